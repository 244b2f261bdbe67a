//! The A2A operations, independent of transport: JSON-RPC (both dialects) and the HTTP+JSON
//! binding call these and only render the results differently.
//!
//! Each operation is answered by the agent's kind of backend, behind one seam
//! ([`Operations`]): `local` runs tasks on the gateway (the agent's actor, the job runner,
//! the task store) for every [`crate::agents::AgentBackend`] (echo, command, and any new
//! local kind), and `upstream` forwards to a remote A2A server, keeping who created each
//! of its tasks. The service checks what every call needs and chooses the implementation
//! once per call.

mod local;
pub(crate) mod push;
pub(crate) mod replicas;
mod upstream;
mod upstream_log;

/// What arrives on `rx` as stream items: `each` makes one of every value and says whether
/// it is the last. Ends after that one, when the channel closes, or with an error when the
/// receiver fell too far behind (a slow caller is cut off rather than holding memory).
fn received<T, F>(
    rx: Option<tokio::sync::broadcast::Receiver<T>>,
    each: F,
) -> impl futures_util::Stream<Item = crate::protocol::ops::Positioned> + Send + 'static
where
    T: Clone + Send + 'static,
    F: Fn(T) -> (crate::protocol::ops::Positioned, bool) + Send + 'static,
{
    use tokio::sync::broadcast::error::RecvError;
    futures_util::stream::unfold((rx, each), |(rx, each)| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Ok(value) => {
                let (item, last) = each(value);
                Some((item, ((!last).then_some(rx), each)))
            }
            Err(RecvError::Lagged(n)) => Some((
                Err(GatewayError::Internal(format!(
                    "the stream fell {n} events behind and was disconnected"
                ))),
                (None, each),
            )),
            Err(RecvError::Closed) => None,
        }
    })
}

use std::sync::Arc;

use futures_util::future::LocalBoxFuture;

use crate::agents::{Agent, Backend};
use crate::auth::Principal;
use crate::error::GatewayError;
use crate::protocol::model::Task;
use crate::protocol::ops::{ItemStream, ListTasksResponse, SendRequest, SendResult};
use crate::protocol::params::ListQuery;
use crate::protocol::resume::ResumeFrom;
use crate::routing::{BoundedMap, ContextIndex};
use crate::store::Kept;
use crate::tasks::{Tasks, Viewer};

use local::LocalOps;
use upstream::UpstreamOps;

pub(crate) struct A2aService {
    tasks: Arc<Tasks>,
    legacy_ids: LegacyNames,
    local: LocalOps,
    upstream: UpstreamOps,
    push: push::Push,
}

/// 0.1 clients choose their task ids: the gateway's task for each (agent, caller, chosen
/// id), so two callers' ids never meet. Cloned into the streams that name new tasks.
#[derive(Clone)]
pub(crate) struct LegacyNames(Arc<BoundedMap<String>>);

impl LegacyNames {
    /// The task a 0.1 caller named `client_id` on `agent`.
    pub(crate) fn get(&self, agent: &Agent, caller: &Principal, client_id: &str) -> Option<String> {
        self.0.get(&legacy_key(agent, caller, client_id))
    }

    /// Reads the name from other replicas first (with a shared store).
    pub(crate) async fn fetch(
        &self,
        agent: &Agent,
        caller: &Principal,
        client_id: &str,
    ) -> Result<(), GatewayError> {
        self.0.fetch(&legacy_key(agent, caller, client_id)).await
    }

    /// Records that the 0.1 caller's `client_id` names `task_id` on `agent`.
    pub(crate) fn name(&self, agent: &Agent, caller: &Principal, client_id: &str, task_id: &str) {
        self.0
            .insert(&legacy_key(agent, caller, client_id), task_id.to_string());
    }
}

/// How the caller will write a task that answers a send. Given one, the service writes the
/// answer to a task it settles at once from the task it is about to store, not from a copy.
pub(crate) type TaskWriter<'a> = &'a (dyn Fn(&Task) -> Result<WrittenAnswer, GatewayError> + Sync);

/// An answer a [`TaskWriter`] wrote.
pub(crate) struct WrittenAnswer {
    pub(crate) body: Vec<u8>,
    /// For a task with no metadata of its own: where in `body` its fields are, up to its
    /// metadata (the gateway's stamp). A durable store keeps the task made from them
    /// (`protocol::write::task_from_answer`) rather than writing it again.
    pub(crate) task_fields: Option<std::ops::Range<usize>>,
}

/// What a send returns: its result, or the answer already written by the [`TaskWriter`].
// Moved once per send; boxing the result would cost an allocation on every other path.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Sent {
    Result(SendResult),
    Written(Vec<u8>),
}

/// The A2A operations as one kind of backend answers them. Checks common to every kind
/// (a send's message, push configs) are made by the service before it calls these.
pub(crate) trait Operations {
    fn send<'a>(
        &'a self,
        agent: &'a Arc<Agent>,
        caller: &'a Principal,
        req: SendRequest,
        writer: Option<TaskWriter<'a>>,
    ) -> LocalBoxFuture<'a, Result<Sent, GatewayError>>;

    fn stream<'a>(
        &'a self,
        agent: &'a Arc<Agent>,
        caller: &'a Principal,
        req: SendRequest,
    ) -> LocalBoxFuture<'a, Result<ItemStream, GatewayError>>;

    fn get<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        id: &'a str,
        history_length: Option<usize>,
    ) -> LocalBoxFuture<'a, Result<Task, GatewayError>>;

    fn list<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        query: &'a ListQuery,
    ) -> LocalBoxFuture<'a, Result<ListTasksResponse, GatewayError>>;

    fn cancel<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        id: &'a str,
    ) -> LocalBoxFuture<'a, Result<Task, GatewayError>>;

    fn subscribe<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        id: &'a str,
    ) -> LocalBoxFuture<'a, Result<ItemStream, GatewayError>>;

    /// A stream picked up after the event that made the task `from.version`: the events
    /// the client missed, then the live ones. Where no log reaches back that far, the
    /// task as it is now, then the live ones.
    fn resume<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        from: &'a ResumeFrom,
    ) -> LocalBoxFuture<'a, Result<ItemStream, GatewayError>>;
}

impl A2aService {
    /// `contexts` is the router's: the service records which agent serves each conversation.
    /// `owners`, `legacy_names` and `ledgers` are where the records of upstream task owners,
    /// 0.1 task names and the tasks relayed to 0.3 upstreams are kept; `push` keeps the
    /// push notification configs.
    pub(crate) fn new(
        tasks: Arc<Tasks>,
        contexts: Arc<ContextIndex>,
        owners: Kept,
        legacy_names: Kept,
        ledgers: Kept,
        push: push::Push,
    ) -> A2aService {
        A2aService {
            push,
            local: LocalOps::new(tasks.clone(), contexts.clone()),
            upstream: UpstreamOps::new(
                tasks.clone(),
                contexts,
                tasks_capacity_hint(),
                owners,
                ledgers,
            ),
            tasks,
            legacy_ids: LegacyNames(Arc::new(BoundedMap::new(
                tasks_capacity_hint(),
                legacy_names,
            ))),
        }
    }

    /// Push notifications: whether they are on, and the key they are signed with.
    pub(crate) fn push(&self) -> &push::Push {
        &self.push
    }

    /// The task names of 0.1 clients.
    pub(crate) fn legacy_names(&self) -> &LegacyNames {
        &self.legacy_ids
    }

    pub(crate) fn tasks(&self) -> &Arc<Tasks> {
        &self.tasks
    }

    /// Who answers `agent`'s operations: chosen here, once per call.
    fn ops(&self, agent: &Agent) -> &dyn Operations {
        match agent.backend {
            Backend::Local(_) => &self.local,
            Backend::Remote(_) => &self.upstream,
        }
    }

    /// `SendMessage` / `message/send`.
    pub(crate) async fn send(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        req: SendRequest,
    ) -> Result<SendResult, GatewayError> {
        match self.send_writing(agent, caller, req, None).await? {
            Sent::Result(result) => Ok(result),
            Sent::Written(_) => Err(GatewayError::Internal("answer written unasked".into())),
        }
    }

    /// [`Self::send`], leaving the writing of a task answer to `writer` where that saves
    /// a copy of the task.
    pub(crate) async fn send_writing(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        req: SendRequest,
        writer: Option<TaskWriter<'_>>,
    ) -> Result<Sent, GatewayError> {
        check_send(&req)?;
        match req.push.is_some() {
            // Boxed: the push path's future would otherwise make every send's larger
            // (and copied), push or not.
            true => Box::pin(self.send_pushing(agent, caller, req)).await,
            false => self.ops(agent).send(agent, caller, req, writer).await,
        }
    }

    /// `SendStreamingMessage` / `message/stream`: the task (or one Message) first, then
    /// every event until the task finishes or needs input.
    pub(crate) async fn stream(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        req: SendRequest,
    ) -> Result<ItemStream, GatewayError> {
        check_send(&req)?;
        let items = match req.push.is_some() {
            true => Box::pin(self.stream_pushing(agent, caller, req)).await,
            false => self.ops(agent).stream(agent, caller, req).await,
        }?;
        Ok(self.tasks.first_written(items))
    }

    /// `GetTask` / `tasks/get`.
    pub(crate) async fn get(
        &self,
        agent: &Agent,
        caller: &Principal,
        id: &str,
        history_length: Option<usize>,
    ) -> Result<Task, GatewayError> {
        self.ops(agent).get(agent, caller, id, history_length).await
    }

    /// `ListTasks` (1.0 only).
    pub(crate) async fn list(
        &self,
        agent: &Agent,
        caller: &Principal,
        query: &ListQuery,
    ) -> Result<ListTasksResponse, GatewayError> {
        self.ops(agent).list(agent, caller, query).await
    }

    /// `CancelTask` / `tasks/cancel`.
    pub(crate) async fn cancel(
        &self,
        agent: &Agent,
        caller: &Principal,
        id: &str,
    ) -> Result<Task, GatewayError> {
        self.ops(agent).cancel(agent, caller, id).await
    }

    /// `SubscribeToTask` / `tasks/resubscribe`: the current task, then its later events.
    pub(crate) async fn subscribe(
        &self,
        agent: &Agent,
        caller: &Principal,
        id: &str,
    ) -> Result<ItemStream, GatewayError> {
        self.ops(agent).subscribe(agent, caller, id).await
    }

    /// A subscription to task `id`, or, with the `Last-Event-ID` of a stream the client
    /// lost (`from`), that stream picked up where it left it. An event id of another task
    /// is as good as an unknown task.
    pub(crate) async fn subscribe_from(
        &self,
        agent: &Agent,
        caller: &Principal,
        id: &str,
        from: Option<&ResumeFrom>,
    ) -> Result<ItemStream, GatewayError> {
        match from {
            Some(from) if from.task_id != id => {
                Err(GatewayError::TaskNotFound(from.task_id.clone()))
            }
            Some(from) => self.resume(agent, caller, from).await,
            None => self.subscribe(agent, caller, id).await,
        }
    }

    /// A stream a client lost, picked up where it left it (`Last-Event-ID`): see
    /// [`Operations::resume`].
    pub(crate) async fn resume(
        &self,
        agent: &Agent,
        caller: &Principal,
        from: &ResumeFrom,
    ) -> Result<ItemStream, GatewayError> {
        self.ops(agent).resume(agent, caller, from).await
    }
}

impl A2aService {
    /// Runs what another replica forwarded for a task this one runs (see
    /// [`replicas::Command`]); `registry` has the agents in force.
    pub(crate) async fn run_forwarded(
        &self,
        command: replicas::Command,
        registry: &crate::agents::Registry,
    ) -> replicas::Answer {
        use replicas::{Answer, Command};
        let (id, outcome) = match command {
            Command::Cancel { id, .. } => {
                let outcome = match self.tasks.cancel(&id, None) {
                    crate::tasks::Applied::Yes => Ok(()),
                    crate::tasks::Applied::NotFound => Err(Answer::NotFound),
                    crate::tasks::Applied::TaskFinished => Err(self.finished(&id)),
                };
                (id, outcome)
            }
            Command::Continue {
                agent,
                principal,
                anonymous,
                message,
                ..
            } => {
                let id = message.task_id.clone().unwrap_or_default();
                let Some(agent) = agent_named(registry, &agent) else {
                    return Answer::NotFound;
                };
                // Authenticated and authorized where the call came in.
                let caller = checked_elsewhere(principal, anonymous);
                let req = SendRequest {
                    message: *message,
                    blocking: false,
                    history_length: None,
                    accepted_output_modes: Vec::new(),
                    metadata: None,
                    push: None,
                    reply_dialect: crate::protocol::Dialect::V10,
                    on_new_task: None,
                };
                let outcome = match self.send(&agent, &caller, req).await {
                    Ok(_) => Ok(()),
                    Err(GatewayError::TaskNotFound(_)) => Err(Answer::NotFound),
                    Err(GatewayError::UnsupportedOperation(_))
                        if self
                            .tasks
                            .inspect_any(&id)
                            .is_some_and(|(t, _)| t.status.state.is_terminal()) =>
                    {
                        Err(self.finished(&id))
                    }
                    Err(e) => Err(Answer::Failed {
                        code: e.code(),
                        message: e.to_string(),
                    }),
                };
                (id, outcome)
            }
        };
        if let Err(answer) = outcome {
            return answer;
        }
        match self.tasks.inspect_any(&id) {
            Some((task, version)) => Answer::Task {
                task: Box::new(task),
                version,
            },
            None => Answer::NotFound,
        }
    }

    fn finished(&self, id: &str) -> replicas::Answer {
        match self.tasks.inspect_any(id) {
            Some((task, _)) => replicas::Answer::Finished(task.status.state.v03_name().into()),
            None => replicas::Answer::NotFound,
        }
    }
}

/// The agent `name`, among those in force or retired (its tasks still finish).
fn agent_named(registry: &crate::agents::Registry, name: &str) -> Option<Arc<Agent>> {
    registry
        .get(name)
        .or_else(|| registry.retired_agent(name))
        .cloned()
}

/// The caller `principal`, authenticated and authorized by another replica (or by this
/// one, earlier): what acting on its behalf needs of it.
fn checked_elsewhere(principal: String, anonymous: bool) -> Principal {
    Principal {
        id: principal.into(),
        scope: crate::auth::Scope::All,
        anonymous,
        tier: Arc::from(""),
        claims: None,
        address: None,
    }
}

/// Length-prefixed, so no choice of ids can make two callers' keys meet.
fn legacy_key(agent: &Agent, caller: &Principal, client_id: &str) -> String {
    let (a, p) = (&agent.name, &caller.id);
    format!("{}:{a}{}:{p}{client_id}", a.len(), p.len())
}

fn viewer<'a>(agent: &'a Agent, caller: &'a Principal) -> Viewer<'a> {
    Viewer {
        agent: &agent.name,
        principal: &caller.id,
    }
}

/// How many upstream task owners are remembered (the oldest are forgotten first).
fn tasks_capacity_hint() -> usize {
    100_000
}

/// Checks what every send needs, whichever backend serves it.
fn check_send(req: &SendRequest) -> Result<(), GatewayError> {
    if req.message.message_id.trim().is_empty() {
        return Err(GatewayError::InvalidParams(
            "params.message.messageId: must not be empty".into(),
        ));
    }
    if req.message.parts.is_empty() {
        return Err(GatewayError::InvalidParams(
            "params.message.parts: a message needs at least one part".into(),
        ));
    }
    Ok(())
}

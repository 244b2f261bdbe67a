//! The A2A operations, independent of transport: JSON-RPC (both dialects) and, later, the
//! HTTP+JSON binding call these and only render the results differently.

use crate::protocol::ops::SendResult;
use std::sync::Arc;

use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::agents::{
    Admission, Agent, AgentBackend, Backend, BackendError, EventSink, Execution, Immediate,
    SinkProbe, SinkSetup, Update,
};
use crate::auth::Principal;
use crate::error::GatewayError;
use crate::protocol::model::{
    new_id, Message, StreamEnd, StreamItem, Task, TaskState, TaskStatus, TaskStatusUpdateEvent,
};
use crate::protocol::ops::{ItemStream, ListTasksResponse, SendRequest};
use crate::protocol::params::ListQuery;
use crate::routing::{conversation, BoundedMap, ContextIndex};
use crate::tasks::{Applied, Tasks, Viewer};

/// How many events an execution may run ahead of a slow caller before it waits.
const CALLER_BUFFER: usize = 32;

pub struct A2aService {
    tasks: Arc<Tasks>,
    remote_owners: Arc<RemoteOwners>,
    contexts: Arc<ContextIndex>,
    legacy_ids: LegacyNames,
}

/// 0.1 clients choose their task ids: the gateway's task for each (agent, caller, chosen
/// id), so two callers' ids never meet. Cloned into the streams that name new tasks.
#[derive(Clone)]
pub struct LegacyNames(Arc<BoundedMap<String>>);

impl LegacyNames {
    /// The task a 0.1 caller named `client_id` on `agent`.
    pub fn get(&self, agent: &Agent, caller: &Principal, client_id: &str) -> Option<String> {
        self.0.get(&legacy_key(agent, caller, client_id))
    }

    /// Records that the 0.1 caller's `client_id` names `task_id` on `agent`.
    pub fn name(&self, agent: &Agent, caller: &Principal, client_id: &str, task_id: &str) {
        self.0
            .insert(&legacy_key(agent, caller, client_id), task_id.to_string());
    }
}

/// A message with its ids settled, ready to run (see [`A2aService::prepare`]).
struct Prepared {
    message: Message,
    /// The task a follow-up message continues; None for a new task.
    continuing: Option<String>,
    task_id: String,
    context_id: String,
    /// The gateway made the contextId up just now, so nothing else can be using it.
    fresh_context: bool,
}

/// How the caller will write a task that answers a send. Given one, the service writes the
/// answer to a task it settles at once from the task it is about to store, not from a copy.
pub type TaskWriter<'a> = &'a (dyn Fn(&Task) -> Result<Vec<u8>, GatewayError> + Sync);

/// What a send returns: its result, or the answer already written by the [`TaskWriter`].
// Moved once per send; boxing the result would cost an allocation on every other path.
#[allow(clippy::large_enum_variant)]
pub enum Sent {
    Result(SendResult),
    Written(Vec<u8>),
}

struct Started {
    task_id: String,
    updates: mpsc::Receiver<Result<Update, GatewayError>>,
}

impl A2aService {
    pub fn new(tasks: Arc<Tasks>) -> A2aService {
        let remote_owners = Arc::new(RemoteOwners::new(tasks_capacity_hint()));
        A2aService {
            tasks,
            remote_owners,
            contexts: Arc::default(),
            legacy_ids: LegacyNames(Arc::new(BoundedMap::new(tasks_capacity_hint()))),
        }
    }

    /// The task names of 0.1 clients.
    pub fn legacy_names(&self) -> &LegacyNames {
        &self.legacy_ids
    }

    pub fn tasks(&self) -> &Tasks {
        &self.tasks
    }

    /// Which agent served each conversation, for context affinity on `/a2a`.
    pub fn contexts(&self) -> &ContextIndex {
        &self.contexts
    }

    /// `SendMessage` / `message/send`.
    pub async fn send(
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
    pub async fn send_writing(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        req: SendRequest,
        writer: Option<TaskWriter<'_>>,
    ) -> Result<Sent, GatewayError> {
        check_send(&req)?;
        match &agent.backend {
            Backend::Local(backend) => self.send_local(agent, caller, backend, req, writer).await,
            Backend::Remote(remote) => {
                self.remote_owners.check_message(&req.message, caller)?;
                let _turn = take_turn(agent, caller, &req).await?;
                let result = remote.send(&req).await?;
                remote.note_result(&caller.id, &result);
                match &result {
                    SendResult::Task(t) => {
                        self.remote_owners.record(&t.id, caller);
                        self.contexts.record(&caller.id, &t.context_id, &agent.name);
                    }
                    SendResult::Message(m) => {
                        if let Some(c) = &m.context_id {
                            self.contexts.record(&caller.id, c, &agent.name);
                        }
                    }
                    SendResult::Relayed(r) => {
                        if let Some(t) = &r.task_id {
                            self.remote_owners.record(t, caller);
                        }
                        if let Some(c) = &r.context_id {
                            self.contexts.record(&caller.id, c, &agent.name);
                        }
                    }
                }
                Ok(Sent::Result(result))
            }
        }
    }

    /// `SendStreamingMessage` / `message/stream`: the task (or one Message) first, then
    /// every event until the task finishes or needs input.
    pub async fn stream(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        req: SendRequest,
    ) -> Result<ItemStream, GatewayError> {
        check_send(&req)?;
        match &agent.backend {
            Backend::Local(backend) => {
                let prepared = self.prepare(agent, caller, req.message)?;
                let continuing = prepared.continuing.is_some();
                let Started { updates, .. } =
                    self.launch(agent, caller, backend, prepared, true)?;
                Ok(until_stream_ends(updates, continuing))
            }
            Backend::Remote(remote) => {
                self.remote_owners.check_message(&req.message, caller)?;
                // The turn is held for as long as the stream is open.
                let turn = take_turn(agent, caller, &req).await?;
                let items = remote.stream(&req).await?;
                let owners = self.remote_owners.clone();
                let contexts = self.contexts.clone();
                let (caller, anonymous) = (caller.id.clone(), caller.anonymous);
                let agent_name = agent.name.clone();
                let remote = remote.clone();
                Ok(Box::pin(items.map(move |item| {
                    let _held = &turn;
                    if let Ok(item) = &item {
                        remote.note_item(&caller, item);
                    }
                    if let Ok(StreamItem::Task(t)) = &item {
                        owners.record_id(&t.id, &caller, anonymous);
                        contexts.record(&caller, &t.context_id, &agent_name);
                    }
                    item
                })))
            }
        }
    }

    /// `GetTask` / `tasks/get`.
    pub async fn get(
        &self,
        agent: &Agent,
        caller: &Principal,
        id: &str,
        history_length: Option<usize>,
    ) -> Result<Task, GatewayError> {
        match &agent.backend {
            Backend::Local(_) => self.get_local(viewer(agent, caller), id, history_length),
            Backend::Remote(remote) => {
                self.remote_owners.check(id, caller)?;
                let task = remote.get(id, history_length).await?;
                remote.note_task(&task);
                Ok(task)
            }
        }
    }

    /// `ListTasks` (1.0 only).
    pub async fn list(
        &self,
        agent: &Agent,
        caller: &Principal,
        query: &ListQuery,
    ) -> Result<ListTasksResponse, GatewayError> {
        match &agent.backend {
            Backend::Local(_) => self.list_local(viewer(agent, caller), query),
            Backend::Remote(remote) => {
                let mut page = remote.list(&caller.id, query).await?;
                // The remote does not know our callers: keep only what this one created.
                page.tasks
                    .retain(|t| self.remote_owners.check(&t.id, caller).is_ok());
                Ok(page)
            }
        }
    }

    /// `CancelTask` / `tasks/cancel`.
    pub async fn cancel(
        &self,
        agent: &Agent,
        caller: &Principal,
        id: &str,
    ) -> Result<Task, GatewayError> {
        match &agent.backend {
            Backend::Local(_) => self.cancel_local(viewer(agent, caller), id),
            Backend::Remote(remote) => {
                self.remote_owners.check(id, caller)?;
                let task = remote.cancel(id).await?;
                remote.note_task(&task);
                Ok(task)
            }
        }
    }

    /// `SubscribeToTask` / `tasks/resubscribe`: the current task, then its later events.
    pub async fn subscribe(
        &self,
        agent: &Agent,
        caller: &Principal,
        id: &str,
    ) -> Result<ItemStream, GatewayError> {
        match &agent.backend {
            Backend::Local(_) => self.subscribe_local(viewer(agent, caller), id),
            Backend::Remote(remote) => {
                self.remote_owners.check(id, caller)?;
                let items = remote.subscribe(id).await?;
                let (remote, owner) = (remote.clone(), caller.id.clone());
                Ok(Box::pin(items.inspect(move |item| {
                    if let Ok(item) = item {
                        remote.note_item(&owner, item);
                    }
                })))
            }
        }
    }

    async fn send_local(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        backend: &Arc<dyn AgentBackend>,
        req: SendRequest,
        writer: Option<TaskWriter<'_>>,
    ) -> Result<Sent, GatewayError> {
        let blocking = req.blocking;
        let history_length = req.history_length;
        let prepared = self.prepare(agent, caller, req.message)?;
        let answer_now = self.answer_now(agent, caller, backend, prepared, history_length, writer);
        let prepared = match answer_now? {
            Ok(answer) => return Ok(answer),
            Err(later) => later,
        };
        let Started {
            task_id,
            mut updates,
        } = self.launch(agent, caller, backend, prepared, false)?;
        let mut saw_task = false;
        while let Some(update) = updates.recv().await {
            let ends_stream = match update? {
                Update::Item(item) => match *item {
                    StreamItem::Message(m) => return Ok(Sent::Result(SendResult::Message(m))),
                    item => item.ends_stream(),
                },
                Update::Progress { ends_stream } => ends_stream,
            };
            saw_task = true;
            if !blocking || ends_stream {
                break;
            }
        }
        if !saw_task {
            return Err(GatewayError::Internal(format!(
                "agent {} ended without answering",
                agent.name
            )));
        }
        let task = self
            .tasks
            .inspect(viewer(agent, caller), &task_id, |t| {
                t.view(history_length, true)
            })
            .ok_or_else(|| GatewayError::TaskNotFound(task_id.clone()))?;
        Ok(Sent::Result(SendResult::Task(task)))
    }

    /// Settles a new task on the caller's thread when the backend knows its outcome at once
    /// and doing the work now overtakes nobody: nothing is queued or running on its context
    /// and a concurrency slot is free. Otherwise hands the message back to be scheduled.
    fn answer_now(
        &self,
        agent: &Agent,
        caller: &Principal,
        backend: &Arc<dyn AgentBackend>,
        p: Prepared,
        history_length: Option<usize>,
        writer: Option<TaskWriter<'_>>,
    ) -> Result<Result<Sent, Prepared>, GatewayError> {
        if p.continuing.is_some() {
            return Ok(Err(p));
        }
        let lane = (!p.fresh_context).then(|| conversation(&caller.id, &p.context_id));
        let Some(_running) = agent.actor.try_run_now(lane.as_deref()) else {
            return Ok(Err(p));
        };
        let Some(outcome) = backend.answer_now(&p.message) else {
            return Ok(Err(p));
        };
        let Prepared {
            message,
            task_id,
            context_id,
            ..
        } = p;
        // Placed as the sink places an execution's task and messages (sink.rs).
        let (artifacts, state, said) = match outcome {
            Immediate::Message(m) => {
                let answer = SendResult::Message(m.placed(None, &context_id));
                return Ok(Ok(Sent::Result(answer)));
            }
            Immediate::Task {
                artifacts,
                state,
                message,
            } => (artifacts, state, message),
        };
        let said = said.map(|m| m.placed(Some(&task_id), &context_id));
        let mut task = Task::submitted(task_id, context_id, message);
        task.artifacts = artifacts;
        task.set_status(TaskStatus::now(state, said));
        let whole = history_length.is_none_or(|n| n >= task.history.len());
        let answer = match writer {
            Some(write) if whole => Sent::Written(write(&task)?),
            _ => Sent::Result(SendResult::Task(task.view(history_length, true))),
        };
        self.tasks
            .create(agent.name.clone(), caller.id.clone(), task, None)?;
        Ok(Ok(answer))
    }

    /// Gives a message its task and context ids: a follow-up's from its task (which must
    /// be the caller's and unfinished), a new task's fresh, and records the conversation.
    fn prepare(
        &self,
        agent: &Agent,
        caller: &Principal,
        mut message: Message,
    ) -> Result<Prepared, GatewayError> {
        let mut fresh_context = false;
        let continuing = match message.task_id.clone().filter(|t| !t.is_empty()) {
            Some(task_id) => {
                let (context_id, state) = self
                    .tasks
                    .inspect(viewer(agent, caller), &task_id, |t| {
                        (t.context_id.clone(), t.status.state)
                    })
                    .ok_or_else(|| GatewayError::TaskNotFound(task_id.clone()))?;
                if state.is_terminal() {
                    return Err(terminal_task_error(&task_id, state));
                }
                if message
                    .context_id
                    .as_ref()
                    .is_some_and(|c| !c.is_empty() && *c != context_id)
                {
                    return Err(GatewayError::InvalidParams(format!(
                        "params.message.contextId: does not match the contextId of task {task_id}"
                    )));
                }
                message.context_id = Some(context_id);
                Some(task_id)
            }
            None => {
                if message.context_id.as_ref().is_some_and(|c| c.len() > 256) {
                    return Err(GatewayError::InvalidParams(
                        "params.message.contextId: longer than 256 characters".into(),
                    ));
                }
                message.task_id = Some(new_id());
                if message.context_id.as_ref().is_none_or(|c| c.is_empty()) {
                    fresh_context = true;
                    message.context_id = Some(ContextIndex::new_id(&agent.name));
                }
                None
            }
        };
        let task_id = message.task_id.clone().unwrap_or_default();
        let context_id = message.context_id.clone().unwrap_or_default();
        if !fresh_context {
            self.contexts.record(&caller.id, &context_id, &agent.name);
        }
        Ok(Prepared {
            message,
            continuing,
            task_id,
            context_id,
            fresh_context,
        })
    }

    /// Schedules the message's execution on the agent's actor.
    fn launch(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        backend: &Arc<dyn AgentBackend>,
        p: Prepared,
        streaming: bool,
    ) -> Result<Started, GatewayError> {
        let (tx, rx) = mpsc::channel(CALLER_BUFFER);
        let task_id = p.task_id.clone();
        let job = Job {
            tasks: self.tasks.clone(),
            agent: agent.clone(),
            owner: caller.id.clone(),
            backend: backend.clone(),
            message: p.message,
            continuing: p.continuing,
            task_id: p.task_id,
            context_id: p.context_id,
            streaming,
            tx,
        };
        let lane = conversation(&job.owner, &job.context_id);
        agent.actor.submit(&lane, job.run())?;
        Ok(Started {
            task_id,
            updates: rx,
        })
    }

    fn get_local(
        &self,
        v: Viewer<'_>,
        id: &str,
        history_length: Option<usize>,
    ) -> Result<Task, GatewayError> {
        self.tasks
            .inspect(v, id, |t| t.view(history_length, true))
            .ok_or_else(|| GatewayError::TaskNotFound(id.to_string()))
    }

    fn list_local(
        &self,
        v: Viewer<'_>,
        query: &ListQuery,
    ) -> Result<ListTasksResponse, GatewayError> {
        let page = self.tasks.list(v, query)?;
        Ok(ListTasksResponse {
            tasks: page
                .tasks
                .iter()
                .map(|t| t.view(query.history_length, query.include_artifacts))
                .collect(),
            next_page_token: page.next_page_token,
            page_size: query.page_size,
            total_size: page.total_size,
        })
    }

    /// Stops running work and marks the task canceled.
    fn cancel_local(&self, v: Viewer<'_>, id: &str) -> Result<Task, GatewayError> {
        let state = self
            .tasks
            .inspect(v, id, |t| t.status.state)
            .ok_or_else(|| GatewayError::TaskNotFound(id.to_string()))?;
        if state.is_terminal() {
            return Err(not_cancelable(id, state));
        }
        match self.tasks.cancel(id, None) {
            Applied::Yes => self.get_local(v, id, None),
            Applied::NotFound => Err(GatewayError::TaskNotFound(id.to_string())),
            Applied::TaskFinished => {
                let state = self
                    .tasks
                    .inspect(v, id, |t| t.status.state)
                    .unwrap_or(TaskState::Unspecified);
                Err(not_cancelable(id, state))
            }
        }
    }

    fn subscribe_local(&self, v: Viewer<'_>, id: &str) -> Result<ItemStream, GatewayError> {
        let (task, rx) = self
            .tasks
            .subscribe(v, id)
            .ok_or_else(|| GatewayError::TaskNotFound(id.to_string()))?;
        if task.status.state.is_terminal() {
            return Err(terminal_task_error(id, task.status.state));
        }
        // Open until the task ends, through input-required and its answer (spec 3.1.6).
        let first = StreamItem::Task(task);
        let rest = stream::unfold(Some(rx), |rx| async move {
            let mut rx = rx?;
            match rx.recv().await {
                Ok(item) => {
                    let item = (*item).clone();
                    let next = (!StreamEnd::Terminal.closes(&item)).then_some(rx);
                    Some((Ok(item), next))
                }
                Err(broadcast::error::RecvError::Lagged(n)) => Some((
                    Err(GatewayError::Internal(format!(
                        "subscriber fell {n} events behind and was disconnected"
                    ))),
                    None,
                )),
                Err(broadcast::error::RecvError::Closed) => None,
            }
        });
        Ok(Box::pin(
            stream::once(async { Ok(first) }).chain_items(rest),
        ))
    }
}

/// `futures::StreamExt::chain` under a name that reads well at the call site.
trait ChainItems: Stream + Sized {
    fn chain_items<S: Stream<Item = Self::Item>>(self, next: S) -> stream::Chain<Self, S> {
        futures_util::StreamExt::chain(self, next)
    }
}
impl<S: Stream> ChainItems for S {}

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

/// Who created each upstream task. The remote owns the task and knows nothing of the
/// gateway's callers, so the gateway remembers, bounded, the creator of every task id it
/// has handed out. An id it does not remember (created before a restart, or long ago) is
/// visible only to the anonymous principal, which is what every caller is when no
/// credentials are configured.
pub struct RemoteOwners {
    owners: BoundedMap<Arc<str>>,
}

impl RemoteOwners {
    fn new(capacity: usize) -> RemoteOwners {
        RemoteOwners {
            owners: BoundedMap::new(capacity),
        }
    }

    fn record(&self, task_id: &str, caller: &Principal) {
        self.record_id(task_id, &caller.id, caller.anonymous);
    }

    /// Anonymous callers are not recorded: an id nobody claimed is visible to exactly the
    /// anonymous principal anyway, so the record would change nothing (and cost on every
    /// call of a gateway without credentials).
    fn record_id(&self, task_id: &str, owner: &Arc<str>, anonymous: bool) {
        if !anonymous {
            self.owners.insert(task_id, owner.clone());
        }
    }

    fn check(&self, task_id: &str, caller: &Principal) -> Result<(), GatewayError> {
        let visible = match self.owners.get(task_id) {
            Some(owner) => *owner == *caller.id,
            None => caller.anonymous,
        };
        if visible {
            Ok(())
        } else {
            Err(GatewayError::TaskNotFound(task_id.to_string()))
        }
    }

    /// A follow-up message may only continue the caller's own task.
    fn check_message(&self, message: &Message, caller: &Principal) -> Result<(), GatewayError> {
        match message.task_id.as_deref().filter(|t| !t.is_empty()) {
            Some(t) => self.check(t, caller),
            None => Ok(()),
        }
    }
}

/// Checks what every send needs, whichever backend serves it.
fn check_send(req: &SendRequest) -> Result<(), GatewayError> {
    if req.has_push_config {
        return Err(GatewayError::PushNotSupported);
    }
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

/// Waits for the agent's actor to admit a forwarded message (mailbox, the caller's lane for
/// its context, concurrency).
async fn take_turn(
    agent: &Agent,
    caller: &Principal,
    req: &SendRequest,
) -> Result<Admission, GatewayError> {
    let lane = req
        .message
        .context_id
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(|c| conversation(&caller.id, c));
    Ok(agent.actor.enqueue(lane.as_deref())?.ready().await)
}

fn terminal_task_error(id: &str, state: TaskState) -> GatewayError {
    GatewayError::UnsupportedOperation(format!(
        "task {id} is already {}; start a new task (it may list this one in referenceTaskIds)",
        state.v03_name()
    ))
}

fn not_cancelable(id: &str, state: TaskState) -> GatewayError {
    GatewayError::TaskNotCancelable {
        id: id.to_string(),
        state: state.v03_name(),
    }
}

/// Ends the caller's stream after the item that closes it, or after an error. A follow-up's
/// stream opens with the task as it was before the follow-up (input-required, say): that
/// snapshot does not end the stream.
fn until_stream_ends(
    updates: mpsc::Receiver<Result<Update, GatewayError>>,
    continuing: bool,
) -> ItemStream {
    Box::pin(stream::unfold(
        Some((updates, continuing)),
        |state| async move {
            let (mut rx, opening) = state?;
            loop {
                let item = match rx.recv().await? {
                    Ok(Update::Item(item)) => Ok(*item),
                    // A relaying sink sends no bare progress; nothing to show if one came.
                    Ok(Update::Progress { .. }) => continue,
                    Err(e) => Err(e),
                };
                let snapshot = opening && matches!(&item, Ok(StreamItem::Task(_)));
                let more = matches!(&item, Ok(i) if snapshot || !i.ends_stream());
                return Some((item, more.then_some((rx, false))));
            }
        },
    ))
}

/// One message's work for a backend, run by the agent's actor when its turn comes.
struct Job {
    tasks: Arc<Tasks>,
    agent: Arc<Agent>,
    owner: Arc<str>,
    backend: Arc<dyn AgentBackend>,
    message: Message,
    /// The task a follow-up message continues; None for a new task.
    continuing: Option<String>,
    task_id: String,
    context_id: String,
    streaming: bool,
    tx: mpsc::Sender<Result<Update, GatewayError>>,
}

impl Job {
    fn update_for(&self, task: &Task) -> Update {
        if self.streaming {
            Update::Item(Box::new(StreamItem::Task(task.clone())))
        } else {
            Update::Progress { ends_stream: false }
        }
    }

    fn sink(&self, pending: Option<Message>, cancel: &CancellationToken) -> (EventSink, SinkProbe) {
        EventSink::new(SinkSetup {
            tasks: self.tasks.clone(),
            agent: self.agent.name.clone(),
            owner: self.owner.clone(),
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            pending,
            caller: self.tx.clone(),
            relay: self.streaming,
            cancel: cancel.clone(),
        })
    }

    /// A streaming caller whose task was ended from elsewhere (canceled on another
    /// connection) gets the final status its stream would otherwise never see. When the
    /// stream already ended, nobody reads it.
    async fn close_stream(&self) {
        let viewer = Viewer {
            agent: &self.agent.name,
            principal: &self.owner,
        };
        let status = self
            .tasks
            .inspect(viewer, &self.task_id, |t| t.status.clone())
            .filter(|s| s.state.is_terminal());
        if let Some(status) = status {
            let item = StreamItem::StatusUpdate(TaskStatusUpdateEvent {
                task_id: self.task_id.clone(),
                context_id: self.context_id.clone(),
                status,
                metadata: None,
            });
            let _ = self.tx.send(Ok(Update::Item(Box::new(item)))).await;
        }
    }

    async fn run(mut self) {
        let cancel = CancellationToken::new();
        let mut current = None;
        if let Some(id) = &self.continuing {
            // The task may have finished while this message waited for its turn.
            match self.tasks.continue_with(id, &self.message, &cancel) {
                Some(t) if !t.status.state.is_terminal() => {
                    // A caller that already left does not stop the work: it may come
                    // back with GetTask.
                    let _ = self.tx.send(Ok(self.update_for(&t))).await;
                    current = Some(t);
                }
                Some(t) => {
                    let _ = self
                        .tx
                        .send(Err(terminal_task_error(id, t.status.state)))
                        .await;
                    return;
                }
                None => {
                    let _ = self
                        .tx
                        .send(Err(GatewayError::TaskNotFound(id.clone())))
                        .await;
                    return;
                }
            }
        }
        // One copy for the new task's history, the original for the backend.
        let message = std::mem::take(&mut self.message);
        let pending = self.continuing.is_none().then(|| message.clone());
        let (events, probe) = self.sink(pending, &cancel);
        let exec = Execution {
            message,
            task: current,
            streaming: self.streaming,
            events,
            cancel: cancel.clone(),
        };
        let outcome = self.backend.execute(exec).await;
        if self.streaming {
            self.close_stream().await;
        }
        match outcome {
            Ok(()) if probe.unanswered() => {
                let err = GatewayError::InvalidAgentResponse(format!(
                    "agent {} finished without a task or a message",
                    self.agent.name
                ));
                let _ = self.tx.send(Err(err)).await;
            }
            Ok(()) | Err(BackendError::SinkClosed(_)) => {}
            Err(BackendError::Failed(reason) | BackendError::Unavailable(reason))
                if probe.has_task() =>
            {
                // Through a sink, so the failure is stored, published and forwarded like
                // any other event.
                let (mut sink, _) = self.sink(None, &cancel);
                let _ = sink
                    .status(TaskState::Failed, Some(Message::agent_text(reason)))
                    .await;
            }
            Err(BackendError::Failed(reason)) => {
                let _ = self
                    .tx
                    .send(Err(GatewayError::InvalidAgentResponse(reason)))
                    .await;
            }
            Err(BackendError::Unavailable(reason)) => {
                let err = GatewayError::AgentUnavailable {
                    agent: self.agent.name.to_string(),
                    reason,
                };
                let _ = self.tx.send(Err(err)).await;
            }
        }
    }
}

//! Agents whose tasks the gateway runs itself: a message gets its task and context ids,
//! is answered at once when its backend knows the whole outcome and nothing is overtaken,
//! and is otherwise scheduled on the agent's actor as a job whose events the task store
//! keeps and publishes.

use std::sync::Arc;

use futures_util::future::LocalBoxFuture;
use futures_util::stream::{self, Stream};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::{viewer, Operations, Sent, TaskWriter, WrittenAnswer};
use crate::agents::{
    Agent, AgentBackend, Backend, BackendError, EventSink, Execution, Immediate, SinkProbe,
    SinkSetup, Update,
};
use crate::auth::Principal;
use crate::error::GatewayError;
use crate::protocol::model::{
    new_id, Message, StreamEnd, StreamItem, Task, TaskState, TaskStatus, TaskStatusUpdateEvent,
};
use crate::protocol::ops::{ItemStream, ListTasksResponse, Positioned, SendRequest, SendResult};
use crate::protocol::params::ListQuery;
use crate::protocol::resume::ResumeFrom;
use crate::protocol::write;
use crate::routing::{conversation, ContextIndex};
use crate::tasks::{Applied, Logged, Resumed, TaskPage, Tasks, Viewer};

use super::replicas::{self, Answer, Command, Forward};

/// How many events an execution may run ahead of a slow caller before it waits.
const CALLER_BUFFER: usize = 32;

pub(super) struct LocalOps {
    tasks: Arc<Tasks>,
    contexts: Arc<ContextIndex>,
    /// With a shared store: the way to tasks other replicas run.
    forward: Option<Forward>,
}

fn backend_of(agent: &Agent) -> Result<&Arc<dyn AgentBackend>, GatewayError> {
    match &agent.backend {
        Backend::Local(backend) => Ok(backend),
        Backend::Remote(_) => Err(GatewayError::Internal(format!(
            "agent {} is not local",
            agent.name
        ))),
    }
}

impl Operations for LocalOps {
    fn send<'a>(
        &'a self,
        agent: &'a Arc<Agent>,
        caller: &'a Principal,
        req: SendRequest,
        writer: Option<TaskWriter<'a>>,
    ) -> LocalBoxFuture<'a, Result<Sent, GatewayError>> {
        // A message for no task another replica runs is sent from here: settled at once
        // when its backend can, else launched, and only then is there something to await
        // (a future built for every send, with the replica paths in it, was copied whole).
        if !self.may_continue_elsewhere(&req.message) {
            let started = backend_of(agent)
                .and_then(|backend| self.start_local(agent, caller, backend, req, writer));
            return match started {
                Ok(Local::Settled(sent)) => Box::pin(std::future::ready(Ok(sent))),
                Ok(Local::Launched(launched)) => {
                    Box::pin(self.settle_launched(agent, caller, launched))
                }
                Err(e) => Box::pin(std::future::ready(Err(e))),
            };
        }
        Box::pin(async move {
            let backend = backend_of(agent)?;
            let mut req = req;
            let message = std::mem::take(&mut req.message);
            match self.continue_elsewhere(agent, caller, message).await? {
                Ok(Continued {
                    task,
                    version,
                    events,
                }) => {
                    let task = match req.blocking {
                        true => replicas::settle(task, version, events).await,
                        false => task,
                    };
                    let task = task.view(req.history_length, true);
                    return Ok(Sent::Result(SendResult::Task(task)));
                }
                Err(message) => req.message = message,
            }
            match self.start_local(agent, caller, backend, req, writer)? {
                Local::Settled(sent) => Ok(sent),
                Local::Launched(launched) => self.settle_launched(agent, caller, launched).await,
            }
        })
    }

    fn stream<'a>(
        &'a self,
        agent: &'a Arc<Agent>,
        caller: &'a Principal,
        req: SendRequest,
    ) -> LocalBoxFuture<'a, Result<ItemStream, GatewayError>> {
        Box::pin(async move {
            let backend = backend_of(agent)?;
            let message = match self.continue_elsewhere(agent, caller, req.message).await? {
                Ok(c) => {
                    let end = StreamEnd::Interrupted;
                    return Ok(replicas::follow(c.task, c.version, c.events, end));
                }
                Err(message) => message,
            };
            let prepared = self.prepare(agent, caller, message)?;
            let Started { updates, .. } = self.launch(agent, caller, backend, prepared, true)?;
            Ok(until_stream_ends(updates))
        })
    }

    fn get<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        id: &'a str,
        history_length: Option<usize>,
    ) -> LocalBoxFuture<'a, Result<Task, GatewayError>> {
        Box::pin(async move {
            self.tasks.hydrate(id).await?;
            self.get_local(viewer(agent, caller), id, history_length)
        })
    }

    fn list<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        query: &'a ListQuery,
    ) -> LocalBoxFuture<'a, Result<ListTasksResponse, GatewayError>> {
        Box::pin(async move {
            let v = viewer(agent, caller);
            match self.tasks.list_shared(v, query).await {
                Some(page) => Ok(list_response(page?, query)),
                None => self.list_local(v, query),
            }
        })
    }

    fn cancel<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        id: &'a str,
    ) -> LocalBoxFuture<'a, Result<Task, GatewayError>> {
        Box::pin(async move {
            self.tasks.hydrate(id).await?;
            let v = viewer(agent, caller);
            match (&self.forward, self.tasks.held_elsewhere(v, id)) {
                (Some(forward), Some((replica, task, _))) if !task.status.state.is_terminal() => {
                    let answer = forward
                        .call(&replica, |reply| Command::Cancel {
                            id: id.to_string(),
                            reply,
                        })
                        .await?;
                    answered(id, answer, not_cancelable).map(|(task, _)| task)
                }
                _ => self.cancel_local(v, id),
            }
        })
    }

    fn subscribe<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        id: &'a str,
    ) -> LocalBoxFuture<'a, Result<ItemStream, GatewayError>> {
        Box::pin(async move {
            let v = viewer(agent, caller);
            let Some(forward) = self.forward.as_ref().filter(|_| !self.tasks.holds(id)) else {
                return self.subscribe_local(v, id);
            };
            // Subscribed before the task is read: no event falls between.
            let events = forward.events(id).await?;
            self.tasks.hydrate(id).await?;
            match self.tasks.held_elsewhere(v, id) {
                Some((_, task, version)) => {
                    if task.status.state.is_terminal() {
                        return Err(terminal_task_error(id, task.status.state));
                    }
                    Ok(replicas::follow(task, version, events, StreamEnd::Terminal))
                }
                None => self.subscribe_local(v, id),
            }
        })
    }

    fn resume<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        from: &'a ResumeFrom,
    ) -> LocalBoxFuture<'a, Result<ItemStream, GatewayError>> {
        Box::pin(async move {
            let id = from.task_id.as_str();
            let v = viewer(agent, caller);
            let Some(forward) = self.forward.as_ref().filter(|_| !self.tasks.holds(id)) else {
                return self.resume_local(v, id, from.version);
            };
            // Another replica's task: its log is in the shared store. Subscribed before
            // the log and the task are read: no event falls between.
            let events = forward.events(id).await?;
            let logged = forward.logged(id).await?;
            self.tasks.hydrate(id).await?;
            match self.tasks.held_elsewhere(v, id) {
                // Its replica may have sent events it had not written yet (it writes them
                // soon, or died, and its task's failure is numbered past them): a client
                // that saw them picks up after them.
                Some((_, task, version))
                    if from.version <= version.saturating_add(crate::store::UNWRITTEN_EVENTS) =>
                {
                    Ok(replicas::resume(
                        task,
                        version,
                        from.version,
                        logged,
                        events,
                    ))
                }
                Some(_) => Err(GatewayError::TaskNotFound(id.to_string())),
                None => self.resume_local(v, id, from.version),
            }
        })
    }
}

impl LocalOps {
    pub(super) fn new(tasks: Arc<Tasks>, contexts: Arc<ContextIndex>) -> LocalOps {
        let forward = tasks.shared().cloned().map(Forward::new);
        LocalOps {
            tasks,
            contexts,
            forward,
        }
    }

    /// Hands a follow-up to a task another replica runs to that replica: the task as it
    /// took it, with its version and the task's later events. The message back when its
    /// task is new or this replica's own.
    async fn continue_elsewhere(
        &self,
        agent: &Agent,
        caller: &Principal,
        message: Message,
    ) -> Result<Result<Continued, Message>, GatewayError> {
        let Some(forward) = &self.forward else {
            return Ok(Err(message));
        };
        let id = match message.task_id.as_deref() {
            Some(id) if !id.is_empty() && !self.tasks.holds(id) => id.to_string(),
            _ => return Ok(Err(message)),
        };
        self.tasks.hydrate(&id).await?;
        let replica = match self.tasks.held_elsewhere(viewer(agent, caller), &id) {
            Some((_, task, _)) if task.status.state.is_terminal() => {
                return Err(terminal_task_error(&id, task.status.state));
            }
            Some((replica, _, _)) => replica,
            None => return Ok(Err(message)),
        };
        // Subscribed before the message goes: no event falls between.
        let events = forward.events(&id).await?;
        let answer = forward
            .call(&replica, |reply| Command::Continue {
                agent: agent.name.to_string(),
                principal: caller.id.to_string(),
                anonymous: caller.anonymous,
                message: Box::new(message),
                reply,
            })
            .await?;
        let (task, version) = answered(&id, answer, terminal_task_error)?;
        Ok(Ok(Continued {
            task,
            version,
            events: Box::pin(events),
        }))
    }

    /// Whether the message may continue a task another replica runs (only with a shared
    /// store, for a task id this replica does not hold).
    fn may_continue_elsewhere(&self, message: &Message) -> bool {
        self.forward.is_some()
            && message
                .task_id
                .as_deref()
                .is_some_and(|id| !id.is_empty() && !self.tasks.holds(id))
    }

    /// Sends a message to this replica's backend: answered at once where it can be, else
    /// launched on the agent's actor.
    fn start_local(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        backend: &Arc<dyn AgentBackend>,
        req: SendRequest,
        writer: Option<TaskWriter<'_>>,
    ) -> Result<Local, GatewayError> {
        let history_length = req.history_length;
        let prepared = self.prepare(agent, caller, req.message)?;
        let answer_now = self.answer_now(agent, caller, backend, prepared, history_length, writer);
        let prepared = match answer_now? {
            Ok(answer) => return Ok(Local::Settled(answer)),
            Err(later) => later,
        };
        let on_new_task = req.on_new_task.filter(|_| prepared.continuing.is_none());
        let started = self.launch(agent, caller, backend, prepared, false)?;
        Ok(Local::Launched(Launched {
            started,
            blocking: req.blocking,
            history_length,
            on_new_task,
        }))
    }

    /// What a launched send answers: the task once it ends or needs input (blocking), or
    /// as soon as it is stored.
    async fn settle_launched(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        launched: Launched,
    ) -> Result<Sent, GatewayError> {
        let Launched {
            started: Started {
                task_id,
                mut updates,
            },
            blocking,
            history_length,
            on_new_task,
        } = launched;
        let mut saw_task = false;
        while let Some(update) = updates.recv().await {
            let ends_stream = match update? {
                Update::Item(item, _) => match *item {
                    StreamItem::Message(m) => return Ok(Sent::Result(SendResult::Message(m))),
                    item => item.ends_stream(),
                },
                Update::Progress { ends_stream } => ends_stream,
            };
            // The first update stored the task.
            if let (false, Some(told)) = (saw_task, &on_new_task) {
                (told.0)(&task_id);
            }
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
        // Answered at once: it finished when it was submitted.
        task.set_status(TaskStatus::at(state, said, task.status.timestamp));
        let whole = history_length.is_none_or(|n| n >= task.history.len());
        let (answer, stored_form) = match writer {
            Some(write) if whole => {
                let WrittenAnswer { body, task_fields } = write(&task)?;
                // A durable store keeps the task as the answer just wrote it.
                let stored_form = task_fields
                    .filter(|_| self.tasks.written_through())
                    .and_then(|fields| write::task_from_answer(&body, fields));
                (Sent::Written(body), stored_form)
            }
            _ => (
                Sent::Result(SendResult::Task(task.view(history_length, true))),
                None,
            ),
        };
        // Only an unfinished task counts against a quota (an anonymous caller's is its
        // address's): a finished one makes no key.
        let quota = match task.status.state.is_terminal() {
            true => None,
            false => caller.quota_key(),
        };
        let owner = (caller.id.clone(), quota);
        self.tasks
            .create_answered(agent.name.clone(), owner, task, stored_form)?;
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
            quota: caller.quota_key(),
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
        Ok(list_response(self.tasks.list(v, query)?, query))
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
        let (task, version, rx) = self
            .tasks
            .subscribe(v, id)
            .ok_or_else(|| GatewayError::TaskNotFound(id.to_string()))?;
        if task.status.state.is_terminal() {
            return Err(terminal_task_error(id, task.status.state));
        }
        // Open until the task ends, through input-required and its answer (spec 3.1.6).
        let first = (StreamItem::Task(task), Some(version));
        Ok(ItemStream::positioned(
            stream::once(async { Ok(first) }).chain_items(live(rx)),
        ))
    }

    /// A stream picked up after the event that made task `id` version `version`: the
    /// events after it that the task's log holds, else the task as it is now; then the
    /// live ones, to the task's end. A finished task's stream ends after the replay.
    fn resume_local(
        &self,
        v: Viewer<'_>,
        id: &str,
        version: u64,
    ) -> Result<ItemStream, GatewayError> {
        let (resumed, rx) = self
            .tasks
            .resume(v, id, version)
            .ok_or_else(|| GatewayError::TaskNotFound(id.to_string()))?;
        let missed: Vec<Positioned> = match resumed {
            Resumed::Events(events) => (events.iter())
                .map(|e| Ok((e.item.clone(), Some(e.version))))
                .collect(),
            Resumed::Snapshot(task, at) => vec![Ok((StreamItem::Task(*task), Some(at)))],
        };
        let ended = missed
            .iter()
            .any(|m| matches!(m, Ok((item, _)) if item.finishes_task()));
        let rx = rx.filter(|_| !ended);
        Ok(ItemStream::positioned(
            stream::iter(missed).chain_items(live(rx)),
        ))
    }
}

fn list_response(page: TaskPage, query: &ListQuery) -> ListTasksResponse {
    ListTasksResponse {
        tasks: page
            .tasks
            .iter()
            .map(|t| t.view(query.history_length, query.include_artifacts))
            .collect(),
        next_page_token: page.next_page_token,
        page_size: query.page_size,
        total_size: page.total_size,
    }
}

/// What another replica answered about task `id`, as this one would have answered.
/// `finished` is the error for a task that had already finished.
fn answered(
    id: &str,
    answer: Answer,
    finished: fn(&str, TaskState) -> GatewayError,
) -> Result<(Task, u64), GatewayError> {
    match answer {
        Answer::Task { task, version } => Ok((*task, version)),
        Answer::NotFound => Err(GatewayError::TaskNotFound(id.to_string())),
        Answer::Finished(state) => Err(finished(
            id,
            TaskState::parse_lenient(&state).unwrap_or(TaskState::Unspecified),
        )),
        // With the code the other replica answered (the row of the protocol's codes).
        Answer::Failed { code, message } => Err(GatewayError::Upstream {
            code,
            message,
            data: None,
        }),
    }
}

/// A follow-up another replica took (see [`LocalOps::continue_elsewhere`]).
struct Continued {
    task: Task,
    version: u64,
    events: futures_util::stream::BoxStream<'static, replicas::Published>,
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

struct Started {
    task_id: String,
    updates: mpsc::Receiver<Result<Update, GatewayError>>,
}

/// A send to this replica's backend, started.
// Settled is the common case: boxing its answer would cost an allocation per send.
#[allow(clippy::large_enum_variant)]
enum Local {
    Settled(Sent),
    Launched(Launched),
}

struct Launched {
    started: Started,
    blocking: bool,
    history_length: Option<usize>,
    /// A new task's (see [`SendRequest::on_new_task`]).
    on_new_task: Option<crate::protocol::ops::OnNewTask>,
}

/// A task's events as they come, each at its version, until the task ends (or the
/// subscriber falls too far behind, which ends the stream with an error).
fn live(
    rx: Option<broadcast::Receiver<Arc<Logged>>>,
) -> impl Stream<Item = Positioned> + Send + 'static {
    super::received(rx, |logged: Arc<Logged>| {
        let item = logged.item.clone();
        let last = StreamEnd::Terminal.closes(&item);
        (Ok((item, Some(logged.version))), last)
    })
}

/// `futures::StreamExt::chain` under a name that reads well at the call site.
trait ChainItems: Stream + Sized {
    fn chain_items<S: Stream<Item = Self::Item>>(self, next: S) -> stream::Chain<Self, S> {
        futures_util::StreamExt::chain(self, next)
    }
}
impl<S: Stream> ChainItems for S {}

fn terminal_task_error(id: &str, state: TaskState) -> GatewayError {
    state.already_ended(id)
}

fn not_cancelable(id: &str, state: TaskState) -> GatewayError {
    GatewayError::TaskNotCancelable {
        id: id.to_string(),
        state: state.v03_name(),
    }
}

/// Ends the caller's stream after the item that closes it, or after an error. (A
/// follow-up's stream opens with its task already working again: see
/// `Tasks::continue_with`.)
fn until_stream_ends(updates: mpsc::Receiver<Result<Update, GatewayError>>) -> ItemStream {
    ItemStream::positioned(stream::unfold(Some(updates), |rx| async move {
        let mut rx = rx?;
        loop {
            let item = match rx.recv().await? {
                Ok(Update::Item(item, version)) => Ok((*item, version)),
                // A relaying sink sends no bare progress; nothing to show if one came.
                Ok(Update::Progress { .. }) => continue,
                Err(e) => Err(e),
            };
            let more = matches!(&item, Ok((i, _)) if !i.ends_stream());
            return Some((item, more.then_some(rx)));
        }
    }))
}

/// One message's work for a backend, run by the agent's actor when its turn comes.
struct Job {
    tasks: Arc<Tasks>,
    agent: Arc<Agent>,
    owner: Arc<str>,
    /// What a new task's unfinished count goes to when not its owner.
    quota: Option<Arc<str>>,
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
    fn update_for(&self, task: &Task, version: u64) -> Update {
        if self.streaming {
            Update::Item(Box::new(StreamItem::Task(task.clone())), Some(version))
        } else {
            Update::Progress { ends_stream: false }
        }
    }

    fn sink(&self, pending: Option<Message>, cancel: &CancellationToken) -> (EventSink, SinkProbe) {
        EventSink::new(SinkSetup {
            tasks: self.tasks.clone(),
            agent: self.agent.name.clone(),
            owner: self.owner.clone(),
            quota: self.quota.clone(),
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
            .status_at(viewer, &self.task_id)
            .filter(|(s, _)| s.state.is_terminal());
        if let Some((status, version)) = status {
            let item = StreamItem::StatusUpdate(TaskStatusUpdateEvent {
                task_id: self.task_id.clone(),
                context_id: self.context_id.clone(),
                status,
                metadata: None,
            });
            let update = Update::Item(Box::new(item), Some(version));
            let _ = self.tx.send(Ok(update)).await;
        }
    }

    async fn run(mut self) {
        let cancel = self.agent.work_token();
        let mut current = None;
        if let Some(id) = &self.continuing {
            // The task may have finished while this message waited for its turn.
            match (self.tasks).continue_with(id, &self.message, &cancel, self.streaming) {
                Some((t, version)) if !t.status.state.is_terminal() => {
                    // A caller that already left does not stop the work: it may come
                    // back with GetTask.
                    let _ = self.tx.send(Ok(self.update_for(&t, version))).await;
                    current = Some(t);
                }
                Some((t, _)) => {
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
            Err(
                BackendError::Failed(reason)
                | BackendError::Unavailable(reason)
                | BackendError::Refused(reason),
            ) if probe.has_task() => {
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
            Err(BackendError::Refused(reason)) => {
                let _ = self.tx.send(Err(GatewayError::InvalidParams(reason))).await;
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

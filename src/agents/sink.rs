//! The one way a backend reports progress. Every event is stored, published to subscribers
//! and forwarded to the caller that started the execution, in that order.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Immediate;
use crate::error::GatewayError;
use crate::protocol::model::{
    Artifact, Message, Metadata, StreamItem, Task, TaskArtifactUpdateEvent, TaskEvent, TaskState,
    TaskStatus, TaskStatusUpdateEvent,
};
use crate::tasks::{Applied, Tasks, Viewer};

/// The task is finished (canceled, say) or could not be stored; the backend should stop.
#[derive(Debug, thiserror::Error)]
#[error("task is closed")]
pub(crate) struct SinkClosed;

/// What the caller of an execution receives, in order.
#[derive(Debug)]
pub(crate) enum Update {
    /// A stream item, for callers that relay every event (streaming calls), with the
    /// version it made its task (none for a Message, or an event that said nothing new).
    /// Boxed: the channel allocates its slots 32 at a time, and an unboxed item made each
    /// open local stream carry 10 KiB of mostly empty slots.
    Item(Box<StreamItem>, Option<u64>),
    /// For callers that only wait (blocking and non-blocking sends): the task moved on, and
    /// whether it reached a state that ends a stream. Saves copying every event.
    Progress { ends_stream: bool },
}

pub(super) type CallerItem = Result<Update, GatewayError>;

/// How far an execution got; shared with the runtime so it can finish the job after the
/// backend (and with it the sink) is gone.
#[derive(Clone, Default)]
pub(crate) struct SinkProbe(Arc<AtomicU8>);

const PENDING: u8 = 0;
const HAS_TASK: u8 = 1;
const REPLIED: u8 = 2;

impl SinkProbe {
    /// The backend answered with neither a task event nor a Message.
    pub(crate) fn unanswered(&self) -> bool {
        self.0.load(Ordering::Acquire) == PENDING
    }

    pub(crate) fn has_task(&self) -> bool {
        self.0.load(Ordering::Acquire) == HAS_TASK
    }

    fn set(&self, phase: u8) {
        self.0.store(phase, Ordering::Release);
    }

    fn get(&self) -> u8 {
        self.0.load(Ordering::Acquire)
    }
}

/// Everything a sink needs; see [`EventSink`]'s fields.
pub(crate) struct SinkSetup {
    pub(crate) tasks: Arc<Tasks>,
    pub(crate) agent: Arc<str>,
    pub(crate) owner: Arc<str>,
    /// What the task's unfinished count goes to when not its owner.
    pub(crate) quota: Option<Arc<str>>,
    pub(crate) task_id: String,
    pub(crate) context_id: String,
    pub(crate) pending: Option<Message>,
    pub(crate) caller: mpsc::Sender<CallerItem>,
    pub(crate) relay: bool,
    pub(crate) cancel: CancellationToken,
}

pub(crate) struct EventSink {
    tasks: Arc<Tasks>,
    agent: Arc<str>,
    owner: Arc<str>,
    quota: Option<Arc<str>>,
    task_id: String,
    context_id: String,
    /// The user message of a new task. The task is only created when the backend first
    /// reports on it, because a backend may answer with a plain Message instead.
    pending: Option<Message>,
    phase: SinkProbe,
    caller: Option<mpsc::Sender<CallerItem>>,
    /// Whether the caller wants every item ([`Update::Item`]) or only progress.
    relay: bool,
    /// Stored with a new task, so that CancelTask can reach the work.
    cancel: CancellationToken,
    /// The tokens the task reported so far, where a budget stops streaming tasks.
    running: Option<Box<crate::usage::Tokens>>,
}

impl EventSink {
    /// A sink for a new task (`pending` holds its first message) or an existing one.
    pub(crate) fn new(setup: SinkSetup) -> (EventSink, SinkProbe) {
        let phase = SinkProbe::default();
        if setup.pending.is_none() {
            phase.set(HAS_TASK);
        }
        let sink = EventSink {
            tasks: setup.tasks,
            agent: setup.agent,
            owner: setup.owner,
            quota: setup.quota,
            task_id: setup.task_id,
            context_id: setup.context_id,
            pending: setup.pending,
            phase: phase.clone(),
            caller: Some(setup.caller),
            relay: setup.relay,
            cancel: setup.cancel,
            running: None,
        };
        (sink, phase)
    }

    pub(crate) fn task_id(&self) -> &str {
        &self.task_id
    }

    /// Sends to the caller; a caller that went away (non-blocking send answered, client
    /// disconnected) stops receiving but the work goes on.
    async fn forward(&mut self, item: CallerItem) {
        if let Some(tx) = &self.caller {
            if tx.send(item).await.is_err() {
                self.caller = None;
            }
        }
    }

    async fn ensure_task(&mut self) -> Result<(), SinkClosed> {
        match self.phase.get() {
            HAS_TASK => return Ok(()),
            REPLIED => return Err(SinkClosed),
            _ => {}
        }
        let Some(message) = self.pending.take() else {
            return Err(SinkClosed);
        };
        let task = Task::submitted(self.task_id.clone(), self.context_id.clone(), message);
        let update = if self.relay {
            Update::Item(Box::new(StreamItem::Task(task.clone())), Some(0))
        } else {
            Update::Progress { ends_stream: false }
        };
        // A streamed task keeps its events, for a client that loses its stream.
        match self.tasks.create_logged(
            self.agent.clone(),
            (self.owner.clone(), self.quota.take()),
            task,
            Some(self.cancel.clone()),
            self.relay,
        ) {
            Ok(()) => {
                self.phase.set(HAS_TASK);
                self.forward(Ok(update)).await;
                Ok(())
            }
            Err(e) => {
                self.phase.set(REPLIED);
                self.forward(Err(e.into())).await;
                Err(SinkClosed)
            }
        }
    }

    async fn emit(&mut self, event: TaskEvent) -> Result<(), SinkClosed> {
        self.ensure_task().await?;
        match self.tasks.apply_at(&self.task_id, &event) {
            (Applied::Yes, version) => {
                // A task that ended is answered once its tokens count against the budgets,
                // so that the caller's next call sees them.
                if event.finishes_task() {
                    if let Some(usage) = self.tasks.usage() {
                        usage.settled().await;
                    }
                }
                // Where a budget stops streaming tasks, the tokens this event reported are
                // checked against it (the event itself goes out first).
                let watched = (self.tasks.usage())
                    .filter(|u| u.stops_streaming())
                    .and_then(|u| Some((u.clone(), crate::tasks::tokens_of_event(&event)?)))
                    .filter(|_| !event.finishes_task());
                let update = if self.relay {
                    Update::Item(Box::new(event.into()), version)
                } else {
                    Update::Progress {
                        ends_stream: event.ends_stream(),
                    }
                };
                self.forward(Ok(update)).await;
                if let Some((usage, tokens)) = watched {
                    if let Some(error) = Box::pin(self.over_budget(&usage, tokens)).await {
                        return self.stop(error).await;
                    }
                }
                Ok(())
            }
            (Applied::TaskFinished | Applied::NotFound, _) => Err(SinkClosed),
        }
    }

    /// The refusal of a budget that stops streaming tasks, once the tokens this task
    /// reported (`tokens` the latest) reach it.
    async fn over_budget(
        &mut self,
        usage: &crate::usage::Usage,
        tokens: crate::usage::ModelTokens,
    ) -> Option<GatewayError> {
        let running = self.running.get_or_insert_with(Default::default);
        running.add(tokens);
        usage.stopped_by(&self.owner, &self.agent, running).await
    }

    /// Cancels the task, saying why (a budget it crossed), and stops its work.
    async fn stop(&mut self, error: GatewayError) -> Result<(), SinkClosed> {
        let why = Message::agent_text(format!("canceled: {error}"));
        let event = TaskEvent::Status(TaskStatusUpdateEvent {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            status: TaskStatus::now(TaskState::Canceled, Some(why)),
            metadata: None,
        });
        if let (Applied::Yes, version) = self.tasks.apply_at(&self.task_id, &event) {
            let update = match self.relay {
                true => Update::Item(Box::new(event.into()), version),
                false => Update::Progress { ends_stream: true },
            };
            self.forward(Ok(update)).await;
        }
        self.cancel.cancel();
        Err(SinkClosed)
    }

    /// Moves the task to `state`, with an optional agent message (kept in the history).
    pub(crate) async fn status(
        &mut self,
        state: TaskState,
        message: Option<Message>,
    ) -> Result<(), SinkClosed> {
        self.status_noted(state, message, None).await
    }

    /// [`Self::status`], adding `metadata` to the task's own (kept) and to the event.
    pub(crate) async fn status_noted(
        &mut self,
        state: TaskState,
        message: Option<Message>,
        metadata: Option<Metadata>,
    ) -> Result<(), SinkClosed> {
        if let Some(entries) = &metadata {
            self.ensure_task().await?;
            if self.tasks.annotate(&self.task_id, entries) != Applied::Yes {
                return Err(SinkClosed);
            }
        }
        let message = message.map(|m| m.placed(Some(&self.task_id), &self.context_id));
        let event = TaskEvent::Status(TaskStatusUpdateEvent {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            status: TaskStatus::now(state, message),
            metadata,
        });
        self.emit(event).await
    }

    /// The caller's earlier tasks with this agent in this task's context (not this task),
    /// at most `limit`, oldest first: a conversation's past turns.
    pub(crate) async fn earlier_in_context(&self, limit: usize) -> Result<Vec<Task>, GatewayError> {
        let viewer = Viewer {
            agent: &self.agent,
            principal: &self.owner,
        };
        self.tasks
            .context_tasks(viewer, &self.context_id, &self.task_id, limit)
            .await
    }

    /// Adds or extends an artifact.
    pub(crate) async fn artifact(
        &mut self,
        artifact: Artifact,
        append: bool,
        last_chunk: bool,
    ) -> Result<(), SinkClosed> {
        let event = TaskEvent::Artifact(TaskArtifactUpdateEvent {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            artifact,
            append,
            last_chunk,
            metadata: None,
        });
        self.emit(event).await
    }

    /// Reports an outcome known at once: the artifacts, then the status (or the reply).
    pub(crate) async fn settle(&mut self, outcome: Immediate) -> Result<(), SinkClosed> {
        match outcome {
            Immediate::Message(m) => self.reply(m).await,
            Immediate::Task {
                artifacts,
                state,
                message,
            } => {
                for a in artifacts {
                    self.artifact(a, false, true).await?;
                }
                self.status(state, message).await
            }
        }
    }

    /// Answers with a plain Message and no task. Once a task exists, a reply becomes the
    /// message of a completed status instead, since A2A has no other place for it.
    pub(crate) async fn reply(&mut self, message: Message) -> Result<(), SinkClosed> {
        match self.phase.get() {
            HAS_TASK => return self.status(TaskState::Completed, Some(message)).await,
            REPLIED => return Err(SinkClosed),
            _ => {
                self.pending = None;
                self.phase.set(REPLIED);
            }
        }
        let message = message.placed(None, &self.context_id);
        self.forward(Ok(Update::Item(
            Box::new(StreamItem::Message(message)),
            None,
        )))
        .await;
        Ok(())
    }
}

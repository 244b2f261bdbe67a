//! Tasks another replica runs (a shared store): their events reach this replica's callers
//! through the shared store, and a cancel or a follow-up message goes to the replica that
//! runs the work as a command, answered under a token of its own.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, Stream, StreamExt};
use serde::{Deserialize, Serialize};

use crate::error::GatewayError;
use crate::protocol::model::{Message, StreamEnd, StreamItem, Task, TaskEvent};
use crate::protocol::ops::ItemStream;
pub(crate) use crate::store::redis::Published;
use crate::store::Shared;

/// What one replica asks of the replica that runs a task.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Command {
    Cancel {
        id: String,
        reply: String,
    },
    Continue {
        agent: String,
        principal: String,
        anonymous: bool,
        message: Box<Message>,
        reply: String,
    },
}

impl Command {
    /// The list the answer goes to.
    pub(crate) fn reply_to(&self) -> &str {
        match self {
            Command::Cancel { reply, .. } | Command::Continue { reply, .. } => reply,
        }
    }
}

/// The answer to a [`Command`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Answer {
    /// The task after the command, and the version it had then.
    Task {
        task: Box<Task>,
        version: u64,
    },
    NotFound,
    /// The task had already finished, in this state (0.3 name).
    Finished(String),
    /// Refused there: the JSON-RPC error code and message it answered.
    Failed {
        code: i64,
        message: String,
    },
}

/// How long a replica has to answer a command.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

fn unavailable(reason: String) -> GatewayError {
    GatewayError::StoreUnavailable(reason)
}

pub(super) struct Forward {
    shared: Arc<Shared>,
}

impl Forward {
    pub(super) fn new(shared: Arc<Shared>) -> Forward {
        Forward { shared }
    }

    /// Sends a command to `replica` and waits for its answer.
    pub(super) async fn call(
        &self,
        replica: &str,
        make: impl FnOnce(String) -> Command,
    ) -> Result<Answer, GatewayError> {
        let reply = self.shared.reply_token();
        let command = serde_json::to_string(&make(reply.clone()))
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        let json = (self.shared)
            .call(replica, &reply, command, ANSWER_WITHIN)
            .await
            .map_err(unavailable)?;
        serde_json::from_str(&json).map_err(|e| GatewayError::Internal(e.to_string()))
    }

    /// The events of `task_id` published from now on. Subscribe before reading the task
    /// they follow, so that none is missed; those at or below its version are dropped.
    pub(super) async fn events(
        &self,
        task_id: &str,
    ) -> Result<impl Stream<Item = Published> + Send + 'static, GatewayError> {
        self.shared.events(task_id).await.map_err(unavailable)
    }

    /// The events a streamed task's log holds in the shared store, oldest first (none
    /// for a task nobody streamed).
    pub(super) async fn logged(&self, task_id: &str) -> Result<Vec<Published>, GatewayError> {
        self.shared.logged(task_id).await.map_err(unavailable)
    }
}

/// A stream of a task another replica runs, picked up after the event that made it
/// version `after`: the events after it from the task's log (`logged`), else the task as it
/// is now (`task`, at `version`); then the live `events`, to the task's end.
pub(super) fn resume(
    task: Task,
    version: u64,
    after: u64,
    logged: Vec<Published>,
    events: impl Stream<Item = Published> + Send + 'static,
) -> ItemStream {
    // Finished, and nothing after `after`: there is nothing to pick up.
    if task.status.state.is_terminal() && after >= version {
        return ItemStream::positioned(stream::empty());
    }
    let reaches = logged
        .first()
        .map_or(after == version, |p| p.version <= after + 1);
    if !reaches {
        return follow(task, version, events, StreamEnd::Terminal);
    }
    let missed: Vec<(StreamItem, u64)> = (logged.into_iter())
        .filter(|p| p.version > after)
        .map(|p| (StreamItem::from(TaskEvent::from(p.event)), p.version))
        .collect();
    let seen = missed.last().map_or(after, |(_, v)| *v);
    let ended = missed.iter().any(|(item, _)| item.finishes_task());
    // Finished, its last event not in the log (written as the log was read): that event.
    let finish = (!ended && task.status.state.is_terminal() && seen < version)
        .then(|| (task.status_event(), version));
    let done = ended || finish.is_some();
    let replayed =
        stream::iter(missed.into_iter().chain(finish)).map(|(item, at)| Ok((item, Some(at))));
    let live = events
        .filter(move |p| std::future::ready(p.version > seen))
        .map(|p| (StreamItem::from(TaskEvent::from(p.event)), p.version));
    let live = (!done).then(|| Box::pin(live));
    let live = stream::unfold(live, |live| async move {
        let mut live = live?;
        let (item, at) = live.next().await?;
        let next = (!StreamEnd::Terminal.closes(&item)).then_some(live);
        Some((Ok((item, Some(at))), next))
    });
    ItemStream::positioned(replayed.chain(live))
}

/// The caller's stream of a task another replica runs: `first`, then every event after
/// `version` until `end` closes the stream.
pub(super) fn follow(
    first: Task,
    version: u64,
    events: impl Stream<Item = Published> + Send + 'static,
    end: StreamEnd,
) -> ItemStream {
    let first = StreamItem::Task(first);
    // The task may have moved on by the time it was read: then it is all there is.
    let done = match end {
        StreamEnd::Terminal => first.finishes_task(),
        StreamEnd::Interrupted => first.ends_stream(),
    };
    let rest = events
        .filter(move |p| std::future::ready(p.version > version))
        .map(|p| (StreamItem::from(TaskEvent::from(p.event)), p.version));
    let rest = (!done).then(|| Box::pin(rest));
    let rest = stream::unfold(rest, move |rest| async move {
        let mut rest = rest?;
        let (item, at) = rest.next().await?;
        let next = (!end.closes(&item)).then_some(rest);
        Some((Ok((item, Some(at))), next))
    });
    let first = (first, Some(version));
    ItemStream::positioned(stream::once(async move { Ok(first) }).chain(rest))
}

/// `task` after the events that come until one ends a send (input needed, or finished).
pub(super) async fn settle(
    mut task: Task,
    version: u64,
    events: impl Stream<Item = Published> + Send + 'static,
) -> Task {
    if task.status.state.is_terminal() || task.status.state.is_interrupted() {
        return task;
    }
    let mut events = Box::pin(events.filter(move |p| std::future::ready(p.version > version)));
    while let Some(p) = events.next().await {
        let event = TaskEvent::from(p.event);
        task.apply(&event);
        if event.ends_stream() {
            break;
        }
    }
    task
}

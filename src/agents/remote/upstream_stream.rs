//! Upstream SSE calls relayed to the caller as they arrive.
//!
//! A send's stream ends where the caller's does (a Message, a terminal or interrupted
//! state). A subscription's stays open until the task ends; an upstream that closes it
//! sooner (servers that stop at `input-required`) is followed with `tasks/get` from there
//! on, and the caller sees the same kind of events either way. An upstream whose events
//! carry ids and whose connection breaks is asked to resume the task's stream after the
//! last one (`Last-Event-ID` on a subscription) before anything else is tried. An error as the upstream's
//! first event is returned as an error, so the caller gets a plain JSON-RPC error rather
//! than a stream holding one.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};

use super::failure::root_cause;
use super::sse::{SseDecoder, SseEvent};
use super::{wire, RemoteAgent};
use crate::error::GatewayError;
use crate::protocol::model::{
    Message, StreamEnd, StreamItem, Task, TaskArtifactUpdateEvent, TaskState, TaskStatus,
    TaskStatusUpdateEvent,
};
use crate::protocol::ops::ItemStream;

/// How often a subscription whose upstream stream ended early asks for the task.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Times one relayed stream reconnects to an upstream that resumes streams.
const MAX_RESUMES: u8 = 3;

/// State of one relayed upstream stream.
pub(super) struct Relay {
    agent: Arc<RemoteAgent>,
    end: StreamEnd,
    body: BoxStream<'static, Result<Bytes, super::BoxError>>,
    decoder: SseDecoder,
    pending: VecDeque<SseEvent>,
    /// Items ready before the caller asked for them: the first one, peeked at, or what
    /// one poll found.
    ready: VecDeque<StreamItem>,
    /// (task id, context id) once known, to report a broken stream on that task.
    task: Option<(String, String)>,
    /// What a subscriber has been shown, so that following by polling picks up there.
    shown: Shown,
    /// The artifact ids the caller has been shown a start of (see `convert`).
    artifacts: HashSet<String>,
    /// The upstream ended a subscription before the task ended: follow it with tasks/get.
    polling: bool,
    /// The id of the upstream's last event, if it sends ids (then it can resume).
    last_id: Option<String>,
    /// Times the stream was resumed after its connection broke.
    resumes: u8,
    /// The stream was resumed: a task snapshot from here on is shown as what changed.
    resumed: bool,
    done: bool,
}

impl Relay {
    fn new(
        agent: Arc<RemoteAgent>,
        end: StreamEnd,
        body: BoxStream<'static, Result<Bytes, super::BoxError>>,
        polling: bool,
    ) -> Relay {
        Relay {
            agent,
            end,
            body,
            decoder: SseDecoder::default(),
            pending: VecDeque::new(),
            ready: VecDeque::new(),
            task: None,
            shown: Shown::default(),
            artifacts: HashSet::new(),
            polling,
            last_id: None,
            resumes: 0,
            resumed: false,
            done: false,
        }
    }

    /// Starts relaying `body` and reads its first item.
    pub(super) async fn open(
        agent: Arc<RemoteAgent>,
        end: StreamEnd,
        body: BoxStream<'static, Result<Bytes, super::BoxError>>,
    ) -> Result<Relay, GatewayError> {
        let mut relay = Relay::new(agent, end, body, false);
        match relay.next_item().await {
            Some(Ok(first)) => {
                relay.ready.push_back(first);
                Ok(relay)
            }
            Some(Err(e)) => Err(e),
            None => Err(GatewayError::InvalidAgentResponse(format!(
                "agent {} ended its stream without an event",
                relay.agent.name
            ))),
        }
    }

    /// A subscription the upstream refused although the task is unfinished (servers
    /// with no producer running for a task waiting for input): `task` first, then what
    /// polling finds, until the task ends.
    pub(super) fn following(agent: Arc<RemoteAgent>, task: Task) -> Relay {
        let mut relay = Relay::new(agent, StreamEnd::Terminal, stream::empty().boxed(), true);
        relay.put_first(StreamItem::Task(task));
        relay
    }

    pub(super) fn first(&self) -> Option<&StreamItem> {
        self.ready.front()
    }

    /// Puts `item` before everything else (a subscription's Task, fetched).
    pub(super) fn put_first(&mut self, item: StreamItem) {
        self.note(&item);
        self.ready.push_front(item);
    }

    pub(super) fn into_stream(self) -> ItemStream {
        ItemStream::new(stream::unfold(self, |mut r| async move {
            let item = r.next_item().await?;
            Some((item, r))
        }))
    }

    fn ends(&self, item: &StreamItem) -> bool {
        self.end.closes(item)
    }

    async fn next_item(&mut self) -> Option<Result<StreamItem, GatewayError>> {
        if let Some(item) = self.ready.pop_front() {
            if self.ends(&item) {
                self.done = true;
                self.ready.clear();
            }
            return Some(Ok(item));
        }
        if self.done {
            return None;
        }
        if self.polling {
            return self.poll().await;
        }
        loop {
            if let Some(event) = self.pending.pop_front() {
                let item = self.convert(event);
                match &item {
                    Ok(i) if !self.ends(i) => {}
                    _ => self.done = true,
                }
                return Some(item);
            }
            let why = match self.body.next().await {
                Some(Ok(chunk)) => {
                    if let Err(e) = self.decoder.feed(&chunk, &mut self.pending) {
                        self.done = true;
                        return Some(Err(GatewayError::InvalidAgentResponse(e)));
                    }
                    continue;
                }
                Some(Err(e)) => {
                    tracing::warn!(agent = %self.agent.name, error = %root_cause(&*e), "upstream stream broke");
                    if self.resume().await {
                        continue;
                    }
                    "the upstream connection broke mid-stream"
                }
                None => "the upstream closed the stream before the task finished",
            };
            if self.end == StreamEnd::Terminal && self.task.is_some() {
                tracing::debug!(agent = %self.agent.name, why, "following the task by polling");
                self.polling = true;
                return self.poll().await;
            }
            return Some(self.broken(why));
        }
    }

    /// Reconnects a broken stream to an upstream that sends event ids: a subscription to
    /// the task with `Last-Event-ID`. False when it cannot (no ids, no task yet, too many
    /// tries, refused): the caller then follows the task another way.
    async fn resume(&mut self) -> bool {
        let (Some(last_id), Some((task_id, _))) = (self.last_id.clone(), self.task.clone()) else {
            return false;
        };
        if self.resumes >= MAX_RESUMES {
            return false;
        }
        self.resumes += 1;
        match self.agent.resume_stream(&task_id, &last_id).await {
            Ok(body) => {
                tracing::info!(agent = %self.agent.name, task = %task_id, "upstream stream resumed after its last event");
                self.body = body;
                self.decoder = SseDecoder::default();
                self.pending.clear();
                self.resumed = true;
                true
            }
            Err(e) => {
                tracing::warn!(agent = %self.agent.name, task = %task_id, error = %e, "the upstream did not resume its stream");
                false
            }
        }
    }

    /// Asks for the task until something changed, and returns the first change.
    async fn poll(&mut self) -> Option<Result<StreamItem, GatewayError>> {
        let (id, _) = self.task.clone()?;
        let mut first = true;
        while self.ready.is_empty() {
            if !std::mem::take(&mut first) {
                tokio::time::sleep(POLL_INTERVAL).await;
            }
            match self.agent.get(&id, Some(0)).await {
                Ok(task) => {
                    let changes = self.shown.changes(task);
                    self.ready.extend(changes);
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        Box::pin(self.next_item()).await
    }

    fn convert(&mut self, event: SseEvent) -> Result<StreamItem, GatewayError> {
        let name = &self.agent.name;
        if event.id.is_some() {
            self.last_id.clone_from(&event.id);
        }
        let raw = wire::read_response(name, event.data.as_bytes())?;
        let mut item = wire::read_stream_item(name, raw)?.ok_or_else(|| {
            GatewayError::InvalidAgentResponse(format!("agent {name} sent an empty stream event"))
        })?;
        self.agent.outward_item(&mut item);
        // Some upstreams mark an artifact's first chunk `append` (and repeat it whole,
        // not appended, as the last): a client cannot append to an artifact it does not
        // have, so the first chunk of an id starts it.
        if let StreamItem::ArtifactUpdate(a) = &mut item {
            if a.append && !self.artifacts.contains(&a.artifact.artifact_id) {
                a.append = false;
            }
        }
        // An upstream that opened the resumed stream with the task (rather than the
        // events after the id) shows what changed since, as polling does.
        if let (true, StreamItem::Task(task)) = (self.resumed, &item) {
            let mut changes = self.shown.changes(task.clone()).into_iter();
            match changes.next() {
                Some(first) => {
                    self.ready.extend(changes);
                    item = first;
                }
                None => return Ok(task.status_event()),
            }
        }
        self.note(&item);
        Ok(item)
    }

    fn note(&mut self, item: &StreamItem) {
        match item {
            StreamItem::Task(t) => {
                let ids = t.artifacts.iter().map(|a| a.artifact_id.clone());
                self.artifacts.extend(ids);
            }
            StreamItem::ArtifactUpdate(a) => {
                if !self.artifacts.contains(&a.artifact.artifact_id) {
                    self.artifacts.insert(a.artifact.artifact_id.clone());
                }
            }
            StreamItem::StatusUpdate(_) | StreamItem::Message(_) => {}
        }
        if self.task.is_none() {
            self.task = match item {
                StreamItem::Task(t) => Some((t.id.clone(), t.context_id.clone())),
                StreamItem::StatusUpdate(s) => Some((s.task_id.clone(), s.context_id.clone())),
                StreamItem::ArtifactUpdate(a) => Some((a.task_id.clone(), a.context_id.clone())),
                StreamItem::Message(_) => None,
            };
        }
        // Kept for every stream: what a resumed or polled one picks up from.
        self.shown.saw(item);
    }

    /// Ends the caller's stream with a failed status rather than leaving it hanging.
    fn broken(&mut self, why: &str) -> Result<StreamItem, GatewayError> {
        self.done = true;
        match self.task.take() {
            Some((task_id, context_id)) => Ok(StreamItem::StatusUpdate(TaskStatusUpdateEvent {
                task_id,
                context_id,
                status: TaskStatus::now(TaskState::Failed, Some(Message::agent_text(why))),
                metadata: None,
            })),
            None => Err(GatewayError::InvalidAgentResponse(format!(
                "agent {}: {why}",
                self.agent.name
            ))),
        }
    }
}

/// The status and artifacts a subscriber has been shown (artifact id -> parts).
#[derive(Default)]
struct Shown {
    status: Option<TaskStatus>,
    artifacts: HashMap<String, usize>,
}

impl Shown {
    fn saw(&mut self, item: &StreamItem) {
        match item {
            StreamItem::Task(t) => {
                self.status = Some(t.status.clone());
                self.artifacts = t
                    .artifacts
                    .iter()
                    .map(|a| (a.artifact_id.clone(), a.parts.len()))
                    .collect();
            }
            StreamItem::StatusUpdate(s) => self.status = Some(s.status.clone()),
            StreamItem::ArtifactUpdate(a) => {
                let parts = self
                    .artifacts
                    .entry(a.artifact.artifact_id.clone())
                    .or_default();
                if a.append {
                    *parts += a.artifact.parts.len();
                } else {
                    *parts = a.artifact.parts.len();
                }
            }
            StreamItem::Message(_) => {}
        }
    }

    /// The events that take a subscriber from what it was shown to `task`: each new or
    /// grown artifact whole, then the status if it moved.
    fn changes(&mut self, task: Task) -> Vec<StreamItem> {
        let mut out = Vec::new();
        for artifact in task.artifacts {
            if self.artifacts.get(&artifact.artifact_id) != Some(&artifact.parts.len()) {
                self.artifacts
                    .insert(artifact.artifact_id.clone(), artifact.parts.len());
                out.push(StreamItem::ArtifactUpdate(TaskArtifactUpdateEvent {
                    task_id: task.id.clone(),
                    context_id: task.context_id.clone(),
                    artifact,
                    append: false,
                    last_chunk: true,
                    metadata: None,
                }));
            }
        }
        let moved = self
            .status
            .as_ref()
            .is_none_or(|s| s.state != task.status.state || s.timestamp != task.status.timestamp);
        if moved {
            self.status = Some(task.status.clone());
            out.push(StreamItem::StatusUpdate(TaskStatusUpdateEvent {
                task_id: task.id,
                context_id: task.context_id,
                status: task.status,
                metadata: None,
            }));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::model::{Artifact, Part};

    fn task(state: TaskState, artifacts: Vec<(&str, usize)>) -> Task {
        let mut t = Task::submitted("t".into(), "c".into(), Message::agent_text("hi"));
        t.status = TaskStatus {
            state,
            message: None,
            timestamp: chrono::DateTime::from_timestamp(1_700_000_000, 0),
        };
        t.artifacts = artifacts
            .into_iter()
            .map(|(id, n)| Artifact {
                artifact_id: id.into(),
                name: None,
                description: None,
                parts: vec![Part::text("x"); n],
                metadata: None,
                extensions: vec![],
            })
            .collect();
        t
    }

    fn kinds(items: &[StreamItem]) -> Vec<&'static str> {
        items
            .iter()
            .map(|i| match i {
                StreamItem::Task(_) => "task",
                StreamItem::StatusUpdate(_) => "status",
                StreamItem::ArtifactUpdate(_) => "artifact",
                StreamItem::Message(_) => "message",
            })
            .collect()
    }

    #[test]
    fn polling_shows_only_what_changed() {
        let mut shown = Shown::default();
        shown.saw(&StreamItem::Task(task(
            TaskState::InputRequired,
            vec![("a", 1)],
        )));
        assert!(shown
            .changes(task(TaskState::InputRequired, vec![("a", 1)]))
            .is_empty());
        let mut working = task(TaskState::Working, vec![("a", 1)]);
        working.status.timestamp = chrono::DateTime::from_timestamp(1_700_000_001, 0);
        assert_eq!(kinds(&shown.changes(working)), ["status"]);
        let mut done = task(TaskState::Completed, vec![("a", 2), ("b", 1)]);
        done.status.timestamp = chrono::DateTime::from_timestamp(1_700_000_002, 0);
        let changes = shown.changes(done);
        assert_eq!(kinds(&changes), ["artifact", "artifact", "status"]);
        assert!(changes.last().is_some_and(StreamItem::finishes_task));
    }
}

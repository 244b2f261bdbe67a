//! Task storage and fan-out.
//!
//! [`TaskStore`] is the storage seam (in-memory today, something shared tomorrow).
//! [`Tasks`] puts a store together with the per-task event fan-out, and is the only way the
//! rest of the gateway changes a task, so that every update is stored and published as one
//! step: a subscriber gets the snapshot and then exactly the events after it, in order.

#[cfg(test)]
mod conformance;
mod conversation;
mod memory;
pub(crate) mod page;

use std::sync::Arc;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

pub(crate) use memory::MemoryTaskStore;

/// DashMap with a fast, DoS-resistant hasher; SipHash showed up in profiles.
pub(crate) type FastMap<K, V> = dashmap::DashMap<K, V, ahash::RandomState>;
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// How often replicas tell each other what their callers' unfinished tasks hold: a caller
/// starting tasks through several replicas at once can pass its quota by what it starts
/// in this time.
const UNFINISHED_EXCHANGE: std::time::Duration = std::time::Duration::from_millis(200);

use crate::protocol::model::{
    ApproxBytes, Message, StreamItem, Task, TaskEvent, TaskState, TaskStatus, TaskStatusUpdateEvent,
};
use crate::protocol::ops::ItemStream;
use crate::protocol::params::ListQuery;
use crate::store::Shared;
use crate::store::TaskRow;

/// The status message of a task whose work a restart took away; `work` says what it was
/// ("its program", see `Agent::work`).
pub(crate) fn lost_work(work: &str) -> String {
    format!("failed: the gateway stopped while this task was running, and {work} did not survive")
}

/// The status message of a task whose replica died (a shared store's survivors say so).
pub(crate) const REPLICA_LOST: &str =
    "failed: the gateway replica running this task stopped, and its work did not survive";

/// A task as stored: the task itself plus what the gateway needs to scope and order it.
#[derive(Debug, Clone)]
pub(crate) struct StoredTask {
    pub(crate) task: Task,
    /// The agent that owns the task; other agents answer "not found" for it.
    pub(crate) agent: Arc<str>,
    /// The principal that created it; everyone else is told it does not exist.
    pub(crate) owner: Arc<str>,
    /// What its unfinished count goes to when not `owner` (an anonymous caller's address).
    pub(crate) quota: Option<Arc<str>>,
    /// Creation order, the tie-breaker when status timestamps are equal.
    pub(crate) seq: u64,
    /// How many events the task took (other replicas' subscribers order by it).
    pub(crate) version: u64,
    /// The replica that runs a task read from a shared store; None: this one.
    pub(crate) replica: Option<Arc<str>>,
    /// Stops the work in progress on this task; dropped once the task finishes.
    pub(crate) cancel: Option<CancellationToken>,
    /// What the task takes in memory, approximately ([`ApproxBytes`]); the store's byte
    /// bound counts it.
    pub(crate) bytes: usize,
    /// The task's latest events, kept from when it was first streamed so that a client
    /// that lost its stream can resume it; none for a task nobody streamed.
    pub(crate) log: Option<Box<EventLog>>,
    /// What usage counts of it while it runs (none while usage counts nothing).
    pub(crate) metered: Option<Box<Metered>>,
}

/// A running task as usage sees it: when it started, and the tokens its events reported.
#[derive(Debug, Clone)]
pub(crate) struct Metered {
    started: std::time::Instant,
    reported: crate::usage::Tokens,
}

/// The tokens an event reports: in its metadata, its status message's or its artifact's.
pub(crate) fn tokens_of_event(event: &TaskEvent) -> Option<crate::usage::ModelTokens> {
    match event {
        TaskEvent::Status(s) => tokens_of_status(s),
        TaskEvent::Artifact(a) => tokens_of_artifact(a),
    }
}

pub(crate) fn tokens_of_status(
    s: &crate::protocol::model::TaskStatusUpdateEvent,
) -> Option<crate::usage::ModelTokens> {
    use crate::usage::tokens::in_metadata;
    in_metadata(s.metadata.as_ref())
        .or_else(|| in_metadata(s.status.message.as_ref().and_then(|m| m.metadata.as_ref())))
}

pub(crate) fn tokens_of_artifact(
    a: &crate::protocol::model::TaskArtifactUpdateEvent,
) -> Option<crate::usage::ModelTokens> {
    use crate::usage::tokens::in_metadata;
    in_metadata(a.metadata.as_ref()).or_else(|| in_metadata(a.artifact.metadata.as_ref()))
}

/// The tokens a task reports as its total: in its metadata, or its status message's;
/// else what its artifacts' metadata add up to.
pub(crate) fn tokens_of_task(task: &Task) -> crate::usage::Tokens {
    use crate::usage::tokens::in_metadata;
    let found = in_metadata(task.metadata.as_ref()).or_else(|| {
        in_metadata(
            task.status
                .message
                .as_ref()
                .and_then(|m| m.metadata.as_ref()),
        )
    });
    let mut tokens = crate::usage::Tokens::default();
    match found {
        Some(total) => tokens.add(total),
        None => (task.artifacts.iter())
            .filter_map(|a| in_metadata(a.metadata.as_ref()))
            .for_each(|t| tokens.add(t)),
    }
    tokens
}

/// One event of a task with the version it made.
#[derive(Debug)]
pub(crate) struct Logged {
    pub(crate) version: u64,
    pub(crate) item: StreamItem,
}

pub(crate) use crate::store::RESUME_EVENTS;

/// A task's latest events, oldest first, at most [`RESUME_EVENTS`], and what they take in
/// memory (counted in the task's bytes: the store's byte bound holds the log too).
#[derive(Debug, Default, Clone)]
pub(crate) struct EventLog {
    events: std::collections::VecDeque<Arc<Logged>>,
    bytes: usize,
}

impl EventLog {
    fn push(&mut self, entry: Arc<Logged>) {
        if self.events.len() == RESUME_EVENTS {
            if let Some(oldest) = self.events.pop_front() {
                self.bytes = self.bytes.saturating_sub(oldest.item.approx_bytes());
            }
        }
        self.bytes += entry.item.approx_bytes();
        self.events.push_back(entry);
    }

    /// The events after `version`, if the log reaches back to the one right after it.
    /// `current` is the task's version: an empty log reaches back only to it (a log made
    /// after the task's events, for a task nobody streamed, holds none of them).
    fn after(&self, version: u64, current: u64) -> Option<Vec<Arc<Logged>>> {
        let oldest = self.events.front().map_or(current + 1, |e| e.version);
        match oldest > version + 1 {
            true => None,
            false => Some(
                (self.events.iter())
                    .filter(|e| e.version > version)
                    .cloned()
                    .collect(),
            ),
        }
    }
}

/// Where a resumed stream starts (see [`Tasks::resume`]).
pub(crate) enum Resumed {
    /// The events after the client's last, from the log.
    Events(Vec<Arc<Logged>>),
    /// The log does not reach back that far: the task as it is now, at its version.
    Snapshot(Box<Task>, u64),
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Only unfinished tasks are left, and they take all the store may hold: the bound
    /// reached, as "N unfinished tasks" or "N bytes of unfinished tasks".
    #[error("the task store is full of unfinished tasks ({0})")]
    Full(String),
    #[error("task {0} already exists")]
    Duplicate(String),
    #[error("invalid page token")]
    BadPageToken,
    #[error("task id {0} is not a UUID")]
    BadId(String),
    /// The caller holds its quota of unfinished tasks, as "N unfinished tasks" or "N
    /// bytes of unfinished tasks".
    #[error("the caller holds its maximum of {0}")]
    Quota(String),
}

pub(crate) struct TaskPage {
    pub(crate) tasks: Vec<Task>,
    pub(crate) next_page_token: String,
    pub(crate) total_size: usize,
}

/// Storage for tasks. Closures passed to `read`/`update` run while the store holds that
/// task's lock, so updates to one task are serialized and observed atomically.
pub(crate) trait TaskStore: Send + Sync + 'static {
    /// Adds a task. When full, the oldest finished tasks make room first.
    fn insert(&self, task: StoredTask) -> Result<(), StoreError> {
        self.insert_answered(task, None)
    }
    /// [`Self::insert`] for a task whose answer wrote it as a durable store does
    /// (`stored_form`, see `service::WrittenAnswer`): the store keeps those bytes.
    fn insert_answered(
        &self,
        task: StoredTask,
        stored_form: Option<Box<[u8]>>,
    ) -> Result<(), StoreError>;
    /// Takes in a task read back from durable storage, as [`Self::insert`] without writing
    /// it again.
    fn restore(&self, task: StoredTask) -> Result<(), StoreError>;
    /// Deletes the finished tasks whose status is older than `cutoff`; returns how many.
    fn prune_finished(&self, cutoff: chrono::DateTime<chrono::Utc>) -> usize;
    /// Runs `f` on the task; false when there is no such task.
    fn read(&self, id: &str, f: &mut dyn FnMut(&StoredTask)) -> bool;
    /// Runs `f` on the task mutably; false when there is no such task.
    fn update(&self, id: &str, f: &mut dyn FnMut(&mut StoredTask)) -> bool;
    /// One page of an agent's tasks, newest status first (full tasks; callers trim them).
    fn list(&self, viewer: Viewer<'_>, query: &ListQuery) -> Result<TaskPage, StoreError>;
    /// Tasks waiting for input (or auth) since before `cutoff`.
    fn interrupted_before(&self, cutoff: chrono::DateTime<chrono::Utc>) -> Vec<String>;
    fn len(&self) -> usize;
    /// Keeps a copy of a task another replica runs, as read from the shared store:
    /// readable until a fresher copy replaces it, never changed here.
    fn adopt_foreign(&self, task: StoredTask);
    /// Whether the task is this replica's own (not a copy of another's).
    fn holds(&self, id: &str) -> bool;
    /// How many tasks are in each state (for metrics; visits every task).
    fn count_by_state(&self) -> Vec<(TaskState, usize)>;
    /// The tasks' bytes, the bound on them, and the largest task's (for metrics; visits
    /// every task).
    fn byte_figures(&self) -> (usize, usize, usize);
}

impl StoredTask {
    /// What the task's unfinished count goes to: its quota key, else its owner.
    fn counted_as(&self) -> &Arc<str> {
        self.quota.as_ref().unwrap_or(&self.owner)
    }

    /// What the task's resume log takes (part of [`StoredTask::bytes`]).
    fn log_bytes(&self) -> usize {
        self.log.as_ref().map_or(0, |log| log.bytes)
    }

    /// Counts the log's change since it took `before` bytes in the task's bytes, and
    /// returns it (signed: the log drops its oldest events as it takes new ones).
    fn count_log(&mut self, before: usize) -> isize {
        let now = self.log_bytes();
        self.bytes = (self.bytes + now).saturating_sub(before);
        now as isize - before as isize
    }

    /// A task a store held, as `replica` runs it (None: this one), with no work here.
    fn read_back(row: TaskRow, replica: Option<Arc<str>>) -> StoredTask {
        let log = (!row.events.is_empty()).then(|| {
            let mut log = Box::<EventLog>::default();
            for (version, event) in row.events {
                let item = StreamItem::from(event);
                log.push(Arc::new(Logged { version, item }));
            }
            log
        });
        let bytes = row.task.approx_bytes() + log.as_ref().map_or(0, |log| log.bytes);
        StoredTask {
            task: row.task,
            agent: row.agent,
            owner: row.owner,
            quota: None,
            seq: row.seq,
            version: row.version,
            replica,
            cancel: None,
            bytes,
            log,
            metered: None,
        }
    }
}

/// Who is looking: tasks are visible only through their agent, to their creator.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Viewer<'a> {
    pub(crate) agent: &'a str,
    pub(crate) principal: &'a str,
}

impl Viewer<'_> {
    pub(crate) fn sees(&self, st: &StoredTask) -> bool {
        &*st.agent == self.agent && &*st.owner == self.principal
    }
}

/// Subscribers per task. Channels exist only while someone listens, so idle tasks cost
/// nothing here.
#[derive(Default)]
struct Fanout {
    channels: FastMap<String, broadcast::Sender<Arc<Logged>>>,
}

/// Small on purpose: subscribers that fall this far behind are told and cut off rather
/// than holding memory for everyone.
const SUBSCRIBER_BUFFER: usize = 128;

impl Fanout {
    fn subscribe(&self, id: &str) -> broadcast::Receiver<Arc<Logged>> {
        self.channels
            .entry(id.to_string())
            .or_insert_with(|| broadcast::channel(SUBSCRIBER_BUFFER).0)
            .subscribe()
    }

    /// Publishes the event that made a task `version`, and keeps it in the task's `log`.
    /// `item` is only built when someone listens or a log keeps it: most tasks have
    /// neither.
    fn publish(
        &self,
        id: &str,
        version: u64,
        item: impl FnOnce() -> StreamItem,
        ends: bool,
        log: Option<&mut EventLog>,
    ) {
        let tx = self.channels.get(id);
        if tx.is_none() && log.is_none() {
            return;
        }
        let entry = Arc::new(Logged {
            version,
            item: item(),
        });
        if let Some(log) = log {
            log.push(entry.clone());
        }
        let Some(tx) = tx else {
            return;
        };
        let abandoned = tx.send(entry).is_err();
        drop(tx);
        if ends || abandoned {
            self.channels.remove(id);
        }
    }
}

/// The outcome of applying an event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    Yes,
    /// The task had already finished (say, canceled meanwhile): the event was dropped.
    TaskFinished,
    NotFound,
}

pub(crate) struct Tasks {
    store: Arc<dyn TaskStore>,
    fanout: Fanout,
    seq: std::sync::atomic::AtomicU64,
    /// Unfinished tasks per owner, so that one caller cannot fill the store for everyone.
    unfinished: FastMap<Arc<str>, Held>,
    /// With a shared store: what each owner's unfinished tasks hold on the other replicas,
    /// as they last said (see [`Tasks::exchange_unfinished`]); the quota covers both.
    elsewhere: arc_swap::ArcSwap<HashMap<Arc<str>, Held>>,
    quota: Quota,
    metrics: Arc<crate::telemetry::Metrics>,
    /// With a store other replicas share: where events go for their subscribers, and
    /// where their tasks are read.
    shared: std::sync::OnceLock<(crate::store::Journal, Arc<Shared>)>,
    /// With a durable store: where the events of streamed tasks are kept (and, for a
    /// shared store, every event goes for other replicas).
    journal: std::sync::OnceLock<crate::store::Journal>,
    /// Where a task's end is counted.
    usage: std::sync::OnceLock<Arc<crate::usage::Usage>>,
    /// Where answers wait for the store (a shared one, synced commits): what a stream's
    /// first item waits for.
    answers_wait_for: std::sync::OnceLock<crate::store::Journal>,
}

/// A task that ended, as usage counts it.
struct Ended {
    owner: Arc<str>,
    agent: Arc<str>,
    state: &'static str,
    ms: i64,
    tokens: crate::usage::Tokens,
}

/// What one owner's unfinished tasks hold.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    tasks: usize,
    bytes: usize,
}

/// What one owner may hold in unfinished tasks at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Quota {
    pub(crate) tasks: usize,
    pub(crate) bytes: usize,
}

impl Tasks {
    pub(crate) fn new(
        store: Arc<dyn TaskStore>,
        quota: Quota,
        metrics: Arc<crate::telemetry::Metrics>,
    ) -> Tasks {
        Tasks {
            metrics,
            store,
            fanout: Fanout::default(),
            seq: Default::default(),
            unfinished: FastMap::default(),
            elsewhere: Default::default(),
            quota: Quota {
                tasks: quota.tasks.max(1),
                bytes: quota.bytes.max(1),
            },
            shared: std::sync::OnceLock::new(),
            journal: std::sync::OnceLock::new(),
            usage: std::sync::OnceLock::new(),
            answers_wait_for: std::sync::OnceLock::new(),
        }
    }

    /// Counts tasks' ends (their state, time and tokens) in `usage`.
    pub(crate) fn count_usage(&self, usage: Arc<crate::usage::Usage>) {
        let _ = self.usage.set(usage);
    }

    /// Where usage is counted.
    pub(crate) fn usage(&self) -> Option<&Arc<crate::usage::Usage>> {
        self.usage.get()
    }

    /// Usage, while it wants tasks' tokens.
    fn metering(&self) -> Option<&Arc<crate::usage::Usage>> {
        self.usage.get().filter(|u| u.wants_tokens())
    }

    /// Counts a task that ended: `ended` is what the store's update took of it.
    fn count_end(&self, ended: Option<Ended>) {
        if let (Some(e), Some(usage)) = (ended, self.usage.get()) {
            usage.task_ended(crate::usage::TaskEnd {
                caller: &e.owner,
                agent: &e.agent,
                state: Some(e.state),
                ms: e.ms,
                tokens: e.tokens,
            });
        }
    }

    /// Keeps the events of streamed tasks in a durable store, through `journal`.
    pub(crate) fn keep_events(&self, journal: crate::store::Journal) {
        let _ = self.journal.set(journal);
    }

    /// Shares tasks with other replicas: every later event goes through `journal` too,
    /// and their tasks are read from `shared`.
    pub(crate) fn share(&self, journal: crate::store::Journal, shared: Arc<Shared>) {
        let _ = self.journal.set(journal.clone());
        let _ = self.shared.set((journal, shared));
    }

    /// Streams' first items wait for what `journal` writes (see [`Self::first_written`]).
    pub(crate) fn answers_wait_for(&self, journal: crate::store::Journal) {
        let _ = self.answers_wait_for.set(journal);
    }

    /// `items` with its first item held until what changed so far is written, where
    /// answers wait for the store: the task a streamed send's client saw is there for
    /// another replica when its own dies (or after a crash, with synced commits), as a
    /// blocking send's is. The later events go at once (a replica that dies may have sent
    /// some unwritten: its task's failure is numbered past them). Unchanged elsewhere.
    pub(crate) fn first_written(&self, items: ItemStream) -> ItemStream {
        use futures_util::StreamExt;
        let Some(journal) = self.answers_wait_for.get().cloned() else {
            return items;
        };
        let mut items = items.with_positions();
        let held = futures_util::stream::once(async move {
            let first = items.next().await;
            if first.is_some() && !journal.settled().await {
                tracing::warn!("a stream's first event went before the store took its task: other replicas see it once the store is back");
            }
            futures_util::stream::iter(first).chain(items)
        });
        ItemStream::positioned(held.flatten())
    }

    /// The store other replicas share, if any.
    pub(crate) fn shared(&self) -> Option<&Arc<Shared>> {
        self.shared.get().map(|(_, shared)| shared)
    }

    /// Makes a task another replica created readable here: a fresh copy from the shared
    /// store (nothing to do for this replica's own tasks, or without a shared store).
    pub(crate) async fn hydrate(&self, id: &str) -> Result<(), crate::error::GatewayError> {
        let Some(shared) = self.shared() else {
            return Ok(());
        };
        if id.is_empty() || self.store.holds(id) || uuid::Uuid::try_parse(id).is_err() {
            return Ok(());
        }
        let found = shared
            .task(id)
            .await
            .map_err(crate::error::GatewayError::StoreUnavailable)?;
        // A task of this replica's that its memory evicted (finished) is read back the same
        // way, as a read-only copy.
        if let Some(envelope) = found {
            let replica = Some(Arc::<str>::from(envelope.replica.as_str()));
            let row = TaskRow::from(envelope);
            self.store
                .adopt_foreign(StoredTask::read_back(row, replica));
        }
        Ok(())
    }

    /// Whether the task is this replica's own (not another replica's, nor unknown).
    pub(crate) fn holds(&self, id: &str) -> bool {
        self.store.holds(id)
    }

    /// The task with its version, whoever owns it (for a replica answering another, which
    /// checked the caller already).
    pub(crate) fn inspect_any(&self, id: &str) -> Option<(Task, u64)> {
        let mut out = None;
        self.store
            .read(id, &mut |st| out = Some((st.task.clone(), st.version)));
        out
    }

    /// The replica that runs the task when it is another one's (a copy read through
    /// [`Self::hydrate`]), with the copy and its version.
    pub(crate) fn held_elsewhere(
        &self,
        viewer: Viewer<'_>,
        id: &str,
    ) -> Option<(Arc<str>, Task, u64)> {
        let mut out = None;
        self.store.read(id, &mut |st| {
            if let (true, Some(replica)) = (viewer.sees(st), &st.replica) {
                out = Some((replica.clone(), st.task.clone(), st.version));
            }
        });
        out
    }

    /// One page of the caller's tasks with an agent across every replica (a shared store);
    /// None without one.
    pub(crate) async fn list_shared(
        &self,
        viewer: Viewer<'_>,
        query: &ListQuery,
    ) -> Option<Result<TaskPage, crate::error::GatewayError>> {
        let shared = self.shared()?;
        let all = match shared.tasks_of(viewer.agent, viewer.principal).await {
            Ok(all) => all,
            Err(e) => return Some(Err(crate::error::GatewayError::StoreUnavailable(e))),
        };
        let matching: Vec<_> = all
            .into_iter()
            .filter(|e| {
                let t = &e.task;
                page::admits(query, &t.context_id, t.status.state, t.status.timestamp)
            })
            .map(|e| {
                (
                    page::sort_key(e.task.status.timestamp, e.seq, &e.task.id),
                    e.task,
                )
            })
            .collect();
        Some(
            page::page(matching, query)
                .map(|(tasks, next_page_token, total_size)| TaskPage {
                    tasks,
                    next_page_token,
                    total_size,
                })
                .map_err(Into::into),
        )
    }

    /// [`Self::create_logged`] for a task answered as it was made, which its answer wrote as
    /// `stored_form` (see `service::WrittenAnswer`).
    pub(crate) fn create_answered(
        &self,
        agent: Arc<str>,
        owner: (Arc<str>, Option<Arc<str>>),
        task: Task,
        stored_form: Option<Box<[u8]>>,
    ) -> Result<(), StoreError> {
        self.create_stored(agent, owner, task, None, false, stored_form)
    }

    /// Whether tasks are written to a durable store.
    pub(crate) fn written_through(&self) -> bool {
        self.journal.get().is_some()
    }

    /// Stores a new task whose work, if any is still going on, `cancel` can stop. An
    /// unfinished one counts against its owner's quota until it finishes.
    /// `owner` is the task's owner and what its unfinished count goes to when not the
    /// owner (see [`StoredTask::quota`]); `streamed`: the task's events are kept for
    /// resuming its stream.
    pub(crate) fn create_logged(
        &self,
        agent: Arc<str>,
        owner: (Arc<str>, Option<Arc<str>>),
        task: Task,
        cancel: Option<CancellationToken>,
        streamed: bool,
    ) -> Result<(), StoreError> {
        self.create_stored(agent, owner, task, cancel, streamed, None)
    }

    fn create_stored(
        &self,
        agent: Arc<str>,
        owner: (Arc<str>, Option<Arc<str>>),
        task: Task,
        cancel: Option<CancellationToken>,
        streamed: bool,
        stored_form: Option<Box<[u8]>>,
    ) -> Result<(), StoreError> {
        let (owner, quota) = owner;
        let counted = !task.status.state.is_terminal();
        let bytes = task.approx_bytes();
        let counted_as = quota.as_ref().unwrap_or(&owner);
        if counted {
            let other = self.unfinished_elsewhere(counted_as);
            let mut held = self.unfinished.entry(counted_as.clone()).or_default();
            if held.tasks + other.tasks >= self.quota.tasks {
                return Err(StoreError::Quota(format!(
                    "{} unfinished tasks",
                    self.quota.tasks
                )));
            }
            if held.bytes + other.bytes + bytes > self.quota.bytes {
                return Err(StoreError::Quota(format!(
                    "{} of unfinished tasks",
                    crate::config::bytes_text(self.quota.bytes as u64)
                )));
            }
            held.tasks += 1;
            held.bytes += bytes;
        }
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.metrics
            .task_entered(&agent, task.status.state.v03_name());
        let counted_as = counted.then(|| counted_as.clone());
        let metered = self.metering().map(|_| {
            Box::new(Metered {
                started: std::time::Instant::now(),
                reported: Default::default(),
            })
        });
        let ended = match (&metered, counted) {
            // Made finished (an answer in one go): it ends here.
            (Some(_), false) => Some(Ended {
                owner: owner.clone(),
                agent: agent.clone(),
                state: task.status.state.v03_name(),
                ms: 0,
                tokens: tokens_of_task(&task),
            }),
            _ => None,
        };
        let metered = metered.filter(|_| counted);
        let stored = StoredTask {
            task,
            agent,
            owner,
            quota,
            seq,
            version: 0,
            replica: None,
            cancel,
            bytes,
            log: streamed.then(Box::default),
            metered,
        };
        let inserted = self.store.insert_answered(stored, stored_form);
        if let (Err(_), Some(counted_as)) = (&inserted, counted_as) {
            self.finished(&counted_as, bytes);
        }
        if inserted.is_ok() {
            self.count_end(ended);
        }
        inserted
    }

    /// Takes in the tasks a durable store held. A task that was unfinished lost its work
    /// with the process that ran it: it is marked failed, saying so (`work_of` its agent
    /// says what the work was), and written back. Returns the ids of those failed so.
    pub(crate) fn restore(
        &self,
        rows: Vec<TaskRow>,
        work_of: &dyn Fn(&str) -> &'static str,
    ) -> Result<Vec<String>, StoreError> {
        let mut failed = Vec::new();
        for row in rows {
            self.seq
                .fetch_max(row.seq + 1, std::sync::atomic::Ordering::Relaxed);
            let mut stored = StoredTask::read_back(row, None);
            let task = &mut stored.task;
            let unfinished = !task.status.state.is_terminal();
            if unfinished {
                let note = Message::agent_text(lost_work(work_of(&stored.agent)))
                    .placed(Some(&task.id), &task.context_id);
                task.set_status(TaskStatus::now(TaskState::Failed, Some(note)));
                failed.push(task.id.clone());
                // An event like any other: a stream picked up after the restart ends with it,
                // numbered past whatever the crashed process sent without writing it.
                stored.version += crate::store::UNWRITTEN_EVENTS;
                if let Some(log) = stored.log.as_deref_mut() {
                    let item = stored.task.status_event();
                    let version = stored.version;
                    log.push(Arc::new(Logged { version, item }));
                }
                stored.bytes = stored.task.approx_bytes() + stored.log_bytes();
            }
            match unfinished {
                true => self.store.insert(stored),
                false => self.store.restore(stored),
            }
            .or_else(|e| match e {
                // A store restored over a lower max_tasks keeps the newest it can.
                StoreError::Full(_) => Ok(()),
                e => Err(e),
            })?;
        }
        Ok(failed)
    }

    /// Deletes finished tasks older than `retention`; returns how many.
    pub(crate) fn prune(&self, retention: std::time::Duration) -> usize {
        match chrono::Duration::from_std(retention) {
            Ok(age) => self.store.prune_finished(chrono::Utc::now() - age),
            Err(_) => 0,
        }
    }

    /// What `owner`'s unfinished tasks hold on the other replicas (nothing without a
    /// shared store).
    fn unfinished_elsewhere(&self, owner: &Arc<str>) -> Held {
        if self.shared.get().is_none() {
            return Held::default();
        }
        self.elsewhere
            .load()
            .get(owner)
            .copied()
            .unwrap_or_default()
    }

    /// With a shared store, every [`UNFINISHED_EXCHANGE`]: tells the other replicas what
    /// each owner's unfinished tasks hold here, and learns what they hold there, so that a
    /// caller's quota is one across replicas. Until `tasks` is dropped.
    pub(crate) async fn exchange_unfinished(tasks: std::sync::Weak<Tasks>) {
        loop {
            let Some(here) = tasks.upgrade() else {
                return;
            };
            let Some(shared) = here.shared().cloned() else {
                return;
            };
            let held: Vec<(String, u64, u64)> = (here.unfinished.iter())
                .map(|e| (e.key().to_string(), e.tasks as u64, e.bytes as u64))
                .collect();
            drop(here);
            match shared.exchange_unfinished(held).await {
                Ok(others) => {
                    let Some(here) = tasks.upgrade() else {
                        return;
                    };
                    let others = (others.into_iter())
                        .map(|(owner, (tasks, bytes))| {
                            let held = Held {
                                tasks: usize::try_from(tasks).unwrap_or(usize::MAX),
                                bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
                            };
                            (Arc::from(owner), held)
                        })
                        .collect();
                    here.elsewhere.store(Arc::new(others));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "store: could not exchange unfinished counts")
                }
            }
            tokio::time::sleep(UNFINISHED_EXCHANGE).await;
        }
    }

    /// One of `owner`'s tasks, of `bytes`, finished: it no longer counts against the
    /// quota.
    fn finished(&self, owner: &Arc<str>, bytes: usize) {
        if let Some(mut held) = self.unfinished.get_mut(owner) {
            held.tasks = held.tasks.saturating_sub(1);
            held.bytes = held.bytes.saturating_sub(bytes);
        }
        self.unfinished.remove_if(owner, |_, held| held.tasks == 0);
    }

    /// An unfinished task of `owner`'s grew (or shrank) by `bytes`.
    fn resized(&self, owner: &Arc<str>, bytes: isize) {
        if bytes == 0 {
            return;
        }
        if let Some(mut held) = self.unfinished.get_mut(owner) {
            held.bytes = held.bytes.saturating_add_signed(bytes);
        }
    }

    /// Cancels the tasks left waiting for input (or auth) longer than `ttl`, stopping
    /// their work; returns how many.
    pub(crate) fn expire_interrupted(&self, ttl: std::time::Duration) -> usize {
        let Ok(ttl) = chrono::Duration::from_std(ttl) else {
            return 0;
        };
        let cutoff = chrono::Utc::now() - ttl;
        let mut expired = 0;
        let note = format!("canceled: no answer came within {} s", ttl.num_seconds());
        for id in self.store.interrupted_before(cutoff) {
            if self.cancel(&id, Some(Message::agent_text(note.clone()))) == Applied::Yes {
                expired += 1;
            }
        }
        expired
    }

    /// Stops the work in progress on a task and marks it canceled, with `note` as its
    /// status message; stored and published like any other event. Callers check first
    /// that the caller may see it.
    pub(crate) fn cancel(&self, id: &str, note: Option<Message>) -> Applied {
        let mut context_id = None;
        self.store.read(id, &mut |st| {
            if let Some(token) = &st.cancel {
                token.cancel();
            }
            context_id = Some(st.task.context_id.clone());
        });
        let Some(context_id) = context_id else {
            return Applied::NotFound;
        };
        let event = TaskEvent::Status(TaskStatusUpdateEvent {
            task_id: id.to_string(),
            context_id,
            status: TaskStatus::now(TaskState::Canceled, note),
            metadata: None,
        });
        self.apply(id, &event)
    }

    /// The agent that owns a task.
    pub(crate) fn owner(&self, id: &str) -> Option<Arc<str>> {
        let mut out = None;
        self.store.read(id, &mut |st| out = Some(st.agent.clone()));
        out
    }

    /// Reads the agent's task through `f` without copying it.
    pub(crate) fn inspect<R>(
        &self,
        viewer: Viewer<'_>,
        id: &str,
        f: impl FnOnce(&Task) -> R,
    ) -> Option<R> {
        let mut f = Some(f);
        let mut out = None;
        self.store.read(id, &mut |st| {
            if viewer.sees(st) {
                if let Some(f) = f.take() {
                    out = Some(f(&st.task));
                }
            }
        });
        out
    }

    /// Stores and publishes one event. Events for finished tasks are dropped, which is what
    /// makes cancel final even while the backend is still producing output.
    pub(crate) fn apply(&self, id: &str, event: &TaskEvent) -> Applied {
        self.apply_at(id, event).0
    }

    /// [`Self::apply`], with the version the event made (none when it was dropped or said
    /// nothing new).
    pub(crate) fn apply_at(&self, id: &str, event: &TaskEvent) -> (Applied, Option<u64>) {
        let mut applied = Applied::TaskFinished;
        let mut version = None;
        let mut logged = false;
        let mut ended = None;
        let found = self.store.update(id, &mut |st| {
            if st.task.status.state.is_terminal() {
                return;
            }
            // A bare status the task is already in says nothing new to subscribers (a
            // follow-up already moved the task to working before its backend says so).
            if let TaskEvent::Status(s) = event {
                if s.status.message.is_none() && s.status.state == st.task.status.state {
                    applied = Applied::Yes;
                    return;
                }
            }
            let before = st.task.status.state;
            let (held, log_before) = (st.bytes, st.log_bytes());
            st.task.apply(event);
            let added = event.approx_bytes();
            st.bytes += added;
            if st.task.status.state != before {
                self.metrics
                    .task_entered(&st.agent, st.task.status.state.v03_name());
            }
            if let Some(metered) = st.metered.as_deref_mut() {
                if let Some(tokens) = tokens_of_event(event) {
                    metered.reported.add(tokens);
                }
            }
            let finished = st.task.status.state.is_terminal();
            if finished {
                st.cancel = None;
                self.finished(st.counted_as(), held);
                if let Some(metered) = st.metered.take() {
                    ended = Some(Ended {
                        owner: st.owner.clone(),
                        agent: st.agent.clone(),
                        state: st.task.status.state.v03_name(),
                        ms: metered.started.elapsed().as_millis() as i64,
                        tokens: metered.reported.larger(tokens_of_task(&st.task)),
                    });
                }
            }
            st.version += 1;
            version = Some(st.version);
            logged = st.log.is_some();
            self.fanout.publish(
                id,
                st.version,
                || StreamItem::from(event.clone()),
                event.finishes_task(),
                st.log.as_deref_mut(),
            );
            let logged_bytes = st.count_log(log_before);
            if !finished {
                self.resized(st.counted_as(), added as isize + logged_bytes);
            }
            applied = Applied::Yes;
        });
        self.share_event(id, version, event, logged);
        self.count_end(ended);
        match found {
            true => (applied, version),
            false => (Applied::NotFound, None),
        }
    }

    /// Adds a follow-up message to an unfinished task and hands it the work's cancel
    /// token; returns the task with the message taken in (finished ones unchanged). A task
    /// that was waiting for this answer is working again from here on, and its
    /// subscribers are told so.
    /// `streamed`: the follow-up streams, so the task's events are kept from here on.
    pub(crate) fn continue_with(
        &self,
        id: &str,
        message: &Message,
        cancel: &CancellationToken,
        streamed: bool,
    ) -> Option<(Task, u64)> {
        let mut out = None;
        let mut working = None;
        self.store.update(id, &mut |st| {
            if streamed {
                st.log.get_or_insert_with(Box::default);
            }
            let log_before = st.log_bytes();
            let unfinished = !st.task.status.state.is_terminal();
            let mut added = 0;
            if unfinished {
                st.task.history.push(message.clone());
                st.cancel = Some(cancel.clone());
                added = message.approx_bytes();
                st.bytes += added;
            }
            if st.task.status.state.is_interrupted() {
                let event = TaskEvent::Status(TaskStatusUpdateEvent {
                    task_id: st.task.id.clone(),
                    context_id: st.task.context_id.clone(),
                    status: TaskStatus::now(TaskState::Working, None),
                    metadata: None,
                });
                st.task.apply(&event);
                st.version += 1;
                let log = st.log.as_deref_mut();
                let logged = log.is_some();
                let item = || StreamItem::from(event.clone());
                self.fanout.publish(id, st.version, item, false, log);
                working = Some((st.version, event, logged));
            }
            let logged_bytes = st.count_log(log_before);
            if unfinished {
                self.resized(st.counted_as(), added as isize + logged_bytes);
            }
            // Taken after the answer moved the task on: a streamed follow-up opens with
            // this snapshot, and a client reading its state must not see the question again.
            out = Some((st.task.clone(), st.version));
        });
        if let Some((version, event, logged)) = working {
            self.share_event(id, Some(version), &event, logged);
        }
        out
    }

    /// Sends an event other replicas' subscribers need through the journal: after the
    /// task's lock is let go, since the journal may make a sender wait for the writer,
    /// which reads tasks under their locks. (A cancel racing its task's own last event
    /// may so reach other replicas first; the cancel ends their streams either way.)
    fn share_event(&self, id: &str, version: Option<u64>, event: &TaskEvent, logged: bool) {
        if let (Some(journal), Some(version)) = (self.journal.get(), version) {
            journal.event(id, version, event, logged);
        }
    }

    /// The current task, its version and, while it is unfinished, a receiver of every
    /// later event, taken atomically. From here on the task's events are kept for
    /// resuming. A finished task gets no receiver: its channel would never be closed.
    #[allow(clippy::type_complexity)]
    pub(crate) fn subscribe(
        &self,
        viewer: Viewer<'_>,
        id: &str,
    ) -> Option<(Task, u64, Option<broadcast::Receiver<Arc<Logged>>>)> {
        let mut out = None;
        self.store.update(id, &mut |st| {
            if viewer.sees(st) {
                let rx = (!st.task.status.state.is_terminal()).then(|| {
                    st.log.get_or_insert_with(Box::default);
                    self.fanout.subscribe(id)
                });
                out = Some((st.task.clone(), st.version, rx));
            }
        });
        out
    }

    /// A stream resumed after the event that made the task `version`: what the client
    /// missed and, for an unfinished task, a receiver of every later event, taken
    /// atomically. None for a task the viewer does not see, or a version it never had.
    #[allow(clippy::type_complexity)]
    pub(crate) fn resume(
        &self,
        viewer: Viewer<'_>,
        id: &str,
        version: u64,
    ) -> Option<(Resumed, Option<broadcast::Receiver<Arc<Logged>>>)> {
        let mut out = None;
        self.store.update(id, &mut |st| {
            if !viewer.sees(st) || version > st.version {
                return;
            }
            let finished = st.task.status.state.is_terminal();
            let log = st.log.get_or_insert_with(Box::default);
            let resumed = match log.after(version, st.version) {
                Some(mut events) => {
                    // A finished task whose last event the log lacks (kept from before it
                    // was streamed, or lost with a crash): its final status ends the replay.
                    let seen = events.last().map_or(version, |e| e.version);
                    if finished && seen < st.version {
                        let item = st.task.status_event();
                        let version = st.version;
                        events.push(Arc::new(Logged { version, item }));
                    }
                    Resumed::Events(events)
                }
                None => Resumed::Snapshot(Box::new(st.task.clone()), st.version),
            };
            out = Some((resumed, (!finished).then(|| self.fanout.subscribe(id))));
        });
        out
    }

    /// The task's status and version, for a stream that must end with it.
    pub(crate) fn status_at(&self, viewer: Viewer<'_>, id: &str) -> Option<(TaskStatus, u64)> {
        let mut out = None;
        self.store.read(id, &mut |st| {
            if viewer.sees(st) {
                out = Some((st.task.status.clone(), st.version));
            }
        });
        out
    }

    pub(crate) fn list(
        &self,
        viewer: Viewer<'_>,
        query: &ListQuery,
    ) -> Result<TaskPage, StoreError> {
        self.store.list(viewer, query)
    }

    pub(crate) fn len(&self) -> usize {
        self.store.len()
    }

    /// See [`TaskStore::byte_figures`].
    pub(crate) fn byte_figures(&self) -> (usize, usize, usize) {
        self.store.byte_figures()
    }

    /// Tasks per state, by their 0.3 names (the metric's label values).
    pub(crate) fn count_by_state(&self) -> Vec<(&'static str, usize)> {
        self.store
            .count_by_state()
            .into_iter()
            .map(|(state, n)| (state.v03_name(), n))
            .collect()
    }
}

impl From<StoreError> for crate::error::GatewayError {
    fn from(e: StoreError) -> crate::error::GatewayError {
        match e {
            StoreError::Full(bound) => crate::error::GatewayError::TaskStoreFull(bound),
            StoreError::Quota(bound) => crate::error::GatewayError::TaskQuota(bound),
            StoreError::BadPageToken => crate::error::GatewayError::InvalidParams(
                "params.pageToken: not a token this gateway issued".into(),
            ),
            other => crate::error::GatewayError::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;

    fn logged(version: u64) -> Arc<Logged> {
        let status = TaskStatus::now(TaskState::Working, None);
        let event = TaskStatusUpdateEvent {
            task_id: "t".into(),
            context_id: "c".into(),
            status,
            metadata: None,
        };
        Arc::new(Logged {
            version,
            item: StreamItem::StatusUpdate(event),
        })
    }

    #[test]
    fn a_log_replays_what_it_holds_and_says_when_it_does_not_reach_back() {
        let mut log = EventLog::default();
        let versions =
            |events: Vec<Arc<Logged>>| events.iter().map(|e| e.version).collect::<Vec<_>>();
        assert_eq!(log.after(0, 0).map(versions), Some(vec![]));
        // Empty, made after the task's first three events: it does not reach them.
        assert!(log.after(1, 3).is_none());
        assert_eq!(log.after(3, 3).map(versions), Some(vec![]));
        for v in 1..=(RESUME_EVENTS as u64 + 10) {
            log.push(logged(v));
        }
        // The oldest 10 are gone: from 11 on.
        let last = RESUME_EVENTS as u64 + 10;
        assert!(log.after(9, last).is_none());
        assert_eq!(
            log.after(10, last).map(versions).map(|v| v.len()),
            Some(RESUME_EVENTS)
        );
        assert_eq!(
            log.after(last - 2, last).map(versions),
            Some(vec![last - 1, last])
        );
        assert_eq!(log.after(last, last).map(versions), Some(vec![]));
    }
}

//! What the gateway keeps beyond one process: tasks and its records (which agent serves a
//! caller's conversation, who created an upstream task, 0.1 clients' task names).
//!
//! The gateway serves from memory (`tasks::MemoryTaskStore`, `routing::BoundedMap`) and
//! writes every change behind it through a [`Journal`]: a change is a note on a channel,
//! and a writer thread of its own reads the current value and commits what piled up in
//! one transaction every `commit_interval_ms` (group commit). So no request waits for a
//! disk, a task updated a hundred times in one interval is written once, and a crash loses
//! at most the changes of the last interval and the commit in progress.
//!
//! The durable kinds: [`sqlite`] (one file, one node). With no journal (the `memory` kind)
//! nothing is written and a change costs one branch.

pub(crate) mod control;
pub(crate) mod counters;
mod health;
pub(crate) mod postgres;
pub(crate) mod postgres_shared;
mod postgres_tls;
pub(crate) mod redis;
pub(crate) mod shared;
pub(crate) mod sqlite;

pub(crate) use crate::config::redacted_url as redacted;
pub(crate) use shared::Shared;

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::protocol::model::{Task, TaskEvent, TaskState};

/// A task as a store read it back (what `tasks::StoredTask` holds, less the running work).
#[derive(Debug, Clone)]
pub(crate) struct TaskRow {
    pub(crate) task: Task,
    pub(crate) agent: Arc<str>,
    pub(crate) owner: Arc<str>,
    pub(crate) seq: u64,
    pub(crate) version: u64,
    /// The latest events of a streamed task, with the versions they made, oldest first
    /// (kept for resuming its streams; empty for a task nobody streamed).
    pub(crate) events: Vec<(u64, TaskEvent)>,
}

/// A task as it is to be written: read from memory when its batch is written, its body
/// already JSON (serialized once, under the task's lock, without copying the task).
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) id: String,
    pub(crate) agent: Arc<str>,
    pub(crate) owner: Arc<str>,
    pub(crate) seq: u64,
    pub(crate) version: u64,
    pub(crate) state: TaskState,
    /// The task, A2A 1.0 JSON.
    pub(crate) body: String,
}

/// The gateway's records beside tasks, each a map from string keys to string values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Table {
    /// A caller's conversation -> the agent that serves it.
    Contexts,
    /// An upstream task id -> the principal that created it through the gateway.
    UpstreamOwners,
    /// A 0.1 caller's own task id -> the gateway's task id.
    LegacyNames,
    /// What the gateway knows of a task it relayed to a 0.3 upstream (`<agent>\n<id>`).
    Ledger,
    /// A task's push notification configs (JSON).
    PushConfigs,
}

/// The key of `agent`'s [`Table::Ledger`] record of task `id`.
pub(crate) fn ledger_key(agent: &str, id: &str) -> String {
    format!("{agent}\n{id}")
}

/// The agent and task id of a [`Table::Ledger`] key.
pub(crate) fn ledger_key_parts(key: &str) -> Option<(&str, &str)> {
    key.split_once('\n')
}

impl Table {
    pub(crate) const ALL: [Table; 5] = [
        Table::Contexts,
        Table::UpstreamOwners,
        Table::LegacyNames,
        Table::Ledger,
        Table::PushConfigs,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Table::Contexts => "contexts",
            Table::UpstreamOwners => "upstream_owners",
            Table::LegacyNames => "legacy_names",
            Table::Ledger => "ledger",
            Table::PushConfigs => "push_configs",
        }
    }
}

/// Local task ids are UUIDs; the memory store keys tasks by their 128-bit value.
pub(crate) type TaskKey = u128;

enum Change {
    /// The task changed: write what it is now (as these bytes, where its answer wrote
    /// them: see [`Journal::task_made`]).
    Task(TaskKey, Option<Box<[u8]>>),
    /// The task is gone from memory (evicted, past retention): its id and creation number,
    /// and for a shared store, where it is not deleted, what it was.
    TaskRemoved(String, u64, Option<Box<Snapshot>>),
    /// A task's event, for other replicas' subscribers (shared stores only); whether the
    /// task's events are kept for resuming streams (it was streamed).
    Event(String, u64, Box<TaskEvent>, bool),
    /// Answered once everything sent before it is written.
    Barrier(tokio::sync::oneshot::Sender<()>),
    Record {
        table: Table,
        key: String,
        value: String,
    },
    /// Commit now and say when done.
    Flush(SyncSender<()>),
    /// Commit and stop: the store closes (the file's lock is let go).
    Stop,
    /// An admin-store operation, run (in a transaction of its own) once what was sent
    /// before it is committed.
    Control(
        control::Op,
        tokio::sync::oneshot::Sender<Result<control::Reply, String>>,
    ),
}

/// Where the writer reads a changed task's current state (the memory store).
pub(crate) trait Snapshots: Send + Sync + 'static {
    /// `stored_form`: the task's body, already written.
    fn snapshot(&self, key: TaskKey, stored_form: Option<Box<[u8]>>) -> Option<Snapshot>;
}

/// Whether the writer's commits go through. While they fail (a full disk, a read-only
/// file system, a shared store away) the gateway takes no new tasks, whose durability it
/// could not keep, and says so on readiness; it takes them again once a commit succeeds.
pub(crate) struct WriteHealth {
    failing: std::sync::atomic::AtomicBool,
    /// Times commits started failing.
    outages: std::sync::atomic::AtomicU64,
    /// Commits that failed.
    failures: std::sync::atomic::AtomicU64,
    /// How long commits take (scraped with the gateway's metrics).
    commit_seconds: prometheus::Histogram,
}

impl Default for WriteHealth {
    fn default() -> Self {
        let opts = prometheus::HistogramOpts::new(
            "a2a_store_commit_seconds",
            "Time the task store takes to commit a batch of changes.",
        )
        .buckets(vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
        ]);
        WriteHealth {
            failing: Default::default(),
            outages: Default::default(),
            failures: Default::default(),
            commit_seconds: prometheus::Histogram::with_opts(opts).expect("valid histogram"),
        }
    }
}

impl WriteHealth {
    pub(crate) fn commit_failures(&self) -> u64 {
        self.failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn commit_seconds(&self) -> Option<prometheus::Histogram> {
        Some(self.commit_seconds.clone())
    }

    pub(crate) fn writing(&self) -> bool {
        !self.failing.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn outages(&self) -> u64 {
        self.outages.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records a commit's outcome; logs once when commits start failing and once when
    /// they succeed again (`quiet`: a shared store, whose own health logs it).
    fn saw(&self, result: &Result<(), String>, changes: usize, quiet: bool) {
        use std::sync::atomic::Ordering;
        if result.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        match result {
            Err(e) if !self.failing.swap(true, Ordering::Relaxed) => {
                self.outages.fetch_add(1, Ordering::Relaxed);
                if !quiet {
                    tracing::error!(error = %e, changes, "store: commits fail; new tasks are refused until they succeed again");
                }
            }
            Err(e) => tracing::debug!(error = %e, changes, "store: commit failed again"),
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) && !quiet => {
                tracing::info!("store: commits succeed again; taking new tasks");
            }
            Ok(()) => {}
        }
    }
}

/// The sending half: cheap to clone, never blocks unless the writer is this many changes
/// behind (then a request waits for the disk rather than memory growing without bound).
#[derive(Clone)]
pub(crate) struct Journal {
    tx: SyncSender<Change>,
    /// The writer, woken by a change that must not wait for the interval to end (see
    /// [`Journal::send_now`]); other changes wait for it without waking it.
    writer: std::thread::Thread,
    /// Whether other replicas hear of events through the store.
    shares_events: bool,
}

const JOURNAL_BACKLOG: usize = 65_536;

/// How many of a streamed task's latest events are kept for resuming its streams: in
/// memory with the task, and in a durable store's log of it.
pub(crate) const RESUME_EVENTS: usize = 256;

/// How far past its last written version a task's failure is numbered when the process
/// that ran it died (a crash, a dead replica): that process may have sent events it had not
/// written, at most what its journal held and the batch it was writing. A client that saw
/// one resumes past it and still gets the failure.
pub(crate) const UNWRITTEN_EVENTS: u64 = 2 * JOURNAL_BACKLOG as u64;

impl Journal {
    pub(crate) fn task_changed(&self, key: TaskKey) {
        self.send(Change::Task(key, None));
    }

    /// A new task; `stored_form`: its body as the store writes it (A2A 1.0 JSON, as
    /// `protocol::write::task` writes it), where its answer wrote that already. Written
    /// as those bytes unless the task changes again before its batch is written.
    pub(crate) fn task_made(&self, key: TaskKey, stored_form: Option<Box<[u8]>>) {
        self.send(Change::Task(key, stored_form));
    }

    /// `last` makes the task as it was, for a shared store (which keeps it until it
    /// expires there): a change not yet written when memory let it go is not lost.
    pub(crate) fn task_removed(
        &self,
        id: String,
        seq: u64,
        last: impl FnOnce() -> Option<Snapshot>,
    ) {
        let last = self.shares_events.then(last).flatten().map(Box::new);
        self.send(Change::TaskRemoved(id, seq, last));
    }

    /// A task took an event, which made its version `version`; `logged`: the task's events
    /// are kept for resuming its streams, there too.
    pub(crate) fn event(&self, id: &str, version: u64, event: &TaskEvent, logged: bool) {
        if self.shares_events || logged {
            self.send(Change::Event(
                id.to_string(),
                version,
                Box::new(event.clone()),
                logged,
            ));
        }
    }

    /// Resolves once everything sent so far is written.
    pub(crate) fn barrier(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Change::Barrier(tx));
        rx
    }

    /// Waits (5 s at most) for everything sent so far to be written; whether it was.
    pub(crate) async fn settled(&self) -> bool {
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.barrier()).await,
            Ok(Ok(()))
        )
    }

    pub(crate) fn record(&self, table: Table, key: &str, value: String) {
        self.send(Change::Record {
            table,
            key: key.to_string(),
            value,
        });
    }

    /// Runs an admin-store operation on the store's writer (which holds the file).
    pub(crate) async fn control(&self, op: control::Op) -> Result<control::Reply, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A full backlog makes this wait for the writer, as any change does: off the
        // worker, so the worker goes on serving meanwhile.
        let journal = self.clone();
        let _ =
            tokio::task::spawn_blocking(move || journal.send_now(Change::Control(op, tx))).await;
        rx.await
            .map_err(|_| "the store's writer stopped".to_string())?
    }

    /// Commits everything sent so far; false when the writer did not finish within `wait`.
    pub(crate) fn flush(&self, wait: Duration) -> bool {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send_now(Change::Flush(tx));
        rx.recv_timeout(wait).is_ok()
    }

    fn send(&self, change: Change) {
        // The writer ends only when every sender is gone, so this cannot fail while the
        // journal exists; a writer that died has logged why.
        let _ = self.tx.send(change);
    }

    /// [`Self::send`], for a change the writer acts on at once rather than at the end of
    /// its interval.
    fn send_now(&self, change: Change) {
        self.send(change);
        self.writer.unpark();
    }
}

/// A durable store's side of the journal: writes one batch as one transaction.
pub(crate) trait Backend: Send + 'static {
    fn commit(&mut self, batch: &Batch) -> Result<(), String>;
    /// An admin-store operation (see [`control`]); stores that keep none elsewhere.
    fn control(&mut self, op: control::Op) -> Result<control::Reply, String> {
        Err(format!("this store keeps no admin entries ({op:?})"))
    }
    /// Housekeeping between commits (deleting old records, giving pages back), called about
    /// once a minute.
    fn maintain(&mut self) -> Result<(), String>;
}

/// The changes of one interval, coalesced: each task and record once, as it is now.
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) tasks: Vec<Snapshot>,
    pub(crate) removed: Vec<(String, u64)>,
    pub(crate) records: Vec<(Table, String, String)>,
    /// In the order they happened, after the tasks they changed.
    /// Each with whether the task's events are kept for resuming (see [`Journal::event`]).
    pub(crate) events: Vec<(String, u64, Box<TaskEvent>, bool)>,
}

impl Batch {
    pub(crate) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
            && self.removed.is_empty()
            && self.records.is_empty()
            && self.events.is_empty()
    }

    fn len(&self) -> usize {
        self.tasks.len() + self.removed.len() + self.records.len() + self.events.len()
    }
}

/// Collects changes until the interval is over; each key once.
#[derive(Default)]
struct Pending {
    /// Each changed task once, with its body where that was written already.
    tasks: Vec<(TaskKey, Option<Box<[u8]>>)>,
    /// Where each task is in `tasks`.
    seen: HashMap<TaskKey, usize>,
    removed: Vec<(String, u64)>,
    /// Tasks memory let go of, as they were (shared stores).
    last: Vec<Snapshot>,
    records: HashMap<(Table, String), String>,
    events: Vec<(String, u64, Box<TaskEvent>, bool)>,
    flushes: Vec<SyncSender<()>>,
    barriers: Vec<tokio::sync::oneshot::Sender<()>>,
    controls: Vec<(
        control::Op,
        tokio::sync::oneshot::Sender<Result<control::Reply, String>>,
    )>,
    stop: bool,
}

impl Pending {
    fn add(&mut self, change: Change) {
        match change {
            Change::Task(key, stored_form) => self.task(key, stored_form),
            Change::TaskRemoved(id, seq, last) => {
                if let Some(last) = last {
                    self.last.push(*last);
                }
                self.removed.push((id, seq));
            }
            Change::Event(id, version, event, logged) => {
                // The task is written in the same batch as its event: a reader never finds
                // the event published and the task older than it.
                if let Ok(uuid) = uuid::Uuid::try_parse(&id) {
                    self.task(uuid.as_u128(), None);
                }
                self.events.push((id, version, event, logged));
            }
            Change::Barrier(done) => self.barriers.push(done),
            Change::Record { table, key, value } => {
                self.records.insert((table, key), value);
            }
            Change::Flush(done) => self.flushes.push(done),
            Change::Stop => self.stop = true,
            Change::Control(op, done) => self.controls.push((op, done)),
        }
    }

    /// The task changed: written once in the batch, as it is when the batch is written. The
    /// body its answer wrote holds only while nothing changed since.
    fn task(&mut self, key: TaskKey, stored_form: Option<Box<[u8]>>) {
        match self.seen.entry(key) {
            std::collections::hash_map::Entry::Occupied(at) => self.tasks[*at.get()].1 = None,
            std::collections::hash_map::Entry::Vacant(at) => {
                at.insert(self.tasks.len());
                self.tasks.push((key, stored_form));
            }
        }
    }

    fn len(&self) -> usize {
        self.tasks.len()
            + self.last.len()
            + self.removed.len()
            + self.records.len()
            + self.events.len()
    }

    /// The batch to write, with each changed task read as it is now. A task removed since
    /// its change has nothing to write; its removal follows.
    fn batch(&mut self, tasks: &dyn Snapshots) -> Batch {
        self.seen.clear();
        let mut written: Vec<Snapshot> = std::mem::take(&mut self.last);
        written.extend(
            self.tasks
                .drain(..)
                .filter_map(|(key, stored_form)| tasks.snapshot(key, stored_form)),
        );
        Batch {
            tasks: written,
            removed: std::mem::take(&mut self.removed),
            records: self
                .records
                .drain()
                .map(|((table, key), value)| (table, key, value))
                .collect(),
            events: std::mem::take(&mut self.events),
        }
    }
}

/// A batch this large is committed at once rather than at the end of the interval.
const MAX_BATCH: usize = 10_000;
const MAINTENANCE_EVERY: Duration = Duration::from_secs(60);
/// The longest the writer parks before it looks at the backlog again: a batch that fills
/// up is committed then, not at the end of a long interval (up to 10 s), by which time the
/// backlog would have filled and made requests wait.
const PARK_AT_MOST: Duration = Duration::from_millis(10);

/// Starts the writer thread; the journal sends it changes. The thread commits what is
/// left and ends when every journal is gone (or the process exits: [`Journal::flush`]
/// first).
fn start(
    mut backend: Box<dyn Backend>,
    tasks: Arc<dyn Snapshots>,
    interval: Duration,
    shares_events: bool,
    health: Arc<WriteHealth>,
) -> Result<(Journal, std::thread::JoinHandle<()>), String> {
    let (tx, rx) = mpsc::sync_channel(JOURNAL_BACKLOG);
    let writer = std::thread::Builder::new()
        .name("store-writer".into())
        .spawn(move || {
            let quiet = shares_events;
            write_loop(&mut *backend, &*tasks, &rx, interval, &health, quiet)
        })
        .map_err(|e| format!("store: cannot start its writer thread: {e}"))?;
    let journal = Journal {
        tx,
        shares_events,
        writer: writer.thread().clone(),
    };
    Ok((journal, writer))
}

/// [`start`] for a store replicas share: no interval (each batch is what arrived while the
/// last was written, and answers wait for theirs: see `Store::settled`), events for the
/// other replicas.
type Started = (Journal, std::thread::JoinHandle<()>, Arc<WriteHealth>);
fn start_shared(backend: Box<dyn Backend>, tasks: Arc<dyn Snapshots>) -> Result<Started, String> {
    let writes = Arc::new(WriteHealth::default());
    let (journal, writer) = start(backend, tasks, Duration::ZERO, true, writes.clone())?;
    Ok((journal, writer, writes))
}

const CANNOT_WRITE_FILE: &str =
    "the task store cannot write (a full disk?): new tasks are refused until it can";

/// The store in use, as opened at start.
pub(crate) struct Store {
    /// None for the memory kind.
    pub(crate) journal: Option<Journal>,
    /// For the banner and the log: the kind and where.
    pub(crate) described: String,
    /// The kind, as OpenTelemetry's `db.system.name` says it.
    pub(crate) system: &'static str,
    pub(crate) retention: Option<Duration>,
    writer: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    /// A store replicas share (Redis, PostgreSQL shared): what they share through it.
    pub(crate) shared: Option<Arc<Shared>>,
    pub(crate) writes: Arc<WriteHealth>,
    /// Answers wait for the commit that holds what their call changed, and fail without it
    /// (`durability = "sync"`).
    pub(crate) sync: bool,
    /// What the admin API keeps (runtime agents and keys, the audit log), in this store.
    pub(crate) control: control::Control,
    /// What readiness and the log say while commits fail.
    cannot_write: &'static str,
}

impl Store {
    pub(crate) fn memory() -> Store {
        Store {
            journal: None,
            described: "memory (tasks are lost on restart)".into(),
            system: "memory",
            retention: None,
            writer: Default::default(),
            shared: None,
            writes: Default::default(),
            sync: false,
            control: control::Control::memory(),
            cannot_write: CANNOT_WRITE_FILE,
        }
    }

    /// Where answers wait for what their calls changed: every change is where other
    /// replicas read it once this journal wrote it, or on disk with `durability = "sync"`.
    /// None when answers need not wait (no other replica reads this store, and its commits
    /// are batched).
    pub(crate) fn answers_wait_for(&self) -> Option<&Journal> {
        self.journal.as_ref().filter(|_| self.answers_wait())
    }

    /// Waits (5 s at most) for what the calls so far changed to be where answers need it
    /// (see [`Self::answers_wait_for`]); whether it is. At once when answers need not wait.
    pub(crate) async fn settled(&self) -> bool {
        match self.answers_wait_for() {
            Some(journal) => journal.settled().await,
            None => true,
        }
    }

    /// Whether answers wait for the store (see [`Self::answers_wait_for`]).
    pub(crate) fn answers_wait(&self) -> bool {
        self.shared.is_some() || self.sync
    }

    /// Why the store takes no changes, for readiness and the log; None when it does.
    pub(crate) fn trouble(&self) -> Option<&'static str> {
        if let Some(shared) = self.shared.as_ref().filter(|s| !s.health().up()) {
            Some(match &**shared {
                Shared::Redis(_) => "the shared task store (Redis) does not answer",
                Shared::Postgres(_) => "the shared task store (PostgreSQL) does not answer",
            })
        } else if !self.writes.writing() {
            Some(self.cannot_write)
        } else {
            None
        }
    }

    /// Commits what is pending and closes the store, before the process exits; changes
    /// after this are not written.
    pub(crate) fn close(&self) {
        let Some(journal) = &self.journal else {
            return;
        };
        if !journal.flush(Duration::from_secs(5)) {
            tracing::error!("store: the last changes were not committed within 5 s");
            return;
        }
        journal.send_now(Change::Stop);
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(writer) = writer {
            let _ = writer.join();
        }
    }
}

/// Opens the configured store: its journal, fed from `tasks`, and what it held.
/// `base` is the directory relative paths in the configuration start from.
pub(crate) fn open(
    config: &crate::config::StoreConfig,
    base: &std::path::Path,
    tasks: Arc<dyn Snapshots>,
) -> Result<(Store, Loaded), String> {
    use crate::config::StoreKind;
    let retention = (config.retention_secs > 0).then(|| Duration::from_secs(config.retention_secs));
    let interval = Duration::from_millis(config.commit_interval_ms.max(1));
    match config.kind {
        StoreKind::Memory => Ok((Store::memory(), Loaded::default())),
        StoreKind::Postgres if config.shared => open_shared_postgres(config, tasks, retention),
        StoreKind::Sqlite | StoreKind::Postgres => {
            let (backend, loaded, place): (Box<dyn Backend>, Loaded, String) = if config.kind
                == StoreKind::Sqlite
            {
                // "./data" under "." reads "./data", not "././data".
                let dir: std::path::PathBuf = base.join(&config.data_dir).components().collect();
                let (backend, loaded) = sqlite::open(&dir, config.retention_secs)?;
                let place = format!("sqlite {}", sqlite::path_in(&dir).display());
                (Box::new(backend), loaded, place)
            } else {
                let place = postgres::Place {
                    url: config.url.clone(),
                    schema: config.schema.clone(),
                    shared: false,
                };
                let (backend, loaded) = postgres::open(&place, config.retention_secs, None)?;
                (
                    Box::new(backend),
                    loaded,
                    format!("postgres {}", place.described()),
                )
            };
            let writes = Arc::new(WriteHealth::default());
            let sync = config.durability == crate::config::Durability::Sync;
            // Synced answers wait for their commit: each batch is what arrived while the
            // last was written, with no interval to wait out.
            let interval = if sync { Duration::ZERO } else { interval };
            let (journal, writer) = start(backend, tasks, interval, false, writes.clone())?;
            let described = match sync {
                true => format!("{place} (answers wait for their commit)"),
                false => format!("{place} (commits every {} ms)", interval.as_millis()),
            };
            let store = Store {
                control: control::Control::journal(journal.clone()),
                journal: Some(journal),
                writer: std::sync::Mutex::new(Some(writer)),
                shared: None,
                writes,
                described,
                system: match config.kind {
                    StoreKind::Postgres => "postgresql",
                    _ => "sqlite",
                },
                retention,
                sync,
                cannot_write: match config.kind {
                    StoreKind::Postgres => {
                        "the task store (PostgreSQL) cannot write: new tasks are refused until it can"
                    }
                    _ => CANNOT_WRITE_FILE,
                },
            };
            Ok((store, loaded))
        }
        StoreKind::Redis => {
            let client = ::redis::Client::open(config.url.as_str())
                .map_err(|e| format!("store.url: {e}"))?;
            let keys = redis::Keys::new(&config.key_prefix);
            let replica: Arc<str> = crate::protocol::model::new_id().into();
            let health = Arc::new(health::Health::new("Redis"));
            let backend = redis::RedisBackend::new(
                client.clone(),
                keys.clone(),
                replica.clone(),
                config.retention_secs,
                health.clone(),
            );
            let (journal, writer, writes) = start_shared(Box::new(backend), tasks)?;
            let lease = Duration::from_secs(config.lease_secs.max(2));
            let redis = Arc::new(redis::Shared::new(
                client,
                keys,
                replica.clone(),
                health,
                lease,
            ));
            let store = Store {
                control: control::Control::redis(redis.clone()),
                shared: Some(Arc::new(Shared::Redis(redis))),
                journal: Some(journal),
                writer: std::sync::Mutex::new(Some(writer)),
                writes,
                system: "redis",
                described: format!(
                    "redis {} prefix {:?} (replica {replica})",
                    redacted(&config.url),
                    config.key_prefix
                ),
                retention,
                sync: false,
                cannot_write: CANNOT_WRITE_FILE,
            };
            Ok((store, Loaded::default()))
        }
    }
}

/// PostgreSQL shared by replicas (`store.shared`): written as a Redis store is (no
/// interval, answers wait for their batch), read and shared through [`postgres_shared`].
fn open_shared_postgres(
    config: &crate::config::StoreConfig,
    tasks: Arc<dyn Snapshots>,
    retention: Option<Duration>,
) -> Result<(Store, Loaded), String> {
    let replica: Arc<str> = crate::protocol::model::new_id().into();
    let place = postgres::Place {
        url: config.url.clone(),
        schema: config.schema.clone(),
        shared: true,
    };
    let (backend, loaded) = postgres::open(&place, config.retention_secs, Some(replica.clone()))?;
    let (journal, writer, writes) = start_shared(Box::new(backend), tasks)?;
    let lease = Duration::from_secs(config.lease_secs.max(2));
    // Calls from every worker share these; each holds one for a statement or two.
    let pool = std::thread::available_parallelism().map_or(4, |n| n.get() * 2 + 2);
    let shared =
        postgres_shared::Shared::new(&config.url, &config.schema, replica.clone(), lease, pool)?;
    let store = Store {
        control: control::Control::journal(journal.clone()),
        journal: Some(journal),
        writer: std::sync::Mutex::new(Some(writer)),
        shared: Some(Arc::new(Shared::Postgres(shared))),
        writes,
        described: format!("postgres {} shared (replica {replica})", place.described()),
        system: "postgresql",
        retention,
        sync: false,
        cannot_write:
            "the task store (PostgreSQL) cannot write: new tasks are refused until it can",
    };
    Ok((store, loaded))
}

fn write_loop(
    backend: &mut dyn Backend,
    tasks: &dyn Snapshots,
    rx: &Receiver<Change>,
    interval: Duration,
    health: &WriteHealth,
    quiet: bool,
) {
    let mut pending = Pending::default();
    let mut failures = 0u32;
    let mut maintained = Instant::now();
    loop {
        // Wait for the first change of a batch, then collect for one interval from it.
        // A batch that failed is tried again soon, new changes or not.
        let idle = match pending.len() {
            0 => MAINTENANCE_EVERY,
            _ => interval.max(Duration::from_millis(100)),
        };
        let mut open = match rx.recv_timeout(idle) {
            Ok(change) => {
                pending.add(change);
                true
            }
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => false,
        };
        let deadline = Instant::now() + interval;
        // The rest of the interval's changes are taken without the writer being woken for
        // each: it parks until the interval ends, and only a change that must not wait
        // (`Journal::send_now`) wakes it sooner. (Woken by every change, the writer cost
        // each task a futex wake on the request's thread and a round of its own.) With no
        // interval (Redis), a batch is whatever arrived while the last one was written.
        while open
            && !pending.stop
            && pending.flushes.is_empty()
            && pending.controls.is_empty()
            && pending.len() < MAX_BATCH
        {
            match rx.try_recv() {
                Ok(change) => pending.add(change),
                Err(TryRecvError::Disconnected) => open = false,
                Err(TryRecvError::Empty) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => {
                        std::thread::park_timeout(left.min(PARK_AT_MOST))
                    }
                    _ => break,
                },
            }
        }
        let batch = pending.batch(tasks);
        let mut written = true;
        if !batch.is_empty() {
            let started = Instant::now();
            let committed = backend.commit(&batch);
            health
                .commit_seconds
                .observe(started.elapsed().as_secs_f64());
            health.saw(&committed, batch.len(), quiet);
            match committed {
                Ok(()) => failures = 0,
                Err(_) => {
                    written = false;
                    failures += 1;
                    requeue(&mut pending, batch);
                    // Not a busy loop against a broken disk or an absent server.
                    std::thread::sleep(interval.max(Duration::from_millis(100)) * failures.min(20));
                }
            }
        }
        // A barrier whose changes were not written is dropped: its waiter is told so.
        for done in pending.barriers.drain(..) {
            if written {
                let _ = done.send(());
            }
        }
        for done in pending.flushes.drain(..) {
            let _ = done.send(());
        }
        for (op, done) in pending.controls.drain(..) {
            let _ = done.send(backend.control(op));
        }
        open &= !pending.stop;
        if maintained.elapsed() >= MAINTENANCE_EVERY {
            maintained = Instant::now();
            if let Err(e) = backend.maintain() {
                tracing::warn!(error = %e, "store: housekeeping failed");
            }
        }
        if !open {
            return;
        }
    }
}

/// Puts a batch that failed back, under whatever changed since.
fn requeue(pending: &mut Pending, batch: Batch) {
    let Batch {
        tasks,
        removed,
        records,
        events,
    } = batch;
    // As they were: written before what changed since (read afresh), which then wins.
    pending.last.extend(tasks);
    pending.removed.extend(removed);
    let later = std::mem::replace(&mut pending.events, events);
    pending.events.extend(later);
    for (table, key, value) in records {
        pending.records.entry((table, key)).or_insert(value);
    }
}

/// What a durable store held when it was opened.
#[derive(Default)]
pub(crate) struct Loaded {
    pub(crate) tasks: Vec<TaskRow>,
    /// Each table's entries, oldest first.
    pub(crate) records: HashMap<Table, Vec<(String, String)>>,
}

impl Loaded {
    /// What one table's map starts from, writes to, and reads other replicas' records from.
    pub(crate) fn kept(&mut self, table: Table, store: &Store) -> Kept {
        Kept {
            table,
            journal: store.journal.clone(),
            shared: store.shared.clone(),
            loaded: self.records.remove(&table).unwrap_or_default(),
        }
    }
}

/// A map of records kept in the store: its table, where changes go, what it held.
pub(crate) struct Kept {
    pub(crate) table: Table,
    pub(crate) journal: Option<Journal>,
    pub(crate) shared: Option<Arc<Shared>>,
    /// Oldest first.
    pub(crate) loaded: Vec<(String, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Says how many tasks each commit wrote.
    struct Counting(mpsc::Sender<usize>);

    impl Backend for Counting {
        fn commit(&mut self, batch: &Batch) -> Result<(), String> {
            let _ = self.0.send(batch.tasks.len());
            Ok(())
        }
        fn maintain(&mut self) -> Result<(), String> {
            Ok(())
        }
    }

    struct AnyTask;

    impl Snapshots for AnyTask {
        fn snapshot(&self, key: TaskKey, _: Option<Box<[u8]>>) -> Option<Snapshot> {
            Some(Snapshot {
                id: key.to_string(),
                agent: "a".into(),
                owner: "o".into(),
                seq: 0,
                version: 0,
                state: TaskState::Completed,
                body: "{}".into(),
            })
        }
    }

    /// The writer parks through its interval, but a full batch is committed long before a
    /// long interval ends, and a flush is answered at once.
    #[test]
    fn a_full_batch_and_a_flush_do_not_wait_for_a_long_interval() {
        let (commits, committed) = mpsc::channel();
        let interval = Duration::from_secs(10);
        let health = Arc::new(WriteHealth::default());
        let (journal, _writer) = start(
            Box::new(Counting(commits)),
            Arc::new(AnyTask),
            interval,
            false,
            health,
        )
        .unwrap();
        // The first change starts the interval; the rest come once the writer is parked.
        journal.task_changed(0);
        std::thread::sleep(Duration::from_millis(100));
        for key in 1..MAX_BATCH as TaskKey {
            journal.task_changed(key);
        }
        let first = committed.recv_timeout(Duration::from_secs(2));
        assert_eq!(first, Ok(MAX_BATCH), "a full batch waited for the interval");
        journal.task_changed(MAX_BATCH as TaskKey);
        assert!(
            journal.flush(Duration::from_secs(2)),
            "a flush waited for the interval"
        );
        assert_eq!(committed.try_recv(), Ok(1));
    }
}

//! One set of test bodies that every task store passes: each body gets a fresh store from a
//! [`Harness`] and, for the durable kinds, opens it again as a restart would. The store
//! kinds each instantiate the bodies at the bottom of this file.

use std::sync::Arc;

use super::{lost_work, Applied, Tasks, Viewer, REPLICA_LOST};
use crate::protocol::model::{
    new_id, Artifact, Message, Part, Task, TaskArtifactUpdateEvent, TaskEvent, TaskState,
    TaskStatus, TaskStatusUpdateEvent,
};
use crate::protocol::params::ListQuery;

/// A store under test: its `Tasks`, and how to reopen it (None: it keeps nothing).
pub(super) trait Harness {
    fn tasks(&self) -> &Tasks;
    /// Stops this instance as a clean shutdown would and opens the store again (for a
    /// shared store: another replica); false for a store that does not outlive its process.
    fn reopen(&mut self) -> bool;
    /// The task as `viewer` reads it (a shared store reads other replicas' tasks first).
    fn read(&self, viewer: Viewer<'_>, id: &str) -> Option<Task> {
        self.tasks().inspect(viewer, id, Task::clone)
    }
    /// One page of `viewer`'s tasks.
    fn list(&self, viewer: Viewer<'_>, q: &ListQuery) -> super::TaskPage {
        self.tasks().list(viewer, q).unwrap()
    }
}

const AGENT: &str = "agent";
const OWNER: &str = "owner";

fn viewer() -> Viewer<'static> {
    Viewer {
        agent: AGENT,
        principal: OWNER,
    }
}

fn user(text: &str, task_id: &str, context_id: &str) -> Message {
    serde_json::from_value(serde_json::json!({
        "role": "ROLE_USER", "messageId": new_id(), "parts": [{"text": text}],
        "taskId": task_id, "contextId": context_id,
    }))
    .unwrap()
}

fn create(h: &dyn Harness, context_id: &str, state: TaskState) -> String {
    create_as(h, AGENT, OWNER, context_id, state)
}

fn create_as(
    h: &dyn Harness,
    agent: &str,
    owner: &str,
    context_id: &str,
    state: TaskState,
) -> String {
    let id = new_id();
    let mut task = Task::submitted(id.clone(), context_id.into(), user("hi", &id, context_id));
    task.set_status(TaskStatus::now(state, None));
    h.tasks()
        .create_logged(agent.into(), (owner.into(), None), task, None, false)
        .unwrap();
    id
}

fn status(id: &str, context_id: &str, state: TaskState, text: Option<&str>) -> TaskEvent {
    TaskEvent::Status(TaskStatusUpdateEvent {
        task_id: id.into(),
        context_id: context_id.into(),
        status: TaskStatus::now(state, text.map(Message::agent_text)),
        metadata: None,
    })
}

fn chunk(id: &str, context_id: &str, text: &str, append: bool) -> TaskEvent {
    TaskEvent::Artifact(TaskArtifactUpdateEvent {
        task_id: id.into(),
        context_id: context_id.into(),
        artifact: Artifact {
            artifact_id: "a1".into(),
            name: None,
            description: None,
            parts: vec![Part::text(text)],
            metadata: None,
            extensions: Vec::new(),
        },
        append,
        last_chunk: false,
        metadata: None,
    })
}

fn get(h: &dyn Harness, id: &str) -> Option<Task> {
    h.read(viewer(), id)
}

/// A task as clients see it (times in milliseconds, as the wire and the stores keep them).
fn wire(h: &dyn Harness, id: &str) -> Option<serde_json::Value> {
    get(h, id).map(|t| serde_json::to_value(t).unwrap())
}

fn query(page_size: usize) -> ListQuery {
    ListQuery::first_page(page_size, true)
}

/// Every page of a query, in order.
fn all_pages(h: &dyn Harness, mut q: ListQuery) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        let page = h.list(viewer(), &q);
        ids.extend(page.tasks.iter().map(|t| t.id.clone()));
        if page.next_page_token.is_empty() {
            return ids;
        }
        q.page_token = Some(page.next_page_token);
    }
}

pub(super) fn events_build_the_task_and_it_reads_back_the_same(h: &mut dyn Harness) {
    let id = create(h, "ctx", TaskState::Submitted);
    let t = h.tasks();
    assert_eq!(
        t.apply(&id, &status(&id, "ctx", TaskState::Working, None)),
        Applied::Yes
    );
    assert_eq!(t.apply(&id, &chunk(&id, "ctx", "hel", false)), Applied::Yes);
    assert_eq!(t.apply(&id, &chunk(&id, "ctx", "lo", true)), Applied::Yes);
    let done = status(&id, "ctx", TaskState::Completed, Some("done"));
    assert_eq!(t.apply(&id, &done), Applied::Yes);
    // A finished task takes no more events.
    let late = status(&id, "ctx", TaskState::Working, None);
    assert_eq!(t.apply(&id, &late), Applied::TaskFinished);
    let task = get(h, &id).unwrap();
    assert_eq!(task.status.state, TaskState::Completed);
    assert_eq!(task.artifacts[0].parts.len(), 2, "{task:?}");
    let before = wire(h, &id);
    if h.reopen() {
        assert_eq!(wire(h, &id), before);
    }
}

pub(super) fn only_the_owner_through_its_agent_sees_a_task(h: &mut dyn Harness) {
    let id = create(h, "ctx", TaskState::Completed);
    for _ in 0..2 {
        assert!(get(h, &id).is_some());
        for (agent, principal) in [("other", OWNER), (AGENT, "someone-else")] {
            let v = Viewer { agent, principal };
            assert!(h.read(v, &id).is_none(), "{agent}/{principal}");
            assert!(h.list(v, &query(10)).tasks.is_empty());
        }
        assert_eq!(h.tasks().owner(&id).as_deref(), Some(AGENT));
        if !h.reopen() {
            break;
        }
    }
}

pub(super) fn lists_newest_first_in_pages_with_filters(h: &mut dyn Harness) {
    let mut made = Vec::new();
    for i in 0..7 {
        let ctx = if i % 2 == 0 { "even" } else { "odd" };
        made.push(create(h, ctx, TaskState::Completed));
        // Distinct status times (the store keeps milliseconds).
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    create_as(h, AGENT, "someone-else", "even", TaskState::Completed);
    let newest_first: Vec<String> = made.iter().rev().cloned().collect();
    for _ in 0..2 {
        assert_eq!(all_pages(h, query(3)), newest_first);
        let mut even = query(2);
        even.context_id = Some("even".into());
        let evens: Vec<String> = newest_first.iter().step_by(2).cloned().collect();
        assert_eq!(all_pages(h, even), evens);
        let first = h.list(viewer(), &query(3));
        assert_eq!(first.total_size, 7);
        let mut working = query(10);
        working.state = Some(TaskState::Working);
        assert!(all_pages(h, working).is_empty());
        if !h.reopen() {
            break;
        }
    }
}

pub(super) fn evicts_the_oldest_finished_when_full(h: &mut dyn Harness) {
    let old = create(h, "c", TaskState::Completed);
    let busy: Vec<String> = (0..CAPACITY - 2)
        .map(|_| create(h, "c", TaskState::Working))
        .collect();
    let newer = create(h, "c", TaskState::Completed);
    let newest = create(h, "c", TaskState::Completed);
    assert!(get(h, &old).is_none(), "the oldest finished made room");
    for _ in 0..2 {
        for id in busy.iter().chain([&newer, &newest]) {
            assert!(get(h, id).is_some());
        }
        assert!(get(h, &old).is_none());
        assert_eq!(h.tasks().len(), CAPACITY);
        if !h.reopen() {
            break;
        }
    }
}

pub(super) fn prunes_finished_tasks_past_retention(h: &mut dyn Harness) {
    let done = create(h, "c", TaskState::Completed);
    let running = create(h, "c", TaskState::Working);
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(h.tasks().prune(std::time::Duration::from_millis(1)), 1);
    assert!(get(h, &done).is_none());
    assert!(get(h, &running).is_some());
    if h.reopen() {
        assert!(get(h, &done).is_none(), "the deletion is stored too");
        assert!(get(h, &running).is_some());
    }
}

pub(super) fn unfinished_tasks_fail_when_their_work_is_gone(h: &mut dyn Harness) {
    let working = create(h, "c", TaskState::Working);
    let waiting = create(h, "c", TaskState::InputRequired);
    let done = create(h, "c", TaskState::Completed);
    if !h.reopen() {
        return;
    }
    for id in [&working, &waiting] {
        let t = get(h, id).unwrap();
        assert_eq!(t.status.state, TaskState::Failed);
        let note = t.status.message.as_ref().unwrap().text();
        // A restart says so; a shared store's next replica finds its predecessor gone.
        assert!(
            note == lost_work("its work") || note == REPLICA_LOST,
            "{note}"
        );
    }
    assert_eq!(get(h, &done).unwrap().status.state, TaskState::Completed);
    // New tasks after a restart sort after the old ones. (Lists sort by status time, in
    // milliseconds; a shared store's replicas number their tasks each their own way, so a
    // task made in the millisecond the old ones failed in may sort either way.)
    std::thread::sleep(std::time::Duration::from_millis(2));
    let newer = create(h, "c", TaskState::Completed);
    assert_eq!(all_pages(h, query(10))[0], newer);
}

pub(super) fn many_tasks_survive_a_reopen(h: &mut dyn Harness) {
    let ids: Vec<String> = (0..3)
        .map(|_| create(h, "c", TaskState::Completed))
        .collect();
    let stored: Vec<_> = ids.iter().map(|id| wire(h, id)).collect();
    if h.reopen() {
        for (id, before) in ids.iter().zip(&stored) {
            assert_eq!(&wire(h, id), before);
        }
    }
}

/// The bodies, as tests of one store kind: `conformance!(name, || harness)`. Every kind
/// passes the first five; the last two are about a store bounded by `max_tasks` and
/// pruned by the gateway (memory, SQLite), where a shared store's tasks expire in Redis
/// instead (tested in `tests/api/replicas.rs`): `conformance!(name, harness, bounded)`.
macro_rules! conformance {
    ($kind:ident, $open:expr, bounded) => {
        conformance!($kind, $open);
        mod bounded {
            use super::*;
            #[test]
            fn evicts_the_oldest_finished_when_full() {
                super::evicts_the_oldest_finished_when_full(&mut $open());
            }
            #[test]
            fn prunes_finished_tasks_past_retention() {
                super::prunes_finished_tasks_past_retention(&mut $open());
            }
        }
    };
    ($kind:ident, $open:expr) => {
        mod $kind {
            use super::*;
            #[test]
            fn events_build_the_task_and_it_reads_back_the_same() {
                super::events_build_the_task_and_it_reads_back_the_same(&mut $open());
            }
            #[test]
            fn only_the_owner_through_its_agent_sees_a_task() {
                super::only_the_owner_through_its_agent_sees_a_task(&mut $open());
            }
            #[test]
            fn lists_newest_first_in_pages_with_filters() {
                super::lists_newest_first_in_pages_with_filters(&mut $open());
            }
            #[test]
            fn unfinished_tasks_fail_when_their_work_is_gone() {
                super::unfinished_tasks_fail_when_their_work_is_gone(&mut $open());
            }
            #[test]
            fn many_tasks_survive_a_reopen() {
                super::many_tasks_survive_a_reopen(&mut $open());
            }
        }
    };
}

const CAPACITY: usize = 8;
const QUOTA: super::Quota = super::Quota {
    tasks: 100,
    bytes: usize::MAX,
};

fn metrics() -> Arc<crate::telemetry::Metrics> {
    Arc::new(crate::telemetry::Metrics::new(false))
}

struct Memory(Tasks);

impl Harness for Memory {
    fn tasks(&self) -> &Tasks {
        &self.0
    }
    fn reopen(&mut self) -> bool {
        false
    }
}

fn memory() -> Memory {
    let store = Arc::new(super::MemoryTaskStore::new(CAPACITY, usize::MAX));
    Memory(Tasks::new(store, QUOTA, metrics()))
}

mod memory_kind {
    use super::*;
    conformance!(memory_store, memory, bounded);
}

/// A subscriber's channel lives while the task can still take events: none is made for a
/// finished task (nothing would ever close it), and a task's last event closes its own.
#[test]
fn subscribing_holds_a_channel_only_while_the_task_runs() {
    let h = memory();
    let tasks = h.tasks();
    let done = create(&h, "c1", TaskState::Completed);
    let (_, _, rx) = tasks.subscribe(viewer(), &done).unwrap();
    assert!(rx.is_none());
    assert_eq!(tasks.fanout.channels.len(), 0);
    let working = create(&h, "c2", TaskState::Working);
    let (_, _, rx) = tasks.subscribe(viewer(), &working).unwrap();
    assert!(rx.is_some());
    assert_eq!(tasks.fanout.channels.len(), 1);
    let finished = status(&working, "c2", TaskState::Completed, None);
    assert_eq!(tasks.apply(&working, &finished), Applied::Yes);
    assert_eq!(tasks.fanout.channels.len(), 0);
}

/// A durable store opened as the gateway opens it: memory in front, the store's journal
/// behind, and what it held restored.
fn open_durable(
    config: &crate::config::StoreConfig,
    base: &std::path::Path,
) -> Result<(Tasks, crate::store::Store), String> {
    let memory = Arc::new(super::MemoryTaskStore::new(CAPACITY, usize::MAX));
    let (store, mut loaded) = crate::store::open(config, base, memory.clone())?;
    memory.write_behind(store.journal.clone().unwrap());
    let tasks = Tasks::new(memory, QUOTA, metrics());
    tasks
        .restore(std::mem::take(&mut loaded.tasks), &|_| "its work")
        .unwrap();
    Ok((tasks, store))
}

/// A SQLite file in a temporary directory, opened as the gateway opens it.
struct Sqlite {
    dir: tempfile::TempDir,
    open: Option<(Tasks, crate::store::Store)>,
}

impl Sqlite {
    fn open_in(dir: tempfile::TempDir) -> Sqlite {
        let config = crate::config::StoreConfig {
            kind: crate::config::StoreKind::Sqlite,
            data_dir: dir.path().to_path_buf(),
            commit_interval_ms: 5,
            ..Default::default()
        };
        let open = open_durable(&config, dir.path()).unwrap();
        Sqlite {
            dir,
            open: Some(open),
        }
    }
}

impl Harness for Sqlite {
    fn tasks(&self) -> &Tasks {
        &self.open.as_ref().unwrap().0
    }
    fn reopen(&mut self) -> bool {
        let (tasks, store) = self.open.take().unwrap();
        store.close();
        drop((tasks, store));
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        *self = Sqlite::open_in(dir);
        true
    }
}

fn sqlite() -> Sqlite {
    Sqlite::open_in(tempfile::tempdir().unwrap())
}

/// A task made with the body its answer wrote is written as those bytes; one that changes
/// before its batch is written is written as it is then.
#[test]
fn a_task_is_written_as_its_answer_wrote_it_unless_it_changed_since() {
    let dir = tempfile::tempdir().unwrap();
    // A long interval: both changes of the second task fall in one batch (the close
    // commits at once).
    let config = crate::config::StoreConfig {
        kind: crate::config::StoreKind::Sqlite,
        data_dir: dir.path().to_path_buf(),
        commit_interval_ms: 2_000,
        ..Default::default()
    };
    let (tasks, store) = open_durable(&config, dir.path()).unwrap();
    // What the answer wrote is told apart by a status message the task in memory lacks.
    let made = |state: TaskState| {
        let id = new_id();
        let mut task = Task::submitted(id.clone(), "c".into(), user("hi", &id, "c"));
        task.set_status(TaskStatus::now(state, None));
        let mut answered = task.clone();
        answered.status.message = Some(Box::new(Message::agent_text("as answered")));
        let form = crate::protocol::write::task(&answered).unwrap();
        tasks
            .create_answered(AGENT.into(), (OWNER.into(), None), task, Some(form.into()))
            .unwrap();
        id
    };
    let kept = made(TaskState::Completed);
    let changed = made(TaskState::Working);
    let done = status(&changed, "c", TaskState::Completed, Some("done"));
    assert_eq!(tasks.apply(&changed, &done), Applied::Yes);
    store.close();
    drop((tasks, store));
    let (tasks, _store) = open_durable(&config, dir.path()).unwrap();
    let said = |id: &str| {
        let task = tasks.inspect(viewer(), id, Task::clone).unwrap();
        let text = task.status.message.map(|m| m.text());
        (task.status.state, text)
    };
    assert_eq!(
        said(&kept),
        (TaskState::Completed, Some("as answered".into()))
    );
    assert_eq!(said(&changed), (TaskState::Completed, Some("done".into())));
}

mod sqlite_kind {
    use super::*;
    conformance!(sqlite_store, sqlite, bounded);
}

/// A schema of its own in the local PostgreSQL, opened as the gateway opens it (dropped
/// when the harness is).
struct Postgres {
    open: Option<(Tasks, crate::store::Store)>,
    // After `open`: the store lets go of the schema before it is dropped.
    schema: crate::store::postgres::testing::Schema,
}

impl Postgres {
    fn open_in(schema: &str) -> (Tasks, crate::store::Store) {
        let config = crate::config::StoreConfig {
            kind: crate::config::StoreKind::Postgres,
            url: crate::store::postgres::testing::url(),
            schema: schema.into(),
            commit_interval_ms: 5,
            ..Default::default()
        };
        open_durable(&config, std::path::Path::new(".")).unwrap_or_else(|e| {
            panic!("{e} (the tests need the local PostgreSQL, or POSTGRES_URL)")
        })
    }
}

impl Harness for Postgres {
    fn tasks(&self) -> &Tasks {
        &self.open.as_ref().unwrap().0
    }
    fn reopen(&mut self) -> bool {
        let (tasks, store) = self.open.take().unwrap();
        store.close();
        drop((tasks, store));
        self.open = Some(Postgres::open_in(&self.schema.0));
        true
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some((_, store)) = self.open.take() {
            store.close();
        }
    }
}

fn postgres() -> Postgres {
    let schema =
        crate::store::postgres::testing::Schema(crate::store::postgres::testing::schema_name());
    Postgres {
        open: Some(Postgres::open_in(&schema.0)),
        schema,
    }
}

mod postgres_kind {
    use super::*;
    conformance!(postgres_store, postgres, bounded);
}

/// Redis for the tests: the one `REDIS_URL` names (default redis://127.0.0.1:6379), else a
/// `redis-server` from PATH started for this test process (and left to die with it).
fn redis_url() -> &'static str {
    static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URL.get_or_init(|| {
        let answers = |url: &str| {
            redis::Client::open(url)
                .and_then(|c| c.get_connection_with_timeout(std::time::Duration::from_secs(1)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        };
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        if answers(&url) {
            return url;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let server = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("no Redis at {url} and no redis-server to start ({e}): install redis-server or set REDIS_URL"));
        // Lives as long as the test process.
        static SERVER: std::sync::OnceLock<std::sync::Mutex<std::process::Child>> =
            std::sync::OnceLock::new();
        let _ = SERVER.set(std::sync::Mutex::new(server));
        let url = format!("redis://127.0.0.1:{port}");
        for _ in 0..200 {
            if answers(&url) {
                return url;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("redis-server did not start on port {port}");
    })
}

/// Replicas of a shared store (Redis under a prefix of their own, or a PostgreSQL schema
/// of their own); reopening starts the next one.
struct Replicas {
    rt: tokio::runtime::Runtime,
    config: crate::config::StoreConfig,
    open: Option<(Tasks, crate::store::Store)>,
    _schema: Option<crate::store::postgres::testing::Schema>,
}

impl Replicas {
    fn replica(
        rt: &tokio::runtime::Runtime,
        config: &crate::config::StoreConfig,
    ) -> (Tasks, crate::store::Store) {
        let memory = Arc::new(super::MemoryTaskStore::new(CAPACITY, usize::MAX));
        let dir = std::path::Path::new(".");
        let (store, _) = crate::store::open(config, dir, memory.clone()).unwrap();
        let journal = store.journal.clone().unwrap();
        memory.write_behind(journal.clone());
        let tasks = Tasks::new(memory, QUOTA, metrics());
        tasks.share(journal, store.shared.clone().unwrap());
        let shared = store.shared.clone().unwrap();
        rt.block_on(async move {
            // As a replica starts: its lease, then the others' leftovers.
            let keeping = shared.clone();
            tokio::spawn(async move { keeping.keep_lease().await });
            // Two looks: a replica is taken for dead when its lease is missing at both.
            let mut suspects = Default::default();
            for _ in 0..2 {
                shared
                    .reap_once(REPLICA_LOST, 600, &mut suspects)
                    .await
                    .unwrap();
            }
        });
        (tasks, store)
    }

    /// Everything written so far is in Redis.
    fn flushed(&self) -> &(Tasks, crate::store::Store) {
        let open = self.open.as_ref().unwrap();
        if let Some(journal) = &open.1.journal {
            assert!(journal.flush(std::time::Duration::from_secs(5)));
        }
        open
    }
}

impl Harness for Replicas {
    fn tasks(&self) -> &Tasks {
        &self.open.as_ref().unwrap().0
    }
    fn reopen(&mut self) -> bool {
        let (tasks, store) = self.open.take().unwrap();
        store.close();
        let shared = store.shared.clone().unwrap();
        self.rt.block_on(shared.release_lease());
        drop((tasks, store));
        self.open = Some(Replicas::replica(&self.rt, &self.config));
        true
    }
    fn read(&self, viewer: Viewer<'_>, id: &str) -> Option<Task> {
        let (tasks, _) = self.flushed();
        self.rt.block_on(tasks.hydrate(id)).unwrap();
        tasks.inspect(viewer, id, Task::clone)
    }
    fn list(&self, viewer: Viewer<'_>, q: &ListQuery) -> super::TaskPage {
        let (tasks, _) = self.flushed();
        self.rt
            .block_on(tasks.list_shared(viewer, q))
            .unwrap()
            .unwrap()
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        if self.config.kind != crate::config::StoreKind::Redis {
            return;
        }
        // Only this harness's keys.
        let Ok(mut c) = redis::Client::open(redis_url()).and_then(|c| c.get_connection()) else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.config.key_prefix))
            .query(&mut c)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut c);
        }
    }
}

fn replicas(
    config: crate::config::StoreConfig,
    schema: Option<crate::store::postgres::testing::Schema>,
) -> Replicas {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = crate::config::StoreConfig {
        lease_secs: 2,
        retention_secs: 600,
        ..config
    };
    let open = Some(Replicas::replica(&rt, &config));
    Replicas {
        rt,
        config,
        open,
        _schema: schema,
    }
}

fn redis() -> Replicas {
    let config = crate::config::StoreConfig {
        kind: crate::config::StoreKind::Redis,
        url: redis_url().to_string(),
        key_prefix: format!("a2a-conformance-{}:", new_id()),
        ..Default::default()
    };
    replicas(config, None)
}

fn postgres_shared() -> Replicas {
    use crate::store::postgres::testing;
    let schema = testing::Schema(testing::schema_name());
    let config = crate::config::StoreConfig {
        kind: crate::config::StoreKind::Postgres,
        url: testing::url(),
        schema: schema.0.clone(),
        shared: true,
        ..Default::default()
    };
    replicas(config, Some(schema))
}

conformance!(redis_store, redis);
conformance!(postgres_shared_store, postgres_shared);

/// A streamed task's resume log counts in the store's bytes and in its owner's, as the
/// task does: the bound holds what memory holds, and a full log stops growing.
#[test]
fn a_streamed_tasks_log_counts_in_its_bytes() {
    let h = memory();
    let tasks = h.tasks();
    let id = new_id();
    let task = Task::submitted(id.clone(), "c".into(), user("hi", &id, "c"));
    (tasks.create_logged(AGENT.into(), (OWNER.into(), None), task, None, true)).unwrap();
    let stored = || tasks.store.byte_figures().0;
    let held = || tasks.unfinished.get(OWNER).map_or(0, |h| h.bytes);
    assert_eq!(stored(), held());
    let text = "x".repeat(1000);
    let mut growth = Vec::new();
    for _ in 0..crate::store::RESUME_EVENTS + 10 {
        let before = stored();
        assert_eq!(
            tasks.apply(&id, &chunk(&id, "c", &text, true)),
            Applied::Yes
        );
        growth.push(stored() - before);
        assert_eq!(stored(), held());
    }
    // Each chunk joins the task and the log, until the log is full: then one leaves it.
    assert!(growth[0] >= 2 * text.len(), "{growth:?}");
    let last = *growth.last().unwrap();
    assert!((text.len()..2 * text.len()).contains(&last), "{growth:?}");
    // Finished, it is no longer the owner's; the store still holds it all.
    let done = status(&id, "c", TaskState::Completed, None);
    assert_eq!(tasks.apply(&id, &done), Applied::Yes);
    assert_eq!(held(), 0);
    let found = tasks
        .store
        .read(&id, &mut |st| assert_eq!(st.bytes, stored()));
    assert!(found);
}

/// What the admin API keeps, in a durable store (`open` gives the store's control): entries
/// versioned, conditional and audited, counters added, read and reserved all or nothing,
/// and all of it there again after the store is opened again.
fn control_and_counters_survive_a_reopen<H: Harness>(
    h: &mut H,
    control_of: fn(&H) -> crate::store::control::Control,
) {
    use crate::store::control::conformance::counters_add_read_and_reserve;
    use crate::store::control::{self, Expect, Kind};
    use crate::store::counters::{CounterOp, CounterReply};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let control = control_of(h);
    rt.block_on(control::conformance::entries_are_versioned_and_writes_conditional(&control));
    rt.block_on(control::conformance::the_audit_pages_newest_first(&control));
    rt.block_on(counters_add_read_and_reserve(&control, true));
    rt.block_on(control.put(Kind::Key, "kept", Some("{}".into()), Expect::Absent))
        .unwrap();
    let version = rt.block_on(control.version()).unwrap();
    assert!(h.reopen());
    let control = control_of(h);
    let kept = rt.block_on(control.get(Kind::Key, "kept")).unwrap();
    assert_eq!(kept.map(|e| e.version), Some(1));
    assert_eq!(rt.block_on(control.version()).unwrap(), version);
    assert_eq!(rt.block_on(control.audit(None, 100)).unwrap().len(), 5);
    let loaded = rt.block_on(control.counters(CounterOp::Load("g".into())));
    let CounterReply::Rows(rows) = loaded.unwrap() else {
        panic!("rows expected");
    };
    let total: i64 = rows.iter().map(|r| r.amount).sum();
    assert_eq!(total, 5 + 7 + 1 + 2, "{rows:?}");
}

#[test]
fn control_and_counters_in_sqlite_survive_a_reopen() {
    control_and_counters_survive_a_reopen(&mut sqlite(), |h| {
        h.open.as_ref().unwrap().1.control.clone()
    });
}

#[test]
fn control_and_counters_in_postgres_survive_a_reopen() {
    control_and_counters_survive_a_reopen(&mut postgres(), |h| {
        h.open.as_ref().unwrap().1.control.clone()
    });
}

/// The admin API's entries in Redis: one replica's writes are the others', and two
/// replicas creating one name at once do not both succeed.
#[test]
fn control_entries_in_redis_are_shared_and_writes_race_safely() {
    use crate::store::control::{self, Expect, Kind, Written};
    let h = redis();
    let control = h.open.as_ref().unwrap().1.control.clone();
    h.rt.block_on(control::conformance::entries_are_versioned_and_writes_conditional(&control));
    h.rt.block_on(control::conformance::the_audit_pages_newest_first(&control));
    let other = Replicas::replica(&h.rt, &h.config);
    let other_control = other.1.control.clone();
    let outcomes = h.rt.block_on(async {
        let a = control.put(
            Kind::Agent,
            "race",
            Some("{\"by\":1}".into()),
            Expect::Absent,
        );
        let b = other_control.put(
            Kind::Agent,
            "race",
            Some("{\"by\":2}".into()),
            Expect::Absent,
        );
        futures_util::future::join(a, b).await
    });
    let done = [outcomes.0.unwrap(), outcomes.1.unwrap()];
    assert_eq!(
        done.iter().filter(|w| **w == Written::Done(1)).count(),
        1,
        "{done:?}"
    );
    let seen =
        h.rt.block_on(other_control.get(Kind::Agent, "race"))
            .unwrap();
    assert_eq!(seen.map(|e| e.version), Some(1));
    other.1.close();
}

/// Counters in Redis: two replicas add to the same numbers, and of two reservations of
/// the last unit at once only one is taken.
#[test]
fn counters_in_redis_are_shared_and_the_last_unit_goes_once() {
    use crate::store::control::conformance::counters_add_read_and_reserve;
    use crate::store::counters::{self, Charge, Counted, CounterOp, CounterReply};
    let h = redis();
    let control = h.open.as_ref().unwrap().1.control.clone();
    h.rt.block_on(counters_add_read_and_reserve(&control, true));
    let other = Replicas::replica(&h.rt, &h.config);
    let other_control = other.1.control.clone();
    let last = || {
        CounterOp::Reserve(vec![Charge {
            counted: Counted {
                group: "race".into(),
                key: "k".into(),
                field: "requests".into(),
                amount: 1,
                expires_ms: counters::now_ms() + 60_000,
            },
            limit: 1,
        }])
    };
    let (a, b) = h.rt.block_on(futures_util::future::join(
        control.counters(last()),
        other_control.counters(last()),
    ));
    let outcomes = [a.unwrap(), b.unwrap()];
    let taken = outcomes
        .iter()
        .filter(|o| matches!(o, CounterReply::Values(_)))
        .count();
    assert_eq!(taken, 1, "{outcomes:?}");
    other.1.close();
}

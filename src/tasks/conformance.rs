//! One set of test bodies that every task store passes: each body gets a fresh store from a
//! [`Harness`] and, for the durable kinds, opens it again as a restart would. The store
//! kinds each instantiate the bodies at the bottom of this file.

use std::sync::Arc;

use super::{Applied, Tasks, Viewer, LOST_WORK};
use crate::protocol::model::{
    new_id, Artifact, Message, Part, Task, TaskArtifactUpdateEvent, TaskEvent, TaskState,
    TaskStatus, TaskStatusUpdateEvent,
};
use crate::protocol::params::ListQuery;

/// A store under test: its `Tasks`, and how to reopen it (None: it keeps nothing).
pub(super) trait Harness {
    fn tasks(&self) -> &Tasks;
    /// Stops this instance as a clean shutdown would and opens the store again; false for
    /// a store that does not outlive its process.
    fn reopen(&mut self) -> bool;
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
        .create(agent.into(), owner.into(), task, None)
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
    h.tasks().inspect(viewer(), id, Task::clone)
}

/// A task as clients see it (times in milliseconds, as the wire and the stores keep them).
fn wire(h: &dyn Harness, id: &str) -> Option<serde_json::Value> {
    get(h, id).map(|t| serde_json::to_value(t).unwrap())
}

fn query(page_size: usize) -> ListQuery {
    ListQuery {
        context_id: None,
        state: None,
        page_size,
        page_token: None,
        history_length: None,
        status_after: None,
        include_artifacts: true,
    }
}

/// Every page of a query, in order.
fn all_pages(h: &dyn Harness, mut q: ListQuery) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        let page = h.tasks().list(viewer(), &q).unwrap();
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
        let t = h.tasks();
        assert!(get(h, &id).is_some());
        for (agent, principal) in [("other", OWNER), (AGENT, "someone-else")] {
            let v = Viewer { agent, principal };
            assert!(t.inspect(v, &id, |_| ()).is_none(), "{agent}/{principal}");
            let page = t.list(v, &query(10)).unwrap();
            assert!(page.tasks.is_empty());
        }
        assert_eq!(t.owner(&id).as_deref(), Some(AGENT));
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
        let first = h.tasks().list(viewer(), &query(3)).unwrap();
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
        let note = t.status.message.as_ref().unwrap();
        assert_eq!(note.text(), LOST_WORK);
    }
    assert_eq!(get(h, &done).unwrap().status.state, TaskState::Completed);
    // New tasks after a restart sort after the old ones.
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

/// The bodies, as tests of one store kind: `conformance!(name, || harness)`.
macro_rules! conformance {
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
            fn evicts_the_oldest_finished_when_full() {
                super::evicts_the_oldest_finished_when_full(&mut $open());
            }
            #[test]
            fn prunes_finished_tasks_past_retention() {
                super::prunes_finished_tasks_past_retention(&mut $open());
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
    let store = Arc::new(super::MemoryTaskStore::new(CAPACITY));
    Memory(Tasks::new(store, 100, metrics()))
}

conformance!(memory_store, memory);

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
        let memory = Arc::new(super::MemoryTaskStore::new(CAPACITY));
        let (store, mut loaded) = crate::store::open(&config, dir.path(), memory.clone()).unwrap();
        memory.write_behind(store.journal.clone().unwrap());
        let tasks = Tasks::new(memory, 100, metrics());
        tasks.restore(std::mem::take(&mut loaded.tasks)).unwrap();
        Sqlite {
            dir,
            open: Some((tasks, store)),
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

conformance!(sqlite_store, sqlite);

//! The in-memory [`TaskStore`]: bounded in count, evicting the oldest finished tasks first.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{page, FastMap, StoreError, StoredTask, TaskPage, TaskStore, Viewer};
use crate::protocol::model::TaskState;
use crate::protocol::params::ListQuery;
use crate::store::{Journal, Snapshot, Snapshots, TaskKey};

pub(crate) struct MemoryTaskStore {
    /// Keyed by the id's 128-bit value: no key allocations, and a lookup compares keys
    /// without chasing a pointer. Boxed: a task inline made every bucket ~400 bytes, so
    /// each insert and eviction walked several cold cache lines of a table too large to
    /// stay in cache.
    tasks: FastMap<TaskKey, Box<StoredTask>>,
    /// Ids in the order their tasks finished; eviction takes from the front. An id may be
    /// stale (already evicted), which eviction tolerates.
    finished: Mutex<VecDeque<TaskKey>>,
    /// `tasks.len()` without visiting every shard of the map on each insert.
    count: AtomicUsize,
    capacity: usize,
    /// The tasks' [`StoredTask::bytes`], summed, and the most they may sum to.
    bytes: AtomicUsize,
    byte_capacity: usize,
    /// Where changes are written behind (a durable store); None keeps them here only.
    journal: std::sync::OnceLock<Journal>,
    /// Copies of tasks other replicas run (a shared store), as last read: readable here,
    /// never changed here.
    foreign: quick_cache::sync::Cache<TaskKey, Arc<StoredTask>>,
}

/// Copies of other replicas' tasks kept at once (the least recently used go first).
const FOREIGN_COPIES: usize = 10_000;

impl MemoryTaskStore {
    /// Holds at most `capacity` tasks and `byte_capacity` bytes of them.
    pub(crate) fn new(capacity: usize, byte_capacity: usize) -> MemoryTaskStore {
        MemoryTaskStore {
            tasks: FastMap::default(),
            finished: Mutex::new(VecDeque::new()),
            count: AtomicUsize::new(0),
            capacity: capacity.max(1),
            bytes: AtomicUsize::new(0),
            byte_capacity: byte_capacity.max(1),
            journal: std::sync::OnceLock::new(),
            foreign: quick_cache::sync::Cache::new(FOREIGN_COPIES),
        }
    }

    /// Writes every later change through `journal` (set once, before serving).
    pub(crate) fn write_behind(&self, journal: Journal) {
        let _ = self.journal.set(journal);
    }

    fn remove(&self, key: &TaskKey) -> bool {
        let Some((_, st)) = self.tasks.remove(key) else {
            return false;
        };
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.bytes.fetch_sub(st.bytes, Ordering::AcqRel);
        if let Some(journal) = self.journal.get() {
            let seq = st.seq;
            journal.task_removed(st.task.id.clone(), seq, || snapshot_of(&st));
        }
        true
    }

    fn put(&self, task: StoredTask, written: bool) -> Result<(), StoreError> {
        // Checked first: an id that cannot be stored must not cost another task its place.
        let id = key(&task.task.id).ok_or_else(|| StoreError::BadId(task.task.id.clone()))?;
        self.make_room(task.bytes)?;
        let finished = task.task.status.state.is_terminal();
        match self.tasks.entry(id) {
            dashmap::Entry::Occupied(_) => return Err(StoreError::Duplicate(task.task.id)),
            dashmap::Entry::Vacant(v) => {
                self.bytes.fetch_add(task.bytes, Ordering::AcqRel);
                v.insert(Box::new(task));
                self.count.fetch_add(1, Ordering::AcqRel);
            }
        }
        if finished {
            self.finished_queue().push_back(id);
        }
        if written {
            self.changed(id);
        }
        Ok(())
    }

    fn changed(&self, key: TaskKey) {
        if let Some(journal) = self.journal.get() {
            journal.task_changed(key);
        }
    }

    fn finished_queue(&self) -> std::sync::MutexGuard<'_, VecDeque<TaskKey>> {
        // A panic while holding this lock cannot leave the queue inconsistent (push/pop
        // only), so a poisoned lock is still usable.
        self.finished
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The task with exactly this id (a UUID spelled differently is another id).
    fn get(&self, id: &str) -> Option<dashmap::mapref::one::Ref<'_, TaskKey, Box<StoredTask>>> {
        key(id)
            .and_then(|k| self.tasks.get(&k))
            .filter(|st| st.task.id == id)
    }

    /// [`Self::get`], for writing.
    fn get_mut(
        &self,
        id: &str,
    ) -> Option<dashmap::mapref::one::RefMut<'_, TaskKey, Box<StoredTask>>> {
        key(id)
            .and_then(|k| self.tasks.get_mut(&k))
            .filter(|st| st.task.id == id)
    }

    /// Evicts the oldest finished tasks until a task of `bytes` more fits, in count and
    /// in bytes; refuses when only unfinished ones are left.
    fn make_room(&self, bytes: usize) -> Result<(), StoreError> {
        while self.count.load(Ordering::Acquire) >= self.capacity {
            let Some(victim) = self.finished_queue().pop_front() else {
                return Err(StoreError::Full(format!(
                    "{} unfinished tasks",
                    self.capacity
                )));
            };
            self.remove(&victim);
        }
        while self.bytes.load(Ordering::Acquire) + bytes > self.byte_capacity {
            let Some(victim) = self.finished_queue().pop_front() else {
                return Err(StoreError::Full(format!(
                    "{} of unfinished tasks",
                    crate::config::bytes_text(self.byte_capacity as u64)
                )));
            };
            self.remove(&victim);
        }
        Ok(())
    }

    /// After a task grew: the oldest finished tasks make room until the store is within
    /// its bytes again, as far as they can (unfinished tasks are never evicted).
    fn shed(&self) {
        while self.bytes.load(Ordering::Acquire) > self.byte_capacity {
            let Some(victim) = self.finished_queue().pop_front() else {
                return;
            };
            self.remove(&victim);
        }
    }
}

/// The key of a task id; None for anything that is not a UUID, which no task has.
fn key(id: &str) -> Option<TaskKey> {
    uuid::Uuid::try_parse(id).ok().map(|u| u.as_u128())
}

impl TaskStore for MemoryTaskStore {
    fn insert(&self, task: StoredTask) -> Result<(), StoreError> {
        self.put(task, true)
    }

    fn restore(&self, task: StoredTask) -> Result<(), StoreError> {
        self.put(task, false)
    }

    fn prune_finished(&self, cutoff: chrono::DateTime<chrono::Utc>) -> usize {
        let old: Vec<TaskKey> = self
            .tasks
            .iter()
            .filter(|st| {
                let status = &st.task.status;
                status.state.is_terminal() && status.timestamp.is_some_and(|t| t < cutoff)
            })
            .map(|st| *st.key())
            .collect();
        old.into_iter().filter(|k| self.remove(k)).count()
    }

    fn read(&self, id: &str, f: &mut dyn FnMut(&StoredTask)) -> bool {
        if let Some(st) = self.get(id) {
            f(&st);
            return true;
        }
        let copy = key(id)
            .and_then(|k| self.foreign.get(&k))
            .filter(|st| st.task.id == id);
        match copy {
            Some(st) => {
                f(&st);
                true
            }
            None => false,
        }
    }

    fn update(&self, id: &str, f: &mut dyn FnMut(&mut StoredTask)) -> bool {
        let Some(mut st) = self.get_mut(id) else {
            return false;
        };
        let was_finished = st.task.status.state.is_terminal();
        let bytes_before = st.bytes;
        f(&mut st);
        let key = *st.key();
        if !was_finished && st.task.status.state.is_terminal() {
            self.finished_queue().push_back(key);
        }
        let grown = st.bytes.saturating_sub(bytes_before);
        // A task's resume log drops its oldest events as it takes new ones.
        let shrunk = bytes_before.saturating_sub(st.bytes);
        drop(st);
        if shrunk > 0 {
            self.bytes.fetch_sub(shrunk, Ordering::AcqRel);
        }
        if grown > 0 && self.bytes.fetch_add(grown, Ordering::AcqRel) + grown > self.byte_capacity {
            self.shed();
        }
        self.changed(key);
        true
    }

    fn list(&self, viewer: Viewer<'_>, query: &ListQuery) -> Result<TaskPage, StoreError> {
        let matching: Vec<_> = self
            .tasks
            .iter()
            .filter(|st| viewer.sees(st))
            .filter(|st| {
                let t = &st.task;
                page::admits(query, &t.context_id, t.status.state, t.status.timestamp)
            })
            .map(|st| {
                let key = page::sort_key(st.task.status.timestamp, st.seq, &st.task.id);
                (key, st.task.id.clone())
            })
            .collect();
        let (ids, next_page_token, total_size) = page::page(matching, query)?;
        let tasks = ids
            .iter()
            .filter_map(|id| self.get(id).map(|st| st.task.clone()))
            .collect();
        Ok(TaskPage {
            tasks,
            next_page_token,
            total_size,
        })
    }

    fn interrupted_before(&self, cutoff: chrono::DateTime<chrono::Utc>) -> Vec<String> {
        self.tasks
            .iter()
            .filter(|st| {
                let status = &st.task.status;
                status.state.is_interrupted() && status.timestamp.is_some_and(|t| t < cutoff)
            })
            .map(|st| st.task.id.clone())
            .collect()
    }

    fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    fn adopt_foreign(&self, task: StoredTask) {
        if let Some(k) = key(&task.task.id) {
            self.foreign.insert(k, Arc::new(task));
        }
    }

    fn holds(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    fn byte_figures(&self) -> (usize, usize, usize) {
        let largest = self.tasks.iter().map(|st| st.bytes).max().unwrap_or(0);
        (
            self.bytes.load(Ordering::Acquire),
            self.byte_capacity,
            largest,
        )
    }

    fn count_by_state(&self) -> Vec<(TaskState, usize)> {
        let mut counts: Vec<(TaskState, usize)> = Vec::new();
        for entry in self.tasks.iter() {
            let state = entry.value().task.status.state;
            match counts.iter_mut().find(|(s, _)| *s == state) {
                Some((_, n)) => *n += 1,
                None => counts.push((state, 1)),
            }
        }
        counts
    }
}

impl Snapshots for MemoryTaskStore {
    fn snapshot(&self, key: TaskKey) -> Option<Snapshot> {
        snapshot_of(&*self.tasks.get(&key)?)
    }
}

/// A task as a durable store writes it.
fn snapshot_of(st: &StoredTask) -> Option<Snapshot> {
    Some(Snapshot {
        id: st.task.id.clone(),
        agent: st.agent.clone(),
        owner: st.owner.clone(),
        seq: st.seq,
        version: st.version,
        state: st.task.status.state,
        body: serde_json::to_string(&st.task).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::model::{Task, TaskState, TaskStatus};
    use std::sync::Arc;

    fn task(id: &str, state: TaskState) -> StoredTask {
        StoredTask {
            task: Task {
                id: id.into(),
                context_id: "c".into(),
                status: TaskStatus::now(state, None),
                artifacts: vec![],
                history: vec![],
                metadata: None,
            },
            agent: Arc::from("a"),
            owner: Arc::from("anonymous"),
            seq: 0,
            version: 0,
            replica: None,
            cancel: None,
            bytes: 100,
            log: None,
        }
    }

    const DONE: &str = "00000000-0000-4000-8000-000000000001";
    const BUSY: &str = "b0000000-0000-4000-8000-00000000000b";
    const NEW: &str = "00000000-0000-4000-8000-000000000003";

    #[test]
    fn evicts_oldest_finished_first_and_refuses_when_all_active() {
        let store = MemoryTaskStore::new(2, usize::MAX);
        store.insert(task(DONE, TaskState::Working)).unwrap();
        store.insert(task(BUSY, TaskState::Working)).unwrap();
        assert!(matches!(
            store.insert(task(NEW, TaskState::Working)),
            Err(StoreError::Full(_))
        ));
        store.update(DONE, &mut |st| st.task.status.state = TaskState::Completed);
        store.insert(task(NEW, TaskState::Working)).unwrap();
        assert!(!store.read(DONE, &mut |_| {}));
        assert!(store.read(BUSY, &mut |_| {}));
    }

    #[test]
    fn ids_are_exact_and_only_uuids_are_stored() {
        let store = MemoryTaskStore::new(2, usize::MAX);
        store.insert(task(BUSY, TaskState::Working)).unwrap();
        assert!(matches!(
            store.insert(task(BUSY, TaskState::Working)),
            Err(StoreError::Duplicate(_))
        ));
        // Full, with one task to evict: a refused id evicts nothing.
        store.insert(task(DONE, TaskState::Completed)).unwrap();
        assert!(matches!(
            store.insert(task("not-a-uuid", TaskState::Working)),
            Err(StoreError::BadId(_))
        ));
        assert!(store.read(DONE, &mut |_| {}));
        // The same UUID spelled another way names no task.
        for other in [
            BUSY.to_uppercase(),
            BUSY.replace('-', ""),
            format!("urn:uuid:{BUSY}"),
        ] {
            assert!(!store.read(&other, &mut |_| {}), "{other}");
            assert!(!store.update(&other, &mut |_| {}), "{other}");
        }
        assert!(!store.read("not-a-uuid", &mut |_| {}));
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn bounded_in_bytes_evicting_finished_first_even_as_tasks_grow() {
        // Room for three tasks of 100 bytes.
        let store = MemoryTaskStore::new(100, 300);
        store.insert(task(DONE, TaskState::Completed)).unwrap();
        store.insert(task(BUSY, TaskState::Working)).unwrap();
        store.insert(task(NEW, TaskState::Working)).unwrap();
        assert_eq!(store.byte_figures().0, 300);
        // A fourth takes the finished task's place.
        const FOURTH: &str = "00000000-0000-4000-8000-000000000004";
        store.insert(task(FOURTH, TaskState::Working)).unwrap();
        assert!(!store.read(DONE, &mut |_| {}));
        // Only unfinished tasks left: a fifth is refused, saying which bound.
        const FIFTH: &str = "00000000-0000-4000-8000-000000000005";
        match store.insert(task(FIFTH, TaskState::Working)) {
            Err(StoreError::Full(bound)) => assert_eq!(bound, "300 bytes of unfinished tasks"),
            other => panic!("{other:?}"),
        }
        // A finished task is evicted when another grows past the bound.
        store.update(NEW, &mut |st| st.task.status.state = TaskState::Completed);
        store.update(BUSY, &mut |st| st.bytes += 50);
        assert!(!store.read(NEW, &mut |_| {}));
        assert_eq!(store.byte_figures(), (250, 300, 150));
    }
}

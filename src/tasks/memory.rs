//! The in-memory [`TaskStore`]: bounded in count and in bytes. When full, it evicts a
//! finished task of the caller whose finished tasks hold the most (in the bound that is
//! full: bytes or count), its oldest first: a caller holding no more than its fair share
//! keeps its tasks while another holds more, however fast that one sends.

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
    /// Finished tasks by owner, each owner's in the order they finished.
    finished: Mutex<Finished>,
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
            finished: Mutex::default(),
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
        if st.task.status.state.is_terminal() {
            self.finished_queue().gone(&st.owner, st.bytes);
        }
        if let Some(journal) = self.journal.get() {
            let seq = st.seq;
            journal.task_removed(st.task.id.clone(), seq, || snapshot_of(&st, None));
        }
        true
    }

    /// Adds a task; `written`: a durable store writes it (as `stored_form`, where its
    /// answer wrote that already).
    fn put(
        &self,
        task: StoredTask,
        written: bool,
        stored_form: Option<Box<[u8]>>,
    ) -> Result<(), StoreError> {
        // Checked first: an id that cannot be stored must not cost another task its place.
        let id = key(&task.task.id).ok_or_else(|| StoreError::BadId(task.task.id.clone()))?;
        self.make_room(task.bytes)?;
        let finished = task.task.status.state.is_terminal();
        match self.tasks.entry(id) {
            dashmap::Entry::Occupied(_) => return Err(StoreError::Duplicate(task.task.id)),
            dashmap::Entry::Vacant(v) => {
                self.bytes.fetch_add(task.bytes, Ordering::AcqRel);
                let stored = v.insert(Box::new(task));
                self.count.fetch_add(1, Ordering::AcqRel);
                // Under the task's lock, as `update` does (the task's lock, then the
                // queue's: never the other way round).
                if finished {
                    self.finished_queue().push(&stored.owner, id, stored.bytes);
                }
            }
        }
        if let (true, Some(journal)) = (written, self.journal.get()) {
            journal.task_made(id, stored_form);
        }
        Ok(())
    }

    fn changed(&self, key: TaskKey) {
        if let Some(journal) = self.journal.get() {
            journal.task_changed(key);
        }
    }

    fn finished_queue(&self) -> std::sync::MutexGuard<'_, Finished> {
        // A panic while holding this lock leaves at worst a count off (no invariant spans
        // two steps), so a poisoned lock is still usable.
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

    /// Evicts finished tasks (see [`Finished::victim`]) until a task of `bytes` more fits,
    /// in count and in bytes; refuses when only unfinished ones are left.
    fn make_room(&self, bytes: usize) -> Result<(), StoreError> {
        while self.count.load(Ordering::Acquire) >= self.capacity {
            let Some(victim) = self.finished_queue().victim(Bound::Count) else {
                return Err(StoreError::Full(format!(
                    "{} unfinished tasks",
                    self.capacity
                )));
            };
            self.remove(&victim);
        }
        while self.bytes.load(Ordering::Acquire) + bytes > self.byte_capacity {
            let Some(victim) = self.finished_queue().victim(Bound::Bytes) else {
                return Err(StoreError::Full(format!(
                    "{} of unfinished tasks",
                    crate::config::bytes_text(self.byte_capacity as u64)
                )));
            };
            self.remove(&victim);
        }
        Ok(())
    }

    /// After a task grew: finished tasks make room until the store is within its bytes
    /// again, as far as they can (unfinished tasks are never evicted).
    fn shed(&self) {
        while self.bytes.load(Ordering::Acquire) > self.byte_capacity {
            let Some(victim) = self.finished_queue().victim(Bound::Bytes) else {
                return;
            };
            self.remove(&victim);
        }
    }
}

/// The bound eviction makes room in.
#[derive(Clone, Copy)]
enum Bound {
    Count,
    Bytes,
}

/// The finished tasks in the store, by owner: the candidates for eviction.
#[derive(Default)]
struct Finished {
    by_owner: std::collections::HashMap<Arc<str>, OwnerFinished, ahash::RandomState>,
}

/// One owner's finished tasks: their ids in the order they finished (an id may be stale,
/// its task already gone, which eviction skips), and how many there are and what they
/// hold now.
#[derive(Default)]
struct OwnerFinished {
    order: VecDeque<TaskKey>,
    tasks: usize,
    bytes: usize,
}

impl Finished {
    fn push(&mut self, owner: &Arc<str>, key: TaskKey, bytes: usize) {
        let held = match self.by_owner.get_mut(owner) {
            Some(held) => held,
            None => self.by_owner.entry(owner.clone()).or_default(),
        };
        held.order.push_back(key);
        held.tasks += 1;
        held.bytes += bytes;
    }

    /// A finished task of `owner`'s, of `bytes`, left the store (evicted, pruned, or
    /// resized: then it comes back with [`Self::resized`]).
    fn gone(&mut self, owner: &Arc<str>, bytes: usize) {
        let Some(held) = self.by_owner.get_mut(owner) else {
            return;
        };
        held.tasks = held.tasks.saturating_sub(1);
        held.bytes = held.bytes.saturating_sub(bytes);
        if held.tasks == 0 {
            self.by_owner.remove(owner);
        }
    }

    /// A finished task of `owner`'s went from `before` to `after` bytes.
    fn resized(&mut self, owner: &Arc<str>, before: usize, after: usize) {
        if let Some(held) = self.by_owner.get_mut(owner) {
            held.bytes = (held.bytes + after).saturating_sub(before);
        }
    }

    /// The next task to evict to make room in `bound`: the oldest finished task of the
    /// owner whose finished tasks hold the most of it. Whenever the store is full, that
    /// owner holds at least an even share of it (the store's bound over the owners with
    /// finished tasks), so an owner below that share loses no task while another holds
    /// more. None when no task is finished.
    fn victim(&mut self, bound: Bound) -> Option<TaskKey> {
        let weight = |held: &OwnerFinished| match bound {
            Bound::Count => held.tasks,
            Bound::Bytes => held.bytes,
        };
        let owner = match self.by_owner.len() {
            0 => return None,
            1 => self.by_owner.keys().next()?.clone(),
            _ => (self.by_owner.iter())
                .max_by_key(|(_, held)| weight(held))
                .map(|(owner, _)| owner.clone())?,
        };
        let held = self.by_owner.get_mut(&owner)?;
        let key = held.order.pop_front();
        if held.order.is_empty() {
            // Only stale ids were left: what they counted is gone too.
            self.by_owner.remove(&owner);
        }
        key
    }
}

/// The key of a task id; None for anything that is not a UUID, which no task has.
fn key(id: &str) -> Option<TaskKey> {
    uuid::Uuid::try_parse(id).ok().map(|u| u.as_u128())
}

impl TaskStore for MemoryTaskStore {
    fn insert_answered(
        &self,
        task: StoredTask,
        stored_form: Option<Box<[u8]>>,
    ) -> Result<(), StoreError> {
        self.put(task, true, stored_form)
    }

    fn restore(&self, task: StoredTask) -> Result<(), StoreError> {
        self.put(task, false, None)
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
        match (was_finished, st.task.status.state.is_terminal()) {
            (false, true) => self.finished_queue().push(&st.owner, key, st.bytes),
            (true, true) if st.bytes != bytes_before => {
                (self.finished_queue()).resized(&st.owner, bytes_before, st.bytes)
            }
            _ => {}
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
    fn snapshot(&self, key: TaskKey, stored_form: Option<Box<[u8]>>) -> Option<Snapshot> {
        snapshot_of(&*self.tasks.get(&key)?, stored_form)
    }
}

/// A task as a durable store writes it: `stored_form` where its answer wrote that already.
fn snapshot_of(st: &StoredTask, stored_form: Option<Box<[u8]>>) -> Option<Snapshot> {
    let body = match stored_form {
        Some(bytes) => bytes.into_vec(),
        // Written directly: through serde, this was the largest part of a durable store's
        // work per task.
        None => crate::protocol::write::task(&st.task).ok()?,
    };
    Some(Snapshot {
        id: st.task.id.clone(),
        agent: st.agent.clone(),
        owner: st.owner.clone(),
        seq: st.seq,
        version: st.version,
        state: st.task.status.state,
        body: String::from_utf8(body).ok()?,
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
            quota: None,
            seq: 0,
            version: 0,
            replica: None,
            cancel: None,
            bytes: 100,
            log: None,
            metered: None,
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

    fn owned(id: &str, owner: &str, bytes: usize) -> StoredTask {
        let mut t = task(id, TaskState::Completed);
        t.owner = Arc::from(owner);
        t.bytes = bytes;
        t
    }

    fn id(n: u32) -> String {
        format!("00000000-0000-4000-8000-{n:012}")
    }

    #[test]
    fn a_flood_evicts_its_own_tasks_not_a_caller_within_its_share() {
        // Bytes: room for ten tasks of 100; the quiet caller's one task is its oldest.
        let store = MemoryTaskStore::new(1_000, 1_000);
        store.insert(owned(&id(0), "key:quiet", 100)).unwrap();
        for n in 1..200 {
            store.insert(owned(&id(n), "anonymous", 100)).unwrap();
        }
        assert!(
            store.read(&id(0), &mut |_| {}),
            "the quiet caller's task was evicted"
        );
        assert!(!store.read(&id(1), &mut |_| {}));
        assert!(store.read(&id(199), &mut |_| {}));
        // Count: room for ten tasks.
        let store = MemoryTaskStore::new(10, usize::MAX);
        store.insert(owned(&id(0), "key:quiet", 1)).unwrap();
        for n in 1..200 {
            store.insert(owned(&id(n), "key:loud", 1)).unwrap();
        }
        assert!(store.read(&id(0), &mut |_| {}));
        assert_eq!(store.len(), 10);
        // A caller over its share loses its own oldest: two callers at five each, the
        // first sends more and evicts its own.
        let store = MemoryTaskStore::new(10, usize::MAX);
        for n in 0..10 {
            let owner = if n % 2 == 0 { "key:a" } else { "key:b" };
            store.insert(owned(&id(n), owner, 1)).unwrap();
        }
        store.insert(owned(&id(10), "key:a", 1)).unwrap();
        store.insert(owned(&id(11), "key:a", 1)).unwrap();
        // a held 5 then 6: its oldest (0) went, then b held as many as a (5 each) and
        // b's oldest or a's went; b keeps at least 4 of its 5.
        assert!(!store.read(&id(0), &mut |_| {}));
        let b_kept = (0..10)
            .filter(|n| n % 2 == 1)
            .filter(|n| store.read(&id(*n), &mut |_| {}))
            .count();
        assert!(b_kept >= 4, "{b_kept}");
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

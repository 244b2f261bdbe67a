//! What the gateway keeps of the tasks it relays to an A2A 0.3 upstream, which has no
//! ListTasks: each task's id, contextId, newest status and its time, and who created it
//! through the gateway. That is enough to answer ListTasks itself, with the filters and
//! pages local agents have. It knows only the tasks created through this gateway since it
//! started (the newest `capacity` of them); tasks that other clients of the upstream create
//! never pass through it and are not listed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};

use crate::protocol::model::{Task, TaskState, TaskStatus};
use crate::protocol::params::ListQuery;
use serde::{Deserialize, Serialize};

use crate::store::{Journal, Table};
use crate::tasks::page;
use crate::tasks::StoreError;

/// One relayed task as last seen.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    pub(crate) id: String,
    pub(crate) context_id: String,
    pub(crate) state: TaskState,
    pub(crate) timestamp: Option<DateTime<Utc>>,
    owner: Arc<str>,
    seq: u64,
}

impl Record {
    /// A newer status (a status without a time keeps the time last seen).
    fn saw(&mut self, status: &TaskStatus) {
        self.state = status.state;
        self.timestamp = status.timestamp.or(self.timestamp);
    }

    /// The task as last seen: its ids and status, without history or artifacts.
    pub(super) fn summary(self) -> Task {
        Task {
            id: self.id,
            context_id: self.context_id,
            status: TaskStatus {
                state: self.state,
                message: None,
                timestamp: self.timestamp,
            },
            artifacts: Vec::new(),
            history: Vec::new(),
            metadata: None,
        }
    }
}

pub(crate) struct Ledger {
    inner: Mutex<Inner>,
    capacity: usize,
    /// Where records are written behind (a durable store), under this agent's name.
    kept: std::sync::OnceLock<(Journal, String)>,
}

/// A record as the store keeps it (under the key `<agent>\n<task id>`).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Persisted {
    context_id: String,
    state: String,
    timestamp: Option<DateTime<Utc>>,
    owner: String,
}

#[derive(Default)]
struct Inner {
    records: HashMap<String, Record>,
    /// Creation order, for evicting the oldest record first.
    order: BTreeMap<u64, String>,
    next_seq: u64,
}

impl Ledger {
    pub(super) fn new(capacity: usize) -> Ledger {
        Ledger {
            inner: Mutex::default(),
            capacity: capacity.max(1),
            kept: std::sync::OnceLock::new(),
        }
    }

    /// Whether [`Self::keep`] was called.
    pub(super) fn is_kept(&self) -> bool {
        self.kept.get().is_some()
    }

    /// Takes in the records a durable store held for `agent` (oldest first) and writes
    /// every later change through `journal`. Once; later calls do nothing.
    pub(super) fn keep(&self, agent: &str, journal: Journal, loaded: Vec<(String, String)>) {
        if self.kept.set((journal, agent.to_string())).is_err() {
            return;
        }
        self.take_in(loaded);
    }

    /// Takes in records another replica wrote (task id, record; oldest first): new ones
    /// are added, known ones take the status written.
    pub(super) fn take_in(&self, loaded: Vec<(String, String)>) {
        for (id, value) in loaded {
            let Ok(k) = serde_json::from_str::<Persisted>(&value) else {
                continue;
            };
            let owner: Arc<str> = k.owner.into();
            let status = TaskStatus {
                state: TaskState::parse_lenient(&k.state).unwrap_or(TaskState::Unspecified),
                message: None,
                timestamp: k.timestamp,
            };
            self.insert(&owner, &id, &k.context_id, &status);
        }
    }

    fn written(&self, r: &Record) {
        let Some((journal, agent)) = self.kept.get() else {
            return;
        };
        let kept = Persisted {
            context_id: r.context_id.clone(),
            state: r.state.v03_name().to_string(),
            timestamp: r.timestamp,
            owner: r.owner.to_string(),
        };
        if let Ok(value) = serde_json::to_string(&kept) {
            journal.record(
                Table::Ledger,
                &crate::store::ledger_key(agent, &r.id),
                value,
            );
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves the records usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A task created by `owner`, or seen again (its newest status wins; the owner stays
    /// the creator).
    pub(super) fn note(&self, owner: &Arc<str>, id: &str, context_id: &str, status: &TaskStatus) {
        if let Some(r) = self.insert(owner, id, context_id, status) {
            self.written(&r);
        }
    }

    /// [`Self::note`] without writing it; the record as it is now.
    fn insert(
        &self,
        owner: &Arc<str>,
        id: &str,
        context_id: &str,
        status: &TaskStatus,
    ) -> Option<Record> {
        let mut inner = self.lock();
        if let Some(r) = inner.records.get_mut(id) {
            r.saw(status);
            return self.kept.get().map(|_| r.clone());
        }
        let seq = inner.next_seq;
        inner.next_seq += 1;
        inner.order.insert(seq, id.to_string());
        inner.records.insert(
            id.to_string(),
            Record {
                id: id.to_string(),
                context_id: context_id.to_string(),
                state: status.state,
                timestamp: status.timestamp.or_else(|| Some(Utc::now())),
                owner: owner.clone(),
                seq,
            },
        );
        while inner.records.len() > self.capacity {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            inner.records.remove(&oldest);
        }
        self.kept.get().and_then(|_| inner.records.get(id).cloned())
    }

    /// A newer status of a task already recorded; unknown ids are ignored.
    pub(super) fn update(&self, id: &str, status: &TaskStatus) {
        let changed = self.lock().records.get_mut(id).map(|r| {
            r.saw(status);
            r.clone()
        });
        if let Some(r) = changed {
            self.written(&r);
        }
    }

    /// One page of `principal`'s tasks, with the next page's token and the count of all
    /// that match.
    pub(super) fn page(
        &self,
        principal: &str,
        query: &ListQuery,
    ) -> Result<(Vec<Record>, String, usize), StoreError> {
        let matching: Vec<_> = self
            .lock()
            .records
            .values()
            .filter(|r| *r.owner == *principal)
            .filter(|r| page::admits(query, &r.context_id, r.state, r.timestamp))
            .map(|r| (page::sort_key(r.timestamp, r.seq, &r.id), r.clone()))
            .collect();
        page::page(matching, query)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(page_size: usize) -> ListQuery {
        ListQuery::first_page(page_size, false)
    }

    fn status(state: TaskState, secs: i64) -> TaskStatus {
        TaskStatus {
            state,
            message: None,
            timestamp: DateTime::from_timestamp(1_700_000_000 + secs, 0),
        }
    }

    #[test]
    fn lists_a_callers_tasks_newest_first_in_pages_and_forgets_the_oldest() {
        let ledger = Ledger::new(3);
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("key:a"), Arc::from("key:b"));
        ledger.note(&a, "t1", "c1", &status(TaskState::Working, 1));
        ledger.note(&b, "t2", "c1", &status(TaskState::Completed, 2));
        ledger.note(&a, "t3", "c2", &status(TaskState::InputRequired, 3));
        ledger.update("t1", &status(TaskState::Completed, 4));
        ledger.note(&b, "t1", "ignored", &status(TaskState::Completed, 4));

        let (page1, token, total) = ledger.page("key:a", &query(1)).unwrap();
        assert_eq!(total, 2);
        assert_eq!(page1[0].id, "t1", "newest status first");
        assert_eq!(page1[0].state, TaskState::Completed);
        assert_eq!(page1[0].context_id, "c1", "the creator's record is kept");
        let mut next = query(1);
        next.page_token = Some(token);
        let (page2, token, _) = ledger.page("key:a", &next).unwrap();
        assert_eq!((page2[0].id.as_str(), token.as_str()), ("t3", ""));

        let mut filtered = query(10);
        filtered.context_id = Some("c2".into());
        assert_eq!(ledger.page("key:a", &filtered).unwrap().0.len(), 1);
        filtered.state = Some(TaskState::Completed);
        assert_eq!(ledger.page("key:a", &filtered).unwrap().2, 0);

        ledger.note(&a, "t4", "c3", &status(TaskState::Working, 5));
        let ids: Vec<String> = ledger
            .page("key:a", &query(10))
            .unwrap()
            .0
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, ["t4", "t3"], "t1, the oldest created, made room");
        let mut bad = query(1);
        bad.page_token = Some("not a token".into());
        assert!(ledger.page("key:a", &bad).is_err());
    }
}

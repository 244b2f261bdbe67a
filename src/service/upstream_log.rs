//! The gateway's own log of the streams it relays from upstream agents, so that a caller
//! whose connection drops can resume an upstream task's stream as it resumes a local one.
//!
//! A streamed send or a subscription to an upstream agent is driven by a task of its own
//! (the recorder): it reads the upstream's stream to its end whether or not the caller is
//! still there, keeps the task's latest events and hands each to the caller's stream. A
//! caller that comes back with `Last-Event-ID` gets the events after it from the log, then
//! the live ones while the recorder runs.
//!
//! Each recording numbers the task's items as the gateway receives them, from a number its
//! start time gives (the task's first snapshot stands there, each event one more), so that
//! two recordings of a task (one after the other, or in two replicas) never share a number:
//! an id from another recording resumes with the task's snapshot.
//!
//! One recorder per task at a time: a subscription to a task a recorder is reading joins
//! it (the task as the recorder last saw it, then the same events with the same ids),
//! rather than opening a second upstream stream.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::broadcast;

use crate::protocol::model::{StreamEnd, StreamItem, Task};
use crate::protocol::ops::{ItemStream, Positioned};

/// Upstream tasks whose logs are kept; past it the oldest is forgotten.
const TASKS_KEPT: usize = 10_000;
/// Items a caller may fall behind the recorder before its stream ends with an error.
const LIVE_BUFFER: usize = 256;

/// Each logged upstream task's log, by the id the gateway gives the task.
#[derive(Default)]
pub(super) struct UpstreamLogs {
    tasks: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    logs: HashMap<String, Arc<Mutex<TaskLog>>>,
    order: VecDeque<String>,
}

struct TaskLog {
    /// The caller the task belongs to.
    owner: Arc<str>,
    /// The number of events received for the task.
    version: u64,
    events: VecDeque<(u64, StreamItem)>,
    /// The task as this recording saw it (once it saw the task itself), while it runs.
    task: Option<Task>,
    /// The recorder's channel while it runs.
    live: Option<broadcast::Sender<Positioned>>,
}

impl UpstreamLogs {
    /// The log of task `id`, made for `owner` if new.
    fn log(&self, id: &str, owner: &Arc<str>) -> Arc<Mutex<TaskLog>> {
        let mut kept = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(log) = kept.logs.get(id) {
            return log.clone();
        }
        if kept.order.len() >= TASKS_KEPT {
            if let Some(oldest) = kept.order.pop_front() {
                kept.logs.remove(&oldest);
            }
        }
        let log = Arc::new(Mutex::new(TaskLog {
            owner: owner.clone(),
            version: 0,
            events: VecDeque::new(),
            task: None,
            live: None,
        }));
        kept.order.push_back(id.to_string());
        kept.logs.insert(id.to_string(), log.clone());
        log
    }

    /// Records `items` (a streamed send's relay, its turn held inside) from a task of
    /// its own, and returns the caller's stream of them, each at its place.
    pub(super) fn record(self: &Arc<Self>, owner: Arc<str>, items: ItemStream) -> ItemStream {
        let (tx, rx) = broadcast::channel(LIVE_BUFFER);
        let logs = self.clone();
        tokio::spawn(async move {
            let mut items = items;
            // The task's log, once the first item names the task and no other recorder
            // reads it.
            let mut log: Option<Arc<Mutex<TaskLog>>> = None;
            let mut named = false;
            while let Some(item) = items.next().await {
                let item = match item {
                    Ok(item) => item,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        break;
                    }
                };
                if !named {
                    if let Some(id) = item.task_id() {
                        named = true;
                        let task = logs.log(id, &owner);
                        let mut held = task.lock().unwrap_or_else(PoisonError::into_inner);
                        if held.live.is_none() {
                            held.live = Some(tx.clone());
                            held.restart();
                            drop(held);
                            log = Some(task);
                        }
                    }
                }
                // Sent under the log's lock: a resume takes the log and subscribes under
                // it, so it sees each item once, from the log or live.
                match &log {
                    Some(log) => {
                        let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
                        let version = log.take(&item);
                        let _ = tx.send(Ok((item, Some(version))));
                    }
                    None => {
                        let _ = tx.send(Ok((item, None)));
                    }
                }
            }
            if let Some(log) = log {
                // The task is kept for subscriptions that join a running recorder only.
                let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
                log.live = None;
                log.task = None;
            }
        });
        ItemStream::positioned(live(rx))
    }

    /// The stream of task `id` after its event `version`, for `owner`: the events after it
    /// the log holds, then the live ones while its recorder runs. None when the log does
    /// not reach back that far (or holds no such task for the caller): the caller then
    /// subscribes upstream.
    pub(super) fn resume(&self, id: &str, owner: &str, version: u64) -> Option<ItemStream> {
        let log = {
            let kept = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
            kept.logs.get(id)?.clone()
        };
        let log = log.lock().unwrap_or_else(PoisonError::into_inner);
        if &*log.owner != owner || version > log.version {
            return None;
        }
        let oldest = log.events.front().map_or(log.version + 1, |(v, _)| *v);
        if oldest > version + 1 && version < log.version {
            return None;
        }
        let missed: Vec<Positioned> = (log.events.iter())
            .filter(|(v, _)| *v > version)
            .map(|(v, item)| Ok((item.clone(), Some(*v))))
            .collect();
        let ended = missed
            .iter()
            .any(|m| matches!(m, Ok((item, _)) if StreamEnd::Terminal.closes(item)));
        let rx = log
            .live
            .as_ref()
            .filter(|_| !ended)
            .map(|tx| tx.subscribe());
        let rest = stream::iter(rx).flat_map(live);
        Some(ItemStream::positioned(stream::iter(missed).chain(rest)))
    }

    /// A subscription of `owner` to task `id` while a recorder reads it: the task as the
    /// recorder last saw it, at its place, then the live events. None when no recorder
    /// reads the task (or it has not seen the task itself yet).
    pub(super) fn join(&self, id: &str, owner: &str) -> Option<ItemStream> {
        let log = {
            let kept = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
            kept.logs.get(id)?.clone()
        };
        let log = log.lock().unwrap_or_else(PoisonError::into_inner);
        if &*log.owner != owner {
            return None;
        }
        let snapshot: Positioned = Ok((StreamItem::Task(log.task.clone()?), Some(log.version)));
        let rx = log.live.as_ref()?.subscribe();
        Some(ItemStream::positioned(
            stream::once(std::future::ready(snapshot)).chain(live(rx)),
        ))
    }
}

impl TaskLog {
    /// A new recording: what happened since an earlier one was not seen, so its numbers
    /// start past a gap, from the time it starts ([`recording_base`]), and older ids no
    /// longer reach the log.
    fn restart(&mut self) {
        self.version = (self.version + 1).max(recording_base());
        self.events.clear();
        self.task = None;
    }

    /// Keeps `item` and returns its place: a task snapshot stands at the version the task
    /// has, an event makes the next one.
    fn take(&mut self, item: &StreamItem) -> u64 {
        item.fold_into(&mut self.task);
        if matches!(item, StreamItem::Task(_)) {
            return self.version;
        }
        self.version += 1;
        if self.events.len() == crate::store::RESUME_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back((self.version, item.clone()));
        self.version
    }
}

/// Where a recording's numbers start: the time, in milliseconds, times 2^20. Another
/// recording of the task (in this process later, or in another replica, whose log this
/// process does not hold) so numbers its events apart from this one's, and later ones
/// higher: an id from one recording never names an event of another, and a caller that
/// comes back with it gets the task's snapshot, as for an id older than the log.
fn recording_base() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (now.as_millis() as u64) << 20
}

/// A recorder's items as they come, until its stream ends (or the caller falls too far
/// behind, which ends this stream with an error).
fn live(rx: broadcast::Receiver<Positioned>) -> impl Stream<Item = Positioned> + Send + 'static {
    super::received(Some(rx), |item| (item, false))
}

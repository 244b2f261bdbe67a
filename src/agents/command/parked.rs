//! Processes that wait for input: parked by task id, watched until the task's next message
//! claims them, and stopped when they time out, are canceled or are evicted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;

use super::process::{close_and_stop, Proc};
use super::timed_out;
use crate::agents::{BackendError, EventSink};
use crate::config::CommandConfig;
use crate::protocol::model::{Message, TaskState};

/// Processes whose tasks wait for input, by task id, at most `max_waiting` of them. Each is
/// owned by a watcher task; the entry here is the way to ask that watcher for it.
pub(super) struct Parked {
    max_waiting: usize,
    /// A plain mutex, held for no await: checking the count, making room and adding an
    /// entry must be one step, or two tasks parking at once could both take the last place.
    list: Mutex<Waitlist>,
}

#[derive(Default)]
pub(super) struct Waitlist {
    by_task: HashMap<String, Waiting>,
    /// Parking order: the smallest serial has waited longest.
    next_serial: u64,
}

pub(super) struct Waiting {
    /// Tells this parking from a later one of the same task, so that a watcher only ever
    /// removes its own entry; and orders parkings, oldest first.
    serial: u64,
    /// What the watcher is to do with the process.
    claim: oneshot::Sender<Claim>,
    /// Fired by the watcher once it has ended the task itself, for a follow-up waiting for
    /// a slot to stop waiting.
    ended: CancellationToken,
}

pub(super) enum Claim {
    /// Hand the process over on this channel.
    Resume(oneshot::Sender<Box<Proc>>),
    /// Too many wait: stop the process and fail its task.
    Evict,
    /// Stop the process; its task is taken care of (canceled).
    Stop,
}

impl Parked {
    pub(super) fn new(max_waiting: usize) -> Parked {
        Parked {
            max_waiting: max_waiting.max(1),
            list: Mutex::default(),
        }
    }

    fn list(&self) -> MutexGuard<'_, Waitlist> {
        // Nothing here panics while holding the lock; if something did, the map is still
        // whole, and refusing every later task would be worse.
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn park(
        self: &Arc<Self>,
        proc: Box<Proc>,
        events: EventSink,
        cancel: CancellationToken,
        cfg: &CommandConfig,
    ) {
        let task_id = events.task_id().to_string();
        let (claim, claims) = oneshot::channel();
        let ended = CancellationToken::new();
        let (serial, evicted) = {
            let mut list = self.list();
            let serial = list.next_serial;
            list.next_serial += 1;
            let mut evicted = Vec::new();
            while list.by_task.len() >= self.max_waiting {
                let oldest = list
                    .by_task
                    .iter()
                    .min_by_key(|(_, w)| w.serial)
                    .map(|(id, _)| id.clone());
                match oldest.and_then(|id| list.by_task.remove(&id)) {
                    Some(w) => evicted.push(w),
                    None => break,
                }
            }
            let waiting = Waiting {
                serial,
                claim,
                ended: ended.clone(),
            };
            // A task is parked at most once at a time (its process is claimed before its
            // next run), so nothing is replaced; were something, dropping it would still
            // have its watcher stop its process.
            list.by_task.insert(task_id.clone(), waiting);
            (serial, evicted)
        };
        for w in evicted {
            // A watcher that has just woken for another reason no longer listens, and
            // ends its process anyway.
            let _ = w.claim.send(Claim::Evict);
        }
        let watch = Watch {
            parked: Arc::downgrade(self),
            task_id,
            serial,
            events,
            cancel,
            ended,
            grace: Duration::from_millis(cfg.kill_grace_ms),
            timeout_secs: cfg.timeout_secs,
            max_waiting: self.max_waiting,
        };
        tokio::spawn(watch.run(proc, claims));
    }

    /// Fires once the watcher of the task's parked process has ended the task itself.
    pub(super) fn ended(&self, task_id: &str) -> Option<CancellationToken> {
        self.list().by_task.get(task_id).map(|w| w.ended.clone())
    }

    /// Removing the entry is what claims the process: only one caller can.
    pub(super) fn take(&self, task_id: &str) -> Option<Waiting> {
        self.list().by_task.remove(task_id)
    }

    /// The task's parked process, if it is still there to be had.
    pub(super) async fn resume(&self, task_id: &str) -> Option<Box<Proc>> {
        // The watcher either hands the process over or, having stopped it, drops the
        // request.
        let waiting = self.take(task_id)?;
        let (back, comes_back) = oneshot::channel();
        waiting.claim.send(Claim::Resume(back)).ok()?;
        comes_back.await.ok()
    }

    /// Has the task's parked process, if any, stopped.
    pub(super) fn discard(&self, task_id: &str) {
        if let Some(waiting) = self.take(task_id) {
            let _ = waiting.claim.send(Claim::Stop);
        }
    }

    /// Removes a watcher's own entry, not a later parking of the same task.
    fn forget(&self, task_id: &str, serial: u64) {
        let mut list = self.list();
        if list
            .by_task
            .get(task_id)
            .is_some_and(|w| w.serial == serial)
        {
            list.by_task.remove(task_id);
        }
    }
}

/// Looks after a parked process until its task's next message claims it, or stops it.
pub(super) struct Watch {
    /// Weak, so that the backend going away drops every entry and with it every claim
    /// channel, which tells the watchers to stop their processes.
    parked: Weak<Parked>,
    task_id: String,
    serial: u64,
    /// The parked run's sink, to fail the task if its time runs out while it waits.
    events: EventSink,
    /// The parked run's token: CancelTask on the waiting task fires it.
    cancel: CancellationToken,
    ended: CancellationToken,
    grace: Duration,
    timeout_secs: u64,
    max_waiting: usize,
}

pub(super) enum Wake {
    Resume(oneshot::Sender<Box<Proc>>),
    Evicted,
    Stop,
    Canceled,
    TimedOut,
    Exited,
    Abandoned,
}

impl Watch {
    async fn run(self, mut proc: Box<Proc>, mut claims: oneshot::Receiver<Claim>) {
        let deadline = proc.deadline;
        let wake = tokio::select! {
            c = &mut claims => match c {
                Ok(Claim::Resume(back)) => Wake::Resume(back),
                Ok(Claim::Evict) => Wake::Evicted,
                Ok(Claim::Stop) => Wake::Stop,
                Err(_) => Wake::Abandoned,
            },
            _ = self.cancel.cancelled() => Wake::Canceled,
            _ = sleep_until(deadline) => Wake::TimedOut,
            _ = proc.child.wait() => Wake::Exited,
        };
        // A claim that arrives from now on goes unanswered: a resumed run starts anew.
        drop(claims);
        if let Wake::Resume(back) = wake {
            // Even one that exited in the meantime: the run finds that out and starts anew.
            if let Err(mut proc) = back.send(proc) {
                // The run that asked is gone (its caller's work was dropped).
                close_and_stop(&mut proc, self.grace).await;
            }
            return;
        }
        if let Some(parked) = self.parked.upgrade() {
            parked.forget(&self.task_id, self.serial);
        }
        let mut events = self.events;
        // The task is failed before the process is stopped, which may take two grace
        // periods, so that its caller hears at once.
        let _ = match wake {
            Wake::TimedOut => {
                timed_out(
                    &mut events,
                    self.timeout_secs,
                    " (it was waiting for input)",
                )
                .await
            }
            Wake::Evicted => {
                let msg = format!(
                    "stopped waiting for input: too many tasks of this agent are waiting \
                     (max_waiting = {})",
                    self.max_waiting
                );
                events
                    .status(TaskState::Failed, Some(Message::agent_text(msg)))
                    .await
                    .map_err(BackendError::from)
            }
            _ => Ok(()),
        };
        // A process that exited by itself leaves its task to the next message, which
        // starts the program anew; every other ending is final for the task.
        if !matches!(wake, Wake::Exited) {
            self.ended.cancel();
        }
        close_and_stop(&mut proc, self.grace).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::SinkSetup;
    use crate::protocol::model::new_id;
    use crate::tasks::{MemoryTaskStore, Tasks, Viewer};

    fn config() -> CommandConfig {
        toml::from_str("command = [\"/bin/cat\"]\nio = \"jsonl\"\nkill_grace_ms = 100").unwrap()
    }

    /// A sink for a new task `task_id` of agent "a", created by caller "p".
    fn sink(tasks: &Arc<Tasks>, task_id: &str) -> EventSink {
        let message: Message = serde_json::from_value(serde_json::json!({
            "role": "ROLE_USER", "messageId": "m", "parts": [{"text": "hi"}],
            "taskId": task_id, "contextId": "c",
        }))
        .unwrap();
        let (caller, _) = tokio::sync::mpsc::channel(8);
        EventSink::new(SinkSetup {
            tasks: tasks.clone(),
            agent: "a".into(),
            owner: "p".into(),
            quota: None,
            task_id: task_id.into(),
            context_id: "c".into(),
            pending: Some(message),
            caller,
            relay: false,
            cancel: CancellationToken::new(),
        })
        .0
    }

    fn state(tasks: &Tasks, id: &str) -> Option<TaskState> {
        let viewer = Viewer {
            agent: "a",
            principal: "p",
        };
        tasks.inspect(viewer, id, |t| t.status.state)
    }

    #[tokio::test]
    async fn past_max_waiting_the_longest_waiting_is_evicted_and_a_resume_claims_once() {
        let metrics = Arc::new(crate::telemetry::Metrics::new(false));
        let tasks = Arc::new(Tasks::new(
            Arc::new(MemoryTaskStore::new(10, usize::MAX)),
            crate::tasks::Quota {
                tasks: 10,
                bytes: usize::MAX,
            },
            metrics,
        ));
        let parked = Arc::new(Parked::new(1));
        let cfg = config();
        // The store keys tasks by their UUIDs, as the gateway issues them.
        let (t1, t2) = (new_id(), new_id());
        for id in [t1.as_str(), t2.as_str()] {
            // As a run parks its process: the task asked for input first.
            let mut events = sink(&tasks, id);
            events
                .status(TaskState::InputRequired, Some(Message::agent_text("name?")))
                .await
                .unwrap();
            assert_eq!(state(&tasks, id), Some(TaskState::InputRequired));
            let proc = super::super::process::start(&cfg).unwrap();
            parked.park(proc, events, CancellationToken::new(), &cfg);
        }
        // t1 waited longest: its task fails, saying why.
        let mut evicted = false;
        for _ in 0..100 {
            if state(&tasks, &t1) == Some(TaskState::Failed) {
                evicted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(evicted, "t1: {:?}", state(&tasks, &t1));
        assert!(
            parked.resume(&t1).await.is_none(),
            "an evicted process is gone"
        );
        // t2's process is handed over once.
        let mut proc = parked.resume(&t2).await.expect("t2 is parked");
        assert!(parked.resume(&t2).await.is_none(), "claimed once");
        close_and_stop(&mut proc, Duration::from_millis(100)).await;
    }
}

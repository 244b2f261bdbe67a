//! The per-agent actor: a bounded mailbox, a concurrency limit, and per-context ordering.
//!
//! It is an actor in behaviour rather than a dedicated task: admission, ordering and the
//! concurrency gate are taken synchronously on the caller's worker thread and the work runs
//! there too, which saves a cross-thread hop on every request. What an actor guarantees
//! still holds: the mailbox is bounded (a full one refuses at once), at most
//! `max_concurrency` executions run, and work for one contextId runs one at a time in
//! arrival order (a ticket is taken at submission, before any scheduling can reorder).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{watch, Semaphore};

use crate::error::GatewayError;
use crate::tasks::FastMap;

#[derive(Debug, Clone, Copy)]
pub struct ActorLimits {
    /// Executions admitted but not yet running.
    pub mailbox: usize,
    /// Executions running at once.
    pub max_concurrency: usize,
}

/// One contextId's queue: tickets are handed out in arrival order and served in order.
struct Lane {
    next_ticket: u64,
    now_serving: watch::Sender<u64>,
}

pub struct AgentActor {
    name: String,
    limits: ActorLimits,
    queued: Arc<AtomicUsize>,
    running: Arc<Semaphore>,
    lanes: Arc<FastMap<String, Lane>>,
}

impl AgentActor {
    pub fn new(name: String, limits: ActorLimits) -> AgentActor {
        AgentActor {
            name,
            limits,
            queued: Arc::new(AtomicUsize::new(0)),
            running: Arc::new(Semaphore::new(limits.max_concurrency.max(1))),
            lanes: Arc::new(FastMap::default()),
        }
    }

    /// Executions waiting for their turn.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Admits `job` for `context_id`, or refuses at once with [`GatewayError::AgentBusy`].
    /// The job runs detached: a caller that goes away does not stop it.
    pub fn submit<F>(&self, context_id: &str, job: F) -> Result<(), GatewayError>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.limits.mailbox {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(GatewayError::AgentBusy(self.name.clone()));
        }
        let (ticket, mut turn) = {
            let mut lane = self
                .lanes
                .entry(context_id.to_string())
                .or_insert_with(|| Lane {
                    next_ticket: 0,
                    now_serving: watch::channel(0).0,
                });
            let ticket = lane.next_ticket;
            lane.next_ticket += 1;
            (ticket, lane.now_serving.subscribe())
        };
        let guard = LaneTurn {
            lanes: self.lanes.clone(),
            context_id: context_id.to_string(),
            ticket,
        };
        let queued = self.queued.clone();
        let running = self.running.clone();
        // Boxed so the spawned task holds a pointer, not a copy of a large future that the
        // runtime would move around at every stage.
        let job = Box::pin(job);
        tokio::spawn(async move {
            let _turn_guard = guard;
            // The sender lives as long as a ticket is outstanding, so this cannot fail;
            // if it somehow did, running out of order beats never running.
            let _ = turn.wait_for(|serving| *serving == ticket).await;
            let permit = running.acquire_owned().await;
            queued.fetch_sub(1, Ordering::AcqRel);
            job.await;
            drop(permit);
        });
        Ok(())
    }
}

/// Hands the lane to the next ticket when an execution ends, even by panic, and drops the
/// lane once nobody is waiting on it.
struct LaneTurn {
    lanes: Arc<FastMap<String, Lane>>,
    context_id: String,
    ticket: u64,
}

impl Drop for LaneTurn {
    fn drop(&mut self) {
        if let dashmap::Entry::Occupied(mut lane) = self.lanes.entry(self.context_id.clone()) {
            if lane.get().next_ticket == self.ticket + 1 {
                lane.remove();
            } else {
                lane.get_mut().now_serving.send_replace(self.ticket + 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    #[tokio::test]
    async fn same_context_runs_in_arrival_order_and_full_mailbox_refuses() {
        let actor = AgentActor::new(
            "a".into(),
            ActorLimits {
                mailbox: 3,
                max_concurrency: 4,
            },
        );
        let order = Arc::new(Mutex::new(Vec::new()));
        for i in 0..3u64 {
            let order = order.clone();
            actor
                .submit("ctx", async move {
                    // Earlier jobs sleep longer: only the lane keeps them in order.
                    tokio::time::sleep(Duration::from_millis(30 - i * 10)).await;
                    order.lock().unwrap().push(i);
                })
                .unwrap();
        }
        assert!(matches!(
            actor.submit("ctx", async {}),
            Err(GatewayError::AgentBusy(_))
        ));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        assert!(actor.lanes.is_empty(), "idle lanes are dropped");
    }
}

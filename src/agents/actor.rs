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

use tokio::sync::{watch, Semaphore, SemaphorePermit};

use crate::error::GatewayError;
use crate::tasks::FastMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ActorLimits {
    /// Executions admitted but not yet running.
    pub(crate) mailbox: usize,
    /// Executions running at once.
    pub(crate) max_concurrency: usize,
}

/// One contextId's queue: tickets are handed out in arrival order and served in order.
struct Lane {
    next_ticket: u64,
    now_serving: watch::Sender<u64>,
}

/// Cloned, it is the same actor (one mailbox, one concurrency gate, one set of lanes): a
/// reload that changes only an agent's card keeps its actor.
#[derive(Clone)]
pub(crate) struct AgentActor {
    name: String,
    limits: ActorLimits,
    queued: Arc<AtomicUsize>,
    running: Arc<Semaphore>,
    lanes: Arc<FastMap<String, Lane>>,
    /// Calls refused because the mailbox was full, ever.
    refused: Arc<std::sync::atomic::AtomicU64>,
}

impl AgentActor {
    pub(crate) fn new(name: String, limits: ActorLimits) -> AgentActor {
        AgentActor {
            name,
            limits,
            queued: Arc::new(AtomicUsize::new(0)),
            running: Arc::new(Semaphore::new(limits.max_concurrency.max(1))),
            lanes: Arc::new(FastMap::default()),
            refused: Default::default(),
        }
    }

    pub(crate) fn limits(&self) -> ActorLimits {
        self.limits
    }

    /// Executions waiting for their turn.
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Calls refused so far because the mailbox was full.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Takes a place in the mailbox (and in `context_id`'s lane, if any), or refuses at
    /// once with [`GatewayError::AgentBusy`]. The place is kept until the returned ticket is
    /// dropped or its [`Ticket::ready`] admission ends.
    pub(crate) fn enqueue(&self, context_id: Option<&str>) -> Result<Ticket, GatewayError> {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.limits.mailbox {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(GatewayError::AgentBusy(self.name.clone()));
        }
        let slot = QueueSlot(Some(self.queued.clone()));
        let lane = context_id.map(|ctx| {
            let (ticket, turn) = {
                let mut lane = self.lanes.entry(ctx.to_string()).or_insert_with(|| Lane {
                    next_ticket: 0,
                    now_serving: watch::channel(0).0,
                });
                let ticket = lane.next_ticket;
                lane.next_ticket += 1;
                (ticket, lane.now_serving.subscribe())
            };
            LaneTicket {
                turn,
                guard: LaneTurn {
                    lanes: self.lanes.clone(),
                    context_id: ctx.to_string(),
                    ticket,
                },
            }
        });
        Ok(Ticket {
            slot,
            lane,
            running: self.running.clone(),
        })
    }

    /// Permission to do a piece of work on the caller's thread right away, without taking
    /// a place in the mailbox: given only when that overtakes nobody (nothing queued or
    /// running for `context_id`) and a concurrency slot is free. Hold it while working.
    pub(crate) fn try_run_now(&self, context_id: Option<&str>) -> Option<SemaphorePermit<'_>> {
        if context_id.is_some_and(|c| self.lanes.contains_key(c)) {
            return None;
        }
        self.running.try_acquire().ok()
    }

    /// Admits `job` for `context_id` and runs it detached when its turn comes: a caller
    /// that goes away does not stop it.
    pub(crate) fn submit<F>(&self, context_id: &str, job: F) -> Result<(), GatewayError>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let ticket = self.enqueue(Some(context_id))?;
        // Boxed so the spawned task holds a pointer, not a copy of a large future that the
        // runtime would move around at every stage.
        // Carried: its spans are the request's children.
        let job = crate::telemetry::carried(job);
        tokio::spawn(async move {
            let _admission = ticket.ready().await;
            job.await;
        });
        Ok(())
    }
}

/// Counts a waiting execution until it starts (or gives up).
struct QueueSlot(Option<Arc<AtomicUsize>>);

impl Drop for QueueSlot {
    fn drop(&mut self) {
        if let Some(q) = self.0.take() {
            q.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

struct LaneTicket {
    turn: watch::Receiver<u64>,
    guard: LaneTurn,
}

/// A place in an agent's mailbox.
pub(crate) struct Ticket {
    slot: QueueSlot,
    lane: Option<LaneTicket>,
    running: Arc<Semaphore>,
}

/// Permission to run: holds a concurrency permit and the context's turn until dropped.
pub(crate) struct Admission {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    _lane: Option<LaneTurn>,
}

impl Ticket {
    /// Waits for the context's turn, then for a concurrency slot.
    pub(crate) async fn ready(mut self) -> Admission {
        // The lane stays in `self` while waiting, so that a caller giving up mid-wait goes
        // through `Drop for Ticket` and keeps the order.
        if let Some(lt) = self.lane.as_mut() {
            let ticket = lt.guard.ticket;
            // The sender lives as long as a ticket is outstanding, so this cannot fail; if
            // it somehow did, running out of order beats never running.
            let _ = lt.turn.wait_for(|serving| *serving == ticket).await;
        }
        let lane = self.lane.take().map(|lt| lt.guard);
        // The semaphore is never closed, so acquiring only fails in theory; then the
        // limit is skipped rather than the request.
        let permit = self.running.clone().acquire_owned().await.ok();
        drop(std::mem::replace(&mut self.slot, QueueSlot(None)));
        Admission {
            _permit: permit,
            _lane: lane,
        }
    }
}

impl Drop for Ticket {
    /// A ticket abandoned while waiting (its client went away) must still pass its turn
    /// on, but only when that turn comes, or later messages would overtake earlier ones.
    fn drop(&mut self) {
        if let Some(mut lt) = self.lane.take() {
            let ticket = lt.guard.ticket;
            if *lt.turn.borrow() == ticket {
                return; // dropping the guard hands the lane on now
            }
            tokio::spawn(async move {
                let _ = lt.turn.wait_for(|serving| *serving == ticket).await;
                drop(lt.guard);
            });
        }
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

    #[tokio::test]
    async fn an_abandoned_ticket_keeps_its_place_in_the_lane() {
        let actor = AgentActor::new(
            "a".into(),
            ActorLimits {
                mailbox: 10,
                max_concurrency: 10,
            },
        );
        let first = actor.enqueue(Some("c")).unwrap().ready().await;
        drop(actor.enqueue(Some("c")).unwrap());
        let third = actor.enqueue(Some("c")).unwrap();
        let waiting = tokio::spawn(async move {
            third.ready().await;
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished(), "the third waits for the first");
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("runs once the first is done")
            .unwrap();
        assert_eq!(actor.queued(), 0);
    }
}

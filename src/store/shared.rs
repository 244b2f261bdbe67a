//! What replicas share through a store besides its writes: reading each other's tasks and
//! records, their leases and the reaping of a dead one's tasks, task events and the
//! commands replicas send each other, allowances, stream caps, quotas and push holds.
//!
//! Two stores do it, [`super::redis`] and [`super::postgres_shared`], each with the same
//! methods; [`Shared`] picks one per call. An enum rather than a trait object: the set is
//! closed, and a request's futures stay unboxed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;

pub(crate) use super::health::Health;
use super::redis::{Envelope, Published};
use super::Table;

/// What a shared store's operations fail with: why, for the caller's error.
pub(crate) type SharedResult<T> = Result<T, String>;

pub(crate) enum Shared {
    Redis(Arc<super::redis::Shared>),
    Postgres(Arc<super::postgres_shared::Shared>),
}

/// Runs the same call on whichever store this is.
macro_rules! each {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            Shared::Redis($s) => $call,
            Shared::Postgres($s) => $call,
        }
    };
}

impl Shared {
    /// How long a replica that stops renewing its lease counts as alive.
    pub(crate) fn lease(&self) -> Duration {
        each!(self, s => s.lease)
    }

    pub(crate) fn health(&self) -> &Health {
        each!(self, s => &s.health)
    }

    pub(crate) async fn task(&self, id: &str) -> SharedResult<Option<Envelope>> {
        each!(self, s => s.task(id).await)
    }

    /// Every task of a caller with an agent.
    pub(crate) async fn tasks_of(&self, agent: &str, owner: &str) -> SharedResult<Vec<Envelope>> {
        each!(self, s => s.tasks_of(agent, owner).await)
    }

    pub(crate) async fn record(&self, table: Table, key: &str) -> SharedResult<Option<String>> {
        each!(self, s => s.record(table, key).await)
    }

    /// The records of every task relayed to the 0.3 upstream `agent` through any replica,
    /// as `(task id, record)`, oldest first.
    pub(crate) async fn ledger(&self, agent: &str) -> SharedResult<Vec<(String, String)>> {
        each!(self, s => s.ledger(agent).await)
    }

    /// Counts a stream `caller` opens here, if its streams over every replica are below
    /// `max`; false when they are not.
    pub(crate) async fn stream_opened(&self, caller: &str, max: usize) -> SharedResult<bool> {
        each!(self, s => s.stream_opened(caller, max).await)
    }

    /// A stream [`Self::stream_opened`] counted has closed.
    pub(crate) async fn stream_closed(&self, caller: &str) {
        each!(self, s => s.stream_closed(caller).await)
    }

    /// Replaces what this replica says its owners' unfinished tasks hold (owner, tasks,
    /// bytes; gone a lease after it stops saying so) and returns what the other replicas
    /// say, summed per owner.
    pub(crate) async fn exchange_unfinished(
        &self,
        held: Vec<(String, u64, u64)>,
    ) -> SharedResult<HashMap<String, (u64, u64)>> {
        each!(self, s => s.exchange_unfinished(held).await)
    }

    /// Takes `cost` from the allowance `bucket` (GCRA on the store's clock: one `interval_us`
    /// per unit, `burst` units at most). Returns allowed (1/0), the remaining burst, µs
    /// until a refused call may retry, µs until the allowance is full.
    pub(crate) async fn rate(
        &self,
        bucket: &str,
        interval_us: u64,
        burst: u32,
        cost: u32,
    ) -> SharedResult<(i64, i64, i64, i64)> {
        each!(self, s => s.rate(bucket, interval_us, burst, cost).await)
    }

    /// Whether the store answers now.
    pub(crate) async fn ping(&self) -> bool {
        each!(self, s => s.ping().await)
    }

    /// Renews this replica's lease every third of its length, until it is given up.
    pub(crate) async fn keep_lease(&self) {
        each!(self, s => s.clone().keep_lease().await)
    }

    /// Gives the lease up at a clean shutdown: the others fail what is left at once.
    pub(crate) async fn release_lease(&self) {
        each!(self, s => s.release_lease().await)
    }

    /// Every half lease: the unfinished tasks of replicas whose lease expired are marked
    /// failed with `note` (by one survivor), and their subscribers told.
    pub(crate) async fn reap_dead(&self, note: &'static str, retention_secs: u64) {
        let mut suspects = std::collections::HashSet::new();
        loop {
            tokio::time::sleep(self.lease() / 2).await;
            if let Err(e) = self.reap_once(note, retention_secs, &mut suspects).await {
                tracing::debug!(error = %e, "store: could not look for dead replicas");
            }
        }
    }

    /// One look for dead replicas: taken for dead when their lease is missing (expired) at
    /// two looks in a row (`suspects` holds those missing at the last), so that a lease that
    /// lapsed while the store itself was away has a renewal's time to come back.
    pub(crate) async fn reap_once(
        &self,
        note: &str,
        retention_secs: u64,
        suspects: &mut std::collections::HashSet<String>,
    ) -> SharedResult<()> {
        each!(self, s => s.reap_once(note, retention_secs, suspects).await)
    }

    /// A token the answer to a command comes back under (see [`Self::call`]).
    pub(crate) fn reply_token(&self) -> String {
        each!(self, s => s.reply_token())
    }

    /// Sends `command` (JSON) to `replica` and waits `within` for the answer that comes
    /// back under `reply`; Err says why none came.
    pub(crate) async fn call(
        &self,
        replica: &str,
        reply: &str,
        command: String,
        within: Duration,
    ) -> SharedResult<String> {
        each!(self, s => s.call(replica, reply, command, within).await)
    }

    /// The commands other replicas send this one, as they come; the stream ends when the
    /// store's connection drops (subscribe again).
    pub(crate) async fn commands(&self) -> SharedResult<BoxStream<'static, String>> {
        each!(self, s => s.commands().await)
    }

    /// Answers a command under its `reply` token.
    pub(crate) async fn answer(&self, reply: &str, json: String) {
        each!(self, s => s.answer(reply, json).await)
    }

    /// The events of `task_id` published from now on; the stream ends when the store's
    /// connection drops (a subscriber may have missed events then).
    pub(crate) async fn events(
        &self,
        task_id: &str,
    ) -> SharedResult<BoxStream<'static, Published>> {
        each!(self, s => s.events(task_id).await)
    }

    /// The events a streamed task's log holds, oldest first (none for a task nobody
    /// streamed).
    pub(crate) async fn logged(&self, task_id: &str) -> SharedResult<Vec<Published>> {
        each!(self, s => s.logged(task_id).await)
    }

    /// Takes the hold on following `task` for push (`about` says what a successor needs to
    /// know of it); the replica holding it already, if another does.
    pub(crate) async fn follow_claim(
        &self,
        task: &str,
        about: &str,
    ) -> SharedResult<Option<String>> {
        each!(self, s => s.follow_claim(task, about).await)
    }

    /// Whether this replica still holds `task`, noting `version` (when not 0) as notified.
    /// A hold handed over and not adopted yet is taken back: its replica was taken for
    /// dead while it only stalled, and its follower goes on.
    pub(crate) async fn follow_mark(&self, task: &str, version: u64) -> SharedResult<bool> {
        each!(self, s => s.follow_mark(task, version).await)
    }

    /// Gives the hold on `task` up (its task finished), if this replica has it.
    pub(crate) async fn follow_release(&self, task: &str) -> SharedResult<()> {
        each!(self, s => s.follow_release(task).await)
    }

    /// Hands `task` over to whichever replica adopts it next (this one included).
    pub(crate) async fn follow_abandon(&self, task: &str) -> SharedResult<()> {
        each!(self, s => s.follow_abandon(task).await)
    }

    /// Takes the hold on one task a dead replica followed: its id, what it is, and the last
    /// version notified (0: none known).
    pub(crate) async fn follow_adopt(&self) -> SharedResult<Option<(String, String, u64)>> {
        each!(self, s => s.follow_adopt().await)
    }

    /// The tasks this replica holds and has not handed over, as [`Self::follow_adopt`]
    /// gives one: what an adoption whose answer was lost left held here.
    pub(crate) async fn follow_held(&self) -> SharedResult<Vec<(String, String, u64)>> {
        each!(self, s => s.follow_held().await)
    }
}

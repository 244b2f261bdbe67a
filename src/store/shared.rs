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

    /// Whether this replica still holds `task`. A hold handed over and not adopted yet is
    /// taken back: its replica was taken for dead while it only stalled, and its follower
    /// goes on.
    pub(crate) async fn follow_check(&self, task: &str) -> SharedResult<bool> {
        each!(self, s => s.follow_check(task).await)
    }

    /// Notes `version` of `task` delivered, while this replica holds it: a successor
    /// resumes after it. A later version noted already stays (notes may finish out of
    /// order).
    pub(crate) async fn follow_note(&self, task: &str, version: u64) -> SharedResult<()> {
        each!(self, s => s.follow_note(task, version).await)
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

#[cfg(test)]
mod tests {
    //! Push holds as two replicas see them, on each shared store (the local Redis under a
    //! key prefix of the test's own, the local PostgreSQL in a schema of its own).

    use super::*;
    use crate::store::postgres::testing::{schema_name, url, Schema};

    fn redis_url() -> String {
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
    }

    /// Deletes the test's keys (and only them) when it ends.
    struct Prefix(String);

    impl Drop for Prefix {
        fn drop(&mut self) {
            let Ok(mut c) = redis::Client::open(redis_url()).and_then(|c| c.get_connection())
            else {
                return;
            };
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}*", self.0))
                .query(&mut c)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut c);
            }
        }
    }

    fn on_redis(prefix: &Prefix, replica: &str) -> Shared {
        let client = redis::Client::open(redis_url()).unwrap();
        let keys = super::super::redis::Keys::new(&prefix.0);
        let health = Arc::new(Health::new("Redis"));
        let lease = Duration::from_secs(2);
        Shared::Redis(Arc::new(super::super::redis::Shared::new(
            client,
            keys,
            replica.into(),
            health,
            lease,
        )))
    }

    fn on_postgres(schema: &Schema, replica: &str) -> Shared {
        let lease = Duration::from_secs(2);
        let shared =
            super::super::postgres_shared::Shared::new(&url(), &schema.0, replica.into(), lease, 2);
        Shared::Postgres(shared.unwrap())
    }

    /// A hold handed over (as the reaper hands over a replica's it takes for dead) and not
    /// adopted yet goes back to its replica when that one, stalled only, checks it before
    /// its next update; adopted first, it is the adopter's, and the stalled replica stands
    /// down. Versions noted delivered only grow, and only the holder's count.
    async fn a_hold_handed_over_is_taken_back_until_adopted(a: Shared, b: Shared) {
        let held = |seen| vec![("t".to_string(), "about".to_string(), seen)];
        assert_eq!(a.follow_claim("t", "about").await.unwrap(), None);
        assert_eq!(
            b.follow_claim("t", "about").await.unwrap().as_deref(),
            Some("a")
        );
        a.follow_note("t", 3).await.unwrap();
        a.follow_note("t", 2).await.unwrap();
        b.follow_note("t", 9).await.unwrap();
        assert_eq!(a.follow_held().await.unwrap(), held(3));

        a.follow_abandon("t").await.unwrap();
        assert!(a.follow_check("t").await.unwrap(), "taken back");
        assert_eq!(b.follow_adopt().await.unwrap(), None, "nothing to adopt");
        assert_eq!(a.follow_held().await.unwrap(), held(3));

        a.follow_abandon("t").await.unwrap();
        assert_eq!(b.follow_adopt().await.unwrap(), held(3).pop());
        assert!(!a.follow_check("t").await.unwrap(), "adopted: not a's");
        a.follow_note("t", 5).await.unwrap();
        a.follow_release("t").await.unwrap();
        assert!(b.follow_check("t").await.unwrap(), "still b's");
        assert_eq!(b.follow_held().await.unwrap(), held(3));
        assert_eq!(a.follow_held().await.unwrap(), []);
    }

    #[tokio::test]
    async fn push_holds_on_redis() {
        let prefix = Prefix(format!("a2a-test-{}:", uuid::Uuid::new_v4().simple()));
        let (a, b) = (on_redis(&prefix, "a"), on_redis(&prefix, "b"));
        a_hold_handed_over_is_taken_back_until_adopted(a, b).await;
    }

    #[tokio::test]
    async fn push_holds_on_postgres() {
        let schema = Schema(schema_name());
        let place = crate::store::postgres::Place {
            url: url(),
            schema: schema.0.clone(),
            shared: true,
        };
        // Made, and its migrations applied, as a replica's start does (on a thread of its
        // own: its client runs a runtime).
        std::thread::spawn(move || drop(crate::store::postgres::open(&place, 0, None).unwrap()))
            .join()
            .unwrap();
        let (a, b) = (on_postgres(&schema, "a"), on_postgres(&schema, "b"));
        a_hold_handed_over_is_taken_back_until_adopted(a, b).await;
    }
}

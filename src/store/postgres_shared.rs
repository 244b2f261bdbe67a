//! Replicas sharing one PostgreSQL schema (`store.shared = true`): what they do through
//! Redis otherwise (see [`super::shared`]), in tables beside the tasks, and events and
//! commands on one notification channel named after the schema.
//!
//! - `tasks`: each with the replica that runs it; the writer thread writes them (see
//!   [`super::postgres`]), `replica` set, in the same transaction as the notifications of
//!   their events, which PostgreSQL sends at commit.
//! - `leases`: a replica's lease, renewed every third of its length on the server's clock;
//!   a replica whose lease stays expired has its unfinished tasks failed by a survivor (one
//!   transaction under an advisory lock).
//! - `streams`, `rates`, `unfinished`, `push_holds`: stream caps, allowances (GCRA), the
//!   per-caller quota's counts and push following, as their Redis keys.
//! - Notifications (`pg_notify(<schema>, …)`): `e <task> <event>` (a task's event),
//!   `c <replica> <command>`, `r <token> <answer>`; a body past NOTIFY's 8,000 bytes goes to
//!   `notes` and the payload names it (`#<id>`).
//!
//! Connections: a few clients (sized from the workers) for calls, one listening for
//! notifications, all run on a thread of their own, so that no worker's runtime holds one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{BoxStream, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Client;

use super::health::Health;
use super::postgres::{inline, noted};
use super::redis::{Envelope, Published, PublishedEvent};
use super::Table;
use crate::protocol::model::{Task, TaskEvent};

/// Why a call failed, for the caller's error (as `redis::RedisResult`).
pub(crate) type SharedResult<T> = Result<T, String>;

/// How long one call may take before the store counts as not answering.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// The server's clock, in ms.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Where to connect, and how.
struct Connector {
    config: tokio_postgres::Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    schema: String,
    /// The thread the connections run on.
    runtime: tokio::runtime::Handle,
}

impl Connector {
    /// A new connection with the schema on its search path; the payloads of the
    /// notifications it receives go to `heard` (the listener's).
    async fn connect(&self, heard: Option<mpsc::UnboundedSender<String>>) -> SharedResult<Client> {
        let (config, tls) = (self.config.clone(), self.tls.clone());
        let connecting = self.runtime.spawn(async move {
            let client = match tls {
                Some(tls) => {
                    let (client, connection) = config.connect(tls).await?;
                    tokio::spawn(drive(connection, heard));
                    client
                }
                None => {
                    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
                    tokio::spawn(drive(connection, heard));
                    client
                }
            };
            Ok::<_, tokio_postgres::Error>(client)
        });
        let client = tokio::time::timeout(IO_TIMEOUT, connecting)
            .await
            .map_err(|_| "connecting to PostgreSQL timed out".to_string())?
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let schema = super::postgres::quoted(&self.schema);
        (client
            .batch_execute(&format!("SET search_path TO {schema}"))
            .await)
            .map_err(|e| e.to_string())?;
        Ok(client)
    }
}

/// Runs a connection until it ends, passing the notifications it receives on.
async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    heard: Option<mpsc::UnboundedSender<String>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(Ok(message)) = messages.next().await {
        if let (Some(heard), tokio_postgres::AsyncMessage::Notification(n)) = (&heard, message) {
            let _ = heard.send(n.payload().to_string());
        }
    }
}

/// Who waits for which notification, filled by the listener.
#[derive(Default)]
struct Hub {
    /// Whether the listener is connected: subscribing while it is not fails, as nothing
    /// would arrive.
    listening: AtomicBool,
    events: Mutex<HashMap<String, Vec<mpsc::UnboundedSender<Published>>>>,
    commands: Mutex<Option<mpsc::UnboundedSender<String>>>,
    replies: Mutex<HashMap<String, oneshot::Sender<String>>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Hub {
    /// The listener went away: every subscriber's stream ends (it may miss events now).
    fn lost(&self) {
        self.listening.store(false, Ordering::Release);
        locked(&self.events).clear();
        locked(&self.commands).take();
        locked(&self.replies).clear();
    }

    /// Whether anyone here waits for a notification of `kind` about `head`: every
    /// replica hears every task's events, and reads (or fetches) only those it wants.
    fn wants(&self, kind: &str, head: &str, replica: &str) -> bool {
        match kind {
            "e" => locked(&self.events).contains_key(head),
            "c" => head == replica,
            "r" => locked(&self.replies).contains_key(head),
            _ => false,
        }
    }

    fn deliver(&self, kind: &str, head: &str, body: String, replica: &str) {
        match kind {
            "e" => {
                let Ok(published) = serde_json::from_str::<Published>(&body) else {
                    return;
                };
                let mut events = locked(&self.events);
                let Some(subscribers) = events.get_mut(head) else {
                    return;
                };
                subscribers.retain(|tx| !tx.is_closed());
                for tx in subscribers.iter() {
                    let _ = tx.send(published.clone());
                }
                if subscribers.is_empty() {
                    events.remove(head);
                }
            }
            "c" if head == replica => {
                if let Some(tx) = &*locked(&self.commands) {
                    let _ = tx.send(body);
                }
            }
            "r" => {
                if let Some(tx) = locked(&self.replies).remove(head) {
                    let _ = tx.send(body);
                }
            }
            _ => {}
        }
    }
}

/// Reads and the rest of what replicas do through PostgreSQL, from async code.
pub(crate) struct Shared {
    pub(crate) replica: Arc<str>,
    pub(crate) health: Arc<Health>,
    pub(crate) lease: Duration,
    /// Set when the lease is given up: it is not renewed again.
    released: AtomicBool,
    connector: Connector,
    clients: Vec<tokio::sync::Mutex<Option<Client>>>,
    next: AtomicUsize,
    hub: Arc<Hub>,
    /// The notification channel: the schema's name.
    channel: String,
}

/// A pooled connection, taken for one call (or one transaction).
type Slot<'a> = tokio::sync::MutexGuard<'a, Option<Client>>;

impl Shared {
    /// Prepares the connections to `url` (made when first used); `pool` clients for calls.
    pub(crate) fn new(
        url: &str,
        schema: &str,
        replica: Arc<str>,
        lease: Duration,
        pool: usize,
    ) -> Result<Arc<Shared>, String> {
        let (url, tls) = super::postgres_tls::prepare(url)?;
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e| format!("store.url: {e}"))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(IO_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name(format!("a2a-gateway/{schema}/{replica}"));
        }
        // A server that vanished without closing the socket is noticed.
        config.keepalives_idle(Duration::from_secs(5));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("store: cannot start PostgreSQL's runtime: {e}"))?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("store-postgres".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .map_err(|e| format!("store: cannot start PostgreSQL's thread: {e}"))?;
        let shared = Arc::new(Shared {
            replica,
            health: Arc::new(Health::new("PostgreSQL")),
            lease,
            released: AtomicBool::new(false),
            connector: Connector {
                config,
                tls,
                schema: schema.to_string(),
                runtime: handle.clone(),
            },
            clients: (0..pool.max(2)).map(|_| Default::default()).collect(),
            next: AtomicUsize::new(0),
            hub: Arc::default(),
            channel: schema.to_string(),
        });
        handle.spawn(Shared::listen(Arc::downgrade(&shared)));
        Ok(shared)
    }

    /// A client of the pool, connected.
    async fn slot(&self) -> SharedResult<Slot<'_>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len();
        let mut slot = self.clients[i].lock().await;
        if slot.as_ref().is_none_or(|c| c.is_closed()) {
            let made = self.connector.connect(None).await;
            self.health.saw(&made);
            *slot = Some(made?);
        }
        Ok(slot)
    }

    /// Waits for `call` on a connection (at most [`IO_TIMEOUT`]), noting whether the server
    /// answered (an error it answered with says nothing of its health).
    async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> SharedResult<T> {
        let (done, answered) = match tokio::time::timeout(IO_TIMEOUT, call).await {
            Ok(Ok(v)) => (Ok(v), true),
            Ok(Err(e)) => match e.as_db_error() {
                Some(db) => (Err(db.message().to_string()), true),
                None => (Err(e.to_string()), false),
            },
            Err(_) => (
                Err("PostgreSQL did not answer within 5 s".to_string()),
                false,
            ),
        };
        match (&done, answered) {
            (Err(e), false) => self.health.saw::<(), _>(&Err(e)),
            _ => self.health.saw::<(), String>(&Ok(())),
        }
        done
    }

    /// Rows of one statement.
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> SharedResult<Vec<tokio_postgres::Row>> {
        let slot = self.slot().await?;
        let client = slot.as_ref().ok_or("no connection")?;
        self.timed(client.query(sql, params)).await
    }

    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> SharedResult<u64> {
        let slot = self.slot().await?;
        let client = slot.as_ref().ok_or("no connection")?;
        self.timed(client.execute(sql, params)).await
    }

    /// Sends a notification of `kind` about `head` (a body too long goes in a note).
    async fn notify(&self, kind: char, head: &str, body: &str) -> SharedResult<()> {
        let slot = self.slot().await?;
        let client = slot.as_ref().ok_or("no connection")?;
        self.timed(notify_on(client, &self.channel, kind, head, body))
            .await
    }

    /// Listens on the schema's channel while the store is open, again after each drop.
    async fn listen(this: std::sync::Weak<Self>) {
        loop {
            let Some(me) = this.upgrade() else {
                return;
            };
            let (tx, mut heard) = mpsc::unbounded_channel();
            let listening = match me.connector.connect(Some(tx)).await {
                Ok(client) => {
                    let channel = super::postgres::quoted(&me.channel);
                    match client.batch_execute(&format!("LISTEN {channel}")).await {
                        Ok(()) => Some(client),
                        Err(_) => None,
                    }
                }
                Err(_) => None,
            };
            let Some(_client) = listening else {
                drop(me);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            };
            me.hub.listening.store(true, Ordering::Release);
            drop(me);
            while let Some(payload) = heard.recv().await {
                let Some(me) = this.upgrade() else {
                    return;
                };
                me.heard(payload).await;
            }
            if let Some(me) = this.upgrade() {
                me.hub.lost();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// One notification: its body read from its note if it has one, then delivered. In
    /// order: the next waits for this one.
    async fn heard(&self, payload: String) {
        let mut parts = payload.splitn(3, ' ');
        let (Some(kind), Some(head), Some(body)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        if !self.hub.wants(kind, head, &self.replica) {
            return;
        }
        let body = match body.strip_prefix('#').map(str::parse::<i64>) {
            Some(Ok(note)) => match self
                .query("SELECT body FROM notes WHERE id = $1", &[&note])
                .await
            {
                Ok(rows) => match rows.first() {
                    Some(row) => row.get::<_, String>(0),
                    None => return,
                },
                Err(_) => return,
            },
            _ => body.to_string(),
        };
        self.hub.deliver(kind, head, body, &self.replica);
    }

    /// Err while the listener is not connected: nothing would arrive. Checked again after
    /// a subscriber is registered, so that one registered as the listener went away (its
    /// subscribers cleared just before) is not left waiting.
    fn listening(&self) -> SharedResult<()> {
        match self.hub.listening.load(Ordering::Acquire) {
            true => Ok(()),
            false => Err("not listening to PostgreSQL's notifications (reconnecting)".into()),
        }
    }
}

fn envelope(row: &tokio_postgres::Row) -> Option<Envelope> {
    Some(Envelope {
        agent: row.get(0),
        owner: row.get(1),
        seq: row.get::<_, i64>(2).max(0) as u64,
        replica: row.get(3),
        version: row.get::<_, i64>(4).max(0) as u64,
        task: serde_json::from_str::<Task>(row.get(5)).ok()?,
    })
}

const ENVELOPE: &str = "SELECT agent, owner, seq, replica, version, body FROM tasks";

/// Reads (see [`super::shared::Shared`] for what each does).
impl Shared {
    pub(crate) async fn task(&self, id: &str) -> SharedResult<Option<Envelope>> {
        let rows = self
            .query(&format!("{ENVELOPE} WHERE id = $1"), &[&id])
            .await?;
        Ok(rows.first().and_then(envelope))
    }

    pub(crate) async fn tasks_of(&self, agent: &str, owner: &str) -> SharedResult<Vec<Envelope>> {
        let rows = self
            .query(
                &format!("{ENVELOPE} WHERE agent = $1 AND owner = $2"),
                &[&agent, &owner],
            )
            .await?;
        Ok(rows.iter().filter_map(envelope).collect())
    }

    pub(crate) async fn record(&self, table: Table, key: &str) -> SharedResult<Option<String>> {
        let rows = self
            .query(
                "SELECT value FROM records WHERE tbl = $1 AND key = $2",
                &[&table.name(), &key],
            )
            .await?;
        Ok(rows.first().map(|r| r.get(0)))
    }

    pub(crate) async fn ledger(&self, agent: &str) -> SharedResult<Vec<(String, String)>> {
        let prefix = super::ledger_key(agent, "");
        let rows = self
            .query(
                "SELECT key, value FROM records WHERE tbl = $1 AND starts_with(key, $2) ORDER BY written_ms",
                &[&Table::Ledger.name(), &prefix],
            )
            .await?;
        Ok((rows.iter())
            .filter_map(|r| {
                let key: &str = r.get(0);
                let (_, id) = super::ledger_key_parts(key)?;
                Some((id.to_string(), r.get(1)))
            })
            .collect())
    }

    pub(crate) async fn logged(&self, task_id: &str) -> SharedResult<Vec<Published>> {
        let rows = self
            .query(
                "SELECT version, body FROM events WHERE task_id = $1 ORDER BY version",
                &[&task_id],
            )
            .await?;
        Ok((rows.iter())
            .filter_map(|r| {
                Some(Published {
                    version: r.get::<_, i64>(0).max(0) as u64,
                    event: serde_json::from_str(r.get(1)).ok()?,
                })
            })
            .collect())
    }

    pub(crate) async fn ping(&self) -> bool {
        self.query("SELECT 1", &[]).await.is_ok()
    }
}

/// Stream caps, quotas and allowances.
impl Shared {
    pub(crate) async fn stream_opened(&self, caller: &str, max: usize) -> SharedResult<bool> {
        let mut slot = self.slot().await?;
        let client = slot.as_mut().ok_or("no connection")?;
        let lock = format!("{}:streams:{caller}", self.channel);
        let replica: &str = &self.replica;
        let max = max as i64;
        let opened = async {
            let tx = client.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&lock])
                .await?;
            let open: i64 = tx
                .query_one(
                    "SELECT coalesce(sum(open), 0)::bigint FROM streams WHERE caller = $1",
                    &[&caller],
                )
                .await?
                .get(0);
            if open >= max {
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO streams (caller, replica, open) VALUES ($1, $2, 1)
                 ON CONFLICT (caller, replica) DO UPDATE SET open = streams.open + 1",
                &[&caller, &replica],
            )
            .await?;
            tx.commit().await?;
            Ok(true)
        };
        self.timed(opened).await
    }

    pub(crate) async fn stream_closed(&self, caller: &str) {
        let replica: &str = &self.replica;
        let _ = self
            .execute(
                "WITH left_open AS (
                   UPDATE streams SET open = open - 1 WHERE caller = $1 AND replica = $2 RETURNING open)
                 DELETE FROM streams WHERE caller = $1 AND replica = $2
                   AND (SELECT open FROM left_open) <= 0",
                &[&caller, &replica],
            )
            .await;
    }

    pub(crate) async fn exchange_unfinished(
        &self,
        held: Vec<(String, u64, u64)>,
    ) -> SharedResult<HashMap<String, (u64, u64)>> {
        let mut slot = self.slot().await?;
        let client = slot.as_mut().ok_or("no connection")?;
        let replica: &str = &self.replica;
        let lease = self.lease.as_millis() as i64;
        let mut cols: (Vec<&str>, Vec<i64>, Vec<i64>) = Default::default();
        for (owner, tasks, bytes) in &held {
            cols.0.push(owner);
            cols.1.push(*tasks as i64);
            cols.2.push(*bytes as i64);
        }
        let exchanged = async {
            let tx = client.transaction().await?;
            tx.execute("DELETE FROM unfinished WHERE replica = $1", &[&replica])
                .await?;
            if !cols.0.is_empty() {
                tx.execute(
                    &format!(
                        "INSERT INTO unfinished (replica, owner, tasks, bytes, expires_ms)
                         SELECT $1::text, t.*, {NOW_MS} + $5::bigint FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS t"
                    ),
                    &[&replica, &cols.0, &cols.1, &cols.2, &lease],
                )
                .await?;
            }
            let rows = tx
                .query(
                    &format!(
                        "SELECT owner, sum(tasks)::bigint, sum(bytes)::bigint FROM unfinished
                         WHERE replica <> $1 AND expires_ms > {NOW_MS} GROUP BY owner"
                    ),
                    &[&replica],
                )
                .await?;
            tx.commit().await?;
            Ok(rows)
        };
        let rows = self.timed(exchanged).await?;
        Ok((rows.iter())
            .map(|r| {
                let n = |i| r.get::<_, i64>(i).max(0) as u64;
                (r.get(0), (n(1), n(2)))
            })
            .collect())
    }

    /// GCRA as in Redis (see `redis::GCRA`), the bucket's theoretical arrival time a row.
    pub(crate) async fn rate(
        &self,
        bucket: &str,
        interval_us: u64,
        burst: u32,
        cost: u32,
    ) -> SharedResult<(i64, i64, i64, i64)> {
        let (interval, burst, cost) = (interval_us as i64, i64::from(burst), i64::from(cost));
        if cost > burst {
            return Ok((0, 0, interval * (cost - burst), 0));
        }
        let taken = self
            .query(
                "INSERT INTO rates AS r (bucket, tat, seen)
                 SELECT $1, n + $2::bigint * $3::bigint, n
                   FROM (SELECT (extract(epoch from clock_timestamp()) * 1000000)::bigint AS n) AS now
                 ON CONFLICT (bucket) DO UPDATE
                   SET tat = GREATEST(r.tat, excluded.seen) + $2::bigint * $3::bigint, seen = excluded.seen
                   WHERE GREATEST(r.tat, excluded.seen) + $2::bigint * ($3::bigint - $4::bigint) <= excluded.seen
                 RETURNING tat, seen",
                &[&bucket, &interval, &cost, &burst],
            )
            .await?;
        if let Some(row) = taken.first() {
            let (tat, now): (i64, i64) = (row.get(0), row.get(1));
            return Ok((1, (now + interval * burst - tat) / interval, 0, tat - now));
        }
        let rows = self
            .query(
                "SELECT tat, (extract(epoch from clock_timestamp()) * 1000000)::bigint FROM rates WHERE bucket = $1",
                &[&bucket],
            )
            .await?;
        let (tat, now): (i64, i64) = rows.first().map_or((0, 0), |r| (r.get(0), r.get(1)));
        let tat = tat.max(now);
        Ok((
            0,
            0,
            tat + interval * cost - interval * burst - now,
            tat - now,
        ))
    }
}

/// Leases, and failing a dead replica's tasks.
impl Shared {
    pub(crate) async fn keep_lease(self: Arc<Self>) {
        let millis = self.lease.as_millis() as i64;
        let renew = format!(
            "INSERT INTO leases (replica, expires_ms) VALUES ($1, {NOW_MS} + $2::bigint)
             ON CONFLICT (replica) DO UPDATE SET expires_ms = excluded.expires_ms"
        );
        while !self.released.load(Ordering::Acquire) {
            let replica: &str = &self.replica;
            let _ = self.execute(&renew, &[&replica, &millis]).await;
            tokio::time::sleep(self.lease / 3).await;
        }
    }

    pub(crate) async fn release_lease(&self) {
        self.released.store(true, Ordering::Release);
        let replica: &str = &self.replica;
        let _ = self
            .execute(
                "UPDATE leases SET expires_ms = 0 WHERE replica = $1",
                &[&replica],
            )
            .await;
    }

    /// One look for dead replicas: those whose lease expired (or who run unfinished tasks
    /// with no lease at all) at two looks in a row, as with Redis.
    pub(crate) async fn reap_once(
        &self,
        note: &str,
        _retention_secs: u64, // finished tasks leave by the writer's housekeeping
        suspects: &mut std::collections::HashSet<String>,
    ) -> SharedResult<()> {
        let replica: &str = &self.replica;
        let rows = self
            .query(
                &format!(
                    "SELECT replica FROM leases WHERE expires_ms < {NOW_MS} AND replica <> $1
                     UNION
                     SELECT DISTINCT replica FROM tasks WHERE NOT finished AND replica <> $1
                       AND replica NOT IN (SELECT replica FROM leases)"
                ),
                &[&replica],
            )
            .await?;
        let dead: std::collections::HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
        suspects.retain(|s| dead.contains(s));
        for replica in dead {
            if suspects.insert(replica.clone()) {
                continue;
            }
            let failed = self.reap(&replica, note).await?;
            suspects.remove(&replica);
            if failed > 0 {
                tracing::warn!(replica = %replica, tasks = failed, "store: a replica's lease expired; its unfinished tasks are marked failed");
            }
        }
        Ok(())
    }

    /// Fails a dead replica's unfinished tasks, forgets its streams and counts, and hands
    /// its push following over, in one transaction; how many tasks it failed.
    async fn reap(&self, dead: &str, note: &str) -> SharedResult<usize> {
        let mut slot = self.slot().await?;
        let client = slot.as_mut().ok_or("no connection")?;
        let lock = format!("{}:reap:{dead}", self.channel);
        let channel = &self.channel;
        let reaped = async {
            let tx = client.transaction().await?;
            let locked: bool = tx
                .query_one("SELECT pg_try_advisory_xact_lock(hashtext($1))", &[&lock])
                .await?
                .get(0);
            if !locked {
                return Ok(0);
            }
            // Renewed meanwhile: alive after all.
            let alive = tx
                .query_opt(
                    &format!("SELECT 1 FROM leases WHERE replica = $1 AND expires_ms >= {NOW_MS}"),
                    &[&dead],
                )
                .await?;
            if alive.is_some() {
                return Ok(0);
            }
            let running = tx
                .query(
                    &format!("{ENVELOPE} WHERE replica = $1 AND NOT finished FOR UPDATE"),
                    &[&dead],
                )
                .await?;
            let mut failed = 0;
            for row in &running {
                let Some(mut envelope) = envelope(row) else {
                    continue;
                };
                let id = envelope.task.id.clone();
                let event = failure(&mut envelope.task, note);
                // Past whatever the dead replica sent its clients without writing it.
                envelope.version += super::UNWRITTEN_EVENTS;
                let version = envelope.version as i64;
                let body = serde_json::to_string(&envelope.task).unwrap_or_default();
                let logged = serde_json::to_string(&PublishedEvent::Status(event.clone()))
                    .unwrap_or_default();
                tx.execute(
                    &format!(
                        "UPDATE tasks SET body = $2, version = $3, state = 'failed', finished = true,
                         written_ms = {NOW_MS} WHERE id = $1"
                    ),
                    &[&id, &body, &version],
                )
                .await?;
                // Into the task's log only if it has one (it was streamed).
                tx.execute(
                    "INSERT INTO events (task_id, version, body)
                     SELECT $1::text, $2::bigint, $3::text WHERE EXISTS (SELECT 1 FROM events WHERE task_id = $1)",
                    &[&id, &version, &logged],
                )
                .await?;
                let published = Published {
                    version: envelope.version,
                    event: PublishedEvent::Status(event),
                };
                let json = serde_json::to_string(&published).unwrap_or_default();
                notify_on(&tx, channel, 'e', &id, &json).await?;
                failed += 1;
            }
            tx.execute("DELETE FROM streams WHERE replica = $1", &[&dead])
                .await?;
            tx.execute("DELETE FROM unfinished WHERE replica = $1", &[&dead])
                .await?;
            tx.execute(
                "UPDATE push_holds SET orphan = true WHERE holder = $1",
                &[&dead],
            )
            .await?;
            tx.execute("DELETE FROM leases WHERE replica = $1", &[&dead])
                .await?;
            tx.commit().await?;
            Ok(failed)
        };
        self.timed(reaped).await
    }
}

/// Sends a notification on `channel` through `c` (a connection, or a transaction: then at
/// its commit); a body too long for NOTIFY goes in a note the payload names.
async fn notify_on(
    c: &impl tokio_postgres::GenericClient,
    channel: &str,
    kind: char,
    head: &str,
    body: &str,
) -> Result<(), tokio_postgres::Error> {
    let payload = match inline(kind, head, body) {
        Some(p) => p,
        None => {
            let note =
                format!("INSERT INTO notes (body, written_ms) VALUES ($1, {NOW_MS}) RETURNING id");
            noted(kind, head, c.query_one(&note, &[&body]).await?.get(0))
        }
    };
    c.execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
        .await
        .map(drop)
}

/// Marks `task` failed with `note`; the event that did it.
fn failure(task: &mut Task, note: &str) -> crate::protocol::model::TaskStatusUpdateEvent {
    use crate::protocol::model::{Message, TaskState, TaskStatus, TaskStatusUpdateEvent};
    let message = Message::agent_text(note.to_string()).placed(Some(&task.id), &task.context_id);
    let event = TaskStatusUpdateEvent {
        task_id: task.id.clone(),
        context_id: task.context_id.clone(),
        status: TaskStatus::now(TaskState::Failed, Some(message)),
        metadata: None,
    };
    task.apply(&TaskEvent::Status(event.clone()));
    event
}

/// Commands between replicas, and task events.
impl Shared {
    pub(crate) fn reply_token(&self) -> String {
        crate::protocol::model::new_id()
    }

    pub(crate) async fn call(
        &self,
        replica: &str,
        reply: &str,
        command: String,
        within: Duration,
    ) -> SharedResult<String> {
        self.listening()?;
        let alive = self
            .query(
                &format!("SELECT 1 FROM leases WHERE replica = $1 AND expires_ms >= {NOW_MS}"),
                &[&replica],
            )
            .await?;
        if alive.is_empty() {
            return Err(format!(
                "the replica running this task ({replica}) does not answer; its unfinished tasks are failed once its lease expires"
            ));
        }
        let (tx, rx) = oneshot::channel();
        locked(&self.hub.replies).insert(reply.to_string(), tx);
        let answered = async {
            self.notify('c', replica, &command).await?;
            match tokio::time::timeout(within, rx).await {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(_)) => {
                    Err("the store's connection dropped while waiting for an answer".into())
                }
                Err(_) => Err(format!(
                    "the replica running this task ({replica}) did not answer within {} s",
                    within.as_secs()
                )),
            }
        }
        .await;
        locked(&self.hub.replies).remove(reply);
        answered
    }

    pub(crate) async fn commands(&self) -> SharedResult<BoxStream<'static, String>> {
        self.listening()?;
        let (tx, rx) = mpsc::unbounded_channel();
        *locked(&self.hub.commands) = Some(tx);
        self.listening()?;
        Ok(received(rx))
    }

    pub(crate) async fn answer(&self, reply: &str, json: String) {
        let _ = self.notify('r', reply, &json).await;
    }

    pub(crate) async fn events(
        &self,
        task_id: &str,
    ) -> SharedResult<BoxStream<'static, Published>> {
        self.listening()?;
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut events = locked(&self.hub.events);
            // Subscribers of tasks that took no event since they left: now and then.
            if events.len() % 256 == 255 {
                events.retain(|_, subscribers| {
                    subscribers.retain(|tx| !tx.is_closed());
                    !subscribers.is_empty()
                });
            }
            events.entry(task_id.to_string()).or_default().push(tx);
        }
        self.listening()?;
        Ok(received(rx))
    }
}

/// What arrives on `rx`, as a stream that ends when its sender is dropped.
fn received<T: Send + 'static>(rx: mpsc::UnboundedReceiver<T>) -> BoxStream<'static, T> {
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

/// Push holds (see the Redis store's, which these follow).
impl Shared {
    pub(crate) async fn follow_claim(
        &self,
        task: &str,
        about: &str,
    ) -> SharedResult<Option<String>> {
        let replica: &str = &self.replica;
        let rows = self
            .query(
                "WITH taken AS (
                   INSERT INTO push_holds (task, holder, about) VALUES ($1, $2, $3)
                   ON CONFLICT (task) DO UPDATE SET about = excluded.about
                     WHERE push_holds.holder = excluded.holder
                   RETURNING holder)
                 SELECT holder FROM taken
                 UNION ALL SELECT holder FROM push_holds WHERE task = $1 AND NOT EXISTS (SELECT 1 FROM taken)",
                &[&task, &replica, &about],
            )
            .await?;
        let mut holder: Option<String> = rows.first().map(|r| r.get(0));
        if holder.is_none() {
            // Taken by another in the moment this statement's snapshot missed it.
            let rows =
                (self.query("SELECT holder FROM push_holds WHERE task = $1", &[&task])).await?;
            holder = rows.first().map(|r| r.get(0));
        }
        Ok(holder.filter(|h| *h != *self.replica))
    }

    pub(crate) async fn follow_check(&self, task: &str) -> SharedResult<bool> {
        let replica: &str = &self.replica;
        let held = self
            .execute(
                "UPDATE push_holds SET orphan = false WHERE task = $1 AND holder = $2",
                &[&task, &replica],
            )
            .await?;
        Ok(held == 1)
    }

    pub(crate) async fn follow_note(&self, task: &str, version: u64) -> SharedResult<()> {
        let replica: &str = &self.replica;
        let version = version as i64;
        self.execute(
            "UPDATE push_holds SET seen = GREATEST(seen, $3::bigint) WHERE task = $1 AND holder = $2",
            &[&task, &replica, &version],
        )
        .await
        .map(drop)
    }

    pub(crate) async fn follow_release(&self, task: &str) -> SharedResult<()> {
        let replica: &str = &self.replica;
        self.execute(
            "DELETE FROM push_holds WHERE task = $1 AND holder = $2",
            &[&task, &replica],
        )
        .await
        .map(drop)
    }

    pub(crate) async fn follow_abandon(&self, task: &str) -> SharedResult<()> {
        let replica: &str = &self.replica;
        self.execute(
            "UPDATE push_holds SET orphan = true WHERE task = $1 AND holder = $2",
            &[&task, &replica],
        )
        .await
        .map(drop)
    }

    pub(crate) async fn follow_adopt(&self) -> SharedResult<Option<(String, String, u64)>> {
        let replica: &str = &self.replica;
        let rows = self
            .query(
                "UPDATE push_holds SET holder = $1, orphan = false
                 WHERE task = (SELECT task FROM push_holds WHERE orphan LIMIT 1 FOR UPDATE SKIP LOCKED)
                 RETURNING task, about, seen",
                &[&replica],
            )
            .await?;
        Ok(rows
            .first()
            .map(|r| (r.get(0), r.get(1), r.get::<_, i64>(2).max(0) as u64)))
    }

    pub(crate) async fn follow_held(&self) -> SharedResult<Vec<(String, String, u64)>> {
        let replica: &str = &self.replica;
        let rows = self
            .query(
                "SELECT task, about, seen FROM push_holds WHERE holder = $1 AND NOT orphan",
                &[&replica],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get::<_, i64>(2).max(0) as u64))
            .collect())
    }
}

//! The Redis store: several replicas share tasks, records and task events through one
//! Redis server (or a managed one), under a key prefix of their own.
//!
//! Keys (`P` is the prefix):
//! - `P task:<id>`: the task with who owns it, which replica runs it and its version
//!   (an [`Envelope`], JSON); finished tasks expire after `retention_secs`.
//! - `P list:<agent>/<owner>`: a sorted set of the ids a caller created with an agent.
//! - `P replicas`: every replica that started; `P running:<replica>`: the unfinished tasks a
//!   replica runs; `P lease:<replica>` says it is alive. When a lease stays expired, the
//!   other replicas fail its running tasks and forget its streams.
//! - `P events:<id>` (pub/sub): a task's events, each with the version it made.
//! - `P commands:<replica>` (pub/sub): cancels and follow-ups for tasks a replica runs,
//!   answered on the list `P reply:<uuid>`.
//! - `P rec:<table>:<key>`: records (context affinity, upstream task owners, 0.1 names).
//! - `P rate:<bucket>`: rate-limit allowances (GCRA), shared by every replica.
//! - `P streams:<caller>`: a caller's open streams, per replica (a hash), for its cap.
//!
//! Writes go through the journal's writer thread, one MULTI/EXEC per batch, and an answer
//! waits for the batch its changes are in (a barrier): a task created through one replica
//! is readable through every other once its creator has answered.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{BoxStream, StreamExt};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use super::{Backend, Batch, Table, TaskRow};
use crate::protocol::model::{Task, TaskEvent};

/// Key names under the prefix.
#[derive(Clone)]
pub(crate) struct Keys {
    prefix: Arc<str>,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.into(),
        }
    }
    /// The prefix and `parts` in one string, each key's one way to be made: joined, not
    /// formatted (`format!` took about 1.4k instructions a key, three keys a task write).
    fn join(&self, parts: &[&str]) -> String {
        let len = self.prefix.len() + parts.iter().map(|p| p.len()).sum::<usize>();
        let mut key = String::with_capacity(len);
        key.push_str(&self.prefix);
        parts.iter().for_each(|p| key.push_str(p));
        key
    }
    pub(crate) fn task(&self, id: &str) -> String {
        self.join(&["task:", id])
    }
    /// Length-prefixed, so no agent or principal name makes two callers' lists meet.
    pub(crate) fn list(&self, agent: &str, owner: &str) -> String {
        let len = agent.len().to_string();
        self.join(&["list:", &len, ":", agent, "/", owner])
    }
    pub(crate) fn running(&self, replica: &str) -> String {
        self.join(&["running:", replica])
    }
    pub(crate) fn replicas(&self) -> String {
        self.join(&["replicas"])
    }
    pub(crate) fn running_pattern(&self) -> String {
        self.join(&["running:*"])
    }
    pub(crate) fn lease(&self, replica: &str) -> String {
        self.join(&["lease:", replica])
    }
    pub(crate) fn reaping(&self, replica: &str) -> String {
        self.join(&["reaping:", replica])
    }
    pub(crate) fn events(&self, id: &str) -> String {
        self.join(&["events:", id])
    }
    /// A streamed task's latest events, for resuming its streams through any replica.
    pub(crate) fn log(&self, id: &str) -> String {
        self.join(&["log:", id])
    }
    pub(crate) fn commands(&self, replica: &str) -> String {
        self.join(&["commands:", replica])
    }
    pub(crate) fn reply(&self, id: &str) -> String {
        self.join(&["reply:", id])
    }
    pub(crate) fn streams(&self, caller: &str) -> String {
        self.join(&["streams:", caller])
    }
    pub(crate) fn streams_pattern(&self) -> String {
        self.join(&["streams:*"])
    }
    pub(crate) fn rate(&self, bucket: &str) -> String {
        self.join(&["rate:", bucket])
    }
    pub(crate) fn record(&self, table: Table, key: &str) -> String {
        self.join(&["rec:", table.name(), ":", key])
    }
    /// The admin API's entries of a kind (a hash: name -> `<version>\n<json>`).
    pub(crate) fn control(&self, kind: &str) -> String {
        self.join(&["control:", kind])
    }
    /// How many changes the admin API's entries have seen; and the channel that says so.
    pub(crate) fn control_version(&self) -> String {
        self.join(&["control:version"])
    }
    pub(crate) fn control_changed(&self) -> String {
        self.join(&["control:changed"])
    }
    /// The audit log (a sorted set by number) and its last number.
    pub(crate) fn audit(&self) -> String {
        self.join(&["audit"])
    }
    pub(crate) fn audit_seq(&self) -> String {
        self.join(&["audit:seq"])
    }
    /// A counter's fields (usage, budgets), and the set of a group's counters.
    pub(crate) fn counter(&self, key: &str) -> String {
        self.join(&["counter:", key])
    }
    pub(crate) fn counter_group(&self, group: &str) -> String {
        self.join(&["counters:", group])
    }
    /// The key of a counter's hash (see [`Keys::counter`]).
    pub(crate) fn counter_key_of<'a>(&self, hash: &'a str) -> Option<&'a str> {
        hash.strip_prefix(&*self.prefix)?.strip_prefix("counter:")
    }
    /// When each runtime key was last used (a hash: id -> ms).
    pub(crate) fn key_used(&self) -> String {
        self.join(&["control:key_used"])
    }
    /// Who follows each task's push configs (hashes by task id: the replica, what the
    /// task is, the last version notified), the tasks each replica follows, and those a
    /// dead replica followed, waiting for a survivor.
    pub(crate) fn push_holder(&self) -> String {
        self.join(&["push:holder"])
    }
    pub(crate) fn push_about(&self) -> String {
        self.join(&["push:about"])
    }
    pub(crate) fn push_seen(&self) -> String {
        self.join(&["push:seen"])
    }
    pub(crate) fn push_following(&self, replica: &str) -> String {
        self.join(&["push:following:", replica])
    }
    /// The ids of the tasks relayed to a 0.3 upstream `agent` (a sorted set by time).
    pub(crate) fn ledger_index(&self, agent: &str) -> String {
        self.join(&["ledger:", agent])
    }
    /// A replica's unfinished tasks per owner (a hash: owner -> "<tasks> <bytes>").
    pub(crate) fn unfinished(&self, replica: &str) -> String {
        self.join(&["unfinished:", replica])
    }
    pub(crate) fn push_orphans(&self) -> String {
        self.join(&["push:orphans"])
    }
    /// The prefix's part after `running:` in a key of [`Keys::running_pattern`].
    pub(crate) fn replica_of_running<'a>(&self, key: &'a str) -> Option<&'a str> {
        key.strip_prefix(&*self.prefix)?.strip_prefix("running:")
    }
}

/// A task as Redis keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Envelope {
    pub(crate) agent: String,
    pub(crate) owner: String,
    pub(crate) seq: u64,
    /// The replica whose process runs the task's work.
    pub(crate) replica: String,
    /// How many events the task has taken; an event published with a version at or below
    /// a snapshot's is already in it.
    pub(crate) version: u64,
    pub(crate) task: Task,
}

/// [`Envelope`] as written: the task's JSON goes in as it is.
struct EnvelopeOut<'a> {
    agent: &'a str,
    owner: &'a str,
    seq: u64,
    replica: &'a str,
    version: u64,
    /// The task's JSON, as the store's snapshot wrote it.
    task: &'a str,
}

impl EnvelopeOut<'_> {
    /// The envelope's JSON, the task's copied in: serde's `RawValue` would parse it again
    /// to check it, which cost a Redis write more than the rest of the envelope.
    fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        // Pieces appended, not `write!`: formatting machinery for two numbers and a copy.
        let mut out = Vec::with_capacity(self.task.len() + 160);
        out.extend_from_slice(b"{\"agent\":");
        serde_json::to_writer(&mut out, self.agent)?;
        out.extend_from_slice(b",\"owner\":");
        serde_json::to_writer(&mut out, self.owner)?;
        out.extend_from_slice(b",\"seq\":");
        serde_json::to_writer(&mut out, &self.seq)?;
        out.extend_from_slice(b",\"replica\":");
        serde_json::to_writer(&mut out, self.replica)?;
        out.extend_from_slice(b",\"version\":");
        serde_json::to_writer(&mut out, &self.version)?;
        out.extend_from_slice(b",\"task\":");
        out.extend_from_slice(self.task.as_bytes());
        out.push(b'}');
        Ok(out)
    }
}

fn encode_error(e: serde_json::Error) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Client, "encode", e.to_string()))
}

/// Appends a published event to a task's log, keeping the latest
/// [`super::RESUME_EVENTS`]; the log expires with its task.
fn log_event(pipe: &mut redis::Pipeline, key: &str, json: &str, retention_secs: u64) {
    let keep = super::RESUME_EVENTS as isize;
    pipe.rpush(key, json).ignore();
    pipe.ltrim(key, -keep, -1).ignore();
    if retention_secs > 0 {
        pipe.expire(key, retention_secs as i64).ignore();
    }
}

/// One published event of a task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Published {
    pub(crate) version: u64,
    pub(crate) event: PublishedEvent,
}

/// [`TaskEvent`] as JSON: `{"status": ...}` or `{"artifact": ...}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum PublishedEvent {
    Status(crate::protocol::model::TaskStatusUpdateEvent),
    Artifact(crate::protocol::model::TaskArtifactUpdateEvent),
}

impl From<&TaskEvent> for PublishedEvent {
    fn from(e: &TaskEvent) -> Self {
        match e {
            TaskEvent::Status(s) => PublishedEvent::Status(s.clone()),
            TaskEvent::Artifact(a) => PublishedEvent::Artifact(a.clone()),
        }
    }
}

impl From<PublishedEvent> for TaskEvent {
    fn from(e: PublishedEvent) -> Self {
        match e {
            PublishedEvent::Status(s) => TaskEvent::Status(s),
            PublishedEvent::Artifact(a) => TaskEvent::Artifact(a),
        }
    }
}

/// The writer thread's side: a blocking connection, reopened after a failure.
pub(crate) struct RedisBackend {
    client: redis::Client,
    conn: Option<redis::Connection>,
    keys: Keys,
    replica: Arc<str>,
    retention_secs: u64,
    health: Arc<Health>,
    /// The tasks this writer has put in its replica's running set: it alone writes that set
    /// (a replica's name is new with each start), so a task answered at once, never in it,
    /// is not removed from it. `None` once a write failed, since a write that failed may
    /// still have been applied: from then on every finished task is removed.
    running: Option<HashSet<String>>,
    /// The name of that set.
    running_key: String,
}

pub(crate) use super::health::Health;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const IO_TIMEOUT: Duration = Duration::from_secs(5);

impl RedisBackend {
    pub(crate) fn new(
        client: redis::Client,
        keys: Keys,
        replica: Arc<str>,
        retention_secs: u64,
        health: Arc<Health>,
    ) -> RedisBackend {
        let running_key = keys.running(&replica);
        RedisBackend {
            client,
            conn: None,
            keys,
            replica,
            retention_secs,
            health,
            running: Some(HashSet::new()),
            running_key,
        }
    }

    fn connection(&mut self) -> redis::RedisResult<&mut redis::Connection> {
        if self.conn.is_none() {
            let conn = self.client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
            conn.set_read_timeout(Some(IO_TIMEOUT))?;
            conn.set_write_timeout(Some(IO_TIMEOUT))?;
            self.conn = Some(conn);
        }
        Ok(self.conn.as_mut().expect("just set"))
    }

    fn write(&mut self, batch: &Batch) -> redis::RedisResult<()> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        let running = &self.running_key;
        // Lists given their expiry in this batch: once each is enough (a set: a batch may
        // hold many callers' tasks).
        let mut expiring: HashSet<String> = HashSet::new();
        for row in &batch.tasks {
            let finished = row.state.is_terminal();
            let envelope = EnvelopeOut {
                agent: &row.agent,
                owner: &row.owner,
                seq: row.seq,
                replica: &self.replica,
                version: row.version,
                task: &row.body,
            };
            let json = envelope.to_json().map_err(encode_error)?;
            let key = self.keys.task(&row.id);
            match (finished, self.retention_secs) {
                (true, secs) if secs > 0 => pipe.set_ex(&key, json, secs).ignore(),
                _ => pipe.set(&key, json).ignore(),
            };
            let list = self.keys.list(&row.agent, &row.owner);
            pipe.zadd(&list, &row.id, row.seq).ignore();
            if self.retention_secs > 0 && !expiring.contains(&list) {
                // The list outlives its newest task by the retention period.
                pipe.expire(&list, self.retention_secs as i64).ignore();
                expiring.insert(list);
            }
            let listed = self.running.as_ref().map(|r| r.contains(&row.id));
            if finished && listed != Some(false) {
                pipe.srem(running, &row.id).ignore();
            } else if !finished && listed != Some(true) {
                pipe.sadd(running, &row.id).ignore();
            }
        }
        for (id, version, event, logged) in &batch.events {
            let published = Published {
                version: *version,
                event: PublishedEvent::from(event.as_ref()),
            };
            let json = serde_json::to_string(&published).map_err(encode_error)?;
            if *logged {
                log_event(&mut pipe, &self.keys.log(id), &json, self.retention_secs);
            }
            pipe.publish(self.keys.events(id), json).ignore();
        }
        for (table, key, value) in &batch.records {
            // Ledger records are listed by agent (ListTasks of a 0.3 upstream): indexed.
            if let (Table::Ledger, Some((agent, id))) = (table, super::ledger_key_parts(key)) {
                let index = self.keys.ledger_index(agent);
                pipe.zadd(&index, id, chrono::Utc::now().timestamp_millis())
                    .ignore();
                if self.retention_secs > 0 {
                    pipe.expire(&index, self.retention_secs as i64).ignore();
                }
            }
            let key = self.keys.record(*table, key);
            match self.retention_secs {
                0 => pipe.set(key, value).ignore(),
                secs => pipe.set_ex(key, value, secs).ignore(),
            };
        }
        // A replica's memory evicting a task says nothing about the shared store: removals
        // are not written (finished tasks expire instead).
        let conn = self.connection()?;
        if let Err(e) = pipe.query::<()>(conn) {
            self.running = None;
            return Err(e);
        }
        if let Some(listed) = &mut self.running {
            for row in &batch.tasks {
                if row.state.is_terminal() {
                    listed.remove(&row.id);
                } else if !listed.contains(&row.id) {
                    // A running task written again (a stream's updates) is not copied again.
                    listed.insert(row.id.clone());
                }
            }
            for (id, _) in &batch.removed {
                listed.remove(id);
            }
        }
        Ok(())
    }
}

impl Backend for RedisBackend {
    fn commit(&mut self, batch: &Batch) -> Result<(), String> {
        let mut result = self.write(batch);
        if result.is_err() {
            // The connection may be one Redis dropped (a restart): once more on a new one.
            self.conn = None;
            result = self.write(batch);
        }
        if result.is_err() {
            self.conn = None;
        }
        self.health.saw(&result);
        result.map_err(|e| e.to_string())
    }

    fn maintain(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// Reads and the rest of what replicas do through Redis, from async code.
pub(crate) struct Shared {
    client: redis::Client,
    conn: tokio::sync::OnceCell<redis::aio::ConnectionManager>,
    pub(crate) keys: Keys,
    pub(crate) replica: Arc<str>,
    pub(crate) health: Arc<Health>,
    pub(crate) lease: Duration,
    /// Set when the lease is given up: it is not renewed again.
    released: AtomicBool,
}

pub(crate) type RedisResult<T> = Result<T, String>;

impl Shared {
    pub(crate) fn new(
        client: redis::Client,
        keys: Keys,
        replica: Arc<str>,
        health: Arc<Health>,
        lease: Duration,
    ) -> Shared {
        Shared {
            client,
            conn: tokio::sync::OnceCell::new(),
            keys,
            replica,
            health,
            lease,
            released: AtomicBool::new(false),
        }
    }

    /// The shared connection (multiplexed; reconnects by itself once made).
    pub(crate) async fn conn(&self) -> RedisResult<redis::aio::ConnectionManager> {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(IO_TIMEOUT))
            .set_number_of_retries(1);
        let made = self
            .conn
            .get_or_try_init(|| {
                redis::aio::ConnectionManager::new_with_config(self.client.clone(), config)
            })
            .await
            .cloned();
        // A cached connection says nothing of whether Redis answers: only a failure does.
        if made.is_err() {
            self.health.saw(&made);
        }
        made.map_err(|e| e.to_string())
    }

    /// Runs `f` on the connection, noting whether Redis answered.
    pub(crate) async fn with<T, F, Fut>(&self, f: F) -> RedisResult<T>
    where
        F: FnOnce(redis::aio::ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.conn().await?;
        let result = f(conn).await;
        self.health.saw(&result);
        result.map_err(|e| e.to_string())
    }

    pub(crate) async fn task(&self, id: &str) -> RedisResult<Option<Envelope>> {
        let key = self.keys.task(id);
        let json: Option<String> = self.with(|mut c| async move { c.get(key).await }).await?;
        Ok(json.and_then(|j| serde_json::from_str(&j).ok()))
    }

    /// Every task of a caller with an agent (ids whose task expired are dropped).
    pub(crate) async fn tasks_of(&self, agent: &str, owner: &str) -> RedisResult<Vec<Envelope>> {
        let list = self.keys.list(agent, owner);
        let ids: Vec<String> = {
            let list = list.clone();
            self.with(|mut c| async move { c.zrange(list, 0, -1).await })
                .await?
        };
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = ids.iter().map(|id| self.keys.task(id)).collect();
        let bodies: Vec<Option<String>> =
            self.with(|mut c| async move { c.mget(keys).await }).await?;
        let mut out = Vec::with_capacity(ids.len());
        let mut gone = Vec::new();
        for (id, body) in ids.iter().zip(bodies) {
            match body.and_then(|b| serde_json::from_str::<Envelope>(&b).ok()) {
                Some(e) => out.push(e),
                None => gone.push(id.clone()),
            }
        }
        if !gone.is_empty() {
            let _ = self
                .with(|mut c| async move { c.zrem::<_, _, ()>(list, gone).await })
                .await;
        }
        Ok(out)
    }

    pub(crate) async fn record(&self, table: Table, key: &str) -> RedisResult<Option<String>> {
        let key = self.keys.record(table, key);
        self.with(|mut c| async move { c.get(key).await }).await
    }

    /// The records of every task relayed to the 0.3 upstream `agent` through any replica,
    /// as `(task id, record)`, oldest first (ids whose record expired are dropped).
    pub(crate) async fn ledger(&self, agent: &str) -> RedisResult<Vec<(String, String)>> {
        let index = self.keys.ledger_index(agent);
        let ids: Vec<String> = {
            let index = index.clone();
            self.with(|mut c| async move { c.zrange(index, 0, -1).await })
                .await?
        };
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = (ids.iter())
            .map(|id| {
                self.keys
                    .record(Table::Ledger, &super::ledger_key(agent, id))
            })
            .collect();
        let values: Vec<Option<String>> =
            self.with(|mut c| async move { c.mget(keys).await }).await?;
        let mut out = Vec::with_capacity(ids.len());
        let mut gone = Vec::new();
        for (id, value) in ids.into_iter().zip(values) {
            match value {
                Some(v) => out.push((id, v)),
                None => gone.push(id),
            }
        }
        if !gone.is_empty() {
            let _ = self
                .with(|mut c| async move { c.zrem::<_, _, ()>(index, gone).await })
                .await;
        }
        Ok(out)
    }

    /// A connection of its own for pub/sub.
    async fn pubsub(&self) -> RedisResult<redis::aio::PubSub> {
        self.connect(self.client.get_async_pubsub()).await
    }

    /// A connection of its own, for a blocking command (BLPOP) that may wait `wait`.
    async fn dedicated(&self, wait: Duration) -> RedisResult<redis::aio::MultiplexedConnection> {
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(wait + IO_TIMEOUT));
        self.connect(
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
    }

    /// A new connection, within [`CONNECT_TIMEOUT`], noting whether Redis answered.
    async fn connect<C>(
        &self,
        connecting: impl std::future::Future<Output = redis::RedisResult<C>>,
    ) -> RedisResult<C> {
        let made = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| "connecting to Redis timed out".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        self.health.saw(&made);
        made
    }

    /// Counts a stream `caller` opens here, if its streams over every replica are below
    /// `max`; false when they are not.
    pub(crate) async fn stream_opened(&self, caller: &str, max: usize) -> RedisResult<bool> {
        static OPENED: Lua = Lua::new(
            r#"
local open = 0
for _, n in ipairs(redis.call('HVALS', KEYS[1])) do open = open + tonumber(n) end
if open >= tonumber(ARGV[2]) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return 1
"#,
        );
        let script = OPENED.get();
        let key = self.keys.streams(caller);
        let replica = self.replica.to_string();
        let opened: i64 = self
            .with(|mut c| async move {
                script
                    .key(key)
                    .arg(replica)
                    .arg(max)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(opened == 1)
    }

    /// A stream [`Self::stream_opened`] counted has closed.
    pub(crate) async fn stream_closed(&self, caller: &str) {
        let key = self.keys.streams(caller);
        let replica = self.replica.to_string();
        let _ = self
            .with(|mut c| async move {
                let left: i64 = c.hincr(&key, &replica, -1).await?;
                if left <= 0 {
                    c.hdel::<_, _, ()>(&key, &replica).await?;
                }
                Ok(())
            })
            .await;
    }

    /// Replaces what this replica says its owners' unfinished tasks hold (`held`: owner,
    /// tasks, bytes; gone a lease after it stops saying so) and returns what the other
    /// replicas say, summed per owner.
    pub(crate) async fn exchange_unfinished(
        &self,
        held: Vec<(String, u64, u64)>,
    ) -> RedisResult<std::collections::HashMap<String, (u64, u64)>> {
        let mine = self.keys.unfinished(&self.replica);
        let millis = self.lease.as_millis() as u64;
        let all = self.keys.replicas();
        let others: Vec<String> = self
            .with(|mut c| async move {
                let mut pipe = redis::pipe();
                pipe.atomic().del(&mine).ignore();
                if !held.is_empty() {
                    let fields: Vec<(String, String)> = (held.into_iter())
                        .map(|(owner, tasks, bytes)| (owner, format!("{tasks} {bytes}")))
                        .collect();
                    pipe.hset_multiple(&mine, &fields)
                        .ignore()
                        .pexpire(&mine, millis as i64)
                        .ignore();
                }
                pipe.smembers(all);
                let (replicas,): (Vec<String>,) = pipe.query_async(&mut c).await?;
                Ok(replicas)
            })
            .await?;
        let keys: Vec<String> = (others.iter())
            .filter(|r| **r != *self.replica)
            .map(|r| self.keys.unfinished(r))
            .collect();
        let mut summed = std::collections::HashMap::new();
        if keys.is_empty() {
            return Ok(summed);
        }
        let hashes: Vec<std::collections::HashMap<String, String>> = self
            .with(|mut c| async move {
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.hgetall(key);
                }
                pipe.query_async(&mut c).await
            })
            .await?;
        for (owner, value) in hashes.into_iter().flatten() {
            let mut numbers = value.split(' ').map(|n| n.parse::<u64>().unwrap_or(0));
            let (tasks, bytes) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
            let sum: &mut (u64, u64) = summed.entry(owner).or_default();
            sum.0 += tasks;
            sum.1 += bytes;
        }
        Ok(summed)
    }

    /// Whether Redis answers a PING now.
    pub(crate) async fn ping(&self) -> bool {
        self.with(|mut c| async move { redis::cmd("PING").query_async::<String>(&mut c).await })
            .await
            .is_ok()
    }
}

/// Generic cell rate algorithm: a bucket is its theoretical arrival time (µs, Redis's
/// clock), expiring once the allowance is full again. Returns allowed (1/0), the remaining
/// burst, µs until a refused call may retry, µs until the allowance is full.
const GCRA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + interval * cost
local allow_at = new_tat - interval * burst
if now < allow_at then
  return {0, 0, allow_at - now, tat - now}
end
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000) + 1)
return {1, math.floor((now + interval * burst - new_tat) / interval), 0, new_tat - now}
"#;

/// Allowances, commands between replicas and task events (see [`super::shared::Shared`]).
impl Shared {
    pub(crate) async fn rate(
        &self,
        bucket: &str,
        interval_us: u64,
        burst: u32,
        cost: u32,
    ) -> RedisResult<(i64, i64, i64, i64)> {
        static RATE: Lua = Lua::new(GCRA);
        let script = RATE.get();
        let key = self.keys.rate(bucket);
        self.with(|mut c| async move {
            (script.key(key).arg(interval_us).arg(burst).arg(cost))
                .invoke_async(&mut c)
                .await
        })
        .await
    }

    /// The list a command's answer is pushed to.
    pub(crate) fn reply_token(&self) -> String {
        self.keys.reply(&crate::protocol::model::new_id())
    }

    pub(crate) async fn call(
        &self,
        replica: &str,
        reply: &str,
        command: String,
        within: Duration,
    ) -> RedisResult<String> {
        // Connected before the command goes out: a failure then leaves nothing done.
        let mut conn = self.dedicated(within).await?;
        let channel = self.keys.commands(replica);
        let listeners: i64 = self
            .with(|mut c| async move { c.publish(channel, command).await })
            .await?;
        if listeners == 0 {
            return Err(format!(
                "the replica running this task ({replica}) does not answer; its unfinished tasks are failed once its lease expires"
            ));
        }
        let answered: Option<(String, String)> = conn
            .blpop(reply, within.as_secs_f64())
            .await
            .map_err(|e| e.to_string())?;
        answered.map(|(_, json)| json).ok_or_else(|| {
            format!(
                "the replica running this task ({replica}) did not answer within {} s",
                within.as_secs()
            )
        })
    }

    pub(crate) async fn commands(&self) -> RedisResult<BoxStream<'static, String>> {
        let mut pubsub = self.pubsub().await?;
        (pubsub.subscribe(self.keys.commands(&self.replica)).await).map_err(|e| e.to_string())?;
        Ok(Box::pin(pubsub.into_on_message().filter_map(
            |msg| async move { msg.get_payload::<String>().ok() },
        )))
    }

    pub(crate) async fn answer(&self, reply: &str, json: String) {
        let reply = reply.to_string();
        let _ = self
            .with(|mut c| async move {
                let mut pipe = redis::pipe();
                pipe.rpush(&reply, json).ignore();
                pipe.expire(&reply, 60).ignore();
                pipe.query_async::<()>(&mut c).await
            })
            .await;
    }

    pub(crate) async fn events(&self, task_id: &str) -> RedisResult<BoxStream<'static, Published>> {
        let mut pubsub = self.pubsub().await?;
        (pubsub.subscribe(self.keys.events(task_id)).await).map_err(|e| e.to_string())?;
        Ok(Box::pin(pubsub.into_on_message().filter_map(
            |msg| async move {
                let payload: String = msg.get_payload().ok()?;
                serde_json::from_str::<Published>(&payload).ok()
            },
        )))
    }

    pub(crate) async fn logged(&self, task_id: &str) -> RedisResult<Vec<Published>> {
        let key = self.keys.log(task_id);
        let entries: Vec<String> = self
            .with(|mut c| async move { c.lrange(key, 0, -1).await })
            .await?;
        Ok((entries.iter())
            .filter_map(|json| serde_json::from_str(json).ok())
            .collect())
    }
}

/// `task` as a `TaskRow` of this gateway's model.
impl From<Envelope> for TaskRow {
    fn from(e: Envelope) -> TaskRow {
        TaskRow {
            task: e.task,
            agent: e.agent.into(),
            owner: e.owner.into(),
            seq: e.seq,
            version: e.version,
            events: Vec::new(),
        }
    }
}

impl Shared {
    /// Renews this replica's lease every third of its length, until it is given up.
    pub(crate) async fn keep_lease(self: Arc<Self>) {
        let key = self.keys.lease(&self.replica);
        let millis = self.lease.as_millis() as u64;
        let (set, me) = (self.keys.replicas(), self.replica.to_string());
        let _ = self
            .with(|mut c| async move { c.sadd::<_, _, ()>(set, me).await })
            .await;
        while !self.released.load(Ordering::Acquire) {
            let key = key.clone();
            let _ = self
                .with(|mut c| async move {
                    c.set_options::<_, _, ()>(
                        key,
                        "alive",
                        redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(millis)),
                    )
                    .await
                })
                .await;
            tokio::time::sleep(self.lease / 3).await;
        }
    }

    /// Gives the lease up at a clean shutdown: the others fail what is left at once.
    pub(crate) async fn release_lease(&self) {
        self.released.store(true, Ordering::Release);
        let key = self.keys.lease(&self.replica);
        let _ = self
            .with(|mut c| async move { c.del::<_, ()>(key).await })
            .await;
    }

    /// One look for dead replicas. A replica is taken for dead when its lease is missing at
    /// two looks in a row (`suspects` holds those missing at the last): a lease that lapsed
    /// while Redis itself was away has a renewal's time to come back.
    pub(crate) async fn reap_once(
        &self,
        note: &str,
        retention_secs: u64,
        suspects: &mut std::collections::HashSet<String>,
    ) -> RedisResult<()> {
        let (pattern, all) = (self.keys.running_pattern(), self.keys.replicas());
        let found: Vec<String> = self
            .with(|mut c| async move {
                let mut found: Vec<String> = c.smembers(all).await?;
                let mut iter = c.scan_match::<_, String>(pattern).await?;
                while let Some(key) = futures_util::StreamExt::next(&mut iter).await {
                    found.push(key?);
                }
                Ok(found)
            })
            .await?;
        let mut replicas: Vec<String> = found
            .iter()
            .map(|k| self.keys.replica_of_running(k).unwrap_or(k).to_string())
            .collect();
        replicas.sort();
        replicas.dedup();
        for replica in replicas {
            if *replica == *self.replica {
                continue;
            }
            let set = self.keys.running(&replica);
            let lease = self.keys.lease(&replica);
            let alive: bool = self
                .with(|mut c| async move { c.exists(lease).await })
                .await?;
            if alive {
                suspects.remove(&replica);
                continue;
            }
            if suspects.insert(replica.clone()) {
                continue;
            }
            let lock = self.keys.reaping(&replica);
            let me = self.replica.to_string();
            let millis = self.lease.as_millis() as u64;
            let locked: Option<String> = self
                .with(|mut c| async move {
                    c.set_options(
                        lock,
                        me,
                        redis::SetOptions::default()
                            .conditional_set(redis::ExistenceCheck::NX)
                            .with_expiration(redis::SetExpiry::PX(millis)),
                    )
                    .await
                })
                .await?;
            if locked.is_none() {
                continue;
            }
            let ids: Vec<String> = {
                let set = set.clone();
                self.with(|mut c| async move { c.smembers(set).await })
                    .await?
            };
            let mut failed = 0;
            for id in &ids {
                if self.fail_lost(id, note, retention_secs).await? {
                    failed += 1;
                }
            }
            self.with(|mut c| async move { c.del::<_, ()>(set).await })
                .await?;
            self.forget_streams_of(&replica).await?;
            self.orphan_followed_by(&replica).await?;
            let (all, gone) = (self.keys.replicas(), replica.clone());
            self.with(|mut c| async move { c.srem::<_, _, ()>(all, gone).await })
                .await?;
            suspects.remove(&replica);
            if failed > 0 {
                tracing::warn!(replica = %replica, tasks = failed, "store: a replica's lease expired; its unfinished tasks are marked failed");
            }
        }
        Ok(())
    }

    /// The tasks a dead replica followed for push wait for a survivor to adopt them.
    async fn orphan_followed_by(&self, replica: &str) -> RedisResult<()> {
        let (orphans, following) = (self.keys.push_orphans(), self.keys.push_following(replica));
        self.with(|mut c| async move {
            let mut pipe = redis::pipe();
            pipe.atomic()
                .sunionstore(&orphans, &[&orphans, &following])
                .ignore()
                .del(&following)
                .ignore();
            pipe.query_async::<()>(&mut c).await
        })
        .await
    }

    /// A dead replica's streams are gone: they no longer count against their callers.
    async fn forget_streams_of(&self, replica: &str) -> RedisResult<()> {
        let pattern = self.keys.streams_pattern();
        let replica = replica.to_string();
        self.with(|mut c| async move {
            let mut keys = Vec::new();
            {
                let mut iter = c.scan_match::<_, String>(pattern).await?;
                while let Some(key) = futures_util::StreamExt::next(&mut iter).await {
                    keys.push(key?);
                }
            }
            for key in keys {
                c.hdel::<_, _, ()>(key, &replica).await?;
            }
            Ok(())
        })
        .await
    }

    /// Marks one task of a dead replica failed, if it is unfinished; true if it was.
    async fn fail_lost(&self, id: &str, note: &str, retention_secs: u64) -> RedisResult<bool> {
        let Some(mut envelope) = self.task(id).await? else {
            return Ok(false);
        };
        if envelope.task.status.state.is_terminal() {
            return Ok(false);
        }
        let task = &mut envelope.task;
        let message = crate::protocol::model::Message::agent_text(note.to_string())
            .placed(Some(&task.id), &task.context_id);
        let status = crate::protocol::model::TaskStatus::now(
            crate::protocol::model::TaskState::Failed,
            Some(message),
        );
        let event = crate::protocol::model::TaskStatusUpdateEvent {
            task_id: task.id.clone(),
            context_id: task.context_id.clone(),
            status,
            metadata: None,
        };
        task.apply(&TaskEvent::Status(event.clone()));
        // Past whatever the dead replica sent its clients without writing it.
        envelope.version += super::UNWRITTEN_EVENTS;
        let published = Published {
            version: envelope.version,
            event: PublishedEvent::Status(event),
        };
        let body = serde_json::to_string(&envelope).map_err(|e| e.to_string())?;
        let published = serde_json::to_string(&published).map_err(|e| e.to_string())?;
        let (key, channel) = (self.keys.task(id), self.keys.events(id));
        let log = self.keys.log(id);
        self.with(|mut c| async move {
            let mut pipe = redis::pipe();
            pipe.atomic();
            match retention_secs {
                0 => pipe.set(key, body).ignore(),
                secs => pipe.set_ex(key, body, secs).ignore(),
            };
            // Into the task's log only if it has one (it was streamed).
            pipe.rpush_exists(&log, &published).ignore();
            pipe.publish(channel, published).ignore();
            pipe.query_async::<()>(&mut c).await
        })
        .await?;
        Ok(true)
    }
}

/// One replica follows each task's push configs (it notifies every config, whichever replica
/// made it): a hold per task, taken when a replica starts following, checked before each
/// notification (a replica that stalled past its lease finds it gone and stops), and
/// adopted by a survivor when its replica dies, with the last version it notified.
impl Shared {
    /// Takes the hold on following `task` (`about` says what a successor needs to know of
    /// it); the replica holding it already, if another does.
    pub(crate) async fn follow_claim(
        &self,
        task: &str,
        about: &str,
    ) -> RedisResult<Option<String>> {
        static CLAIM: Lua = Lua::new(
            r#"
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held and held ~= ARGV[2] then return held end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[1])
return ''
"#,
        );
        let k = &self.keys;
        let keys = [
            k.push_holder(),
            k.push_about(),
            k.push_following(&self.replica),
        ];
        let held: String = self
            .run(&CLAIM, &keys, &[task, &*self.replica, about])
            .await?;
        Ok((!held.is_empty()).then_some(held))
    }

    /// Whether this replica still holds `task`. A hold handed over and not adopted yet is
    /// taken back: its replica was taken for dead while it only stalled, and its follower
    /// goes on.
    pub(crate) async fn follow_check(&self, task: &str) -> RedisResult<bool> {
        static CHECK: Lua = Lua::new(
            r#"
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if redis.call('SREM', KEYS[2], ARGV[1]) == 1 then redis.call('SADD', KEYS[3], ARGV[1]) end
return 1
"#,
        );
        let k = &self.keys;
        let keys = [
            k.push_holder(),
            k.push_orphans(),
            k.push_following(&self.replica),
        ];
        let mine: i64 = self.run(&CHECK, &keys, &[task, &*self.replica]).await?;
        Ok(mine == 1)
    }

    /// Notes `version` of `task` delivered (a later one noted already stays), while this
    /// replica holds it.
    pub(crate) async fn follow_note(&self, task: &str, version: u64) -> RedisResult<()> {
        static NOTE: Lua = Lua::new(
            r#"
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if tonumber(ARGV[3]) > tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
end
return 1
"#,
        );
        let keys = [self.keys.push_holder(), self.keys.push_seen()];
        let version = version.to_string();
        let args = [task, &*self.replica, version.as_str()];
        self.run::<i64>(&NOTE, &keys, &args).await.map(drop)
    }

    /// Gives the hold on `task` up (its task finished), if this replica has it.
    pub(crate) async fn follow_release(&self, task: &str) -> RedisResult<()> {
        static RELEASE: Lua = Lua::new(
            r#"
redis.call('SREM', KEYS[4], ARGV[1])
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"#,
        );
        let k = &self.keys;
        let keys = [
            k.push_holder(),
            k.push_about(),
            k.push_seen(),
            k.push_following(&self.replica),
        ];
        let args = [task, &*self.replica];
        self.run::<i64>(&RELEASE, &keys, &args).await.map(drop)
    }

    /// Hands `task` over to whichever replica adopts it next (this one included): its
    /// follower here lost its updates (the store went away, say), and a new one picks up
    /// after the last version notified.
    pub(crate) async fn follow_abandon(&self, task: &str) -> RedisResult<()> {
        static ABANDON: Lua = Lua::new(
            r#"
redis.call('SREM', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('SADD', KEYS[3], ARGV[1])
return 1
"#,
        );
        let k = &self.keys;
        let keys = [
            k.push_holder(),
            k.push_following(&self.replica),
            k.push_orphans(),
        ];
        let args = [task, &*self.replica];
        self.run::<i64>(&ABANDON, &keys, &args).await.map(drop)
    }

    /// Takes the hold on one task a dead replica followed: its id, what it is, and the
    /// last version notified (0: none known).
    pub(crate) async fn follow_adopt(&self) -> RedisResult<Option<(String, String, u64)>> {
        static ADOPT: Lua = Lua::new(
            r#"
local task = redis.call('SPOP', KEYS[1])
if not task then return false end
redis.call('HSET', KEYS[2], task, ARGV[1])
redis.call('SADD', KEYS[5], task)
return {task, redis.call('HGET', KEYS[3], task) or '', redis.call('HGET', KEYS[4], task) or '0'}
"#,
        );
        let k = &self.keys;
        let keys = [
            k.push_orphans(),
            k.push_holder(),
            k.push_about(),
            k.push_seen(),
            k.push_following(&self.replica),
        ];
        let adopted: Option<(String, String, String)> =
            self.run(&ADOPT, &keys, &[&*self.replica]).await?;
        Ok(adopted.map(|(task, about, seen)| (task, about, seen.parse().unwrap_or(0))))
    }

    pub(crate) async fn follow_held(&self) -> RedisResult<Vec<(String, String, u64)>> {
        static HELD: Lua = Lua::new(
            r#"
local held = {}
for _, task in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('HGET', KEYS[2], task) == ARGV[1] then
    held[#held + 1] = {task, redis.call('HGET', KEYS[3], task) or '', redis.call('HGET', KEYS[4], task) or '0'}
  end
end
return held
"#,
        );
        let k = &self.keys;
        let keys = [
            k.push_following(&self.replica),
            k.push_holder(),
            k.push_about(),
            k.push_seen(),
        ];
        let held: Vec<(String, String, String)> = self.run(&HELD, &keys, &[&*self.replica]).await?;
        Ok((held.into_iter())
            .map(|(task, about, seen)| (task, about, seen.parse().unwrap_or(0)))
            .collect())
    }

    /// Runs `script` on `keys` with `args`.
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Lua,
        keys: &[String],
        args: &[&str],
    ) -> RedisResult<T> {
        let script = script.get();
        self.with(|mut c| async move { script.key(keys).arg(args).invoke_async(&mut c).await })
            .await
    }
}

/// A Lua script for Redis, hashed once, when first run.
struct Lua {
    source: &'static str,
    script: std::sync::OnceLock<redis::Script>,
}

impl Lua {
    const fn new(source: &'static str) -> Lua {
        Lua {
            source,
            script: std::sync::OnceLock::new(),
        }
    }

    fn get(&self) -> &redis::Script {
        self.script.get_or_init(|| redis::Script::new(self.source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::model::{Message, Part, Role};

    #[test]
    fn keys_are_the_prefix_and_their_parts() {
        let keys = Keys::new("gw:");
        assert_eq!(keys.task("t1"), "gw:task:t1");
        assert_eq!(keys.list("echo", "k/1"), "gw:list:4:echo/k/1");
        assert_eq!(keys.running("r1"), "gw:running:r1");
        assert_eq!(
            keys.record(Table::Ledger, "a"),
            format!("gw:rec:{}:a", Table::Ledger.name())
        );
        assert_eq!(keys.audit(), "gw:audit");
        assert_eq!(keys.replica_of_running(&keys.running("r1")), Some("r1"));
        assert_eq!(keys.counter_key_of(&keys.counter("c")), Some("c"));
    }

    #[test]
    fn an_envelope_is_written_as_serde_writes_it() {
        #[derive(Serialize)]
        struct BySerde<'a> {
            agent: &'a str,
            owner: &'a str,
            seq: u64,
            replica: &'a str,
            version: u64,
            task: &'a serde_json::value::RawValue,
        }
        let message = Message {
            message_id: "m\"1".into(),
            role: Role::User,
            parts: vec![Part::text("hi\n")],
            ..Default::default()
        };
        let task = Task::submitted("t\\1".into(), "c1".into(), message);
        let body = String::from_utf8(crate::protocol::write::task(&task).unwrap()).unwrap();
        let out = EnvelopeOut {
            agent: "a\"gent",
            owner: "key:o\\wner",
            seq: 7,
            replica: "r\n1",
            version: u64::MAX,
            task: &body,
        };
        let raw = serde_json::value::RawValue::from_string(body.clone()).unwrap();
        let expected = serde_json::to_string(&BySerde {
            agent: out.agent,
            owner: out.owner,
            seq: out.seq,
            replica: out.replica,
            version: out.version,
            task: &raw,
        })
        .unwrap();
        let written = String::from_utf8(out.to_json().unwrap()).unwrap();
        assert_eq!(written, expected);
        let read: Envelope = serde_json::from_str(&written).unwrap();
        // Stored timestamps keep milliseconds.
        let stored: Task = serde_json::from_str(&body).unwrap();
        assert_eq!(stored.id, task.id);
        let read = (read.agent.as_str(), read.seq, read.task);
        assert_eq!(read, ("a\"gent", 7, stored));
    }
}

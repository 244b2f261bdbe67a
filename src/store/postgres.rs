//! The PostgreSQL store: tasks, their events, the gateway's records, the admin API's entries
//! and the counters in one schema of a PostgreSQL database. Each group commit is one
//! transaction of a few statements whatever its size (rows go as arrays, `unnest`ed by the
//! server), on disk when it returns (PostgreSQL's `synchronous_commit`).
//!
//! One gateway holds a schema at a time (a session advisory lock, taken again when the
//! connection is made again): several gateways share one database by each using a schema
//! of its own. With `store.shared`, replicas share a schema instead (each holding the lock
//! in shared mode, so a gateway of the other mode is refused): see [`super::postgres_shared`].

use std::collections::HashMap;
use std::time::Duration;

use postgres::{Client, NoTls, Transaction};

use super::redis::PublishedEvent;
use super::{Backend, Batch, Loaded, Table, TaskRow};
use crate::protocol::model::{Task, TaskEvent};

/// Each entry takes the schema from its index to the next version (entry 0 makes version
/// 1). Never edit a shipped entry: add one.
const MIGRATIONS: &[&str] = &[
    // Version 1. A task is kept as its A2A 1.0 JSON, keyed by creation order; the columns
    // beside it are what loading and housekeeping look at. Then what the SQLite file keeps
    // beside tasks: stream events, records, the admin API's entries and the counters.
    "CREATE TABLE tasks (
        seq BIGINT PRIMARY KEY,
        id TEXT NOT NULL,
        agent TEXT NOT NULL,
        owner TEXT NOT NULL,
        version BIGINT NOT NULL,
        state TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE TABLE events (
        task_id TEXT NOT NULL,
        version BIGINT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (task_id, version)
    );
    CREATE TABLE records (
        tbl TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        written_ms BIGINT NOT NULL,
        PRIMARY KEY (tbl, key)
    );
    CREATE INDEX records_by_age ON records (tbl, written_ms);
    CREATE TABLE control (
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        version BIGINT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (kind, name)
    );
    CREATE TABLE audit (seq BIGSERIAL PRIMARY KEY, entry TEXT NOT NULL);
    CREATE TABLE control_changes (id INT PRIMARY KEY CHECK (id = 1), changes BIGINT NOT NULL);
    INSERT INTO control_changes (id, changes) VALUES (1, 0);
    CREATE TABLE key_used (id TEXT PRIMARY KEY, at_ms BIGINT NOT NULL);
    CREATE TABLE counters (
        grp TEXT NOT NULL,
        key TEXT NOT NULL,
        field TEXT NOT NULL,
        amount BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL,
        PRIMARY KEY (grp, key, field)
    );
    CREATE INDEX counters_expiry ON counters (expires_ms);",
    // Version 2. Replicas share a schema (`store.shared`): a task is keyed by its id (each
    // replica numbers its own), with the replica that runs it, whether it finished and when
    // it was written; then what replicas share beside tasks (see `postgres_shared`).
    "ALTER TABLE tasks DROP CONSTRAINT tasks_pkey;
    ALTER TABLE tasks ADD PRIMARY KEY (id);
    CREATE INDEX tasks_by_seq ON tasks (seq);
    ALTER TABLE tasks ADD COLUMN replica TEXT NOT NULL DEFAULT '';
    ALTER TABLE tasks ADD COLUMN finished BOOLEAN NOT NULL DEFAULT false;
    ALTER TABLE tasks ADD COLUMN written_ms BIGINT NOT NULL DEFAULT 0;
    UPDATE tasks SET finished = state IN ('completed', 'canceled', 'failed', 'rejected');
    CREATE INDEX tasks_by_caller ON tasks (agent, owner);
    CREATE INDEX tasks_running ON tasks (replica) WHERE NOT finished;
    CREATE INDEX tasks_finished ON tasks (written_ms) WHERE finished;
    CREATE TABLE leases (replica TEXT PRIMARY KEY, expires_ms BIGINT NOT NULL);
    CREATE TABLE streams (
        caller TEXT NOT NULL,
        replica TEXT NOT NULL,
        open INT NOT NULL,
        PRIMARY KEY (caller, replica)
    );
    CREATE TABLE rates (bucket TEXT PRIMARY KEY, tat BIGINT NOT NULL, seen BIGINT NOT NULL);
    CREATE TABLE unfinished (
        replica TEXT NOT NULL,
        owner TEXT NOT NULL,
        tasks BIGINT NOT NULL,
        bytes BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL,
        PRIMARY KEY (replica, owner)
    );
    CREATE TABLE push_holds (
        task TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        about TEXT NOT NULL,
        seen BIGINT NOT NULL DEFAULT 0,
        orphan BOOLEAN NOT NULL DEFAULT false
    );
    CREATE INDEX push_holds_by_holder ON push_holds (holder);
    CREATE TABLE notes (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL, written_ms BIGINT NOT NULL);",
];

/// Records kept per table (the newest), as many as the memory maps they fill hold.
const RECORDS_PER_TABLE: i64 = 100_000;

/// How long connecting may take before the store says the server does not answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a gateway waits for the schema another one holds before it says so.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Where the store is: the server and the schema in it.
#[derive(Clone)]
pub(crate) struct Place {
    pub(crate) url: String,
    pub(crate) schema: String,
    /// Replicas share the schema (`store.shared`).
    pub(crate) shared: bool,
}

impl Place {
    /// The URL without its password, and the schema: for messages and the banner.
    pub(crate) fn described(&self) -> String {
        format!("{} schema {}", super::redacted(&self.url), self.schema)
    }
}

pub(crate) struct PostgresBackend {
    client: Client,
    place: Place,
    retention_secs: u64,
    /// Shared: this replica, written beside each task it runs.
    replica: Option<std::sync::Arc<str>>,
    /// The writes' statements, prepared once per connection.
    statements: Statements,
}

/// Statements prepared on the writer's connection, by their SQL: a commit sends each
/// statement's rows in one round trip instead of two (parse, then execute).
#[derive(Default)]
struct Statements(HashMap<&'static str, postgres::Statement>);

impl Statements {
    fn get(
        &mut self,
        tx: &mut Transaction<'_>,
        sql: &'static str,
    ) -> Result<postgres::Statement, postgres::Error> {
        if let Some(prepared) = self.0.get(sql) {
            return Ok(prepared.clone());
        }
        let prepared = tx.prepare(sql)?;
        self.0.insert(sql, prepared.clone());
        Ok(prepared)
    }
    fn execute(
        &mut self,
        tx: &mut Transaction<'_>,
        sql: &'static str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        let statement = self.get(tx, sql)?;
        tx.execute(&statement, params)
    }

    fn query_one(
        &mut self,
        tx: &mut Transaction<'_>,
        sql: &'static str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<postgres::Row, postgres::Error> {
        let statement = self.get(tx, sql)?;
        tx.query_one(&statement, params)
    }
}

/// Connects, takes the schema for this gateway, brings it up to date and reads what it
/// holds. Errors say which server and schema, and what to do.
pub(crate) fn open(
    place: &Place,
    retention_secs: u64,
    replica: Option<std::sync::Arc<str>>,
) -> Result<(PostgresBackend, Loaded), String> {
    // The client runs a runtime of its own, which cannot start inside the gateway's: it is
    // made, and used, on threads of its own.
    let place = place.clone();
    std::thread::Builder::new()
        .name("store-open".into())
        .spawn(move || {
            let mut client = connect(&place)?;
            migrate(&mut client, &place)?;
            // Replicas read each other's tasks from the store, not from memory.
            let loaded = match place.shared {
                true => Loaded::default(),
                false => load(&mut client).map_err(|e| failed(&place, &e))?,
            };
            Ok((
                PostgresBackend {
                    client,
                    place,
                    retention_secs,
                    replica,
                    statements: Statements::default(),
                },
                loaded,
            ))
        })
        .map_err(|e| format!("store: cannot start a thread to open PostgreSQL: {e}"))?
        .join()
        .map_err(|_| "store: opening PostgreSQL panicked".to_string())?
}

fn failed(place: &Place, e: &postgres::Error) -> String {
    let why = match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => e.to_string(),
    };
    format!("store: PostgreSQL {}: {why}", place.described())
}

/// A connection with the schema created, on its search path and held by this gateway.
fn connect(place: &Place) -> Result<Client, String> {
    let (url, tls) = super::postgres_tls::prepare(&place.url)?;
    let mut config: postgres::Config = url.parse().map_err(|e| format!("store.url: {e}"))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        // Operators find the gateway's sessions, by schema, in pg_stat_activity.
        config.application_name(&format!("a2a-gateway/{}", place.schema));
    }
    let connected = match tls {
        Some(tls) => config.connect(tls),
        None => config.connect(NoTls),
    };
    let mut client = connected.map_err(|e| {
        let why = match (e.as_db_error(), std::error::Error::source(&e)) {
            (Some(db), _) => db.message().to_string(),
            (None, Some(cause)) => format!("{e} ({cause})"),
            (None, None) => e.to_string(),
        };
        format!(
            "store: cannot reach PostgreSQL at {}: {why}",
            super::redacted(&place.url)
        )
    })?;
    let fail = |e: postgres::Error| failed(place, &e);
    let schema = quoted(&place.schema);
    client
        .batch_execute(&format!(
            "SET client_min_messages TO warning; CREATE SCHEMA IF NOT EXISTS {schema}; SET search_path TO {schema}"
        ))
        .map_err(fail)?;
    // A gateway that just exited may hold it a moment longer (the server ends its session
    // after the socket closes).
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    let held = loop {
        let take = match place.shared {
            true => "SELECT pg_try_advisory_lock_shared(hashtext('a2a-gateway:' || $1))",
            false => "SELECT pg_try_advisory_lock(hashtext('a2a-gateway:' || $1))",
        };
        let held: bool = client
            .query_one(take, &[&place.schema])
            .map_err(fail)?
            .get(0);
        if held || std::time::Instant::now() >= deadline {
            break held;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if !held {
        let why = match place.shared {
            true => "by a gateway that does not share it (store.shared = false)",
            false => "by another gateway (one gateway per schema: give each its own store.schema, or set store.shared = true on every replica)",
        };
        return Err(format!(
            "store: schema {} in PostgreSQL at {} is in use {why}",
            place.schema,
            super::redacted(&place.url)
        ));
    }
    Ok(client)
}

/// A schema name as an SQL identifier (the configuration allows letters, digits and `_`;
/// quoting keeps its case).
pub(super) fn quoted(schema: &str) -> String {
    format!("\"{}\"", schema.replace('"', "\"\""))
}

/// Applies the migrations the schema lacks, in one transaction. A schema written by a
/// newer gateway is refused, untouched.
fn migrate(client: &mut Client, place: &Place) -> Result<(), String> {
    let fail = |e: postgres::Error| failed(place, &e);
    let mut tx = client.transaction().map_err(fail)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_version (
            id INT PRIMARY KEY CHECK (id = 1), version INT NOT NULL);
         INSERT INTO schema_version (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;",
    )
    .map_err(fail)?;
    let version: i32 = tx
        .query_one(
            "SELECT version FROM schema_version WHERE id = 1 FOR UPDATE",
            &[],
        )
        .map_err(fail)?
        .get(0);
    let known = MIGRATIONS.len() as i32;
    if version > known {
        return Err(format!(
            "store: PostgreSQL {} was written by a newer a2a-gateway (schema version {version}; this one knows versions up to {known}). Run the newer gateway, or give this one another store.schema.",
            place.described()
        ));
    }
    for (i, step) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        tx.batch_execute(step).map_err(fail)?;
        tx.execute(
            "UPDATE schema_version SET version = $1 WHERE id = 1",
            &[&(i as i32 + 1)],
        )
        .map_err(fail)?;
    }
    tx.commit().map_err(fail)
}

fn load(client: &mut Client) -> Result<Loaded, postgres::Error> {
    let mut loaded = Loaded::default();
    let mut events = load_events(client)?;
    let mut unreadable = 0usize;
    for row in client.query(
        "SELECT agent, owner, seq, version, body FROM tasks ORDER BY seq",
        &[],
    )? {
        let body: &str = row.get(4);
        match serde_json::from_str::<Task>(body) {
            Ok(task) => loaded.tasks.push(TaskRow {
                events: events.remove(&task.id).unwrap_or_default(),
                task,
                agent: row.get::<_, &str>(0).into(),
                owner: row.get::<_, &str>(1).into(),
                seq: row.get::<_, i64>(2).max(0) as u64,
                version: row.get::<_, i64>(3).max(0) as u64,
            }),
            Err(_) => unreadable += 1,
        }
    }
    if unreadable > 0 {
        tracing::warn!(
            tasks = unreadable,
            "store: some stored tasks could not be read and were skipped"
        );
    }
    let records =
        client.prepare("SELECT key, value FROM records WHERE tbl = $1 ORDER BY written_ms")?;
    for table in Table::ALL {
        let entries = client
            .query(&records, &[&table.name()])?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        loaded.records.insert(table, entries);
    }
    Ok(loaded)
}

/// Streamed tasks' kept events, by task, oldest first.
fn load_events(
    client: &mut Client,
) -> Result<HashMap<String, Vec<(u64, TaskEvent)>>, postgres::Error> {
    let mut by_task: HashMap<String, Vec<(u64, TaskEvent)>> = HashMap::new();
    for row in client.query(
        "SELECT task_id, version, body FROM events ORDER BY task_id, version",
        &[],
    )? {
        if let Ok(event) = serde_json::from_str::<PublishedEvent>(row.get(2)) {
            by_task
                .entry(row.get(0))
                .or_default()
                .push((row.get::<_, i64>(1).max(0) as u64, TaskEvent::from(event)));
        }
    }
    Ok(by_task)
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl PostgresBackend {
    /// The connection, made again (with the schema held again) when the server dropped it.
    fn client(&mut self) -> Result<&mut Client, String> {
        if self.client.is_closed() {
            self.client = connect(&self.place)?;
            self.statements = Statements::default();
        }
        Ok(&mut self.client)
    }
}

/// One batch, as columns: each statement sends its rows as arrays in one round trip.
/// `shared`: the schema replicas share, and this replica (see [`super::postgres_shared`]).
fn write(
    tx: &mut Transaction<'_>,
    statements: &mut Statements,
    batch: &Batch,
    shared: Option<(&str, &str)>,
) -> Result<(), postgres::Error> {
    if !batch.tasks.is_empty() {
        // A task twice in one batch (memory let go of it, and it changed): the later wins.
        let mut latest: HashMap<&str, &super::Snapshot> = HashMap::new();
        for row in &batch.tasks {
            latest.insert(&row.id, row);
        }
        let rows: Vec<&super::Snapshot> = latest.into_values().collect();
        let seqs: Vec<i64> = rows.iter().map(|r| r.seq as i64).collect();
        let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        let agents: Vec<&str> = rows.iter().map(|r| &*r.agent).collect();
        let owners: Vec<&str> = rows.iter().map(|r| &*r.owner).collect();
        let versions: Vec<i64> = rows.iter().map(|r| r.version as i64).collect();
        let states: Vec<&str> = rows.iter().map(|r| r.state.v03_name()).collect();
        let finished: Vec<bool> = rows.iter().map(|r| r.state.is_terminal()).collect();
        let bodies: Vec<&str> = rows.iter().map(|r| r.body.as_str()).collect();
        let replica = shared.map_or("", |(_, replica)| replica);
        statements.execute(
            tx,
            "INSERT INTO tasks (seq, id, agent, owner, version, state, body, finished, replica, written_ms)
             SELECT t.*, $9::text, $10::bigint FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::bool[]) AS t
             ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, agent = excluded.agent,
               owner = excluded.owner, version = excluded.version, state = excluded.state,
               body = excluded.body, finished = excluded.finished, replica = excluded.replica,
               written_ms = excluded.written_ms",
            &[&seqs, &ids, &agents, &owners, &versions, &states, &bodies, &finished, &replica, &now_ms()],
        )?;
    }
    // A replica's memory letting a task go says nothing about the shared schema: finished
    // tasks leave it past retention instead.
    if !batch.removed.is_empty() && shared.is_none() {
        let (ids, seqs): (Vec<&str>, Vec<i64>) = batch
            .removed
            .iter()
            .map(|(id, seq)| (id.as_str(), *seq as i64))
            .unzip();
        statements.execute(tx, "DELETE FROM tasks WHERE seq = ANY($1)", &[&seqs])?;
        statements.execute(tx, "DELETE FROM events WHERE task_id = ANY($1)", &[&ids])?;
    }
    if let (Some((channel, _)), false) = (shared, batch.events.is_empty()) {
        // Sent when the transaction commits, in order, with the tasks they changed.
        let mut payloads = Vec::with_capacity(batch.events.len());
        for (id, version, event, _) in &batch.events {
            let published = super::redis::Published {
                version: *version,
                event: PublishedEvent::from(event.as_ref()),
            };
            let json = serde_json::to_string(&published).unwrap_or_default();
            payloads.push(match inline('e', id, &json) {
                Some(payload) => payload,
                None => {
                    let note: i64 = statements
                        .query_one(
                            tx,
                            "INSERT INTO notes (body, written_ms) VALUES ($1, $2) RETURNING id",
                            &[&json, &now_ms()],
                        )?
                        .get(0);
                    noted('e', id, note)
                }
            });
        }
        statements.execute(
            tx,
            "SELECT pg_notify($1, p) FROM unnest($2::text[]) WITH ORDINALITY AS t(p, n) ORDER BY n",
            &[&channel, &payloads],
        )?;
    }
    let logged: Vec<_> = batch.events.iter().filter(|e| e.3).collect();
    if !logged.is_empty() {
        let mut kept: HashMap<(&str, i64), String> = HashMap::new();
        // The oldest version each task keeps.
        let mut oldest: HashMap<&str, i64> = HashMap::new();
        for (id, version, event, _) in logged {
            let body =
                serde_json::to_string(&PublishedEvent::from(event.as_ref())).unwrap_or_default();
            kept.insert((id.as_str(), *version as i64), body);
            let floor = *version as i64 - super::RESUME_EVENTS as i64;
            let entry = oldest.entry(id.as_str()).or_insert(floor);
            *entry = (*entry).max(floor);
        }
        let mut cols: (Vec<&str>, Vec<i64>, Vec<&str>) = Default::default();
        for ((id, version), body) in &kept {
            cols.0.push(id);
            cols.1.push(*version);
            cols.2.push(body);
        }
        statements.execute(
            tx,
            "INSERT INTO events (task_id, version, body)
             SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[])
             ON CONFLICT (task_id, version) DO UPDATE SET body = excluded.body",
            &[&cols.0, &cols.1, &cols.2],
        )?;
        let (ids, floors): (Vec<&str>, Vec<i64>) = oldest.into_iter().filter(|f| f.1 > 0).unzip();
        if !ids.is_empty() {
            statements.execute(
                tx,
                "DELETE FROM events e USING unnest($1::text[], $2::bigint[]) AS t(id, floor)
                 WHERE e.task_id = t.id AND e.version <= t.floor",
                &[&ids, &floors],
            )?;
        }
    }
    if !batch.records.is_empty() {
        let mut cols: (Vec<&str>, Vec<&str>, Vec<&str>) = Default::default();
        for (table, key, value) in &batch.records {
            cols.0.push(table.name());
            cols.1.push(key);
            cols.2.push(value);
        }
        statements.execute(
            tx,
            "INSERT INTO records (tbl, key, value, written_ms)
             SELECT t.tbl, t.key, t.value, $4 FROM unnest($1::text[], $2::text[], $3::text[]) AS t(tbl, key, value)
             ON CONFLICT (tbl, key) DO UPDATE SET value = excluded.value, written_ms = excluded.written_ms",
            &[&cols.0, &cols.1, &cols.2, &now_ms()],
        )?;
    }
    Ok(())
}

impl Backend for PostgresBackend {
    fn commit(&mut self, batch: &Batch) -> Result<(), String> {
        let (replica, schema) = (self.replica.clone(), self.place.schema.clone());
        let once = |me: &mut PostgresBackend| -> Result<Result<(), postgres::Error>, String> {
            me.client()?;
            let mut tx = match me.client.transaction() {
                Ok(tx) => tx,
                Err(e) => return Ok(Err(e)),
            };
            let shared = replica.as_deref().map(|r| (schema.as_str(), r));
            Ok(write(&mut tx, &mut me.statements, batch, shared).and_then(|()| tx.commit()))
        };
        let done = match once(self)? {
            // The server dropped the connection (restarted, or an operator ended it): a
            // new one is tried at once, so that answers waiting for this commit need not
            // fail.
            Err(_) if self.client.is_closed() => once(self)?,
            done => done,
        };
        done.map_err(|e| failed(&self.place, &e))
    }

    fn control(&mut self, op: super::control::Op) -> Result<super::control::Reply, String> {
        let done = control(self.client()?, op);
        done.map_err(|e| failed(&self.place, &e))
    }

    fn maintain(&mut self) -> Result<(), String> {
        let retention_secs = self.retention_secs;
        let shared = self.place.shared;
        let client = self.client()?;
        let mut done = prune_records(client, retention_secs);
        if shared && done.is_ok() {
            done = prune_shared(client, retention_secs);
        }
        done.map_err(|e| failed(&self.place, &e))
    }
}

/// Deletes records past retention, and past [`RECORDS_PER_TABLE`] per table, oldest first.
/// PostgreSQL's autovacuum gives the space of deleted rows back.
fn prune_records(client: &mut Client, retention_secs: u64) -> Result<(), postgres::Error> {
    for table in Table::ALL {
        if retention_secs > 0 {
            let cutoff = now_ms() - (retention_secs as i64).saturating_mul(1000);
            client.execute(
                "DELETE FROM records WHERE tbl = $1 AND written_ms < $2",
                &[&table.name(), &cutoff],
            )?;
        }
        let newest_kept = client.query_opt(
            "SELECT written_ms FROM records WHERE tbl = $1
             ORDER BY written_ms DESC LIMIT 1 OFFSET $2",
            &[&table.name(), &RECORDS_PER_TABLE],
        )?;
        if let Some(row) = newest_kept {
            client.execute(
                "DELETE FROM records WHERE tbl = $1 AND written_ms <= $2",
                &[&table.name(), &row.get::<_, i64>(0)],
            )?;
        }
    }
    Ok(())
}

/// One admin-store operation, in a transaction of its own.
fn control(
    client: &mut Client,
    op: super::control::Op,
) -> Result<super::control::Reply, postgres::Error> {
    use super::control::{AuditRow, Entry, Op, Reply, Written, AUDIT_KEPT};
    let mut tx = client.transaction()?;
    let reply = match op {
        Op::List(kind) => {
            let rows = tx.query(
                "SELECT name, version, value FROM control WHERE kind = $1 ORDER BY name",
                &[&kind.name()],
            )?;
            Reply::Entries(
                rows.into_iter()
                    .map(|r| Entry {
                        name: r.get(0),
                        version: r.get::<_, i64>(1).max(0) as u64,
                        value: r.get(2),
                    })
                    .collect(),
            )
        }
        Op::Put(kind, name, value, expect) => {
            // One writer of an entry at a time, whichever replica's: FOR UPDATE below locks
            // nothing while the entry does not exist yet.
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtext('a2a-control:' || $1 || '/' || $2))",
                &[&kind.name(), &name],
            )?;
            let current: Option<u64> = tx
                .query_opt(
                    "SELECT version FROM control WHERE kind = $1 AND name = $2 FOR UPDATE",
                    &[&kind.name(), &name],
                )?
                .map(|r| r.get::<_, i64>(0).max(0) as u64);
            if !expect.holds(current) {
                return Ok(Reply::Written(Written::Conflict(current)));
            }
            let version = match value {
                Some(value) => {
                    let version = current.unwrap_or(0) + 1;
                    tx.execute(
                        "INSERT INTO control (kind, name, version, value) VALUES ($1, $2, $3, $4)
                         ON CONFLICT (kind, name) DO UPDATE SET version = excluded.version, value = excluded.value",
                        &[&kind.name(), &name, &(version as i64), &value],
                    )?;
                    version
                }
                None => {
                    tx.execute(
                        "DELETE FROM control WHERE kind = $1 AND name = $2",
                        &[&kind.name(), &name],
                    )?;
                    0
                }
            };
            tx.execute(
                "UPDATE control_changes SET changes = changes + 1 WHERE id = 1",
                &[],
            )?;
            Reply::Written(Written::Done(version))
        }
        Op::Append(entry) => {
            let seq: i64 = tx
                .query_one(
                    "INSERT INTO audit (entry) VALUES ($1) RETURNING seq",
                    &[&entry],
                )?
                .get(0);
            tx.execute(
                "DELETE FROM audit WHERE seq <= $1",
                &[&(seq - AUDIT_KEPT as i64)],
            )?;
            Reply::Seq(seq.max(0) as u64)
        }
        Op::Audit { before, limit } => {
            let before = before.map_or(i64::MAX, |b| b as i64);
            let rows = tx.query(
                "SELECT seq, entry FROM audit WHERE seq < $1 ORDER BY seq DESC LIMIT $2",
                &[&before, &(limit as i64)],
            )?;
            Reply::Audit(
                rows.into_iter()
                    .map(|r| AuditRow {
                        seq: r.get::<_, i64>(0).max(0) as u64,
                        entry: r.get(1),
                    })
                    .collect(),
            )
        }
        Op::Version => Reply::Version(
            tx.query_one("SELECT changes FROM control_changes WHERE id = 1", &[])?
                .get::<_, i64>(0)
                .max(0) as u64,
        ),
        Op::Used(used) => {
            for (id, at) in used {
                tx.execute(
                    "INSERT INTO key_used (id, at_ms) VALUES ($1, $2)
                     ON CONFLICT (id) DO UPDATE SET at_ms = GREATEST(key_used.at_ms, excluded.at_ms)",
                    &[&id, &at],
                )?;
            }
            Reply::Used(Vec::new())
        }
        Op::UsedAll => Reply::Used(
            tx.query("SELECT id, at_ms FROM key_used", &[])?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect(),
        ),
        Op::Counters(op) => Reply::Counters(super::counters::on_postgres(&mut tx, op)?),
    };
    tx.commit()?;
    Ok(reply)
}

/// Replicas sharing a schema (see [`super::postgres_shared`]): what their writer sends and
/// deletes.
/// Notification payloads stay under PostgreSQL's 8,000-byte limit.
const INLINE_MAX: usize = 7_000;

/// The payload of a notification of `kind` about `head` with `body`, if it fits.
pub(super) fn inline(kind: char, head: &str, body: &str) -> Option<String> {
    (body.len() <= INLINE_MAX).then(|| format!("{kind} {head} {body}"))
}

/// The payload naming the note `id` that holds the body.
pub(super) fn noted(kind: char, head: &str, id: i64) -> String {
    format!("{kind} {head} #{id}")
}

/// Housekeeping of a schema replicas share (about once a minute): finished tasks past
/// retention, and what expired beside them.
pub(super) fn prune_shared(
    client: &mut postgres::Client,
    retention_secs: u64,
) -> Result<(), postgres::Error> {
    let now = now_ms();
    if retention_secs > 0 {
        let cutoff = now - (retention_secs as i64).saturating_mul(1000);
        client.execute(
            "WITH gone AS (DELETE FROM tasks WHERE finished AND written_ms < $1 RETURNING id)
             DELETE FROM events WHERE task_id IN (SELECT id FROM gone)",
            &[&cutoff],
        )?;
    }
    client.execute(
        "DELETE FROM notes WHERE written_ms < $1",
        &[&(now - 600_000)],
    )?;
    client.execute(
        "DELETE FROM rates WHERE tat < $1",
        &[&now.saturating_mul(1000)],
    )?;
    client.execute("DELETE FROM unfinished WHERE expires_ms < $1", &[&now])?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod testing {
    //! A schema of the test's own in the local PostgreSQL, dropped when the test is done.

    /// The server the tests use: `POSTGRES_URL`, or the local one (trust auth, database
    /// `test`). A test that needs it fails when it does not answer.
    pub(crate) fn url() -> String {
        std::env::var("POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    }

    /// A fresh schema name, `a2a_test_<hex>`.
    pub(crate) fn schema_name() -> String {
        format!("a2a_test_{}", uuid::Uuid::new_v4().simple())
    }

    /// Drops the schema `name` (and only it), when the test that made it ends.
    pub(crate) struct Schema(pub(crate) String);

    impl Drop for Schema {
        fn drop(&mut self) {
            let url = url();
            let name = self.0.clone();
            // The client's runtime cannot run inside a test's.
            let _ = std::thread::spawn(move || {
                if let Ok(mut c) = postgres::Client::connect(&url, postgres::NoTls) {
                    let _ = c.batch_execute(&format!(
                        "DROP SCHEMA IF EXISTS {} CASCADE",
                        super::quoted(&name)
                    ));
                }
            })
            .join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{schema_name, url, Schema};
    use super::*;

    fn place(schema: &Schema) -> Place {
        Place {
            url: url(),
            schema: schema.0.clone(),
            shared: false,
        }
    }

    fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().unwrap()
    }

    #[test]
    fn a_newer_schema_is_refused_untouched() {
        let schema = Schema(schema_name());
        let at = place(&schema);
        drop(open(&at, 0, None).unwrap());
        let bump = at.clone();
        on_thread(move || {
            let mut c = connect(&bump).unwrap();
            c.execute("UPDATE schema_version SET version = 99", &[])
                .unwrap();
        });
        let err = open(&at, 0, None).err().unwrap();
        assert!(
            err.contains("newer a2a-gateway (schema version 99"),
            "{err}"
        );
        let version: i32 = on_thread(move || {
            connect(&at)
                .unwrap()
                .query_one("SELECT version FROM schema_version", &[])
                .unwrap()
                .get(0)
        });
        assert_eq!(version, 99);
    }

    #[test]
    fn a_second_gateway_on_the_same_schema_is_refused() {
        let schema = Schema(schema_name());
        let at = place(&schema);
        let (_held, _) = open(&at, 0, None).unwrap();
        let err = open(&at, 0, None).err().unwrap();
        assert!(err.contains("in use by another gateway"), "{err}");
    }

    #[test]
    fn an_unreachable_server_is_named_without_its_password() {
        let refusing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = refusing.local_addr().unwrap().port();
        drop(refusing);
        let at = Place {
            url: format!("postgres://me:secret@127.0.0.1:{port}/db"),
            schema: "s".into(),
            shared: false,
        };
        let err = open(&at, 0, None).err().unwrap();
        assert!(err.contains("cannot reach PostgreSQL at"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn records_past_the_cap_are_deleted_oldest_first() {
        let schema = Schema(schema_name());
        let (mut db, _) = open(&place(&schema), 0, None).unwrap();
        let n = RECORDS_PER_TABLE + 5;
        on_thread(move || {
            db.client
                .execute(
                    "INSERT INTO records SELECT 'contexts', 'k' || i, 'a', i FROM generate_series(0, $1::bigint - 1) AS i",
                    &[&n],
                )
                .unwrap();
            db.maintain().unwrap();
            let row = db
                .client
                .query_one(
                    "SELECT count(*), min(written_ms) FROM records WHERE tbl = 'contexts'",
                    &[],
                )
                .unwrap();
            assert_eq!(row.get::<_, i64>(0), RECORDS_PER_TABLE);
            assert_eq!(row.get::<_, i64>(1), 5);
        });
    }
}

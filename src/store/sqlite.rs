//! The SQLite store: one file, `<data_dir>/gateway.db`, in WAL mode with `synchronous=FULL`
//! (each group commit is on disk when it returns, power loss included), held exclusively
//! by one gateway process.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::redis::PublishedEvent;
use super::{Backend, Batch, Loaded, Table, TaskRow};
use crate::protocol::model::{Task, TaskEvent};

pub(crate) const FILE_NAME: &str = "gateway.db";

/// Each entry takes the schema from its index to the next version (entry 0 makes version
/// 1). Never edit a shipped entry: add one.
const MIGRATIONS: &[&str] = &[
    // Version 1. A task is kept as its A2A 1.0 JSON; the columns beside it are what
    // loading and housekeeping look at.
    // Keyed by creation order: new tasks append to the table's b-tree instead of landing
    // at random places in it (as UUID keys would), several times faster to write.
    "CREATE TABLE tasks (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL,
        agent TEXT NOT NULL,
        owner TEXT NOT NULL,
        version INTEGER NOT NULL,
        state TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE TABLE records (
        tbl TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        written_ms INTEGER NOT NULL,
        PRIMARY KEY (tbl, key)
    ) WITHOUT ROWID;
    CREATE INDEX records_by_age ON records (tbl, written_ms);",
    // Version 2. The latest events of streamed tasks, for resuming their streams after a
    // restart: each as its JSON ({"status": ...} or {"artifact": ...}).
    "CREATE TABLE events (
        task_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (task_id, version)
    ) WITHOUT ROWID;",
    // Version 3. What the admin API keeps: agents and keys made at runtime (each its JSON
    // with a version of its own), the audit log, how many changes they have seen, and
    // when each key was last used.
    "CREATE TABLE control (
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        version INTEGER NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (kind, name)
    ) WITHOUT ROWID;
    CREATE TABLE audit (seq INTEGER PRIMARY KEY, entry TEXT NOT NULL);
    CREATE TABLE control_changes (id INTEGER PRIMARY KEY CHECK (id = 1), changes INTEGER NOT NULL);
    INSERT INTO control_changes (id, changes) VALUES (1, 0);
    CREATE TABLE key_used (id TEXT PRIMARY KEY, at_ms INTEGER NOT NULL) WITHOUT ROWID;",
    // Version 4. Counters: usage per day, what budgets spent per window (`store::counters`).
    "CREATE TABLE counters (
        grp TEXT NOT NULL,
        key TEXT NOT NULL,
        field TEXT NOT NULL,
        amount INTEGER NOT NULL,
        expires_ms INTEGER NOT NULL,
        PRIMARY KEY (grp, key, field)
    ) WITHOUT ROWID;
    CREATE INDEX counters_expiry ON counters (expires_ms);",
];

/// Records kept per table (the newest), as many as the memory maps they fill hold.
const RECORDS_PER_TABLE: i64 = 100_000;

pub(crate) struct SqliteBackend {
    conn: Connection,
    retention_secs: u64,
}

/// Opens (creating) the database in `dir`, brings its schema up to date and reads what it
/// holds. Errors name the file and what to do.
pub(crate) fn open(dir: &Path, retention_secs: u64) -> Result<(SqliteBackend, Loaded), String> {
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "store: cannot create the data directory {}: {e}",
            dir.display()
        )
    })?;
    let path = dir.join(FILE_NAME);
    let fail = |e: rusqlite::Error| describe(&path, e);
    let mut conn = Connection::open(&path).map_err(fail)?;
    // Long enough for a gateway that is exiting to let go, short enough to say so at once.
    conn.busy_timeout(std::time::Duration::from_secs(1))
        .map_err(fail)?;
    // auto_vacuum only takes effect before the first table exists: new files get it.
    conn.execute_batch(
        "PRAGMA auto_vacuum = INCREMENTAL;
         PRAGMA locking_mode = EXCLUSIVE;",
    )
    .map_err(fail)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(fail)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!(
            "store: {} cannot use WAL mode (got {mode})",
            path.display()
        ));
    }
    // A larger page cache keeps the b-trees' upper levels in memory between batches.
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA cache_size = -32768;")
        .map_err(fail)?;
    migrate(&mut conn, &path)?;
    let loaded = load(&conn).map_err(fail)?;
    Ok((
        SqliteBackend {
            conn,
            retention_secs,
        },
        loaded,
    ))
}

fn describe(path: &Path, e: rusqlite::Error) -> String {
    if let rusqlite::Error::SqliteFailure(f, _) = &e {
        if f.code == rusqlite::ErrorCode::DatabaseBusy
            || f.code == rusqlite::ErrorCode::DatabaseLocked
        {
            return format!(
                "store: {} is in use by another process (one gateway per data_dir)",
                path.display()
            );
        }
    }
    format!("store: {}: {e}", path.display())
}

/// Applies the migrations the file lacks, in one transaction (which also takes the file's
/// exclusive lock). A file from a newer gateway is refused, untouched.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), String> {
    let fail = |e: rusqlite::Error| describe(path, e);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Exclusive)
        .map_err(fail)?;
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(fail)?;
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(format!(
            "store: {} was written by a newer a2a-gateway (schema version {version}; this one knows versions up to {known}). Run the newer gateway, or point data_dir elsewhere.",
            path.display()
        ));
    }
    for (i, step) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        tx.execute_batch(step).map_err(fail)?;
        tx.pragma_update(None, "user_version", i as i64 + 1)
            .map_err(fail)?;
    }
    tx.commit().map_err(fail)
}

fn load(conn: &Connection) -> rusqlite::Result<Loaded> {
    let mut loaded = Loaded::default();
    let mut rows =
        conn.prepare("SELECT agent, owner, seq, version, body FROM tasks ORDER BY seq")?;
    let mut unreadable = 0usize;
    let tasks = rows.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, String>(4)?,
        ))
    })?;
    let mut events = load_events(conn)?;
    for row in tasks {
        let (agent, owner, seq, version, body) = row?;
        match serde_json::from_str::<Task>(&body) {
            Ok(task) => loaded.tasks.push(TaskRow {
                events: events.remove(&task.id).unwrap_or_default(),
                task,
                agent: agent.into(),
                owner: owner.into(),
                seq: seq.max(0) as u64,
                version: version.max(0) as u64,
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
    let mut records =
        conn.prepare("SELECT key, value FROM records WHERE tbl = ?1 ORDER BY written_ms")?;
    for table in Table::ALL {
        let entries = records
            .query_map([table.name()], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<(String, String)>>>()?;
        loaded.records.insert(table, entries);
    }
    Ok(loaded)
}

/// Streamed tasks' kept events, by task, oldest first.
fn load_events(
    conn: &Connection,
) -> rusqlite::Result<std::collections::HashMap<String, Vec<(u64, TaskEvent)>>> {
    let mut by_task: std::collections::HashMap<String, Vec<(u64, TaskEvent)>> = Default::default();
    let mut rows =
        conn.prepare("SELECT task_id, version, body FROM events ORDER BY task_id, version")?;
    let events = rows.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, String>(2)?,
        ))
    })?;
    for event in events {
        let (task, version, body) = event?;
        if let Ok(event) = serde_json::from_str::<PublishedEvent>(&body) {
            let event = TaskEvent::from(event);
            by_task
                .entry(task)
                .or_default()
                .push((version.max(0) as u64, event));
        }
    }
    Ok(by_task)
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Backend for SqliteBackend {
    fn commit(&mut self, batch: &Batch) -> Result<(), String> {
        let tx = self.conn.transaction().map_err(|e| e.to_string())?;
        {
            let mut put = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO tasks (seq, id, agent, owner, version, state, body)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(|e| e.to_string())?;
            for row in &batch.tasks {
                put.execute(params![
                    row.seq as i64,
                    row.id,
                    &*row.agent,
                    &*row.owner,
                    row.version as i64,
                    row.state.v03_name(),
                    row.body
                ])
                .map_err(|e| e.to_string())?;
            }
            let mut remove = tx
                .prepare_cached("DELETE FROM tasks WHERE seq = ?1")
                .map_err(|e| e.to_string())?;
            let mut forget = tx
                .prepare_cached("DELETE FROM events WHERE task_id = ?1")
                .map_err(|e| e.to_string())?;
            for (id, seq) in &batch.removed {
                remove.execute([*seq as i64]).map_err(|e| e.to_string())?;
                forget.execute([id]).map_err(|e| e.to_string())?;
            }
            let mut keep = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO events (task_id, version, body) VALUES (?1, ?2, ?3)",
                )
                .map_err(|e| e.to_string())?;
            let mut trim = tx
                .prepare_cached("DELETE FROM events WHERE task_id = ?1 AND version <= ?2")
                .map_err(|e| e.to_string())?;
            for (id, version, event, logged) in &batch.events {
                if !logged {
                    continue;
                }
                let body = serde_json::to_string(&PublishedEvent::from(event.as_ref()))
                    .map_err(|e| e.to_string())?;
                keep.execute(params![id, *version as i64, body])
                    .map_err(|e| e.to_string())?;
                let oldest = *version as i64 - super::RESUME_EVENTS as i64;
                if oldest > 0 {
                    trim.execute(params![id, oldest])
                        .map_err(|e| e.to_string())?;
                }
            }
            let mut record = tx
                .prepare_cached(
                    "INSERT INTO records (tbl, key, value, written_ms) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (tbl, key) DO UPDATE SET value = excluded.value, written_ms = excluded.written_ms",
                )
                .map_err(|e| e.to_string())?;
            let now = now_ms();
            for (table, key, value) in &batch.records {
                record
                    .execute(params![table.name(), key, value, now])
                    .map_err(|e| e.to_string())?;
            }
        }
        tx.commit().map_err(|e| e.to_string())
    }

    fn control(&mut self, op: super::control::Op) -> Result<super::control::Reply, String> {
        control(&mut self.conn, op).map_err(|e| e.to_string())
    }

    fn maintain(&mut self) -> Result<(), String> {
        let fail = |e: rusqlite::Error| e.to_string();
        for table in Table::ALL {
            if self.retention_secs > 0 {
                let cutoff = now_ms() - (self.retention_secs as i64).saturating_mul(1000);
                self.conn
                    .execute(
                        "DELETE FROM records WHERE tbl = ?1 AND written_ms < ?2",
                        params![table.name(), cutoff],
                    )
                    .map_err(fail)?;
            }
            let newest_kept: Option<i64> = self
                .conn
                .query_row(
                    "SELECT written_ms FROM records WHERE tbl = ?1
                     ORDER BY written_ms DESC LIMIT 1 OFFSET ?2",
                    params![table.name(), RECORDS_PER_TABLE],
                    |r| r.get(0),
                )
                .optional()
                .map_err(fail)?;
            if let Some(cutoff) = newest_kept {
                self.conn
                    .execute(
                        "DELETE FROM records WHERE tbl = ?1 AND written_ms <= ?2",
                        params![table.name(), cutoff],
                    )
                    .map_err(fail)?;
            }
        }
        // Gives the pages of deleted rows back to the file system a little at a time.
        self.conn
            .execute_batch("PRAGMA incremental_vacuum(1000);")
            .map_err(fail)
    }
}

/// One admin-store operation, in a transaction of its own.
fn control(
    conn: &mut Connection,
    op: super::control::Op,
) -> rusqlite::Result<super::control::Reply> {
    use super::control::{AuditRow, Entry, Op, Reply, Written, AUDIT_KEPT};
    let tx = conn.transaction()?;
    let reply = match op {
        Op::List(kind) => {
            let mut rows = tx.prepare_cached(
                "SELECT name, version, value FROM control WHERE kind = ?1 ORDER BY name",
            )?;
            let entries = rows
                .query_map([kind.name()], |r| {
                    Ok(Entry {
                        name: r.get(0)?,
                        version: r.get::<_, i64>(1)?.max(0) as u64,
                        value: r.get(2)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Reply::Entries(entries)
        }
        Op::Put(kind, name, value, expect) => {
            let current: Option<u64> = tx
                .query_row(
                    "SELECT version FROM control WHERE kind = ?1 AND name = ?2",
                    params![kind.name(), name],
                    |r| r.get::<_, i64>(0),
                )
                .optional()?
                .map(|v| v.max(0) as u64);
            if !expect.holds(current) {
                return Ok(Reply::Written(Written::Conflict(current)));
            }
            let version = match value {
                Some(value) => {
                    let version = current.unwrap_or(0) + 1;
                    tx.execute(
                        "INSERT OR REPLACE INTO control (kind, name, version, value) VALUES (?1, ?2, ?3, ?4)",
                        params![kind.name(), name, version as i64, value],
                    )?;
                    version
                }
                None => {
                    tx.execute(
                        "DELETE FROM control WHERE kind = ?1 AND name = ?2",
                        params![kind.name(), name],
                    )?;
                    0
                }
            };
            tx.execute(
                "UPDATE control_changes SET changes = changes + 1 WHERE id = 1",
                [],
            )?;
            Reply::Written(Written::Done(version))
        }
        Op::Append(entry) => {
            tx.execute("INSERT INTO audit (entry) VALUES (?1)", [entry])?;
            let seq = tx.last_insert_rowid();
            tx.execute(
                "DELETE FROM audit WHERE seq <= ?1",
                [seq - AUDIT_KEPT as i64],
            )?;
            Reply::Seq(seq.max(0) as u64)
        }
        Op::Audit { before, limit } => {
            let mut rows = tx.prepare_cached(
                "SELECT seq, entry FROM audit WHERE seq < ?1 ORDER BY seq DESC LIMIT ?2",
            )?;
            let before = before.map_or(i64::MAX, |b| b as i64);
            let page = rows
                .query_map(params![before, limit as i64], |r| {
                    Ok(AuditRow {
                        seq: r.get::<_, i64>(0)?.max(0) as u64,
                        entry: r.get(1)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Reply::Audit(page)
        }
        Op::Version => Reply::Version(tx.query_row(
            "SELECT changes FROM control_changes WHERE id = 1",
            [],
            |r| r.get::<_, i64>(0).map(|v| v.max(0) as u64),
        )?),
        Op::Used(used) => {
            for (id, at) in used {
                tx.execute(
                    "INSERT INTO key_used (id, at_ms) VALUES (?1, ?2)
                     ON CONFLICT (id) DO UPDATE SET at_ms = max(at_ms, excluded.at_ms)",
                    params![id, at],
                )?;
            }
            Reply::Used(Vec::new())
        }
        Op::UsedAll => {
            let mut rows = tx.prepare_cached("SELECT id, at_ms FROM key_used")?;
            let all = rows
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Reply::Used(all)
        }
        Op::Counters(op) => Reply::Counters(super::counters::on_sqlite(&tx, op)?),
    };
    tx.commit()?;
    Ok(reply)
}

/// The database file in `dir`.
pub(crate) fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_schema_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path(), 0).unwrap());
        let conn = Connection::open(path_in(dir.path())).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        let err = open(dir.path(), 0).err().unwrap();
        assert!(
            err.contains("newer a2a-gateway (schema version 99"),
            "{err}"
        );
        let conn = Connection::open(path_in(dir.path())).unwrap();
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, 99);
    }

    #[test]
    fn a_second_process_on_the_same_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_held, _) = open(dir.path(), 0).unwrap();
        let err = open(dir.path(), 0).err().unwrap();
        assert!(err.contains("in use by another process"), "{err}");
    }

    #[test]
    fn records_past_the_cap_are_deleted_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let (mut db, _) = open(dir.path(), 0).unwrap();
        let n = RECORDS_PER_TABLE + 5;
        {
            let tx = db.conn.transaction().unwrap();
            for i in 0..n {
                tx.execute(
                    "INSERT INTO records VALUES ('contexts', ?1, 'a', ?2)",
                    params![format!("k{i}"), i],
                )
                .unwrap();
            }
            tx.commit().unwrap();
        }
        db.maintain().unwrap();
        let (count, oldest): (i64, String) = db
            .conn
            .query_row(
                "SELECT count(*), min(written_ms) FROM records WHERE tbl = 'contexts'",
                [],
                |r| Ok((r.get(0)?, r.get::<_, i64>(1)?.to_string())),
            )
            .unwrap();
        assert_eq!(count, RECORDS_PER_TABLE);
        assert_eq!(oldest, "5");
    }
}

//! What the admin API keeps: the agents and keys made at runtime, their audit log, and when
//! each key was last used. Kept where tasks are kept, so it holds on one node (memory,
//! SQLite) and is shared by replicas (Redis); every change counts one more `version`, which
//! replicas watch to put changes in force (see `reload::follow_control`).
//!
//! Entries are JSON text with a version of their own: a write says what it expects (the
//! entry absent, present, or at a version) and is refused when the store holds something
//! else, so two replicas creating one name at once do not both succeed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::counters::{CounterOp, CounterReply, MemoryCounters};
use super::Journal;

/// What a control entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Agent,
    Key,
    Budget,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Agent => "agent",
            Kind::Key => "key",
            Kind::Budget => "budget",
        }
    }
}

/// One entry: its name, its version (1 for a new one, one more per write) and its JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) version: u64,
    pub(crate) value: String,
}

/// What a write expects to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    Absent,
    Version(u64),
}

impl Expect {
    pub(crate) fn holds(self, current: Option<u64>) -> bool {
        match (self, current) {
            (Expect::Absent, None) => true,
            (Expect::Version(want), Some(v)) => want == v,
            _ => false,
        }
    }
}

/// A write's outcome: done (the entry's new version; 0 when deleted), or refused with the
/// version found (None: absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    Done(u64),
    Conflict(Option<u64>),
}

/// One audit entry as kept: its number (increasing) and its JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AuditRow {
    pub(crate) seq: u64,
    pub(crate) entry: String,
}

/// One audit entry: who did what to what, from where, when, and a digest of the entry
/// before and after (the SHA-256 of its JSON; none where there was none).
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub(crate) struct AuditEntry {
    /// Its number in the log: later entries have larger ones (set when read back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) seq: Option<u64>,
    /// When, RFC 3339.
    pub(crate) at: String,
    /// Who: `admin-key:<id>`, `jwt:<issuer>:<sub>` (an admin); `key:<id>` for a runtime
    /// key's refusal.
    pub(crate) actor: String,
    /// `agent.create`, `agent.update`, `agent.delete`, `agent.enable`, `agent.disable`,
    /// `key.create`, `key.rotate`, `key.revoke`, `key.refused`.
    pub(crate) action: String,
    /// `agent:<name>` or `key:<id>`.
    pub(crate) target: String,
    /// The client's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) after: Option<String>,
    /// What else there is to say (a refusal's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) detail: Option<String>,
}

/// The SHA-256 of an entry's JSON, as the audit log holds it.
pub(crate) fn digest_of(value: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(value.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Audit entries kept (the oldest go first).
pub(crate) const AUDIT_KEPT: u64 = 100_000;

/// One operation, as the SQLite writer thread runs it.
#[derive(Debug)]
pub(crate) enum Op {
    List(Kind),
    /// A new value, or None to delete.
    Put(Kind, String, Option<String>, Expect),
    Append(String),
    /// Entries numbered below `before` (all: None), newest first, at most `limit`.
    Audit {
        before: Option<u64>,
        limit: usize,
    },
    Version,
    Used(Vec<(String, i64)>),
    UsedAll,
    /// Usage and budget counters (`store::counters`).
    Counters(CounterOp),
}

#[derive(Debug)]
pub(crate) enum Reply {
    Entries(Vec<Entry>),
    Written(Written),
    Seq(u64),
    Audit(Vec<AuditRow>),
    Version(u64),
    Used(Vec<(String, i64)>),
    Counters(CounterReply),
}

/// Where control entries are kept.
#[derive(Clone)]
pub(crate) struct Control {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Memory(Arc<Mutex<Memory>>),
    /// SQLite: through the writer thread, which holds the file.
    Journal(Journal),
    Redis(Arc<super::redis::Shared>),
}

impl Control {
    /// Kept in this process only (the memory store).
    pub(crate) fn memory() -> Control {
        Control {
            inner: Inner::Memory(Default::default()),
        }
    }

    pub(crate) fn journal(journal: Journal) -> Control {
        Control {
            inner: Inner::Journal(journal),
        }
    }

    pub(crate) fn redis(shared: Arc<super::redis::Shared>) -> Control {
        Control {
            inner: Inner::Redis(shared),
        }
    }

    async fn run(&self, op: Op) -> Result<Reply, String> {
        match &self.inner {
            Inner::Memory(m) => Ok(m.lock().unwrap_or_else(|e| e.into_inner()).apply(op)),
            Inner::Journal(j) => j.control(op).await,
            Inner::Redis(shared) => on_redis(shared, op).await,
        }
    }

    pub(crate) async fn list(&self, kind: Kind) -> Result<Vec<Entry>, String> {
        match self.run(Op::List(kind)).await? {
            Reply::Entries(e) => Ok(e),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    pub(crate) async fn get(&self, kind: Kind, name: &str) -> Result<Option<Entry>, String> {
        Ok(self.list(kind).await?.into_iter().find(|e| e.name == name))
    }

    /// Writes `value` (None: deletes) if the store holds what `expect` says.
    pub(crate) async fn put(
        &self,
        kind: Kind,
        name: &str,
        value: Option<String>,
        expect: Expect,
    ) -> Result<Written, String> {
        match self.run(Op::Put(kind, name.into(), value, expect)).await? {
            Reply::Written(w) => Ok(w),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// Appends `entry` to the audit log, and logs it as one JSON line (target
    /// `a2a_gateway::audit`); its number.
    pub(crate) async fn record(&self, entry: &AuditEntry) -> Result<u64, String> {
        let json = serde_json::to_string(entry).map_err(|e| e.to_string())?;
        tracing::info!(target: "a2a_gateway::audit", audit = %json, "audit");
        self.append(json).await
    }

    /// Appends an audit entry; its number.
    pub(crate) async fn append(&self, entry: String) -> Result<u64, String> {
        match self.run(Op::Append(entry)).await? {
            Reply::Seq(n) => Ok(n),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    pub(crate) async fn audit(
        &self,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<AuditRow>, String> {
        match self.run(Op::Audit { before, limit }).await? {
            Reply::Audit(rows) => Ok(rows),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// How many changes the entries have seen: what replicas compare.
    pub(crate) async fn version(&self) -> Result<u64, String> {
        match self.run(Op::Version).await? {
            Reply::Version(v) => Ok(v),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// Records when keys were last used (milliseconds since the epoch; the later wins).
    pub(crate) async fn used(&self, used: Vec<(String, i64)>) -> Result<(), String> {
        self.run(Op::Used(used)).await.map(|_| ())
    }

    /// A counter operation (see `store::counters`).
    pub(crate) async fn counters(&self, op: CounterOp) -> Result<CounterReply, String> {
        match self.run(Op::Counters(op)).await? {
            Reply::Counters(reply) => Ok(reply),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    pub(crate) async fn used_all(&self) -> Result<HashMap<String, i64>, String> {
        match self.run(Op::UsedAll).await? {
            Reply::Used(u) => Ok(u.into_iter().collect()),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }
}

/// The memory kind's entries.
#[derive(Default)]
pub(crate) struct Memory {
    entries: HashMap<Kind, BTreeMap<String, (u64, String)>>,
    audit: std::collections::VecDeque<AuditRow>,
    seq: u64,
    version: u64,
    used: HashMap<String, i64>,
    counters: MemoryCounters,
}

impl Memory {
    pub(crate) fn apply(&mut self, op: Op) -> Reply {
        match op {
            Op::List(kind) => Reply::Entries(
                (self.entries.get(&kind).into_iter().flatten())
                    .map(|(name, (version, value))| Entry {
                        name: name.clone(),
                        version: *version,
                        value: value.clone(),
                    })
                    .collect(),
            ),
            Op::Put(kind, name, value, expect) => {
                let table = self.entries.entry(kind).or_default();
                let current = table.get(&name).map(|(v, _)| *v);
                if !expect.holds(current) {
                    return Reply::Written(Written::Conflict(current));
                }
                self.version += 1;
                match value {
                    Some(value) => {
                        let version = current.unwrap_or(0) + 1;
                        table.insert(name, (version, value));
                        Reply::Written(Written::Done(version))
                    }
                    None => {
                        table.remove(&name);
                        Reply::Written(Written::Done(0))
                    }
                }
            }
            Op::Append(entry) => {
                self.seq += 1;
                self.audit.push_back(AuditRow {
                    seq: self.seq,
                    entry,
                });
                while self.audit.len() as u64 > AUDIT_KEPT {
                    self.audit.pop_front();
                }
                Reply::Seq(self.seq)
            }
            Op::Audit { before, limit } => Reply::Audit(
                (self.audit.iter().rev())
                    .filter(|r| before.is_none_or(|b| r.seq < b))
                    .take(limit)
                    .cloned()
                    .collect(),
            ),
            Op::Version => Reply::Version(self.version),
            Op::Used(used) => {
                for (id, at) in used {
                    let kept = self.used.entry(id).or_insert(at);
                    *kept = (*kept).max(at);
                }
                Reply::Used(Vec::new())
            }
            Op::UsedAll => Reply::Used(self.used.iter().map(|(k, v)| (k.clone(), *v)).collect()),
            Op::Counters(op) => Reply::Counters(self.counters.apply(op)),
        }
    }
}

/// A conditional write of an admin entry, atomic on the server: refused (0, the version
/// found, -1 for none) unless the entry is as expected (`absent`, `present`, or a
/// version); else written (or deleted, for an empty value), the change counted and
/// published (1, the new version).
const CONTROL_PUT: &str = r#"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local curv = -1
if cur then curv = tonumber(string.match(cur, '^(%d+)')) end
local expect = ARGV[2]
local ok = (expect == 'absent' and curv == -1)
  or (tonumber(expect) ~= nil and tonumber(expect) == curv)
if not ok then return {0, curv} end
local v = 0
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  v = math.max(curv, 0) + 1
  redis.call('HSET', KEYS[1], ARGV[1], v .. '\n' .. ARGV[3])
end
local g = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', KEYS[3], g)
return {1, v}
"#;

/// Appends an audit entry under the next number, keeping the newest.
const AUDIT_APPEND: &str = r#"
local seq = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], seq, ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[2]) + 1))
return seq
"#;

/// Records a key's last use, the later one winning.
const KEY_USED: &str = r#"
for i = 1, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > cur then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 1
"#;

/// An admin entry as Redis keeps it (`<version>\n<json>`).
fn entry_of(name: String, stored: &str) -> Option<Entry> {
    let (version, value) = stored.split_once('\n')?;
    Some(Entry {
        name,
        version: version.parse().ok()?,
        value: value.to_string(),
    })
}

/// One operation, on Redis.
async fn on_redis(shared: &super::redis::Shared, op: Op) -> Result<Reply, String> {
    use redis::AsyncCommands as _;
    static PUT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    static APPEND: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    static USED: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    let keys = &shared.keys;
    match op {
        Op::List(kind) => {
            let key = keys.control(kind.name());
            let all: Vec<(String, String)> = shared
                .with(|mut c| async move { c.hgetall(key).await })
                .await?;
            let mut entries: Vec<_> = (all.into_iter())
                .filter_map(|(name, stored)| entry_of(name, &stored))
                .collect();
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(Reply::Entries(entries))
        }
        Op::Put(kind, name, value, expect) => {
            let script = PUT.get_or_init(|| redis::Script::new(CONTROL_PUT));
            let expect = match expect {
                Expect::Absent => "absent".to_string(),
                Expect::Version(v) => v.to_string(),
            };
            let (hash, version, changed) = (
                keys.control(kind.name()),
                keys.control_version(),
                keys.control_changed(),
            );
            let value = value.unwrap_or_default();
            let (done, v): (i64, i64) = shared
                .with(|mut c| async move {
                    (script.key(hash).key(version).key(changed))
                        .arg(name)
                        .arg(expect)
                        .arg(value)
                        .invoke_async(&mut c)
                        .await
                })
                .await?;
            Ok(Reply::Written(match done {
                1 => Written::Done(v.max(0) as u64),
                _ => Written::Conflict((v >= 0).then_some(v as u64)),
            }))
        }
        Op::Append(entry) => {
            let script = APPEND.get_or_init(|| redis::Script::new(AUDIT_APPEND));
            let (log, seq) = (keys.audit(), keys.audit_seq());
            let n: u64 = shared
                .with(|mut c| async move {
                    (script.key(log).key(seq))
                        .arg(entry)
                        .arg(AUDIT_KEPT)
                        .invoke_async(&mut c)
                        .await
                })
                .await?;
            Ok(Reply::Seq(n))
        }
        Op::Audit { before, limit } => {
            let log = keys.audit();
            let max = match before {
                Some(b) => format!("({b}"),
                None => "+inf".into(),
            };
            let rows: Vec<(String, f64)> = shared
                .with(|mut c| async move {
                    redis::cmd("ZRANGE")
                        .arg(log)
                        .arg(max)
                        .arg("-inf")
                        .arg("BYSCORE")
                        .arg("REV")
                        .arg("LIMIT")
                        .arg(0)
                        .arg(limit)
                        .arg("WITHSCORES")
                        .query_async(&mut c)
                        .await
                })
                .await?;
            Ok(Reply::Audit(
                (rows.into_iter())
                    .map(|(entry, seq)| AuditRow {
                        seq: seq as u64,
                        entry,
                    })
                    .collect(),
            ))
        }
        Op::Version => {
            let key = keys.control_version();
            let v: Option<u64> = shared.with(|mut c| async move { c.get(key).await }).await?;
            Ok(Reply::Version(v.unwrap_or(0)))
        }
        Op::Used(used) => {
            if used.is_empty() {
                return Ok(Reply::Used(Vec::new()));
            }
            let script = USED.get_or_init(|| redis::Script::new(KEY_USED));
            let key = keys.key_used();
            shared
                .with(|mut c| async move {
                    let mut call = script.key(key);
                    for (id, at) in &used {
                        call.arg(id).arg(at);
                    }
                    call.invoke_async::<i64>(&mut c).await
                })
                .await?;
            Ok(Reply::Used(Vec::new()))
        }
        Op::UsedAll => {
            let key = keys.key_used();
            let all: Vec<(String, i64)> = shared
                .with(|mut c| async move { c.hgetall(key).await })
                .await?;
            Ok(Reply::Used(all))
        }
        Op::Counters(op) => super::counters::on_redis(shared, op)
            .await
            .map(Reply::Counters),
    }
}

#[cfg(test)]
pub(crate) mod conformance {
    //! What every kind of control store does, run against each.
    use super::*;
    use crate::store::counters::{now_ms, Charge, Counted, CounterOp, CounterReply};

    pub(crate) async fn entries_are_versioned_and_writes_conditional(control: &Control) {
        let v0 = control.version().await.unwrap();
        let first = control
            .put(Kind::Agent, "a", Some("{\"x\":1}".into()), Expect::Absent)
            .await
            .unwrap();
        assert_eq!(first, Written::Done(1));
        // The same name at once from elsewhere: refused, saying what is there.
        let again = control
            .put(Kind::Agent, "a", Some("{}".into()), Expect::Absent)
            .await
            .unwrap();
        assert_eq!(again, Written::Conflict(Some(1)));
        let stale = control
            .put(Kind::Agent, "a", Some("{}".into()), Expect::Version(7))
            .await
            .unwrap();
        assert_eq!(stale, Written::Conflict(Some(1)));
        let second = control
            .put(
                Kind::Agent,
                "a",
                Some("{\"x\":2}".into()),
                Expect::Version(1),
            )
            .await
            .unwrap();
        assert_eq!(second, Written::Done(2));
        let got = control.get(Kind::Agent, "a").await.unwrap().unwrap();
        assert_eq!((got.version, got.value.as_str()), (2, "{\"x\":2}"));
        assert!(control.list(Kind::Key).await.unwrap().is_empty());
        control
            .put(Kind::Key, "k", Some("{}".into()), Expect::Absent)
            .await
            .unwrap();
        let gone = control
            .put(Kind::Agent, "a", None, Expect::Version(2))
            .await;
        assert_eq!(gone.unwrap(), Written::Done(0));
        assert!(control.get(Kind::Agent, "a").await.unwrap().is_none());
        let missing = control
            .put(Kind::Agent, "a", None, Expect::Version(2))
            .await;
        assert_eq!(missing.unwrap(), Written::Conflict(None));
        assert_eq!(control.version().await.unwrap(), v0 + 4);
    }

    pub(crate) async fn the_audit_pages_newest_first(control: &Control) {
        let mut seqs = Vec::new();
        for i in 0..5 {
            seqs.push(control.append(format!("{{\"n\":{i}}}")).await.unwrap());
        }
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        let page = control.audit(None, 2).await.unwrap();
        assert_eq!(page.len(), 2);
        assert_eq!(page[0].entry, "{\"n\":4}");
        let next = control.audit(Some(page[1].seq), 10).await.unwrap();
        assert_eq!(
            next.iter().map(|r| r.entry.as_str()).collect::<Vec<_>>(),
            ["{\"n\":2}", "{\"n\":1}", "{\"n\":0}"]
        );
        control
            .used(vec![("k".into(), 10), ("j".into(), 5)])
            .await
            .unwrap();
        control.used(vec![("k".into(), 7)]).await.unwrap();
        let used = control.used_all().await.unwrap();
        assert_eq!((used["k"], used["j"]), (10, 5));
    }

    fn counted(group: &str, key: &str, field: &str, amount: i64) -> Counted {
        Counted {
            group: group.into(),
            key: key.into(),
            field: field.into(),
            amount,
            expires_ms: now_ms() + 60_000,
        }
    }

    /// Adds accumulate and are read by group; with `reserves`, a reservation takes every
    /// part or none.
    pub(crate) async fn counters_add_read_and_reserve(control: &Control, reserves: bool) {
        let values = control
            .counters(CounterOp::Add(vec![
                counted("g1", "a", "requests", 2),
                counted("g1", "a", "requests", 3),
                counted("g1", "b", "tokens", 7),
                counted("g2", "c", "requests", 1),
            ]))
            .await
            .unwrap();
        assert_eq!(values, CounterReply::Values(vec![2, 5, 7, 1]));
        let CounterReply::Rows(mut rows) = control
            .counters(CounterOp::Read(vec!["g1".into()]))
            .await
            .unwrap()
        else {
            panic!("rows expected");
        };
        rows.sort_by(|a, b| (&a.key, &a.field).cmp(&(&b.key, &b.field)));
        let read: Vec<_> = rows
            .iter()
            .map(|r| (r.key.as_str(), r.field.as_str(), r.amount))
            .collect();
        assert_eq!(read, [("a", "requests", 5), ("b", "tokens", 7)]);
        if !reserves {
            return;
        }
        let charge = |key: &str, field: &str, amount: i64, limit: i64| Charge {
            counted: counted("g3", key, field, amount),
            limit,
        };
        let first = control
            .counters(CounterOp::Reserve(vec![
                charge("x", "requests", 1, 2),
                charge("y", "tokens", 0, 10),
            ]))
            .await
            .unwrap();
        assert_eq!(first, CounterReply::Values(vec![1, 0]));
        let second = control
            .counters(CounterOp::Reserve(vec![charge("x", "requests", 1, 2)]))
            .await
            .unwrap();
        assert_eq!(second, CounterReply::Values(vec![2]));
        // The limit reached: refused, and the other part not taken either.
        let third = control
            .counters(CounterOp::Reserve(vec![
                charge("z", "requests", 1, 5),
                charge("x", "requests", 1, 2),
            ]))
            .await
            .unwrap();
        assert_eq!(
            third,
            CounterReply::Refused {
                index: 1,
                current: 2
            }
        );
        let CounterReply::Rows(rows) = control
            .counters(CounterOp::Read(vec!["g3".into()]))
            .await
            .unwrap()
        else {
            panic!("rows expected");
        };
        assert!(!rows.iter().any(|r| r.key == "z"), "{rows:?}");
    }

    #[tokio::test]
    async fn memory() {
        let control = Control::memory();
        entries_are_versioned_and_writes_conditional(&control).await;
        the_audit_pages_newest_first(&control).await;
        counters_add_read_and_reserve(&control, true).await;
    }
}

//! Counters: usage per day and what budgets spent per window. Each counter is a key's
//! field (a number), the key listed in a group (what it is read by: a day, a window) and
//! kept until it expires. Kept where tasks are kept: in this process (memory), in the
//! SQLite file (written behind, once a second or so, by `usage`), or in Redis, where every
//! replica adds to the same numbers and a reservation is one script, so that two replicas
//! never both take the last unit of a budget.

use std::collections::{BTreeMap, HashMap};

/// One counter's change or value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Counted {
    /// What reads it: `u|<day>` (usage), `b|<budget>|<window>` (a budget's window).
    pub(crate) group: String,
    pub(crate) key: String,
    pub(crate) field: String,
    pub(crate) amount: i64,
    /// When the key may go (milliseconds since the epoch).
    pub(crate) expires_ms: i64,
}

/// A reservation's part: `amount` more of a counter, refused (all parts with it) when the
/// counter holds `limit` or more, or would pass it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Charge {
    pub(crate) counted: Counted,
    pub(crate) limit: i64,
}

impl Charge {
    /// Whether a counter at `current` refuses this charge. An amount of 0 (tokens, known
    /// only when a call ends) is refused only once the limit is reached.
    fn refuses(&self, current: i64) -> bool {
        current.saturating_add(self.counted.amount.max(1)) > self.limit
    }
}

#[derive(Debug)]
pub(crate) enum CounterOp {
    /// Adds each amount; the values after, in order.
    Add(Vec<Counted>),
    /// Adds every charge's amount, or none when one refuses.
    Reserve(Vec<Charge>),
    /// Every counter of the keys in these groups.
    Read(Vec<String>),
    /// Every counter not expired whose group starts with this (what a node's own ledger
    /// starts from).
    Load(String),
    /// Drops the keys expired before this instant.
    Prune(i64),
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CounterReply {
    Values(Vec<i64>),
    /// The charge (its index) that refused, and its counter's value.
    Refused {
        index: usize,
        current: i64,
    },
    Rows(Vec<Counted>),
    Pruned(u64),
}

/// A key's counters: when it expires, and its fields.
type Fields = (i64, BTreeMap<String, i64>);

/// Counters in this process.
#[derive(Default)]
pub(crate) struct MemoryCounters {
    /// By group, then key.
    groups: HashMap<String, BTreeMap<String, Fields>>,
}

impl MemoryCounters {
    pub(crate) fn apply(&mut self, op: CounterOp) -> CounterReply {
        match op {
            CounterOp::Add(amounts) => {
                CounterReply::Values(amounts.into_iter().map(|c| self.add(c)).collect())
            }
            CounterOp::Reserve(charges) => {
                for (index, charge) in charges.iter().enumerate() {
                    let current = self.value(&charge.counted);
                    if charge.refuses(current) {
                        return CounterReply::Refused { index, current };
                    }
                }
                let values = charges.into_iter().map(|c| self.add(c.counted)).collect();
                CounterReply::Values(values)
            }
            CounterOp::Read(groups) => {
                let mut rows = Vec::new();
                for group in groups {
                    rows.extend(self.rows_of(&group, i64::MIN));
                }
                CounterReply::Rows(rows)
            }
            CounterOp::Load(prefix) => {
                let now = now_ms();
                let groups: Vec<String> = (self.groups.keys())
                    .filter(|g| g.starts_with(&prefix))
                    .cloned()
                    .collect();
                let rows = groups.iter().flat_map(|g| self.rows_of(g, now)).collect();
                CounterReply::Rows(rows)
            }
            CounterOp::Prune(before) => {
                let mut pruned = 0;
                for keys in self.groups.values_mut() {
                    let held = keys.len();
                    keys.retain(|_, (expires, _)| *expires >= before);
                    pruned += (held - keys.len()) as u64;
                }
                self.groups.retain(|_, keys| !keys.is_empty());
                CounterReply::Pruned(pruned)
            }
        }
    }

    fn add(&mut self, c: Counted) -> i64 {
        let keys = self.groups.entry(c.group).or_default();
        let (expires, fields) = keys.entry(c.key).or_default();
        *expires = (*expires).max(c.expires_ms);
        let value = fields.entry(c.field).or_default();
        *value = value.saturating_add(c.amount);
        *value
    }

    fn value(&self, c: &Counted) -> i64 {
        let fields = self.groups.get(&c.group).and_then(|k| k.get(&c.key));
        fields
            .and_then(|(_, f)| f.get(&c.field))
            .copied()
            .unwrap_or(0)
    }

    fn rows_of(&self, group: &str, alive_at: i64) -> Vec<Counted> {
        let mut rows = Vec::new();
        for (key, (expires, fields)) in self.groups.get(group).into_iter().flatten() {
            if *expires < alive_at {
                continue;
            }
            for (field, amount) in fields {
                rows.push(Counted {
                    group: group.to_string(),
                    key: key.clone(),
                    field: field.clone(),
                    amount: *amount,
                    expires_ms: *expires,
                });
            }
        }
        rows
    }
}

pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The SQLite kind: each operation in the writer's transaction.
pub(crate) fn on_sqlite(
    tx: &rusqlite::Transaction<'_>,
    op: CounterOp,
) -> rusqlite::Result<CounterReply> {
    use rusqlite::params;
    let read = |r: &rusqlite::Row<'_>| {
        Ok(Counted {
            group: r.get(0)?,
            key: r.get(1)?,
            field: r.get(2)?,
            amount: r.get(3)?,
            expires_ms: r.get(4)?,
        })
    };
    Ok(match op {
        CounterOp::Add(amounts) => {
            let mut add = tx.prepare_cached(
                "INSERT INTO counters (grp, key, field, amount, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (grp, key, field) DO UPDATE SET amount = amount + excluded.amount,
                   expires_ms = max(expires_ms, excluded.expires_ms)
                 RETURNING amount",
            )?;
            let mut values = Vec::with_capacity(amounts.len());
            for c in &amounts {
                values.push(add.query_row(
                    params![c.group, c.key, c.field, c.amount, c.expires_ms],
                    |r| r.get(0),
                )?);
            }
            CounterReply::Values(values)
        }
        CounterOp::Reserve(charges) => {
            let mut get = tx.prepare_cached(
                "SELECT amount FROM counters WHERE grp = ?1 AND key = ?2 AND field = ?3",
            )?;
            for (index, charge) in charges.iter().enumerate() {
                let c = &charge.counted;
                let current: i64 = get
                    .query_row(params![c.group, c.key, c.field], |r| r.get(0))
                    .or_else(|e| match e {
                        rusqlite::Error::QueryReturnedNoRows => Ok(0),
                        e => Err(e),
                    })?;
                if charge.refuses(current) {
                    return Ok(CounterReply::Refused { index, current });
                }
            }
            drop(get);
            let counted = charges.into_iter().map(|c| c.counted).collect();
            return on_sqlite(tx, CounterOp::Add(counted));
        }
        CounterOp::Read(groups) => {
            let mut rows = tx.prepare_cached(
                "SELECT grp, key, field, amount, expires_ms FROM counters WHERE grp = ?1",
            )?;
            let mut out = Vec::new();
            for group in groups {
                let found = rows.query_map([&group], read)?;
                out.extend(found.collect::<rusqlite::Result<Vec<_>>>()?);
            }
            CounterReply::Rows(out)
        }
        CounterOp::Load(prefix) => {
            let mut rows = tx.prepare_cached(
                "SELECT grp, key, field, amount, expires_ms FROM counters
                 WHERE substr(grp, 1, length(?1)) = ?1 AND expires_ms >= ?2",
            )?;
            let found = rows.query_map(params![prefix, now_ms()], read)?;
            CounterReply::Rows(found.collect::<rusqlite::Result<Vec<_>>>()?)
        }
        CounterOp::Prune(before) => {
            let n = tx.execute("DELETE FROM counters WHERE expires_ms < ?1", [before])?;
            CounterReply::Pruned(n as u64)
        }
    })
}

/// [`on_sqlite`] in PostgreSQL: a reservation locks the rows it reads, so that two
/// transactions never both take the last unit.
pub(crate) fn on_postgres(
    tx: &mut postgres::Transaction<'_>,
    op: CounterOp,
) -> Result<CounterReply, postgres::Error> {
    let read = |r: postgres::Row| Counted {
        group: r.get(0),
        key: r.get(1),
        field: r.get(2),
        amount: r.get(3),
        expires_ms: r.get(4),
    };
    Ok(match op {
        CounterOp::Add(amounts) => {
            let add = tx.prepare(
                "INSERT INTO counters (grp, key, field, amount, expires_ms) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (grp, key, field) DO UPDATE SET amount = counters.amount + excluded.amount,
                   expires_ms = GREATEST(counters.expires_ms, excluded.expires_ms)
                 RETURNING amount",
            )?;
            let mut values = Vec::with_capacity(amounts.len());
            for c in &amounts {
                let row = tx.query_one(
                    &add,
                    &[&c.group, &c.key, &c.field, &c.amount, &c.expires_ms],
                )?;
                values.push(row.get(0));
            }
            CounterReply::Values(values)
        }
        CounterOp::Reserve(charges) => {
            // The row first, so that FOR UPDATE has one to lock: replicas sharing the schema
            // reserve from one counter one at a time, its first unit too.
            let make = tx.prepare(
                "INSERT INTO counters (grp, key, field, amount, expires_ms) VALUES ($1, $2, $3, 0, $4)
                 ON CONFLICT (grp, key, field) DO NOTHING",
            )?;
            let get = tx.prepare(
                "SELECT amount FROM counters WHERE grp = $1 AND key = $2 AND field = $3 FOR UPDATE",
            )?;
            let mut made = Vec::new();
            for (index, charge) in charges.iter().enumerate() {
                let c = &charge.counted;
                if tx.execute(&make, &[&c.group, &c.key, &c.field, &c.expires_ms])? == 1 {
                    made.push(c);
                }
                let current: i64 = tx
                    .query_opt(&get, &[&c.group, &c.key, &c.field])?
                    .map_or(0, |r| r.get(0));
                if charge.refuses(current) {
                    // All or nothing: the rows made for this reservation go too.
                    for c in made {
                        tx.execute(
                            "DELETE FROM counters WHERE grp = $1 AND key = $2 AND field = $3",
                            &[&c.group, &c.key, &c.field],
                        )?;
                    }
                    return Ok(CounterReply::Refused { index, current });
                }
            }
            let counted = charges.into_iter().map(|c| c.counted).collect();
            return on_postgres(tx, CounterOp::Add(counted));
        }
        CounterOp::Read(groups) => {
            let rows = tx.prepare(
                "SELECT grp, key, field, amount, expires_ms FROM counters WHERE grp = $1",
            )?;
            let mut out = Vec::new();
            for group in groups {
                out.extend(tx.query(&rows, &[&group])?.into_iter().map(read));
            }
            CounterReply::Rows(out)
        }
        CounterOp::Load(prefix) => {
            let rows = tx.query(
                "SELECT grp, key, field, amount, expires_ms FROM counters
                 WHERE starts_with(grp, $1) AND expires_ms >= $2",
                &[&prefix, &now_ms()],
            )?;
            CounterReply::Rows(rows.into_iter().map(read).collect())
        }
        CounterOp::Prune(before) => {
            let n = tx.execute("DELETE FROM counters WHERE expires_ms < $1", &[&before])?;
            CounterReply::Pruned(n)
        }
    })
}

/// Adds each amount (HINCRBY) and lists its key in its group; the values after.
const ADD: &str = r#"
local out = {}
for i = 1, #KEYS do
  local a = (i - 1) * 4
  out[i] = redis.call('HINCRBY', KEYS[i], ARGV[a + 1], ARGV[a + 2])
  redis.call('SADD', ARGV[a + 3], KEYS[i])
  redis.call('PEXPIREAT', KEYS[i], ARGV[a + 4])
  redis.call('PEXPIREAT', ARGV[a + 3], ARGV[a + 4])
end
return out
"#;

/// A reservation, all or nothing: {1, values...} or {0, index, current}.
const RESERVE: &str = r#"
for i = 1, #KEYS do
  local a = (i - 1) * 5
  local cur = tonumber(redis.call('HGET', KEYS[i], ARGV[a + 1]) or '0')
  local amount = tonumber(ARGV[a + 2])
  if amount < 1 then amount = 1 end
  if cur + amount > tonumber(ARGV[a + 5]) then return {0, i - 1, cur} end
end
local out = {1}
for i = 1, #KEYS do
  local a = (i - 1) * 5
  out[i + 1] = redis.call('HINCRBY', KEYS[i], ARGV[a + 1], ARGV[a + 2])
  redis.call('SADD', ARGV[a + 3], KEYS[i])
  redis.call('PEXPIREAT', KEYS[i], ARGV[a + 4])
  redis.call('PEXPIREAT', ARGV[a + 3], ARGV[a + 4])
end
return out
"#;

/// The Redis kind: a counter is a hash (`counter:<key>`, a field per counter), its group a
/// set of such hashes (`counters:<group>`); both expire with their keys. A key's expiry is
/// the same whoever writes it (its day's or window's), so each write sets it again.
pub(crate) async fn on_redis(
    shared: &super::redis::Shared,
    op: CounterOp,
) -> Result<CounterReply, String> {
    static ADD_SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    static RESERVE_SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    let keys = &shared.keys;
    match op {
        CounterOp::Add(amounts) => {
            if amounts.is_empty() {
                return Ok(CounterReply::Values(Vec::new()));
            }
            let script = ADD_SCRIPT.get_or_init(|| redis::Script::new(ADD));
            let mut invocation = script.prepare_invoke();
            for c in &amounts {
                invocation
                    .key(keys.counter(&c.key))
                    .arg(&c.field)
                    .arg(c.amount)
                    .arg(keys.counter_group(&c.group))
                    .arg(c.expires_ms);
            }
            let values: Vec<i64> = shared
                .with(|mut c| async move { invocation.invoke_async(&mut c).await })
                .await?;
            Ok(CounterReply::Values(values))
        }
        CounterOp::Reserve(charges) => {
            let script = RESERVE_SCRIPT.get_or_init(|| redis::Script::new(RESERVE));
            let mut invocation = script.prepare_invoke();
            for charge in &charges {
                let c = &charge.counted;
                invocation
                    .key(keys.counter(&c.key))
                    .arg(&c.field)
                    .arg(c.amount)
                    .arg(keys.counter_group(&c.group))
                    .arg(c.expires_ms)
                    .arg(charge.limit);
            }
            let out: Vec<i64> = shared
                .with(|mut c| async move { invocation.invoke_async(&mut c).await })
                .await?;
            match out.as_slice() {
                [1, values @ ..] => Ok(CounterReply::Values(values.to_vec())),
                [0, index, current] => Ok(CounterReply::Refused {
                    index: (*index).max(0) as usize,
                    current: *current,
                }),
                other => Err(format!("a reservation answered {other:?}")),
            }
        }
        CounterOp::Read(groups) => {
            let mut rows = Vec::new();
            for group in groups {
                let set = keys.counter_group(&group);
                let members: Vec<String> = shared
                    .with(|mut c| async move { redis::AsyncCommands::smembers(&mut c, set).await })
                    .await?;
                if members.is_empty() {
                    continue;
                }
                let mut pipe = redis::pipe();
                for member in &members {
                    pipe.hgetall(member);
                }
                let found: Vec<HashMap<String, i64>> = shared
                    .with(|mut c| async move { pipe.query_async(&mut c).await })
                    .await?;
                for (member, fields) in members.iter().zip(found) {
                    let Some(key) = keys.counter_key_of(member) else {
                        continue;
                    };
                    for (field, amount) in fields {
                        rows.push(Counted {
                            group: group.clone(),
                            key: key.to_string(),
                            field,
                            amount,
                            // Redis keeps it; the reader has no use for it.
                            expires_ms: 0,
                        });
                    }
                }
            }
            Ok(CounterReply::Rows(rows))
        }
        // Every replica reads Redis itself, and Redis expires what it holds.
        CounterOp::Load(_) => Ok(CounterReply::Rows(Vec::new())),
        CounterOp::Prune(_) => Ok(CounterReply::Pruned(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_keys_are_pruned() {
        let mut m = MemoryCounters::default();
        let counted = |key: &str, expires_ms| Counted {
            group: "g".into(),
            key: key.into(),
            field: "f".into(),
            amount: 1,
            expires_ms,
        };
        m.apply(CounterOp::Add(vec![
            counted("old", 5),
            counted("new", now_ms() + 60_000),
        ]));
        assert_eq!(m.apply(CounterOp::Prune(10)), CounterReply::Pruned(1));
        let CounterReply::Rows(rows) = m.apply(CounterOp::Load("g".into())) else {
            panic!("rows expected");
        };
        assert_eq!(rows.len(), 1);
    }
}

//! Budgets: how much a caller, an agent, or a caller of an agent may use in a window, from
//! `[[budgets]]` and the admin API. Checked at admission: a call reserves its request (and
//! for a send its task) in every budget it falls under at once, all or nothing, and is
//! refused when one is spent; tokens and cost are known when a task ends and added then,
//! so the call that crosses a limit finishes and the next is refused.
//!
//! Where the numbers are kept: on one node ([`Ledger::Local`]) in this process, written
//! behind to the SQLite file with usage and read back at start; with replicas
//! ([`Ledger::Shared`]) in Redis, each reservation one script, so that two replicas never
//! both take the last unit.

use std::sync::{Arc, Mutex};

use chrono_tz::Tz;

use super::clock;
use crate::config::{BudgetConfig, Window};
use crate::store::control::Control;
use crate::store::counters::{Charge, Counted, CounterOp, CounterReply, MemoryCounters};

/// Where a budget comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Source {
    File,
    Runtime,
}

/// What a budget limits, as its counters' fields name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Measure {
    Requests,
    Tasks,
    Tokens,
    /// In billionths of the currency.
    Cost,
}

impl Measure {
    pub(crate) fn field(self) -> &'static str {
        match self {
            Measure::Requests => "requests",
            Measure::Tasks => "tasks",
            Measure::Tokens => "tokens",
            Measure::Cost => "cost",
        }
    }

    /// A limit or amount as people read it.
    pub(crate) fn describe(self, amount: i64) -> String {
        match self {
            Measure::Cost => format!("a cost of {:.2}", amount as f64 / super::NANOS),
            other => format!("{amount} {}", other.field()),
        }
    }
}

/// A budget in force.
#[derive(Debug)]
pub(crate) struct Budget {
    pub(crate) config: BudgetConfig,
    pub(crate) source: Source,
    /// Its limits, in counter units.
    limits: Vec<(Measure, i64)>,
}

impl Budget {
    pub(crate) fn new(config: BudgetConfig, source: Source) -> Budget {
        let limits = [
            (Measure::Requests, config.max_requests.map(|n| n as i64)),
            (Measure::Tasks, config.max_tasks.map(|n| n as i64)),
            (Measure::Tokens, config.max_tokens.map(|n| n as i64)),
            (
                Measure::Cost,
                config.max_cost.map(|c| (c * super::NANOS).round() as i64),
            ),
        ];
        let limits = (limits.into_iter())
            .filter_map(|(m, limit)| limit.map(|l| (m, l)))
            .collect();
        Budget {
            config,
            source,
            limits,
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.config.id
    }

    pub(crate) fn limits(&self) -> &[(Measure, i64)] {
        &self.limits
    }

    fn limits_spend(&self) -> bool {
        (self.limits.iter()).any(|(m, _)| matches!(m, Measure::Tokens | Measure::Cost))
    }

    /// The part of its key a caller (or agent) has: itself, `*` for all together, or
    /// none when the budget does not name it.
    fn part<'a>(list: &Option<Vec<String>>, name: &'a str) -> Option<&'a str> {
        match list {
            None => Some("*"),
            Some(list) if list.len() == 1 && list[0] == "*" => Some(name),
            Some(list) => list.iter().any(|n| n == name).then_some(name),
        }
    }

    /// The key of `caller`'s calls to `agent` in this budget, if it covers them.
    fn key_of(&self, caller: &str, agent: &str) -> Option<(String, String)> {
        let caller = Self::part(&self.config.callers, caller)?;
        let agent = Self::part(&self.config.agents, agent)?;
        Some((agent.to_string(), caller.to_string()))
    }
}

/// The window of a budget now, and its counters' names.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub(crate) budget: Arc<Budget>,
    pub(crate) group: String,
    pub(crate) key: String,
    pub(crate) resets_ms: i64,
    /// What is counted for: the agent's part and the caller's (`*`: all together).
    pub(crate) agent: String,
    pub(crate) caller: String,
}

impl Place {
    /// `amount` of `measure` in this place's counters.
    pub(crate) fn counted(&self, measure: Measure, amount: i64) -> Counted {
        Counted {
            group: self.group.clone(),
            key: self.key.clone(),
            field: measure.field().into(),
            amount,
            // A window's counters stay a day past its end, to be read back.
            expires_ms: self.resets_ms + 24 * 3600 * 1000,
        }
    }
}

/// The group and key of a budget's window: `b|<id>|<window>`, `…|<agent>|<caller>`.
pub(crate) fn names(id: &str, window: &str, agent: &str, caller: &str) -> (String, String) {
    let group = format!("b|{id}|{window}");
    let key = format!("{group}|{agent}|{caller}");
    (group, key)
}

/// The budgets in force.
#[derive(Debug, Default)]
pub(crate) struct InForce {
    pub(crate) budgets: Vec<Arc<Budget>>,
}

impl InForce {
    /// Where `caller`'s calls to `agent` count now.
    pub(crate) fn places(&self, caller: &str, agent: &str, zone: Tz, now_ms: i64) -> Vec<Place> {
        let mut places = Vec::new();
        for budget in &self.budgets {
            let Some((agent_part, caller_part)) = budget.key_of(caller, agent) else {
                continue;
            };
            let (window, _, resets_ms) = clock::window_of(budget.config.window, zone, now_ms);
            let (group, key) = names(budget.id(), &window, &agent_part, &caller_part);
            places.push(Place {
                budget: budget.clone(),
                group,
                key,
                resets_ms,
                agent: agent_part,
                caller: caller_part,
            });
        }
        places
    }

    /// Whether any budget counts tokens or cost (then tasks' tokens are looked for).
    pub(crate) fn spend_limited(&self) -> bool {
        self.budgets.iter().any(|b| b.limits_spend())
    }
}

/// What one call reserved: the place nearest its limit, for the answer's headers.
#[derive(Debug, Clone)]
pub(crate) struct Standing {
    pub(crate) budget: Arc<str>,
    pub(crate) measure: Measure,
    pub(crate) limit: i64,
    pub(crate) used: i64,
    pub(crate) resets_ms: i64,
}

impl Standing {
    /// The numbers as an answer carries them (HTTP headers, gRPC metadata): the budget,
    /// what it counts, its limit, what remains, and seconds until it resets.
    pub(crate) fn headers(&self) -> [(&'static str, String); 5] {
        let value = |n: i64| match self.measure {
            Measure::Cost => format!("{:.4}", n as f64 / super::NANOS),
            _ => n.to_string(),
        };
        let reset = (self.resets_ms - clock::now_ms()).max(0) as u64;
        [
            ("x-budget-id", self.budget.to_string()),
            ("x-budget-unit", self.measure.field().to_string()),
            ("x-budget-limit", value(self.limit)),
            ("x-budget-remaining", value((self.limit - self.used).max(0))),
            ("x-budget-reset", reset.div_ceil(1000).to_string()),
        ]
    }
}

/// The charges of one call: its request, its task when it sends, and a check of tokens
/// and cost (reserving none).
pub(crate) fn charges(places: &[Place], sends: bool) -> Vec<(usize, Measure, Charge)> {
    let mut out = Vec::new();
    for (i, place) in places.iter().enumerate() {
        for (measure, limit) in place.budget.limits() {
            let amount = match measure {
                Measure::Requests => 1,
                Measure::Tasks if sends => 1,
                Measure::Tasks => continue,
                Measure::Tokens | Measure::Cost => 0,
            };
            out.push((
                i,
                *measure,
                Charge {
                    counted: place.counted(*measure, amount),
                    limit: *limit,
                },
            ));
        }
    }
    out
}

/// Where budget counters are kept.
pub(crate) enum Ledger {
    /// In this process; `persist`: the SQLite file it is written behind to.
    Local {
        counters: Mutex<MemoryCounters>,
        unwritten: Mutex<Vec<Counted>>,
        persist: Option<Control>,
    },
    Shared(Control),
}

impl Ledger {
    /// Kept in this process (written behind to `persist`, if any).
    pub(crate) fn local(persist: Option<Control>) -> Ledger {
        Ledger::Local {
            counters: Mutex::default(),
            unwritten: Mutex::default(),
            persist,
        }
    }

    /// Reads back what a durable store holds of windows not over (once, at start).
    pub(crate) async fn load(&self) {
        let Ledger::Local {
            counters,
            persist: Some(control),
            ..
        } = self
        else {
            return;
        };
        match control.counters(CounterOp::Load("b|".into())).await {
            Ok(CounterReply::Rows(rows)) => {
                let mut counters = counters.lock().unwrap_or_else(|e| e.into_inner());
                counters.apply(CounterOp::Add(rows));
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "budgets: what they spent could not be read back; they start from zero")
            }
        }
    }

    pub(crate) async fn run(&self, op: CounterOp) -> Result<CounterReply, String> {
        match self {
            Ledger::Shared(control) => control.counters(op).await,
            Ledger::Local {
                counters,
                unwritten,
                persist,
            } => {
                let written: Vec<Counted> = match (&op, persist) {
                    (CounterOp::Add(c), Some(_)) => c.clone(),
                    (CounterOp::Reserve(c), Some(_)) => {
                        c.iter().map(|c| c.counted.clone()).collect()
                    }
                    _ => Vec::new(),
                };
                let reply = counters.lock().unwrap_or_else(|e| e.into_inner()).apply(op);
                if matches!(reply, CounterReply::Values(_)) && !written.is_empty() {
                    let written = written.into_iter().filter(|c| c.amount != 0);
                    (unwritten.lock().unwrap_or_else(|e| e.into_inner())).extend(written);
                }
                Ok(reply)
            }
        }
    }

    /// What a local ledger has not written to its file yet (taken).
    pub(crate) fn take_unwritten(&self) -> Option<(Control, Vec<Counted>)> {
        match self {
            Ledger::Local {
                unwritten,
                persist: Some(control),
                ..
            } => {
                let rows =
                    std::mem::take(&mut *unwritten.lock().unwrap_or_else(|e| e.into_inner()));
                (!rows.is_empty()).then(|| (control.clone(), rows))
            }
            _ => None,
        }
    }

    /// Drops what windows long over hold.
    pub(crate) fn prune(&self, now_ms: i64) {
        if let Ledger::Local { counters, .. } = self {
            counters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .apply(CounterOp::Prune(now_ms));
        }
    }
}

/// The window's label, start and end for a budget now (for the admin API's view).
pub(crate) fn window_now(window: Window, zone: Tz) -> (String, i64, i64) {
    clock::window_of(window, zone, clock::now_ms())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(callers: Option<&[&str]>, agents: Option<&[&str]>) -> Arc<Budget> {
        let list = |l: Option<&[&str]>| l.map(|l| l.iter().map(|s| s.to_string()).collect());
        Arc::new(Budget::new(
            BudgetConfig {
                id: "b".into(),
                callers: list(callers),
                agents: list(agents),
                window: Window::Day,
                max_requests: Some(3),
                max_tasks: None,
                max_tokens: Some(100),
                max_cost: None,
                soft_percent: None,
                webhook: None,
                stop_streaming: false,
            },
            Source::File,
        ))
    }

    #[test]
    fn a_budget_covers_whom_it_names_each_on_its_own_or_all_together() {
        let utc: Tz = "UTC".parse().unwrap();
        let at = |b: Arc<Budget>, caller: &str, agent: &str| {
            let in_force = InForce { budgets: vec![b] };
            let places = in_force.places(caller, agent, utc, 0);
            places.first().map(|p| (p.agent.clone(), p.caller.clone()))
        };
        let each = budget(Some(&["*"]), Some(&["*"]));
        assert_eq!(
            at(each, "key:a", "echo"),
            Some(("echo".into(), "key:a".into()))
        );
        let listed = budget(Some(&["key:ci"]), None);
        assert_eq!(
            at(listed.clone(), "key:ci", "echo"),
            Some(("*".into(), "key:ci".into()))
        );
        assert_eq!(at(listed, "key:other", "echo"), None);
        let per_agent = budget(None, Some(&["llm"]));
        assert_eq!(
            at(per_agent.clone(), "key:a", "llm"),
            Some(("llm".into(), "*".into()))
        );
        assert_eq!(at(per_agent, "key:a", "echo"), None);
    }

    #[test]
    fn a_call_reserves_its_request_and_checks_tokens() {
        let utc: Tz = "UTC".parse().unwrap();
        let in_force = InForce {
            budgets: vec![budget(Some(&["*"]), None)],
        };
        let places = in_force.places("key:a", "echo", utc, 0);
        let charges = charges(&places, true);
        let parts: Vec<_> = (charges.iter())
            .map(|(_, m, c)| (m.field(), c.counted.amount, c.limit))
            .collect();
        assert_eq!(parts, [("requests", 1, 3), ("tokens", 0, 100)]);
        assert_eq!(charges[0].2.counted.key, "b|b|d19700101|*|key:a");
    }
}

//! Usage read back: the counters of the days asked for, filtered and grouped, as JSON or
//! CSV. What `GET /admin/v1/usage` and a caller's `GET /a2a/usage` answer.

use std::collections::BTreeMap;

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use super::{clock, Usage, NANOS};
use crate::error::GatewayError;
use crate::store::counters::{Counted, CounterOp, CounterReply};

/// The longest span one read covers.
const MAX_DAYS: i64 = 400;

/// What to read: the days (`from`, `to`, inclusive, `YYYY-MM-DD` in `[usage] time_zone`;
/// default: the last 30 days), whose use (`caller`, `agent`, `model`: only those), grouped
/// by `group_by` (`day`, `caller`, `agent`, comma-separated; none: one row of totals).
#[derive(Debug, Default, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UsageQuery {
    #[serde(default)]
    pub(crate) from: Option<NaiveDate>,
    #[serde(default)]
    pub(crate) to: Option<NaiveDate>,
    #[serde(default)]
    pub(crate) caller: Option<String>,
    #[serde(default)]
    pub(crate) agent: Option<String>,
    /// Only this model's tokens and cost (requests, tasks and bytes are not per model:
    /// they stay those of the callers and agents that used it).
    #[serde(default)]
    pub(crate) model: Option<String>,
    #[serde(default)]
    pub(crate) group_by: Option<String>,
    /// `json` (the default) or `csv` (also chosen by `Accept: text/csv`).
    #[serde(default)]
    pub(crate) format: Option<String>,
}

/// A dimension rows are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dimension {
    Day,
    Caller,
    Agent,
}

/// One model's tokens and cost.
#[derive(Debug, Default, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct ModelFigures {
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) cost: f64,
}

/// What was used.
#[derive(Debug, Default, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct Figures {
    pub(crate) requests: u64,
    /// Requests by binding and method (`jsonrpc SendMessage`).
    pub(crate) requests_by: BTreeMap<String, u64>,
    /// Requests answered with an error.
    pub(crate) errors: u64,
    /// Tasks that ended, and how, by final state.
    pub(crate) tasks: u64,
    pub(crate) tasks_by_state: BTreeMap<String, u64>,
    /// Seconds the ended tasks ran.
    pub(crate) task_seconds: f64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) tokens: u64,
    /// At `[pricing]`'s prices, in the report's currency.
    pub(crate) cost: f64,
    pub(crate) models: BTreeMap<String, ModelFigures>,
}

impl Figures {
    /// Adds one counter (a field of a day's key) to these figures.
    fn add(&mut self, field: &str, amount: i64, model_wanted: Option<&str>) {
        let n = amount.max(0) as u64;
        let mut parts = field.splitn(3, '|');
        let kind = parts.next().unwrap_or_default();
        match kind {
            "req" => {
                let binding = parts.next().unwrap_or_default();
                let method = parts.next().unwrap_or_default();
                self.requests += n;
                *self
                    .requests_by
                    .entry(format!("{binding} {method}"))
                    .or_default() += n;
            }
            "err" => self.errors += n,
            "task" => {
                self.tasks += n;
                let state = parts.next().unwrap_or_default().to_string();
                *self.tasks_by_state.entry(state).or_default() += n;
            }
            "task_ms" => self.task_seconds += n as f64 / 1000.0,
            "in" => self.bytes_in += n,
            "out" => self.bytes_out += n,
            "tok_in" | "tok_out" | "cost" => {
                let model = field.split_once('|').map_or("", |(_, m)| m);
                if model_wanted.is_some_and(|w| w != model) {
                    return;
                }
                let figures = self.models.entry(model.to_string()).or_default();
                match kind {
                    "tok_in" => {
                        figures.input_tokens += n;
                        self.input_tokens += n;
                        self.tokens += n;
                    }
                    "tok_out" => {
                        figures.output_tokens += n;
                        self.output_tokens += n;
                        self.tokens += n;
                    }
                    _ => {
                        figures.cost += n as f64 / NANOS;
                        self.cost += n as f64 / NANOS;
                    }
                }
            }
            _ => {}
        }
    }

    fn uses_model(&self, model: &str) -> bool {
        self.models.contains_key(model)
    }
}

/// A row's day, caller and agent (each None when not grouped by).
type Grouped = (Option<String>, Option<String>, Option<String>);

/// One row: the values of the dimensions grouped by, and what was used.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct UsageRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) day: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) caller: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) agent: Option<String>,
    #[serde(flatten)]
    pub(crate) figures: Figures,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct UsageReport {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) time_zone: String,
    pub(crate) currency: String,
    /// The dimensions rows are grouped by.
    pub(crate) group_by: Vec<String>,
    pub(crate) rows: Vec<UsageRow>,
    pub(crate) total: Figures,
}

fn invalid(field: &str, message: String) -> GatewayError {
    GatewayError::AdminInvalid(vec![(field.into(), message)])
}

fn dimensions(group_by: Option<&str>) -> Result<Vec<Dimension>, GatewayError> {
    let mut dims = Vec::new();
    for name in group_by.unwrap_or_default().split(',').map(str::trim) {
        let dim = match name {
            "" => continue,
            "day" => Dimension::Day,
            "caller" => Dimension::Caller,
            "agent" => Dimension::Agent,
            other => {
                return Err(invalid(
                    "group_by",
                    format!("\"{other}\" is not one of day, caller, agent"),
                ))
            }
        };
        if !dims.contains(&dim) {
            dims.push(dim);
        }
    }
    Ok(dims)
}

/// A day's key, `u|<day>|<agent>|<caller>`, read back (a caller id may hold `|`).
fn parts_of(key: &str) -> Option<(&str, &str, &str)> {
    let rest = key.strip_prefix("u|")?;
    let (day, rest) = rest.split_once('|')?;
    let (agent, caller) = rest.split_once('|')?;
    Some((day, agent, caller))
}

impl Usage {
    /// The report `query` asks for (this replica's counts written first).
    pub(crate) async fn report(&self, query: &UsageQuery) -> Result<UsageReport, GatewayError> {
        let dims = dimensions(query.group_by.as_deref())?;
        let zone = self.zone();
        let today = clock::day_of(zone, clock::now_ms()).0;
        let to = query.to.unwrap_or(today);
        let from = query.from.unwrap_or(to - chrono::TimeDelta::days(29));
        if from > to {
            return Err(invalid("from", format!("{from} is after to ({to})")));
        }
        if (to - from).num_days() >= MAX_DAYS {
            return Err(invalid(
                "from",
                format!("a read covers at most {MAX_DAYS} days"),
            ));
        }
        self.flush().await;
        let groups: Vec<String> = from
            .iter_days()
            .take_while(|d| *d <= to)
            .map(|d| format!("u|{}", d.format("%Y-%m-%d")))
            .collect();
        let rows = match self.control.counters(CounterOp::Read(groups)).await {
            Ok(CounterReply::Rows(rows)) => rows,
            Ok(other) => return Err(GatewayError::Internal(format!("usage read: {other:?}"))),
            Err(e) => return Err(GatewayError::StoreUnavailable(e)),
        };
        // Each (day, agent, caller) first, so that a model filter can keep the whole of
        // the keys that used it.
        let mut by_key: BTreeMap<(String, String, String), Figures> = BTreeMap::new();
        for Counted {
            key, field, amount, ..
        } in &rows
        {
            let Some((day, agent, caller)) = parts_of(key) else {
                continue;
            };
            if query.caller.as_deref().is_some_and(|c| c != caller)
                || query.agent.as_deref().is_some_and(|a| a != agent)
            {
                continue;
            }
            let figures = by_key
                .entry((day.into(), agent.into(), caller.into()))
                .or_default();
            figures.add(field, *amount, query.model.as_deref());
        }
        let mut grouped: BTreeMap<Grouped, Figures> = BTreeMap::new();
        let mut total = Figures::default();
        for ((day, agent, caller), figures) in by_key {
            if query
                .model
                .as_deref()
                .is_some_and(|m| !figures.uses_model(m))
            {
                continue;
            }
            let pick = |d: Dimension, value: &String| dims.contains(&d).then(|| value.clone());
            let key = (
                pick(Dimension::Day, &day),
                pick(Dimension::Caller, &caller),
                pick(Dimension::Agent, &agent),
            );
            merge(grouped.entry(key).or_default(), &figures);
            merge(&mut total, &figures);
        }
        let rows = grouped
            .into_iter()
            .map(|((day, caller, agent), figures)| UsageRow {
                day,
                caller,
                agent,
                figures,
            })
            .collect();
        let names = |d: &Dimension| match d {
            Dimension::Day => "day",
            Dimension::Caller => "caller",
            Dimension::Agent => "agent",
        };
        Ok(UsageReport {
            from: from.to_string(),
            to: to.to_string(),
            time_zone: zone.name().to_string(),
            currency: self.currency(),
            group_by: dims.iter().map(names).map(String::from).collect(),
            rows,
            total,
        })
    }
}

fn merge(into: &mut Figures, from: &Figures) {
    into.requests += from.requests;
    for (k, v) in &from.requests_by {
        *into.requests_by.entry(k.clone()).or_default() += v;
    }
    into.errors += from.errors;
    into.tasks += from.tasks;
    for (k, v) in &from.tasks_by_state {
        *into.tasks_by_state.entry(k.clone()).or_default() += v;
    }
    into.task_seconds += from.task_seconds;
    into.bytes_in += from.bytes_in;
    into.bytes_out += from.bytes_out;
    into.input_tokens += from.input_tokens;
    into.output_tokens += from.output_tokens;
    into.tokens += from.tokens;
    into.cost += from.cost;
    for (model, f) in &from.models {
        let m = into.models.entry(model.clone()).or_default();
        m.input_tokens += f.input_tokens;
        m.output_tokens += f.output_tokens;
        m.cost += f.cost;
    }
}

/// The states a task ends in, the CSV's columns.
const FINAL_STATES: [&str; 4] = ["completed", "failed", "canceled", "rejected"];

/// The report as CSV: a header, then a row per row (grouped dimensions first).
pub(crate) fn csv(report: &UsageReport) -> String {
    let mut out = String::new();
    let mut header: Vec<String> = report.group_by.clone();
    header.extend(
        [
            "requests",
            "errors",
            "tasks",
            "tasks_completed",
            "tasks_failed",
            "tasks_canceled",
            "tasks_rejected",
            "task_seconds",
            "bytes_in",
            "bytes_out",
            "input_tokens",
            "output_tokens",
            "tokens",
            "cost",
        ]
        .map(String::from),
    );
    out.push_str(&header.join(","));
    out.push_str("\r\n");
    for row in &report.rows {
        let mut cells: Vec<String> = Vec::new();
        for dim in &report.group_by {
            let value = match dim.as_str() {
                "day" => row.day.as_deref(),
                "caller" => row.caller.as_deref(),
                _ => row.agent.as_deref(),
            };
            cells.push(csv_cell(value.unwrap_or_default()));
        }
        let f = &row.figures;
        cells.extend([f.requests, f.errors, f.tasks].map(|n| n.to_string()));
        for state in FINAL_STATES {
            let n = f.tasks_by_state.get(state).copied().unwrap_or(0);
            cells.push(n.to_string());
        }
        cells.push(format!("{:.3}", f.task_seconds));
        cells.extend(
            [
                f.bytes_in,
                f.bytes_out,
                f.input_tokens,
                f.output_tokens,
                f.tokens,
            ]
            .map(|n| n.to_string()),
        );
        cells.push(format!("{:.6}", f.cost));
        out.push_str(&cells.join(","));
        out.push_str("\r\n");
    }
    out
}

/// A CSV cell (RFC 4180), with a cell that a spreadsheet would run as a formula quoted
/// after a `'`.
fn csv_cell(value: &str) -> String {
    let value = match value.starts_with(['=', '+', '-', '@']) {
        true => format!("'{value}"),
        false => value.to_string(),
    };
    match value.contains([',', '"', '\n', '\r']) {
        true => format!("\"{}\"", value.replace('"', "\"\"")),
        false => value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_fields_read_back() {
        assert_eq!(
            parts_of("u|2026-11-28|echo|jwt:a|b"),
            Some(("2026-11-28", "echo", "jwt:a|b"))
        );
        let mut f = Figures::default();
        f.add("req|jsonrpc|SendMessage", 2, None);
        f.add("task|completed", 1, None);
        f.add("tok_in|gpt-4o", 10, None);
        f.add("tok_out|gpt-4o", 5, None);
        f.add("cost|gpt-4o", 1_500_000_000, None);
        f.add("tok_in|other", 7, Some("gpt-4o"));
        assert_eq!(f.requests, 2);
        assert_eq!(f.requests_by["jsonrpc SendMessage"], 2);
        assert_eq!((f.input_tokens, f.output_tokens, f.tokens), (10, 5, 15));
        assert!((f.cost - 1.5).abs() < 1e-9);
    }

    #[test]
    fn csv_cells_are_quoted_and_formulas_defused() {
        assert_eq!(csv_cell("key:a"), "key:a");
        assert_eq!(csv_cell("a,b"), "\"a,b\"");
        assert_eq!(csv_cell("=SUM(A1)"), "'=SUM(A1)");
        assert_eq!(csv_cell("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn group_by_names_its_dimensions() {
        assert_eq!(
            dimensions(Some("day, agent")).unwrap(),
            [Dimension::Day, Dimension::Agent]
        );
        assert!(dimensions(Some("model")).is_err());
        assert!(dimensions(None).unwrap().is_empty());
    }
}

//! `[usage]`, `[pricing]` and `[[budgets]]`: who used what, at what price, and how much of
//! it a caller or an agent may use in a window.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Diagnostic, Diagnostics};

/// `[usage]`: counting requests, tasks, bytes and tokens per caller, agent and day.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageConfig {
    /// Counts every call (off: nothing is counted, and a call costs nothing more; budgets
    /// count what they limit either way).
    #[serde(default)]
    pub enabled: bool,
    /// The zone days and budget windows are calendar days and months of (an IANA name:
    /// `Europe/Paris`, `America/New_York`).
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
    /// How often this replica's counts go to the store (at most this much is lost with a
    /// replica killed outright).
    #[serde(default = "default_flush_ms")]
    pub flush_interval_ms: u64,
    /// Days of usage kept.
    #[serde(default = "default_retention_days")]
    pub retention_days: u32,
    /// What `[pricing]`'s prices are in (a label in answers and exports).
    #[serde(default = "default_currency")]
    pub currency: String,
    /// The Prometheus series of tokens and cost carry a `caller` label too (one series per
    /// key and model: keep it off with many keys).
    #[serde(default)]
    pub metrics_per_caller: bool,
}

impl Default for UsageConfig {
    fn default() -> Self {
        UsageConfig {
            enabled: false,
            time_zone: default_time_zone(),
            flush_interval_ms: default_flush_ms(),
            retention_days: default_retention_days(),
            currency: default_currency(),
            metrics_per_caller: false,
        }
    }
}

fn default_time_zone() -> String {
    "UTC".into()
}
fn default_flush_ms() -> u64 {
    1000
}
fn default_retention_days() -> u32 {
    400
}
fn default_currency() -> String {
    "USD".into()
}

/// `[pricing."<model>"]`: what a model's tokens cost, per million.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    #[serde(default)]
    pub input_per_million: f64,
    #[serde(default)]
    pub output_per_million: f64,
}

/// The prices, by model name as the model reports it (`gpt-4o-mini`); `"*"` prices any
/// model not named.
pub type Pricing = BTreeMap<String, ModelPrice>;

/// A budget's window: calendar minutes, days or months in `[usage] time_zone`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Window {
    Minute,
    Day,
    Month,
}

impl Window {
    pub fn name(self) -> &'static str {
        match self {
            Window::Minute => "minute",
            Window::Day => "day",
            Window::Month => "month",
        }
    }
}

/// `[[budgets]]`, and a budget the admin API keeps: how much callers may use of agents in
/// a window. Each caller it names (or, with `"*"`, each caller) and each agent it names
/// (`"*"`: each agent) has a budget of its own; without `agents` a caller's calls to every
/// agent count together, without `callers` every caller's calls to an agent do.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Its name, in refusals, headers, metrics and the log (letters, digits, `-_.:`).
    /// Through the admin API it is the path's.
    #[serde(default)]
    pub id: String,
    /// Caller ids as policies name them (`key:ci`, `jwt:<sub>`, `anonymous`), or `"*"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callers: Option<Vec<String>>,
    /// Agent names, or `"*"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    pub window: Window,
    /// Calls (every A2A operation on every binding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<u64>,
    /// Sends (each starts or continues a task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tasks: Option<u64>,
    /// Tokens, input and output, as agents report them: known when a task ends, so the
    /// call that crosses the limit finishes and the next is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Cost at `[pricing]`'s prices, in `[usage] currency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// From this share of a limit on, a warning: a metric, a log line and the webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_percent: Option<u8>,
    /// Where warnings (and the limit reached) are posted, as JSON, by the push machinery
    /// (its retries and destination policy; needs `[push] enabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// A task whose agent reports tokens as it goes is canceled when they cross
    /// `max_tokens` (or `max_cost`), rather than let finish.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop_streaming: bool,
}

/// The problems of one budget, each with the field it is about (`push_enabled`: whether
/// a webhook can be delivered).
pub fn budget_problems(budget: &BudgetConfig, push_enabled: bool) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let mut problem = |field: &str, message: String| problems.push((field.to_string(), message));
    if let Err(e) = super::check_policy_id(&budget.id) {
        problem("id", e.replace("policy id", "budget id"));
    }
    let limits = [
        budget.max_requests,
        budget.max_tasks,
        budget.max_tokens,
        budget.max_cost.map(|_| 1),
    ];
    if limits.iter().all(Option::is_none) {
        problem(
            "max_requests",
            "a budget needs at least one of max_requests, max_tasks, max_tokens, max_cost".into(),
        );
    }
    for (field, value) in [
        ("max_requests", budget.max_requests),
        ("max_tasks", budget.max_tasks),
        ("max_tokens", budget.max_tokens),
    ] {
        if value == Some(0) {
            problem(field, "must be at least 1".into());
        } else if value.is_some_and(|v| v > i64::MAX as u64 / 2) {
            problem(field, "is too large".into());
        }
    }
    if let Some(cost) = budget.max_cost {
        if !(cost.is_finite() && cost > 0.0 && cost < 1e9) {
            problem(
                "max_cost",
                format!("must be a positive amount below 1e9, got {cost}"),
            );
        }
    }
    if let Some(p) = budget.soft_percent {
        if !(1..=99).contains(&p) {
            problem("soft_percent", format!("must be from 1 to 99, got {p}"));
        }
    }
    for (field, list) in [("callers", &budget.callers), ("agents", &budget.agents)] {
        let Some(list) = list else { continue };
        if list.is_empty() {
            problem(
                field,
                "name at least one, or \"*\" (or leave it out: all together)".into(),
            );
        }
        for (i, name) in list.iter().enumerate() {
            if name.trim().is_empty() || name.contains('|') {
                problem(
                    &format!("{field}[{i}]"),
                    format!("\"{name}\" is not a name (empty, or holds \"|\")"),
                );
            }
        }
        if list.len() > 1 && list.iter().any(|n| n == "*") {
            problem(
                field,
                "\"*\" stands alone (it means each on its own)".into(),
            );
        }
    }
    if let Some(url) = &budget.webhook {
        let parsed = url::Url::parse(url);
        if parsed.map_or(true, |u| !matches!(u.scheme(), "http" | "https")) {
            problem("webhook", format!("must be an http(s) URL, got \"{url}\""));
        } else if !push_enabled {
            problem(
                "webhook",
                "needs [push] enabled = true (webhooks go through its deliveries and destination policy)".into(),
            );
        }
    }
    if budget.stop_streaming && budget.max_tokens.is_none() && budget.max_cost.is_none() {
        problem(
            "stop_streaming",
            "stops tasks at max_tokens or max_cost: set one".into(),
        );
    }
    problems
}

/// The checks of `[usage]`, `[pricing]` and `[[budgets]]`.
pub(super) fn check(
    usage: &UsageConfig,
    pricing: &Pricing,
    budgets: &[BudgetConfig],
    push_enabled: bool,
    file: &Path,
    diags: &mut Diagnostics,
) {
    if usage.time_zone.parse::<chrono_tz::Tz>().is_err() {
        diags.push(Diagnostic::file(
            file,
            format!(
                "usage.time_zone \"{}\" is not an IANA time zone (\"UTC\", \"Europe/Paris\")",
                usage.time_zone
            ),
        ));
    }
    for (key, value) in [
        ("usage.flush_interval_ms", usage.flush_interval_ms),
        ("usage.retention_days", u64::from(usage.retention_days)),
    ] {
        if value == 0 {
            diags.push(Diagnostic::file(file, format!("{key} must be at least 1")));
        }
    }
    for (model, price) in pricing {
        for (name, value) in [
            ("input_per_million", price.input_per_million),
            ("output_per_million", price.output_per_million),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                diags.push(Diagnostic::file(
                    file,
                    format!("pricing.\"{model}\".{name} must be a price of 0 or more, got {value}"),
                ));
            }
        }
    }
    let mut ids = std::collections::HashSet::new();
    for (i, budget) in budgets.iter().enumerate() {
        let name = match budget.id.is_empty() {
            true => format!("budgets[{i}]"),
            false => format!("budget \"{}\"", budget.id),
        };
        if !budget.id.is_empty() && !ids.insert(budget.id.as_str()) {
            diags.push(Diagnostic::file(file, format!("{name} is defined twice")));
        }
        for (field, message) in budget_problems(budget, push_enabled) {
            diags.push(Diagnostic::file(
                file,
                format!("{name}: {field}: {message}"),
            ));
        }
    }
}

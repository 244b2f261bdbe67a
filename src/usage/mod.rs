//! Who used what: every call counted per caller, agent and day (requests by method and
//! binding, errors, bytes in and out; tasks by final state, their seconds, tokens and
//! cost), and budgets checked at admission ([`budgets`]).
//!
//! A call's counts come from its request note when it is accounted (`http::account`, every
//! binding's) and from its task when it ends (`tasks`, the upstream relay); they pile up
//! here, in memory, and go to the store every `[usage] flush_interval_ms` as counters
//! (`store::counters`): added to by every replica, read back by `GET /admin/v1/usage`.
//! With usage off and no budget, a call pays one atomic load.

pub(crate) mod budgets;
pub(crate) mod clock;
pub(crate) mod report;
pub(crate) mod tokens;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use chrono::NaiveDate;
use chrono_tz::Tz;

use crate::config::{BudgetConfig, Pricing, UsageConfig};
use crate::error::GatewayError;
use crate::store::control::Control;
use crate::store::counters::{Counted, CounterOp, CounterReply};
use crate::telemetry::Metrics;
use budgets::{Budget, InForce, Ledger, Measure, Place, Source, Standing};
pub(crate) use tokens::{ModelTokens, Tokens};

/// Cost is counted in billionths of the currency.
pub(crate) const NANOS: f64 = 1e9;

/// Model names the metrics label before they say "other".
const MODELS_LABELLED: usize = 64;

/// How `[usage]` and `[pricing]` read.
struct Settings {
    zone: Tz,
    pricing: Pricing,
    currency: String,
    flush: Duration,
    retention_days: u32,
    per_caller: bool,
}

impl Settings {
    fn of(config: &UsageConfig, pricing: &Pricing) -> Settings {
        Settings {
            zone: config.time_zone.parse().unwrap_or(Tz::UTC),
            pricing: pricing.clone(),
            currency: config.currency.clone(),
            flush: Duration::from_millis(config.flush_interval_ms.max(1)),
            retention_days: config.retention_days.max(1),
            per_caller: config.metrics_per_caller,
        }
    }

    /// What `tokens` cost, in billionths.
    fn cost(&self, t: &ModelTokens) -> i64 {
        let price = self.pricing.get(&t.model).or_else(|| self.pricing.get("*"));
        price.map_or(0, |p| {
            let per_token = |per_million: f64| per_million * NANOS / 1e6;
            (t.input as f64 * per_token(p.input_per_million)
                + t.output as f64 * per_token(p.output_per_million))
            .round() as i64
        })
    }
}

/// One caller's use of one agent on one day, not yet in the store.
#[derive(Debug, Default)]
struct Tally {
    /// By (binding, method).
    requests: Vec<((&'static str, &'static str), i64)>,
    errors: i64,
    /// By final state.
    tasks: Vec<(&'static str, i64)>,
    bytes_in: i64,
    bytes_out: i64,
    task_ms: i64,
    /// By model: input, output, cost (billionths).
    models: Vec<(String, [i64; 3])>,
}

fn bump<K: PartialEq>(list: &mut Vec<(K, i64)>, key: K, n: i64) {
    match list.iter_mut().find(|(k, _)| *k == key) {
        Some((_, v)) => *v += n,
        None => list.push((key, n)),
    }
}

impl Tally {
    /// The counters it adds to, under `key` in `group`.
    fn rows(self, group: &str, key: &str, expires_ms: i64) -> Vec<Counted> {
        let mut rows = Vec::new();
        let mut row = |field: String, amount: i64| {
            if amount != 0 {
                rows.push(Counted {
                    group: group.to_string(),
                    key: key.to_string(),
                    field,
                    amount,
                    expires_ms,
                });
            }
        };
        for ((binding, method), n) in self.requests {
            row(format!("req|{binding}|{method}"), n);
        }
        row("err".into(), self.errors);
        for (state, n) in self.tasks {
            row(format!("task|{state}"), n);
        }
        row("in".into(), self.bytes_in);
        row("out".into(), self.bytes_out);
        row("task_ms".into(), self.task_ms);
        for (model, [input, output, cost]) in self.models {
            row(format!("tok_in|{model}"), input);
            row(format!("tok_out|{model}"), output);
            row(format!("cost|{model}"), cost);
        }
        rows
    }
}

type TallyKey = (NaiveDate, Arc<str>, Arc<str>);

/// What this replica counted and has not written yet.
#[derive(Default)]
struct Pending {
    /// The zone days are counted in (`[usage] time_zone`; UTC until configured).
    zone: Option<Tz>,
    /// Today (in the zone) and when it ends: most calls need no calendar.
    today: Option<(NaiveDate, i64)>,
    tallies: Vec<(TallyKey, Tally)>,
    /// Where each key's tally is in `tallies`.
    index: std::collections::HashMap<TallyKey, usize, ahash::RandomState>,
    /// The tally counted last: a call's note and its task's end, and most calls after it,
    /// count for the same caller and agent, found again without hashing their names.
    last: Option<usize>,
    /// Counters a write did not take, tried again with the next.
    unwritten: Vec<Counted>,
}

impl Pending {
    fn day(&mut self, zone: Tz, now_ms: i64) -> NaiveDate {
        match self.today {
            Some((day, ends)) if now_ms < ends => day,
            _ => {
                let (day, ends) = clock::day_of(zone, now_ms);
                // Past midnight only if the clock went forward; a clock that went back
                // keeps counting into the day it is in.
                self.today = Some((day, ends));
                day
            }
        }
    }

    fn tally(&mut self, caller: &Arc<str>, agent: &Arc<str>) -> &mut Tally {
        let zone = self.zone.unwrap_or(Tz::UTC);
        let day = self.day(zone, clock::coarse_now_ms());
        let same = |(d, c, a): &TallyKey| *d == day && same_name(c, caller) && same_name(a, agent);
        let at = match self.last {
            Some(i) if self.tallies.get(i).is_some_and(|(key, _)| same(key)) => i,
            _ => {
                let key = (day, caller.clone(), agent.clone());
                let next = self.tallies.len();
                let at = *self.index.entry(key.clone()).or_insert(next);
                if at == next {
                    self.tallies.push((key, Tally::default()));
                }
                self.last = Some(at);
                at
            }
        };
        &mut self.tallies[at].1
    }

    /// What was counted, taken to be written.
    fn take(&mut self) -> Vec<(TallyKey, Tally)> {
        self.index.clear();
        self.last = None;
        std::mem::take(&mut self.tallies)
    }
}

/// The same name, most often the same `Arc` (the caller's principal, the agent's config).
fn same_name(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

/// A budget that crossed its warning line or reached a limit.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Alert {
    pub(crate) budget: String,
    /// `soft` (past `soft_percent`) or `spent` (a limit reached).
    pub(crate) level: &'static str,
    /// What crossed: requests, tasks, tokens or cost.
    pub(crate) measure: &'static str,
    pub(crate) used: f64,
    pub(crate) limit: f64,
    /// The caller and agent it counts (`*`: all together).
    pub(crate) caller: String,
    pub(crate) agent: String,
    pub(crate) resets_at: String,
    pub(crate) at: String,
    #[serde(skip)]
    pub(crate) webhook: Option<String>,
}

/// The bytes of an answer that goes on after its call was accounted (a stream), added to
/// the caller's usage when it ends; made only while usage is counted.
pub(crate) struct Streamed {
    usage: Arc<Usage>,
    caller: Option<Arc<str>>,
    agent: Option<Arc<str>>,
    pub(crate) bytes: u64,
}

impl Streamed {
    pub(crate) fn start(
        usage: &Arc<Usage>,
        caller: Option<Arc<str>>,
        agent: Option<Arc<str>>,
    ) -> Option<Streamed> {
        usage.recording().then(|| Streamed {
            usage: usage.clone(),
            caller,
            agent,
            bytes: 0,
        })
    }
}

impl Drop for Streamed {
    fn drop(&mut self) {
        (self.usage).streamed(self.caller.as_ref(), self.agent.as_ref(), self.bytes);
    }
}

/// A task's end, as usage counts it.
pub(crate) struct TaskEnd<'a> {
    pub(crate) caller: &'a Arc<str>,
    pub(crate) agent: &'a Arc<str>,
    /// None for an answer that made no task (a message).
    pub(crate) state: Option<&'static str>,
    pub(crate) ms: i64,
    pub(crate) tokens: Tokens,
}

pub(crate) struct Usage {
    settings: ArcSwap<Settings>,
    /// `[usage] enabled`.
    recording: AtomicBool,
    /// Some budget is in force; some budget limits tokens or cost.
    budgeted: AtomicBool,
    spend_budgeted: AtomicBool,
    /// Some budget stops streaming tasks that cross it.
    stops: AtomicBool,
    pending: Mutex<Pending>,
    /// Where usage counters go.
    control: Control,
    ledger: Ledger,
    budgets: ArcSwap<InForce>,
    /// The budgets of the files and of the admin API, which make those in force.
    sources: Mutex<(Vec<BudgetConfig>, Vec<BudgetConfig>)>,
    metrics: Arc<Metrics>,
    models_labelled: Mutex<HashSet<String>>,
    alert: OnceLock<Box<dyn Fn(Alert) + Send + Sync>>,
    anonymous: Arc<str>,
    /// The agent of a call that reached none (refused before routing).
    no_agent: Arc<str>,
    /// Tasks' tokens on their way to the budgets, and the signal that some arrived.
    spending: std::sync::atomic::AtomicUsize,
    spent: tokio::sync::Notify,
}

impl Usage {
    /// Usage counted into `control`'s store; budgets kept in Redis when it is `shared`,
    /// else in this process, written behind to a durable store.
    pub(crate) fn new(
        config: &crate::config::GatewayConfig,
        control: Control,
        shared: bool,
        durable: bool,
        metrics: Arc<Metrics>,
    ) -> Usage {
        clock::start();
        let ledger = match (shared, durable) {
            (true, _) => Ledger::Shared(control.clone()),
            (false, true) => Ledger::local(Some(control.clone())),
            (false, false) => Ledger::local(None),
        };
        let usage = Usage {
            settings: ArcSwap::from_pointee(Settings::of(&config.usage, &config.pricing)),
            recording: AtomicBool::new(config.usage.enabled),
            budgeted: AtomicBool::new(false),
            spend_budgeted: AtomicBool::new(false),
            stops: AtomicBool::new(false),
            pending: Mutex::default(),
            control,
            ledger,
            budgets: ArcSwap::default(),
            sources: Mutex::default(),
            metrics,
            models_labelled: Mutex::default(),
            alert: OnceLock::new(),
            anonymous: Arc::from("anonymous"),
            no_agent: Arc::from(""),
            spending: Default::default(),
            spent: tokio::sync::Notify::new(),
        };
        usage.configure(config);
        usage
    }

    /// Reads back what budgets spent before a restart (before the gateway serves).
    pub(crate) async fn load(&self) {
        self.ledger.load().await;
    }

    /// Puts `[usage]`, `[pricing]` and `[[budgets]]` in force (at start and on reload).
    pub(crate) fn configure(&self, config: &crate::config::GatewayConfig) {
        let settings = Settings::of(&config.usage, &config.pricing);
        {
            let mut pending = self.pending();
            pending.today = None;
            pending.zone = Some(settings.zone);
        }
        self.settings.store(Arc::new(settings));
        self.recording
            .store(config.usage.enabled, Ordering::Relaxed);
        self.lock_sources().0 = config.budgets.clone();
        self.rebuild();
    }

    /// Puts the admin API's budgets in force.
    pub(crate) fn set_runtime_budgets(&self, budgets: Vec<BudgetConfig>) {
        self.lock_sources().1 = budgets;
        self.rebuild();
    }

    fn lock_sources(&self) -> std::sync::MutexGuard<'_, (Vec<BudgetConfig>, Vec<BudgetConfig>)> {
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn rebuild(&self) {
        let (file, runtime) = self.lock_sources().clone();
        let file = file.into_iter().map(|b| (b, Source::File));
        // A runtime budget with a file's id is not put in force (the admin API refuses
        // to make one; a file added later wins).
        let runtime = runtime.into_iter().map(|b| (b, Source::Runtime));
        let mut seen = HashSet::new();
        let budgets: Vec<Arc<Budget>> = (file.chain(runtime))
            .filter(|(b, _)| seen.insert(b.id.clone()))
            .map(|(b, source)| Arc::new(Budget::new(b, source)))
            .collect();
        let in_force = InForce { budgets };
        self.spend_budgeted
            .store(in_force.spend_limited(), Ordering::Relaxed);
        let stops = in_force.budgets.iter().any(|b| b.config.stop_streaming);
        self.stops.store(stops, Ordering::Relaxed);
        self.budgeted
            .store(!in_force.budgets.is_empty(), Ordering::Relaxed);
        self.budgets.store(Arc::new(in_force));
    }

    /// Where alerts go besides the log and the metrics (the push machinery's webhooks).
    pub(crate) fn on_alert(&self, deliver: Box<dyn Fn(Alert) + Send + Sync>) {
        let _ = self.alert.set(deliver);
    }

    /// Some budget stops streaming tasks that cross it (then running tasks' tokens are
    /// checked as they are reported).
    pub(crate) fn stops_streaming(&self) -> bool {
        self.stops.load(Ordering::Relaxed)
    }

    /// The refusal a running task meets when the tokens it reported so far (`running`),
    /// beside what its budgets spent, reach the limit of one that stops streaming tasks.
    pub(crate) async fn stopped_by(
        &self,
        caller: &str,
        agent: &str,
        running: &Tokens,
    ) -> Option<GatewayError> {
        let in_force = self.in_force();
        let places = in_force.places(caller, agent, self.zone(), clock::now_ms());
        let settings = self.settings.load_full();
        let tokens = running.total() as i64;
        let cost: i64 = running.by_model.iter().map(|t| settings.cost(t)).sum();
        for place in places.iter().filter(|p| p.budget.config.stop_streaming) {
            let read = self
                .ledger
                .run(CounterOp::Read(vec![place.group.clone()]))
                .await;
            let Ok(CounterReply::Rows(rows)) = read else {
                continue;
            };
            let spent = |field: &str| {
                (rows.iter())
                    .find(|r| r.key == place.key && r.field == field)
                    .map_or(0, |r| r.amount)
            };
            for (measure, limit) in place.budget.limits() {
                let running = match measure {
                    Measure::Tokens => tokens,
                    Measure::Cost => cost,
                    _ => continue,
                };
                let used = spent(measure.field()) + running;
                if used >= *limit {
                    self.metrics.budget_refused(place.budget.id());
                    return Some(spent_error(place, *measure, *limit, used));
                }
            }
        }
        None
    }

    /// Some budget is in force.
    pub(crate) fn budgeted(&self) -> bool {
        self.budgeted.load(Ordering::Relaxed)
    }

    pub(crate) fn recording(&self) -> bool {
        self.recording.load(Ordering::Relaxed)
    }

    /// Whether a task's tokens are wanted (counted, or limited by a budget).
    pub(crate) fn wants_tokens(&self) -> bool {
        self.recording() || self.spend_budgeted.load(Ordering::Relaxed)
    }

    pub(crate) fn zone(&self) -> Tz {
        self.settings.load().zone
    }

    pub(crate) fn currency(&self) -> String {
        self.settings.load().currency.clone()
    }

    pub(crate) fn in_force(&self) -> Arc<InForce> {
        self.budgets.load_full()
    }

    /// One call, as its note says once it is answered.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn request(
        &self,
        caller: Option<&Arc<str>>,
        agent: Option<&Arc<str>>,
        binding: &'static str,
        method: &'static str,
        failed: bool,
        bytes_in: u64,
        bytes_out: u64,
    ) {
        if !self.recording() {
            return;
        }
        let caller = caller.unwrap_or(&self.anonymous);
        let agent = agent.unwrap_or(&self.no_agent);
        let mut pending = self.pending();
        let tally = pending.tally(caller, agent);
        bump(&mut tally.requests, (binding, method), 1);
        tally.errors += i64::from(failed);
        tally.bytes_in += bytes_in as i64;
        tally.bytes_out += bytes_out as i64;
    }

    /// Bytes a stream sent after its call was accounted.
    fn streamed(&self, caller: Option<&Arc<str>>, agent: Option<&Arc<str>>, bytes: u64) {
        if !self.recording() || bytes == 0 {
            return;
        }
        let caller = caller.unwrap_or(&self.anonymous);
        let agent = agent.unwrap_or(&self.no_agent);
        self.pending().tally(caller, agent).bytes_out += bytes as i64;
    }

    /// A task that ended: its final state, how long it ran, and the tokens it reported.
    pub(crate) fn task_ended(self: &Arc<Self>, end: TaskEnd<'_>) {
        // Most tasks report no tokens: the settings (prices) are read only for those that do.
        let settings = (!end.tokens.by_model.is_empty()).then(|| self.settings.load_full());
        let costs: Vec<(ModelTokens, i64)> = match &settings {
            Some(settings) => (end.tokens.by_model.iter())
                .map(|t| (t.clone(), settings.cost(t)))
                .collect(),
            None => Vec::new(),
        };
        if self.recording() {
            let mut pending = self.pending();
            let tally = pending.tally(end.caller, end.agent);
            if let Some(state) = end.state {
                bump(&mut tally.tasks, state, 1);
                tally.task_ms += end.ms.max(0);
            }
            for (t, cost) in &costs {
                let figures = [t.input as i64, t.output as i64, *cost];
                match tally.models.iter_mut().find(|(m, _)| *m == t.model) {
                    Some((_, f)) => f.iter_mut().zip(figures).for_each(|(a, b)| *a += b),
                    None => tally.models.push((t.model.clone(), figures)),
                }
            }
            drop(pending);
            let caller = match settings.as_ref().is_some_and(|s| s.per_caller) {
                true => &**end.caller,
                false => "",
            };
            for (t, cost) in &costs {
                let model = self.model_label(&t.model);
                (self.metrics).tokens(end.agent, &model, "input", caller, t.input);
                (self.metrics).tokens(end.agent, &model, "output", caller, t.output);
                (self.metrics).cost(end.agent, &model, caller, *cost as f64 / NANOS);
            }
        }
        if self.spend_budgeted.load(Ordering::Relaxed) && !end.tokens.is_empty() {
            let tokens = end.tokens.total() as i64;
            let cost: i64 = costs.iter().map(|(_, c)| c).sum();
            let (caller, agent) = (end.caller.to_string(), end.agent.to_string());
            let me = self.clone();
            self.spending.fetch_add(1, Ordering::AcqRel);
            tokio::spawn(async move {
                me.spend(&caller, &agent, tokens, cost).await;
                me.spending.fetch_sub(1, Ordering::AcqRel);
                me.spent.notify_waiters();
            });
        }
    }

    /// Waits (a second at most) until the tokens of tasks that ended are counted against
    /// the budgets: an answer that waits for this is followed by calls that see them.
    pub(crate) async fn settled(&self) {
        if !self.spend_budgeted.load(Ordering::Relaxed) {
            return;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        loop {
            let notified = self.spent.notified();
            if self.spending.load(Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }

    /// The metrics' label for a model: its name, for the first [`MODELS_LABELLED`].
    fn model_label(&self, model: &str) -> String {
        let mut seen = self
            .models_labelled
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if seen.contains(model) {
            return model.to_string();
        }
        if seen.len() < MODELS_LABELLED {
            seen.insert(model.to_string());
            return model.to_string();
        }
        "other".into()
    }

    /// Adds a task's tokens and cost to the budgets they count against.
    async fn spend(&self, caller: &str, agent: &str, tokens: i64, cost: i64) {
        let in_force = self.in_force();
        let places = in_force.places(caller, agent, self.zone(), clock::now_ms());
        let mut adds = Vec::new();
        for place in &places {
            for (measure, limit) in place.budget.limits() {
                let amount = match measure {
                    Measure::Tokens => tokens,
                    Measure::Cost => cost,
                    _ => continue,
                };
                if amount > 0 {
                    adds.push((place, *measure, *limit, amount));
                }
            }
        }
        if adds.is_empty() {
            return;
        }
        let counted = (adds.iter())
            .map(|(place, measure, _, amount)| place.counted(*measure, *amount))
            .collect();
        match self.ledger.run(CounterOp::Add(counted)).await {
            Ok(CounterReply::Values(values)) => {
                for ((place, measure, limit, amount), after) in adds.iter().zip(values) {
                    self.crossed(place, *measure, *limit, after - amount, after);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, caller, agent, "budgets: a task's tokens could not be counted against them");
            }
        }
    }

    /// Step of admission: reserves this call's request (and, for a send, its task) in
    /// every budget it falls under, refusing it when one is spent. Where the call stands
    /// in the budget nearest its limit (the one spent, for a refusal) goes with either
    /// outcome, for the answer's headers.
    pub(crate) async fn admit(
        &self,
        caller: &str,
        agent: &str,
        sends: bool,
    ) -> Result<Option<Standing>, (GatewayError, Option<Standing>)> {
        let in_force = self.in_force();
        let places = in_force.places(caller, agent, self.zone(), clock::now_ms());
        if places.is_empty() {
            return Ok(None);
        }
        let charges = budgets::charges(&places, sends);
        let op = CounterOp::Reserve(charges.iter().map(|(_, _, c)| c.clone()).collect());
        let reply = self.ledger.run(op).await.map_err(|e| {
            let error =
                GatewayError::StoreUnavailable(format!("budgets could not be checked: {e}"));
            (error, None)
        })?;
        let standing = |place: &Place, measure: Measure, limit: i64, used: i64| Standing {
            budget: Arc::from(place.budget.id()),
            measure,
            limit,
            used,
            resets_ms: place.resets_ms,
        };
        match reply {
            CounterReply::Values(values) => {
                let mut nearest: Option<Standing> = None;
                for ((i, measure, charge), after) in charges.iter().zip(values) {
                    let place = &places[*i];
                    let amount = charge.counted.amount;
                    self.crossed(place, *measure, charge.limit, after - amount, after);
                    let this = standing(place, *measure, charge.limit, after);
                    let left = |s: &Standing| (s.limit - s.used) as f64 / s.limit.max(1) as f64;
                    if nearest.as_ref().is_none_or(|n| left(&this) < left(n)) {
                        nearest = Some(this);
                    }
                }
                Ok(nearest)
            }
            CounterReply::Refused { index, current } => {
                let (i, measure, charge) = &charges[index];
                let place = &places[*i];
                self.metrics.budget_refused(place.budget.id());
                let error = spent_error(place, *measure, charge.limit, current);
                Err((
                    error,
                    Some(standing(place, *measure, charge.limit, current)),
                ))
            }
            other => Err((
                GatewayError::Internal(format!("a budget reservation answered {other:?}")),
                None,
            )),
        }
    }

    /// Warns when a counter went from `before` to `after` across the budget's soft line
    /// or its limit.
    fn crossed(&self, place: &Place, measure: Measure, limit: i64, before: i64, after: i64) {
        let budget = &place.budget.config;
        let soft = budget
            .soft_percent
            .map(|p| ((limit as i128 * i128::from(p) + 99) / 100) as i64);
        let level = if before < limit && after >= limit {
            "spent"
        } else if soft.is_some_and(|s| before < s && after >= s) {
            "soft"
        } else {
            return;
        };
        self.metrics.budget_alert(&budget.id, level);
        let value = |n: i64| match measure {
            Measure::Cost => n as f64 / NANOS,
            _ => n as f64,
        };
        let alert = Alert {
            budget: budget.id.clone(),
            level,
            measure: measure.field(),
            used: value(after),
            limit: value(limit),
            caller: place.caller.clone(),
            agent: place.agent.clone(),
            resets_at: rfc3339(place.resets_ms),
            at: rfc3339(clock::now_ms()),
            webhook: budget.webhook.clone(),
        };
        tracing::warn!(
            target: "a2a_gateway::usage",
            budget = %alert.budget,
            level,
            measure = alert.measure,
            used = alert.used,
            limit = alert.limit,
            caller = %alert.caller,
            agent = %alert.agent,
            resets_at = %alert.resets_at,
            "budget {}",
            match level {
                "spent" => "spent: further calls are refused until it resets",
                _ => "past its warning line",
            }
        );
        if let (Some(deliver), Some(_)) = (self.alert.get(), &alert.webhook) {
            deliver(alert);
        }
    }

    /// Writes what this replica counted (and what its ledger spent, on one node) to the
    /// store. What a write does not take is tried again with the next.
    pub(crate) async fn flush(&self) {
        let settings = self.settings.load_full();
        let rows = {
            let mut pending = self.pending();
            let tallies = pending.take();
            let mut rows = std::mem::take(&mut pending.unwritten);
            for ((day, caller, agent), tally) in tallies {
                let label = day.format("%Y-%m-%d").to_string();
                let group = format!("u|{label}");
                let key = format!("{group}|{agent}|{caller}");
                let kept_days = i64::from(settings.retention_days) + 1;
                let expires = (day + chrono::TimeDelta::days(kept_days))
                    .and_hms_opt(0, 0, 0)
                    .map_or(i64::MAX, |t| t.and_utc().timestamp_millis());
                rows.extend(tally.rows(&group, &key, expires));
            }
            rows
        };
        if !rows.is_empty() {
            if let Err(e) = self.control.counters(CounterOp::Add(rows.clone())).await {
                tracing::warn!(error = %e, rows = rows.len(), "usage: counts could not be written; they are tried again");
                let mut pending = self.pending();
                let mut kept = rows;
                kept.append(&mut pending.unwritten);
                // Bounded: an outage long enough to pile up a million counters loses
                // the oldest.
                let excess = kept.len().saturating_sub(1_000_000);
                kept.drain(..excess);
                pending.unwritten = kept;
            }
        }
        if let Some((control, rows)) = self.ledger.take_unwritten() {
            if let Err(e) = control.counters(CounterOp::Add(rows)).await {
                tracing::warn!(error = %e, "budgets: what they spent could not be written to the store");
            }
        }
    }

    /// Writes counts every `flush_interval_ms`, and drops expired ones hourly, for as long
    /// as `usage` lives.
    pub(crate) async fn keep_writing(usage: std::sync::Weak<Usage>) {
        let mut pruned = std::time::Instant::now();
        loop {
            let Some(me) = usage.upgrade() else { return };
            let every = me.settings.load().flush;
            drop(me);
            tokio::time::sleep(every).await;
            let Some(me) = usage.upgrade() else { return };
            me.flush().await;
            if pruned.elapsed() >= Duration::from_secs(3600) {
                pruned = std::time::Instant::now();
                let now = clock::now_ms();
                me.ledger.prune(now);
                if let Err(e) = me.control.counters(CounterOp::Prune(now)).await {
                    tracing::warn!(error = %e, "usage: expired counts could not be dropped");
                }
            }
        }
    }

    /// What a budget's current windows hold, per key: for the admin API.
    pub(crate) async fn standing_of(&self, budget: &Budget) -> Result<Vec<Counted>, String> {
        let (window, _, _) = budgets::window_now(budget.config.window, self.zone());
        let (group, _) = budgets::names(budget.id(), &window, "", "");
        match self.ledger.run(CounterOp::Read(vec![group])).await? {
            CounterReply::Rows(rows) => Ok(rows),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }
}

pub(crate) fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The refusal of a call whose budget is spent.
fn spent_error(place: &Place, measure: Measure, limit: i64, used: i64) -> GatewayError {
    let window = place.budget.config.window.name();
    let whose = match (place.caller.as_str(), place.agent.as_str()) {
        ("*", "*") => String::new(),
        ("*", agent) => format!(" for agent {agent}"),
        (caller, "*") => format!(" for {caller}"),
        (caller, agent) => format!(" for {caller} on agent {agent}"),
    };
    let now = clock::now_ms();
    GatewayError::BudgetExceeded(Box::new(crate::error::BudgetSpent {
        budget: place.budget.id().to_string(),
        limit: format!("{} per {window}{whose}", measure.describe(limit)),
        used: match measure {
            Measure::Cost => format!("{:.2}", used as f64 / NANOS),
            _ => used.to_string(),
        },
        resets_at: rfc3339(place.resets_ms),
        retry_after: ((place.resets_ms - now).max(0) as u64)
            .div_ceil(1000)
            .max(1),
    }))
}

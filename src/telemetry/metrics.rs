//! The `a2a_*` metric families, on the `prometheus` crate. Label values come only from
//! configuration and from fixed sets (methods, dialects, bindings, error reasons), never
//! from what callers send, so the number of series stays bounded.
//!
//! Per-agent gauges (mailbox depth, processes, upstream health, stored tasks) are read
//! from the agents when scraped, so the request path pays only for the counters it moves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus::local::{LocalHistogram, LocalIntCounter};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Request and upstream latencies: 0.5 ms to 60 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Each worker counts the calls it answers in series of its own (prometheus's local
/// counters and histograms: plain, unshared numbers), added to the shared ones when the
/// worker flushes, every [`FLUSH_EVERY`] and before a scrape it answers. Shared atomics
/// written by every worker on every call cost 14% of the echo path (two workers, each
/// taking the other's cache lines); `with_label_values` per call hashed every label under
/// a lock. Series are keyed by where the label strings live: method, dialect, binding,
/// outcome and state are `'static`; agent names are checked on a hit.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct CallKey {
    metrics: usize,
    agent: usize,
    labels: [usize; 4],
}

/// Past this many series a worker starts its cache afresh (agents come and go by reload).
const CALL_CACHE_LIMIT: usize = 4096;

/// How often each worker adds its counts to the shared series.
pub(crate) const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

type Cache<V> = std::cell::RefCell<HashMap<CallKey, V, ahash::RandomState>>;

thread_local! {
    static CALLS: Cache<(Box<str>, (LocalIntCounter, LocalHistogram))> = Cache::default();
    static TRANSITIONS: Cache<(Box<str>, LocalIntCounter)> = Cache::default();
}

/// A worker's local series: what it adds to the shared ones when flushed.
trait Flush {
    fn flush(&self);
}

impl Flush for LocalIntCounter {
    fn flush(&self) {
        LocalIntCounter::flush(self);
    }
}

impl Flush for (LocalIntCounter, LocalHistogram) {
    fn flush(&self) {
        self.0.flush();
        self.1.flush();
    }
}

fn flush_all<V: Flush>(cache: &Cache<(Box<str>, V)>) {
    cache.borrow().values().for_each(|(_, v)| v.flush());
}

/// Adds this thread's counts to the shared series.
pub(crate) fn flush_local() {
    CALLS.with(flush_all);
    TRANSITIONS.with(flush_all);
}

/// Records into this worker's series for `key`: the one kept (a hit is checked against
/// the agent's name, whose string may have been freed and its address reused), else one
/// `make` resolves from the shared families, kept from then on.
fn record<V: Flush>(
    cache: &'static std::thread::LocalKey<Cache<(Box<str>, V)>>,
    key: CallKey,
    agent: &str,
    make: impl FnOnce() -> V,
    record: impl FnOnce(&V),
) {
    cache.with_borrow_mut(|series| {
        if let Some((name, v)) = series.get(&key) {
            if **name == *agent {
                return record(v);
            }
        }
        let v = make();
        record(&v);
        if series.len() >= CALL_CACHE_LIMIT {
            series.values().for_each(|(_, v)| v.flush());
            series.clear();
        }
        series.insert(key, (agent.into(), v));
    });
}

/// The flush loops running (one or more per worker thread).
static FLUSH_LOOPS: AtomicUsize = AtomicUsize::new(0);
/// Raised by a scrape: every loop flushes at once, and says so in [`FLUSHED`].
static FLUSH_ASKED: std::sync::LazyLock<tokio::sync::watch::Sender<u64>> =
    std::sync::LazyLock::new(|| tokio::sync::watch::channel(0).0);
static FLUSHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static FLUSHED_NOTIFY: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Flushes this thread's counts every [`FLUSH_EVERY`], and when a scrape asks (see
/// [`flush_everywhere`]); runs on each worker (spawned there) until its runtime stops.
pub(crate) async fn flush_periodically() {
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            FLUSH_LOOPS.fetch_sub(1, Ordering::AcqRel);
        }
    }
    FLUSH_LOOPS.fetch_add(1, Ordering::AcqRel);
    let _running = Running;
    let mut asked = FLUSH_ASKED.subscribe();
    let mut every = tokio::time::interval(FLUSH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => flush_local(),
            changed = asked.changed() => {
                if changed.is_err() {
                    return;
                }
                flush_local();
                FLUSHED.fetch_add(1, Ordering::AcqRel);
                FLUSHED_NOTIFY.notify_waiters();
            }
        }
    }
}

/// Has every worker add its counts to the shared series, so that a scrape sees every call
/// answered before it on any worker (a gRPC stream, an MCP call), not only its own
/// worker's; waits at most 100 ms for them.
pub(crate) async fn flush_everywhere() {
    let loops = FLUSH_LOOPS.load(Ordering::Acquire) as u64;
    let before = FLUSHED.load(Ordering::Acquire);
    FLUSH_ASKED.send_modify(|n| *n = n.wrapping_add(1));
    let all_flushed = async {
        loop {
            let notified = FLUSHED_NOTIFY.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if FLUSHED.load(Ordering::Acquire) >= before + loops {
                return;
            }
            notified.await;
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_millis(100), all_flushed).await;
}

/// Tells gateways in one process (the tests) apart in the caches.
static INSTANCES: AtomicUsize = AtomicUsize::new(0);

pub(crate) struct Metrics {
    /// This instance's number, for the per-worker caches.
    id: usize,
    enabled: bool,
    registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    first_event: HistogramVec,
    open_streams: IntGaugeVec,
    task_transitions: IntCounterVec,
    tasks: IntGaugeVec,
    stored_tasks: IntGauge,
    stored_bytes: IntGaugeVec,
    store_writable: IntGauge,
    store_outages: IntCounter,
    upstream_calls: IntCounterVec,
    upstream_duration: HistogramVec,
    upstream_healthy: IntGaugeVec,
    processes: IntGaugeVec,
    mailbox_depth: IntGaugeVec,
    mailbox_rejections: IntCounterVec,
    auth_failures: IntCounterVec,
    policy_denials: IntCounterVec,
    rate_limited: IntCounterVec,
    usage_tokens: IntCounterVec,
    usage_cost: prometheus::CounterVec,
    budget_alerts: IntCounterVec,
    budget_refusals: IntCounterVec,
    reloads: IntCounterVec,
    push: IntCounterVec,
    config: IntGaugeVec,
    connections: IntGauge,
    mcp_sessions: IntGauge,
    connections_refused: IntCounterVec,
    store_commit_failures: IntCounter,
    spans_dropped: IntCounter,
    /// One scrape at a time: scrape-time counters catch up by difference.
    scraping: std::sync::Mutex<()>,
}

/// What the task store reports when scraped.
pub(crate) struct StoreGauges {
    pub(crate) tasks: usize,
    /// The tasks' approximate bytes, the bound on them, and the largest task's.
    pub(crate) bytes: usize,
    pub(crate) bytes_limit: usize,
    pub(crate) largest_task_bytes: usize,
    /// Whether commits go through, and how many times they stopped.
    pub(crate) writable: bool,
    pub(crate) outages: u64,
    /// Commits that failed, and the time commits take (the store's own histogram).
    pub(crate) commit_failures: u64,
    pub(crate) commit_seconds: Option<Histogram>,
}

/// What the connection gate and the trace exporter report when scraped.
pub(crate) struct EdgeGauges {
    pub(crate) connections: usize,
    /// Connections refused at the gate, by the cap that refused them.
    pub(crate) refused: [(&'static str, u64); 2],
    /// Spans the trace exporter dropped (its queue full, the collector away).
    pub(crate) spans_dropped: u64,
    pub(crate) mcp_sessions: usize,
}

/// What one agent reports when scraped.
pub(crate) struct AgentGauges<'a> {
    pub(crate) agent: &'a str,
    pub(crate) mailbox_depth: usize,
    pub(crate) mailbox_rejections: u64,
    /// Command processes running and waiting for a slot, for command agents.
    pub(crate) processes: Option<(usize, usize)>,
    /// Whether the upstream answers, for upstream agents.
    pub(crate) upstream_healthy: Option<bool>,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    let h = HistogramVec::new(opts, labels).expect("valid metric");
    registry
        .register(Box::new(h.clone()))
        .expect("unique metric");
    h
}

impl Metrics {
    /// The families, registered once per gateway. `enabled: false` makes every recording
    /// a no-op (and `/metrics` is not served).
    pub(crate) fn new(enabled: bool) -> Metrics {
        let r = Registry::new();
        let stored_tasks = IntGauge::new("a2a_stored_tasks", "Tasks held in the task store.")
            .expect("valid metric");
        r.register(Box::new(stored_tasks.clone()))
            .expect("unique metric");
        let store_writable = IntGauge::new(
            "a2a_task_store_writable",
            "1 while the task store's commits go through; 0 while they fail (new tasks are refused).",
        )
        .expect("valid metric");
        r.register(Box::new(store_writable.clone()))
            .expect("unique metric");
        let store_outages = IntCounter::new(
            "a2a_task_store_outages_total",
            "Times the task store's commits started failing.",
        )
        .expect("valid metric");
        r.register(Box::new(store_outages.clone()))
            .expect("unique metric");
        let connections = IntGauge::new("a2a_open_connections", "Client connections open.")
            .expect("valid metric");
        r.register(Box::new(connections.clone()))
            .expect("unique metric");
        let mcp_sessions = IntGauge::new(
            "a2a_mcp_sessions",
            "MCP sessions open (handshake-era clients; see [mcp] max_sessions).",
        )
        .expect("valid metric");
        r.register(Box::new(mcp_sessions.clone()))
            .expect("unique metric");
        let build = gauge(
            &r,
            "a2a_build_info",
            "1, labelled by the gateway's version.",
            &["version"],
        );
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let lone = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            r.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let store_commit_failures = lone(
            "a2a_store_commit_failures_total",
            "Task store commits that failed (each is tried again).",
        );
        let spans_dropped = lone(
            "a2a_trace_spans_dropped_total",
            "Spans the OTLP exporter dropped: its queue was full or the collector did not take them.",
        );
        let call = &["agent", "method", "dialect", "binding"];
        let metrics = Metrics {
            id: INSTANCES.fetch_add(1, Ordering::Relaxed),
            enabled,
            requests: counter(
                &r,
                "a2a_requests_total",
                "A2A calls answered, by outcome (ok or the error reason).",
                &["agent", "method", "dialect", "binding", "outcome"],
            ),
            duration: histogram(
                &r,
                "a2a_request_duration_seconds",
                "Time to answer an A2A call (to the response head, for streams).",
                call,
            ),
            first_event: histogram(
                &r,
                "a2a_stream_first_event_seconds",
                "Time from a streaming call to its first SSE event.",
                &["agent", "method"],
            ),
            open_streams: gauge(&r, "a2a_open_streams", "SSE streams open.", &["agent"]),
            task_transitions: counter(
                &r,
                "a2a_task_transitions_total",
                "Tasks entering each state.",
                &["agent", "state"],
            ),
            tasks: gauge(
                &r,
                "a2a_tasks",
                "Stored tasks by state (read when scraped).",
                &["state"],
            ),
            stored_tasks,
            stored_bytes: gauge(
                &r,
                "a2a_stored_task_bytes",
                "Approximate bytes of the tasks held in memory: in all (total), the bound on them (limit), and the largest task's (largest_task).",
                &["of"],
            ),
            store_writable,
            store_outages,
            upstream_calls: counter(
                &r,
                "a2a_upstream_calls_total",
                "Calls to upstream A2A agents, by outcome.",
                &["agent", "outcome"],
            ),
            upstream_duration: histogram(
                &r,
                "a2a_upstream_call_duration_seconds",
                "Latency of upstream calls (to the response head, for streams).",
                &["agent"],
            ),
            upstream_healthy: gauge(
                &r,
                "a2a_upstream_healthy",
                "1 when the upstream's card could be fetched last time.",
                &["agent"],
            ),
            processes: gauge(
                &r,
                "a2a_command_processes",
                "Command agent processes running, and calls waiting for a process slot.",
                &["agent", "state"],
            ),
            mailbox_depth: gauge(
                &r,
                "a2a_mailbox_depth",
                "Executions admitted to an agent's mailbox and not yet running.",
                &["agent"],
            ),
            mailbox_rejections: counter(
                &r,
                "a2a_mailbox_rejections_total",
                "Calls refused because the agent's mailbox was full.",
                &["agent"],
            ),
            auth_failures: counter(
                &r,
                "a2a_auth_failures_total",
                "Requests refused by authentication or authorization, by kind.",
                &["kind"],
            ),
            policy_denials: counter(
                &r,
                "a2a_policy_denials_total",
                "Requests refused by a policy, by the rule that refused (\"(no allow rule matched)\" when allow rules applied and none held).",
                &["rule"],
            ),
            rate_limited: counter(
                &r,
                "a2a_rate_limited_total",
                "Requests refused by a rate limit.",
                &["agent"],
            ),
            usage_tokens: counter(
                &r,
                "a2a_usage_tokens_total",
                "Tokens agents reported, by agent, model (as reported; past 64 models, \"other\") and direction (input, output); with [usage] metrics_per_caller, by caller too.",
                &["agent", "model", "direction", "caller"],
            ),
            usage_cost: {
                let c = prometheus::CounterVec::new(
                    Opts::new(
                        "a2a_usage_cost_total",
                        "What the tokens cost at [pricing]'s prices, in [usage] currency, by agent and model (and caller, with metrics_per_caller).",
                    ),
                    &["agent", "model", "caller"],
                )
                .expect("valid metric");
                r.register(Box::new(c.clone())).expect("unique metric");
                c
            },
            budget_alerts: counter(
                &r,
                "a2a_budget_alerts_total",
                "Budgets that crossed their soft_percent (level soft) or reached a limit (level spent), per key and window.",
                &["budget", "level"],
            ),
            budget_refusals: counter(
                &r,
                "a2a_budget_refusals_total",
                "Calls refused because a budget was spent.",
                &["budget"],
            ),
            reloads: counter(
                &r,
                "a2a_config_reloads_total",
                "Configuration reloads, by outcome (ok, invalid; unchanged: the files changed, the configuration did not).",
                &["outcome"],
            ),
            push: counter(
                &r,
                "a2a_push_notifications_total",
                "Push notifications, by outcome: delivered, retried (an attempt that will be repeated), failed (given up), dropped (a full queue's oldest update).",
                &["outcome"],
            ),
            config: gauge(
                &r,
                "a2a_config_info",
                "1 for the configuration in force, labelled by its hash.",
                &["hash"],
            ),
            connections,
            mcp_sessions,
            connections_refused: counter(
                &r,
                "a2a_connections_refused_total",
                "Connections refused at the gate, by the cap reached (max_connections, per_ip).",
                &["reason"],
            ),
            store_commit_failures,
            spans_dropped,
            scraping: std::sync::Mutex::new(()),
            registry: r,
        };
        metrics.start_at_zero();
        metrics
    }

    /// The counters whose labels take a few known values start at 0 for each, so that a
    /// rate over them (a dashboard's panel, an alert) reads 0 before the first event
    /// rather than nothing.
    fn start_at_zero(&self) {
        let known: [(&IntCounterVec, &[&str]); 4] = [
            (&self.reloads, &["ok", "unchanged", "invalid"]),
            (&self.push, &["delivered", "retried", "failed", "dropped"]),
            (&self.connections_refused, &["max_connections", "per_ip"]),
            (
                &self.auth_failures,
                &[
                    "missing",
                    "rejected_api_key",
                    "rejected_bearer",
                    "rejected_client_certificate",
                    "forbidden",
                ],
            ),
        ];
        for (counter, values) in known {
            for value in values {
                counter.with_label_values(&[value]);
            }
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// One A2A call answered.
    pub(crate) fn request(
        &self,
        agent: &str,
        call: [&'static str; 3],
        outcome: &'static str,
        seconds: f64,
    ) {
        if !self.enabled {
            return;
        }
        let [method, dialect, binding] = call;
        let key = CallKey {
            metrics: self.id,
            agent: agent.as_ptr() as usize,
            labels: [method, dialect, binding, outcome].map(|l| l.as_ptr() as usize),
        };
        record(
            &CALLS,
            key,
            agent,
            || {
                let count = self
                    .requests
                    .with_label_values(&[agent, method, dialect, binding, outcome]);
                let time = self
                    .duration
                    .with_label_values(&[agent, method, dialect, binding]);
                (count.local(), time.local())
            },
            |(count, time)| {
                count.inc();
                time.observe(seconds);
            },
        );
    }

    /// The timer of a stream's first event, and the gauge of the stream being open. Both
    /// are handed to the stream, which reports as it runs and when it ends.
    pub(crate) fn stream(&self, agent: &str, method: &str) -> Option<(Histogram, IntGauge)> {
        if !self.enabled {
            return None;
        }
        Some((
            self.first_event.with_label_values(&[agent, method]),
            self.open_streams.with_label_values(&[agent]),
        ))
    }

    pub(crate) fn task_entered(&self, agent: &str, state: &'static str) {
        if !self.enabled {
            return;
        }
        let key = CallKey {
            metrics: self.id,
            agent: agent.as_ptr() as usize,
            labels: [state.as_ptr() as usize, 0, 0, 0],
        };
        record(
            &TRANSITIONS,
            key,
            agent,
            || {
                self.task_transitions
                    .with_label_values(&[agent, state])
                    .local()
            },
            LocalIntCounter::inc,
        );
    }

    /// The counters of one upstream agent's calls, resolved once per agent.
    pub(crate) fn upstream(&self, agent: &str) -> Option<UpstreamCalls> {
        self.enabled.then(|| UpstreamCalls {
            ok: self.upstream_calls.with_label_values(&[agent, "ok"]),
            error: self.upstream_calls.with_label_values(&[agent, "error"]),
            unavailable: self
                .upstream_calls
                .with_label_values(&[agent, "unavailable"]),
            duration: self.upstream_duration.with_label_values(&[agent]),
        })
    }

    pub(crate) fn auth_failure(&self, kind: &str) {
        if self.enabled {
            self.auth_failures.with_label_values(&[kind]).inc();
        }
    }

    /// One push notification delivered, retried, given up or dropped.
    pub(crate) fn push(&self, outcome: &'static str) {
        if self.enabled {
            self.push.with_label_values(&[outcome]).inc();
        }
    }

    pub(crate) fn policy_denied(&self, rule: &str) {
        if self.enabled {
            self.policy_denials.with_label_values(&[rule]).inc();
        }
    }

    /// Tokens an agent reported (`direction`: input or output).
    pub(crate) fn tokens(&self, agent: &str, model: &str, direction: &str, caller: &str, n: u64) {
        if self.enabled && n > 0 {
            let labels = [agent, model, direction, caller];
            self.usage_tokens.with_label_values(&labels).inc_by(n);
        }
    }

    pub(crate) fn cost(&self, agent: &str, model: &str, caller: &str, amount: f64) {
        if self.enabled && amount > 0.0 {
            let labels = [agent, model, caller];
            self.usage_cost.with_label_values(&labels).inc_by(amount);
        }
    }

    /// A budget crossed its warning line (`soft`) or reached a limit (`spent`).
    pub(crate) fn budget_alert(&self, budget: &str, level: &'static str) {
        if self.enabled {
            self.budget_alerts.with_label_values(&[budget, level]).inc();
        }
    }

    pub(crate) fn budget_refused(&self, budget: &str) {
        if self.enabled {
            self.budget_refusals.with_label_values(&[budget]).inc();
        }
    }

    pub(crate) fn rate_limited(&self, agent: &str) {
        if self.enabled {
            self.rate_limited.with_label_values(&[agent]).inc();
        }
    }

    /// A reload's outcome: `ok`, `invalid`, or `unchanged` (the files changed, the
    /// configuration they make did not).
    pub(crate) fn reload(&self, outcome: &'static str) {
        self.reloads.with_label_values(&[outcome]).inc();
    }

    /// The configuration now in force.
    pub(crate) fn config_loaded(&self, hash: &str) {
        self.config.reset();
        self.config.with_label_values(&[hash]).set(1);
    }

    /// Forgets the series of agents no longer configured.
    pub(crate) fn agent_removed(&self, agent: &str) {
        let _ = self.mailbox_depth.remove_label_values(&[agent]);
        let _ = self.mailbox_rejections.remove_label_values(&[agent]);
        let _ = self.upstream_healthy.remove_label_values(&[agent]);
        for state in ["running", "waiting"] {
            let _ = self.processes.remove_label_values(&[agent, state]);
        }
    }

    /// The text exposition, after setting the gauges read at scrape time.
    pub(crate) fn render<'a>(
        &self,
        agents: impl Iterator<Item = AgentGauges<'a>>,
        tasks_by_state: &[(&str, usize)],
        store: &StoreGauges,
        edge: &EdgeGauges,
    ) -> Vec<u8> {
        flush_local();
        let _one_at_a_time = self
            .scraping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for a in agents {
            self.mailbox_depth
                .with_label_values(&[a.agent])
                .set(a.mailbox_depth as i64);
            // The agent counts; the counter catches up with it.
            let rejections = self.mailbox_rejections.with_label_values(&[a.agent]);
            rejections.inc_by(a.mailbox_rejections.saturating_sub(rejections.get()));
            if let Some((running, waiting)) = a.processes {
                self.processes
                    .with_label_values(&[a.agent, "running"])
                    .set(running as i64);
                self.processes
                    .with_label_values(&[a.agent, "waiting"])
                    .set(waiting as i64);
            }
            if let Some(healthy) = a.upstream_healthy {
                self.upstream_healthy
                    .with_label_values(&[a.agent])
                    .set(i64::from(healthy));
            }
        }
        self.tasks.reset();
        for (state, n) in tasks_by_state {
            self.tasks.with_label_values(&[state]).set(*n as i64);
        }
        self.stored_tasks.set(store.tasks as i64);
        for (of, n) in [
            ("total", store.bytes),
            ("limit", store.bytes_limit),
            ("largest_task", store.largest_task_bytes),
        ] {
            self.stored_bytes
                .with_label_values(&[of])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.store_writable.set(i64::from(store.writable));
        self.store_outages
            .inc_by(store.outages.saturating_sub(self.store_outages.get()));
        let catch_up = |counter: &IntCounter, total: u64| {
            counter.inc_by(total.saturating_sub(counter.get()));
        };
        catch_up(&self.store_commit_failures, store.commit_failures);
        catch_up(&self.spans_dropped, edge.spans_dropped);
        self.connections.set(edge.connections as i64);
        self.mcp_sessions.set(edge.mcp_sessions as i64);
        for (reason, total) in edge.refused {
            catch_up(
                &self.connections_refused.with_label_values(&[reason]),
                total,
            );
        }
        let mut families = self.registry.gather();
        if let Some(commits) = &store.commit_seconds {
            families.extend(prometheus::core::Collector::collect(commits));
        }
        let mut out = Vec::with_capacity(16 * 1024);
        // Encoding into memory fails only on a metric that could not be registered.
        let _ = TextEncoder::new().encode(&families, &mut out);
        out
    }
}

/// One upstream agent's call counters.
#[derive(Clone)]
pub(crate) struct UpstreamCalls {
    ok: IntCounter,
    error: IntCounter,
    unavailable: IntCounter,
    duration: Histogram,
}

impl UpstreamCalls {
    /// A call that got an answer (`ok`), an A2A error (`error`), or none (`unavailable`:
    /// refused, timed out, unreadable).
    pub(crate) fn count(&self, outcome: UpstreamOutcome) {
        match outcome {
            UpstreamOutcome::Ok => &self.ok,
            UpstreamOutcome::Error => &self.error,
            UpstreamOutcome::Unavailable => &self.unavailable,
        }
        .inc();
    }

    /// How long the exchange took (to the response head, for streams).
    pub(crate) fn took(&self, seconds: f64) {
        self.duration.observe(seconds);
    }
}

#[derive(Clone, Copy)]
pub(crate) enum UpstreamOutcome {
    Ok,
    Error,
    Unavailable,
}

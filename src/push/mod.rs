//! Delivering push notifications: one ordered queue per config, retries with backoff and
//! jitter, a cap on deliveries in flight per destination, and the destination policy
//! ([`policy`]) checked at connect time. What to send, and when, is the service's
//! business (`service/push.rs`); this only carries bodies to URLs, and never makes the
//! task or any other webhook wait.

pub(crate) mod policy;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use tokio::sync::Semaphore;

use crate::config::PushSettings;
use crate::telemetry::Metrics;

pub(crate) use crate::signing::Signer;
pub(crate) use policy::Policy;

/// The header a config's token goes in (what the SDKs' receivers check).
pub(crate) const TOKEN_HEADER: &str = "X-A2A-Notification-Token";

/// How a notification authenticates, besides the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Authorization {
    None,
    /// `Authorization: <scheme> <credentials>`, as the config gave them.
    Header(String),
    /// `Authorization: Bearer <a JWT the gateway signs for this notification>`.
    GatewayJwt,
}

/// Where one config's notifications go.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) task_id: String,
    pub(crate) config_id: String,
    pub(crate) url: String,
    pub(crate) token: Option<String>,
    pub(crate) authorization: Authorization,
}

/// One notification, rendered.
#[derive(Debug, Clone)]
pub(crate) struct Notification {
    pub(crate) body: bytes::Bytes,
    pub(crate) content_type: &'static str,
    /// The task's last one: never dropped from a full queue.
    pub(crate) last: bool,
    /// The same on every copy of it (each retry; an update sent again by the replica that
    /// took its following over), sent as [`ID_HEADER`]: a receiver that keeps the ids it
    /// handled handles each notification once.
    id: String,
}

/// The header carrying a notification's [`Notification`] id.
pub(crate) const ID_HEADER: &str = "X-A2A-Gateway-Notification-Id";

impl Notification {
    pub(crate) fn new(body: bytes::Bytes, content_type: &'static str) -> Notification {
        Notification {
            body,
            content_type,
            last: false,
            id: uuid::Uuid::new_v4().simple().to_string(),
        }
    }

    /// Task `task_id`'s final state for its config `config_id`: the same id whichever
    /// replica sends it.
    pub(crate) fn final_state(
        body: bytes::Bytes,
        content_type: &'static str,
        task_id: &str,
        config_id: &str,
    ) -> Notification {
        Notification {
            body,
            content_type,
            last: true,
            id: keyed_id(task_id, config_id, b"final"),
        }
    }

    /// An update of task `task_id` for its config `config_id`: the same id for the same
    /// body whichever replica sends it (a successor sends again what its follower had not
    /// noted delivered). Every update's body differs from the others' (each carries its
    /// own timestamp, artifact or history).
    pub(crate) fn update(
        body: bytes::Bytes,
        content_type: &'static str,
        task_id: &str,
        config_id: &str,
    ) -> Notification {
        let id = keyed_id(task_id, config_id, &body);
        Notification {
            body,
            content_type,
            last: false,
            id,
        }
    }
}

/// A notification's id from what it is: 32 hex digits of a SHA-256.
fn keyed_id(task_id: &str, config_id: &str, what: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::new()
        .chain_update(task_id)
        .chain_update([0])
        .chain_update(config_id)
        .chain_update([0])
        .chain_update(what)
        .finalize();
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// A notification someone waits for: whether it is still this gateway's to send, asked
/// just before it goes (another replica may have taken its task over meanwhile), and what
/// is told once it was delivered, given up or not sent.
struct Tracked {
    still_ours: futures_util::future::BoxFuture<'static, bool>,
    done: tokio::sync::oneshot::Sender<()>,
}

pub(crate) struct Pusher {
    settings: PushSettings,
    policy: Arc<Policy>,
    client: reqwest::Client,
    signer: Arc<Signer>,
    /// Deliveries in flight per destination (scheme://host:port); entries go when idle.
    destinations: DashMap<String, Arc<Semaphore>, ahash::RandomState>,
    /// The queue of every config with notifications waiting or in flight.
    queues: DashMap<(String, String), Arc<Queue>, ahash::RandomState>,
    metrics: Arc<Metrics>,
    /// Each attempt's span, when spans are exported.
    tracing: Option<Arc<crate::telemetry::Tracing>>,
}

/// A worker runs while the queue has notifications, and leaves when it is empty.
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    /// Each with what is told once it is delivered or given up, if someone waits.
    pending: VecDeque<(Target, Notification, Option<Tracked>)>,
    /// A worker delivers from it.
    started: bool,
    /// Its worker has stopped (nothing was left, or the config was deleted): a new
    /// notification needs a new queue.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Why one attempt failed, and whether another may succeed.
struct Failure {
    why: String,
    retry: bool,
    /// What the receiver asked for (`Retry-After`).
    wait: Option<Duration>,
}

impl Pusher {
    /// `issuer` names the gateway in the JWTs it signs.
    pub(crate) fn new(
        settings: &PushSettings,
        signer: Arc<Signer>,
        metrics: Arc<Metrics>,
        tracing: Option<Arc<crate::telemetry::Tracing>>,
    ) -> Result<Pusher, String> {
        let policy = Arc::new(Policy::new(settings));
        let timeout = Duration::from_secs(settings.timeout_secs);
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(policy.resolver()))
            // A redirect could lead anywhere; the receiver's URL is the only one called.
            .redirect(reqwest::redirect::Policy::none())
            // A proxy from the environment would connect where the policy cannot look.
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!(
                "a2a-gateway/",
                env!("CARGO_PKG_VERSION"),
                " (push)"
            ))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| format!("push: the HTTP client: {e}"))?;
        Ok(Pusher {
            settings: settings.clone(),
            policy,
            client,
            signer,
            destinations: DashMap::default(),
            queues: DashMap::default(),
            metrics,
            tracing,
        })
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    pub(crate) fn settings(&self) -> &PushSettings {
        &self.settings
    }

    /// The JWKS receivers verify notification JWTs with.
    pub(crate) fn jwks(&self) -> serde_json::Value {
        self.signer.jwks()
    }

    /// Queues `note` for `target`'s config; sent after everything queued before it.
    pub(crate) fn enqueue(self: &Arc<Self>, target: Target, note: Notification) {
        self.queue(target, note, None);
    }

    /// [`Self::enqueue`], sent only if `still_ours` (awaited just before it goes) says so;
    /// resolves once the notification was delivered, given up or not sent (an error:
    /// dropped unsent, superseded or its config deleted).
    pub(crate) fn enqueue_tracked(
        self: &Arc<Self>,
        target: Target,
        note: Notification,
        still_ours: futures_util::future::BoxFuture<'static, bool>,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let (done, rx) = tokio::sync::oneshot::channel();
        self.queue(target, note, Some(Tracked { still_ours, done }));
        rx
    }

    fn queue(self: &Arc<Self>, target: Target, note: Notification, done: Option<Tracked>) {
        let key = (target.task_id.clone(), target.config_id.clone());
        let mut item = Some((target, note, done));
        while let Some((target, note, done)) = item.take() {
            let queue = self.queues.entry(key.clone()).or_default().clone();
            let mut state = queue.lock();
            if state.closed {
                // Its worker is leaving; it takes the map entry with it. Try again.
                drop(state);
                self.queues.remove_if(&key, |_, q| Arc::ptr_eq(q, &queue));
                item = Some((target, note, done));
                continue;
            }
            let starts = !std::mem::replace(&mut state.started, true);
            // A newer final state supersedes one still waiting (a config made again for a
            // finished task, say): one is kept, so finals cannot pile up either.
            if note.last {
                state.pending.retain(|(_, n, _)| !n.last);
            }
            state.pending.push_back((target, note, done));
            if state.pending.len() > self.settings.max_queued_per_config {
                // The oldest update that is not the task's last goes.
                if let Some(i) = state.pending.iter().position(|(_, n, _)| !n.last) {
                    state.pending.remove(i);
                    self.metrics.push("dropped");
                    tracing::warn!(task = %key.0, config = %key.1, "push queue full: dropped the oldest waiting notification");
                }
            }
            drop(state);
            if starts {
                self.start(key.clone(), queue);
            }
        }
    }

    /// Deliveries for a deleted config stop (the one in flight finishes).
    pub(crate) fn forget(&self, task_id: &str, config_id: &str) {
        let key = (task_id.to_string(), config_id.to_string());
        if let Some((_, queue)) = self.queues.remove(&key) {
            let mut state = queue.lock();
            state.pending.clear();
            state.closed = true;
        }
    }

    fn start(self: &Arc<Self>, key: (String, String), queue: Arc<Queue>) {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let next = {
                    let mut state = queue.lock();
                    match state.pending.pop_front() {
                        Some(item) => Some(item),
                        None if state.closed => return,
                        None => {
                            // Idle: close, and leave the map, under the queue's lock, so
                            // a notification queued meanwhile finds it closed.
                            state.closed = true;
                            None
                        }
                    }
                };
                match next {
                    Some((target, note, None)) => me.deliver(&target, &note).await,
                    Some((target, note, Some(tracked))) => {
                        if tracked.still_ours.await {
                            me.deliver(&target, &note).await;
                        } else {
                            tracing::info!(task = %target.task_id, config = %target.config_id, "push: another replica follows the task now and sends this");
                        }
                        let _ = tracked.done.send(());
                    }
                    None => {
                        me.queues.remove_if(&key, |_, q| Arc::ptr_eq(q, &queue));
                        return;
                    }
                }
            }
        });
    }

    /// One notification, with retries; the outcome is logged and counted.
    async fn deliver(&self, target: &Target, note: &Notification) {
        let first = Instant::now();
        let budget = Duration::from_secs(self.settings.retry_for_secs);
        let mut backoff = Duration::from_millis(self.settings.initial_backoff_ms);
        let max_backoff = Duration::from_secs(self.settings.max_backoff_secs);
        let mut attempt = 1;
        let failure = loop {
            match self.attempt(target, note, attempt).await {
                Ok(()) => {
                    self.metrics.push("delivered");
                    tracing::debug!(task = %target.task_id, config = %target.config_id, attempt, "push notification delivered");
                    return;
                }
                Err(f) if !f.retry || attempt >= self.settings.max_attempts => break f,
                Err(f) => {
                    let wait = f.wait.unwrap_or_else(|| jittered(backoff)).min(max_backoff);
                    if first.elapsed() + wait > budget {
                        break f;
                    }
                    self.metrics.push("retried");
                    tracing::info!(task = %target.task_id, config = %target.config_id, attempt, error = %f.why, retry_in_ms = wait.as_millis() as u64, "push notification not delivered; retrying");
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(max_backoff);
                    attempt += 1;
                }
            }
        };
        self.metrics.push("failed");
        tracing::warn!(task = %target.task_id, config = %target.config_id, destination = %destination(&target.url), attempts = attempt, error = %failure.why, "push notification given up");
    }

    async fn attempt(
        &self,
        target: &Target,
        note: &Notification,
        attempt: u32,
    ) -> Result<(), Failure> {
        // Its own trace, linked to the request that made the task; the receiver gets it as
        // its parent.
        let mut span = self.tracing.as_ref().map(|t| {
            use opentelemetry::KeyValue;
            t.push_attempt(
                &target.task_id,
                vec![
                    KeyValue::new("server.address", destination(&target.url)),
                    KeyValue::new("a2a.task.id", target.task_id.clone()),
                    KeyValue::new("a2a.push.config.id", target.config_id.clone()),
                    KeyValue::new("a2a.push.attempt", i64::from(attempt)),
                ],
            )
        });
        let trace = span.as_ref().map(|s| s.header());
        let outcome = self.attempt_traced(target, note, trace).await;
        if let Some(span) = span.as_mut() {
            let result = match &outcome {
                Ok(()) => "delivered",
                Err(f) if f.retry => "retry",
                Err(_) => "failed",
            };
            span.set(opentelemetry::KeyValue::new("a2a.push.outcome", result));
            if let Err(f) = &outcome {
                span.fail(f.why.clone());
            }
        }
        outcome
    }

    async fn attempt_traced(
        &self,
        target: &Target,
        note: &Notification,
        trace: Option<(String, Option<String>)>,
    ) -> Result<(), Failure> {
        let permits = self.destination(&target.url);
        let _permit = permits.acquire().await.map_err(|_| Failure {
            why: "closed".into(),
            retry: false,
            wait: None,
        })?;
        let outcome = self.post(target, note, trace).await;
        drop(_permit);
        self.destinations
            .remove_if(&destination(&target.url), |_, s| {
                Arc::strong_count(s) <= 2
                    && s.available_permits() == self.settings.max_per_destination
            });
        outcome
    }

    async fn post(
        &self,
        target: &Target,
        note: &Notification,
        trace: Option<(String, Option<String>)>,
    ) -> Result<(), Failure> {
        // Checked when the config was made; checked again, as the policy may refuse
        // address literals only (names are checked as they are connected to).
        self.policy.check_form(&target.url).map_err(|why| Failure {
            why,
            retry: false,
            wait: None,
        })?;
        let mut req = self
            .client
            .post(&target.url)
            .header(CONTENT_TYPE, note.content_type)
            .header(ID_HEADER, &note.id)
            .body(note.body.clone());
        if let Some(token) = &target.token {
            req = req.header(TOKEN_HEADER, token);
        }
        if let Some((parent, state)) = trace {
            req = req.header("traceparent", parent);
            if let Some(state) = state {
                req = req.header("tracestate", state);
            }
        }
        match &target.authorization {
            Authorization::None => {}
            Authorization::Header(value) => {
                if let Ok(v) = HeaderValue::from_str(value) {
                    req = req.header(AUTHORIZATION, v);
                }
            }
            Authorization::GatewayJwt => {
                let jwt = self
                    .signer
                    .sign(&target.url, &target.task_id, &note.body)
                    .map_err(|why| Failure {
                        why,
                        retry: false,
                        wait: None,
                    })?;
                req = req.header(AUTHORIZATION, format!("Bearer {jwt}"));
            }
        }
        let resp = req.send().await.map_err(|e| {
            // Without the URL: its path or query may hold the receiver's secret.
            let why = crate::error::error_chain(&e.without_url());
            // The policy refusing every address does not change by retrying.
            let refused = why.contains("push.allow");
            Failure {
                why,
                retry: !refused,
                wait: None,
            }
        })?;
        // The body is never read: a receiver's answer is its status.
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let wait = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        if status.is_redirection() {
            let to = resp
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("?");
            return Err(Failure {
                why: format!("answered {status} to {to}; redirects are not followed"),
                retry: false,
                wait: None,
            });
        }
        let retry = status.is_server_error()
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || status == reqwest::StatusCode::REQUEST_TIMEOUT;
        Err(Failure {
            why: format!("answered {status}"),
            retry,
            wait,
        })
    }

    fn destination(&self, url: &str) -> Arc<Semaphore> {
        self.destinations
            .entry(destination(url))
            .or_insert_with(|| Arc::new(Semaphore::new(self.settings.max_per_destination)))
            .clone()
    }
}

/// What deliveries are counted per: scheme, host and port.
fn destination(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => format!(
            "{}://{}:{}",
            u.scheme(),
            u.host_str().unwrap_or_default(),
            u.port_or_known_default().unwrap_or_default()
        ),
        Err(_) => url.to_string(),
    }
}

/// Between half of `backoff` and all of it ("equal jitter"), so retries spread out
/// without any coming back at once.
fn jittered(backoff: Duration) -> Duration {
    use ring::rand::SecureRandom as _;
    let mut byte = [0u8; 2];
    let _ = ring::rand::SystemRandom::new().fill(&mut byte);
    let fraction = f64::from(u16::from_le_bytes(byte)) / f64::from(u16::MAX);
    backoff.mul_f64(0.5 + fraction / 2.0)
}

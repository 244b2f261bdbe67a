//! The `a2a` backend: an A2A agent served elsewhere, reached over JSON-RPC in whichever
//! dialect it speaks.
//!
//! The remote owns its tasks; the gateway forwards every operation and keeps no copy. Task
//! ids are namespaced as `<agent>.<remote id>` on the way out, so ids from different
//! remotes never collide and any task id names the agent that owns it.

mod failure;
mod grpc;
mod ledger;
pub(crate) mod resolve;
// Its decoder is re-exported for the fuzz targets (lib.rs), so its items stay `pub`.
mod pool;
#[allow(unreachable_pub)]
pub(crate) mod sse;
mod transport;
mod upstream_stream;
mod wire;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use serde_json::Value;

use self::failure::Failure;
use self::ledger::Ledger;
use self::transport::Transport;
use self::upstream_stream::Relay;
use self::wire::TaskOp;
use super::AgentHealth;
use crate::config::A2aConfig;
use crate::error::GatewayError;
use crate::protocol::model::{Message, StreamEnd, StreamItem, Task, TaskState};
use crate::protocol::ops::SendResult;
use crate::protocol::ops::{ItemStream, ListTasksResponse, SendRequest};
use crate::protocol::params::ListQuery;
use crate::protocol::Dialect;
use crate::telemetry::{UpstreamCalls, UpstreamOutcome};

/// A stream's bytes, from reqwest or from the gRPC adapter.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where and how to talk to the remote.
#[derive(Clone, Debug)]
struct Upstream {
    /// Parsed once: every call would otherwise parse it again (IDNA included).
    uri: http::Uri,
    dialect: Dialect,
    /// Whether the agent file's `headers` go with calls: only to the file's own origin.
    secrets: bool,
    /// Served over gRPC, with the tenant its card names: `Some(None)` without.
    grpc: Option<Option<String>>,
}

impl Upstream {
    fn parse(url: &str, dialect: Dialect) -> Result<Upstream, String> {
        // Through the WHATWG parser first: it normalizes what http::Uri would take as is.
        let endpoint = reqwest::Url::parse(url).map_err(|e| format!("url \"{url}\": {e}"))?;
        let uri = endpoint
            .as_str()
            .parse()
            .map_err(|e| format!("url \"{url}\": {e}"))?;
        Ok(Upstream {
            uri,
            dialect,
            secrets: true,
            grpc: None,
        })
    }

    /// A card's gRPC interface: `url` is a gRPC target (`host:port`) or an http(s) URL.
    fn grpc(url: &str, tenant: Option<&str>, dialect: Dialect) -> Result<Upstream, String> {
        let url = match url.contains("://") {
            true => url.to_string(),
            false => format!("http://{url}"),
        };
        Ok(Upstream {
            grpc: Some(tenant.filter(|t| !t.is_empty()).map(str::to_string)),
            ..Upstream::parse(&url, dialect)?
        })
    }

    /// The `A2A-Version` header a call to this remote carries. Absent means 0.3 to every
    /// SDK; the JavaScript one compares the value exactly.
    fn version_header(&self) -> Option<(HeaderName, HeaderValue)> {
        (self.dialect == Dialect::V10).then(|| {
            (
                HeaderName::from_static("a2a-version"),
                HeaderValue::from_static("1.0"),
            )
        })
    }
}

#[derive(Default)]
struct State {
    card: Option<Arc<Value>>,
    /// The extended card, fetched with the file's credentials when the card offers one.
    extended: Option<Arc<Value>>,
    /// The extensions the card marks required, read once per card.
    required_extensions: Arc<[String]>,
    upstream: Option<Arc<Upstream>>,
    healthy: bool,
}

pub(crate) struct RemoteAgent {
    name: Arc<str>,
    config: A2aConfig,
    /// Streams. The file's headers are added per call, when the call may carry them.
    client: reqwest::Client,
    headers: HeaderMap,
    /// Every other call.
    transport: Transport,
    /// Calls to an upstream served over gRPC.
    grpc: grpc::GrpcTransport,
    forced: Option<Dialect>,
    state: RwLock<State>,
    next_id: AtomicU64,
    /// The tasks relayed while the upstream speaks 0.3, which has no ListTasks.
    ledger: Ledger,
    card_changes: super::CardChanges,
    /// Call counters, when metrics are on.
    calls: Option<UpstreamCalls>,
}

/// The longest pause between two reads of a task a blocking send waits for.
const POLL_INTERVAL_MAX: Duration = Duration::from_millis(500);

/// How long a caller's stream waits for the upstream's first event before it starts (and
/// its keep-alives with it): errors come back as plain JSON-RPC answers until then.
const FIRST_EVENT_GRACE: Duration = Duration::from_secs(1);

/// How many relayed tasks each 0.3 upstream's ledger keeps (the oldest created go first).
const LEDGER_CAPACITY: usize = 10_000;

impl RemoteAgent {
    pub(crate) fn new(
        name: &str,
        config: A2aConfig,
        card_changes: super::CardChanges,
        calls: Option<UpstreamCalls>,
    ) -> Result<RemoteAgent, String> {
        let mut headers = HeaderMap::new();
        for (k, v) in &config.headers {
            // Validated at load; a failure here is a bug, reported rather than ignored.
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?;
            let mut value = HeaderValue::from_str(v).map_err(|e| e.to_string())?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        // Link-local addresses only where the file itself names one, whatever a name resolves to.
        let resolver = resolve::GuardedResolver {
            allow_link_local: reqwest::Url::parse(&config.url)
                .ok()
                .and_then(|u| u.host().map(|h| resolve::is_link_local_host(&h)))
                .unwrap_or(false),
        };
        let transport = Transport::new(&config, headers.clone(), resolver)?;
        let grpc = grpc::GrpcTransport::new(&config, resolver)?;
        let mut builder = reqwest::Client::builder().dns_resolver(Arc::new(resolver));
        if config.http2 {
            builder = builder.http2_prior_knowledge();
        }
        // A JSON-RPC call is never replayed, with the file's headers, at an address the
        // agent file does not name: no redirects.
        let client = builder
            .use_preconfigured_tls(transport::tls_config(&config)?)
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(config.connect_timeout_secs))
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(4096)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        let forced = match config.protocol.as_deref() {
            Some("0.3") => Some(Dialect::V03),
            Some("1.0") => Some(Dialect::V10),
            _ => None,
        };
        // With the protocol given and a base URL, calls can go out before (or without)
        // the card: the base URL is the JSON-RPC endpoint of every SDK server.
        let upstream = match forced.filter(|_| !is_card_url(&config.url)) {
            Some(dialect) => Some(Upstream::parse(&config.url, dialect)?),
            None => None,
        };
        Ok(RemoteAgent {
            name: Arc::from(name),
            config,
            client,
            headers,
            transport,
            grpc,
            forced,
            state: RwLock::new(State {
                upstream: upstream.map(Arc::new),
                ..State::default()
            }),
            next_id: AtomicU64::new(1),
            ledger: Ledger::new(LEDGER_CAPACITY),
            card_changes,
            calls,
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn health(&self) -> AgentHealth {
        if self.read().healthy {
            AgentHealth::Healthy
        } else {
            AgentHealth::Unhealthy
        }
    }

    /// The remote card as last fetched, if ever.
    pub(crate) fn card(&self) -> Option<Arc<Value>> {
        self.read().card.clone()
    }

    /// The extensions the remote's card marks required.
    pub(crate) fn required_extensions(&self) -> Arc<[String]> {
        self.read().required_extensions.clone()
    }

    /// The remote's extended card as last fetched, when its card offers one.
    pub(crate) fn extended_card(&self) -> Option<Arc<Value>> {
        self.read().extended.clone()
    }

    /// The remote's extended card: asked for with the agent file's credentials, as the
    /// dialect names the call (over whatever binding the upstream is reached by).
    async fn fetch_extended(&self, up: &Upstream) -> Result<Value, String> {
        let method = match up.dialect {
            Dialect::V10 => "GetExtendedAgentCard",
            Dialect::V03 | Dialect::V01 => "agent/getAuthenticatedExtendedCard",
        };
        let body = serde_json::to_vec(&wire::Envelope {
            jsonrpc: "2.0",
            id: self.request_id(),
            method,
            params: serde_json::json!({}),
        })
        .map_err(|e| e.to_string())?;
        let card = self.call(up, body).await.map_err(|e| e.to_string())?;
        let card: Value = serde_json::from_str(card.get()).map_err(|e| e.to_string())?;
        match card.is_object() {
            true => Ok(card),
            false => Err(format!("the answer is not a card: {card}")),
        }
    }

    pub(crate) fn stream_keepalive(&self) -> Option<Duration> {
        self.config.stream_keepalive_secs.map(Duration::from_secs)
    }

    fn card_urls(&self) -> Vec<String> {
        let url = self.config.url.trim_end_matches('/');
        if is_card_url(url) {
            vec![url.to_string()]
        } else {
            vec![
                format!("{url}/.well-known/agent-card.json"),
                format!("{url}/.well-known/agent.json"),
            ]
        }
    }

    /// The endpoint the file names itself (a base URL and `protocol`), if it does.
    fn pinned_endpoint(&self) -> Option<Upstream> {
        let dialect = self.forced.filter(|_| !is_card_url(&self.config.url))?;
        Upstream::parse(&self.config.url, dialect).ok()
    }

    /// Keeps calls on the origin the agent file names. A card naming another origin (where
    /// the file's headers would go) has its path used on the file's origin, unless the file
    /// says `follow_card_url`; then the card's origin is called without the file's headers,
    /// and never a link-local address (cloud metadata) the file does not name.
    fn on_file_origin(&self, up: Upstream) -> Result<Upstream, String> {
        let file = reqwest::Url::parse(&self.config.url).map_err(|e| e.to_string())?;
        let chosen = reqwest::Url::parse(&up.uri.to_string()).map_err(|e| e.to_string())?;
        if chosen.origin() == file.origin() {
            return Ok(up);
        }
        if up.grpc.is_some() {
            // A gRPC interface is a port of its own: on the host the file names, it is the
            // file's agent. Elsewhere its path cannot be moved onto the file's origin.
            if chosen.host_str() == file.host_str() {
                return Ok(up);
            }
            if !self.config.follow_card_url {
                return Err(format!(
                    "the card's gRPC interface is on another host ({chosen}); follow_card_url = true calls it, without the agent file's headers"
                ));
            }
        }
        if !self.config.follow_card_url {
            tracing::warn!(agent = %self.name, card = %chosen, "the card names another origin; calls stay on the agent file's (follow_card_url = true follows the card)");
            let mut pinned = file;
            pinned.set_path(chosen.path());
            pinned.set_query(chosen.query());
            return Upstream::parse(pinned.as_str(), up.dialect);
        }
        if chosen
            .host()
            .is_some_and(|h| resolve::is_link_local_host(&h))
        {
            return Err(format!(
                "the card points at {chosen}, a link-local address the agent file does not name"
            ));
        }
        Ok(Upstream {
            secrets: false,
            ..up
        })
    }

    /// Fetches the remote card and picks the endpoint and dialect from it.
    pub(crate) async fn refresh(&self) -> Result<(), String> {
        let mut last_err = String::from("no card URL");
        for url in self.card_urls() {
            match self.fetch_card(&url).await {
                Ok(card) if self.config.verify_card_signature => {
                    match self.verify_signature(card).await {
                        Ok(card) => return self.keep_card(card, &url).await,
                        Err(e) => {
                            // Never served: not as this agent's card, not through its URLs.
                            self.write().healthy = false;
                            return Err(format!("the card at {url} is refused: {e}"));
                        }
                    }
                }
                Ok(card) => return self.keep_card(card, &url).await,
                Err(e) => last_err = e,
            }
        }
        self.write().healthy = false;
        Err(last_err)
    }

    /// Checks the card's signature against the keys the agent file names; the card as it
    /// was signed. A hybrid card (1.0 with 0.3's members added, as the Python SDK serves
    /// one) may be signed in its 1.0 form only: then that form is the card kept, so that
    /// nothing unsigned is used.
    async fn verify_signature(&self, card: Value) -> Result<Value, String> {
        let keys = match (&self.config.card_jwks_file, &self.config.card_jwks_url) {
            (Some(file), _) => {
                std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?
            }
            (None, Some(url)) => self
                .transport
                .get_card(url)
                .await
                .map_err(|e| format!("fetching the keys at {url}: {e}"))?
                .to_vec(),
            (None, None) => return Err("no keys to check it with".into()),
        };
        let keys: jsonwebtoken::jwk::JwkSet =
            serde_json::from_slice(&keys).map_err(|e| format!("the keys are not a JWKS: {e}"))?;
        let whole = crate::signing::verify_card(&card, &keys);
        if whole.is_ok() || card.get("supportedInterfaces").is_none() {
            return whole
                .map(|()| card)
                .map_err(|e| format!("its signature: {e}"));
        }
        let mut v10 = card;
        if let Some(obj) = v10.as_object_mut() {
            for key in crate::protocol::V03_CARD_MEMBERS {
                obj.remove(key);
            }
        }
        crate::signing::verify_card(&v10, &keys)
            .map(|()| v10)
            .map_err(|e| format!("its signature: {e}"))
    }

    /// A fetched card, its endpoint chosen and its extended card fetched, kept.
    async fn keep_card(&self, card: Value, url: &str) -> Result<(), String> {
        let upstream = match self.pinned_endpoint() {
            // The file names the endpoint and its dialect: the card only describes.
            Some(up) => Ok(up),
            None => choose_upstream(&card, url, self.forced)
                .ok_or_else(|| "the remote card offers no JSON-RPC interface".to_string())
                .and_then(|up| self.on_file_origin(up)),
        };
        let extended = match &upstream {
            Ok(up) if offers_extended_card(&card) => match self.fetch_extended(up).await {
                Ok(extended) => Some(extended),
                Err(e) => {
                    tracing::warn!(agent = %self.name, error = %e, "the upstream's extended card could not be fetched: only its public card is served");
                    None
                }
            },
            _ => None,
        };
        let mut state = self.write();
        let up = match upstream {
            Ok(up) => up,
            Err(e) => {
                state.healthy = false;
                return Err(e);
            }
        };
        state.upstream = Some(Arc::new(up));
        let changed =
            state.card.as_deref() != Some(&card) || state.extended.as_deref() != extended.as_ref();
        if changed {
            let listed = card["capabilities"]["extensions"].as_array();
            state.required_extensions = listed
                .into_iter()
                .flatten()
                .filter(|e| e["required"] == true)
                .filter_map(|e| e["uri"].as_str().map(str::to_string))
                .collect();
            state.card = Some(Arc::new(card));
            state.extended = extended.map(Arc::new);
            self.card_changes.bump();
        }
        state.healthy = true;
        Ok(())
    }

    async fn fetch_card(&self, url: &str) -> Result<Value, String> {
        let body = self
            .transport
            .get_card(url)
            .await
            .map_err(|e| format!("fetching {url}: {e}"))?;
        serde_json::from_slice(&body).map_err(|e| format!("reading the card at {url}: {e}"))
    }

    /// How long until the next card fetch: the refresh period, or the retry period while
    /// the remote is down.
    pub(crate) fn refresh_interval(&self, healthy: bool) -> Duration {
        Duration::from_secs(if healthy {
            self.config.card_refresh_secs
        } else {
            self.config.retry_secs
        })
    }

    /// Keeps the card fresh for as long as the gateway runs; retries sooner while down.
    /// Fetches the card once, then gives the loop that keeps it fresh (to spawn).
    pub(crate) async fn first_refresh(
        self: Arc<Self>,
    ) -> impl std::future::Future<Output = ()> + Send {
        let result = self.refresh().await;
        if let Err(e) = &result {
            tracing::warn!(agent = %self.name, error = %e, "upstream agent unavailable");
        }
        let first_delay = self.refresh_interval(result.is_ok());
        self.keep_fresh(first_delay)
    }

    /// Refreshes the card periodically until the agent is dropped (removed by a reload).
    pub(crate) async fn keep_fresh(self: Arc<Self>, first_delay: Duration) {
        let this = Arc::downgrade(&self);
        drop(self);
        tokio::time::sleep(first_delay).await;
        while let Some(me) = this.upgrade() {
            let healthy = match me.refresh().await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(agent = %me.name, error = %e, "upstream card unavailable");
                    false
                }
            };
            let pause = me.refresh_interval(healthy);
            drop(me);
            tokio::time::sleep(pause).await;
        }
    }

    fn upstream(&self) -> Result<Arc<Upstream>, GatewayError> {
        self.read()
            .upstream
            .clone()
            .ok_or_else(|| self.unavailable("its agent card could not be fetched yet"))
    }

    fn unavailable(&self, reason: &str) -> GatewayError {
        GatewayError::AgentUnavailable {
            agent: self.name.to_string(),
            reason: reason.to_string(),
        }
    }

    fn request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Maps a transport failure to an answer, and notes the remote as down when it is.
    fn transport_error(&self, failure: Failure) -> GatewayError {
        tracing::warn!(agent = %self.name, error = %failure.detail(), "upstream request failed");
        match failure {
            Failure::Timeout => GatewayError::UpstreamTimeout {
                agent: self.name.to_string(),
                secs: self.config.timeout_secs,
            },
            Failure::Connect { refused, .. } => {
                self.write().healthy = false;
                self.unavailable(if refused {
                    "connection refused"
                } else {
                    "could not connect"
                })
            }
            Failure::Broken(_) => self.unavailable("the connection failed"),
            Failure::TooLarge => GatewayError::InvalidAgentResponse(format!(
                "agent {} answered with more than {} MiB",
                self.name,
                failure::MAX_ANSWER_BYTES >> 20
            )),
        }
    }

    fn reqwest_error(&self, e: reqwest::Error) -> GatewayError {
        self.transport_error(Failure::from_reqwest(&e))
    }

    fn note_alive(&self) {
        if !self.read().healthy {
            self.write().healthy = true;
        }
    }

    /// A streaming call, through reqwest.
    fn post(&self, up: &Upstream, body: Vec<u8>) -> reqwest::RequestBuilder {
        let mut req = self
            .client
            // reqwest parses it again whatever it is given; streams are rare enough.
            .post(up.uri.to_string())
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        if up.secrets {
            req = req.headers(self.headers.clone());
        }
        if let Some((name, value)) = up.version_header() {
            req = req.header(name, value);
        }
        if let Some((name, value)) = transport::extension_header(up.dialect) {
            req = req.header(name, value);
        }
        for (name, value) in transport::trace_headers(&up.uri) {
            req = req.header(name, value);
        }
        req
    }

    /// One non-streaming JSON-RPC call; returns the raw result.
    async fn call(
        &self,
        up: &Upstream,
        body: Vec<u8>,
    ) -> Result<Box<serde_json::value::RawValue>, GatewayError> {
        let body = self.exchange(up, body).await?;
        self.counted(wire::read_response(&self.name, &body).map(ToOwned::to_owned))
    }

    /// Counts an answered call as ok or as an A2A error.
    fn counted<T>(&self, answer: Result<T, GatewayError>) -> Result<T, GatewayError> {
        if let Some(calls) = &self.calls {
            calls.count(match answer {
                Ok(_) => UpstreamOutcome::Ok,
                Err(_) => UpstreamOutcome::Error,
            });
        }
        answer
    }

    /// One non-streaming JSON-RPC request and its response body; the caller counts its
    /// outcome (an answer may still be an error), this counts calls that got none.
    async fn exchange(&self, up: &Upstream, body: Vec<u8>) -> Result<bytes::Bytes, GatewayError> {
        let started = std::time::Instant::now();
        let answer = match &up.grpc {
            None => {
                self.transport
                    .post_json(
                        &up.uri,
                        up.version_header(),
                        transport::extension_header(up.dialect),
                        up.secrets,
                        body,
                    )
                    .await
            }
            Some(tenant) => {
                let headers = self.secret_headers(up);
                let tenant = tenant.as_deref();
                let call = self.grpc.unary(&up.uri, up.dialect, tenant, headers, &body);
                Box::pin(call).await
            }
        };
        self.took(started, answer.is_ok());
        let body = answer.map_err(|f| self.transport_error(f))?;
        self.note_alive();
        Ok(body)
    }

    /// Records an exchange's latency, and counts one that got no answer.
    fn took(&self, started: std::time::Instant, answered: bool) {
        crate::telemetry::upstream_answered(answered);
        if let Some(calls) = &self.calls {
            calls.took(started.elapsed().as_secs_f64());
            if !answered {
                calls.count(UpstreamOutcome::Unavailable);
            }
        }
    }

    /// The remote's id for one of our namespaced ids, or "not found" when it is not ours.
    fn inward<'a>(&self, id: &'a str) -> Result<&'a str, GatewayError> {
        id.strip_prefix(&*self.name)
            .and_then(|rest| rest.strip_prefix('.'))
            .filter(|rest| !rest.is_empty())
            .ok_or_else(|| GatewayError::TaskNotFound(id.to_string()))
    }

    fn outward(&self, id: &mut String) {
        *id = format!("{}.{id}", self.name);
    }

    fn outward_message(&self, m: &mut Message) {
        if let Some(t) = m.task_id.as_mut() {
            self.outward(t);
        }
        for r in &mut m.reference_task_ids {
            self.outward(r);
        }
    }

    fn outward_task(&self, t: &mut Task) {
        self.outward(&mut t.id);
        if let Some(m) = t.status.message.as_mut() {
            self.outward_message(m);
        }
        for m in &mut t.history {
            self.outward_message(m);
        }
    }

    fn outward_item(&self, item: &mut StreamItem) {
        match item {
            StreamItem::Task(t) => self.outward_task(t),
            StreamItem::Message(m) => self.outward_message(m),
            StreamItem::StatusUpdate(s) => {
                self.outward(&mut s.task_id);
                if let Some(m) = s.status.message.as_mut() {
                    self.outward_message(m);
                }
            }
            StreamItem::ArtifactUpdate(a) => self.outward(&mut a.task_id),
        }
    }

    /// The caller's message with the remote's ids in it (borrowed when it names no task).
    fn inward_message<'m>(&self, message: &'m Message) -> Result<Cow<'m, Message>, GatewayError> {
        if message.task_id.is_none() && message.reference_task_ids.is_empty() {
            return Ok(Cow::Borrowed(message));
        }
        let mut m = message.clone();
        if let Some(t) = &m.task_id {
            m.task_id = Some(self.inward(t)?.to_string());
        }
        // References to tasks of other agents mean nothing upstream; drop them.
        m.reference_task_ids = message
            .reference_task_ids
            .iter()
            .filter_map(|r| self.inward(r).ok().map(str::to_string))
            .collect();
        Ok(Cow::Owned(m))
    }

    pub(crate) async fn send(&self, req: &SendRequest) -> Result<SendResult, GatewayError> {
        let sent = self.send_once(req).await?;
        if !req.blocking {
            return Ok(sent);
        }
        let unsettled = match &sent {
            SendResult::Relayed(r) => r
                .state()
                .filter(|s| !s.ends_stream())
                .and_then(|_| r.task_id.clone()),
            SendResult::Task(t) if !t.status.state.ends_stream() => Some(t.id.clone()),
            _ => None,
        };
        match unsettled {
            // Boxed: the wait is rare, and inline it would make every send's future as
            // large as a GetTask call.
            Some(id) => Ok(Box::pin(self.until_settled(&id, req.history_length, sent)).await),
            None => Ok(sent),
        }
    }

    /// A blocking send the upstream answered before the task settled (fasta2a answers
    /// every send at once, `submitted`): the caller asked to wait, so the gateway does,
    /// reading the task until it ends or asks for input. Past `timeout_secs`, or when the
    /// task cannot be read, the caller gets the task as last seen, as a blocking send
    /// whose upstream gave up waiting would.
    async fn until_settled(
        &self,
        id: &str,
        history_length: Option<usize>,
        sent: SendResult,
    ) -> SendResult {
        let until = tokio::time::Instant::now() + Duration::from_secs(self.config.timeout_secs);
        let mut pause = Duration::from_millis(20);
        let mut last = sent;
        while tokio::time::Instant::now() + pause < until {
            tokio::time::sleep(pause).await;
            match self.get(id, history_length).await {
                Ok(task) => {
                    let settled = task.status.state.ends_stream();
                    last = SendResult::Task(task);
                    if settled {
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!(agent = %self.name, task = %id, error = %e, "a blocking send's task could not be read; answered as last seen");
                    break;
                }
            }
            pause = (pause * 2).min(POLL_INTERVAL_MAX);
        }
        last
    }

    async fn send_once(&self, req: &SendRequest) -> Result<SendResult, GatewayError> {
        let up = self.upstream()?;
        let message = self.inward_message(&req.message)?;
        let body = wire::send_body(up.dialect, false, self.request_id(), req, &message)?;
        let body = self.exchange(&up, body).await?;
        if up.dialect == req.reply_dialect {
            if let Some(relayed) = self.relay(up.dialect, &body, req.history_length) {
                return self.counted(Ok(relayed));
            }
            // Not something the relay can vouch for (an error, the other dialect's shape,
            // snake_case, a malformed field): converted like any other answer, or refused.
        }
        let raw = self.counted(wire::read_response(&self.name, &body))?;
        Ok(match wire::read_send_result(&self.name, raw)? {
            SendResult::Task(mut t) => {
                self.outward_task(&mut t);
                SendResult::Task(t.trimmed(req.history_length, true))
            }
            SendResult::Message(mut m) => {
                self.outward_message(&mut m);
                SendResult::Message(m)
            }
            relayed @ SendResult::Relayed(_) => relayed,
        })
    }

    /// A send result for a caller that speaks the remote's dialect: passed on as the remote
    /// wrote it, with its task ids namespaced and its history trimmed.
    fn relay(
        &self,
        dialect: Dialect,
        body: &bytes::Bytes,
        history_length: Option<usize>,
    ) -> Option<SendResult> {
        let mut relayed = wire::read_relayed(dialect, body)?;
        let namespaced = |id: &str| {
            let mut out = String::with_capacity(self.name.len() + 1 + id.len());
            out.push_str(&self.name);
            out.push('.');
            out.push_str(id);
            out
        };
        relayed.rewrite(&namespaced, history_length).ok()?;
        Some(SendResult::Relayed(Box::new(relayed)))
    }

    pub(crate) async fn stream(
        self: &Arc<Self>,
        req: &SendRequest,
    ) -> Result<ItemStream, GatewayError> {
        let up = self.upstream()?;
        let message = self.inward_message(&req.message)?;
        let body = wire::send_body(up.dialect, true, self.request_id(), req, &message)?;
        let me = self.clone();
        self.started(async move { me.open_stream(&up, body, StreamEnd::Interrupted).await })
            .await
    }

    /// Waits for an upstream stream's first event, within `timeout_secs`. What fails before
    /// it, quickly as upstreams fail, is returned as an error (a plain JSON-RPC answer); an
    /// upstream still silent after [`FIRST_EVENT_GRACE`] gets the caller's stream started
    /// (its keep-alives run) and is waited for inside it, a failure then ending the stream.
    async fn started(
        self: &Arc<Self>,
        open: impl std::future::Future<Output = Result<Relay, GatewayError>> + Send + 'static,
    ) -> Result<ItemStream, GatewayError> {
        let limit = Duration::from_secs(self.config.timeout_secs);
        let (name, secs) = (self.name.to_string(), self.config.timeout_secs);
        let mut open = Box::pin(async move {
            tokio::time::timeout(limit, open)
                .await
                .unwrap_or(Err(GatewayError::UpstreamTimeout { agent: name, secs }))
        });
        tokio::select! {
            relay = &mut open => Ok(relay?.into_stream()),
            _ = tokio::time::sleep(FIRST_EVENT_GRACE.min(limit)) => {
                let items = futures_util::stream::once(open).flat_map(|relay| match relay {
                    Ok(relay) => relay.into_stream(),
                    Err(e) => ItemStream::new(futures_util::stream::iter([Err(e)])),
                });
                Ok(ItemStream::new(items))
            }
        }
    }

    pub(crate) async fn get(
        &self,
        id: &str,
        history_length: Option<usize>,
    ) -> Result<Task, GatewayError> {
        self.task_call(TaskOp::Get, id, history_length).await
    }

    /// A cancel the upstream answers with the task finished otherwise (fasta2a answers so
    /// for a task that had already ended) did not cancel it: the spec's not-cancelable.
    /// Cancels an upstream task. A task that had already ended is not cancelable, as with
    /// the gateway's own agents (-32002), whatever the upstream answers: some answer the
    /// task as it is (fasta2a), canceled long before this call included.
    pub(crate) async fn cancel(&self, id: &str) -> Result<Task, GatewayError> {
        // How far apart the upstream's clock and this one may be: a task canceled earlier
        // than that before this call was canceled by someone else, before it.
        const CLOCKS_APART: chrono::TimeDelta = chrono::TimeDelta::seconds(2);
        let asked = chrono::Utc::now();
        let task = self.task_call(TaskOp::Cancel, id, None).await?;
        let canceled_before = (task.status.timestamp).is_some_and(|at| at < asked - CLOCKS_APART);
        match task.status.state {
            TaskState::Canceled if !canceled_before => Ok(task),
            state if state.is_terminal() => Err(GatewayError::TaskNotCancelable {
                id: id.to_string(),
                state: state.v03_name(),
            }),
            _ => Ok(task),
        }
    }

    async fn task_call(
        &self,
        op: TaskOp,
        id: &str,
        history_length: Option<usize>,
    ) -> Result<Task, GatewayError> {
        let up = self.upstream()?;
        let remote_id = self.inward(id)?;
        let body = wire::task_body(up.dialect, op, self.request_id(), remote_id, history_length)?;
        let raw = self.call(&up, body).await?;
        let mut task = wire::read_task(&self.name, &raw)?;
        self.outward_task(&mut task);
        Ok(task.trimmed(history_length, true))
    }

    /// A subscription to task `id`; `ended` says what a task that has ended gets.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        id: &str,
        ended: Ended,
    ) -> Result<ItemStream, GatewayError> {
        let up = self.upstream()?;
        let remote_id = self.inward(id)?;
        let body = wire::task_body(
            up.dialect,
            TaskOp::Subscribe,
            self.request_id(),
            remote_id,
            None,
        )?;
        let (me, id) = (self.clone(), id.to_string());
        self.started(async move {
            let mut relay = match me.open_stream(&up, body, StreamEnd::Terminal).await {
                Ok(relay) => relay,
                Err(refused) if refuses_subscriptions(&refused) => {
                    // Some servers (a2a-sdk 0.3) answer "task not found" for a task no
                    // producer runs for, such as one waiting for input, though tasks/get
                    // finds it: then the gateway follows the task itself.
                    let task = me.get(&id, None).await.map_err(|_| refused)?;
                    if task.status.state.is_terminal() && ended == Ended::Refused {
                        return Err(task.status.state.already_ended(&id));
                    }
                    // A finished task followed is shown once: the relay ends at it.
                    tracing::debug!(agent = %me.name, task = %id, "the upstream refused a subscription; following the task by polling");
                    return Ok(Relay::following(me.clone(), task));
                }
                Err(e) => return Err(e),
            };
            // A finished task has nothing to subscribe to, whatever the upstream sends
            // (fasta2a: the task, then the end).
            if let Some(StreamItem::Task(t)) = relay.first() {
                if t.status.state.is_terminal() && ended == Ended::Refused {
                    return Err(t.status.state.already_ended(&id));
                }
            }
            // 1.0 opens a subscription with the task itself; a 0.3 upstream's resubscribe
            // may not send it, so it is fetched.
            if !matches!(relay.first(), Some(StreamItem::Task(_))) {
                let task = me.get(&id, None).await?;
                relay.put_first(StreamItem::Task(task));
            }
            Ok(relay)
        })
        .await
    }

    /// Whether the upstream's card says it streams (subscriptions included).
    pub(crate) fn streams(&self) -> bool {
        self.card()
            .is_some_and(|c| c["capabilities"]["streaming"] == true)
    }

    /// Whether the upstream's card says it sends push notifications.
    pub(crate) fn pushes(&self) -> bool {
        self.card()
            .is_some_and(|c| c["capabilities"]["pushNotifications"] == true)
    }

    /// Asks the upstream to notify `url` (the gateway's own webhook, with `token`) of
    /// the task `id`'s updates.
    pub(crate) async fn register_webhook(
        &self,
        id: &str,
        url: &str,
        token: &str,
    ) -> Result<(), GatewayError> {
        let up = self.upstream()?;
        let remote_id = self.inward(id)?;
        let body = wire::push_body(up.dialect, self.request_id(), remote_id, url, token)?;
        self.call(&up, body).await.map(drop)
    }

    /// A notification the upstream pushed to the gateway's webhook, as a stream item with
    /// the gateway's ids.
    pub(crate) fn read_pushed(&self, body: &[u8]) -> Result<StreamItem, GatewayError> {
        let raw: &serde_json::value::RawValue = serde_json::from_slice(body).map_err(|e| {
            GatewayError::InvalidParams(format!("the notification is not JSON: {e}"))
        })?;
        let mut item = wire::read_stream_item(&self.name, raw)?.ok_or_else(|| {
            GatewayError::InvalidParams("the notification is no task, message or task event".into())
        })?;
        self.outward_item(&mut item);
        Ok(item)
    }

    /// Keeps the ledger in a durable store: what it held for this agent (task id, record;
    /// oldest first) and where later changes go. Once per agent instance.
    pub(crate) fn keep_ledger(
        &self,
        journal: &crate::store::Journal,
        loaded: impl FnOnce() -> Vec<(String, String)>,
    ) {
        if !self.ledger.is_kept() {
            self.ledger.keep(&self.name, journal.clone(), loaded());
        }
    }

    /// Takes in what other replicas relayed to this 0.3 upstream, for a ListTasks that
    /// covers them (`read` gets the records from the shared store); nothing to do for
    /// other upstreams.
    pub(crate) async fn take_in_ledger<F, Fut>(&self, read: F) -> Result<(), GatewayError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Vec<(String, String)>, GatewayError>>,
    {
        if let Some(ledger) = self.ledger() {
            let records = read().await?;
            ledger.take_in(records);
        }
        Ok(())
    }

    /// The ledger, while the upstream speaks 0.3 (1.0 upstreams list their own tasks).
    fn ledger(&self) -> Option<&Ledger> {
        let v03 = self
            .read()
            .upstream
            .as_ref()
            .is_some_and(|up| up.dialect == Dialect::V03);
        v03.then_some(&self.ledger)
    }

    /// Records what a send returned, for ListTasks on 0.3 upstreams.
    pub(crate) fn note_result(&self, owner: &Arc<str>, result: &SendResult) {
        let Some(ledger) = self.ledger() else {
            return;
        };
        match result {
            SendResult::Task(t) => ledger.note(owner, &t.id, &t.context_id, &t.status),
            SendResult::Relayed(r) => {
                if let (Some(id), Some(context), Some(status)) =
                    (&r.task_id, &r.context_id, r.status())
                {
                    ledger.note(owner, id, context, &status);
                }
            }
            SendResult::Message(_) => {}
        }
    }

    /// Records a streamed item of `owner`'s task, for ListTasks on 0.3 upstreams.
    pub(crate) fn note_item(&self, owner: &Arc<str>, item: &StreamItem) {
        let Some(ledger) = self.ledger() else {
            return;
        };
        match item {
            StreamItem::Task(t) => ledger.note(owner, &t.id, &t.context_id, &t.status),
            StreamItem::StatusUpdate(s) => ledger.note(owner, &s.task_id, &s.context_id, &s.status),
            StreamItem::ArtifactUpdate(_) | StreamItem::Message(_) => {}
        }
    }

    /// Records the newest status of a task read or canceled.
    pub(crate) fn note_task(&self, task: &Task) {
        if let Some(ledger) = self.ledger() {
            ledger.update(&task.id, &task.status);
        }
    }

    /// `principal`'s tasks: from the upstream when it speaks 1.0 (the caller keeps only
    /// its own), from the ledger when it speaks 0.3. Tasks the ledger holds are fetched
    /// again when the caller asks for history or artifacts, or may have moved on.
    pub(crate) async fn list(
        &self,
        principal: &str,
        query: &ListQuery,
    ) -> Result<ListTasksResponse, GatewayError> {
        let up = self.upstream()?;
        if up.dialect == Dialect::V03 {
            return self.list_from_ledger(principal, query).await;
        }
        let raw = self
            .call(&up, wire::list_body(self.request_id(), query)?)
            .await?;
        let list = wire::read_list(&self.name, &raw)?;
        Ok(ListTasksResponse {
            tasks: list
                .tasks
                .into_iter()
                .map(|mut t| {
                    self.outward_task(&mut t);
                    t.trimmed(query.history_length, query.include_artifacts)
                })
                .collect(),
            next_page_token: list.next_page_token,
            page_size: query.page_size,
            total_size: list.total_size,
        })
    }

    async fn list_from_ledger(
        &self,
        principal: &str,
        query: &ListQuery,
    ) -> Result<ListTasksResponse, GatewayError> {
        let (records, next_page_token, total_size) = self.ledger.page(principal, query)?;
        let details = query.history_length != Some(0) || query.include_artifacts;
        let tasks = futures_util::future::join_all(records.into_iter().map(|r| async move {
            if details || !r.state.is_terminal() {
                match self.get(&r.id, query.history_length).await {
                    Ok(task) => {
                        self.ledger.update(&task.id, &task.status);
                        return task.trimmed(query.history_length, query.include_artifacts);
                    }
                    Err(e) => {
                        tracing::debug!(agent = %self.name, task = %r.id, error = %e, "listing a task as last seen");
                    }
                }
            }
            r.summary()
        }))
        .await;
        Ok(ListTasksResponse {
            tasks,
            next_page_token,
            page_size: query.page_size,
            total_size,
        })
    }

    /// The agent file's headers, for a call that may carry them.
    fn secret_headers(&self, up: &Upstream) -> &HeaderMap {
        static NONE: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(HeaderMap::new);
        match up.secrets {
            true => &self.headers,
            false => &NONE,
        }
    }

    /// Opens an upstream SSE call and reads its first event. Errors before the stream
    /// starts (a plain JSON-RPC body, or an error as the first event) are returned as errors.
    async fn open_stream(
        self: &Arc<Self>,
        up: &Upstream,
        body: Vec<u8>,
        end: StreamEnd,
    ) -> Result<Relay, GatewayError> {
        if let Some(tenant) = &up.grpc {
            let started = std::time::Instant::now();
            let headers = self.secret_headers(up);
            let opened = self
                .grpc
                .stream(&up.uri, up.dialect, tenant.as_deref(), headers, &body)
                .await;
            self.took(started, opened.is_ok());
            let events = opened.map_err(|f| self.transport_error(f))?;
            self.note_alive();
            return self.counted(Relay::open(self.clone(), end, events).await);
        }
        let started = std::time::Instant::now();
        let resp = self
            .post(up, body)
            .header(ACCEPT, "text/event-stream")
            .send()
            .await;
        self.took(started, resp.is_ok());
        let resp = resp.map_err(|e| self.reqwest_error(e))?;
        transport::note_activated(resp.headers());
        self.note_alive();
        let is_sse = is_event_stream(resp.headers());
        if !is_sse {
            let body = failure::read_capped(http::Response::from(resp).into_body())
                .await
                .map_err(|f| self.transport_error(f))?;
            self.counted(wire::read_response(&self.name, &body))?;
            return Err(GatewayError::InvalidAgentResponse(format!(
                "agent {} answered a streaming call without a stream",
                self.name
            )));
        }
        let events = resp
            .bytes_stream()
            .map(|r| r.map_err(BoxError::from))
            .boxed();
        self.counted(Relay::open(self.clone(), end, events).await)
    }
}

impl RemoteAgent {
    /// The stream of task `id` (as the gateway names it) after the upstream's event
    /// `last_id`: a subscription with `Last-Event-ID`, for a stream whose connection broke.
    /// JSON-RPC upstreams only (gRPC streams carry no event ids).
    pub(super) async fn resume_stream(
        self: &Arc<Self>,
        id: &str,
        last_id: &str,
    ) -> Result<
        futures_util::stream::BoxStream<'static, Result<bytes::Bytes, BoxError>>,
        GatewayError,
    > {
        let up = self.upstream()?;
        if up.grpc.is_some() {
            return Err(GatewayError::UnsupportedOperation(
                "resuming a gRPC upstream stream".into(),
            ));
        }
        let remote_id = self.inward(id)?;
        let body = wire::task_body(
            up.dialect,
            TaskOp::Subscribe,
            self.request_id(),
            remote_id,
            None,
        )?;
        let resp = self
            .post(&up, body)
            .header(ACCEPT, "text/event-stream")
            .header("last-event-id", last_id)
            .send()
            .await
            .map_err(|e| self.reqwest_error(e))?;
        let is_sse = is_event_stream(resp.headers());
        if !is_sse {
            return Err(GatewayError::InvalidAgentResponse(format!(
                "agent {} did not resume its stream (status {})",
                self.name,
                resp.status()
            )));
        }
        self.note_alive();
        Ok(resp
            .bytes_stream()
            .map(|r| r.map_err(BoxError::from))
            .boxed())
    }
}

/// What a subscription to a task that has ended gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// An error, as the spec has it for a subscription.
    Refused,
    /// The task as it ended, then the end of the stream: a resumed stream that no log
    /// reaches (it was relayed elsewhere, or long ago).
    Shown,
}

/// Whether an upstream answered with an event stream.
fn is_event_stream(headers: &reqwest::header::HeaderMap) -> bool {
    (headers.get(CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        })
}

/// An upstream's refusal of a subscription that `GetTask` may show to be wrong: task not
/// found, unsupported operation, no such method, or invalid params (a2a-sdk 0.3.x's answer
/// for a finished task, which the spec answers as unsupported).
fn refuses_subscriptions(e: &GatewayError) -> bool {
    matches!(
        e,
        GatewayError::Upstream {
            code: -32001 | -32004 | -32601 | -32602,
            ..
        }
    )
}

/// Whether a card says its agent has an extended card (1.0's capability, or 0.3's flag).
fn offers_extended_card(card: &Value) -> bool {
    card["capabilities"]["extendedAgentCard"] == true
        || card["supportsAuthenticatedExtendedCard"] == true
}

fn is_card_url(url: &str) -> bool {
    url.trim_end_matches('/').ends_with(".json")
}

fn major_minor(v: &str) -> Option<Dialect> {
    crate::protocol::Dialect::from_version_header(Some(v))
        .ok()
        .flatten()
}

/// Picks the remote's JSON-RPC endpoint: its 1.0 interface if it has one (or the forced
/// dialect's), else its 0.3 one, else the 0.3 top-level `url`. A card served over gRPC
/// only gets its gRPC interface: 1.0's, else 0.3's.
fn choose_upstream(card: &Value, card_url: &str, forced: Option<Dialect>) -> Option<Upstream> {
    let jsonrpc: Vec<(Option<Dialect>, &str)> = card["supportedInterfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["protocolBinding"].as_str().unwrap_or("JSONRPC") == "JSONRPC")
        .filter_map(|i| {
            let url = i["url"].as_str()?;
            Some((i["protocolVersion"].as_str().and_then(major_minor), url))
        })
        .collect();
    let top_level = card["url"].as_str().filter(|_| {
        card["preferredTransport"]
            .as_str()
            .is_none_or(|t| t == "JSONRPC")
    });
    let order = match forced {
        Some(d) => vec![d],
        None => vec![Dialect::V10, Dialect::V03],
    };
    for dialect in order {
        let from_interfaces = jsonrpc
            .iter()
            .find(|(d, _)| *d == Some(dialect))
            .map(|(_, u)| *u);
        let url = match dialect {
            Dialect::V10 => from_interfaces,
            Dialect::V03 => from_interfaces.or(top_level),
            Dialect::V01 => None,
        }
        .or_else(|| forced.and(jsonrpc.first().map(|(_, u)| *u).or(top_level)));
        // An interface URL that does not parse is no interface.
        if let Some(up) = url.and_then(|u| Upstream::parse(&resolve(card_url, u), dialect).ok()) {
            return Some(up);
        }
    }
    grpc_interfaces(card)
        .into_iter()
        .filter(|(dialect, _, _)| forced.is_none_or(|d| d == *dialect))
        .find_map(|(dialect, url, tenant)| Upstream::grpc(url, tenant, dialect).ok())
}

/// A card's gRPC interfaces, 1.0's first, as (dialect, target, tenant): 1.0 lists them in
/// `supportedInterfaces`; a 0.3 card names one by its top-level `url` when it prefers
/// gRPC, or in `additionalInterfaces`.
fn grpc_interfaces(card: &Value) -> Vec<(Dialect, &str, Option<&str>)> {
    let listed = |key: &str, binding: &'static str| {
        card[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter(move |i| i[binding] == "GRPC")
            .filter_map(move |i| Some((i, i["url"].as_str()?)))
    };
    let mut found: Vec<_> = listed("supportedInterfaces", "protocolBinding")
        .filter_map(|(i, url)| {
            let dialect = i["protocolVersion"].as_str().and_then(major_minor)?;
            Some((dialect, url, i["tenant"].as_str()))
        })
        .collect();
    let preferred = card["url"]
        .as_str()
        .filter(|_| card["preferredTransport"] == "GRPC");
    let additional = listed("additionalInterfaces", "transport").map(|(_, url)| url);
    found.extend(
        preferred
            .into_iter()
            .chain(additional)
            .map(|url| (Dialect::V03, url, None)),
    );
    found.sort_by_key(|(dialect, _, _)| *dialect != Dialect::V10);
    found
}

/// `url` as the card at `card_url` means it (absolute, or relative to the card).
fn resolve(card_url: &str, url: &str) -> String {
    reqwest::Url::parse(card_url)
        .and_then(|base| base.join(url))
        .map_or_else(|_| url.to_string(), String::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prefers_1_0_then_0_3_then_the_top_level_url() {
        let both = json!({"supportedInterfaces": [
            {"url": "http://r/v03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
            {"url": "http://r/v10", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]});
        let up = choose_upstream(&both, "http://r/card.json", None).unwrap();
        assert_eq!(
            (up.uri.to_string().as_str(), up.dialect),
            ("http://r/v10", Dialect::V10)
        );
        let up = choose_upstream(&both, "http://r/card.json", Some(Dialect::V03)).unwrap();
        assert_eq!(
            (up.uri.to_string().as_str(), up.dialect),
            ("http://r/v03", Dialect::V03)
        );
        let legacy = json!({"url": "/rpc", "protocolVersion": "0.3.0"});
        let up = choose_upstream(&legacy, "http://r:9/.well-known/agent-card.json", None).unwrap();
        assert_eq!(
            (up.uri.to_string().as_str(), up.dialect),
            ("http://r:9/rpc", Dialect::V03)
        );
        let rest_only = json!({"supportedInterfaces": [
            {"url": "http://r/rest", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"}]});
        assert!(choose_upstream(&rest_only, "http://r/c.json", None).is_none());
    }

    #[test]
    fn a_card_served_over_grpc_only_gets_its_grpc_interface_in_its_dialect() {
        let grpc = |card: &Value, forced| {
            let up = choose_upstream(card, "http://r/c.json", forced)?;
            Some((up.uri.to_string(), up.dialect, up.grpc?))
        };
        let v03 =
            json!({"url": "r:50051", "preferredTransport": "GRPC", "protocolVersion": "0.3.0"});
        assert_eq!(
            grpc(&v03, None),
            Some(("http://r:50051/".into(), Dialect::V03, None))
        );
        assert_eq!(grpc(&v03, Some(Dialect::V10)), None);
        let additional = json!({"url": "http://r/rpc", "preferredTransport": "HTTP+JSON",
            "additionalInterfaces": [{"url": "r:9", "transport": "GRPC"}]});
        assert_eq!(grpc(&additional, None).unwrap().1, Dialect::V03);
        let both = json!({"supportedInterfaces": [
            {"url": "r:3", "protocolBinding": "GRPC", "protocolVersion": "0.3"},
            {"url": "r:10", "protocolBinding": "GRPC", "protocolVersion": "1.0", "tenant": "t"}]});
        assert_eq!(
            grpc(&both, None),
            Some(("http://r:10/".into(), Dialect::V10, Some("t".into())))
        );
        assert_eq!(grpc(&both, Some(Dialect::V03)).unwrap().0, "http://r:3/");
    }
}

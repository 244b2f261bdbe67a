//! The HTTP surface: routes and thin handlers. Handlers extract, call the service or the
//! card builders, and render; everything else lives in the layers below.

pub(crate) mod admission;
mod body;
mod caller;
mod card_cache;
mod cards;
mod console;
mod cors;
mod health;
mod jsonrpc;
mod lifecycle;
mod live;
mod normalize;
mod observe;
mod push;
mod rejections;
mod rest;
mod sse;
mod tls;
mod usage;

use std::borrow::Cow;
use std::sync::Arc;

use actix_web::http::header::{self, HeaderName};
use actix_web::{web, HttpRequest, HttpResponse};

use crate::agents::{Agent, Registry};
use crate::auth::Principal;
use crate::error::GatewayError;
use crate::limits::{StreamGauge, StreamSlot};
use crate::routing::{self, Router, Served};
use crate::service::A2aService;
use crate::telemetry::Metrics;

pub(crate) use body::{check_json_type, read_body, read_chunks, BodyLimits, Feeding, Payer};
pub(crate) use caller::Caller;
pub(crate) use card_cache::CardCache;
pub(crate) use cards::extended as extended_card;
pub(crate) use jsonrpc::{answer as jsonrpc_answer, refusal};
pub(crate) use lifecycle::Lifecycle;
pub(crate) use live::{Live, LiveRef, Parts};
pub(crate) use observe::{account, render_metrics, Edge, Logged};
pub(crate) use rejections::tcp_with_json_rejections;
pub(crate) use sse::watched;
pub(crate) use tls::{
    tls_with_json_rejections, Certificate, ClientCertificate, OverTls, TlsConnection,
};
pub(crate) use usage::{query_of as usage_query, render as render_usage};

/// Shared by every worker; built once. What a reload changes is in [`Live`], swapped whole.
pub(crate) struct AppState {
    pub(crate) live: arc_swap::ArcSwap<Live>,
    pub(crate) router: Router,
    pub(crate) service: A2aService,
    pub(crate) streams: StreamGauge,
    pub(crate) bodies: body::BodyLimits,
    pub(crate) connections: Arc<crate::limits::connections::ConnectionLimits>,
    /// Rendered aggregated cards.
    pub(crate) cards: card_cache::CardCache,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) lifecycle: Lifecycle,
    /// Where tasks and records are written behind memory.
    pub(crate) store: crate::store::Store,
    /// Agent instances a reload replaced by ones with a new backend, whose work may still
    /// run: stopped with the rest at shutdown.
    pub(crate) superseded: std::sync::Mutex<Vec<std::sync::Weak<Agent>>>,
    /// Where the gRPC binding listens, when it is on (the cards list it).
    pub(crate) grpc_port: Option<u16>,
    /// The HTTP port, for the URLs of cards asked for over gRPC (no `public_url` set).
    pub(crate) http_port: u16,
    /// The key every card is signed with ([`crate::card::finish`]).
    pub(crate) card_signer: Arc<crate::signing::Signer>,
    /// The TLS certificate, when `[server.tls]` is set (read again on reload).
    pub(crate) certificate: Option<Arc<Certificate>>,
    /// Bumped by every reload that takes: what watches the agent set (MCP sessions, for
    /// `notifications/tools/list_changed`) hears of it.
    pub(crate) reloaded: tokio::sync::watch::Sender<u64>,
    /// The span exporter, when `[telemetry]` (or the environment) names a collector.
    pub(crate) tracing: Option<Arc<crate::telemetry::Tracing>>,
    /// MCP sessions open now (kept by the MCP endpoint), for the metrics.
    pub(crate) mcp_sessions: Arc<std::sync::atomic::AtomicUsize>,
    /// The keys the admin API issued, in force.
    pub(crate) keys: crate::auth::RuntimeKeys,
    /// Their refusals, until the task that audits them takes them.
    pub(crate) key_refusals:
        std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<crate::auth::Refusal>>>,
    /// The version of the admin API's entries in force here (see `reload::follow_control`),
    /// and how the admin API asks for them to be applied again at once.
    pub(crate) control_applied: tokio::sync::watch::Sender<u64>,
    pub(crate) control_wake: Arc<tokio::sync::Notify>,
    /// The gateway file, whose directory runtime agents' relative paths start from.
    pub(crate) gateway_file: std::path::PathBuf,
    /// Who used what, and the budgets.
    pub(crate) usage: Arc<crate::usage::Usage>,
}

impl AppState {
    /// The configuration in force. A request takes it once (the [`Caller`](caller::Caller)
    /// extractor does) and keeps it to the end, whatever a reload swaps in meanwhile.
    pub(crate) fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Admits a call to `agent`: refused while a shared store does not answer, and a send
    /// (`sends`: it may start a task) while the store cannot write; then counted against
    /// the rate limits in force (shared ones with a shared store; see [`Live::admit`]).
    pub(crate) async fn admit(
        &self,
        head: &impl admission::Head,
        live: &Live,
        caller: &Principal,
        agent: &Agent,
        sends: bool,
    ) -> Result<(), GatewayError> {
        if let Some(shared) = &self.store.shared {
            if !shared.health().up() {
                return Err(GatewayError::StoreUnavailable(
                    "the shared store does not answer".into(),
                ));
            }
        }
        if sends && !self.store.writes.writing() {
            return Err(GatewayError::StoreUnavailable(
                "the store's commits fail".into(),
            ));
        }
        // Boxed, and only then: the shared count's future would make every request's
        // larger (and it is copied whole wherever a request's future moves).
        match self.store.shared.as_deref() {
            Some(shared) if live.rates.active() => {
                Box::pin(live.admit_shared(head, caller, agent, shared)).await?
            }
            _ => live.admit(head, caller, agent)?,
        }
        // The budgets last: a call the rate limits refuse spends nothing. Boxed, and only
        // where a budget is in force, for the same reason.
        if self.usage.budgeted() {
            let standing = Box::pin(self.usage.admit(&caller.id, &agent.name, sends)).await;
            let (outcome, standing) = match standing {
                Ok(standing) => (Ok(()), standing),
                Err((error, standing)) => (Err(error), standing),
            };
            if let Some(standing) = standing {
                head.keep_budget(standing);
            }
            outcome?;
        }
        Ok(())
    }

    /// [`Self::admit`] for a request no agent answers (an MCP session's own messages):
    /// refused while a shared store does not answer, and counted against the caller's rate.
    pub(crate) async fn admit_caller(
        &self,
        head: &impl admission::Head,
        live: &Live,
        caller: &Principal,
    ) -> Result<(), GatewayError> {
        match self.store.shared.as_deref() {
            Some(shared) if live.rates.active() => {
                Box::pin(live.admit_caller_shared(head, caller, shared)).await
            }
            _ => live.admit_caller(head, caller),
        }
    }

    /// The refusal while draining, and the last event of every open stream.
    pub(crate) fn shutting_down(&self) -> GatewayError {
        GatewayError::ShuttingDown {
            replicas: self.store.shared.is_some(),
        }
    }

    pub(crate) fn default_keepalive(&self) -> std::time::Duration {
        self.live().default_keepalive()
    }

    /// Keeps track of replaced agent instances (see `superseded`).
    pub(crate) fn supersede(&self, agents: Vec<Arc<Agent>>) {
        let mut held = self
            .superseded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.retain(|a| a.strong_count() > 0);
        held.extend(agents.iter().map(Arc::downgrade));
    }

    /// Every agent instance that may still have work: current, removed and replaced.
    pub(crate) fn all_agents(&self) -> Vec<Arc<Agent>> {
        let live = self.live();
        let mut all: Vec<Arc<Agent>> = live.registry.iter().cloned().collect();
        all.extend(live.registry.retired().cloned());
        let held = self
            .superseded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        all.extend(held.iter().filter_map(std::sync::Weak::upgrade));
        all
    }

    /// A stream slot counted against the gateway and against the caller's tier (over every
    /// replica, with a shared store).
    pub(crate) async fn open_stream(
        &self,
        head: &impl admission::Head,
        live: &Live,
        caller: &Principal,
    ) -> Result<StreamSlot, GatewayError> {
        let key = live.caller_key(head, caller);
        let max = live.rates.max_streams(caller);
        match &self.store.shared {
            Some(shared) => Box::pin(self.streams.try_open_shared(shared, &key, max)).await,
            None => self.streams.try_open_for(&key, max),
        }
    }
}

/// Every route. The routes do not depend on the agents: an agent's endpoints look its name
/// up in the registry in force, so the agent set can change without touching them.
pub(crate) fn routes(cfg: &mut web::ServiceConfig, metrics_here: bool, console: Option<&str>) {
    // `/a2a` and every agent's JSON-RPC endpoint `/a2a/agents/{name}` are not here: the
    // edge calls them itself (`jsonrpc::direct`), so the ten-thousandth agent costs what
    // the first does and no call pays for the router.
    cfg.service(web::resource(HEALTH_PATH).route(web::get().to(health::health)))
        .service(web::resource("/a2a/agents").route(web::get().to(cards::list_agents)));
    cfg.service(rest::scope("/a2a/rest"))
        .service(rest::scope("/a2a/agents/{name}/rest"))
        .service(
            web::resource([
                "/a2a/agents/{name}/card",
                "/a2a/agents/{name}/.well-known/agent-card.json",
                "/a2a/agents/{name}/.well-known/agent.json",
                "/a2a/agents/{name}/.well-known/agent-card",
            ])
            .route(web::get().to(cards::agent_card)),
        )
        .service(
            // `agent-card` without `.json` is what JAF-style clients ask for.
            web::resource([
                "/.well-known/agent-card.json",
                "/.well-known/agent.json",
                "/.well-known/agent-card",
            ])
            .route(web::get().to(cards::gateway_card)),
        )
        .service(web::resource(push::JWKS_PATH).route(web::get().to(push::jwks)))
        .service(
            web::resource(format!("{}/{{secret}}", crate::service::push::RELAY_PATH))
                .route(web::post().to(push::relay)),
        )
        // After the A2A routes, which every call would otherwise test these against first.
        .service(web::resource(READY_PATH).route(web::get().to(lifecycle::ready)))
        .service(web::resource(USAGE_PATH).route(web::get().to(usage::own)));
    if metrics_here {
        cfg.service(web::resource(METRICS_PATH).route(web::get().to(observe::metrics)));
    }
    if let Some(path) = console {
        cfg.service(web::resource(path).route(web::get().to(console::page)));
    }
    cfg.default_service(web::to(not_found));
}

const AGENTS_PREFIX: &str = "/a2a/agents";

/// The operators' endpoints: liveness, readiness, metrics. They answer while draining.
pub(crate) const HEALTH_PATH: &str = "/a2a/health";
pub(crate) const READY_PATH: &str = "/a2a/ready";
pub(crate) const METRICS_PATH: &str = "/metrics";
/// A caller's own usage.
pub(crate) const USAGE_PATH: &str = "/a2a/usage";

/// The agent name a path under `/a2a/agents/` starts with.
pub(crate) fn agent_in_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix(AGENTS_PREFIX)?.strip_prefix('/')?;
    let name = rest.split('/').next().unwrap_or_default();
    (!name.is_empty()).then_some(name)
}

/// `name` of a path `/a2a/agents/{name}`: one non-empty segment after the prefix.
pub(crate) fn agent_segment(path: &str) -> Option<&str> {
    agent_in_path(path).filter(|name| path.len() == AGENTS_PREFIX.len() + 1 + name.len())
}

/// What a request's path addresses, resolved once per request.
pub(crate) enum Addressed {
    /// `/a2a` and the shared HTTP+JSON routes: the router chooses the agent.
    Shared,
    Agent(Arc<Agent>),
    /// A path naming no agent there is: answered, with the request's id, by the list of
    /// agents the caller may see.
    Unknown(Box<str>),
}

impl Addressed {
    /// What `name` (from an agent's path), or no name (a shared path), addresses.
    pub(crate) fn of(registry: &Registry, name: Option<&str>) -> Addressed {
        match name {
            None => Addressed::Shared,
            Some(name) => match registry.get(name) {
                Some(agent) => Addressed::Agent(agent.clone()),
                None => Addressed::Unknown(quoted(name).into()),
            },
        }
    }
}

/// Which agent answered, and on the shared endpoints why.
pub(crate) fn served_headers(resp: &mut HttpResponse, served: &Served) {
    // Named once (`from_static` checks the name each time it runs).
    static AGENT: header::HeaderName = header::HeaderName::from_static(routing::AGENT_HEADER);
    static ROUTE: header::HeaderName = header::HeaderName::from_static(routing::ROUTE_HEADER);
    let headers = resp.headers_mut();
    if let Ok(v) = header::HeaderValue::from_str(&served.agent) {
        headers.insert(AGENT.clone(), v);
    }
    if let Some(Ok(v)) = served.route().map(header::HeaderValue::from_str) {
        headers.insert(ROUTE.clone(), v);
    }
}

/// The caller's `A2A-Version`: the header, or `?A2A-Version=` for clients that cannot set
/// headers (the reference allows both).
pub(crate) fn version_header(req: &HttpRequest) -> Option<Cow<'_, str>> {
    static A2A_VERSION: HeaderName = HeaderName::from_static("a2a-version");
    if let Some(v) = req.headers().get(&A2A_VERSION) {
        return Some(String::from_utf8_lossy(v.as_bytes()));
    }
    req.query_string()
        .split('&')
        .find_map(|kv| kv.strip_prefix("A2A-Version="))
        .map(Cow::Borrowed)
}

/// Where a stream request picks up a stream the client lost: its `Last-Event-ID`, if it
/// sent one (an id this gateway did not make is an error).
pub(crate) fn resume_from(
    req: &HttpRequest,
) -> Result<Option<crate::protocol::resume::ResumeFrom>, GatewayError> {
    let Some(value) = req.headers().get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("(not text)");
    crate::protocol::resume::read_last_event_id(text).map(Some)
}

/// A `GatewayError` on the HTTP+JSON binding: google.rpc.Status with its `ErrorInfo`, the
/// 1.0.1 HTTP status, and the retry / challenge headers it calls for.
pub(crate) fn error_response(e: &GatewayError) -> HttpResponse {
    if let GatewayError::Internal(detail) = e {
        tracing::error!(%detail, "internal error");
    }
    crate::telemetry::note(|c| c.error = Some((e.code(), e.reason())));
    let status = actix_web::http::StatusCode::from_u16(e.rest_http_status())
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = HttpResponse::build(status);
    resp.content_type("application/a2a+json");
    if let Some(secs) = e.retry_after() {
        resp.insert_header((header::RETRY_AFTER, secs.to_string()));
    }
    if let Some(c) = e.challenge() {
        resp.insert_header((header::WWW_AUTHENTICATE, c.to_string()));
    }
    if e.closes_connection() {
        resp.force_close();
    }
    resp.body(e.rest_body().to_string())
}

/// Errors of routes outside any agent (no such path, wrong method), in the same body shape.
fn rest_error(status: u16, message: String) -> HttpResponse {
    let code = actix_web::http::StatusCode::from_u16(status)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(code).json(crate::error::status_body(status, &message, None))
}

/// A POST is answered as JSON-RPC (its client speaks it), anything else as plain JSON.
pub(crate) async fn not_found(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
    caller: caller::Caller,
) -> HttpResponse {
    if req.method() == actix_web::http::Method::POST {
        return jsonrpc::unknown_endpoint(req, body, state, caller).await;
    }
    rest_error(
        404,
        format!(
            "no route for {} {}; see /.well-known/agent-card.json and /a2a/agents",
            req.method(),
            shown_path(&req)
        ),
    )
}

/// Text from a request's path as error messages quote it: at most 200 characters, so a
/// long URL is not sent back.
pub(crate) fn quoted(text: &str) -> String {
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

fn shown_path(req: &HttpRequest) -> String {
    quoted(req.path())
}

pub(crate) async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    let mut resp = rest_error(
        405,
        format!(
            "{} is not allowed on {}: JSON-RPC calls use POST",
            req.method(),
            shown_path(&req)
        ),
    );
    resp.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
    resp
}

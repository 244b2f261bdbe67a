//! The HTTP surface: routes and thin handlers. Handlers extract, call the service or the
//! card builders, and render; everything else lives in the layers below.

mod body;
mod caller;
mod card_cache;
mod cards;
mod health;
mod jsonrpc;
mod normalize;
mod rejections;
mod rest;
mod sse;

use std::borrow::Cow;
use std::sync::Arc;

use actix_web::http::header::{self, HeaderName};
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};

use crate::agents::{Agent, Agents, Registry};
use crate::auth::{AuthError, Authenticator, Principal};
use crate::config::Access;
use crate::config::GatewayConfig;
use crate::error::GatewayError;
use crate::limits::{RateInfo, RateLimits, StreamGauge, StreamSlot};
use crate::routing::{Router, Served};
use crate::service::A2aService;

pub(crate) use body::BodyLimits;
pub(crate) use card_cache::CardCache;
pub(crate) use normalize::TrimTrailingSlash;
pub(crate) use rejections::tcp_with_json_rejections;

/// The request span: method, path and status only. The default builder records a dozen
/// fields and draws a random request id per request, which cost about a tenth of the
/// gateway's throughput even with the span disabled.
pub(crate) struct LeanRootSpan;

/// Whether the per-request spans would be recorded at all. When the log level leaves them
/// out, the tracing middleware is not installed: it would only cost every request its
/// request id and span bookkeeping for nothing.
pub(crate) fn request_spans_enabled() -> bool {
    // The same target and level as `LeanRootSpan`'s span.
    tracing::span_enabled!(tracing::Level::INFO)
}

impl tracing_actix_web::RootSpanBuilder for LeanRootSpan {
    fn on_request_start(request: &actix_web::dev::ServiceRequest) -> tracing::Span {
        tracing::info_span!(
            "request",
            method = %request.method(),
            path = %request.path(),
            status = tracing::field::Empty,
        )
    }

    fn on_request_end<B: actix_web::body::MessageBody>(
        span: tracing::Span,
        outcome: &Result<actix_web::dev::ServiceResponse<B>, actix_web::Error>,
    ) {
        let status = match outcome {
            Ok(resp) => resp.status().as_u16(),
            Err(e) => e.as_response_error().status_code().as_u16(),
        };
        span.record("status", status);
        tracing::debug!(parent: &span, status, "request finished");
    }
}

/// Shared by every worker; built once.
pub(crate) struct AppState {
    pub(crate) config: GatewayConfig,
    pub(crate) auth: Authenticator,
    pub(crate) rates: RateLimits,
    pub(crate) router: Router,
    pub(crate) registry: Agents,
    pub(crate) service: A2aService,
    pub(crate) streams: StreamGauge,
    pub(crate) bodies: body::BodyLimits,
    pub(crate) connections: Arc<crate::limits::connections::ConnectionLimits>,
    /// Rendered aggregated cards.
    pub(crate) cards: card_cache::CardCache,
    /// No credentials configured and every agent public: access has nothing to check.
    pub(crate) open_to_all: bool,
    /// Every agent needs credentials: an anonymous call on a shared endpoint is refused
    /// before its body is read. (Worked out with `open_to_all` when the agents are loaded,
    /// not per request: with many agents that is a walk over all of them.)
    pub(crate) no_public_agent: bool,
}

impl AppState {
    /// The base URL clients reach the gateway at: the configured public URL, else what the
    /// request says (Forwarded / X-Forwarded-Proto / X-Forwarded-Host / Host).
    pub(crate) fn base_url(&self, req: &HttpRequest) -> String {
        match self.config.public_url() {
            Some(url) => url.to_string(),
            None => {
                let info = req.connection_info();
                format!("{}://{}", info.scheme(), info.host())
            }
        }
    }

    pub(crate) fn default_keepalive(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.config.limits.stream_keepalive_secs.max(1))
    }

    /// The caller, or the 401 to answer with. Runs before any body is read.
    pub(crate) fn authenticate(&self, req: &HttpRequest) -> Result<Principal, GatewayError> {
        self.auth
            .authenticate(req.headers())
            .map_err(|e| self.auth_error(e))
    }

    /// Refuses from the headers alone, before any body is read, a caller that may not call
    /// the agent the path names, or on the shared endpoints any agent at all.
    pub(crate) fn admit_early(
        &self,
        addressed: &Addressed,
        caller: &Principal,
    ) -> Result<(), GatewayError> {
        if self.open_to_all {
            return Ok(());
        }
        match addressed {
            Addressed::Agent(agent) => self.authorize(caller, agent),
            // Answered later, with the request's id.
            Addressed::Unknown(_) => Ok(()),
            Addressed::Shared if caller.anonymous && self.no_public_agent => {
                Err(self.auth_error(AuthError::Missing))
            }
            Addressed::Shared => Ok(()),
        }
    }

    /// Whether `caller` may call `agent`: a 401 or a 403 if not.
    pub(crate) fn authorize(&self, caller: &Principal, agent: &Agent) -> Result<(), GatewayError> {
        self.auth
            .authorize(caller, &agent.def)
            .map_err(|e| self.auth_error(e))
    }

    fn auth_error(&self, e: AuthError) -> GatewayError {
        if let AuthError::Rejected { reason, .. } = &e {
            // The reason, never the credential.
            tracing::info!(%reason, "credentials rejected");
        }
        match e {
            AuthError::Forbidden => GatewayError::Forbidden,
            other => GatewayError::Unauthenticated {
                message: other.to_string(),
                challenge: self.auth.challenge(&other),
            },
        }
    }

    /// The key a caller is counted under (its credential, or its address when anonymous).
    fn caller_key(&self, req: &HttpRequest, caller: &Principal) -> String {
        let xff = req
            .headers()
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok());
        let ip = self.rates.client_ip(req.peer_addr().map(|a| a.ip()), xff);
        self.rates.caller_key(caller, ip)
    }

    /// Counts one request against the caller's and the agent's rate; the numbers go out
    /// as `X-RateLimit-*` headers (see [`rate_limit_headers`]), also on a refusal.
    pub(crate) fn admit(
        &self,
        req: &HttpRequest,
        caller: &Principal,
        agent: &Agent,
    ) -> Result<(), GatewayError> {
        let key = || self.caller_key(req, caller);
        match self.rates.check(caller, key, &agent.def.name) {
            Ok(info) => {
                if let Some(info) = info {
                    req.extensions_mut().insert(info);
                }
                Ok(())
            }
            Err((e, info)) => {
                req.extensions_mut().insert(info);
                Err(e)
            }
        }
    }

    /// A stream slot counted against the gateway and against the caller's tier.
    pub(crate) fn open_stream(
        &self,
        req: &HttpRequest,
        caller: &Principal,
    ) -> Result<StreamSlot, GatewayError> {
        let key = self.caller_key(req, caller);
        self.streams
            .try_open_for(&key, self.rates.max_streams(caller))
    }

    /// An unknown agent is a 404, except for anonymous callers when agents are private by
    /// default: they learn nothing beyond "authenticate first".
    pub(crate) fn missing_agent(&self, caller: &Principal, name: &str) -> GatewayError {
        self.unroutable(caller, self.unknown_agent(name))
    }

    /// A request that reaches no agent (unknown by name, or unroutable on the shared
    /// endpoints): for anonymous callers when agents are private by default, "authenticate
    /// first" instead of the agent names the error would list.
    pub(crate) fn unroutable(&self, caller: &Principal, error: GatewayError) -> GatewayError {
        if caller.anonymous && self.auth.default_access() == Access::Authenticated {
            return self.auth_error(AuthError::Missing);
        }
        error
    }

    pub(crate) fn unknown_agent(&self, name: &str) -> GatewayError {
        GatewayError::AgentNotFound {
            name: name.to_string(),
            available: self.registry.current().first_names(),
        }
    }
}

/// Every route. The routes do not depend on the agents: an agent's endpoints look its name
/// up in the registry in force, so the agent set can change without touching them.
pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/a2a")
            .route(web::post().to(jsonrpc::default_agent))
            .default_service(web::to(method_not_allowed)),
    )
    .service(web::resource("/a2a/health").route(web::get().to(health::health)))
    .service(web::resource("/a2a/agents").route(web::get().to(cards::list_agents)));
    // Every agent's JSON-RPC endpoint is this one route, placed before the patterns: a
    // static prefix and a byte scan for a single path segment, then a lookup of the name,
    // so the ten-thousandth agent costs what the first does.
    cfg.service(
        web::scope(AGENTS_PREFIX)
            .guard(actix_web::guard::fn_guard(|ctx| {
                agent_segment(ctx.head().uri.path()).is_some()
            }))
            .default_service(web::to(jsonrpc::agent_endpoint)),
    );
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
        .default_service(web::to(not_found));
}

const AGENTS_PREFIX: &str = "/a2a/agents";

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
    let headers = resp.headers_mut();
    if let Ok(v) = header::HeaderValue::from_str(&served.agent) {
        headers.insert(header::HeaderName::from_static("a2a-gateway-agent"), v);
    }
    if let Some(Ok(v)) = served.route().map(header::HeaderValue::from_str) {
        headers.insert(header::HeaderName::from_static("a2a-gateway-route"), v);
    }
}

/// Middleware around CORS: an answer that does not allow its origin carries no CORS
/// header at all (actix-cors still adds `Access-Control-Expose-Headers`).
pub(crate) async fn cors_only_when_allowed(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    let mut resp = next.call(req).await?;
    let headers = resp.headers_mut();
    if !headers.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
        let cors: Vec<HeaderName> = headers
            .keys()
            .filter(|k| k.as_str().starts_with("access-control-"))
            .cloned()
            .collect();
        for name in cors {
            headers.remove(name);
        }
    }
    Ok(resp)
}

/// Middleware: writes the `X-RateLimit-*` headers a handler recorded for its request.
pub(crate) async fn rate_limit_headers(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    let mut resp = next.call(req).await?;
    let info = resp.request().extensions().get::<RateInfo>().copied();
    if let Some(info) = info {
        let headers = resp.headers_mut();
        for (name, value) in [
            ("x-ratelimit-limit", info.limit.to_string()),
            ("x-ratelimit-remaining", info.remaining.to_string()),
            ("x-ratelimit-reset", info.reset_secs.to_string()),
        ] {
            if let Ok(v) = header::HeaderValue::from_str(&value) {
                headers.insert(header::HeaderName::from_static(name), v);
            }
        }
    }
    Ok(resp)
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

/// A `GatewayError` on the HTTP+JSON binding: google.rpc.Status with its `ErrorInfo`, the
/// 1.0.1 HTTP status, and the retry / challenge headers it calls for.
pub(crate) fn error_response(e: &GatewayError) -> HttpResponse {
    if let GatewayError::Internal(detail) = e {
        tracing::error!(%detail, "internal error");
    }
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

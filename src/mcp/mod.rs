//! Every agent behind the gateway as an MCP tool: the Model Context Protocol over
//! Streamable HTTP at `[mcp] path` (`/mcp`), served by the official Rust SDK (`rmcp`).
//!
//! The endpoint is a door like the A2A ones: the caller's credentials are checked first
//! (the same 401s), a session belongs to the caller who opened it, and every tool call is
//! an A2A call made through the same admission (access, store health, rate limits, stream
//! caps), counted and logged with `binding="mcp"`. rmcp's handlers must be `Send`; the
//! gateway's calls hold the worker's own handles, so each call is handed to the worker that
//! took its HTTP request and run there ([`dispatch`]).

mod content;
mod dispatch;
mod server;
mod stdio;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::auth::Principal;
use crate::error::GatewayError;
use crate::http::admission::{self, Head};
use crate::http::{refusal, Addressed, AppState, Caller};

pub(crate) use dispatch::Dispatch;
pub(crate) use stdio::bridge;

/// Sessions remembered with their caller; past this, the ones rmcp has closed are let go.
const SESSIONS_PRUNED_PAST: usize = 4096;

/// The MCP endpoint: rmcp's service, and who opened each of its sessions.
pub(crate) struct Endpoint {
    service: StreamableHttpService<server::Tools, LocalSessionManager>,
    manager: Arc<LocalSessionManager>,
    sessions: Mutex<HashMap<String, Arc<str>>>,
}

impl Endpoint {
    /// The endpoint for `state`; `allowed_hosts` are the `Host`s it answers (DNS rebinding:
    /// see `[mcp] allowed_hosts`), none for any.
    pub(crate) fn new(state: Arc<AppState>, allowed_hosts: Vec<String>) -> Endpoint {
        let config = StreamableHttpServerConfig::default().with_allowed_hosts(allowed_hosts);
        let manager = Arc::new(LocalSessionManager::default());
        let service = StreamableHttpService::new(
            move || Ok(server::Tools::new(state.clone())),
            manager.clone(),
            config,
        );
        Endpoint {
            service,
            manager,
            sessions: Mutex::default(),
        }
    }

    fn owner(&self, session: &str) -> Option<Arc<str>> {
        self.lock().get(session).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<str>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The `Host`s the endpoint answers: `[mcp] allowed_hosts` (`*`: any), else the loopback
/// names and `public_url`'s host.
pub(crate) fn allowed_hosts(config: &crate::config::GatewayConfig) -> Vec<String> {
    match &config.mcp.allowed_hosts {
        Some(hosts) if hosts.iter().any(|h| h == "*") => Vec::new(),
        Some(hosts) => hosts.clone(),
        None => {
            let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).into();
            let public = config.public_url().and_then(|u| url::Url::parse(u).ok());
            hosts.extend(public.and_then(|u| u.host_str().map(str::to_owned)));
            hosts
        }
    }
}

/// What a tool call reads of the HTTP request that carried it, whichever worker runs it:
/// the caller's credentials (as headers, and the connection's client certificate), where
/// it comes from, and the worker to run its A2A call on.
#[derive(Clone)]
pub(crate) struct Door {
    /// Shared by the session's calls, not copied per call.
    pub(crate) head: Arc<McpHead>,
    pub(crate) principal: Principal,
    pub(crate) dispatch: Dispatch,
}

/// The head admission reads of an MCP request.
pub(crate) struct McpHead {
    headers: actix_web::http::header::HeaderMap,
    peer: Option<IpAddr>,
    certificate: Option<Arc<str>>,
}

impl Head for McpHead {
    fn presented(&self) -> crate::auth::Presented<'_> {
        crate::auth::Presented::in_headers(&self.headers)
            .with_certificate(self.certificate.as_deref())
    }

    fn origin(&self) -> (Option<IpAddr>, Option<&str>) {
        let xff = self
            .headers
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok());
        (self.peer, xff)
    }

    fn keep_rate(&self, _info: crate::limits::RateInfo) {
        // An MCP answer is the client's session's; the numbers are in the refusal's text.
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn extensions(&self) -> Option<&str> {
        crate::protocol::extensions_in(|name| self.headers.get(name).map(|v| v.as_bytes()))
    }
}

/// `[mcp] path`: every method (POST for messages, GET for the server's stream, DELETE to
/// end a session) goes to rmcp once the caller is let in.
pub(crate) async fn serve(req: HttpRequest, body: web::Payload) -> HttpResponse {
    let (Some(endpoint), Some((state, caller))) = (
        req.app_data::<web::Data<Endpoint>>().cloned(),
        Caller::with_state(&req),
    ) else {
        return HttpResponse::InternalServerError().finish();
    };
    // Credentials first, as on every endpoint: a caller that may use no agent at all (an
    // anonymous one where none is public) is told so here.
    let live = caller.live;
    let principal = match admission::at_the_door(&live, caller.principal, &Addressed::Shared) {
        Ok(p) => p,
        Err(e) => return refusal(&req, state, &e),
    };
    // A session is its opener's: another caller's session id is one that does not exist.
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &session {
        if endpoint.owner(id).as_deref() != Some(&*principal.id) {
            return HttpResponse::NotFound()
                .content_type("application/json")
                .body(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}"#);
        }
    }
    let head = Arc::new(McpHead {
        headers: req.headers().clone(),
        peer: req.peer_addr().map(|a| a.ip()),
        certificate: req
            .conn_data::<crate::http::ClientCertificate>()
            .map(|c| c.0.clone()),
    });
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let payer = |h: &ahash::RandomState| live.caller_hash(&*head, Some(&principal), h);
    let limit = state.bodies.max_bytes();
    let bytes = match crate::http::read_chunks(body, declared, limit, &state.bodies, &payer).await {
        Ok(b) => b,
        Err(e) => return refusal(&req, state, &e),
    };
    let mut forwarded = http::Request::builder()
        .method(req.method().as_str())
        .uri(req.uri().to_string());
    for (name, value) in req.headers() {
        forwarded = forwarded.header(name.as_str(), value.as_bytes());
    }
    let Ok(mut forwarded) = forwarded.body(http_body_util::Full::new(bytes)) else {
        let e = GatewayError::Internal("an MCP request's head".into());
        return refusal(&req, state, &e);
    };
    let opener = principal.id.clone();
    forwarded.extensions_mut().insert(Door {
        head,
        principal,
        dispatch: Dispatch::on_this_worker(state.clone()),
    });
    let deleting = req.method() == actix_web::http::Method::DELETE;
    let mut service = endpoint.service.clone();
    let Ok(answer) = tower_service::Service::call(&mut service, forwarded).await;
    if let (None, Some(id)) = (&session, answer.headers().get("mcp-session-id")) {
        if let Ok(id) = id.to_str() {
            remember(&endpoint, id, opener).await;
        }
    }
    if let (true, Some(id)) = (deleting && answer.status().is_success(), &session) {
        endpoint.lock().remove(id);
    }
    into_actix(answer)
}

/// Notes who opened a session; when many are noted, forgets those rmcp has closed.
async fn remember(endpoint: &Endpoint, id: &str, opener: Arc<str>) {
    use rmcp::transport::streamable_http_server::session::SessionManager as _;
    let known: Vec<String> = {
        let mut sessions = endpoint.lock();
        sessions.insert(id.to_owned(), opener);
        if sessions.len() <= SESSIONS_PRUNED_PAST {
            return;
        }
        sessions.keys().cloned().collect()
    };
    let manager = &endpoint.manager;
    let mut closed = Vec::new();
    for id in known {
        if !manager
            .has_session(&id.clone().into())
            .await
            .unwrap_or(false)
        {
            closed.push(id);
        }
    }
    let mut sessions = endpoint.lock();
    for id in closed {
        sessions.remove(&id);
    }
}

/// rmcp's answer as actix's: the status, the headers, and the body as it comes (an SSE
/// stream stays one).
fn into_actix(
    answer: http::Response<
        http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>,
    >,
) -> HttpResponse {
    let (parts, body) = answer.into_parts();
    let status = actix_web::http::StatusCode::from_u16(parts.status.as_u16())
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut out = HttpResponse::build(status);
    for (name, value) in &parts.headers {
        out.append_header((name.as_str(), value.as_bytes()));
    }
    // Reverse proxies (nginx) buffer responses unless told not to.
    out.insert_header(("x-accel-buffering", "no"));
    let chunks = http_body_util::BodyExt::into_data_stream(body)
        .map(|chunk| chunk.map_err(|e| actix_web::error::ErrorInternalServerError(e.to_string())));
    out.streaming(chunks)
}

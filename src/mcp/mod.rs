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
mod sessions;
mod stdio;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::{header, Method, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt as _;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::auth::Principal;
use crate::error::GatewayError;
use crate::http::admission::{self, Head};
use crate::http::{refusal, Addressed, AppState, Caller, Live, Payer};
use crate::protocol::jsonrpc::RpcId;

pub(crate) use dispatch::Dispatch;
pub(crate) use stdio::{bridge, BridgeTarget};

/// The MCP endpoint: rmcp's service, and the sessions it holds for whom.
pub(crate) struct Endpoint {
    service: StreamableHttpService<server::Tools, LocalSessionManager>,
    manager: Arc<LocalSessionManager>,
    sessions: sessions::Sessions,
    state: Arc<AppState>,
}

impl Endpoint {
    /// The endpoint for `state`; `allowed_hosts` are the `Host`s it answers (DNS rebinding:
    /// see `[mcp] allowed_hosts`), none for any. Idle sessions are closed from here on.
    pub(crate) fn start(state: Arc<AppState>, allowed_hosts: Vec<String>) -> web::Data<Endpoint> {
        let config = StreamableHttpServerConfig::default().with_allowed_hosts(allowed_hosts);
        // Sessions are expired here, by their use (see `expire_idle`), not by rmcp's timer,
        // which would end one while a long tool call runs in it.
        let mut manager = LocalSessionManager::default();
        manager.session_config.keep_alive = None;
        let manager = Arc::new(manager);
        let tools = state.clone();
        let service = StreamableHttpService::new(
            move || Ok(server::Tools::new(tools.clone())),
            manager.clone(),
            config,
        );
        let endpoint = web::Data::new(Endpoint {
            service,
            manager,
            sessions: sessions::Sessions::new(state.mcp_sessions.clone()),
            state,
        });
        tokio::spawn(expire_idle(Arc::downgrade(&endpoint.clone().into_inner())));
        endpoint
    }

    /// Forgets session `id` and gives back the share it held.
    fn forget(&self, id: &str) {
        if let Some(slot) = self.sessions.close(id) {
            self.state.bodies.give_back(slot, sessions::SESSION_BYTES);
        }
    }
}

/// Closes the sessions unused for `[mcp] idle_timeout_secs`, and forgets those rmcp ended
/// itself, every quarter of that time (at least every second, at most every minute),
/// while the endpoint lives.
async fn expire_idle(endpoint: std::sync::Weak<Endpoint>) {
    loop {
        let Some(idle) = endpoint.upgrade().map(|e| idle_timeout(&e.state.live())) else {
            return;
        };
        tokio::time::sleep((idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))).await;
        let Some(endpoint) = endpoint.upgrade() else {
            return;
        };
        for id in endpoint.sessions.idle(idle) {
            let _ = endpoint.manager.close_session(&id.clone().into()).await;
            endpoint.forget(&id);
        }
        for id in endpoint.sessions.ids() {
            if !(endpoint.manager.has_session(&id.clone().into()).await).unwrap_or(true) {
                endpoint.forget(&id);
            }
        }
    }
}

fn idle_timeout(live: &Live) -> Duration {
    Duration::from_secs(live.config.mcp.idle_timeout_secs.max(1))
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
    /// Canceled when the HTTP client goes away before this request's answer has been
    /// sent (with `[mcp] cancel_abandoned_calls`): a tool call then cancels its task.
    pub(crate) abandoned: Option<CancellationToken>,
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

    fn peer(&self) -> Option<IpAddr> {
        self.peer
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
/// end a session) goes to rmcp once the caller is let in: its credentials, its origin, the
/// session its own, its rate limit (every request, `initialize` included; a tool call's
/// A2A call is counted by admission), and for a new session a place under the caps.
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
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let own = live.base_url(&req);
        if !origin_allowed(&live, origin.as_bytes(), &own) {
            let shown = String::from_utf8_lossy(origin.as_bytes()).into_owned();
            let error = GatewayError::OriginNotAllowed(shown);
            return refused(&req, state, &RpcId::NULL, &error);
        }
    }
    let head = Arc::new(McpHead {
        headers: req.headers().clone(),
        peer: req.peer_addr().map(|a| a.ip()),
        certificate: req
            .conn_data::<crate::http::ClientCertificate>()
            .map(|c| c.0.clone()),
    });
    // A session is its opener's: another caller's session id, or an anonymous client's
    // from another address, is one that does not exist.
    let owner: Arc<str> = live.caller_key(&*head, &principal).into();
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &session {
        if !endpoint.sessions.owned_by(id, &owner) {
            return HttpResponse::NotFound()
                .content_type("application/json")
                .body(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}"#);
        }
    }
    let hash = |h: &ahash::RandomState| live.caller_hash(&*head, Some(&principal), h);
    let payer = Payer {
        hash: &hash,
        anonymous: principal.anonymous,
    };
    let bytes = match crate::http::read_body(&req, body, &state.bodies, &payer).await {
        Ok(b) => b,
        Err(e) => return refusal(&req, state, &e),
    };
    let message = match *req.method() == Method::POST {
        true => match Message::read(&bytes) {
            Ok(m) => Some(m),
            Err(e) => return refused(&req, state, &RpcId::NULL, &e),
        },
        false => None,
    };
    let id = message.as_ref().map_or(RpcId::NULL, |m| m.id.clone());
    // A tool call's A2A call is counted by admission, as on every binding; the rest here.
    if !message.as_ref().is_some_and(|m| m.tool_call) {
        if let Err(e) = state.admit_caller(&*head, &live, &principal).await {
            return refused(&req, state, &id, &e);
        }
    }
    let mcp = &live.config.mcp;
    let opening = match message.as_ref().is_some_and(|m| m.initialize) && session.is_none() {
        true => {
            let caps = (
                mcp.max_sessions_per_caller,
                mcp.max_sessions
                    .unwrap_or_else(sessions::default_max_sessions),
            );
            let hold = || state.bodies.hold_share(&payer, sessions::SESSION_BYTES);
            let give_back = |slot| state.bodies.give_back(slot, sessions::SESSION_BYTES);
            let opened =
                (endpoint.sessions).open(owner, caps, idle_timeout(&live), hold, give_back);
            match opened {
                Ok(opening) => Some(opening),
                Err(e) => return refused(&req, state, &id, &e),
            }
        }
        false => None,
    };
    let abandoned = (mcp.cancel_abandoned_calls && message.as_ref().is_some_and(|m| m.tool_call))
        .then(CancellationToken::new);
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
    forwarded.extensions_mut().insert(Door {
        head,
        principal,
        dispatch: Dispatch::on_this_worker(state.clone()),
        abandoned: abandoned.clone(),
    });
    let mut service = endpoint.service.clone();
    let Ok(answer) = tower_service::Service::call(&mut service, forwarded).await;
    let new_session = answer.headers().get("mcp-session-id");
    if let (Some(opening), Some(id)) = (opening, new_session.and_then(|v| v.to_str().ok())) {
        endpoint.sessions.opened(opening, id);
    }
    let deleting = *req.method() == Method::DELETE;
    if let (true, Some(id)) = (deleting && answer.status().is_success(), &session) {
        endpoint.forget(id);
        // The session is ended: 200, as MCP's clients expect (rmcp says 202, which the
        // Python SDK's client reports as a failure on every close).
        return HttpResponse::Ok().finish();
    }
    if let Some(id) = &session {
        endpoint.sessions.enter(id);
    }
    let watch = Watch {
        abandoned,
        busy: session.map(|id| (endpoint, id)),
    };
    into_actix(answer, watch)
}

/// Whether a request from `origin` may use the endpoint: the gateway's own origin, or one
/// `[mcp] allowed_origins` or `[cors] allowed_origins` names (`*`: any).
fn origin_allowed(live: &Live, origin: &[u8], own: &str) -> bool {
    let Ok(origin) = std::str::from_utf8(origin) else {
        return false;
    };
    let config = &live.config;
    origin.eq_ignore_ascii_case(own)
        || (config.mcp.allowed_origins.iter())
            .chain(&config.cors.allowed_origins)
            .any(|allowed| allowed == "*" || allowed.eq_ignore_ascii_case(origin))
}

/// What the door reads of a POSTed message: its id, and whether it opens a session or
/// calls a tool. A body rmcp could not read is refused here, 400 with JSON-RPC's own
/// error (rmcp would answer 415 whatever the fault).
struct Message {
    id: RpcId,
    initialize: bool,
    tool_call: bool,
}

/// The common message, a tool call, as rmcp reads it: nothing else at its top level, and
/// its params rmcp's own type. rmcp's message type tries its requests one by one (a tool
/// call is far down the list) and builds an error for each it passes: 27k instructions
/// at the door, where this reader takes 4k.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCall<'a> {
    jsonrpc: &'a str,
    id: rmcp::model::RequestId,
    method: &'a str,
    #[allow(dead_code)] // Read so that rmcp surely reads it as well.
    params: rmcp::model::CallToolRequestParams,
}

impl Message {
    fn read(body: &[u8]) -> Result<Message, GatewayError> {
        Self::read_tool_call(body).map_or_else(|| Self::read_any(body), Ok)
    }

    fn read_tool_call(body: &[u8]) -> Option<Message> {
        let call = serde_json::from_slice::<ToolCall>(body).ok()?;
        (call.jsonrpc == "2.0" && call.method == "tools/call").then(|| Message {
            id: Self::id(&call.id),
            initialize: false,
            tool_call: true,
        })
    }

    fn read_any(body: &[u8]) -> Result<Message, GatewayError> {
        let message: ClientJsonRpcMessage = serde_json::from_slice(body).map_err(|e| {
            use serde_json::error::Category;
            match e.classify() {
                Category::Syntax | Category::Eof | Category::Io => {
                    GatewayError::Parse(format!("the body is not JSON: {e}"))
                }
                Category::Data => GatewayError::InvalidRequest(format!("not an MCP message: {e}")),
            }
        })?;
        let (id, request) = match &message {
            ClientJsonRpcMessage::Request(r) => (Some(&r.id), Some(&r.request)),
            ClientJsonRpcMessage::Error(e) => (e.id.as_ref(), None),
            ClientJsonRpcMessage::Response(r) => (Some(&r.id), None),
            ClientJsonRpcMessage::Notification(_) => (None, None),
        };
        Ok(Message {
            id: id.map_or(RpcId::NULL, Self::id),
            initialize: matches!(request, Some(ClientRequest::InitializeRequest(_))),
            tool_call: matches!(request, Some(ClientRequest::CallToolRequest(_))),
        })
    }

    fn id(id: &rmcp::model::RequestId) -> RpcId {
        serde_json::to_value(id).map_or(RpcId::NULL, RpcId::Value)
    }
}

/// A refusal in MCP's form: a JSON-RPC error for request `id`, its `ErrorInfo` in `data`,
/// with its HTTP status (Streamable HTTP answers a request it cannot take with a 4xx: 400
/// for one it cannot read, 429 and 503 with `Retry-After`).
fn refused(req: &HttpRequest, state: &AppState, id: &RpcId, error: &GatewayError) -> HttpResponse {
    let mut reply = crate::rpc::RpcReply::error(id, crate::protocol::Dialect::V10, error);
    if let crate::rpc::RpcReply::Json { status, .. } = &mut reply {
        *status = error.rest_http_status();
    }
    crate::http::jsonrpc_answer(req, state, reply)
}

/// What follows an answer on its way out: the session it keeps busy (not idle while
/// answering), and the token canceled if the client goes before the end.
struct Watch {
    abandoned: Option<CancellationToken>,
    busy: Option<(web::Data<Endpoint>, String)>,
}

/// rmcp's answer as actix's: the status, the headers, and the body as it comes (an SSE
/// stream stays one), watched to its end.
fn into_actix(
    answer: http::Response<
        http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>,
    >,
    watch: Watch,
) -> HttpResponse {
    let (parts, body) = answer.into_parts();
    let status =
        StatusCode::from_u16(parts.status.as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut out = HttpResponse::build(status);
    for (name, value) in &parts.headers {
        out.append_header((name.as_str(), value.as_bytes()));
    }
    // Reverse proxies (nginx) buffer responses unless told not to.
    out.insert_header(("x-accel-buffering", "no"));
    let chunks = http_body_util::BodyExt::into_data_stream(body)
        .map(|chunk| chunk.map_err(|e| actix_web::error::ErrorInternalServerError(e.to_string())));
    out.streaming(Watched {
        inner: chunks,
        ended: false,
        watch,
    })
}

pin_project_lite::pin_project! {
    /// An answer's body on its way to the client; when it is dropped (sent, or its client
    /// gone) the session is used again from now, and a call whose client went before the
    /// end is canceled.
    struct Watched<S> {
        #[pin]
        inner: S,
        ended: bool,
        watch: Watch,
    }

    impl<S> PinnedDrop for Watched<S> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some((endpoint, id)) = this.watch.busy.take() {
                endpoint.sessions.done(&id);
            }
            if let (false, Some(abandoned)) = (*this.ended, &this.watch.abandoned) {
                abandoned.cancel();
            }
        }
    }
}

impl<S: futures_util::Stream> futures_util::Stream for Watched<S> {
    type Item = S::Item;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        let this = self.project();
        let next = this.inner.poll_next(cx);
        if let std::task::Poll::Ready(None) = next {
            *this.ended = true;
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(message: Option<Message>) -> Option<(String, bool, bool)> {
        message.map(|m| (format!("{:?}", m.id), m.initialize, m.tool_call))
    }

    #[test]
    fn the_tool_call_reader_reads_what_rmcp_reads_or_leaves_it() {
        let calls = [
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hi"}}}"#,
            r#"{"method":"tools/call","params":{"name":"echo"},"id":"a-1","jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","id":-3,"method":"tools/call","params":{"name":"echo","arguments":{},"_meta":{"progressToken":1}}}"#,
        ];
        for body in calls {
            let fast = seen(Message::read_tool_call(body.as_bytes()));
            assert!(fast.is_some(), "{body}");
            assert_eq!(
                fast,
                seen(Message::read_any(body.as_bytes()).ok()),
                "{body}"
            );
        }
        // Whatever is not plainly a tool call is read by rmcp's type, errors included.
        let others = [
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"},"result":{}}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"echo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"echo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"name":"echo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":[1]}}"#,
            "{not json",
        ];
        for body in others {
            assert!(Message::read_tool_call(body.as_bytes()).is_none(), "{body}");
        }
        let escaped = r#"{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"name":"echo"}}"#;
        let read = Message::read(escaped.as_bytes()).ok();
        assert_eq!(read.map(|m| m.tool_call), Some(true));
        assert!(matches!(
            Message::read(b"{not json"),
            Err(GatewayError::Parse(_))
        ));
        let stray = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"},"result":{}}"#;
        assert!(matches!(
            Message::read(stray.as_bytes()),
            Err(GatewayError::InvalidRequest(_))
        ));
    }
}

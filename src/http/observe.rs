//! One middleware around every request: refuses new work while draining, carries the
//! caller's trace context to the layers below, then writes the access-log line and moves
//! the request metrics from what the layers noted (see [`crate::telemetry::Call`]).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use actix_web::body::{BodySize, EitherBody, MessageBody};
use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::HttpMessage;
use actix_web::{web, HttpResponse};

use super::cors::Cors;
use super::{error_response, quoted, AppState};
use crate::error::GatewayError;
use crate::limits::RateInfo;
use crate::telemetry::{self, TraceParent};
use crate::usage::budgets::Standing;

use crate::telemetry::ACCESS;

static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The probes answer while draining: liveness stays up, readiness says why it is not.
fn is_probe(path: &str) -> bool {
    [super::HEALTH_PATH, super::READY_PATH, super::METRICS_PATH].contains(&path)
}

/// The caller's W3C trace context; `tracestate` rides along when short and printable.
fn trace_context(req: &ServiceRequest) -> Option<(TraceParent, Option<String>)> {
    let headers = req.headers();
    let state = headers.get(&TRACESTATE).map(|v| v.as_bytes());
    TraceParent::with_state(headers.get(&TRACEPARENT)?.as_bytes(), state)
}

/// The one middleware in front of every route: one trailing slash trimmed from the path,
/// drain refusals, CORS (preflights answered here), the trace context and the per-request
/// note, then the rate-limit headers, CORS headers, the metrics and the access-log line on
/// the way out. Written as a service of its own with a named future, rather than with
/// `from_fn` (which boxes a future per request, and the inner service's again) and a layer
/// per concern (each a service call and a future per request).
pub(crate) struct Edge;

impl<S, B> Transform<S, ServiceRequest> for Edge
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Transform = EdgeService<S>;
    type InitError = ();
    type Future = std::future::Ready<Result<EdgeService<S>, ()>>;

    fn new_transform(&self, service: S) -> Self::Future {
        std::future::ready(Ok(EdgeService { service }))
    }
}

pub(crate) struct EdgeService<S> {
    service: S,
}

/// What the way out needs of the way in.
struct Watch {
    start: Instant,
    scope: Rc<telemetry::Scope>,
    cors: Cors,
    rated: bool,
    /// Whether answers wait for the store (a shared one, or `durability = "sync"`).
    shared: bool,
    /// The access log's: the request's method and path, its trace id, and its span.
    head: Option<(actix_web::http::Method, String)>,
    trace_id: Option<String>,
    span: tracing::Span,
}

impl<S, B> Service<ServiceRequest> for EdgeService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Future = EdgeFuture<S::Future, B>;

    forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        // Before routing: `/a2a/agents/echo/` is `/a2a/agents/echo` on every route.
        if let Some(uri) = super::normalize::without_trailing_slash(req.uri()) {
            req.match_info_mut().get_mut().update(&uri);
            req.head_mut().uri = uri;
        }
        let start = Instant::now();
        let Some(state) = req.app_data::<web::Data<AppState>>().cloned() else {
            let (inner, scope) = telemetry::observed(None, None, self.route(req));
            return EdgeFuture::Running {
                inner,
                watch: Some(Watch {
                    start,
                    scope,
                    cors: Cors::Off,
                    rated: false,
                    shared: false,
                    head: None,
                    trace_id: None,
                    span: tracing::Span::none(),
                }),
            };
        };
        let (cors, rated) = {
            let live = state.live.load();
            // The admin API is never CORS-enabled: a browser page elsewhere gets nothing.
            let cors = match req.path().starts_with("/admin/") {
                true => Cors::Off,
                false => Cors::check(&live.config.cors, &req),
            };
            (cors, live.rates.active())
        };
        let cors = match cors {
            Cors::Preflight(resp) => return EdgeFuture::answered(req.into_response(resp)),
            other => other,
        };
        if state.lifecycle.draining() && !is_probe(req.path()) {
            let mut resp = drain_refusal(&req, &state);
            cors.decorate(resp.headers_mut());
            return EdgeFuture::answered(req.into_response(resp));
        }
        let logged = tracing::enabled!(target: ACCESS, tracing::Level::INFO);
        let head = logged.then(|| (req.method().clone(), quoted(req.path())));
        let trace = trace_context(&req);
        let trace_id = trace
            .as_ref()
            .filter(|_| logged)
            .map(|(t, _)| t.trace_id().to_string());
        // The request's span, when the access log is on: what is logged while the request
        // is handled says which call it belongs to. (Without it, no span is entered.)
        let span = match logged {
            true => tracing::info_span!(
                "request",
                a2a.method = tracing::field::Empty,
                task_id = tracing::field::Empty,
                context_id = tracing::field::Empty,
            ),
            false => tracing::Span::none(),
        };
        // The exported span, when spans are exported.
        let exported = state
            .tracing
            .as_ref()
            .map(|t| t.server_span(trace.as_ref(), span_name(&req), span_attributes(&req)));
        let inner = {
            let _inside = span.enter();
            self.route(req)
        };
        let (inner, scope) = telemetry::observed(trace, exported, inner);
        EdgeFuture::Running {
            inner,
            watch: Some(Watch {
                start,
                scope,
                cors,
                rated,
                shared: state.store.answers_wait(),
                head,
                trace_id,
                span,
            }),
        }
    }
}

impl<S, B> EdgeService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    /// The JSON-RPC endpoints, which take nearly every request, are called here; the rest
    /// goes through actix's router.
    fn route(&self, req: ServiceRequest) -> Routed<S::Future> {
        match super::jsonrpc::direct(req) {
            Ok(future) => Routed::JsonRpc { future },
            Err(req) => Routed::Router {
                future: self.service.call(req),
            },
        }
    }
}

type Answer<B> = Result<ServiceResponse<EitherBody<B>>, actix_web::Error>;

pin_project_lite::pin_project! {
    /// A request below the edge: a JSON-RPC endpoint called directly, or actix's router.
    #[project = RoutedProj]
    pub(crate) enum Routed<F> {
        JsonRpc { future: futures_util::future::LocalBoxFuture<'static, ServiceResponse> },
        Router { #[pin] future: F },
    }
}

impl<F, B> Future for Routed<F>
where
    F: Future<Output = Result<ServiceResponse<B>, actix_web::Error>>,
{
    type Output = Answer<B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer<B>> {
        match self.project() {
            RoutedProj::Router { future } => {
                Poll::Ready(ready!(future.poll(cx)).map(ServiceResponse::map_into_left_body))
            }
            RoutedProj::JsonRpc { future } => {
                Poll::Ready(Ok(ready!(future.as_mut().poll(cx)).map_into_right_body()))
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A request through the edge: answered at once (a preflight, a refusal while
    /// draining), running, or waiting for a shared store to take its changes.
    #[project = EdgeProj]
    pub(crate) enum EdgeFuture<F, B> {
        Answered { answer: Option<ServiceResponse<EitherBody<B>>> },
        Running {
            #[pin]
            inner: telemetry::Observed<Routed<F>>,
            watch: Option<Watch>,
        },
        Finishing { future: futures_util::future::LocalBoxFuture<'static, Answer<B>> },
    }
}

impl<F, B> EdgeFuture<F, B> {
    fn answered(resp: ServiceResponse) -> Self {
        EdgeFuture::Answered {
            answer: Some(resp.map_into_right_body()),
        }
    }
}

impl<F, B> Future for EdgeFuture<F, B>
where
    F: Future<Output = Result<ServiceResponse<B>, actix_web::Error>>,
    B: MessageBody + 'static,
{
    type Output = Answer<B>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer<B>> {
        match self.as_mut().project() {
            EdgeProj::Answered { answer } => match answer.take() {
                Some(resp) => Poll::Ready(Ok(resp)),
                None => Poll::Ready(Err(actix_web::error::ErrorInternalServerError(
                    "polled after it answered",
                ))),
            },
            EdgeProj::Finishing { future } => future.as_mut().poll(cx),
            EdgeProj::Running { inner, watch } => {
                let res = {
                    let _inside = watch.as_ref().map(|w| w.span.enter());
                    ready!(inner.poll(cx))
                };
                let Some(watch) = watch.take() else {
                    return Poll::Ready(Err(actix_web::error::ErrorInternalServerError(
                        "polled after it answered",
                    )));
                };
                let res = match res {
                    Ok(res) => res,
                    Err(e) => {
                        if let Some((method, path)) = &watch.head {
                            let status = e.as_response_error().status_code().as_u16();
                            tracing::info!(target: ACCESS, %method, path, status, "request");
                        }
                        return Poll::Ready(Err(e));
                    }
                };
                if watch.shared && res.request().method() == actix_web::http::Method::POST {
                    // Only when answers wait for the store is there something to wait
                    // for: boxed then.
                    let future = Box::pin(async move {
                        let parent = watch.scope.span().map(|s| s.parent());
                        let res = match stored_first(&res, parent).await {
                            None => res,
                            Some(refusal) => {
                                let (req, _) = res.into_parts();
                                ServiceResponse::new(req, refusal).map_into_right_body()
                            }
                        };
                        Ok(finish(res, watch))
                    });
                    self.set(EdgeFuture::Finishing { future });
                    return self.poll(cx);
                }
                Poll::Ready(Ok(finish(res, watch)))
            }
        }
    }
}

/// The way out: rate-limit and CORS headers, the metrics, the access-log line.
fn finish<B: MessageBody + 'static>(
    mut res: ServiceResponse<B>,
    watch: Watch,
) -> ServiceResponse<B> {
    let Watch {
        start,
        scope,
        cors,
        rated,
        head,
        trace_id,
        span,
        ..
    } = watch;
    let call = scope.take();
    let _inside = span.enter();
    let seconds = start.elapsed().as_secs_f64();
    if rated {
        let rate = res.request().extensions().get::<RateInfo>().copied();
        if let Some(info) = rate {
            rate_limit_headers(res.headers_mut(), info);
        }
    }

    cors.decorate(res.headers_mut());
    if let Some(activated) = &call.extensions_activated {
        // In the header the caller's dialect reads.
        let name = crate::protocol::extensions_header(match call.dialect {
            Some("0.3") => crate::protocol::Dialect::V03,
            _ => crate::protocol::Dialect::V10,
        });
        if let Ok(value) = HeaderValue::from_str(activated) {
            res.headers_mut()
                .insert(HeaderName::from_static(name), value);
        }
    }
    let status = res.status().as_u16();
    if let Some(span) = scope.span() {
        let route = res
            .headers()
            .get("a2a-gateway-route")
            .and_then(|v| v.to_str().ok());
        span.finish(&call, status, false, route);
    }
    // The request by handle (a count, not a copy): the state it lends stays borrowed
    // while the answer's headers change.
    let req = res.request().clone();
    if let Some(state) = req.app_data::<web::Data<AppState>>() {
        let mut call = call;
        if call.method.is_some() && state.usage.budgeted() {
            if let Some(standing) = req.extensions_mut().remove::<Standing>() {
                budget_headers(res.headers_mut(), &standing);
            }
        }
        if call.method.is_some() && state.usage.recording() {
            call.bytes_in = (req.headers().get(header::CONTENT_LENGTH))
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0);
            if let BodySize::Sized(n) = res.response().body().size() {
                call.bytes_out = n;
            }
        }
        let logged = head.as_ref().map(|(method, path)| Logged {
            method: method.as_str(),
            path,
            status,
            trace_id: trace_id.as_deref(),
        });
        account(state, &call, seconds, logged);
    }
    res
}

/// A request span's first name (the A2A method replaces it once known).
fn span_name(req: &ServiceRequest) -> String {
    format!("{} {}", req.method(), req.path())
}

/// The HTTP attributes of a request's span.
fn span_attributes(req: &ServiceRequest) -> Vec<opentelemetry::KeyValue> {
    use actix_web::http::{header, Method};
    use opentelemetry::KeyValue;
    // Static strings where the value is one of a few: a span's attributes are made on every
    // request, and each string made is an allocation, and another when it is exported.
    let method: opentelemetry::Value = match *req.method() {
        Method::POST => "POST".into(),
        Method::GET => "GET".into(),
        Method::OPTIONS => "OPTIONS".into(),
        Method::DELETE => "DELETE".into(),
        Method::PUT => "PUT".into(),
        ref other => other.to_string().into(),
    };
    // The original request's scheme where a proxy says it (actix reads `Forwarded` and
    // `X-Forwarded-Proto`, and works out the host too, so only when one is there).
    let headers = req.headers();
    let scheme: opentelemetry::Value = if headers.contains_key(header::FORWARDED)
        || headers.contains_key(header::X_FORWARDED_PROTO)
    {
        req.connection_info().scheme().to_string().into()
    } else if req.app_config().secure() {
        "https".into()
    } else {
        "http".into()
    };
    let mut out = vec![
        KeyValue::new("http.request.method", method),
        KeyValue::new("url.path", req.path().to_string()),
        KeyValue::new("url.scheme", scheme),
        KeyValue::new(
            "network.protocol.version",
            match req.version() {
                actix_web::http::Version::HTTP_2 => "2",
                actix_web::http::Version::HTTP_10 => "1.0",
                _ => "1.1",
            },
        ),
    ];
    if let Some(peer) = req.peer_addr() {
        out.push(KeyValue::new("client.address", client_address(peer.ip())));
    }
    if let Some(agent) = req
        .headers()
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
    {
        out.push(KeyValue::new("user_agent.original", agent.to_string()));
    }
    out
}

/// The client's address as a span attribute. Formatting an address takes about 1.6k
/// instructions, and a worker's requests mostly come from the same few addresses, so the
/// worker keeps the last one it formatted (shared, not copied, into each span).
fn client_address(ip: std::net::IpAddr) -> opentelemetry::StringValue {
    use std::cell::RefCell;
    thread_local! {
        static LAST: RefCell<Option<(std::net::IpAddr, opentelemetry::StringValue)>> =
            const { RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((seen, text)) if *seen == ip => text.clone(),
        _ => {
            let text =
                opentelemetry::StringValue::from(std::sync::Arc::<str>::from(ip.to_string()));
            *last = Some((ip, text.clone()));
            text
        }
    })
}

/// What the access log says of a request besides its call's note.
pub(crate) struct Logged<'a> {
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    /// The HTTP status, or on gRPC the status code.
    pub(crate) status: u16,
    pub(crate) trace_id: Option<&'a str>,
}

/// A finished call into the metrics and, when it is on, the access log: every binding's.
pub(crate) fn account(
    state: &AppState,
    call: &telemetry::Call,
    seconds: f64,
    logged: Option<Logged>,
) {
    if let Some(method) = call.method {
        let outcome = call.error.map_or("ok", |(_, reason)| reason);
        state.metrics.request(
            call.agent.as_deref().unwrap_or(""),
            [
                method,
                call.dialect.unwrap_or(""),
                call.binding.unwrap_or(""),
            ],
            outcome,
            seconds,
        );
        state.usage.request(
            call.principal.as_ref(),
            call.agent.as_ref(),
            call.binding.unwrap_or(""),
            method,
            call.error.is_some(),
            call.bytes_in,
            call.bytes_out,
        );
    }
    if let Some(Logged {
        method,
        path,
        status,
        trace_id,
    }) = logged
    {
        tracing::info!(
            target: ACCESS,
            method,
            path,
            status,
            // Microseconds, as milliseconds with three decimals: no float noise in the log.
            duration_ms = (seconds * 1e6).round() / 1e3,
            agent = call.agent.as_deref(),
            a2a.method = call.method,
            a2a.dialect = call.dialect,
            a2a.binding = call.binding,
            code = call.error.map(|(code, _)| code),
            reason = call.error.map(|(_, reason)| reason),
            principal = call.principal.as_deref(),
            task_id = call.task_id.as_deref(),
            context_id = call.context_id.as_deref(),
            trace_id,
            "request"
        );
    }
}

/// Where answers wait for the store, an answer leaves once what its call changed is where
/// it must be: where every replica reads it (a shared store), or on disk (`durability =
/// "sync"`). If a shared store does not take it in time, the answer still goes (the work
/// is done, and the changes are written when the store is back), and the log says so; a
/// synced one that does not is answered with the refusal returned here instead.
async fn stored_first<B>(
    res: &ServiceResponse<B>,
    parent: Option<crate::telemetry::Parent>,
) -> Option<HttpResponse> {
    let req = res.request();
    let state = req.app_data::<web::Data<AppState>>()?;
    // The wait's span, when spans are exported.
    let system = state.store.system;
    let mut span = parent.map(|p| {
        p.child(
            "store commit".into(),
            opentelemetry::trace::SpanKind::Internal,
            vec![opentelemetry::KeyValue::new("db.system.name", system)],
        )
    });
    if state.store.settled().await {
        return None;
    }
    if let Some(span) = span.as_mut() {
        span.fail("the store did not take the changes in time".into());
    }
    if state.store.sync {
        let error = GatewayError::StoreUnavailable(format!(
            "the commit holding the changes of {} failed",
            quoted(req.path())
        ));
        return Some(match jsonrpc_path(req.path()) {
            true => super::jsonrpc::refusal(req, state, &error),
            false => error_response(&error),
        });
    }
    tracing::warn!(
        path = %quoted(req.path()),
        "answered before the shared store took the call's changes: other replicas see them once it is back"
    );
    None
}

/// The answer to a new request while draining, in its binding's shape: a JSON-RPC error
/// for a POST to a JSON-RPC endpoint, else a `google.rpc.Status`. Either way 503,
/// `Retry-After` and `Connection: close`.
fn drain_refusal(req: &ServiceRequest, state: &AppState) -> HttpResponse {
    if req.method() == actix_web::http::Method::POST && jsonrpc_path(req.path()) {
        super::jsonrpc::refusal(req.request(), state, &state.shutting_down())
    } else {
        error_response(&state.shutting_down())
    }
}

/// Whether a POST to `path` is a JSON-RPC call (else the HTTP+JSON binding's).
fn jsonrpc_path(path: &str) -> bool {
    path == "/a2a" || super::agent_segment(path).is_some()
}

/// The `X-RateLimit-*` headers a handler recorded for its request (also on a refusal).
fn rate_limit_headers(headers: &mut HeaderMap, info: RateInfo) {
    for (name, value) in info.headers() {
        headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
    }
}

/// The `X-Budget-*` headers of the budget a call came nearest to spending.
fn budget_headers(headers: &mut HeaderMap, standing: &Standing) {
    for (name, value) in standing.headers() {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
}

/// `GET /metrics`: the Prometheus text exposition.
pub(super) async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    crate::telemetry::flush_everywhere().await;
    render_metrics(&state)
}

pub(crate) fn render_metrics(state: &AppState) -> HttpResponse {
    let live = state.live();
    let agents = live.registry.iter().map(|a| a.gauges());
    let by_state = state.service.tasks().count_by_state();
    let (bytes, bytes_limit, largest_task_bytes) = state.service.tasks().byte_figures();
    let store = crate::telemetry::StoreGauges {
        tasks: state.service.tasks().len(),
        bytes,
        bytes_limit,
        largest_task_bytes,
        writable: state.store.writes.writing(),
        outages: state.store.writes.outages(),
        commit_failures: state.store.writes.commit_failures(),
        commit_seconds: state.store.writes.commit_seconds(),
    };
    let edge = crate::telemetry::EdgeGauges {
        connections: state.connections.open(),
        refused: state.connections.refused(),
        spans_dropped: state.tracing.as_ref().map_or(0, |t| t.dropped()),
        mcp_sessions: state
            .mcp_sessions
            .load(std::sync::atomic::Ordering::Relaxed),
    };
    let body = state.metrics.render(agents, &by_state, &store, &edge);
    HttpResponse::Ok()
        .insert_header(("Cache-Control", "no-store"))
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(body)
}

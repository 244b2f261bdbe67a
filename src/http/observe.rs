//! One middleware around every request: refuses new work while draining, carries the
//! caller's trace context to the layers below, then writes the access-log line and moves
//! the request metrics from what the layers noted (see [`crate::telemetry::Call`]).

use std::time::Instant;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::HttpMessage;
use actix_web::{web, HttpResponse};
use tracing::Instrument;

use super::cors::Cors;
use super::{error_response, quoted, AppState};
use crate::limits::RateInfo;
use crate::telemetry::{self, TraceParent};

use crate::telemetry::ACCESS;

static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The probes answer while draining: liveness stays up, readiness says why it is not.
fn is_probe(path: &str) -> bool {
    [super::HEALTH_PATH, super::READY_PATH, super::METRICS_PATH].contains(&path)
}

/// The caller's W3C trace context; `tracestate` rides along when short and printable.
fn trace_context(req: &ServiceRequest) -> Option<(TraceParent, Option<String>)> {
    let parent = TraceParent::parse(req.headers().get(&TRACEPARENT)?.as_bytes())?;
    let state = req
        .headers()
        .get(&TRACESTATE)
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 512)
        .map(str::to_string);
    Some((parent, state))
}

/// The one middleware in front of every route: drain refusals, CORS (preflights answered
/// here), the trace context and the per-request note, then the rate-limit headers, CORS
/// headers, the metrics and the access-log line on the way out. One layer rather than
/// several: each `from_fn` layer boxes a future per request.
pub(crate) async fn edge(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let start = Instant::now();
    let Some(state) = req.app_data::<web::Data<AppState>>() else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_left_body);
    };
    let draining = state.lifecycle.draining();
    // Whether answers wait for a shared store (read now: the state is not at hand later).
    let shared = state.store.shared.is_some();
    let (cors, rated) = {
        let live = state.live.load();
        (Cors::check(&live.config.cors, &req), live.rates.active())
    };
    let cors = match cors {
        Cors::Preflight(resp) => return Ok(req.into_response(resp).map_into_right_body()),
        other => other,
    };
    if draining && !is_probe(req.path()) {
        let mut resp = drain_refusal(&req, state);
        cors.decorate(resp.headers_mut());
        return Ok(req.into_response(resp).map_into_right_body());
    }
    let logged = tracing::enabled!(target: ACCESS, tracing::Level::INFO);
    let head = logged.then(|| (req.method().clone(), quoted(req.path())));
    let trace = trace_context(&req);
    let trace_id = trace
        .as_ref()
        .filter(|_| logged)
        .map(|(t, _)| t.trace_id().to_string());
    // The request's span, when the access log is on: what is logged while the request is
    // handled says which call it belongs to. (Without it, no span is entered per poll.)
    let handled = telemetry::observed(trace, next.call(req));
    let (span, (res, call)) = if logged {
        let span = tracing::info_span!(
            "request",
            a2a.method = tracing::field::Empty,
            task_id = tracing::field::Empty,
            context_id = tracing::field::Empty,
        );
        (span.clone(), handled.instrument(span).await)
    } else {
        (tracing::Span::none(), handled.await)
    };
    let mut res = match res {
        Ok(res) => res,
        Err(e) => {
            if let Some((method, path)) = head {
                let status = e.as_response_error().status_code().as_u16();
                tracing::info!(target: ACCESS, %method, path, status, "request");
            }
            return Err(e);
        }
    };
    if shared {
        shared_first(&res).await;
    }
    let _inside = span.enter();
    let seconds = start.elapsed().as_secs_f64();
    if rated {
        let rate = res.request().extensions().get::<RateInfo>().copied();
        if let Some(info) = rate {
            rate_limit_headers(res.headers_mut(), info);
        }
    }
    cors.decorate(res.headers_mut());
    let status = res.status().as_u16();
    if let (Some(state), Some(method)) =
        (res.request().app_data::<web::Data<AppState>>(), call.method)
    {
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
    }
    if let Some((method, path)) = head {
        tracing::info!(
            target: ACCESS,
            %method,
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
            trace_id = trace_id.as_deref(),
            "request"
        );
    }
    Ok(res.map_into_left_body())
}

/// With a shared store, an answer leaves once what its call changed is where every replica
/// reads it. If the store does not take it in time, the answer still goes (the work is
/// done, and the changes are written when the store is back), and the log says so.
async fn shared_first<B>(res: &ServiceResponse<B>) {
    if res.request().method() != actix_web::http::Method::POST {
        return;
    }
    let Some(written) = res
        .request()
        .app_data::<web::Data<AppState>>()
        .and_then(|state| state.store.barrier())
    else {
        return;
    };
    if !matches!(
        tokio::time::timeout(std::time::Duration::from_secs(5), written).await,
        Ok(Ok(()))
    ) {
        tracing::warn!(
            path = %quoted(res.request().path()),
            "answered before the shared store took the call's changes: other replicas see them once it is back"
        );
    }
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
    for (name, value) in [
        ("x-ratelimit-limit", info.limit.to_string()),
        ("x-ratelimit-remaining", info.remaining.to_string()),
        ("x-ratelimit-reset", info.reset_secs.to_string()),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
}

/// `GET /metrics`: the Prometheus text exposition.
pub(super) async fn metrics(state: web::Data<AppState>) -> HttpResponse {
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
    };
    let body = state
        .metrics
        .render(agents, &by_state, &store, state.connections.open());
    HttpResponse::Ok()
        .insert_header(("Cache-Control", "no-store"))
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(body)
}

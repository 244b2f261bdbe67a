//! One middleware around every request: refuses new work while draining, carries the
//! caller's trace context to the layers below, then writes the access-log line and moves
//! the request metrics from what the layers noted (see [`crate::telemetry::Call`]).

use std::time::Instant;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::HeaderName;
use actix_web::middleware::Next;
use actix_web::{web, HttpResponse};
use tracing::Instrument;

use super::{error_response, quoted, AppState};
use crate::error::GatewayError;
use crate::telemetry::{self, TraceParent};

use crate::telemetry::ACCESS;

static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The probes answer while draining: liveness stays up, readiness says why it is not.
fn is_probe(path: &str) -> bool {
    matches!(path, "/a2a/health" | "/a2a/ready" | "/metrics")
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

pub(crate) async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let start = Instant::now();
    let state = req.app_data::<web::Data<AppState>>().cloned();
    if state.as_ref().is_some_and(|s| s.lifecycle.draining()) && !is_probe(req.path()) {
        let resp: HttpResponse = error_response(&GatewayError::ShuttingDown);
        return Ok(req.into_response(resp).map_into_right_body());
    }
    let logged = tracing::enabled!(target: ACCESS, tracing::Level::INFO);
    let head = logged.then(|| (req.method().clone(), quoted(req.path())));
    let trace = trace_context(&req);
    let trace_id = trace
        .as_ref()
        .filter(|_| logged)
        .map(|(t, _)| t.trace_id().to_string());
    // The request's span (when logged at all): what is logged while it is handled says
    // which call it belongs to.
    let span = if logged {
        tracing::info_span!(
            "request",
            a2a.method = tracing::field::Empty,
            task_id = tracing::field::Empty,
            context_id = tracing::field::Empty,
        )
    } else {
        tracing::Span::none()
    };
    let (res, call) = telemetry::observed(trace, next.call(req))
        .instrument(span.clone())
        .await;
    let _inside = span.enter();
    let seconds = start.elapsed().as_secs_f64();
    let status = match &res {
        Ok(r) => r.status().as_u16(),
        Err(e) => e.as_response_error().status_code().as_u16(),
    };
    if let (Some(state), Some(method)) = (&state, call.method) {
        let agent = call.agent.as_deref().unwrap_or("");
        let outcome = call.error.map_or("ok", |(_, reason)| reason);
        state.metrics.request(
            [
                agent,
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
            duration_ms = seconds * 1000.0,
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
    res.map(ServiceResponse::map_into_left_body)
}

/// `GET /metrics`: the Prometheus text exposition.
pub(super) async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    render_metrics(&state)
}

pub(crate) fn render_metrics(state: &AppState) -> HttpResponse {
    let live = state.live();
    let agents = live.registry.iter().map(|a| a.gauges());
    let by_state = state.service.tasks().count_by_state();
    let body = state.metrics.render(
        agents,
        &by_state,
        state.service.tasks().len(),
        state.connections.open(),
    );
    HttpResponse::Ok()
        .insert_header(("Cache-Control", "no-store"))
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(body)
}

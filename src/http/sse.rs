//! Server-sent event responses, shared by the JSON-RPC and HTTP+JSON bindings.

use std::convert::Infallible;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, Responder};
use actix_web_lab::sse;
use futures_util::StreamExt;

use super::AppState;
use crate::error::GatewayError;
use crate::limits::StreamSlot;
use crate::protocol::model::StreamItem;
use crate::protocol::ops::{ItemStream, Positioned};
use crate::telemetry;

/// Streams `items` as SSE, each rendered by `render` into a `data:` payload (an error goes
/// out as `event: error`), with keep-alive comments while idle. See [`watched`] for what
/// every stream gets whatever its binding.
pub(super) fn event_stream<R>(
    req: &HttpRequest,
    state: &AppState,
    items: ItemStream,
    keepalive: Duration,
    slot: StreamSlot,
    render: R,
) -> HttpResponse
where
    R: Fn(&Result<StreamItem, GatewayError>) -> (bool, Vec<u8>) + 'static,
{
    // Called while the request's note is current: it names the caller and the agent.
    let noted = telemetry::noted(|c| (c.principal.clone(), c.agent.clone()));
    let mut counted = noted
        .and_then(|(caller, agent)| crate::usage::Streamed::start(&state.usage, caller, agent));
    let events = watched_positioned(state, items, slot).map(move |positioned| {
        let (item, at) = match positioned {
            Ok((item, at)) => (Ok(item), at),
            Err(e) => (Err(e), None),
        };
        let (is_error, body) = render(&item);
        if let Some(counted) = counted.as_mut() {
            counted.bytes += body.len() as u64;
        }
        let text = String::from_utf8(body)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        let data = sse::Data::new(text);
        let data = match (&item, at) {
            (Ok(item), Some(version)) => match item.task_id() {
                Some(task) => data.id(crate::protocol::resume::event_id(task, version)),
                None => data,
            },
            _ => data,
        };
        Ok::<_, Infallible>(sse::Event::Data(if is_error {
            data.event("error")
        } else {
            data
        }))
    });
    let mut resp = sse::Sse::from_stream(events)
        .with_keep_alive(keepalive)
        .respond_to(req);
    // Reverse proxies (nginx) buffer responses unless told not to.
    resp.headers_mut().insert(
        header::HeaderName::from_static("x-accel-buffering"),
        header::HeaderValue::from_static("no"),
    );
    resp.map_into_boxed_body()
}

/// A stream's events as every binding sends them: counted in the stream metrics (the time
/// to the first event, the open-stream gauge), holding `slot` (the stream's place in the
/// gateway-wide and the caller's counts) until it ends, and when the gateway drains ended
/// with a `ShuttingDown` error, which tells the client to resubscribe elsewhere. Called
/// while the request's note is current (it names the agent and the method).
pub(crate) fn watched(
    state: &AppState,
    items: ItemStream,
    slot: StreamSlot,
) -> impl futures_util::Stream<Item = Result<StreamItem, GatewayError>> + Send + 'static {
    watched_positioned(state, items, slot).map(|r| r.map(|(item, _)| item))
}

/// [`watched`], each item with its place among its task's events.
fn watched_positioned(
    state: &AppState,
    items: ItemStream,
    slot: StreamSlot,
) -> impl futures_util::Stream<Item = Positioned> + Send + 'static {
    let items = items.with_positions();
    let observed = telemetry::noted(|c| (c.agent.clone(), c.method))
        .and_then(|(agent, method)| state.metrics.stream(agent.as_deref()?, method?));
    let mut watch = observed.map(|(first_event, open)| StreamWatch::new(first_event, open));
    // The request's span, when spans are exported: it ends with the stream, and says the
    // state the task was last seen in.
    let span = telemetry::request_span();
    let drain = state.lifecycle.drain_token();
    let farewell = state.shutting_down();
    let items = items.take_until(drain.clone().cancelled_owned());
    let farewell = futures_util::stream::once(async move { drain.is_cancelled() }).filter_map(
        move |drained| {
            let farewell = farewell.clone();
            async move { drained.then_some(Err(farewell)) }
        },
    );
    items.chain(farewell).map(move |item| {
        let _open = &slot;
        if let Some(w) = watch.as_mut() {
            w.event();
        }
        if let (Some(span), Ok((item, _))) = (&span, &item) {
            match item {
                StreamItem::Task(t) => {
                    span.task_event(&t.id, &t.context_id, Some(t.status.state.v03_name()));
                }
                StreamItem::StatusUpdate(u) => {
                    span.task_event(&u.task_id, &u.context_id, Some(u.status.state.v03_name()));
                }
                StreamItem::Message(_) | StreamItem::ArtifactUpdate(_) => {}
            }
        }
        item
    })
}

/// A stream's metrics: the time to its first event, and the open-stream gauge, which it
/// holds up while alive.
struct StreamWatch {
    started: std::time::Instant,
    first_event: Option<prometheus::Histogram>,
    open: prometheus::IntGauge,
}

impl StreamWatch {
    fn new(first_event: prometheus::Histogram, open: prometheus::IntGauge) -> StreamWatch {
        open.inc();
        StreamWatch {
            started: std::time::Instant::now(),
            first_event: Some(first_event),
            open,
        }
    }

    fn event(&mut self) {
        if let Some(h) = self.first_event.take() {
            h.observe(self.started.elapsed().as_secs_f64());
        }
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        self.open.dec();
    }
}

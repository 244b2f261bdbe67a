//! Server-sent event responses, shared by the JSON-RPC and HTTP+JSON bindings.

use std::convert::Infallible;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, Responder};
use actix_web_lab::sse;
use futures_util::StreamExt;

use crate::error::GatewayError;
use crate::limits::StreamSlot;
use crate::protocol::model::StreamItem;
use crate::protocol::ops::ItemStream;

/// Streams `items` as SSE, each rendered by `render` into a `data:` payload (an error goes
/// out as `event: error`), with keep-alive comments while idle.
/// `slot` holds the stream's place in the gateway-wide count until the stream ends.
pub(super) fn event_stream<R>(
    req: &HttpRequest,
    items: ItemStream,
    keepalive: Duration,
    slot: StreamSlot,
    render: R,
) -> HttpResponse
where
    R: Fn(&Result<StreamItem, GatewayError>) -> (bool, Vec<u8>) + 'static,
{
    let events = items.map(move |item| {
        let _open = &slot;
        let (is_error, body) = render(&item);
        let text = String::from_utf8(body)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        let data = sse::Data::new(text);
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

//! Reading request bodies: content type, size, time and memory checks that answer in the
//! protocol.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, HttpRequest};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;

use crate::config::Limits;
use crate::error::GatewayError;

/// JSON-RPC travels as `application/json`; `application/a2a+json` and other `+json` types are
/// accepted too. A missing Content-Type is tolerated: the body must still parse as JSON.
pub(super) fn check_content_type(req: &HttpRequest) -> Result<(), GatewayError> {
    let Some(value) = req.headers().get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let raw = value.as_bytes();
    let essence = raw.split(|b| *b == b';').next().unwrap_or(raw).trim_ascii();
    let json = essence.eq_ignore_ascii_case(b"application/json")
        || (essence.len() >= 5 && essence[essence.len() - 5..].eq_ignore_ascii_case(b"+json"));
    if json {
        Ok(())
    } else {
        let essence = String::from_utf8_lossy(essence).to_ascii_lowercase();
        Err(GatewayError::ContentTypeNotSupported(format!(
            "\"{essence}\"; send JSON-RPC as application/json"
        )))
    }
}

/// What a body may cost: its size, its time, and its share of the bytes held gateway-wide
/// for bodies still arriving (so slow senders cannot hold the gateway's memory).
pub(crate) struct BodyLimits {
    max_bytes: usize,
    base_time: Duration,
    min_rate: usize,
    budget: usize,
    buffered: AtomicUsize,
}

impl BodyLimits {
    pub(crate) fn new(limits: &Limits) -> BodyLimits {
        BodyLimits {
            max_bytes: limits.max_body_bytes,
            base_time: Duration::from_secs(limits.body_timeout_secs.max(1)),
            min_rate: limits.body_min_bytes_per_sec.max(1),
            budget: limits.max_buffered_body_bytes,
            buffered: AtomicUsize::new(0),
        }
    }

    /// Bytes held right now for bodies still arriving.
    pub(crate) fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Acquire)
    }

    /// Takes `n` more bytes of the budget, or refuses.
    fn reserve(&self, held: &mut Held<'_>, n: usize) -> Result<(), GatewayError> {
        let before = self.buffered.fetch_add(n, Ordering::AcqRel);
        if before + n > self.budget {
            self.buffered.fetch_sub(n, Ordering::AcqRel);
            return Err(GatewayError::BodiesOverBudget);
        }
        held.bytes += n;
        Ok(())
    }
}

/// A body's reservation, given back when the body is read (or given up).
struct Held<'a> {
    limits: &'a BodyLimits,
    bytes: usize,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.limits.buffered.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Reads the body: refused at once when its declared size is over the limit or the
/// gateway's budget, refused as soon as it grows past either, and given up with 408 when it
/// has not arrived within `body_timeout_secs` plus a second per `body_min_bytes_per_sec`.
pub(super) async fn read_body(
    req: &HttpRequest,
    mut body: web::Payload,
    limits: &BodyLimits,
) -> Result<Bytes, GatewayError> {
    let limit = limits.max_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(GatewayError::PayloadTooLarge(limit));
    }
    let mut held = Held { limits, bytes: 0 };
    // A declared length is taken whole up front: a sender cannot start many bodies cheaply.
    if let Some(n) = declared {
        limits.reserve(&mut held, n)?;
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(1024).min(limit));
    let mut take = |chunk: Result<Bytes, actix_web::error::PayloadError>,
                    buf: &mut BytesMut|
     -> Result<(), GatewayError> {
        let chunk = chunk
            .map_err(|e| GatewayError::InvalidRequest(format!("could not read the body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(GatewayError::PayloadTooLarge(limit));
        }
        let more = (buf.len() + chunk.len()).saturating_sub(held.bytes);
        if more > 0 {
            limits.reserve(&mut held, more)?;
        }
        buf.extend_from_slice(&chunk);
        Ok(())
    };
    let expected = declared.unwrap_or(limit);
    let deadline = limits.base_time + Duration::from_secs((expected / limits.min_rate) as u64);
    let rest = async {
        while let Some(chunk) = body.next().await {
            take(chunk, &mut buf)?;
        }
        Ok(())
    };
    match tokio::time::timeout(deadline, rest).await {
        Ok(result) => result.map(|()| buf.freeze()),
        Err(_) => Err(GatewayError::RequestTimeout(deadline.as_secs())),
    }
}

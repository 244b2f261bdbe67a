//! Reading request bodies: content type and size checks that answer in the protocol.

use actix_web::http::header;
use actix_web::{web, HttpRequest};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;

use crate::error::GatewayError;

/// JSON-RPC travels as `application/json`; `application/a2a+json` and other `+json` types are
/// accepted too. A missing Content-Type is tolerated: the body must still parse as JSON.
pub fn check_content_type(req: &HttpRequest) -> Result<(), GatewayError> {
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

/// Reads the body, refusing at once (by Content-Length) or as soon as it exceeds `limit`.
pub async fn read_body(
    req: &HttpRequest,
    mut body: web::Payload,
    limit: usize,
) -> Result<Bytes, GatewayError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(GatewayError::PayloadTooLarge(limit));
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(1024).min(limit));
    while let Some(chunk) = body.next().await {
        let chunk = chunk
            .map_err(|e| GatewayError::InvalidRequest(format!("could not read the body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(GatewayError::PayloadTooLarge(limit));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

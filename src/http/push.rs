//! The push endpoints outside the A2A bindings: the public key receivers verify the
//! gateway's notification JWTs with, and the webhooks the gateway registers with upstreams
//! that push (a secret URL per task, checked against the token it was registered with).

use actix_web::{web, HttpRequest, HttpResponse};

use super::body::read_body;
use super::{error_response, AppState};
use crate::push::TOKEN_HEADER;

pub(crate) const JWKS_PATH: &str = "/.well-known/jwks.json";

/// `GET /.well-known/jwks.json`: 404 while push is off.
pub(super) async fn jwks(state: web::Data<AppState>) -> HttpResponse {
    match state.service.push().jwks() {
        Some(keys) => HttpResponse::Ok()
            .content_type("application/jwk-set+json")
            .insert_header(("Cache-Control", "public, max-age=300"))
            .json(keys),
        None => HttpResponse::NotFound().json(crate::error::status_body(
            404,
            "push notifications are off, and nothing is signed",
            None,
        )),
    }
}

/// `POST /a2a/push/{secret}`: an upstream's notification for a task, relayed to the
/// task's configs. Answered 204 once taken; the upstream's delivery is not held up by
/// the gateway's own deliveries.
pub(super) async fn relay(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
    secret: web::Path<String>,
) -> HttpResponse {
    let token = req
        .headers()
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok());
    let outcome = async {
        let payer = |h: &ahash::RandomState| state.live().caller_hash(&req, None, h);
        let bytes = read_body(&req, body, &state.bodies, &payer).await?;
        state.service.push_arrived(&secret, token, &bytes).await
    }
    .await;
    match outcome {
        Ok(()) => HttpResponse::NoContent().finish(),
        Err(e) => error_response(&e),
    }
}

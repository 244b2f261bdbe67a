//! The push endpoints outside the A2A bindings: the public key receivers verify the
//! gateway's notification JWTs with, and the webhooks the gateway registers with upstreams
//! that push (a secret URL per task, checked against the token it was registered with).

use actix_web::{web, HttpRequest, HttpResponse};

use super::body::{read_body, Payer};
use super::{error_response, AppState};
use crate::push::TOKEN_HEADER;

pub(crate) const JWKS_PATH: &str = "/.well-known/jwks.json";

/// `GET /.well-known/jwks.json`: the keys cards and push notifications are signed with.
pub(super) async fn jwks(state: web::Data<AppState>) -> HttpResponse {
    let mut keys = vec![state.card_signer.jwk().clone()];
    let push = state.service.push().jwks();
    let push_keys = push.as_ref().and_then(|set| set["keys"].as_array());
    for key in push_keys.into_iter().flatten() {
        if !keys.iter().any(|k| k["kid"] == key["kid"]) {
            keys.push(key.clone());
        }
    }
    HttpResponse::Ok()
        .content_type("application/jwk-set+json")
        .insert_header(("Cache-Control", "public, max-age=300"))
        .json(serde_json::json!({ "keys": keys }))
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
        let hash = |h: &ahash::RandomState| state.live().caller_hash(&req, None, h);
        let payer = Payer {
            hash: &hash,
            anonymous: true,
        };
        let bytes = read_body(&req, body, &state.bodies, &payer).await?;
        state.service.push_arrived(&secret, token, &bytes).await
    }
    .await;
    match outcome {
        Ok(()) => HttpResponse::NoContent().finish(),
        Err(e) => error_response(&e),
    }
}

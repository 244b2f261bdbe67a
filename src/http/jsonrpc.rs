//! `POST /a2a` and `POST /a2a/agents/{name}`: bytes in, JSON-RPC (or SSE) out. Every failure,
//! including the ones before JSON-RPC parsing, answers with a JSON-RPC error body.

use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use futures_util::future::LocalBoxFuture;

use super::admission::{self, Admitted, Refused, Target};
use super::body::{check_content_type, read_body, Payer};
use super::caller::Caller;
use super::sse::event_stream;
use super::{resume_from, served_headers, version_header, Addressed, AppState};
use crate::error::GatewayError;
use crate::limits::StreamSlot;
use crate::protocol::jsonrpc::{
    parse_request, parse_request_for_agent, render_result, Method, RpcId,
};
use crate::protocol::Dialect;
use crate::rpc::{dispatch, json, render_stream_item, RpcReply};
use crate::telemetry;
use serde_json::value::RawValue;

// The state and the caller are taken in the handler, not as extractors: actix-web's
// extractor tuple is a future of its own, polled per argument, on the hottest path.

/// The JSON-RPC endpoints, `/a2a` and `/a2a/agents/{name}`, called by the edge itself; any
/// other path is given back for actix's router. The endpoints take nearly every request,
/// and the router's lookup and its layers (a scope, a resource, a handler service, each a
/// boxed service call and a boxed future) cost about 2.6k instructions a call.
pub(super) fn direct(
    req: ServiceRequest,
) -> Result<LocalBoxFuture<'static, ServiceResponse>, ServiceRequest> {
    let path = req.path();
    if path != "/a2a" && super::agent_segment(path).is_none() {
        return Err(req);
    }
    let (req, mut payload) = req.into_parts();
    let body = web::Payload::from_request(&req, &mut payload).into_inner();
    // `handle` is awaited in the boxed future itself: each async level around it is one
    // more copy of its whole future (2.3 KB) when it starts, into memory out of cache.
    Ok(Box::pin(async move {
        let resp = match body {
            Err(e) => e.error_response(),
            // Either endpoint, any method: JSON-RPC calls are POSTs.
            Ok(_) if req.method() != actix_web::http::Method::POST => {
                super::method_not_allowed(req.clone()).await
            }
            // The caller is found in the future, not before it: who called is noted for
            // the request's telemetry, which is there only while the future is polled.
            Ok(body) => match Caller::with_state(&req) {
                Some((state, caller)) => {
                    // Looked up once: the request keeps the agent it addressed, whatever
                    // is swapped in later.
                    let path = super::agent_segment(req.path());
                    let addressed = Addressed::of(&caller.live.registry, path);
                    handle(req.clone(), body, state, caller, addressed).await
                }
                None => HttpResponse::InternalServerError().finish(),
            },
        };
        ServiceResponse::new(req, resp)
    }))
}

pub(super) async fn handle(
    req: HttpRequest,
    body: web::Payload,
    state: &AppState,
    caller: Caller,
    addressed: Addressed,
) -> HttpResponse {
    let version = version_header(&req);
    let header_dialect = Dialect::from_version_header(version.as_deref());
    let early_dialect = header_dialect
        .as_ref()
        .ok()
        .copied()
        .flatten()
        .unwrap_or(Dialect::V03);
    let early = |e: GatewayError| RpcReply::error(&RpcId::NULL, early_dialect, &e);

    // Credentials first: a caller that cannot get in learns nothing about the request.
    let live = caller.live;
    let caller = match admission::at_the_door(&live, caller.principal, &addressed) {
        Ok(c) => c,
        Err(e) => return respond(&req, state, early(e)),
    };
    if let Err(e) = check_content_type(&req) {
        return respond(&req, state, early(e));
    }
    let hash = |h: &ahash::RandomState| live.caller_hash(&req, Some(&caller), h);
    let payer = Payer {
        hash: &hash,
        anonymous: caller.anonymous,
    };
    let bytes = match read_body(&req, body, &state.bodies, &payer).await {
        Ok(b) => b,
        Err(e) => return respond(&req, state, early(e)),
    };
    let header_dialect = match header_dialect {
        Ok(d) => d,
        Err(e) => {
            // The method name, when readable, says which dialect to answer in.
            let (id, dialect) = match parse_request(&bytes, None) {
                Ok(r) => (r.id, r.dialect),
                Err(f) => (f.id, early_dialect),
            };
            return respond(&req, state, RpcReply::error(&id, dialect, &e));
        }
    };
    // On /a2a the router reads the raw params before anything else does.
    let parsed = match addressed {
        Addressed::Shared => parse_request(&bytes, header_dialect),
        Addressed::Agent(_) | Addressed::Unknown(_) => {
            parse_request_for_agent(&bytes, header_dialect)
        }
    };
    let mut rpc = match parsed {
        Ok(r) => r,
        Err(f) => return respond(&req, state, RpcReply::error(&f.id, f.dialect, &f.error)),
    };
    if rpc.method.is_streaming() {
        match resume_from(&req) {
            Ok(from) => rpc.resume = from,
            Err(e) => return respond(&req, state, RpcReply::error(&rpc.id, rpc.dialect, &e)),
        }
    }
    telemetry::note_method(rpc.method.name(), rpc.dialect.version(), "jsonrpc");
    if rpc.method == Method::GetExtendedAgentCard && !matches!(addressed, Addressed::Unknown(_)) {
        let base = live.base_url(&req);
        let card = super::extended_card(state, &live, &caller, &addressed, &base, rpc.dialect);
        let reply = card
            .and_then(|card| {
                let card: &RawValue = serde_json::from_slice(card.json())
                    .map_err(|e| GatewayError::Internal(format!("a rendered card: {e}")))?;
                render_result(&rpc.id, card)
            })
            .map_or_else(|e| RpcReply::error(&rpc.id, rpc.dialect, &e), json);
        return respond(&req, state, reply);
    }
    let streams = rpc.method.is_streaming();
    let admitted = admission::admit(
        state,
        &req,
        &live,
        &caller,
        addressed,
        Target::Rpc(&rpc),
        streams,
    )
    .await;
    let Admitted {
        agent,
        served,
        slot,
    } = match admitted {
        Ok(a) => a,
        Err(Refused { error, served }) => {
            let mut resp = respond(&req, state, RpcReply::error(&rpc.id, rpc.dialect, &error));
            if let Some(served) = &served {
                served_headers(&mut resp, served);
            }
            return resp;
        }
    };
    let reply = dispatch(&state.service, &agent, &caller, rpc, &served).await;
    let mut resp = respond_with(&req, state, reply, slot);
    served_headers(&mut resp, &served);
    resp
}

/// A POST to a path that is no endpoint. JSON-RPC clients read the answer as a JSON-RPC
/// error (with their request's id when it parses); proxies see the 404. A path under an
/// agent that does not exist names the agents there are, as `/a2a/agents/<unknown>` does.
pub(super) async fn unknown_endpoint(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
    caller: Caller,
) -> HttpResponse {
    let header = Dialect::from_version_header(version_header(&req).as_deref())
        .ok()
        .flatten();
    let addressed = Addressed::of(&caller.live.registry, super::agent_in_path(req.path()));
    let error = match addressed {
        Addressed::Unknown(name) => match caller.principal {
            Ok(principal) => caller.live.missing_agent(&principal, &name),
            Err(e) => e,
        },
        Addressed::Shared | Addressed::Agent(_) => {
            GatewayError::EndpointNotFound(super::quoted(req.path()))
        }
    };
    // The body only lends its id and dialect to the answer; one that cannot be read
    // (too large, cut off) leaves them at their defaults.
    let hash = |h: &ahash::RandomState| caller.live.caller_hash(&req, None, h);
    let payer = Payer {
        hash: &hash,
        anonymous: true,
    };
    let bytes = read_body(&req, body, &state.bodies, &payer)
        .await
        .unwrap_or_default();
    let (id, dialect) = match parse_request(&bytes, header) {
        Ok(r) => (r.id, r.dialect),
        Err(f) => (f.id, f.dialect),
    };
    respond(&req, &state, RpcReply::error(&id, dialect, &error))
}

/// A call refused before it is read (the gateway is draining; a door's credentials), as a
/// JSON-RPC error in the dialect its header names.
pub(crate) fn refusal(req: &HttpRequest, state: &AppState, error: &GatewayError) -> HttpResponse {
    let dialect = Dialect::from_version_header(version_header(req).as_deref())
        .ok()
        .flatten()
        .unwrap_or(Dialect::V03);
    respond(req, state, RpcReply::error(&RpcId::NULL, dialect, error))
}

/// A JSON-RPC answer made elsewhere (the MCP door's refusals), sent as every JSON-RPC
/// answer is.
pub(crate) fn answer(req: &HttpRequest, state: &AppState, reply: RpcReply) -> HttpResponse {
    respond(req, state, reply)
}

fn respond(req: &HttpRequest, state: &AppState, reply: RpcReply) -> HttpResponse {
    respond_with(req, state, reply, None)
}

/// A JSON-RPC answer as its HTTP response: its status, `Retry-After` for overload answers,
/// `WWW-Authenticate` for a 401, and `Connection: close` where the connection is done.
fn json_response(
    status: u16,
    body: Vec<u8>,
    retry_after: Option<u64>,
    challenge: Option<String>,
    closes: bool,
) -> HttpResponse {
    let code =
        actix_web::http::StatusCode::from_u16(status).unwrap_or(actix_web::http::StatusCode::OK);
    let mut resp = HttpResponse::build(code);
    static JSON: header::HeaderValue = header::HeaderValue::from_static("application/json");
    resp.insert_header((header::CONTENT_TYPE, JSON.clone()));
    if closes {
        resp.force_close();
    }
    if let Some(secs) = retry_after {
        resp.insert_header((header::RETRY_AFTER, secs.to_string()));
    }
    if let Some(c) = challenge {
        resp.insert_header((header::WWW_AUTHENTICATE, c));
    }
    resp.body(body)
}

/// Renders a reply; a stream needs the slot taken for it before dispatch.
fn respond_with(
    req: &HttpRequest,
    state: &AppState,
    reply: RpcReply,
    slot: Option<StreamSlot>,
) -> HttpResponse {
    match (reply, slot) {
        (
            RpcReply::Json {
                status,
                body,
                retry_after,
                challenge,
                closes,
            },
            _,
        ) => json_response(status, body, retry_after, challenge, closes),
        (
            RpcReply::Stream {
                id,
                dialect,
                end,
                items,
                keepalive,
            },
            Some(slot),
        ) => {
            let keepalive = keepalive.unwrap_or_else(|| state.default_keepalive());
            event_stream(req, state, items, keepalive, slot, move |item| {
                render_stream_item(&id, dialect, end, item)
            })
        }
        // Only the gRPC binding asks for protobuf.
        (RpcReply::Protobuf(_), _) => respond(
            req,
            state,
            RpcReply::error(
                &RpcId::NULL,
                Dialect::V10,
                &GatewayError::Internal("a protobuf answer on JSON-RPC".into()),
            ),
        ),
        // Only streaming methods produce streams, and they always take a slot first.
        (RpcReply::Stream { id, dialect, .. }, None) => respond(
            req,
            state,
            RpcReply::error(
                &id,
                dialect,
                &GatewayError::Internal("stream without a slot".into()),
            ),
        ),
    }
}

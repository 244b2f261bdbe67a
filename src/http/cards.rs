use std::sync::Arc;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::caller::Caller;
use super::card_cache::{CardKey, Coding, Encoded, Rendered, Which};
use super::{error_response, version_header, Addressed, AppState, Live, LiveRef};
use crate::agents::Agent;
use crate::auth::{AccessKey, AuthError, Principal};
use crate::card;
use crate::config::Access;
use crate::error::GatewayError;
use crate::protocol::Dialect;

/// Cards need no credentials. Presented ones (if valid) show the caller which restricted
/// agents it may call; anonymous callers see only the agents open to them.
fn card_caller(caller: Caller) -> (Principal, LiveRef) {
    let principal = caller.principal.unwrap_or_else(|_| Principal::anonymous());
    (principal, caller.live)
}

/// Security shapes follow the caller's generation: `A2A-Version: 1.x` gets 1.0 shapes.
fn wants_v10(req: &HttpRequest) -> bool {
    version_header(req).is_some_and(|v| v.trim().starts_with('1'))
}

/// The gRPC binding's address as clients reach it: the host they reach the gateway at,
/// and the gRPC port (unless `[server] grpc_in_cards` leaves it out).
fn grpc_target(state: &AppState, live: &Live, base: &str) -> Option<String> {
    let port = state
        .grpc_port
        .filter(|_| live.config.server.grpc_in_cards)?;
    let url = url::Url::parse(base).ok()?;
    Some(format!("{}:{port}", url.host_str()?))
}

/// The aggregated card as `caller` sees it: the agents it may call, with their extended
/// skills in the `extended` form.
fn aggregated(
    state: &AppState,
    live: &Live,
    caller: &Principal,
    base: &str,
    v10: bool,
    extended: bool,
) -> Value {
    let required = live.auth.default_access() == Access::Authenticated;
    rendered_with(state, live, base, v10, required, |sec, offers| {
        let visible = live
            .registry
            .iter()
            .filter(|a| live.auth.authorize(caller, &a.def).is_ok());
        card::gateway_card(&live.config, visible, base, sec, offers, extended)
    })
}

/// What every card is rendered with: the credential schemes (in `v10`'s shapes, and
/// `required` or not) and what the gateway offers at `base`.
fn rendered_with<T>(
    state: &AppState,
    live: &Live,
    base: &str,
    v10: bool,
    required: bool,
    render: impl FnOnce(&card::Security, card::Offers<'_>) -> T,
) -> T {
    let schemes = live.auth.schemes();
    let sec = card::Security {
        schemes: &schemes,
        required,
        v10,
    };
    let grpc = grpc_target(state, live, base);
    let offers = card::Offers {
        push: state.service.push().enabled(),
        grpc: grpc.as_deref(),
    };
    render(&sec, offers)
}

/// The extended card a caller asks for, on any binding, rendered and signed: the agent's
/// (`addressed`), or on the shared endpoints the aggregated one. One whose card does not
/// offer it (no extended card, or no credential the gateway accepts) answers as the spec
/// has it in the caller's `dialect`; one that does goes only to an authenticated caller
/// the agent is open to. `base` is the gateway's URL as the caller reaches it.
pub(crate) fn extended(
    state: &AppState,
    live: &Live,
    caller: &Principal,
    addressed: &Addressed,
    base: &str,
    dialect: Dialect,
) -> Result<Arc<Rendered>, GatewayError> {
    let offered = !live.auth.schemes().is_empty()
        && match addressed {
            Addressed::Agent(agent) => card::has_extended(agent),
            Addressed::Shared => true,
            Addressed::Unknown(name) => return Err(live.unknown_agent(name)),
        };
    if !offered {
        return Err(card::no_extended_card(dialect));
    }
    if caller.anonymous {
        return Err(live.auth_error(AuthError::Missing));
    }
    let v10 = dialect == Dialect::V10;
    let rendered = match addressed {
        Addressed::Agent(agent) => {
            live.authorize(caller, agent)?;
            agent_card_rendered(state, live, agent, base, v10, true)
        }
        _ => gateway_card_rendered(state, live, caller, base, v10, true),
    };
    rendered.ok_or_else(|| card::no_extended_card(dialect))
}

/// The aggregated card for `caller`, rendered, signed and kept.
fn gateway_card_rendered(
    state: &AppState,
    live: &Live,
    caller: &Principal,
    base: &str,
    v10: bool,
    extended: bool,
) -> Option<Arc<Rendered>> {
    let key = CardKey {
        which: Which::Gateway,
        extended,
        access: caller.access_key(),
        base: base.to_string(),
        v10,
        registry: live.registry.id(),
        generation: live.registry.card_generation(),
    };
    let rendered = state.cards.get_or_render(&key, || {
        let card = aggregated(state, live, caller, base, v10, extended);
        serde_json::to_vec(&card::finish(card, v10, &state.card_signer))
    });
    log_unrendered(rendered)
}

/// `agent`'s card (its extended one, if it has one, when `extended`), rendered, signed
/// and kept: the same for every caller.
fn agent_card_rendered(
    state: &AppState,
    live: &Live,
    agent: &Arc<Agent>,
    base: &str,
    v10: bool,
    extended: bool,
) -> Option<Arc<Rendered>> {
    if extended && !card::has_extended(agent) {
        return None;
    }
    let key = CardKey {
        which: Which::Agent(agent.name.clone()),
        extended,
        access: AccessKey::All,
        base: base.to_string(),
        v10,
        registry: live.registry.id(),
        generation: live.registry.card_generation(),
    };
    // Everything is built in here: a card kept costs a request only the lookup.
    let rendered = state.cards.get_or_render(&key, || {
        let required = live.auth.access_of(&agent.def) == Access::Authenticated;
        let card = rendered_with(
            state,
            live,
            base,
            v10,
            required,
            |sec, offers| match extended {
                true => card::extended_agent_card(agent, base, sec, offers),
                false => Some(card::agent_card(agent, base, sec, offers)),
            },
        );
        serde_json::to_vec(&card::finish(
            card.unwrap_or_default(),
            v10,
            &state.card_signer,
        ))
    });
    log_unrendered(rendered)
}

fn log_unrendered(rendered: Result<Arc<Rendered>, serde_json::Error>) -> Option<Arc<Rendered>> {
    rendered
        .map_err(|e| tracing::error!(error = %e, "a card could not be serialized"))
        .ok()
}

pub(super) async fn gateway_card(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Caller,
) -> HttpResponse {
    let (caller, live) = card_caller(caller);
    let base = live.base_url(&req);
    match gateway_card_rendered(&state, &live, &caller, &base, wants_v10(&req), false) {
        Some(card) => card_response(&req, &live, &card, Coding::preferred(&req)),
        None => error_response(&GatewayError::Internal("serializing a card".into())),
    }
}

pub(super) async fn agent_card(
    req: HttpRequest,
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let live = state.live();
    let Some(agent) = live.registry.get(&name) else {
        return error_response(&live.unknown_agent(&name));
    };
    let base = live.base_url(&req);
    match agent_card_rendered(&state, &live, agent, &base, wants_v10(&req), false) {
        Some(card) => card_response(&req, &live, &card, Coding::preferred(&req)),
        None => error_response(&GatewayError::Internal("serializing a card".into())),
    }
}

pub(super) async fn list_agents(req: HttpRequest, caller: Caller) -> HttpResponse {
    let (caller, live) = card_caller(caller);
    let base = live.base_url(&req);
    let registry = &live.registry;
    let agents: Vec<Value> = registry
        .iter()
        .filter(|a| live.auth.authorize(&caller, &a.def).is_ok())
        .map(|a| {
            let path = card::agent_path(&a.def.name);
            // An upstream agent's file may leave these to its card.
            let from_card = |field: &str| {
                a.remote()
                    .and_then(|r| r.card())
                    .and_then(|c| c[field].as_str().map(str::to_string))
            };
            let description = match a.def.description.as_str() {
                "" => from_card("description").unwrap_or_default(),
                given => given.to_string(),
            };
            json!({
                "name": a.def.name,
                "description": description,
                "version": a.def.version.clone()
                    .or_else(|| from_card("version"))
                    .unwrap_or_else(|| "1.0.0".into()),
                "url": format!("{base}{path}"),
                "cardUrl": format!("{base}{path}/card"),
                "health": a.health(),
            })
        })
        .collect();
    HttpResponse::Ok().json(json!({
        "defaultAgent": registry.default_agent().map(|a| a.def.name.clone()),
        "agents": agents,
    }))
}

/// Serves a card in `coding` with a validator and a max-age, answering a matching
/// `If-None-Match` with 304.
fn card_response(req: &HttpRequest, live: &Live, card: &Rendered, coding: Coding) -> HttpResponse {
    let (Encoded { body, etag }, coding) = card.encoded(coding);
    let cache = format!("public, max-age={}", live.config.limits.card_max_age_secs);
    let headers = req.headers();
    // If-None-Match decides when it is sent; If-Modified-Since only without it (RFC 9110).
    let matches = match headers.get(header::IF_NONE_MATCH) {
        Some(tags) => tags.to_str().is_ok_and(|v| {
            v.split(',')
                .map(|t| t.trim().trim_start_matches("W/"))
                .any(|t| t == "*" || t == etag.as_str())
        }),
        None => headers
            .get(header::IF_MODIFIED_SINCE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<header::HttpDate>().ok())
            .is_some_and(|since| card.modified() <= std::time::SystemTime::from(since)),
    };
    let modified = header::HttpDate::from(card.modified()).to_string();
    let mut resp = if matches {
        HttpResponse::NotModified().finish()
    } else {
        let mut ok = HttpResponse::Ok();
        ok.content_type("application/json");
        if let Some(name) = coding.header_value() {
            ok.insert_header((header::CONTENT_ENCODING, name));
        }
        ok.body(body.clone())
    };
    let headers = resp.headers_mut();
    for (name, value) in [
        (header::ETAG, etag.as_str()),
        (header::LAST_MODIFIED, modified.as_str()),
        (header::CACHE_CONTROL, cache.as_str()),
        // Card URLs follow these headers unless a public URL is configured.
        (
            header::VARY,
            "Host, Forwarded, X-Forwarded-Host, X-Forwarded-Proto, A2A-Version, Authorization, X-API-Key, Accept-Encoding",
        ),
    ] {
        if let Ok(v) = header::HeaderValue::from_str(value) {
            headers.insert(name, v);
        }
    }
    resp
}

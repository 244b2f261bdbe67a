//! The A2A 1.0 HTTP+JSON binding, for every agent: `/a2a/agents/{name}/rest/...`, and
//! `/a2a/rest/...` for the shared endpoint (follow-ups reach the task's agent, the rest the
//! default agent). Mapped onto the same service calls as JSON-RPC; errors are
//! `google.rpc.Status` bodies with the A2A 1.0.1 HTTP statuses.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::body::{check_content_type, read_body};
use super::sse::event_stream;
use super::{error_response, version_header, AppState};
use crate::agents::Agent;
use crate::auth::Principal;
use crate::error::GatewayError;
use crate::limits::StreamSlot;
use crate::protocol::ops::ItemStream;
use crate::protocol::params::{self, ListTasksParams, SendParams};
use crate::protocol::Dialect;
use crate::routing;
use crate::rpc::send_request;

const MEDIA_TYPE: &str = "application/a2a+json";

/// Mounts the binding under `prefix` (which may hold `{name}`).
pub fn scope(prefix: &str) -> actix_web::Scope {
    web::scope(prefix)
        .route("/message:send", web::post().to(send))
        .route("/message:stream", web::post().to(stream))
        .route("/tasks", web::get().to(list))
        .route(
            "/tasks/{id}/pushNotificationConfigs",
            web::route().to(push_unsupported),
        )
        .route(
            "/tasks/{id}/pushNotificationConfigs/{config}",
            web::route().to(push_unsupported),
        )
        .route("/tasks/{task}", web::get().to(task_get_or_subscribe))
        .route("/tasks/{task}", web::post().to(task_action))
        .route("/extendedAgentCard", web::get().to(extended_card))
        .default_service(web::to(unknown_route))
}

fn ok_json<T: Serialize>(value: &T) -> HttpResponse {
    match serde_json::to_vec(value) {
        Ok(body) => HttpResponse::Ok().content_type(MEDIA_TYPE).body(body),
        Err(e) => error_response(&GatewayError::Internal(format!(
            "serializing a result: {e}"
        ))),
    }
}

fn reply<T: Serialize>(result: Result<T, GatewayError>) -> HttpResponse {
    match result {
        Ok(v) => ok_json(&v),
        Err(e) => error_response(&e),
    }
}

/// This binding is 1.0's; 0.3 served its REST routes elsewhere (`/v1/...`).
fn check_version(req: &HttpRequest) -> Result<(), GatewayError> {
    match Dialect::from_version_header(version_header(req).as_deref())? {
        None | Some(Dialect::V10) => Ok(()),
        Some(Dialect::V03) => Err(GatewayError::VersionNotSupported {
            requested: "0.3".into(),
            supported: "1.0 on the HTTP+JSON binding; 0.3 clients use JSON-RPC",
        }),
    }
}

/// The agent a request is for (named in the path, or chosen as on the shared endpoint),
/// once the caller is known to be allowed to call it.
fn agent_for(
    req: &HttpRequest,
    state: &AppState,
    caller: &Principal,
    task: Option<&str>,
) -> Result<Arc<Agent>, GatewayError> {
    let agent = match req.match_info().get("name") {
        Some(name) => state
            .registry
            .get(name)
            .cloned()
            .ok_or_else(|| state.missing_agent(caller, name))?,
        None => task
            .and_then(|t| routing::owner(&state.registry, state.service.tasks(), t))
            .or_else(|| state.registry.default_agent())
            .cloned()
            .ok_or_else(|| GatewayError::AgentNotFound {
                name: "(default)".into(),
                available: state.registry.names(),
            })?,
    };
    state.authorize(caller, &agent)?;
    state.admit(req, caller, &agent)?;
    Ok(agent)
}

/// The caller and the checked body of a send.
async fn send_params(
    req: &HttpRequest,
    body: web::Payload,
    state: &AppState,
) -> Result<(Principal, SendParams), GatewayError> {
    let caller = state.authenticate(req)?;
    check_version(req)?;
    check_content_type(req)?;
    let bytes = read_body(req, body, state.config.limits.max_body_bytes).await?;
    let raw: Box<RawValue> =
        serde_json::from_slice(&bytes).map_err(|e| GatewayError::Parse(e.to_string()))?;
    Ok((caller, params::decode(Some(&raw))?))
}

async fn send(req: HttpRequest, body: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    let result = async {
        let (caller, p) = send_params(&req, body, &state).await?;
        let agent = agent_for(&req, &state, &caller, p.message.task_id.as_deref())?;
        state
            .service
            .send(&agent, &caller, send_request(p, Dialect::V10)?)
            .await
    }
    .await;
    reply(result)
}

async fn stream(req: HttpRequest, body: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    let result = async {
        let (caller, p) = send_params(&req, body, &state).await?;
        let agent = agent_for(&req, &state, &caller, p.message.task_id.as_deref())?;
        let slot = state.open_stream(&req, &caller)?;
        let items = state
            .service
            .stream(&agent, &caller, send_request(p, Dialect::V10)?)
            .await?;
        Ok::<_, GatewayError>((agent, items, slot))
    }
    .await;
    match result {
        Ok((agent, items, slot)) => sse(&req, &state, &agent, items, slot),
        Err(e) => error_response(&e),
    }
}

fn sse(
    req: &HttpRequest,
    state: &AppState,
    agent: &Agent,
    items: ItemStream,
    slot: StreamSlot,
) -> HttpResponse {
    let keepalive = agent
        .remote()
        .and_then(|r| r.stream_keepalive())
        .unwrap_or_else(|| state.default_keepalive());
    // REST events are the StreamResponse itself, without a JSON-RPC envelope.
    event_stream(req, items, keepalive, slot, |item| match item {
        Ok(item) => match serde_json::to_vec(item) {
            Ok(body) => (false, body),
            Err(e) => (
                true,
                GatewayError::Internal(e.to_string())
                    .rest_body()
                    .to_string()
                    .into_bytes(),
            ),
        },
        Err(e) => (true, e.rest_body().to_string().into_bytes()),
    })
}

#[derive(Deserialize)]
struct HistoryQuery {
    #[serde(default, rename = "historyLength", alias = "history_length")]
    history_length: Option<i64>,
}

fn query<T: serde::de::DeserializeOwned>(req: &HttpRequest) -> Result<T, GatewayError> {
    serde_urlencoded::from_str(req.query_string())
        .map_err(|e| GatewayError::InvalidParams(format!("query: {e}")))
}

/// `GET /tasks/{id}` and `GET /tasks/{id}:subscribe`.
async fn task_get_or_subscribe(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let target = req.match_info().get("task").unwrap_or_default().to_string();
    match target.rsplit_once(':') {
        Some((id, "subscribe")) => subscribe(&req, &state, id).await,
        Some((_, "cancel")) => {
            error_response(&GatewayError::InvalidRequest("cancel is a POST".into()))
        }
        _ => {
            let result = async {
                let caller = state.authenticate(&req)?;
                check_version(&req)?;
                let q: HistoryQuery = query(&req)?;
                let history = params::history_length(q.history_length, Dialect::V10)?;
                let agent = agent_for(&req, &state, &caller, Some(&target))?;
                state.service.get(&agent, &caller, &target, history).await
            }
            .await;
            reply(result)
        }
    }
}

/// `POST /tasks/{id}:cancel` and `POST /tasks/{id}:subscribe` (the spec table says POST,
/// the proto GET; both are served).
async fn task_action(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let target = req.match_info().get("task").unwrap_or_default().to_string();
    match target.rsplit_once(':') {
        Some((id, "cancel")) => {
            let result = async {
                let caller = state.authenticate(&req)?;
                check_version(&req)?;
                let agent = agent_for(&req, &state, &caller, Some(id))?;
                state.service.cancel(&agent, &caller, id).await
            }
            .await;
            reply(result)
        }
        Some((id, "subscribe")) => subscribe(&req, &state, id).await,
        _ => error_response(&GatewayError::MethodNotFound(format!(
            "POST {}",
            req.path()
        ))),
    }
}

async fn subscribe(req: &HttpRequest, state: &AppState, id: &str) -> HttpResponse {
    let result = async {
        let caller = state.authenticate(req)?;
        check_version(req)?;
        let agent = agent_for(req, state, &caller, Some(id))?;
        let slot = state.open_stream(req, &caller)?;
        let items = state.service.subscribe(&agent, &caller, id).await?;
        Ok::<_, GatewayError>((agent, items, slot))
    }
    .await;
    match result {
        Ok((agent, items, slot)) => sse(req, state, &agent, items, slot),
        Err(e) => error_response(&e),
    }
}

async fn list(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let result = async {
        let caller = state.authenticate(&req)?;
        check_version(&req)?;
        let p: ListTasksParams = query(&req)?;
        let agent = agent_for(&req, &state, &caller, None)?;
        state.service.list(&agent, &caller, &p.check()?).await
    }
    .await;
    reply(result)
}

async fn push_unsupported() -> HttpResponse {
    error_response(&GatewayError::PushNotSupported)
}

async fn extended_card() -> HttpResponse {
    error_response(&GatewayError::UnsupportedOperation(
        "this agent does not offer an extended agent card".into(),
    ))
}

async fn unknown_route(req: HttpRequest) -> HttpResponse {
    error_response(&GatewayError::MethodNotFound(format!(
        "{} {}",
        req.method(),
        req.path()
    )))
}

//! The A2A 1.0 HTTP+JSON binding, for every agent: `/a2a/agents/{name}/rest/...`, and
//! `/a2a/rest/...` for the shared endpoint (routed as `/a2a` is: sends by the full
//! routing order, task routes to the task's agent, the task list to the default agent). Mapped onto the same service calls as JSON-RPC; errors are
//! `google.rpc.Status` bodies with the A2A 1.0.1 HTTP statuses.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::admission::{self, Admitted, Refused, Target};
use super::body::{check_bodiless_post, check_content_type, read_body, Payer};
use super::caller::Caller;
use super::sse::event_stream;
use super::{error_response, served_headers, version_header, Addressed, AppState, Live};
use crate::agents::Agent;
use crate::auth::Principal;
use crate::error::GatewayError;
use crate::limits::StreamSlot;
use crate::protocol::jsonrpc::Method;
use crate::protocol::ops::{ItemStream, SendRequest};
use crate::protocol::params::{self, ListTasksParams, SendParams};
use crate::protocol::push::{read_call, PushOp};
use crate::protocol::Dialect;
use crate::routing::{Served, Stampable};
use crate::rpc::send_request;
use crate::telemetry;

const MEDIA_TYPE: &str = "application/a2a+json";

/// Mounts the binding under `prefix` (which may hold `{name}`).
pub(super) fn scope(prefix: &str) -> actix_web::Scope {
    web::scope(prefix)
        .route("/message:send", web::post().to(send))
        .route("/message:stream", web::post().to(stream))
        .route("/tasks", web::get().to(list))
        .route(
            "/tasks/{task}/pushNotificationConfigs",
            web::route().to(push_configs),
        )
        .route(
            "/tasks/{task}/pushNotificationConfigs/{config}",
            web::route().to(push_configs),
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

/// The answer of an agent: its result or error, saying which agent it was.
/// Renders an answer with the gateway's note stamped in, or its error.
fn reply<T: Serialize + Stampable>(
    served: &Served,
    result: Result<T, GatewayError>,
) -> HttpResponse {
    let mut resp = match result {
        Ok(v) => ok_json(&served.stamped(v)),
        Err(e) => error_response(&e),
    };
    served_headers(&mut resp, served);
    resp
}

/// This binding is 1.0's; 0.3 served its REST routes elsewhere (`/v1/...`).
fn check_version(req: &HttpRequest) -> Result<(), GatewayError> {
    admission::v10_only(
        version_header(req).as_deref(),
        "1.0 on the HTTP+JSON binding; 0.3 clients use JSON-RPC",
    )
}

/// The agent a request is for (named in the path, or routed on the shared routes), once
/// admission lets it through; a refusal is rendered here, naming the agent past
/// authorization as every answer does.
async fn admitted(
    req: &HttpRequest,
    state: &AppState,
    live: &Live,
    caller: &Principal,
    addressed: Addressed,
    target: Target<'_>,
    streams: bool,
) -> Result<Admitted, HttpResponse> {
    admission::admit(state, req, live, caller, addressed, target, streams)
        .await
        .map_err(refusal)
}

/// A refusal's answer, naming the agent past authorization as every answer does.
fn refusal(Refused { error, served }: Refused) -> HttpResponse {
    let mut resp = error_response(&error);
    if let Some(served) = &served {
        served_headers(&mut resp, served);
    }
    resp
}

/// A send, admitted: who asks, the agent that answers, and the request (or what is wrong
/// with it, which goes out as that agent's answer).
struct RoutedSend {
    caller: Principal,
    admitted: Admitted,
    send: Result<SendRequest, GatewayError>,
}

async fn routed_send(
    req: &HttpRequest,
    body: web::Payload,
    state: &AppState,
    caller: Caller,
    streams: bool,
) -> Result<RoutedSend, HttpResponse> {
    let live = caller.live;
    let addressed = Addressed::of(&live.registry, req.match_info().get("name"));
    let door = || {
        let caller = admission::at_the_door(&live, caller.principal, &addressed)?;
        check_version(req)?;
        check_content_type(req)?;
        Ok::<_, GatewayError>(caller)
    };
    let caller = door().map_err(|e| error_response(&e))?;
    let policies_checked =
        admission::policies_before_body(req, &live, &caller, &addressed, streams)
            .map_err(refusal)?;
    let read = async {
        let hash = |h: &ahash::RandomState| live.caller_hash(req, Some(&caller), h);
        let payer = Payer {
            hash: &hash,
            anonymous: caller.anonymous,
        };
        let bytes = read_body(req, body, &state.bodies, &payer).await?;
        let raw: Box<RawValue> =
            serde_json::from_slice(&bytes).map_err(|e| GatewayError::Parse(e.to_string()))?;
        let params: SendParams = params::decode(Some(&raw))?;
        Ok::<_, GatewayError>((raw, params))
    };
    let (raw, params) = read.await.map_err(|e| error_response(&e))?;
    let target = Target::Send {
        params: &raw,
        policies_checked,
    };
    let admitted = admitted(req, state, &live, &caller, addressed, target, streams).await?;
    Ok(RoutedSend {
        caller,
        admitted,
        send: send_request(params, Dialect::V10),
    })
}

async fn send(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
    caller: Caller,
) -> HttpResponse {
    note_method("SendMessage");
    let routed = match routed_send(&req, body, &state, caller, false).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let Admitted { agent, served, .. } = &routed.admitted;
    let result = match routed.send {
        Ok(send) => state.service.send(agent, &routed.caller, send).await,
        Err(e) => Err(e),
    };
    reply(served, result)
}

async fn stream(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
    caller: Caller,
) -> HttpResponse {
    note_method("SendStreamingMessage");
    let routed = match routed_send(&req, body, &state, caller, true).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let Admitted {
        agent,
        served,
        slot,
    } = routed.admitted;
    let opened = async {
        // The same request again after a dropped stream picks that stream up.
        let items = match super::resume_from(&req)? {
            Some(from) => state.service.resume(&agent, &routed.caller, &from).await?,
            None => {
                let send = routed.send?;
                state.service.stream(&agent, &routed.caller, send).await?
            }
        };
        Ok::<_, GatewayError>((items, slot))
    }
    .await;
    sse(&req, &state, &agent, &served, opened)
}

/// An event stream, or the error that prevented it.
fn sse(
    req: &HttpRequest,
    state: &AppState,
    agent: &Agent,
    served: &Served,
    opened: Result<(ItemStream, Option<StreamSlot>), GatewayError>,
) -> HttpResponse {
    let (items, slot) = match opened {
        Ok((items, Some(slot))) => (items, slot),
        Ok((_, None)) => {
            let e = GatewayError::Internal("stream without a slot".into());
            return reply::<()>(served, Err(e));
        }
        Err(e) => return reply::<()>(served, Err(e)),
    };
    let keepalive = agent
        .remote()
        .and_then(|r| r.stream_keepalive())
        .unwrap_or_else(|| state.default_keepalive());
    // REST events are the StreamResponse itself, without a JSON-RPC envelope.
    let items = served.clone().stamp_stream(items);
    let mut resp = event_stream(req, state, items, keepalive, slot, |item| match item {
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
    });
    served_headers(&mut resp, served);
    resp
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

/// The caller and the admitted call of a request that has no body.
async fn caller_and_agent(
    req: &HttpRequest,
    state: &AppState,
    caller: Caller,
    target: Target<'_>,
    streams: bool,
) -> Result<(Principal, Admitted), HttpResponse> {
    let live = caller.live;
    let addressed = Addressed::of(&live.registry, req.match_info().get("name"));
    let principal = admission::at_the_door(&live, caller.principal, &addressed)
        .and_then(|p| check_version(req).map(|()| p))
        .and_then(|p| match *req.method() == actix_web::http::Method::POST {
            true => check_bodiless_post(req).map(|()| p),
            false => Ok(p),
        })
        .map_err(|e| error_response(&e))?;
    if let Target::Task(id) = target {
        telemetry::note_task(id, None);
    }
    let admitted = admitted(req, state, &live, &principal, addressed, target, streams).await?;
    Ok((principal, admitted))
}

/// What the access log and metrics call this request.
fn note_method(method: &'static str) {
    telemetry::note_method(method, Dialect::V10.version(), "rest");
}

/// `GET /tasks/{id}` and `GET /tasks/{id}:subscribe`.
async fn task_get_or_subscribe(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Caller,
) -> HttpResponse {
    let target = req.match_info().get("task").unwrap_or_default().to_string();
    match target.rsplit_once(':') {
        Some((id, "subscribe")) => subscribe(&req, &state, caller, id).await,
        Some((_, "cancel")) => {
            error_response(&GatewayError::InvalidRequest("cancel is a POST".into()))
        }
        _ => {
            note_method("GetTask");
            let (caller, Admitted { agent, served, .. }) =
                match caller_and_agent(&req, &state, caller, Target::Task(&target), false).await {
                    Ok(r) => r,
                    Err(resp) => return resp,
                };
            let result = async {
                let q: HistoryQuery = query(&req)?;
                let history = params::history_length(q.history_length, Dialect::V10)?;
                state.service.get(&agent, &caller, &target, history).await
            }
            .await;
            reply(&served, result)
        }
    }
}

/// `POST /tasks/{id}:cancel` and `POST /tasks/{id}:subscribe` (the spec table says POST,
/// the proto GET; both are served).
async fn task_action(req: HttpRequest, state: web::Data<AppState>, caller: Caller) -> HttpResponse {
    let target = req.match_info().get("task").unwrap_or_default().to_string();
    match target.rsplit_once(':') {
        Some((id, "cancel")) => {
            note_method("CancelTask");
            let (caller, Admitted { agent, served, .. }) =
                match caller_and_agent(&req, &state, caller, Target::Task(id), false).await {
                    Ok(r) => r,
                    Err(resp) => return resp,
                };
            let result = state.service.cancel(&agent, &caller, id).await;
            reply(&served, result)
        }
        Some((id, "subscribe")) => subscribe(&req, &state, caller, id).await,
        _ => error_response(&GatewayError::MethodNotFound(format!(
            "POST {}",
            req.path()
        ))),
    }
}

async fn subscribe(req: &HttpRequest, state: &AppState, caller: Caller, id: &str) -> HttpResponse {
    note_method("SubscribeToTask");
    let (
        caller,
        Admitted {
            agent,
            served,
            slot,
        },
    ) = match caller_and_agent(req, state, caller, Target::Task(id), true).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let opened = async {
        let from = super::resume_from(req)?;
        let items = (state.service)
            .subscribe_from(&agent, &caller, id, from.as_ref())
            .await?;
        Ok::<_, GatewayError>((items, slot))
    }
    .await;
    sse(req, state, &agent, &served, opened)
}

async fn list(req: HttpRequest, state: web::Data<AppState>, caller: Caller) -> HttpResponse {
    note_method("ListTasks");
    let (caller, Admitted { agent, served, .. }) =
        match caller_and_agent(&req, &state, caller, Target::TaskList, false).await {
            Ok(r) => r,
            Err(resp) => return resp,
        };
    let result = async {
        let p: ListTasksParams = query(&req)?;
        state.service.list(&agent, &caller, &p.check()?).await
    }
    .await;
    reply(&served, result)
}

/// `POST` (create) and `GET` (list) on `/tasks/{task}/pushNotificationConfigs`; `GET` and
/// `DELETE` on `.../{config}`.
async fn push_configs(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
    caller: Caller,
) -> HttpResponse {
    use actix_web::http::Method as Http;
    let task = req.match_info().get("task").unwrap_or_default().to_string();
    let config = req.match_info().get("config").map(str::to_string);
    let op = match (req.method(), &config) {
        (&Http::POST, None) => PushOp::Set,
        (&Http::GET, None) => PushOp::List,
        (&Http::GET, Some(_)) => PushOp::Get,
        (&Http::DELETE, Some(_)) => PushOp::Delete,
        (method, _) => {
            return error_response(&GatewayError::MethodNotFound(format!(
                "{method} {}",
                req.path()
            )))
        }
    };
    note_method(Method::Push(op).name());
    let (caller, Admitted { agent, served, .. }) =
        match caller_and_agent(&req, &state, caller, Target::Task(&task), false).await {
            Ok(r) => r,
            Err(resp) => return resp,
        };
    let result = async {
        state.service.push().check_enabled()?;
        // The path and query say what JSON-RPC params would; one reader checks both.
        let mut params = match op {
            PushOp::Set => {
                check_content_type(&req)?;
                let hash =
                    |h: &ahash::RandomState| state.live().caller_hash(&req, Some(&caller), h);
                let payer = Payer {
                    hash: &hash,
                    anonymous: caller.anonymous,
                };
                let bytes = read_body(&req, body, &state.bodies, &payer).await?;
                match serde_json::from_slice(&bytes) {
                    Ok(serde_json::Value::Object(m)) => m,
                    Ok(_) => {
                        return Err(GatewayError::InvalidParams(
                            "the body must be a TaskPushNotificationConfig object".into(),
                        ))
                    }
                    Err(e) => return Err(GatewayError::Parse(e.to_string())),
                }
            }
            _ => query::<serde_json::Map<String, serde_json::Value>>(&req)?,
        };
        params.insert("taskId".into(), task.clone().into());
        if let Some(id) = &config {
            params.insert("id".into(), id.clone().into());
        }
        if let Some(size) = params.get("pageSize").and_then(|v| v.as_str()) {
            let size = size.parse::<i64>().map_err(|_| {
                GatewayError::InvalidParams("query: pageSize must be a number".into())
            })?;
            params.insert("pageSize".into(), size.into());
        }
        let raw = serde_json::value::to_raw_value(&params)
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        let call = read_call(op, Dialect::V10, Some(&raw))?;
        let answer = state
            .service
            .push_call(&agent, &caller, op, call, None)
            .await?;
        Ok(match crate::rpc::push_answer(answer, Dialect::V10, &task) {
            // REST's delete answers an empty object.
            serde_json::Value::Null => serde_json::json!({}),
            v => v,
        })
    }
    .await;
    let mut resp = match result {
        Ok(v) => ok_json(&v),
        Err(e) => error_response(&e),
    };
    served_headers(&mut resp, &served);
    resp
}

async fn extended_card(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Caller,
) -> HttpResponse {
    note_method(Method::GetExtendedAgentCard.name());
    let live = caller.live;
    let addressed = Addressed::of(&live.registry, req.match_info().get("name"));
    let card = check_version(&req).and_then(|()| {
        let base = live.base_url(&req);
        super::extended_card(
            &state,
            &live,
            &caller.principal?,
            &addressed,
            &base,
            Dialect::V10,
        )
    });
    match card {
        Ok(card) => HttpResponse::Ok()
            .content_type(MEDIA_TYPE)
            .body(card.json().clone()),
        Err(e) => error_response(&e),
    }
}

async fn unknown_route(req: HttpRequest) -> HttpResponse {
    error_response(&GatewayError::MethodNotFound(format!(
        "{} {}",
        req.method(),
        req.path()
    )))
}

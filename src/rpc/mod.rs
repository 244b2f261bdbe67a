//! JSON-RPC dispatch: a parsed request in, a rendered answer (a body or an event stream)
//! out, always in the caller's dialect. No HTTP here.

mod v01;

use std::future::Future;
use std::sync::Arc;

use futures_util::FutureExt;

use crate::agents::Agent;
use crate::auth::Principal;
use crate::error::GatewayError;
use crate::protocol::jsonrpc::{render_error, render_result, Method, RpcId, RpcRequest};
use crate::protocol::model::{Stamped, StreamEnd, StreamItem, Task};
use crate::protocol::ops::SendResult;
use crate::protocol::ops::{ItemStream, SendRequest};
use crate::protocol::params::{self, ListTasksParams, SendParams, TaskIdParams};
use crate::protocol::v03::{StreamItemV03, V03};
use crate::protocol::Dialect;
use crate::protocol::{grpc_send, write};
use crate::routing::Served;
use crate::service::push::PushAnswer;
use crate::service::{A2aService, Sent, WrittenAnswer};

pub(crate) enum RpcReply {
    /// A JSON-RPC response body, the HTTP status to send it with, and for overload
    /// answers how many seconds to wait before retrying.
    Json {
        status: u16,
        body: Vec<u8>,
        retry_after: Option<u64>,
        /// `WWW-Authenticate`, for a 401.
        challenge: Option<String>,
        /// The connection cannot be used again (a body that never came in full; a drain).
        closes: bool,
    },
    /// A task answer in the gRPC binding's protobuf (a send's `SendMessageResponse`, or
    /// `GetTask`'s and `CancelTask`'s `Task`), for a request that asked for it
    /// (`protobuf_answer`); every other answer is JSON.
    Protobuf(Vec<u8>),
    /// An SSE stream; each item is rendered with [`render_stream_item`].
    Stream {
        id: RpcId,
        dialect: Dialect,
        /// Where the stream ends, which 0.3 and 0.1 events say with `final`.
        end: StreamEnd,
        items: ItemStream,
        /// The agent's own keep-alive period, if it sets one.
        keepalive: Option<std::time::Duration>,
    },
}

impl RpcReply {
    pub(crate) fn error(id: &RpcId, dialect: Dialect, error: &GatewayError) -> RpcReply {
        if let GatewayError::Internal(detail) = error {
            tracing::error!(%detail, "internal error");
        }
        crate::telemetry::note(|c| c.error = Some((error.code(), error.reason())));
        RpcReply::Json {
            status: error.jsonrpc_http_status(),
            body: render_error(id, dialect, error),
            retry_after: error.retry_after(),
            challenge: error.challenge().map(str::to_string),
            closes: error.closes_connection(),
        }
    }
}

/// Runs `req` on `agent`; results and stream events carry `served` in their metadata.
/// `run`'s future, mapped rather than awaited in one more async level: each level copies
/// the whole future below it (about 1.1 KB) when it starts.
pub(crate) fn dispatch<'a>(
    service: &'a A2aService,
    agent: &'a Arc<Agent>,
    caller: &'a Principal,
    req: RpcRequest<'a>,
    served: &'a Served,
) -> impl Future<Output = RpcReply> + 'a {
    run(service, agent, caller, req, served)
        .map(|(id, dialect, outcome)| outcome.unwrap_or_else(|e| RpcReply::error(&id, dialect, &e)))
}

/// [`dispatch`], with the error not yet rendered: for bindings that render errors their
/// own way (gRPC's statuses). With the request's id and dialect, to render either with.
pub(crate) async fn run(
    service: &A2aService,
    agent: &Arc<Agent>,
    caller: &Principal,
    req: RpcRequest<'_>,
    served: &Served,
) -> (RpcId, Dialect, Result<RpcReply, GatewayError>) {
    let RpcRequest {
        id,
        method,
        dialect,
        params,
        send: decoded,
        resume,
        protobuf_answer,
    } = req;
    let send_params = || decoded.map_or_else(|| params::decode(params), |p| Ok(*p));
    let outcome: Result<RpcReply, GatewayError> = async {
        // The 0.1 paths are boxed: their futures would make every call's larger.
        if dialect == Dialect::V01 {
            return Box::pin(v01::dispatch(
                service, agent, caller, &id, method, params, served,
            ))
            .await;
        }
        if legacy_task_method(dialect, method) {
            if let Some((p, task_id)) =
                Box::pin(legacy_task(service, agent, caller, params)).await?
            {
                let call = v01::task_call(service, agent, caller, &id, method, p, &task_id, served);
                return Box::pin(call).await;
            }
        }
        match method {
            Method::SendMessage => {
                let send = send_request(send_params()?, dialect)?;
                let stamp = served.metadata_stamp();
                // Atomic only because the writer must be Sync; it runs on this thread.
                let wrote_protobuf = std::sync::atomic::AtomicBool::new(false);
                let write = |task: &Task| {
                    note_task(&task.id, &task.context_id);
                    crate::telemetry::note_task_state(task.status.state.v03_name());
                    let answer = |body| WrittenAnswer {
                        body,
                        task_fields: None,
                    };
                    if protobuf_answer {
                        if let Some(bytes) = grpc_send::task_answer(task, stamp) {
                            wrote_protobuf.store(true, std::sync::atomic::Ordering::Relaxed);
                            return Ok(answer(bytes));
                        }
                    }
                    match dialect {
                        Dialect::V10 => write::task_answer_marked(&id, task, stamp)
                            .map(|(body, task_fields)| WrittenAnswer { body, task_fields })
                            .map_err(|e| {
                                GatewayError::Internal(format!("serializing result: {e}"))
                            }),
                        Dialect::V03 | Dialect::V01 => {
                            render_result(&id, V03(&Stamped { value: task, stamp })).map(answer)
                        }
                    }
                };
                match service
                    .send_writing(agent, caller, send, Some(&write))
                    .await?
                {
                    Sent::Written(body)
                        if wrote_protobuf.load(std::sync::atomic::Ordering::Relaxed) =>
                    {
                        Ok(RpcReply::Protobuf(body))
                    }
                    Sent::Written(body) => Ok(json(body)),
                    Sent::Result(result) => {
                        note_result(&result);
                        ok(&id, dialect, served, result)
                    }
                }
            }
            Method::SendStreamingMessage => {
                // The same stream request again, after a dropped stream: its task's stream
                // picks up where the client left it, and the message is not sent again.
                let items = match &resume {
                    Some(from) => service.resume(agent, caller, from).await?,
                    None => {
                        let send = send_request(send_params()?, dialect)?;
                        service.stream(agent, caller, send).await?
                    }
                };
                Ok(stream(
                    &id,
                    dialect,
                    StreamEnd::Interrupted,
                    agent,
                    served,
                    items,
                ))
            }
            Method::GetTask => {
                let p: TaskIdParams = params::decode(params)?;
                crate::telemetry::note_task(&p.id, None);
                let history = params::history_length(p.history_length, dialect)?;
                let task = service.get(agent, caller, &p.id, history).await?;
                ok_task(&id, dialect, served, task, protobuf_answer)
            }
            Method::ListTasks => {
                let p: ListTasksParams = params::decode(params)?;
                let result = service.list(agent, caller, &p.check()?).await?;
                Ok(json(render_result(&id, served.stamped(result))?))
            }
            Method::CancelTask => {
                let p: TaskIdParams = params::decode(params)?;
                crate::telemetry::note_task(&p.id, None);
                let task = service.cancel(agent, caller, &p.id).await?;
                ok_task(&id, dialect, served, task, protobuf_answer)
            }
            Method::SubscribeToTask => {
                let p: TaskIdParams = params::decode(params)?;
                crate::telemetry::note_task(&p.id, None);
                let items = (service)
                    .subscribe_from(agent, caller, &p.id, resume.as_ref())
                    .await?;
                Ok(stream(
                    &id,
                    dialect,
                    StreamEnd::Terminal,
                    agent,
                    served,
                    items,
                ))
            }
            Method::Push(op) => {
                service.push().check_enabled()?;
                let call = crate::protocol::push::read_call(op, dialect, params)?;
                crate::telemetry::note_task(&call.task_id, None);
                let task_id = call.task_id.clone();
                // Boxed, so that the other methods' futures do not grow to its size.
                let answer = Box::pin(service.push_call(agent, caller, op, call, None)).await?;
                Ok(json(render_result(
                    &id,
                    push_answer(answer, dialect, &task_id),
                )?))
            }
            // Cards are the bindings' to render (their URLs are the caller's view of the
            // gateway): each answers this call before dispatch (http::cards::extended).
            Method::GetExtendedAgentCard => Err(crate::card::no_extended_card(dialect)),
        }
    }
    .await;
    (id, dialect, outcome)
}

pub(crate) fn send_request(p: SendParams, dialect: Dialect) -> Result<SendRequest, GatewayError> {
    let config = p.configuration.unwrap_or_default();
    let mut message = p.message;
    if message.context_id.is_none() {
        message.context_id = p.session_id;
    }
    Ok(SendRequest {
        blocking: config.blocking(),
        accepted_output_modes: config.accepted_output_modes.clone(),
        metadata: p.metadata,
        history_length: params::history_length(config.history_length, dialect)?,
        push: match config.push_notification_config.as_ref() {
            Some(v) if !v.is_null() => {
                Some(Box::new(crate::protocol::push::read_inline(v, dialect)?))
            }
            _ => None,
        },
        message,
        reply_dialect: dialect,
        on_new_task: None,
    })
}

/// A task call with a 0.3 name (0.1 clients read their tasks with the names 0.3 kept) for a
/// task a 0.1 client named: its params and the gateway's task. Other calls: None.
async fn legacy_task(
    service: &A2aService,
    agent: &Agent,
    caller: &Principal,
    params: Option<&serde_json::value::RawValue>,
) -> Result<Option<(TaskIdParams, String)>, GatewayError> {
    let p: TaskIdParams = params::decode(params)?;
    let names = service.legacy_names();
    names.fetch(agent, caller, &p.id).await?;
    Ok(names.get(agent, caller, &p.id).map(|task_id| (p, task_id)))
}

/// Whether a call may be a task call of a 0.1 client (see [`legacy_task`]).
fn legacy_task_method(dialect: Dialect, method: Method) -> bool {
    dialect == Dialect::V03
        && matches!(
            method,
            Method::GetTask | Method::CancelTask | Method::SubscribeToTask
        )
}

/// A push call's answer in `dialect`'s shape.
pub(crate) fn push_answer(
    answer: PushAnswer,
    dialect: Dialect,
    task_id: &str,
) -> serde_json::Value {
    match answer {
        PushAnswer::Config(c) => c.render(dialect, task_id),
        PushAnswer::Configs(configs, next) => {
            let rendered: Vec<_> = configs.iter().map(|c| c.render(dialect, task_id)).collect();
            match dialect {
                Dialect::V10 => serde_json::json!({"configs": rendered, "nextPageToken": next}),
                // 0.3's list is a bare array.
                Dialect::V03 | Dialect::V01 => serde_json::Value::Array(rendered),
            }
        }
        PushAnswer::Deleted => serde_json::Value::Null,
    }
}

pub(crate) fn json(body: Vec<u8>) -> RpcReply {
    RpcReply::Json {
        status: 200,
        body,
        retry_after: None,
        challenge: None,
        closes: false,
    }
}

// The renderers below are where the gateway's note goes into an answer (`Served`): the
// dispatchers hand them what the service returned, unstamped.

fn ok(
    id: &RpcId,
    dialect: Dialect,
    served: &Served,
    result: SendResult,
) -> Result<RpcReply, GatewayError> {
    let result = served.stamped(result);
    if let (SendResult::Relayed(r), Dialect::V10 | Dialect::V03) = (&result, dialect) {
        // The upstream's bytes, copied with the gateway's few changes made.
        return r
            .answer(id, dialect)
            .map(json)
            .map_err(|e| GatewayError::Internal(format!("serializing result: {e}")));
    }
    Ok(json(match dialect {
        Dialect::V10 => render_result(id, &result)?,
        Dialect::V03 => render_result(id, V03(&result))?,
        Dialect::V01 => return v01::ok(id, &result, None),
    }))
}

fn ok_task(
    id: &RpcId,
    dialect: Dialect,
    served: &Served,
    task: Task,
    protobuf_answer: bool,
) -> Result<RpcReply, GatewayError> {
    let task = served.stamped(task);
    if protobuf_answer {
        if let Some(bytes) = grpc_send::task(&task) {
            return Ok(RpcReply::Protobuf(bytes));
        }
    }
    Ok(json(match dialect {
        Dialect::V10 => render_result(id, &task)?,
        Dialect::V03 => render_result(id, V03(&task))?,
        Dialect::V01 => v01::render_task(id, &task, None)?,
    }))
}

/// A stream of `items`, each with the gateway's note, ending after the item `end` closes.
pub(crate) fn stream(
    id: &RpcId,
    dialect: Dialect,
    end: StreamEnd,
    agent: &Agent,
    served: &Served,
    items: ItemStream,
) -> RpcReply {
    RpcReply::Stream {
        id: id.clone(),
        dialect,
        end,
        items: served.clone().stamp_stream(items),
        keepalive: agent.remote().and_then(|r| r.stream_keepalive()),
    }
}

/// One SSE `data:` payload: a JSON-RPC response whose result is the item in the caller's
/// dialect; `true` with a JSON-RPC error body when it must go out as `event: error`.
pub(crate) fn render_stream_item(
    id: &RpcId,
    dialect: Dialect,
    end: StreamEnd,
    item: &Result<StreamItem, GatewayError>,
) -> (bool, Vec<u8>) {
    let rendered = item
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|item| match dialect {
            Dialect::V10 => render_result(id, item),
            Dialect::V03 => render_result(id, StreamItemV03(item, end)),
            Dialect::V01 => render_result(id, crate::protocol::v01::EventV01(item, end)),
        });
    match rendered {
        Ok(body) => (false, body),
        // 0.1 clients read only `data:` blocks; they find the error in the body.
        Err(e) => (dialect != Dialect::V01, render_error(id, dialect, &e)),
    }
}

/// The task a send created or continued, for the access log.
fn note_task(task_id: &str, context_id: &str) {
    crate::telemetry::note_task(task_id, Some(context_id));
}

fn note_result(result: &SendResult) {
    match result {
        SendResult::Task(t) => {
            note_task(&t.id, &t.context_id);
            crate::telemetry::note_task_state(t.status.state.v03_name());
        }
        SendResult::Message(m) => {
            if let Some(task) = &m.task_id {
                crate::telemetry::note_task(task, m.context_id.as_deref());
            }
        }
        SendResult::Relayed(_) => {}
    }
}

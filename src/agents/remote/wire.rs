//! What goes over the wire to an upstream agent, in its dialect, and how its answers are
//! read back into the canonical model. Reading is lenient about the dialect: a peer that
//! answers in the other generation's shape is still understood.

use crate::protocol::ops::SendResult;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::error::GatewayError;
use crate::protocol::model::{
    Message, Metadata, StreamItem, Task, TaskArtifactUpdateEvent, TaskState, TaskStatusUpdateEvent,
};
use crate::protocol::ops::SendRequest;
use crate::protocol::params::ListQuery;
use crate::protocol::relay::Relayed;
use crate::protocol::v03::V03;
use crate::protocol::Dialect;

#[derive(Serialize)]
pub(super) struct Envelope<'a, P: Serialize> {
    pub(crate) jsonrpc: &'static str,
    pub(crate) id: u64,
    pub(crate) method: &'a str,
    pub(crate) params: P,
}

/// The 1.0 configuration as serde writes it: the reference the direct writer is held to.
#[cfg(test)]
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConfigV10<'a> {
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    accepted_output_modes: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    history_length: Option<usize>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    return_immediately: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConfigV03<'a> {
    accepted_output_modes: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    history_length: Option<usize>,
    blocking: bool,
}

#[derive(Serialize)]
struct SendParamsOut<'a, M: Serialize, C: Serialize> {
    message: M,
    configuration: C,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a Metadata>,
}

/// `historyLength` as the upstream reads it: 0.3 peers take 0 as "everything", so only a
/// positive limit is passed to them (the gateway trims again on the way back anyway).
fn upstream_history(h: Option<usize>, dialect: Dialect) -> Option<usize> {
    match dialect {
        Dialect::V10 => h,
        // Upstreams speak 0.3 or 1.0; 0.1 is a caller's dialect only.
        Dialect::V03 | Dialect::V01 => h.filter(|n| *n > 0),
    }
}

/// The body of a send (`message` already carrying upstream ids).
pub(super) fn send_body(
    dialect: Dialect,
    streaming: bool,
    id: u64,
    req: &SendRequest,
    message: &Message,
) -> Result<Vec<u8>, GatewayError> {
    let history_length = upstream_history(req.history_length, dialect);
    let metadata = req.metadata.as_ref();
    let out = match dialect {
        // Written directly (the bytes serde writes, as a test holds it to): this request
        // is built on every upstream call.
        Dialect::V10 => crate::protocol::write::send_request(
            id,
            streaming,
            message,
            &req.accepted_output_modes,
            history_length,
            !req.blocking,
            metadata,
        ),
        Dialect::V03 | Dialect::V01 => serde_json::to_vec(&Envelope {
            jsonrpc: "2.0",
            id,
            method: if streaming {
                "message/stream"
            } else {
                "message/send"
            },
            params: SendParamsOut {
                message: V03(message),
                configuration: ConfigV03 {
                    accepted_output_modes: &req.accepted_output_modes,
                    history_length,
                    blocking: req.blocking,
                },
                metadata,
            },
        }),
    };
    out.map_err(|e| GatewayError::Internal(format!("serializing an upstream request: {e}")))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct IdParams<'a> {
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    history_length: Option<usize>,
}

/// Which task operation; each has one name per dialect.
#[derive(Clone, Copy)]
pub(super) enum TaskOp {
    Get,
    Cancel,
    Subscribe,
}

pub(super) fn task_body(
    dialect: Dialect,
    op: TaskOp,
    id: u64,
    task_id: &str,
    history_length: Option<usize>,
) -> Result<Vec<u8>, GatewayError> {
    let method = match (op, dialect) {
        (TaskOp::Get, Dialect::V10) => "GetTask",
        (TaskOp::Get, Dialect::V03 | Dialect::V01) => "tasks/get",
        (TaskOp::Cancel, Dialect::V10) => "CancelTask",
        (TaskOp::Cancel, Dialect::V03 | Dialect::V01) => "tasks/cancel",
        (TaskOp::Subscribe, Dialect::V10) => "SubscribeToTask",
        (TaskOp::Subscribe, Dialect::V03 | Dialect::V01) => "tasks/resubscribe",
    };
    serde_json::to_vec(&Envelope {
        jsonrpc: "2.0",
        id,
        method,
        params: IdParams {
            id: task_id,
            history_length: upstream_history(history_length, dialect),
        },
    })
    .map_err(|e| GatewayError::Internal(format!("serializing an upstream request: {e}")))
}

/// Registers the gateway's own webhook for a task with the upstream.
pub(super) fn push_body(
    dialect: Dialect,
    id: u64,
    task_id: &str,
    url: &str,
    token: &str,
) -> Result<Vec<u8>, GatewayError> {
    let config = serde_json::json!({"id": "a2a-gateway", "url": url, "token": token});
    let (method, params) = match dialect {
        Dialect::V10 => {
            let mut flat = config;
            flat["taskId"] = task_id.into();
            ("CreateTaskPushNotificationConfig", flat)
        }
        Dialect::V03 | Dialect::V01 => (
            "tasks/pushNotificationConfig/set",
            serde_json::json!({"taskId": task_id, "pushNotificationConfig": config}),
        ),
    };
    serde_json::to_vec(&Envelope {
        jsonrpc: "2.0",
        id,
        method,
        params,
    })
    .map_err(|e| GatewayError::Internal(format!("serializing an upstream request: {e}")))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListParams<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    context_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<TaskState>,
    page_size: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    page_token: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    history_length: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status_timestamp_after: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    include_artifacts: bool,
}

pub(super) fn list_body(id: u64, q: &ListQuery) -> Result<Vec<u8>, GatewayError> {
    serde_json::to_vec(&Envelope {
        jsonrpc: "2.0",
        id,
        method: "ListTasks",
        params: ListParams {
            context_id: q.context_id.as_deref(),
            status: q.state,
            page_size: q.page_size,
            page_token: q.page_token.as_deref(),
            history_length: q.history_length,
            status_timestamp_after: q
                .status_after
                .as_ref()
                .map(crate::protocol::model::format_timestamp),
            include_artifacts: q.include_artifacts,
        },
    })
    .map_err(|e| GatewayError::Internal(format!("serializing an upstream request: {e}")))
}

/// A JSON-RPC response, its result read as `R`: a borrowed raw value to read later, or
/// one of the relay's shapes to read in the same pass as the envelope.
#[derive(Deserialize)]
struct Response<R> {
    #[serde(default = "Option::default")]
    result: Option<R>,
    #[serde(default)]
    error: Option<ErrorObject>,
}

#[derive(Deserialize)]
struct ErrorObject {
    code: i64,
    #[serde(default)]
    message: String,
    #[serde(default)]
    data: Option<Value>,
}

fn invalid(agent: &str, what: impl std::fmt::Display) -> GatewayError {
    GatewayError::InvalidAgentResponse(format!("agent {agent} {what}"))
}

/// Reads a JSON-RPC response: the raw result (borrowed from `body`, which is only scanned
/// here), or the upstream's error passed through.
pub(super) fn read_response<'a>(agent: &str, body: &'a [u8]) -> Result<&'a RawValue, GatewayError> {
    let resp: Response<&RawValue> = serde_json::from_slice(body).map_err(|_| {
        invalid(
            agent,
            "answered with something that is not a JSON-RPC response",
        )
    })?;
    match (resp.result, resp.error) {
        (_, Some(e)) => Err(GatewayError::Upstream {
            code: e.code,
            message: e.message,
            data: e.data,
        }),
        (Some(result), None) => Ok(result),
        (None, None) => Err(invalid(
            agent,
            "answered with neither a result nor an error",
        )),
    }
}

/// A send result to relay as it is, when it has one of the relay's shapes in `dialect`;
/// `None` for anything else (errors included), which the conversion path then reads.
pub(super) fn read_relayed(dialect: Dialect, body: &bytes::Bytes) -> Option<Relayed> {
    Relayed::from_response(dialect, body)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrappedStream {
    task: Option<Task>,
    message: Option<Message>,
    status_update: Option<TaskStatusUpdateEvent>,
    artifact_update: Option<TaskArtifactUpdateEvent>,
}

fn bare_kind(raw: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct Kind {
        kind: Option<String>,
    }
    serde_json::from_str::<Kind>(raw.get()).ok()?.kind
}

/// A send result: 1.0 wraps it (`{"task":…}`), 0.3 tags it (`"kind":"task"`).
pub(super) fn read_send_result(agent: &str, raw: &RawValue) -> Result<SendResult, GatewayError> {
    if let Some(item) = read_stream_item(agent, raw)? {
        return match item {
            StreamItem::Task(t) => Ok(SendResult::Task(t)),
            StreamItem::Message(m) => Ok(SendResult::Message(m)),
            _ => Err(invalid(
                agent,
                "answered a send with an event instead of a task",
            )),
        };
    }
    Err(invalid(
        agent,
        "answered a send with neither a task nor a message",
    ))
}

/// A stream result, or a send result (the same shapes plus the two event kinds).
pub(super) fn read_stream_item(
    agent: &str,
    raw: &RawValue,
) -> Result<Option<StreamItem>, GatewayError> {
    let bad = |e: serde_json::Error| invalid(agent, format!("sent a malformed result: {e}"));
    if let Some(kind) = bare_kind(raw) {
        let text = raw.get();
        return Ok(Some(match kind.as_str() {
            "task" => StreamItem::Task(serde_json::from_str(text).map_err(bad)?),
            "message" => StreamItem::Message(serde_json::from_str(text).map_err(bad)?),
            "status-update" => StreamItem::StatusUpdate(serde_json::from_str(text).map_err(bad)?),
            "artifact-update" => {
                StreamItem::ArtifactUpdate(serde_json::from_str(text).map_err(bad)?)
            }
            other => return Err(invalid(agent, format!("sent an unknown kind \"{other}\""))),
        }));
    }
    let w: WrappedStream = serde_json::from_str(raw.get()).map_err(bad)?;
    Ok(
        match (w.task, w.message, w.status_update, w.artifact_update) {
            (Some(t), _, _, _) => Some(StreamItem::Task(t)),
            (_, Some(m), _, _) => Some(StreamItem::Message(m)),
            (_, _, Some(s), _) => Some(StreamItem::StatusUpdate(s)),
            (_, _, _, Some(a)) => Some(StreamItem::ArtifactUpdate(a)),
            _ => None,
        },
    )
}

/// A Task (get, cancel), bare in both dialects.
pub(super) fn read_task(agent: &str, raw: &RawValue) -> Result<Task, GatewayError> {
    serde_json::from_str(raw.get())
        .map_err(|e| invalid(agent, format!("sent a malformed task: {e}")))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListResult {
    #[serde(default)]
    pub(crate) tasks: Vec<Task>,
    #[serde(default)]
    pub(crate) next_page_token: String,
    #[serde(default)]
    pub(crate) total_size: usize,
}

pub(super) fn read_list(agent: &str, raw: &RawValue) -> Result<ListResult, GatewayError> {
    serde_json::from_str(raw.get())
        .map_err(|e| invalid(agent, format!("sent a malformed task list: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::model::{Part, PartContent, Role};

    /// The 1.0 request written directly is the one serde writes, byte for byte.
    #[test]
    fn the_written_send_request_is_what_serde_writes() {
        let mut message = Message::agent_text("hello \"there\"\n");
        message.role = Role::User;
        message.context_id = Some("c".into());
        message.parts.push(Part {
            content: PartContent::Data(serde_json::json!({"a": [1, "b"]})),
            metadata: None,
            filename: Some("f.json".into()),
            media_type: Some("application/json".into()),
        });
        let mut metadata = Metadata::new();
        metadata.insert("k".into(), serde_json::json!({"x": 1}));
        let mut req = SendRequest {
            message: Message::default(),
            blocking: true,
            accepted_output_modes: Vec::new(),
            metadata: None,
            history_length: None,
            push: None,
            reply_dialect: Dialect::V10,
            on_new_task: None,
        };
        for (modes, history, blocking, md, streaming) in [
            (vec![], None, true, None, false),
            (
                vec!["text/plain".to_string()],
                Some(3),
                false,
                Some(metadata.clone()),
                true,
            ),
            (vec![], Some(0), false, None, false),
        ] {
            req.accepted_output_modes = modes;
            req.history_length = history;
            req.blocking = blocking;
            req.metadata = md;
            let serde = serde_json::to_vec(&Envelope {
                jsonrpc: "2.0",
                id: 42,
                method: if streaming {
                    "SendStreamingMessage"
                } else {
                    "SendMessage"
                },
                params: SendParamsOut {
                    message: &message,
                    configuration: ConfigV10 {
                        accepted_output_modes: &req.accepted_output_modes,
                        history_length: req.history_length,
                        return_immediately: !req.blocking,
                    },
                    metadata: req.metadata.as_ref(),
                },
            })
            .unwrap();
            let written = send_body(Dialect::V10, streaming, 42, &req, &message).unwrap();
            assert_eq!(
                String::from_utf8(written).unwrap(),
                String::from_utf8(serde).unwrap()
            );
        }
    }
}

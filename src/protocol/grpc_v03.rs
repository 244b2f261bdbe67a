//! A2A 0.3 over gRPC (0.3's `a2a.v1.A2AService`), as upstreams served that way speak it.
//! The remote backend writes 0.3 JSON-RPC calls and reads 0.3 JSON-RPC answers whatever
//! carries them; these are the conversions between that JSON and the ProtoJSON of the 0.3
//! proto's messages, so that a 0.3 gRPC upstream is relayed exactly as a 0.3 JSON-RPC one.
//!
//! The two differ in more than names: a message's parts are its `content`, a part is a
//! oneof without `kind`, a file is `fileWithUri` or `fileWithBytes`, data is wrapped once
//! more, roles and states are enum names (`TASK_STATE_CANCELLED` with two Ls), a status
//! update's `final` is left out when false, and tasks and push configurations are named by
//! resource names (`tasks/{id}`, `tasks/{id}/pushNotificationConfigs/{config}`).
//!
//! File bytes follow the proto: `file_with_bytes` holds the file's bytes, so its ProtoJSON
//! is the same base64 the JSON's `bytes` holds. (a2a-sdk 0.3.x puts the UTF-8 of the
//! base64 text in that field instead; see docs/agents.md.)

use serde_json::{json, Map, Value};

use super::jsonrpc::Method;
use super::push::PushOp;

/// A 0.3 JSON-RPC call's params as the ProtoJSON of the request of the 0.3 gRPC method
/// that stands for it.
pub(crate) fn request(method: Method, params: Value) -> Result<Value, String> {
    let mut params = match params {
        Value::Object(p) => p,
        Value::Null => Map::new(),
        _ => return Err("its params are not an object".into()),
    };
    let task = |params: &Map<String, Value>, key: &str| match params.get(key) {
        Some(Value::String(id)) => Ok(format!("tasks/{id}")),
        _ => Err(format!("its params have no \"{key}\"")),
    };
    // A configuration is named by its id; a2a-sdk 0.3.x gives one without an id the task's.
    let config_name = |params: &Map<String, Value>, task: &str, id: Option<&Value>| {
        let id = id
            .and_then(Value::as_str)
            .or_else(|| params.get("id").and_then(Value::as_str));
        format!("{task}/pushNotificationConfigs/{}", id.unwrap_or_default())
    };
    Ok(match method {
        Method::SendMessage | Method::SendStreamingMessage => {
            let mut out = Map::new();
            if let Some(message) = params.remove("message") {
                out.insert("message".into(), message_out(message));
            }
            if let Some(Value::Object(mut config)) = params.remove("configuration") {
                if let Some(push) = config.remove("pushNotificationConfig") {
                    config.insert("pushNotification".into(), push);
                }
                out.insert("configuration".into(), Value::Object(config));
            }
            if let Some(metadata) = params.remove("metadata") {
                out.insert("metadata".into(), metadata);
            }
            Value::Object(out)
        }
        Method::GetTask => {
            let mut out = json!({"name": task(&params, "id")?});
            if let Some(history) = params.remove("historyLength").filter(|h| !h.is_null()) {
                out["historyLength"] = history;
            }
            out
        }
        Method::CancelTask | Method::SubscribeToTask => json!({"name": task(&params, "id")?}),
        Method::Push(PushOp::Set) => {
            let parent = task(&params, "taskId")?;
            let config = params.remove("pushNotificationConfig").unwrap_or_default();
            let id = config
                .get("id")
                .and_then(Value::as_str)
                .or_else(|| params.get("taskId").and_then(Value::as_str))
                .unwrap_or_default()
                .to_string();
            let name = format!("{parent}/pushNotificationConfigs/{id}");
            json!({
                "parent": parent,
                "configId": id,
                "config": {"name": name, "pushNotificationConfig": config},
            })
        }
        Method::Push(PushOp::Get | PushOp::Delete) => {
            let parent = task(&params, "id")?;
            let name = config_name(&params, &parent, params.get("pushNotificationConfigId"));
            json!({ "name": name })
        }
        Method::Push(PushOp::List) => json!({"parent": task(&params, "id")?}),
        Method::GetExtendedAgentCard => json!({}),
        Method::ListTasks => return Err("0.3 has no ListTasks".into()),
    })
}

/// A 0.3 gRPC answer (the ProtoJSON of the method's response) as the result a 0.3
/// JSON-RPC upstream would have sent.
pub(crate) fn answer(method: Method, output: Value) -> Value {
    match method {
        Method::SendMessage | Method::SendStreamingMessage | Method::SubscribeToTask => {
            stream_in(output)
        }
        Method::GetTask | Method::CancelTask => task_in(output),
        Method::Push(PushOp::Set | PushOp::Get) => push_config_in(output),
        Method::Push(PushOp::List) => match output {
            Value::Object(mut list) => match list.remove("configs") {
                Some(Value::Array(configs)) => {
                    Value::Array(configs.into_iter().map(push_config_in).collect())
                }
                _ => json!([]),
            },
            _ => json!([]),
        },
        Method::Push(PushOp::Delete) => Value::Null,
        Method::GetExtendedAgentCard | Method::ListTasks => output,
    }
}

/// The A2A error code of a 0.3 SDK's error status, whose message names the error's type
/// (`TaskNotFoundError: Task not found`), and the message without it.
pub(crate) fn error_of(message: &str) -> Option<(i64, &str)> {
    let (name, rest) = message.split_once(": ")?;
    let code = match name {
        "JSONParseError" => -32700,
        "InvalidRequestError" => -32600,
        "MethodNotFoundError" => -32601,
        "InvalidParamsError" => -32602,
        "InternalError" => -32603,
        "TaskNotFoundError" => -32001,
        "TaskNotCancelableError" => -32002,
        "PushNotificationNotSupportedError" => -32003,
        "UnsupportedOperationError" => -32004,
        "ContentTypeNotSupportedError" => -32005,
        "InvalidAgentResponseError" => -32006,
        "AuthenticatedExtendedCardNotConfiguredError" => -32007,
        _ => return None,
    };
    Some((code, rest))
}

fn rename(object: &mut Map<String, Value>, from: &str, to: &str) {
    if let Some(value) = object.remove(from) {
        object.insert(to.into(), value);
    }
}

fn map_array(value: Option<&mut Value>, each: fn(Value) -> Value) {
    if let Some(Value::Array(items)) = value {
        for item in items.iter_mut() {
            *item = each(std::mem::take(item));
        }
    }
}

fn message_out(message: Value) -> Value {
    let Value::Object(mut m) = message else {
        return message;
    };
    m.remove("kind");
    let role = match m.get("role").and_then(Value::as_str) {
        Some("agent") => "ROLE_AGENT",
        Some("user") => "ROLE_USER",
        _ => "ROLE_UNSPECIFIED",
    };
    m.insert("role".into(), role.into());
    rename(&mut m, "parts", "content");
    map_array(m.get_mut("content"), part_out);
    Value::Object(m)
}

fn part_out(part: Value) -> Value {
    let Value::Object(mut p) = part else {
        return part;
    };
    let mut out = Map::new();
    if let Some(metadata) = p.remove("metadata").filter(|m| !m.is_null()) {
        out.insert("metadata".into(), metadata);
    }
    if let Some(Value::Object(mut file)) = p.remove("file") {
        rename(&mut file, "uri", "fileWithUri");
        rename(&mut file, "bytes", "fileWithBytes");
        out.insert("file".into(), Value::Object(file));
    } else if let Some(data) = p.remove("data") {
        out.insert("data".into(), json!({ "data": data }));
    } else {
        out.insert("text".into(), p.remove("text").unwrap_or_else(|| "".into()));
    }
    Value::Object(out)
}

fn stream_in(response: Value) -> Value {
    let Value::Object(mut r) = response else {
        return response;
    };
    if let Some(task) = r.remove("task") {
        task_in(task)
    } else if let Some(message) = r.remove("message") {
        message_in(message)
    } else if let Some(Value::Object(mut update)) = r.remove("statusUpdate") {
        update.insert("kind".into(), "status-update".into());
        if let Some(status) = update.remove("status") {
            update.insert("status".into(), status_in(status));
        }
        let last = update
            .get("final")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        update.insert("final".into(), last.into());
        Value::Object(update)
    } else if let Some(Value::Object(mut update)) = r.remove("artifactUpdate") {
        update.insert("kind".into(), "artifact-update".into());
        if let Some(artifact) = update.remove("artifact") {
            update.insert("artifact".into(), artifact_in(artifact));
        }
        Value::Object(update)
    } else {
        Value::Object(r)
    }
}

fn task_in(task: Value) -> Value {
    let Value::Object(mut t) = task else {
        return task;
    };
    t.insert("kind".into(), "task".into());
    let status = t.remove("status").unwrap_or_else(|| json!({}));
    t.insert("status".into(), status_in(status));
    map_array(t.get_mut("artifacts"), artifact_in);
    map_array(t.get_mut("history"), message_in);
    Value::Object(t)
}

fn status_in(status: Value) -> Value {
    let Value::Object(mut s) = status else {
        return status;
    };
    let state = match s.get("state").and_then(Value::as_str) {
        Some("TASK_STATE_SUBMITTED") => "submitted",
        Some("TASK_STATE_WORKING") => "working",
        Some("TASK_STATE_COMPLETED") => "completed",
        Some("TASK_STATE_FAILED") => "failed",
        Some("TASK_STATE_CANCELLED") => "canceled",
        Some("TASK_STATE_INPUT_REQUIRED") => "input-required",
        Some("TASK_STATE_REJECTED") => "rejected",
        Some("TASK_STATE_AUTH_REQUIRED") => "auth-required",
        _ => "unknown",
    };
    s.insert("state".into(), state.into());
    if let Some(message) = s.remove("message") {
        s.insert("message".into(), message_in(message));
    }
    Value::Object(s)
}

fn message_in(message: Value) -> Value {
    let Value::Object(mut m) = message else {
        return message;
    };
    m.insert("kind".into(), "message".into());
    let role = match m.get("role").and_then(Value::as_str) {
        Some("ROLE_AGENT") => "agent",
        _ => "user",
    };
    m.insert("role".into(), role.into());
    let parts = m.remove("content").unwrap_or_else(|| json!([]));
    m.insert("parts".into(), parts);
    map_array(m.get_mut("parts"), part_in);
    Value::Object(m)
}

fn artifact_in(artifact: Value) -> Value {
    let Value::Object(mut a) = artifact else {
        return artifact;
    };
    map_array(a.get_mut("parts"), part_in);
    Value::Object(a)
}

fn part_in(part: Value) -> Value {
    let Value::Object(mut p) = part else {
        return part;
    };
    let mut out = Map::new();
    if let Some(Value::Object(mut file)) = p.remove("file") {
        rename(&mut file, "fileWithUri", "uri");
        rename(&mut file, "fileWithBytes", "bytes");
        out.insert("kind".into(), "file".into());
        out.insert("file".into(), Value::Object(file));
    } else if let Some(data) = p.remove("data") {
        let data = match data {
            Value::Object(mut wrapped) => wrapped.remove("data").unwrap_or_else(|| json!({})),
            _ => json!({}),
        };
        out.insert("kind".into(), "data".into());
        out.insert("data".into(), data);
    } else {
        out.insert("kind".into(), "text".into());
        out.insert("text".into(), p.remove("text").unwrap_or_else(|| "".into()));
    }
    if let Some(metadata) = p.remove("metadata") {
        out.insert("metadata".into(), metadata);
    }
    Value::Object(out)
}

fn push_config_in(config: Value) -> Value {
    let Value::Object(mut c) = config else {
        return config;
    };
    let name = c.remove("name");
    let task = name
        .as_ref()
        .and_then(Value::as_str)
        .and_then(|n| n.strip_prefix("tasks/"))
        .and_then(|n| n.split('/').next())
        .unwrap_or_default();
    let config = c
        .remove("pushNotificationConfig")
        .unwrap_or_else(|| json!({}));
    json!({"taskId": task, "pushNotificationConfig": config})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::grpc::{encode_json, rpc_of};
    use crate::protocol::Dialect;

    /// JSON through the 0.3 proto and back, as an upstream's answer would come.
    fn through_proto(method: Method, json: Value, input: bool) -> Value {
        let rpc = rpc_of(method, Dialect::V03).unwrap();
        let message = if input { &rpc.input } else { &rpc.output };
        let encoded = encode_json(&json.to_string(), message).unwrap();
        serde_json::to_value(&encoded).unwrap()
    }

    #[test]
    fn a_send_with_every_kind_of_part_reads_as_the_0_3_proto_has_it() {
        let params = json!({
            "message": {"kind": "message", "messageId": "m1", "role": "user", "contextId": "c",
                "parts": [
                    {"kind": "text", "text": "hi", "metadata": {"k": 1}},
                    {"kind": "file", "file": {"uri": "http://f/x.png", "mimeType": "image/png", "name": "x.png"}},
                    {"kind": "file", "file": {"bytes": "aGk=", "mimeType": "text/plain"}},
                    {"kind": "data", "data": {"a": [1, 2]}}]},
            "configuration": {"acceptedOutputModes": ["text/plain"], "blocking": true,
                "historyLength": 3, "pushNotificationConfig": {"url": "http://hook", "token": "t"}},
            "metadata": {"trace": "x"},
        });
        let proto = request(Method::SendMessage, params).unwrap();
        let read = through_proto(Method::SendMessage, proto, true);
        let m = &read["message"];
        assert_eq!(m["role"], "ROLE_USER", "{read}");
        assert_eq!(
            m["content"][0],
            json!({"text": "hi", "metadata": {"k": 1.0}})
        );
        assert_eq!(m["content"][1]["file"]["fileWithUri"], "http://f/x.png");
        assert_eq!(m["content"][1]["file"]["name"], "x.png");
        assert_eq!(m["content"][2]["file"]["fileWithBytes"], "aGk=");
        assert_eq!(m["content"][3]["data"]["data"]["a"], json!([1.0, 2.0]));
        let c = &read["configuration"];
        assert_eq!(c["pushNotification"]["url"], "http://hook", "{read}");
        assert_eq!(
            (c["blocking"].clone(), c["historyLength"].clone()),
            (json!(true), json!(3))
        );
        assert_eq!(read["metadata"]["trace"], "x");
    }

    #[test]
    fn task_calls_name_their_task_and_push_calls_their_configuration() {
        let get = request(Method::GetTask, json!({"id": "t1", "historyLength": 2})).unwrap();
        assert_eq!(get, json!({"name": "tasks/t1", "historyLength": 2}));
        let cancel = request(Method::CancelTask, json!({"id": "t1"})).unwrap();
        assert_eq!(cancel, json!({"name": "tasks/t1"}));
        let set =
            json!({"taskId": "t1", "pushNotificationConfig": {"id": "gw", "url": "http://h"}});
        let set = through_proto(
            Method::Push(PushOp::Set),
            request(Method::Push(PushOp::Set), set).unwrap(),
            true,
        );
        assert_eq!(set["parent"], "tasks/t1");
        assert_eq!(set["configId"], "gw");
        assert_eq!(set["config"]["name"], "tasks/t1/pushNotificationConfigs/gw");
        let get = json!({"id": "t1"});
        let get = request(Method::Push(PushOp::Get), get).unwrap();
        assert_eq!(get["name"], "tasks/t1/pushNotificationConfigs/t1");
        let list = request(Method::Push(PushOp::List), json!({"id": "t1"})).unwrap();
        assert_eq!(list, json!({"parent": "tasks/t1"}));
        assert!(request(Method::GetTask, json!({})).is_err());
        assert!(request(Method::ListTasks, json!({})).is_err());
        assert!(request(Method::GetTask, json!([1])).is_err());
    }

    #[test]
    fn answers_read_back_as_0_3_json_rpc_results() {
        let task = json!({"task": {"id": "t", "contextId": "c",
            "status": {"state": "TASK_STATE_CANCELLED", "message": {"messageId": "s", "role": "ROLE_AGENT",
                "content": [{"text": "bye"}]}},
            "artifacts": [{"artifactId": "a", "parts": [
                {"data": {"data": {"n": 1}}},
                {"file": {"fileWithBytes": "aGk=", "name": "f.txt"}, "metadata": {"m": true}}]}],
            "history": [{"messageId": "m", "role": "ROLE_USER", "content": [{"text": "hi"}]}]}});
        let read = through_proto(Method::SendMessage, task, false);
        let t = answer(Method::SendMessage, read);
        assert_eq!(t["kind"], "task", "{t}");
        assert_eq!(t["status"]["state"], "canceled");
        assert_eq!(t["status"]["message"]["role"], "agent");
        assert_eq!(
            t["status"]["message"]["parts"][0],
            json!({"kind": "text", "text": "bye"})
        );
        let parts = &t["artifacts"][0]["parts"];
        assert_eq!(parts[0], json!({"kind": "data", "data": {"n": 1.0}}));
        assert_eq!(parts[1]["file"], json!({"bytes": "aGk=", "name": "f.txt"}));
        assert_eq!(parts[1]["metadata"]["m"], true);
        assert_eq!(t["history"][0]["parts"][0]["text"], "hi");

        let working = json!({"statusUpdate": {"taskId": "t", "contextId": "c",
            "status": {"state": "TASK_STATE_WORKING"}}});
        let read = through_proto(Method::SendStreamingMessage, working, false);
        let update = answer(Method::SendStreamingMessage, read);
        assert_eq!(update["kind"], "status-update", "{update}");
        assert_eq!(
            (update["final"].clone(), update["status"]["state"].clone()),
            (json!(false), json!("working"))
        );
        let chunk = json!({"artifactUpdate": {"taskId": "t", "contextId": "c", "lastChunk": true,
            "artifact": {"artifactId": "a", "parts": [{"text": "x"}]}}});
        let read = through_proto(Method::SubscribeToTask, chunk, false);
        let chunk = answer(Method::SubscribeToTask, read);
        assert_eq!(chunk["kind"], "artifact-update", "{chunk}");
        assert_eq!(chunk["artifact"]["parts"][0]["kind"], "text");

        let config = json!({"name": "tasks/t9/pushNotificationConfigs/gw",
            "pushNotificationConfig": {"id": "gw", "url": "http://h"}});
        let list = answer(
            Method::Push(PushOp::List),
            json!({"configs": [config.clone()]}),
        );
        assert_eq!(list[0]["taskId"], "t9", "{list}");
        assert_eq!(
            answer(Method::Push(PushOp::Get), config)["pushNotificationConfig"]["id"],
            "gw"
        );
        assert_eq!(answer(Method::Push(PushOp::Delete), json!({})), Value::Null);
    }

    #[test]
    fn a_0_3_sdk_status_message_names_its_error() {
        assert_eq!(
            error_of("TaskNotFoundError: Task not found"),
            Some((-32001, "Task not found"))
        );
        assert_eq!(
            error_of("UnsupportedOperationError: no"),
            Some((-32004, "no"))
        );
        assert_eq!(error_of("Unknown error type: x"), None);
        assert_eq!(error_of("plain"), None);
    }
}

//! A2A 0.1, the `tasks/send` generation, for the clients still built on it.
//!
//! In: a 0.1 send names its task (`params.id`, chosen by the client), calls the
//! conversation `sessionId`, sends no `messageId`, tags parts with `type`, and puts its
//! options beside the message rather than in `configuration`. [`read_send`] turns that into
//! the current params. Out: tasks with the client's id, `sessionId`, `type`-tagged parts,
//! artifacts with an `index`, states from 0.1's seven, and stream events that carry the
//! task `id` and `final` and no `kind`.

use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::model::{
    format_timestamp, new_id, Artifact, Message, Part, PartContent, Role, StreamEnd, StreamItem,
    Task, TaskState, TaskStatus,
};
use super::params::{self, SendParams};
use crate::error::GatewayError;

/// A 0.1 send, read.
pub struct SendV01 {
    /// The task id the client chose.
    pub task_id: String,
    pub params: SendParams,
}

/// The 0.1 `TaskSendParams`, every optional field nullable (the 0.1 Python client sends
/// `null` for each one it does not set).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSend {
    id: Option<Value>,
    session_id: Option<String>,
    message: Option<Map<String, Value>>,
    accepted_output_modes: Option<Vec<String>>,
    push_notification: Option<Value>,
    history_length: Option<i64>,
    metadata: Option<Map<String, Value>>,
}

/// Reads `tasks/send` / `tasks/sendSubscribe` params into the current shape.
pub fn read_send(raw: Option<&RawValue>) -> Result<SendV01, GatewayError> {
    let wire: WireSend = params::decode(raw)?;
    let task_id = match wire.id {
        Some(Value::String(id)) if !id.trim().is_empty() => id,
        _ => {
            return Err(GatewayError::InvalidParams(
                "params.id: a 0.1 send names its task with a non-empty string".into(),
            ))
        }
    };
    if task_id.len() > 256 {
        return Err(GatewayError::InvalidParams(
            "params.id: longer than 256 characters".into(),
        ));
    }
    let mut message = wire
        .message
        .ok_or_else(|| GatewayError::InvalidParams("missing field `message`".into()))?;
    // 0.1 messages carry no id; the gateway gives each one its own.
    if !matches!(message.get("messageId"), Some(Value::String(_))) {
        message.insert("messageId".into(), Value::String(new_id()));
    }
    let mut configuration = Map::new();
    if let Some(modes) = wire.accepted_output_modes {
        configuration.insert("acceptedOutputModes".into(), modes.into());
    }
    if let Some(push) = wire.push_notification.filter(|p| !p.is_null()) {
        configuration.insert("pushNotificationConfig".into(), push);
    }
    let mut current = Map::new();
    current.insert("message".into(), Value::Object(message));
    current.insert("configuration".into(), Value::Object(configuration));
    if let Some(md) = wire.metadata {
        current.insert("metadata".into(), Value::Object(md));
    }
    if let Some(session) = wire.session_id.filter(|s| !s.is_empty()) {
        current.insert("sessionId".into(), Value::String(session));
    }
    let raw = serde_json::value::to_raw_value(&current)
        .map_err(|e| GatewayError::Internal(format!("re-reading 0.1 params: {e}")))?;
    let mut params: SendParams = params::decode(Some(&raw))?;
    if let Some(n) = wire.history_length {
        params
            .configuration
            .get_or_insert_with(Default::default)
            .history_length = Some(n);
    }
    Ok(SendV01 { task_id, params })
}

/// 0.1 knows seven states; the later ones map to their nearest.
pub fn state_name(state: TaskState) -> &'static str {
    match state {
        TaskState::Submitted => "submitted",
        TaskState::Working => "working",
        TaskState::InputRequired | TaskState::AuthRequired => "input-required",
        TaskState::Completed => "completed",
        TaskState::Canceled => "canceled",
        TaskState::Failed | TaskState::Rejected => "failed",
        TaskState::Unspecified => "unknown",
    }
}

/// The JSON-RPC error code for a 0.1 caller: 0.1 gave -32006..-32009 other meanings, so
/// the later errors under those codes go out as internal errors, with their message.
pub fn error_code(code: i64) -> i64 {
    if (-32009..=-32006).contains(&code) {
        -32603
    } else {
        code
    }
}

/// A task as a 0.1 client reads it (its id already the one the client chose).
pub struct TaskV01<'a> {
    pub task: &'a Task,
    pub history_length: Option<usize>,
}

impl Serialize for TaskV01<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = self.task;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("id", &t.id)?;
        m.serialize_entry("sessionId", &t.context_id)?;
        m.serialize_entry("status", &StatusV01(&t.status))?;
        let artifacts: Vec<_> = t
            .artifacts
            .iter()
            .enumerate()
            .map(|(index, a)| ArtifactV01 {
                artifact: a,
                index,
                chunk: None,
            })
            .collect();
        // 0.1 clients iterate over the artifacts without checking for them.
        m.serialize_entry("artifacts", &artifacts)?;
        let keep = self.history_length.unwrap_or(t.history.len());
        let history = &t.history[t.history.len().saturating_sub(keep)..];
        if !history.is_empty() {
            let history: Vec<_> = history.iter().map(MessageV01).collect();
            m.serialize_entry("history", &history)?;
        }
        if let Some(md) = &t.metadata {
            m.serialize_entry("metadata", md)?;
        }
        m.end()
    }
}

/// A Message answer, which 0.1 does not have: a completed task whose status carries it.
pub struct MessageAsTaskV01<'a> {
    pub message: &'a Message,
    pub id: &'a str,
}

impl Serialize for MessageAsTaskV01<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("id", self.id)?;
        if let Some(c) = &self.message.context_id {
            m.serialize_entry("sessionId", c)?;
        }
        let status = TaskStatus::now(TaskState::Completed, Some(self.message.clone()));
        m.serialize_entry("status", &StatusV01(&status))?;
        m.serialize_entry("artifacts", &[(); 0])?;
        m.end()
    }
}

/// One stream item as a 0.1 event: a status event (a task snapshot shows as its status),
/// or an artifact event; `final` marks where a 0.1 stream ends.
pub struct EventV01<'a>(pub &'a StreamItem, pub StreamEnd);

impl Serialize for EventV01<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        let id = match self.0 {
            StreamItem::Task(t) => Some(&t.id),
            StreamItem::StatusUpdate(u) => Some(&u.task_id),
            StreamItem::ArtifactUpdate(a) => Some(&a.task_id),
            StreamItem::Message(msg) => msg.task_id.as_ref(),
        };
        m.serialize_entry("id", &id)?;
        let (status, metadata) = match self.0 {
            StreamItem::ArtifactUpdate(a) => {
                let artifact = ArtifactV01 {
                    artifact: &a.artifact,
                    index: 0,
                    chunk: Some((a.append, a.last_chunk)),
                };
                m.serialize_entry("artifact", &artifact)?;
                if let Some(md) = &a.metadata {
                    m.serialize_entry("metadata", md)?;
                }
                return m.end();
            }
            StreamItem::Task(t) => (t.status.clone(), &t.metadata),
            StreamItem::StatusUpdate(u) => (u.status.clone(), &u.metadata),
            StreamItem::Message(msg) => (
                TaskStatus::now(TaskState::Completed, Some(msg.clone())),
                &msg.metadata,
            ),
        };
        m.serialize_entry("status", &StatusV01(&status))?;
        m.serialize_entry("final", &self.1.closes(self.0))?;
        if let Some(md) = metadata {
            m.serialize_entry("metadata", md)?;
        }
        m.end()
    }
}

struct StatusV01<'a>(&'a TaskStatus);

impl Serialize for StatusV01<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let st = self.0;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("state", state_name(st.state))?;
        if let Some(msg) = &st.message {
            m.serialize_entry("message", &MessageV01(msg))?;
        }
        if let Some(ts) = &st.timestamp {
            m.serialize_entry("timestamp", &format_timestamp(ts))?;
        }
        m.end()
    }
}

struct MessageV01<'a>(&'a Message);

impl Serialize for MessageV01<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let msg = self.0;
        let mut m = s.serialize_map(None)?;
        let role = match msg.role {
            Role::Agent => "agent",
            _ => "user",
        };
        m.serialize_entry("role", role)?;
        let parts: Vec<_> = msg.parts.iter().map(PartV01).collect();
        m.serialize_entry("parts", &parts)?;
        if let Some(md) = &msg.metadata {
            m.serialize_entry("metadata", md)?;
        }
        m.end()
    }
}

struct ArtifactV01<'a> {
    artifact: &'a Artifact,
    index: usize,
    /// (append, lastChunk) on a streamed artifact.
    chunk: Option<(bool, bool)>,
}

impl Serialize for ArtifactV01<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let a = self.artifact;
        let mut m = s.serialize_map(None)?;
        if let Some(n) = &a.name {
            m.serialize_entry("name", n)?;
        }
        if let Some(d) = &a.description {
            m.serialize_entry("description", d)?;
        }
        let parts: Vec<_> = a.parts.iter().map(PartV01).collect();
        m.serialize_entry("parts", &parts)?;
        m.serialize_entry("index", &self.index)?;
        if let Some((append, last_chunk)) = self.chunk {
            m.serialize_entry("append", &append)?;
            m.serialize_entry("lastChunk", &last_chunk)?;
        }
        if let Some(md) = &a.metadata {
            m.serialize_entry("metadata", md)?;
        }
        m.end()
    }
}

struct PartV01<'a>(&'a Part);

impl Serialize for PartV01<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let p = self.0;
        let mut m = s.serialize_map(None)?;
        match &p.content {
            PartContent::Text(t) => {
                m.serialize_entry("type", "text")?;
                m.serialize_entry("text", t)?;
            }
            PartContent::Raw(_) | PartContent::Url(_) => {
                let mut file = Map::new();
                if let Some(n) = &p.filename {
                    file.insert("name".into(), n.clone().into());
                }
                if let Some(mt) = &p.media_type {
                    file.insert("mimeType".into(), mt.clone().into());
                }
                match &p.content {
                    PartContent::Raw(b) => file.insert("bytes".into(), b.clone().into()),
                    PartContent::Url(u) => file.insert("uri".into(), u.clone().into()),
                    _ => None,
                };
                m.serialize_entry("type", "file")?;
                m.serialize_entry("file", &file)?;
            }
            // 0.1 data is an object; anything else is wrapped.
            PartContent::Data(Value::Object(obj)) => {
                m.serialize_entry("type", "data")?;
                m.serialize_entry("data", obj)?;
            }
            PartContent::Data(other) => {
                m.serialize_entry("type", "data")?;
                m.serialize_entry("data", &serde_json::json!({ "value": other }))?;
            }
        }
        if let Some(md) = &p.metadata {
            m.serialize_entry("metadata", md)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(v: Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&v).unwrap()
    }

    /// The 0.1 Python client's body: every optional field present as null.
    #[test]
    fn reads_the_0_1_client_body_with_its_nulls() {
        let body = json!({
            "id": "740f1e21465b4ee2af4af7b8c6cacad5",
            "sessionId": "7fbd065264cb4d6c91ed96909589fc35",
            "message": {"role": "user", "parts": [{"type": "text", "text": "hello", "metadata": null}], "metadata": null},
            "acceptedOutputModes": ["text"], "pushNotification": null, "historyLength": null, "metadata": null
        });
        let send = read_send(Some(&raw(body))).unwrap();
        assert_eq!(send.task_id, "740f1e21465b4ee2af4af7b8c6cacad5");
        assert_eq!(
            send.params.session_id.as_deref(),
            Some("7fbd065264cb4d6c91ed96909589fc35")
        );
        assert!(!send.params.message.message_id.is_empty());
        assert_eq!(send.params.message.parts[0].as_text(), Some("hello"));
        let config = send.params.configuration.unwrap();
        assert_eq!(config.accepted_output_modes, ["text"]);
        assert!(config.push_notification_config.is_none());

        for (bad, why) in [
            (
                json!({"message": {"role": "user", "parts": []}}),
                "params.id",
            ),
            (
                json!({"id": 7, "message": {"role": "user", "parts": []}}),
                "params.id",
            ),
            (json!({"id": "t"}), "message"),
            (
                json!({"id": "t", "message": {"role": "user", "parts": [{"type": "text"}]}}),
                "parts[0]",
            ),
        ] {
            let err = read_send(Some(&raw(bad))).err().unwrap();
            assert!(err.to_string().contains(why), "{err}");
        }
    }

    #[test]
    fn writes_the_shapes_0_1_clients_parse() {
        let mut task = Task::submitted(
            "client-id".into(),
            "session".into(),
            Message::agent_text("hi"),
        );
        task.artifacts = vec![Artifact {
            artifact_id: "a".into(),
            name: Some("joke".into()),
            description: None,
            parts: vec![Part::text("ha")],
            metadata: None,
            extensions: vec![],
        }];
        task.status = TaskStatus::now(TaskState::Rejected, None);
        let v = serde_json::to_value(TaskV01 {
            task: &task,
            history_length: Some(0),
        })
        .unwrap();
        assert_eq!(v["id"], "client-id");
        assert_eq!(v["sessionId"], "session");
        assert_eq!(v["status"]["state"], "failed", "rejected is failed in 0.1");
        assert_eq!(
            v["artifacts"],
            json!([{"name": "joke", "parts": [{"type": "text", "text": "ha"}], "index": 0}])
        );
        assert!(v.get("history").is_none() && v.get("kind").is_none(), "{v}");

        let status = StreamItem::Task(task);
        let e = serde_json::to_value(EventV01(&status, StreamEnd::Interrupted)).unwrap();
        assert_eq!(
            (e["id"].clone(), e["final"].clone()),
            (json!("client-id"), json!(true))
        );
        assert!(e.get("kind").is_none() && e.get("taskId").is_none(), "{e}");
        assert_eq!(error_code(-32006), -32603);
        assert_eq!(error_code(-32001), -32001);
    }
}

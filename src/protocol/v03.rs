//! Exact 0.3 JSON-RPC output shapes (`kind` discriminators, kebab-case states, lowercase
//! roles, `file`/`data` parts), written straight from the canonical model without an
//! intermediate `Value` tree.

use super::ops::SendResult;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{Map, Value};

use super::model::{
    format_timestamp, Artifact, Message, Part, PartContent, Stamp, Stamped, StreamEnd, StreamItem,
    Task, TaskArtifactUpdateEvent, TaskStatus, TaskStatusUpdateEvent, DATA_COMPAT_KEY,
};

/// Borrowing adapter: `V03(&x)` serializes `x` in its 0.3 JSON-RPC form.
pub struct V03<'a, T: ?Sized>(pub &'a T);

/// Adapter for slices, so `Vec<T>` fields need no intermediate collection.
struct V03Seq<'a, T>(&'a [T]);

impl<'a, T> Serialize for V03Seq<'a, T>
where
    V03<'a, T>: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(V03))
    }
}

impl Serialize for V03<'_, Part> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let p = self.0;
        let mut m = s.serialize_map(None)?;
        match &p.content {
            PartContent::Text(t) => {
                m.serialize_entry("kind", "text")?;
                m.serialize_entry("text", t)?;
                if let Some(md) = &p.metadata {
                    m.serialize_entry("metadata", md)?;
                }
            }
            PartContent::Raw(_) | PartContent::Url(_) => {
                m.serialize_entry("kind", "file")?;
                m.serialize_entry("file", &FileV03(p))?;
                if let Some(md) = &p.metadata {
                    m.serialize_entry("metadata", md)?;
                }
            }
            PartContent::Data(Value::Object(obj)) => {
                m.serialize_entry("kind", "data")?;
                m.serialize_entry("data", obj)?;
                if let Some(md) = &p.metadata {
                    m.serialize_entry("metadata", md)?;
                }
            }
            // 0.3 data must be an object: wrap like the SDK compat layers do, and mark it
            // so a 1.0 peer can unwrap it again.
            PartContent::Data(other) => {
                m.serialize_entry("kind", "data")?;
                let mut wrapped = Map::new();
                wrapped.insert("value".into(), other.clone());
                m.serialize_entry("data", &wrapped)?;
                let mut md = p.metadata.clone().unwrap_or_default();
                md.insert(DATA_COMPAT_KEY.into(), Value::Bool(true));
                m.serialize_entry("metadata", &md)?;
            }
        }
        m.end()
    }
}

struct FileV03<'a>(&'a Part);

impl Serialize for FileV03<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let p = self.0;
        let mut m = s.serialize_map(None)?;
        match &p.content {
            PartContent::Raw(b) => m.serialize_entry("bytes", b)?,
            PartContent::Url(u) => m.serialize_entry("uri", u)?,
            PartContent::Text(_) | PartContent::Data(_) => {}
        }
        if let Some(n) = &p.filename {
            m.serialize_entry("name", n)?;
        }
        if let Some(mt) = &p.media_type {
            m.serialize_entry("mimeType", mt)?;
        }
        m.end()
    }
}

impl Serialize for V03<'_, Message> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let msg = self.0;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("kind", "message")?;
        m.serialize_entry("messageId", &msg.message_id)?;
        m.serialize_entry("role", msg.role.v03_name())?;
        m.serialize_entry("parts", &V03Seq(&msg.parts))?;
        if let Some(c) = &msg.context_id {
            m.serialize_entry("contextId", c)?;
        }
        if let Some(t) = &msg.task_id {
            m.serialize_entry("taskId", t)?;
        }
        if !msg.reference_task_ids.is_empty() {
            m.serialize_entry("referenceTaskIds", &msg.reference_task_ids)?;
        }
        if !msg.extensions.is_empty() {
            m.serialize_entry("extensions", &msg.extensions)?;
        }
        if let Some(md) = &msg.metadata {
            m.serialize_entry("metadata", md)?;
        }
        m.end()
    }
}

impl Serialize for V03<'_, Artifact> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let a = self.0;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("artifactId", &a.artifact_id)?;
        if let Some(n) = &a.name {
            m.serialize_entry("name", n)?;
        }
        if let Some(d) = &a.description {
            m.serialize_entry("description", d)?;
        }
        m.serialize_entry("parts", &V03Seq(&a.parts))?;
        if let Some(md) = &a.metadata {
            m.serialize_entry("metadata", md)?;
        }
        if !a.extensions.is_empty() {
            m.serialize_entry("extensions", &a.extensions)?;
        }
        m.end()
    }
}

impl Serialize for V03<'_, TaskStatus> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let st = self.0;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("state", st.state.v03_name())?;
        if let Some(msg) = st.message.as_deref() {
            m.serialize_entry("message", &V03(msg))?;
        }
        if let Some(ts) = &st.timestamp {
            m.serialize_entry("timestamp", &format_timestamp(ts))?;
        }
        m.end()
    }
}

impl Serialize for V03<'_, Task> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        V03(&Stamped {
            value: self.0,
            stamp: Stamp::NONE,
        })
        .serialize(s)
    }
}

impl Serialize for V03<'_, Stamped<'_, Task>> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = self.0.value;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("kind", "task")?;
        m.serialize_entry("id", &t.id)?;
        m.serialize_entry("contextId", &t.context_id)?;
        m.serialize_entry("status", &V03(&t.status))?;
        if !t.artifacts.is_empty() {
            m.serialize_entry("artifacts", &V03Seq(&t.artifacts))?;
        }
        if !t.history.is_empty() {
            m.serialize_entry("history", &V03Seq(&t.history))?;
        }
        if let Some(md) = self.0.stamp.metadata(t.metadata.as_ref()) {
            m.serialize_entry("metadata", &md)?;
        }
        m.end()
    }
}

/// A status update with the 0.3-only `final` flag, which the stream writer decides.
pub struct StatusV03<'a> {
    pub event: &'a TaskStatusUpdateEvent,
    pub is_final: bool,
}

impl Serialize for StatusV03<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.event;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("kind", "status-update")?;
        m.serialize_entry("taskId", &e.task_id)?;
        m.serialize_entry("contextId", &e.context_id)?;
        m.serialize_entry("status", &V03(&e.status))?;
        m.serialize_entry("final", &self.is_final)?;
        if let Some(md) = &e.metadata {
            m.serialize_entry("metadata", md)?;
        }
        m.end()
    }
}

impl Serialize for V03<'_, TaskArtifactUpdateEvent> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.0;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("kind", "artifact-update")?;
        m.serialize_entry("taskId", &e.task_id)?;
        m.serialize_entry("contextId", &e.context_id)?;
        m.serialize_entry("artifact", &V03(&e.artifact))?;
        if e.append {
            m.serialize_entry("append", &true)?;
        }
        if e.last_chunk {
            m.serialize_entry("lastChunk", &true)?;
        }
        if let Some(md) = &e.metadata {
            m.serialize_entry("metadata", md)?;
        }
        m.end()
    }
}

impl Serialize for V03<'_, SendResult> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            SendResult::Task(t) => V03(t).serialize(s),
            SendResult::Message(m) => V03(m).serialize(s),
            SendResult::Relayed(r) => r.serialize_as(super::Dialect::V03, s),
        }
    }
}

/// A stream item in 0.3 form. `final` is set on whichever event closes the stream, so a 0.3
/// client never waits on a stream the gateway has already ended (trap 5 of the reference).
pub struct StreamItemV03<'a>(pub &'a StreamItem, pub StreamEnd);

impl Serialize for StreamItemV03<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            StreamItem::Task(t) => V03(t).serialize(s),
            StreamItem::Message(m) => V03(m).serialize(s),
            StreamItem::StatusUpdate(e) => StatusV03 {
                event: e,
                is_final: self.1.closes(self.0),
            }
            .serialize(s),
            StreamItem::ArtifactUpdate(e) => V03(e).serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::model::{Role, TaskState};
    use serde_json::json;

    #[test]
    fn task_renders_in_03_shape() {
        let task = Task {
            id: "t1".into(),
            context_id: "c1".into(),
            status: TaskStatus {
                state: TaskState::Canceled,
                message: None,
                timestamp: None,
            },
            artifacts: vec![Artifact {
                artifact_id: "a1".into(),
                name: None,
                description: None,
                parts: vec![Part::text("hi")],
                metadata: None,
                extensions: vec![],
            }],
            history: vec![Message {
                message_id: "m".into(),
                context_id: None,
                task_id: None,
                role: Role::User,
                parts: vec![Part {
                    content: PartContent::Data(json!(5)),
                    metadata: None,
                    filename: None,
                    media_type: None,
                }],
                metadata: None,
                extensions: vec![],
                reference_task_ids: vec![],
            }],
            metadata: None,
        };
        let v = serde_json::to_value(V03(&task)).unwrap();
        assert_eq!(
            v,
            json!({"kind":"task","id":"t1","contextId":"c1","status":{"state":"canceled"},
                "artifacts":[{"artifactId":"a1","parts":[{"kind":"text","text":"hi"}]}],
                "history":[{"kind":"message","messageId":"m","role":"user",
                    "parts":[{"kind":"data","data":{"value":5},"metadata":{"data_part_compat":true}}]}]})
        );
    }
}

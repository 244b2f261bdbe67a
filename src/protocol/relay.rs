//! Answers relayed from an upstream agent that speaks the caller's dialect.
//!
//! Re-encoding such an answer through the canonical model costs a full parse and a full
//! render per call, and drops every field the model does not know (an extension's, say).
//! Instead the answer stays as the upstream wrote it and only what the gateway must change
//! is opened: the top-level fields of the task or message, its status message and history
//! (to namespace task ids and trim the history), and its metadata (to say who served it).

use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::ser::{Error as _, SerializeMap};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use super::model::Metadata;
use super::Dialect;

/// A JSON object whose fields are kept as written, except `metadata`, which is parsed so
/// that it can be added to.
#[derive(Debug, Clone, Default)]
pub struct RawObject {
    fields: Vec<(String, Box<RawValue>)>,
    pub metadata: Option<Metadata>,
}

impl RawObject {
    fn position(&self, key: &str) -> Option<usize> {
        self.fields.iter().position(|(k, _)| k == key)
    }

    /// A field read as `T`: `None` when absent or null, an error when it is not a `T`.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> serde_json::Result<Option<T>> {
        match self.position(key) {
            Some(i) => serde_json::from_str(self.fields[i].1.get()),
            None => Ok(None),
        }
    }

    /// A field that must be there, as `T`.
    fn require<T: DeserializeOwned>(&self, key: &'static str) -> Result<T, RelayError> {
        self.get(key)
            .ok()
            .flatten()
            .ok_or(RelayError::MissingField(key))
    }

    /// Refuses spellings the relay would not rewrite (the model reads snake_case too, so
    /// such an answer is left to the conversion path).
    fn refuse(&self, keys: &[&'static str]) -> Result<(), RelayError> {
        match keys.iter().find(|k| self.position(k).is_some()) {
            Some(k) => Err(RelayError::Spelling(k)),
            None => Ok(()),
        }
    }

    /// Replaces (or adds) a field.
    pub fn set<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> serde_json::Result<()> {
        let raw = serde_json::value::to_raw_value(value)?;
        match self.position(key) {
            Some(i) => self.fields[i].1 = raw,
            None => self.fields.push((key.to_string(), raw)),
        }
        Ok(())
    }

    /// Applies `edit` to the object in field `key`, if there is one; `edit` says whether it
    /// changed anything, and only then is the field written again.
    pub fn edit_object(
        &mut self,
        key: &str,
        edit: impl FnOnce(&mut RawObject) -> Result<bool, RelayError>,
    ) -> Result<bool, RelayError> {
        let Some(mut inner) = self.get::<RawObject>(key)? else {
            return Ok(false);
        };
        if !edit(&mut inner)? {
            return Ok(false);
        }
        self.set(key, &inner)?;
        Ok(true)
    }
}

impl PartialEq for RawObject {
    fn eq(&self, other: &Self) -> bool {
        self.metadata == other.metadata
            && self.fields.len() == other.fields.len()
            && self
                .fields
                .iter()
                .zip(&other.fields)
                .all(|((ka, va), (kb, vb))| ka == kb && va.get() == vb.get())
    }
}

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = RawObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawObject, A::Error> {
                let mut object = RawObject::default();
                while let Some(key) = map.next_key::<String>()? {
                    // Parsers disagree on which of two equal keys wins; the relay would
                    // rewrite one and let the other through.
                    if object.position(&key).is_some()
                        || (key == "metadata" && object.metadata.is_some())
                    {
                        return Err(serde::de::Error::custom(format!("duplicate key {key}")));
                    }
                    if key == "metadata" {
                        object.metadata = map.next_value()?;
                    } else {
                        let value: Box<RawValue> = map.next_value()?;
                        object.fields.push((key, value));
                    }
                }
                Ok(object)
            }
        }
        d.deserialize_map(ObjectVisitor)
    }
}

impl Serialize for RawObject {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (k, v) in &self.fields {
            map.serialize_entry(k, v)?;
        }
        if let Some(m) = &self.metadata {
            map.serialize_entry("metadata", m)?;
        }
        map.end()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayedKind {
    Task,
    Message,
}

/// A send result as the upstream wrote it, in `dialect`, which is also the caller's.
#[derive(Debug, Clone, PartialEq)]
pub struct Relayed {
    pub dialect: Dialect,
    pub kind: RelayedKind,
    pub object: RawObject,
    /// The task's (namespaced) id and its context, for the gateway's own records.
    pub task_id: Option<String>,
    pub context_id: Option<String>,
    /// Whether the task's status carries a message (with ids to rewrite).
    status_message: bool,
}

/// Why a result cannot be relayed as it is.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("answered a send with neither a task nor a message")]
    NoTaskOrMessage,
    #[error("sent a task without a valid {0}")]
    MissingField(&'static str),
    #[error("sent a result with a {0} field, which is relayed only in camelCase")]
    Spelling(&'static str),
    #[error("sent a malformed result: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// A 1.0 send result: the task or the message, wrapped.
#[derive(Deserialize)]
pub struct Wrapped {
    task: Option<RawObject>,
    message: Option<RawObject>,
}

/// What the relay checks of a task's status without opening it further.
#[derive(Deserialize)]
struct StatusProbe {
    #[allow(dead_code)] // read to check it is a string
    state: String,
    message: Option<serde::de::IgnoredAny>,
}

/// A task's status without its message.
#[derive(Deserialize)]
struct BareStatus {
    state: crate::protocol::model::TaskState,
    #[serde(default)]
    timestamp: Option<String>,
}

impl Relayed {
    /// The task's status without its message (None for a message, or one that does not
    /// read). Read again on request: most relayed results never need it.
    pub fn status(&self) -> Option<crate::protocol::model::TaskStatus> {
        if self.kind != RelayedKind::Task {
            return None;
        }
        let bare: BareStatus = self.object.get("status").ok()??;
        Some(crate::protocol::model::TaskStatus {
            state: bare.state,
            message: None,
            timestamp: bare
                .timestamp
                .as_deref()
                .and_then(crate::protocol::model::parse_timestamp),
        })
    }

    /// Opens a send result: 1.0 wraps it (`{"task":{…}}`), 0.3 tags it (`"kind":"task"`).
    /// The gateway reads results along with their envelope (`from_wrapped`/`from_tagged`).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn read(dialect: Dialect, result: &RawValue) -> Result<Relayed, RelayError> {
        match dialect {
            Dialect::V10 => Relayed::from_wrapped(serde_json::from_str(result.get())?),
            Dialect::V03 | Dialect::V01 => {
                Relayed::from_tagged(serde_json::from_str(result.get())?)
            }
        }
    }

    /// A 1.0 result, already read (for instance along with its JSON-RPC envelope).
    pub fn from_wrapped(w: Wrapped) -> Result<Relayed, RelayError> {
        match w {
            Wrapped { task: Some(t), .. } => Relayed::checked(Dialect::V10, RelayedKind::Task, t),
            Wrapped {
                message: Some(m), ..
            } => Relayed::checked(Dialect::V10, RelayedKind::Message, m),
            _ => Err(RelayError::NoTaskOrMessage),
        }
    }

    /// A 0.3 result, already read.
    pub fn from_tagged(object: RawObject) -> Result<Relayed, RelayError> {
        let kind = match object.get::<String>("kind")?.as_deref() {
            Some("task") => RelayedKind::Task,
            Some("message") => RelayedKind::Message,
            _ => return Err(RelayError::NoTaskOrMessage),
        };
        Relayed::checked(Dialect::V03, kind, object)
    }

    fn checked(
        dialect: Dialect,
        kind: RelayedKind,
        object: RawObject,
    ) -> Result<Relayed, RelayError> {
        object.refuse(&["context_id", "task_id", "reference_task_ids"])?;
        let mut relayed = Relayed {
            dialect,
            kind,
            task_id: None,
            context_id: None,
            status_message: false,
            object,
        };
        let object = &relayed.object;
        if kind == RelayedKind::Task {
            relayed.task_id = Some(object.require("id")?);
            relayed.context_id = Some(object.require("contextId")?);
            let status: StatusProbe = object.require("status")?;
            relayed.status_message = status.message.is_some();
        } else {
            relayed.context_id = object.get("contextId")?;
        }
        Ok(relayed)
    }

    /// Rewrites every task id the result carries with `map` (the task's own id, and the
    /// `taskId`/`referenceTaskIds` of its status message and history), and keeps the newest
    /// `history_length` history messages.
    pub fn rewrite(
        &mut self,
        map: &dyn Fn(&str) -> String,
        history_length: Option<usize>,
    ) -> Result<(), RelayError> {
        match self.kind {
            RelayedKind::Message => rewrite_message(&mut self.object, map).map(drop),
            RelayedKind::Task => {
                if let Some(id) = &self.task_id {
                    let id = map(id);
                    self.object.set("id", &id)?;
                    self.task_id = Some(id);
                }
                if self.status_message {
                    self.object.edit_object("status", |status| {
                        status.edit_object("message", |m| rewrite_message(m, map))
                    })?;
                }
                if let Some(mut history) = self.object.get::<Vec<RawObject>>("history")? {
                    let before = history.len();
                    if let Some(n) = history_length {
                        history.drain(..before.saturating_sub(n));
                    }
                    let mut changed = history.len() != before;
                    for m in &mut history {
                        changed |= rewrite_message(m, map)?;
                    }
                    if changed {
                        self.object.set("history", &history)?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// Whether the message named any task (and so was rewritten).
fn rewrite_message(m: &mut RawObject, map: &dyn Fn(&str) -> String) -> Result<bool, RelayError> {
    m.refuse(&["task_id", "reference_task_ids", "context_id"])?;
    let mut changed = false;
    if let Some(t) = m.get::<String>("taskId")? {
        m.set("taskId", &map(&t))?;
        changed = true;
    }
    if let Some(refs) = m.get::<Vec<String>>("referenceTaskIds")? {
        let refs: Vec<String> = refs.iter().map(|r| map(r)).collect();
        m.set("referenceTaskIds", &refs)?;
        changed = true;
    }
    Ok(changed)
}

impl Relayed {
    /// Writes the result for a caller speaking `dialect`, which must be the relayed one.
    pub fn serialize_as<S: Serializer>(&self, dialect: Dialect, s: S) -> Result<S::Ok, S::Error> {
        if dialect != self.dialect {
            return Err(S::Error::custom(
                "a relayed result rendered in the other dialect",
            ));
        }
        match dialect {
            Dialect::V03 | Dialect::V01 => self.object.serialize(s),
            Dialect::V10 => {
                let mut map = s.serialize_map(Some(1))?;
                let key = match self.kind {
                    RelayedKind::Task => "task",
                    RelayedKind::Message => "message",
                };
                map.serialize_entry(key, &self.object)?;
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(v: serde_json::Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&v).unwrap()
    }

    #[test]
    fn a_task_keeps_what_it_does_not_rewrite() {
        let result = raw(json!({"task": {
            "id": "t1", "contextId": "c1", "x-extension": {"keep": [1, 2]},
            "status": {"state": "TASK_STATE_COMPLETED",
                       "message": {"messageId": "a", "taskId": "t1", "role": "ROLE_AGENT", "parts": []}},
            "history": [
                {"messageId": "1", "taskId": "t1", "referenceTaskIds": ["t0"], "parts": []},
                {"messageId": "2", "taskId": "t1", "parts": []}
            ],
            "metadata": {"upstream": true}
        }}));
        let mut r = Relayed::read(Dialect::V10, &result).unwrap();
        r.rewrite(&|id| format!("agent.{id}"), Some(1)).unwrap();
        r.object
            .metadata
            .get_or_insert_with(Metadata::new)
            .insert("gateway/agent".into(), json!("agent"));
        let mut out = Vec::new();
        r.serialize_as(Dialect::V10, &mut serde_json::Serializer::new(&mut out))
            .unwrap();
        let out: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            out,
            json!({"task": {
                "id": "agent.t1", "contextId": "c1", "x-extension": {"keep": [1, 2]},
                "status": {"state": "TASK_STATE_COMPLETED",
                           "message": {"messageId": "a", "taskId": "agent.t1", "role": "ROLE_AGENT", "parts": []}},
                "history": [{"messageId": "2", "taskId": "agent.t1", "parts": []}],
                "metadata": {"upstream": true, "gateway/agent": "agent"}
            }})
        );
        assert_eq!(r.task_id.as_deref(), Some("agent.t1"));
        assert_eq!(r.context_id.as_deref(), Some("c1"));
    }

    #[test]
    fn a_0_3_message_is_tagged_and_malformed_results_are_refused() {
        let m = raw(json!({"kind": "message", "messageId": "m", "contextId": "c", "parts": []}));
        let r = Relayed::read(Dialect::V03, &m).unwrap();
        assert_eq!(
            (r.kind, r.context_id.as_deref()),
            (RelayedKind::Message, Some("c"))
        );
        assert!(r
            .serialize_as(Dialect::V10, serde_json::value::Serializer)
            .is_err());

        let ok = json!({"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}});
        let with = |extra: serde_json::Value| {
            let mut t = ok.clone();
            t.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            json!({ "task": t })
        };
        let rewritten = |v: serde_json::Value| {
            Relayed::read(Dialect::V10, &raw(v)).and_then(|mut r| r.rewrite(&|i| i.into(), Some(1)))
        };
        assert!(rewritten(with(json!({}))).is_ok());
        for (dialect, bad) in [
            (Dialect::V10, json!({"status": "ok"})),
            (
                Dialect::V10,
                json!({"task": {"contextId": "c", "status": {"state": "x"}}}),
            ),
            (
                Dialect::V10,
                json!({"task": {"id": 7, "contextId": "c", "status": {"state": "x"}}}),
            ),
            (Dialect::V10, json!({"task": {"id": "t", "contextId": "c"}})),
            (
                Dialect::V10,
                json!({"task": {"id": "t", "contextId": "c", "status": {}}}),
            ),
            (Dialect::V10, with(json!({"context_id": "c"}))),
            (
                Dialect::V03,
                json!({"id": "t", "contextId": "c", "status": {"state": "working"}}),
            ),
            (Dialect::V10, json!([1, 2])),
        ] {
            assert!(Relayed::read(dialect, &raw(bad.clone())).is_err(), "{bad}");
        }
        // Present but not what the relay rewrites: refused, so the caller never gets an id
        // the gateway did not namespace.
        for bad in [
            with(json!({"history": [{"messageId": "1", "taskId": "t"}, 5]})),
            with(json!({"history": [{"messageId": "1", "taskId": 5}]})),
            with(json!({"history": [{"messageId": "1", "task_id": "t"}]})),
            with(json!({"status": {"state": "x", "message": "not an object"}})),
        ] {
            assert!(rewritten(bad.clone()).is_err(), "{bad}");
        }
        let duplicate = RawValue::from_string(
            r#"{"task": {"id": "t", "id": "u", "contextId": "c", "status": {"state": "x"}}}"#
                .into(),
        )
        .unwrap();
        assert!(Relayed::read(Dialect::V10, &duplicate).is_err());
    }
}

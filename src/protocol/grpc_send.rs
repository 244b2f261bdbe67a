//! The common gRPC send without the descriptor: a `SendMessageRequest` carrying a text
//! message for a named agent, read straight into the model, and the task it is answered
//! with (or a stream's items, or a task read or canceled), written straight as a
//! `SendMessageResponse` (or `StreamResponse`s, or a `Task`).
//!
//! Why a second way beside the descriptor's: a gRPC send otherwise crosses ProtoJSON twice
//! (protobuf → dynamic message → JSON params, and the JSON answer → JSON values →
//! protobuf), which cost more than the rest of the call (callgrind: the answer's crossing
//! alone 84k instructions of a 157k call). Like the JSON-RPC common-send reader, this one
//! takes only what it reads exactly as the descriptor's way would, and gives None for
//! anything else (a field it does not know, one given twice, a required one missing, text
//! that is not UTF-8), which then goes the descriptor's way and gets its answer. The tests
//! hold both ways to the same messages.

use prost::encoding::{decode_varint, encode_key, encode_varint, encoded_len_varint, WireType};
use serde_json::Value;

use super::model::{
    Artifact, Message, Metadata, Part, PartContent, Role, Stamp, StreamItem, Task, TaskState,
    TaskStatus,
};
use super::params::{SendConfiguration, SendParams};

/// A send of the common shape: the agent its `tenant` names, and its params. None for a
/// send without a tenant (routed by its params on the shared endpoint) or of another shape.
pub(crate) fn read_send(bytes: &[u8]) -> Option<(String, Box<SendParams>)> {
    let (mut tenant, mut message, mut configuration) = (None, None, None);
    Fields(bytes).each(|number, field| match number {
        1 => once(&mut tenant, field.text()),
        2 => once(&mut message, self::message(field.bytes()?)),
        3 => once(&mut configuration, self::configuration(field.bytes()?)),
        _ => None,
    })?;
    let tenant = tenant.filter(|t: &String| !t.is_empty())?;
    let params = SendParams {
        message: message?,
        configuration,
        metadata: None,
        session_id: None,
    };
    Some((tenant, Box::new(params)))
}

fn message(bytes: &[u8]) -> Option<Message> {
    let (mut message_id, mut context_id, mut task_id, mut role) = (None, None, None, None);
    let mut parts = Vec::new();
    Fields(bytes).each(|number, field| match number {
        1 => once(&mut message_id, field.text()),
        2 => once(&mut context_id, field.text()),
        3 => once(&mut task_id, field.text()),
        4 => once(
            &mut role,
            match field.varint()? {
                1 => Some(Role::User),
                2 => Some(Role::Agent),
                _ => None,
            },
        ),
        5 => {
            parts.push(text_part(field.bytes()?)?);
            Some(())
        }
        _ => None,
    })?;
    // What ProtoJSON leaves out for being empty is missing to the params' reader: an id,
    // a role or parts missing is its error to give; empty ids are no ids.
    let message_id = message_id.filter(|id: &String| !id.is_empty())?;
    if parts.is_empty() {
        return None;
    }
    Some(Message {
        message_id,
        context_id: context_id.filter(|id: &String| !id.is_empty()),
        task_id: task_id.filter(|id: &String| !id.is_empty()),
        role: role?,
        parts,
        metadata: None,
        extensions: Vec::new(),
        reference_task_ids: Vec::new(),
    })
}

fn text_part(bytes: &[u8]) -> Option<Part> {
    let mut text = None;
    Fields(bytes).each(|number, field| match number {
        1 => once(&mut text, field.text()),
        _ => None,
    })?;
    Some(Part::text(text?))
}

fn configuration(bytes: &[u8]) -> Option<SendConfiguration> {
    let mut configuration = SendConfiguration::default();
    let (mut history_length, mut immediately) = (None, None);
    Fields(bytes).each(|number, field| match number {
        1 => {
            configuration.accepted_output_modes.push(field.text()?);
            Some(())
        }
        // An int32: a negative one is sign-extended to ten bytes.
        3 => once(&mut history_length, field.varint().map(|n| n as i32 as i64)),
        4 => once(&mut immediately, field.varint().map(|n| n != 0)),
        _ => None,
    })?;
    configuration.history_length = history_length;
    // A bool without presence: false is not written, and reads as not given.
    configuration.return_immediately = immediately.filter(|given| *given);
    Some(configuration)
}

/// Fills `slot` with `value`, unless it is filled already: protobuf merges a field given
/// twice, which is the descriptor's reader's to do. None then, or when there is no value.
fn once<T>(slot: &mut Option<T>, value: Option<T>) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value?);
    Some(())
}

/// A message's fields, in the order they come.
struct Fields<'a>(&'a [u8]);

/// One field's value, as its wire type carries it.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

impl<'a> Field<'a> {
    fn varint(&self) -> Option<u64> {
        match self {
            Field::Varint(n) => Some(*n),
            Field::Bytes(_) => None,
        }
    }

    fn bytes(&self) -> Option<&'a [u8]> {
        match self {
            Field::Bytes(b) => Some(b),
            Field::Varint(_) => None,
        }
    }

    fn text(&self) -> Option<String> {
        std::str::from_utf8(self.bytes()?).ok().map(str::to_owned)
    }
}

impl<'a> Fields<'a> {
    /// Calls `each` with every field; None when a field is not varint or length-delimited
    /// or is cut short, or when `each` says None.
    fn each(self, mut each: impl FnMut(u32, Field<'a>) -> Option<()>) -> Option<()> {
        let mut rest = self.0;
        while !rest.is_empty() {
            let key = decode_varint(&mut rest).ok()?;
            let number = u32::try_from(key >> 3).ok()?;
            let field = match key & 7 {
                0 => Field::Varint(decode_varint(&mut rest).ok()?),
                2 => {
                    let len = usize::try_from(decode_varint(&mut rest).ok()?).ok()?;
                    let (value, after) = rest.split_at_checked(len)?;
                    rest = after;
                    Field::Bytes(value)
                }
                _ => return None,
            };
            each(number, field)?;
        }
        Some(())
    }
}

/// `SendMessageResponse { task }` for `task`, with `stamp` on its metadata. None when the
/// task holds what the descriptor's way must judge (a timestamp protobuf cannot hold,
/// bytes that are not base64): that way then writes or refuses it.
pub(crate) fn task_answer(task: &Task, stamp: Stamp<'_>) -> Option<Vec<u8>> {
    let mut w = Writer(Vec::with_capacity(512));
    w.nested(1, |w| w.task(task, stamp))?;
    Some(w.0)
}

/// A task as the `Task` message (`GetTask`'s and `CancelTask`'s answer); None as for
/// [`task_answer`].
pub(crate) fn task(task: &Task) -> Option<Vec<u8>> {
    let mut w = Writer(Vec::with_capacity(512));
    w.task(task, Stamp::NONE)?;
    Some(w.0)
}

/// A stream's item as a `StreamResponse`; None as for [`task_answer`].
pub(crate) fn stream_item(item: &StreamItem) -> Option<Vec<u8>> {
    let mut w = Writer(Vec::with_capacity(256));
    match item {
        StreamItem::Task(task) => w.nested(1, |w| w.task(task, Stamp::NONE))?,
        StreamItem::Message(message) => w.nested(2, |w| w.message(message))?,
        StreamItem::StatusUpdate(update) => w.nested(3, |w| {
            w.string(1, &update.task_id);
            w.string(2, &update.context_id);
            w.nested(3, |w| w.status(&update.status))?;
            w.metadata(4, update.metadata.as_ref())
        })?,
        StreamItem::ArtifactUpdate(update) => w.nested(4, |w| {
            w.string(1, &update.task_id);
            w.string(2, &update.context_id);
            w.nested(3, |w| w.artifact(&update.artifact))?;
            if update.append {
                w.varint(4, 1);
            }
            if update.last_chunk {
                w.varint(5, 1);
            }
            w.metadata(6, update.metadata.as_ref())
        })?,
    }
    Some(w.0)
}

/// Protobuf written into one buffer; a nested message is written in place, its length
/// put in front of it once it is known.
struct Writer(Vec<u8>);

impl Writer {
    fn nested(&mut self, number: u32, body: impl FnOnce(&mut Self) -> Option<()>) -> Option<()> {
        encode_key(number, WireType::LengthDelimited, &mut self.0);
        let at = self.0.len();
        self.0.push(0);
        body(self)?;
        let len = self.0.len() - at - 1;
        match u8::try_from(len).ok().filter(|n| *n < 0x80) {
            Some(short) => self.0[at] = short,
            None => {
                // Every answer's task is longer than 127 bytes: its prefix is made on the
                // stack and the body moved along by what the one byte left short.
                let mut prefix = [0u8; 10];
                let used = encoded_len_varint(len as u64);
                encode_varint(len as u64, &mut &mut prefix[..]);
                self.0.splice(at..at + 1, prefix[..used].iter().copied());
            }
        }
        Some(())
    }

    fn varint(&mut self, number: u32, n: u64) {
        encode_key(number, WireType::Varint, &mut self.0);
        encode_varint(n, &mut self.0);
    }

    fn bytes(&mut self, number: u32, bytes: &[u8]) {
        encode_key(number, WireType::LengthDelimited, &mut self.0);
        encode_varint(bytes.len() as u64, &mut self.0);
        self.0.extend_from_slice(bytes);
    }

    /// A string field without presence: not written when empty, as encoders do.
    fn string(&mut self, number: u32, s: &str) {
        if !s.is_empty() {
            self.bytes(number, s.as_bytes());
        }
    }

    fn opt_string(&mut self, number: u32, s: Option<&String>) {
        if let Some(s) = s {
            self.string(number, s);
        }
    }

    fn strings(&mut self, number: u32, items: &[String]) {
        for s in items {
            self.bytes(number, s.as_bytes());
        }
    }

    fn task(&mut self, t: &Task, stamp: Stamp<'_>) -> Option<()> {
        self.string(1, &t.id);
        self.string(2, &t.context_id);
        self.nested(3, |w| w.status(&t.status))?;
        for artifact in &t.artifacts {
            self.nested(4, |w| w.artifact(artifact))?;
        }
        for message in &t.history {
            self.nested(5, |w| w.message(message))?;
        }
        if let Some(md) = stamp.metadata(t.metadata.as_ref()) {
            self.nested(6, |w| {
                for (key, value) in md.own() {
                    w.entry(key, |w| w.value(value))?;
                }
                for (key, value) in md.stamp().entries() {
                    w.entry(key, |w| {
                        w.bytes(3, value.as_bytes());
                        Some(())
                    })?;
                }
                Some(())
            })?;
        }
        Some(())
    }

    fn status(&mut self, s: &TaskStatus) -> Option<()> {
        let state = state_number(s.state);
        if state != 0 {
            self.varint(1, state);
        }
        if let Some(m) = &s.message {
            self.nested(2, |w| w.message(m))?;
        }
        if let Some(ts) = &s.timestamp {
            use chrono::Datelike;
            // Timestamp holds years 1 to 9999, and no leap second; answers carry
            // milliseconds, as the JSON bindings write them.
            let nanos = ts.timestamp_subsec_nanos();
            if !(1..=9999).contains(&ts.year()) || nanos >= 1_000_000_000 {
                return None;
            }
            let (seconds, nanos) = (ts.timestamp(), nanos / 1_000_000 * 1_000_000);
            self.nested(3, |w| {
                if seconds != 0 {
                    w.varint(1, seconds as u64);
                }
                if nanos != 0 {
                    w.varint(2, u64::from(nanos));
                }
                Some(())
            })?;
        }
        Some(())
    }

    fn message(&mut self, m: &Message) -> Option<()> {
        self.string(1, &m.message_id);
        self.opt_string(2, m.context_id.as_ref());
        self.opt_string(3, m.task_id.as_ref());
        let role = match m.role {
            Role::Unspecified => 0,
            Role::User => 1,
            Role::Agent => 2,
        };
        if role != 0 {
            self.varint(4, role);
        }
        for part in &m.parts {
            self.nested(5, |w| w.part(part))?;
        }
        self.metadata(6, m.metadata.as_ref())?;
        self.strings(7, &m.extensions);
        self.strings(8, &m.reference_task_ids);
        Some(())
    }

    fn artifact(&mut self, a: &Artifact) -> Option<()> {
        self.string(1, &a.artifact_id);
        self.opt_string(2, a.name.as_ref());
        self.opt_string(3, a.description.as_ref());
        for part in &a.parts {
            self.nested(4, |w| w.part(part))?;
        }
        self.metadata(5, a.metadata.as_ref())?;
        self.strings(6, &a.extensions);
        Some(())
    }

    fn part(&mut self, p: &Part) -> Option<()> {
        // The content is a oneof: written even when empty.
        match &p.content {
            PartContent::Text(t) => self.bytes(1, t.as_bytes()),
            PartContent::Raw(b) => self.bytes(2, &super::protojson::base64_bytes(b).ok()?),
            PartContent::Url(u) => self.bytes(3, u.as_bytes()),
            PartContent::Data(v) => self.nested(4, |w| w.value(v))?,
        }
        self.metadata(5, p.metadata.as_ref())?;
        self.opt_string(6, p.filename.as_ref());
        self.opt_string(7, p.media_type.as_ref());
        Some(())
    }

    /// A `google.protobuf.Struct` field, when there is one.
    fn metadata(&mut self, number: u32, md: Option<&Metadata>) -> Option<()> {
        match md {
            Some(md) => self.nested(number, |w| w.fields(md)),
            None => Some(()),
        }
    }

    /// A `Struct`'s entries.
    fn fields(&mut self, md: &Metadata) -> Option<()> {
        for (key, value) in md {
            self.entry(key, |w| w.value(value))?;
        }
        Some(())
    }

    /// One entry of a `Struct`'s map: its key, and the `Value` `value` writes.
    fn entry(&mut self, key: &str, value: impl FnOnce(&mut Self) -> Option<()>) -> Option<()> {
        self.nested(1, |w| {
            w.bytes(1, key.as_bytes());
            w.nested(2, value)
        })
    }

    /// A `google.protobuf.Value`'s one field.
    fn value(&mut self, v: &Value) -> Option<()> {
        match v {
            Value::Null => self.varint(1, 0),
            Value::Number(n) => {
                encode_key(2, WireType::SixtyFourBit, &mut self.0);
                self.0.extend_from_slice(&n.as_f64()?.to_le_bytes());
            }
            Value::String(s) => self.bytes(3, s.as_bytes()),
            Value::Bool(b) => self.varint(4, u64::from(*b)),
            Value::Object(md) => self.nested(5, |w| w.fields(md))?,
            Value::Array(items) => self.nested(6, |w| {
                for item in items {
                    w.nested(1, |w| w.value(item))?;
                }
                Some(())
            })?,
        }
        Some(())
    }
}

/// `lf.a2a.v1.TaskState`'s number for a state (the tests check them against the proto).
fn state_number(state: TaskState) -> u64 {
    match state {
        TaskState::Unspecified => 0,
        TaskState::Submitted => 1,
        TaskState::Working => 2,
        TaskState::Completed => 3,
        TaskState::Failed => 4,
        TaskState::Canceled => 5,
        TaskState::InputRequired => 6,
        TaskState::Rejected => 7,
        TaskState::AuthRequired => 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::grpc::{decode, encode_json, json_to_bytes, rpc_of, take_tenant};
    use crate::protocol::jsonrpc::{Method, RpcId};
    use crate::protocol::model::Stamp;
    use crate::protocol::{params, Dialect};
    use prost::Message as _;
    use prost_reflect::DynamicMessage;

    fn send() -> &'static crate::protocol::grpc::Rpc {
        rpc_of(Method::SendMessage, Dialect::V10).unwrap()
    }

    /// The answer the descriptor's way writes: the JSON task answer, its result as protobuf.
    fn by_descriptor(task: &Task, stamp: Stamp<'_>) -> Result<Vec<u8>, String> {
        let body = crate::protocol::write::task_answer(&RpcId::NULL, task, stamp).unwrap();
        let answer: Value = serde_json::from_slice(&body).unwrap();
        json_to_bytes(&answer["result"].to_string(), &send().output).map(|b| b.to_vec())
    }

    fn task_message() -> prost_reflect::MessageDescriptor {
        rpc_of(Method::GetTask, Dialect::V10)
            .unwrap()
            .output
            .clone()
    }

    fn read_back(bytes: &[u8]) -> DynamicMessage {
        DynamicMessage::decode(send().output.clone(), bytes).unwrap()
    }

    #[test]
    fn answers_read_back_as_the_descriptors_way_writes_them() {
        let stamps = [
            Stamp::NONE,
            Stamp::new(("gateway/agent", "echo"), None),
            Stamp::new(("gateway/agent", "e\"cho"), Some(("gateway/route", "r"))),
            Stamp::new(("n", "overrides the task's own n"), None),
        ];
        let mut written = 0;
        let mut tasks = crate::protocol::write::tests::tasks();
        let mut noted = tasks[0].clone();
        noted.metadata = serde_json::json!({"n": 1, "k": [1.5, {"x": null}, -2, "s"]})
            .as_object()
            .cloned();
        tasks.push(noted);
        for task in tasks {
            for stamp in stamps {
                let expected = by_descriptor(&task, stamp);
                match task_answer(&task, stamp) {
                    Some(direct) => {
                        let expected = expected.unwrap_or_else(|e| panic!("{e}: {task:?}"));
                        assert_eq!(read_back(&direct), read_back(&expected), "{task:?}");
                        written += 1;
                        // The same task alone, as GetTask answers it.
                        if stamp.entries().next().is_none() {
                            let alone = DynamicMessage::decode(
                                task_message(),
                                &*self::task(&task).unwrap(),
                            )
                            .unwrap();
                            let wrapped = read_back(&direct);
                            let inner = wrapped.get_field_by_name("task").unwrap();
                            assert_eq!(inner.as_message(), Some(&alone), "{task:?}");
                        }
                    }
                    // Only what protobuf cannot hold is left to the descriptor's way.
                    None => {
                        let ts = task.status.timestamp.unwrap();
                        assert!(
                            ts.timestamp_subsec_nanos() >= 1_000_000_000
                                || ts.timestamp() > 253_402_300_799,
                            "{task:?}"
                        );
                    }
                }
            }
        }
        assert!(written >= 30, "{written}");
        // Every state by its number in the proto.
        let state = crate::protocol::grpc::rpc_of(Method::GetTask, Dialect::V10)
            .unwrap()
            .output
            .get_field_by_name("status")
            .unwrap();
        let prost_reflect::Kind::Message(status) = state.kind() else {
            panic!("status is a message")
        };
        let prost_reflect::Kind::Enum(states) = status.get_field_by_name("state").unwrap().kind()
        else {
            panic!("state is an enum")
        };
        for value in states.values() {
            let state = TaskState::from_v10_name(value.name()).unwrap();
            assert_eq!(state_number(state), value.number() as u64);
        }
    }

    #[test]
    fn stream_items_read_back_as_the_descriptors_way_writes_them() {
        use crate::protocol::model::{TaskArtifactUpdateEvent, TaskStatusUpdateEvent};
        let output = rpc_of(Method::SendStreamingMessage, Dialect::V10)
            .unwrap()
            .output
            .clone();
        let mut items = Vec::new();
        for task in crate::protocol::write::tests::tasks() {
            let metadata = serde_json::json!({"k": [1, "v"]}).as_object().cloned();
            items.push(StreamItem::StatusUpdate(TaskStatusUpdateEvent {
                task_id: task.id.clone(),
                context_id: task.context_id.clone(),
                status: task.status.clone(),
                metadata: metadata.clone(),
            }));
            for (i, artifact) in task.artifacts.iter().enumerate() {
                items.push(StreamItem::ArtifactUpdate(TaskArtifactUpdateEvent {
                    task_id: task.id.clone(),
                    context_id: String::new(),
                    artifact: artifact.clone(),
                    append: i % 2 == 1,
                    last_chunk: i % 2 == 0,
                    metadata: metadata.clone().filter(|_| i == 0),
                }));
            }
            items.extend(task.history.iter().cloned().map(StreamItem::Message));
            items.push(StreamItem::Task(task));
        }
        let mut written = 0;
        for item in &items {
            let json = serde_json::to_string(item).unwrap();
            let expected = json_to_bytes(&json, &output);
            let read = |bytes: &[u8]| DynamicMessage::decode(output.clone(), bytes).unwrap();
            match stream_item(item) {
                Some(direct) => {
                    let expected = expected.unwrap_or_else(|e| panic!("{e}: {json}"));
                    assert_eq!(read(&direct), read(&expected), "{json}");
                    written += 1;
                }
                None => assert!(json.contains(":60.") || json.contains("+"), "{json}"),
            }
        }
        assert!(written >= 20, "{written}");
    }

    #[test]
    fn bytes_that_are_not_base64_go_the_descriptors_way() {
        let mut task = crate::protocol::write::tests::tasks().remove(0);
        task.artifacts.push(Artifact {
            artifact_id: "a".into(),
            name: None,
            description: None,
            parts: vec![Part {
                content: PartContent::Raw("not base64!".into()),
                metadata: None,
                filename: None,
                media_type: None,
            }],
            metadata: None,
            extensions: Vec::new(),
        });
        assert!(task_answer(&task, Stamp::NONE).is_none());
        assert!(by_descriptor(&task, Stamp::NONE).is_err());
    }

    /// What the descriptor's way makes of a request: its tenant and its params as the
    /// params' reader reads the ProtoJSON.
    fn by_descriptor_read(bytes: &[u8]) -> (Option<String>, Result<SendParams, String>) {
        let mut message = decode(bytes::Bytes::copy_from_slice(bytes), &send().input).unwrap();
        let tenant = take_tenant(&mut message);
        let raw = serde_json::value::to_raw_value(&message).unwrap();
        let params = params::decode::<SendParams>(Some(&raw)).map_err(|e| e.to_string());
        (tenant, params)
    }

    fn request(json: &str) -> Vec<u8> {
        encode_json(json, &send().input).unwrap().encode_to_vec()
    }

    #[test]
    fn common_sends_read_as_the_descriptors_way_reads_them() {
        let common = [
            r#"{"tenant":"echo","message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"hello"}]}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","contextId":"c","taskId":"t","role":"ROLE_AGENT","parts":[{"text":""},{"text":"☃ \"x\"\n"}]}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"a"}]},"configuration":{}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"a"}]},"configuration":{"acceptedOutputModes":["text/plain",""],"historyLength":0,"returnImmediately":true}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"a"}]},"configuration":{"historyLength":-3,"returnImmediately":false}}"#,
        ];
        for json in common {
            let bytes = request(json);
            let (tenant, params) = read_send(&bytes).unwrap_or_else(|| panic!("{json}"));
            let (expected_tenant, expected) = by_descriptor_read(&bytes);
            assert_eq!(Some(tenant), expected_tenant, "{json}");
            assert_eq!(
                format!("{params:?}"),
                format!("{:?}", expected.unwrap()),
                "{json}"
            );
        }
        // Anything else is the descriptor's way's to read, or to refuse.
        let other = [
            r#"{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"a"}]}}"#,
            r#"{"tenant":"e","message":{"messageId":"","role":"ROLE_USER","parts":[{"text":"a"}]}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","parts":[{"text":"a"}]}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","role":"ROLE_USER"}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","role":"ROLE_USER","parts":[{"url":"u"}]}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"a","mediaType":"text/plain"}]}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"a"}],"metadata":{"k":1}}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"a"}],"extensions":["x"]}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"a"}]},"metadata":{"k":1}}"#,
            r#"{"tenant":"e","message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"a"}]},"configuration":{"taskPushNotificationConfig":{"url":"u"}}}"#,
            r#"{"tenant":"e"}"#,
        ];
        for json in other {
            assert!(read_send(&request(json)).is_none(), "{json}");
        }
        // Bytes no encoder writes: a field given twice, text that is not UTF-8, cut short,
        // a wire type the message does not use there.
        let good = request(common[0]);
        let twice = [good.clone(), good.clone()].concat();
        assert!(read_send(&twice).is_none());
        let mut bad_utf8 = good.clone();
        let at = bad_utf8.windows(5).position(|w| w == b"hello").unwrap();
        bad_utf8[at] = 0xff;
        assert!(read_send(&bad_utf8).is_none());
        assert!(read_send(&good[..good.len() - 1]).is_none());
        assert!(read_send(&[0x0d, 0, 0, 0, 0]).is_none());
    }
}

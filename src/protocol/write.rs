//! The 1.0 JSON-RPC answer carrying a task, written straight into bytes.
//!
//! serde_json scans every key and string for characters to escape and writes each token
//! with its own call into the buffer; for a task answer that was the largest share of the
//! gateway's own work per request. This writer copies the fixed parts (keys with their
//! punctuation) in one go and strings that need no escaping as they are. Whatever needs
//! more care (escapes, metadata values, data parts, timestamps chrono must write) goes
//! through serde_json, so the bytes are exactly those `Serialize` gives; the tests hold
//! the two to that over every field.

use serde::Serialize;

use super::jsonrpc::RESULT_CAPACITY;
use super::model::{
    format_timestamp, rfc3339_millis, Artifact, Message, Metadata, Part, PartContent, Stamp, Task,
    TaskStatus,
};

/// `{"jsonrpc":"2.0","id":…,"result":{"task":…}}` for `task`, with `stamp` on its metadata.
pub fn task_answer(
    id: &super::jsonrpc::RpcId,
    task: &Task,
    stamp: Stamp<'_>,
) -> serde_json::Result<Vec<u8>> {
    task_answer_marked(id, task, stamp).map(|(answer, _)| answer)
}

/// [`task_answer`], and for a task with no metadata of its own, where in it the task's
/// fields are up to its metadata (the stamp's): see [`task_from_answer`].
pub fn task_answer_marked(
    id: &super::jsonrpc::RpcId,
    task: &Task,
    stamp: Stamp<'_>,
) -> serde_json::Result<(Vec<u8>, Option<std::ops::Range<usize>>)> {
    let mut w = Writer(Vec::with_capacity(RESULT_CAPACITY));
    w.raw(b"{\"jsonrpc\":\"2.0\",\"id\":");
    w.serde(id)?;
    w.raw(b",\"result\":{\"task\":");
    let start = w.0.len();
    let fields_end = w.task_marked(task, stamp)?;
    w.raw(b"}}");
    let unstamped = task.metadata.is_none().then_some(start..fields_end);
    Ok((w.0, unstamped))
}

/// The task as [`task`] writes it, from an answer and the fields [`task_answer_marked`]
/// marked in it: those fields, closed (the stamp left out).
pub fn task_from_answer(answer: &[u8], fields: std::ops::Range<usize>) -> Option<Box<[u8]>> {
    Some([answer.get(fields)?, b"}"].concat().into_boxed_slice())
}

/// `task` as its `Serialize` writes it (a store's snapshot of it), written directly.
pub fn task(task: &Task) -> serde_json::Result<Vec<u8>> {
    let mut w = Writer(Vec::with_capacity(RESULT_CAPACITY));
    w.task(task, Stamp::NONE)?;
    Ok(w.0)
}

/// The 1.0 `SendMessage` (or `SendStreamingMessage`) request an upstream gets, as serde
/// writes it: `{"jsonrpc":"2.0","id":…,"method":…,"params":{"message":…,
/// "configuration":{…},"metadata":…}}`, configuration fields only when set.
pub fn send_request(
    id: u64,
    streaming: bool,
    message: &Message,
    accepted_output_modes: &[String],
    history_length: Option<usize>,
    return_immediately: bool,
    metadata: Option<&Metadata>,
) -> serde_json::Result<Vec<u8>> {
    let mut w = Writer(Vec::with_capacity(RESULT_CAPACITY));
    w.raw(b"{\"jsonrpc\":\"2.0\",\"id\":");
    w.raw(id.to_string().as_bytes());
    w.raw(match streaming {
        true => b",\"method\":\"SendStreamingMessage\",\"params\":{\"message\":",
        false => b",\"method\":\"SendMessage\",\"params\":{\"message\":",
    });
    w.message(message)?;
    w.raw(b",\"configuration\":{");
    let mut first = true;
    let mut field = |w: &mut Writer, key: &[u8]| {
        if !std::mem::take(&mut first) {
            w.0.push(b',');
        }
        w.raw(key);
    };
    if !accepted_output_modes.is_empty() {
        field(&mut w, b"\"acceptedOutputModes\":");
        w.serde(accepted_output_modes)?;
    }
    if let Some(n) = history_length {
        field(&mut w, b"\"historyLength\":");
        w.raw(n.to_string().as_bytes());
    }
    if return_immediately {
        field(&mut w, b"\"returnImmediately\":true");
    }
    w.0.push(b'}');
    w.metadata(metadata)?;
    w.raw(b"}}");
    Ok(w.0)
}

/// Whether JSON needs any of these bytes escaped (a control character, `"` or a backslash).
fn needs_escape(bytes: &[u8]) -> bool {
    super::scan::next_special(bytes, 0).is_some()
}

struct Writer(Vec<u8>);

impl Writer {
    fn raw(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    fn serde<T: Serialize + ?Sized>(&mut self, value: &T) -> serde_json::Result<()> {
        serde_json::to_writer(&mut self.0, value)
    }

    /// A JSON string: copied as is unless something in it must be escaped.
    fn str(&mut self, s: &str) -> serde_json::Result<()> {
        if needs_escape(s.as_bytes()) {
            return self.serde(s);
        }
        self.0.reserve(s.len() + 2);
        self.0.push(b'"');
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(b'"');
        Ok(())
    }

    /// `,"key":"value"` when there is a value.
    fn opt_str(&mut self, key: &[u8], value: Option<&String>) -> serde_json::Result<()> {
        if let Some(v) = value {
            self.raw(key);
            self.str(v)?;
        }
        Ok(())
    }

    /// `,"metadata":{...}` when there is any.
    fn metadata(&mut self, md: Option<&Metadata>) -> serde_json::Result<()> {
        if let Some(md) = md {
            self.raw(b",\"metadata\":");
            self.serde(md)?;
        }
        Ok(())
    }

    fn strs(&mut self, key: &[u8], values: &[String]) -> serde_json::Result<()> {
        if !values.is_empty() {
            self.raw(key);
            self.serde(values)?;
        }
        Ok(())
    }

    fn seq<T>(
        &mut self,
        items: &[T],
        mut each: impl FnMut(&mut Self, &T) -> serde_json::Result<()>,
    ) -> serde_json::Result<()> {
        self.0.push(b'[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.0.push(b',');
            }
            each(self, item)?;
        }
        self.0.push(b']');
        Ok(())
    }

    fn task(&mut self, t: &Task, stamp: Stamp<'_>) -> serde_json::Result<()> {
        self.task_marked(t, stamp).map(|_| ())
    }

    /// [`Self::task`]; returns where its fields before the metadata end.
    fn task_marked(&mut self, t: &Task, stamp: Stamp<'_>) -> serde_json::Result<usize> {
        self.raw(b"{\"id\":");
        self.str(&t.id)?;
        self.raw(b",\"contextId\":");
        self.str(&t.context_id)?;
        self.raw(b",\"status\":");
        self.status(&t.status)?;
        if !t.artifacts.is_empty() {
            self.raw(b",\"artifacts\":");
            self.seq(&t.artifacts, Self::artifact)?;
        }
        if !t.history.is_empty() {
            self.raw(b",\"history\":");
            self.seq(&t.history, Self::message)?;
        }
        let fields_end = self.0.len();
        match (t.metadata.as_ref(), stamp.metadata(t.metadata.as_ref())) {
            // The usual case, the gateway's own note alone, needs no map machinery.
            (None, Some(_)) => {
                self.raw(b",\"metadata\":{");
                for (i, (key, value)) in stamp.entries().enumerate() {
                    if i > 0 {
                        self.0.push(b',');
                    }
                    self.str(key)?;
                    self.0.push(b':');
                    self.str(value)?;
                }
                self.0.push(b'}');
            }
            (_, Some(md)) => {
                self.raw(b",\"metadata\":");
                self.serde(&md)?;
            }
            (_, None) => {}
        }
        self.0.push(b'}');
        Ok(fields_end)
    }

    fn status(&mut self, s: &TaskStatus) -> serde_json::Result<()> {
        self.raw(b"{\"state\":\"");
        self.raw(s.state.v10_name().as_bytes());
        self.0.push(b'"');
        if let Some(m) = &s.message {
            self.raw(b",\"message\":");
            self.message(m)?;
        }
        if let Some(ts) = &s.timestamp {
            self.raw(b",\"timestamp\":");
            match rfc3339_millis(ts) {
                Some(ascii) => {
                    self.0.push(b'"');
                    self.raw(&ascii);
                    self.0.push(b'"');
                }
                None => self.str(&format_timestamp(ts))?,
            }
        }
        self.0.push(b'}');
        Ok(())
    }

    fn message(&mut self, m: &Message) -> serde_json::Result<()> {
        self.raw(b"{\"messageId\":");
        self.str(&m.message_id)?;
        self.opt_str(b",\"contextId\":", m.context_id.as_ref())?;
        self.opt_str(b",\"taskId\":", m.task_id.as_ref())?;
        self.raw(b",\"role\":\"");
        self.raw(m.role.v10_name().as_bytes());
        self.raw(b"\",\"parts\":");
        self.seq(&m.parts, Self::part)?;
        self.metadata(m.metadata.as_ref())?;
        self.strs(b",\"extensions\":", &m.extensions)?;
        self.strs(b",\"referenceTaskIds\":", &m.reference_task_ids)?;
        self.0.push(b'}');
        Ok(())
    }

    fn artifact(&mut self, a: &Artifact) -> serde_json::Result<()> {
        self.raw(b"{\"artifactId\":");
        self.str(&a.artifact_id)?;
        self.opt_str(b",\"name\":", a.name.as_ref())?;
        self.opt_str(b",\"description\":", a.description.as_ref())?;
        self.raw(b",\"parts\":");
        self.seq(&a.parts, Self::part)?;
        self.metadata(a.metadata.as_ref())?;
        self.strs(b",\"extensions\":", &a.extensions)?;
        self.0.push(b'}');
        Ok(())
    }

    fn part(&mut self, p: &Part) -> serde_json::Result<()> {
        match &p.content {
            PartContent::Text(t) => {
                self.raw(b"{\"text\":");
                self.str(t)?;
            }
            PartContent::Raw(b) => {
                self.raw(b"{\"raw\":");
                self.str(b)?;
            }
            PartContent::Url(u) => {
                self.raw(b"{\"url\":");
                self.str(u)?;
            }
            PartContent::Data(v) => {
                self.raw(b"{\"data\":");
                self.serde(v)?;
            }
        }
        self.metadata(p.metadata.as_ref())?;
        self.opt_str(b",\"filename\":", p.filename.as_ref())?;
        self.opt_str(b",\"mediaType\":", p.media_type.as_ref())?;
        self.0.push(b'}');
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::protocol::jsonrpc::{render_result, RpcId};
    use crate::protocol::model::{Role, Stamped, TaskState};
    use chrono::{DateTime, Utc};
    use serde_json::{json, Value};

    fn map(v: Value) -> Option<crate::protocol::model::Metadata> {
        v.as_object().cloned()
    }

    fn part(content: PartContent) -> Part {
        Part {
            content,
            metadata: None,
            filename: None,
            media_type: None,
        }
    }

    fn message(id: &str) -> Message {
        Message {
            message_id: id.into(),
            role: Role::User,
            parts: vec![Part::text("hello")],
            ..Default::default()
        }
    }

    /// Tasks that between them use every field the writer writes, and strings that need
    /// escaping in each place a string goes.
    pub(in crate::protocol) fn tasks() -> Vec<Task> {
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let plain = Task::submitted("t-1".into(), "c-1".into(), message("m1"));
        let mut full = plain.clone();
        full.id = "t\"2\\".into();
        full.context_id = "c\n2\u{1}é".into();
        full.metadata = map(json!({"gateway/agent": "mine", "n": 1.5, "z": [null, true]}));
        let mut said = message("m\t2");
        said.role = Role::Agent;
        said.context_id = Some("c\n2".into());
        said.task_id = Some("t2".into());
        said.metadata = map(json!({"k": "v"}));
        said.extensions = vec!["ext\"1".into()];
        said.reference_task_ids = vec!["r1".into(), "r2".into()];
        said.parts = vec![
            Part {
                metadata: map(json!({"p": {"q": 1}})),
                filename: Some("a\"b.txt".into()),
                media_type: Some("text/plain".into()),
                ..Part::text("line\nbreak \"quoted\" ☃")
            },
            part(PartContent::Raw("aGk=".into())),
            part(PartContent::Url("https://example.com/x?y=\"z\"".into())),
            part(PartContent::Data(json!({"key": "value", "count": 42}))),
            part(PartContent::Data(json!([1, "two", null]))),
            part(PartContent::Data(json!("scalar"))),
        ];
        full.history.push(said.clone());
        full.set_status(TaskStatus {
            state: TaskState::InputRequired,
            message: Some(Box::new(said.clone())),
            timestamp: Some(at("2016-12-31T23:59:60.5Z")),
        });
        full.artifacts = vec![
            crate::protocol::model::Artifact {
                artifact_id: "a\\1".into(),
                name: Some("n\"ame".into()),
                description: Some("desc".into()),
                parts: said.parts.clone(),
                metadata: map(json!({"a": "b"})),
                extensions: vec!["e".into()],
            },
            crate::protocol::model::Artifact {
                artifact_id: "a2".into(),
                name: None,
                description: None,
                parts: Vec::new(),
                metadata: None,
                extensions: Vec::new(),
            },
        ];
        let mut bare = plain.clone();
        bare.history.clear();
        bare.status = TaskStatus {
            state: TaskState::Unspecified,
            message: None,
            timestamp: None,
        };
        let mut far = plain.clone();
        far.status.timestamp = Some(at("9999-12-31T23:59:59Z") + chrono::Duration::days(400));
        let mut states = Vec::new();
        for state in [
            TaskState::Submitted,
            TaskState::Working,
            TaskState::Completed,
            TaskState::Failed,
            TaskState::Canceled,
            TaskState::Rejected,
            TaskState::AuthRequired,
        ] {
            let mut t = plain.clone();
            t.status.state = state;
            states.push(t);
        }
        let mut all = vec![plain, full, bare, far];
        all.extend(states);
        all
    }

    #[test]
    fn every_byte_that_needs_escaping_is_found_wherever_it_is() {
        for byte in 0..=255u8 {
            let want = byte < 0x20 || byte == b'"' || byte == b'\\';
            for len in [1, 7, 8, 9, 16, 23] {
                for at in 0..len {
                    // Neighbours that push the word arithmetic to its edges.
                    for fill in [b'a', 0x7f, 0x80, 0xff, 0x21, 0x5d] {
                        let mut s = vec![fill; len];
                        s[at] = byte;
                        assert_eq!(
                            needs_escape(&s),
                            want,
                            "{byte:#x} at {at} of {len} in {fill:#x}"
                        );
                    }
                }
            }
        }
    }

    /// The 1.0 send result, `{"task": ...}`.
    #[derive(Serialize)]
    struct Answer<'a> {
        task: Stamped<'a, Task>,
    }

    #[test]
    fn a_task_alone_is_written_as_serde_writes_it() {
        for task in tasks() {
            let fast = String::from_utf8(self::task(&task).unwrap()).unwrap();
            assert_eq!(fast, serde_json::to_string(&task).unwrap(), "{task:?}");
        }
    }

    /// A durable store keeps the task as the answer wrote it: exactly its own writing.
    #[test]
    fn an_answer_marks_the_task_as_a_store_writes_it() {
        let stamps = [Stamp::NONE, Stamp::new(("gateway/agent", "e\"cho"), None)];
        let mut marked = 0;
        for id in [json!(1), json!("req-\"7\"")].map(RpcId::from) {
            for task in tasks() {
                for stamp in stamps {
                    let (answer, at) = task_answer_marked(&id, &task, stamp).unwrap();
                    let Some(at) = at else {
                        assert!(task.metadata.is_some(), "{task:?}");
                        continue;
                    };
                    let stored = task_from_answer(&answer, at).unwrap();
                    assert_eq!(*stored, self::task(&task).unwrap(), "{task:?} {stamp:?}");
                    marked += 1;
                }
            }
        }
        assert!(marked > 0);
    }

    #[test]
    fn writes_the_bytes_serde_writes() {
        let stamps = [
            Stamp::NONE,
            Stamp::new(("gateway/agent", "echo"), None),
            Stamp::new(
                ("gateway/agent", "e\"cho"),
                Some(("gateway/route", "rule-1")),
            ),
        ];
        for id in [json!(1), json!("req-\"7\""), json!(-3)].map(RpcId::from) {
            for task in tasks() {
                for stamp in stamps {
                    let fast = task_answer(&id, &task, stamp).unwrap();
                    let serde = render_result(
                        &id,
                        Answer {
                            task: Stamped {
                                value: &task,
                                stamp,
                            },
                        },
                    )
                    .unwrap();
                    assert_eq!(
                        String::from_utf8(fast).unwrap(),
                        String::from_utf8(serde).unwrap(),
                        "{task:?} {stamp:?}"
                    );
                }
            }
        }
    }
}

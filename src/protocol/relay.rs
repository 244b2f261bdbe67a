//! Answers relayed from an upstream agent that speaks the caller's dialect.
//!
//! Re-encoding such an answer through the canonical model costs a full parse and a full
//! render per call, and drops every field the model does not know (an extension's, say).
//! Instead the answer is kept as the upstream wrote it, read once to find what the gateway
//! must change (the task ids of the task, its status message and its history; the history
//! to trim; the metadata to add its note to), and written out as copies of the upstream's
//! bytes with those few places replaced. Nothing else is parsed into values, escaped or
//! rendered again.
//!
//! What is relayed must be as valid as what is rendered. The same read checks the values
//! strict clients choke on: a status timestamp without a zone (repaired to RFC 3339 in
//! UTC, as the model reads it), a state or role spelled for the other dialect (repaired
//! to this one's), and required fields (a message's `messageId`, `role` and `parts`, an
//! artifact's `artifactId` and `parts`, 0.3's `kind`). What cannot be repaired in place
//! (an unknown state, a missing field) sends the answer down the conversion path, which
//! reads it as `GetTask` would.

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use serde::ser::Error as _;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

use super::model::{Metadata, TaskState, TaskStatus};
use super::scan::next_special;
use super::Dialect;

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
    /// The upstream's bytes (as they came: not copied); `object` is where the task or
    /// message is in them.
    body: Bytes,
    object: Range<usize>,
    /// Boxed: it is large, and a `Relayed` is moved several times on its way out.
    found: Box<Found>,
    /// Changes to `body` made by [`Relayed::rewrite`]: ordered, not overlapping.
    edits: Vec<(Range<usize>, String)>,
    /// Values the read found invalid, with what replaces them (see the module's notes).
    repairs: Vec<(Range<usize>, String)>,
    /// Entries the gateway adds to the object's metadata as it is written (its note), over
    /// any of the object's own under the same keys.
    pub stamp: Option<Metadata>,
    /// The task's (namespaced) id and its context, for the gateway's own records.
    pub task_id: Option<String>,
    pub context_id: Option<String>,
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
    /// Something the relay cannot repair in place; the conversion path reads it.
    #[error("sent a result the relay cannot pass on as written: {0}")]
    NotAsWritten(&'static str),
}

/// What the read found where, as byte ranges into the body.
#[derive(Debug, Clone, Default, PartialEq)]
struct Found {
    /// The task's `id` value and what it says.
    id: Option<(Range<usize>, String)>,
    status: Option<StatusFound>,
    /// Each message of the `history`.
    history: Option<Vec<MessageFound>>,
    /// The object's own `metadata` value.
    metadata: Option<Range<usize>>,
    /// A relayed message's own ids.
    message: MessageFound,
    /// Whether the object has any field (a stamp is then added after a comma).
    fields: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct StatusFound {
    state: Option<TaskState>,
    /// Where the state's string is, and whether it has escapes.
    state_at: Option<(Range<usize>, bool)>,
    /// Where the time is, and whether it has escapes.
    timestamp: Option<(Range<usize>, bool)>,
    /// Boxed: most statuses have none, and the found fields are moved several times.
    message: Option<Box<MessageFound>>,
}

/// Where a message names tasks: its `taskId` and `referenceTaskIds` values, with what they
/// say; and the message itself (found only in a history, for trimming).
#[derive(Debug, Clone, Default, PartialEq)]
struct MessageFound {
    whole: Option<Range<usize>>,
    task_id: Option<(Range<usize>, String)>,
    references: Option<(Range<usize>, Vec<String>)>,
    /// Where the role's string is and whether it has escapes (None: no role).
    role: Option<(Range<usize>, bool)>,
    /// Which required fields it has: `messageId` (a string), `parts` (a list), `kind`.
    message_id: bool,
    parts: bool,
    kind: bool,
}

impl Relayed {
    /// Opens a send result: 1.0 wraps it (`{"task":{…}}`), 0.3 tags it (`"kind":"task"`).
    /// The gateway reads results along with their envelope ([`Relayed::from_response`]).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn read(dialect: Dialect, result: &RawValue) -> Result<Relayed, RelayError> {
        let body = Bytes::copy_from_slice(result.get().as_bytes());
        let read = read_result(result.get(), dialect, false)?.ok_or(RelayError::NoTaskOrMessage)?;
        Relayed::checked(dialect, body, read)
    }

    /// The result of a JSON-RPC response body (`{"jsonrpc":"2.0","id":…,"result":…}`) when
    /// it has one of the relay's shapes in `dialect`; `None` for anything else (an error
    /// among them), which the conversion path then reads.
    pub fn from_response(dialect: Dialect, body: &Bytes) -> Option<Relayed> {
        if dialect == Dialect::V01 {
            return None;
        }
        let text = std::str::from_utf8(body).ok()?;
        let read = read_result(text, dialect, true).ok()??;
        Relayed::checked(dialect, body.clone(), read).ok()
    }

    fn checked(dialect: Dialect, body: Bytes, read: ReadObject) -> Result<Relayed, RelayError> {
        let ReadObject {
            kind,
            range,
            found,
            context_id,
        } = read;
        let mut relayed = Relayed {
            dialect,
            kind,
            body,
            object: range,
            task_id: None,
            context_id,
            found,
            edits: Vec::new(),
            repairs: Vec::new(),
            stamp: None,
        };
        relayed.repairs = relayed.repairs()?;
        relayed.edits = relayed.repairs.clone();
        if kind == RelayedKind::Task {
            let Some((_, id)) = &relayed.found.id else {
                return Err(RelayError::MissingField("id"));
            };
            relayed.task_id = Some(id.clone());
            if relayed.context_id.is_none() {
                return Err(RelayError::MissingField("contextId"));
            }
            if relayed.found.status.is_none() {
                return Err(RelayError::MissingField("status"));
            }
        }
        Ok(relayed)
    }

    /// What must change for the answer to be valid in its dialect, or why it cannot be
    /// relayed as written.
    fn repairs(&self) -> Result<Vec<(Range<usize>, String)>, RelayError> {
        let mut repairs = Vec::new();
        let found = &self.found;
        match self.kind {
            RelayedKind::Message => self.repair_message(&found.message, &mut repairs)?,
            RelayedKind::Task => {
                if let Some(status) = &found.status {
                    self.repair_state(status, &mut repairs)?;
                    self.repair_timestamp(status, &mut repairs)?;
                }
                let status_message = found.status.as_ref().and_then(|s| s.message.as_deref());
                for m in status_message
                    .into_iter()
                    .chain(found.history.iter().flatten())
                {
                    self.repair_message(m, &mut repairs)?;
                }
            }
        }
        Ok(repairs)
    }

    fn text(&self, (at, escaped): &(Range<usize>, bool)) -> Result<Cow<'_, str>, RelayError> {
        let raw = std::str::from_utf8(&self.body[at.clone()])
            .map_err(|_| RelayError::NotAsWritten("a string that is not UTF-8"))?;
        Ok(match escaped {
            false => Cow::Borrowed(&raw[1..raw.len() - 1]),
            true => Cow::Owned(serde_json::from_str(raw)?),
        })
    }

    /// A state spelled as this dialect spells it; another dialect's spelling is repaired,
    /// one no dialect has is not relayed.
    fn repair_state(
        &self,
        status: &StatusFound,
        repairs: &mut Vec<(Range<usize>, String)>,
    ) -> Result<(), RelayError> {
        let (Some(state), Some(at)) = (status.state, &status.state_at) else {
            return Err(RelayError::NotAsWritten("a task state no dialect has"));
        };
        let name = match self.dialect {
            Dialect::V10 => state.v10_name(),
            Dialect::V03 | Dialect::V01 => state.v03_name(),
        };
        if at.1 || self.text(at)? != name {
            repairs.push((at.0.clone(), format!("\"{name}\"")));
        }
        Ok(())
    }

    /// A status timestamp is RFC 3339 with a zone; one without (`2026-11-25T13:56:08.99`,
    /// as some Python servers write) is read as UTC, as the model reads it.
    fn repair_timestamp(
        &self,
        status: &StatusFound,
        repairs: &mut Vec<(Range<usize>, String)>,
    ) -> Result<(), RelayError> {
        let Some(at) = &status.timestamp else {
            return Ok(());
        };
        let text = self.text(at)?;
        if !at.1 && is_rfc3339(&text) {
            return Ok(());
        }
        let time = super::model::parse_timestamp(&text)
            .ok_or(RelayError::NotAsWritten("a timestamp that is not one"))?;
        repairs.push((
            at.0.clone(),
            format!("\"{}\"", super::model::format_timestamp(&time)),
        ));
        Ok(())
    }

    fn repair_message(
        &self,
        m: &MessageFound,
        repairs: &mut Vec<(Range<usize>, String)>,
    ) -> Result<(), RelayError> {
        if !(m.message_id && m.parts) || (self.dialect != Dialect::V10 && !m.kind) {
            return Err(RelayError::NotAsWritten(
                "a message without its required fields",
            ));
        }
        let Some(at) = &m.role else {
            return Err(RelayError::NotAsWritten("a message without a role"));
        };
        let text = self.text(at)?;
        let role = super::model::Role::from_name(&text)
            .ok_or(RelayError::NotAsWritten("a role no dialect has"))?;
        let name = match self.dialect {
            Dialect::V10 => role.v10_name(),
            Dialect::V03 | Dialect::V01 => role.v03_name(),
        };
        if at.1 || text != name {
            repairs.push((at.0.clone(), format!("\"{name}\"")));
        }
        Ok(())
    }

    /// The task's or message's JSON as the upstream sent it (before any rewrite).
    pub fn object_bytes(&self) -> &[u8] {
        self.body.get(self.object.clone()).unwrap_or_default()
    }

    pub fn is_task(&self) -> bool {
        self.kind == RelayedKind::Task
    }

    /// The task's state (None for a message).
    pub fn state(&self) -> Option<TaskState> {
        match self.kind {
            RelayedKind::Task => self.found.status.as_ref()?.state,
            RelayedKind::Message => None,
        }
    }

    /// The task's status without its message (None for a message).
    pub fn status(&self) -> Option<TaskStatus> {
        if self.kind != RelayedKind::Task {
            return None;
        }
        let status = self.found.status.as_ref()?;
        let timestamp = status.timestamp.clone().and_then(|(at, _)| {
            let raw = std::str::from_utf8(&self.body[at]).ok()?;
            serde_json::from_str::<String>(raw).ok()
        });
        Some(TaskStatus {
            state: status.state?,
            message: None,
            timestamp: timestamp.as_deref().and_then(super::model::parse_timestamp),
        })
    }

    /// Rewrites every task id the result carries with `map` (the task's own id, and the
    /// `taskId`/`referenceTaskIds` of its status message and history), and keeps the newest
    /// `history_length` history messages.
    pub fn rewrite(
        &mut self,
        map: &dyn Fn(&str) -> String,
        history_length: Option<usize>,
    ) -> Result<(), RelayError> {
        let mut edits = Vec::new();
        let mut removed = None;
        let found = &self.found;
        match self.kind {
            RelayedKind::Message => message_edits(&found.message, map, &mut edits)?,
            RelayedKind::Task => {
                if let Some((at, id)) = &found.id {
                    let id = map(id);
                    edits.push((at.clone(), serde_json::to_string(&id)?));
                    self.task_id = Some(id);
                }
                if let Some(m) = found.status.as_ref().and_then(|s| s.message.as_deref()) {
                    message_edits(m, map, &mut edits)?;
                }
                if let Some(messages) = &found.history {
                    let drop = history_length.map_or(0, |n| messages.len().saturating_sub(n));
                    let (gone, kept) = messages.split_at(drop);
                    let whole = |m: Option<&MessageFound>| m.and_then(|m| m.whole.clone());
                    // The older messages go: from the first up to the first one kept (with
                    // the comma between), or to the end of the last when none is kept.
                    if let Some(first) = whole(gone.first()) {
                        let end = match whole(kept.first()) {
                            Some(next) => next.start,
                            None => whole(gone.last()).map_or(first.end, |last| last.end),
                        };
                        edits.push((first.start..end, String::new()));
                        removed = Some(first.start..end);
                    }
                    for m in kept {
                        message_edits(m, map, &mut edits)?;
                    }
                }
            }
        }
        // Repairs inside the messages trimmed away go with them.
        edits.extend(
            self.repairs
                .iter()
                .filter(|(at, _)| {
                    removed
                        .as_ref()
                        .is_none_or(|gone| at.start < gone.start || at.end > gone.end)
                })
                .cloned(),
        );
        edits.sort_by_key(|(at, _)| at.start);
        self.edits = edits;
        Ok(())
    }

    /// The object as the caller gets it: the upstream's bytes with the edits made and the
    /// stamp in its metadata.
    fn write_object(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let stamp = self.stamp_at()?;
        let mut at = self.object.start;
        let mut stamped = false;
        for (range, text) in &self.edits {
            if let Some((r, how)) = stamp
                .as_ref()
                .filter(|(r, _)| !stamped && r.start <= range.start)
            {
                self.copy_to(out, &mut at, r);
                self.write_stamp(out, *how)?;
                stamped = true;
            }
            self.copy_to(out, &mut at, range);
            out.extend_from_slice(text.as_bytes());
        }
        if let Some((r, how)) = stamp.as_ref().filter(|_| !stamped) {
            self.copy_to(out, &mut at, r);
            self.write_stamp(out, *how)?;
        }
        out.extend_from_slice(&self.body[at..self.object.end]);
        Ok(())
    }

    /// Copies the body from `at` to the start of `range`, and goes on from its end.
    fn copy_to(&self, out: &mut Vec<u8>, at: &mut usize, range: &Range<usize>) {
        out.extend_from_slice(&self.body[*at..range.start]);
        *at = range.end;
    }

    /// Where the stamp goes into the object's metadata, and how; None without a stamp.
    fn stamp_at(&self) -> serde_json::Result<Option<(Range<usize>, StampHow)>> {
        if self.stamp.as_ref().is_none_or(Metadata::is_empty) {
            return Ok(None);
        }
        let stamp = self.stamp.as_ref();
        let own = self
            .found
            .metadata
            .as_ref()
            .map(|r| (r, &self.body[r.clone()]));
        Ok(Some(match own {
            // None of the stamp's keys in it: the stamp's entries go first.
            Some((r, raw))
                if raw.first() == Some(&b'{') && !stamp.is_some_and(|s| mentions(raw, s)) =>
            {
                let empty = raw[1..].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
                (
                    r.start + 1..r.start + 1,
                    StampHow::Entries { comma: !empty },
                )
            }
            // Its entries under the stamp's keys are replaced: read and written again.
            Some((r, raw)) if raw.first() == Some(&b'{') => (r.clone(), StampHow::Merged),
            Some((r, _)) => (r.clone(), StampHow::Object { field: false }),
            None => {
                let end = self.object.end - 1;
                match self.found.fields {
                    true => (end..end, StampHow::FieldAfterComma),
                    false => (end..end, StampHow::Object { field: true }),
                }
            }
        }))
    }

    fn write_stamp(&self, out: &mut Vec<u8>, how: StampHow) -> serde_json::Result<()> {
        let Some(stamp) = &self.stamp else {
            return Ok(());
        };
        let entries = |out: &mut Vec<u8>| -> serde_json::Result<()> {
            for (i, (key, value)) in stamp.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key)?;
                out.push(b':');
                serde_json::to_writer(&mut *out, value)?;
            }
            Ok(())
        };
        match how {
            StampHow::Entries { comma } => {
                entries(out)?;
                if comma {
                    out.push(b',');
                }
            }
            StampHow::Merged => {
                let r = self.found.metadata.clone().unwrap_or_default();
                let mut own: Metadata = serde_json::from_slice(&self.body[r])?;
                own.extend(stamp.clone());
                serde_json::to_writer(&mut *out, &own)?;
            }
            StampHow::Object { field } => {
                if field {
                    out.extend_from_slice(b"\"metadata\":");
                }
                out.push(b'{');
                entries(out)?;
                out.push(b'}');
            }
            StampHow::FieldAfterComma => {
                out.extend_from_slice(b",\"metadata\":{");
                entries(out)?;
                out.push(b'}');
            }
        }
        Ok(())
    }

    /// `{"jsonrpc":"2.0","id":…,"result":…}` with this result, written straight into
    /// bytes, for a caller speaking `dialect` (which must be the relayed one).
    pub fn answer(
        &self,
        id: &super::jsonrpc::RpcId,
        dialect: Dialect,
    ) -> serde_json::Result<Vec<u8>> {
        if dialect != self.dialect {
            return Err(<serde_json::Error as serde::ser::Error>::custom(
                "a relayed result rendered in the other dialect",
            ));
        }
        let mut out = Vec::with_capacity(self.body.len() + 128);
        out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
        serde_json::to_writer(&mut out, id)?;
        out.extend_from_slice(b",\"result\":");
        self.write_result(&mut out)?;
        out.push(b'}');
        Ok(out)
    }

    fn write_result(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        match self.dialect {
            Dialect::V03 | Dialect::V01 => self.write_object(out),
            Dialect::V10 => {
                out.extend_from_slice(match self.kind {
                    RelayedKind::Task => b"{\"task\":",
                    RelayedKind::Message => b"{\"message\":",
                });
                self.write_object(out)?;
                out.push(b'}');
                Ok(())
            }
        }
    }

    /// Writes the result for a caller speaking `dialect`, which must be the relayed one.
    pub fn serialize_as<S: Serializer>(&self, dialect: Dialect, s: S) -> Result<S::Ok, S::Error> {
        if dialect != self.dialect {
            return Err(S::Error::custom(
                "a relayed result rendered in the other dialect",
            ));
        }
        let mut out = Vec::with_capacity(self.body.len() + 64);
        self.write_result(&mut out).map_err(S::Error::custom)?;
        let text = String::from_utf8(out).map_err(S::Error::custom)?;
        RawValue::from_string(text)
            .map_err(S::Error::custom)?
            .serialize(s)
    }
}

/// How the stamp goes into the object.
#[derive(Clone, Copy)]
enum StampHow {
    /// Its entries, at the start of the object's own metadata (then a comma if that has
    /// entries).
    Entries { comma: bool },
    /// The own metadata read, the stamp's entries put over it, and written again.
    Merged,
    /// A metadata object of its own, in place of a null (or as a field, `field`, of an
    /// object that has no other).
    Object { field: bool },
    /// `,"metadata":{…}` at the end of the object.
    FieldAfterComma,
}

/// Whether raw metadata names any key of `stamp` (written plainly; an escaped spelling of
/// the same key would be missed, so the check errs toward reading it whole).
fn mentions(raw: &[u8], stamp: &Metadata) -> bool {
    raw.contains(&b'\\')
        || stamp.keys().any(|k| {
            let quoted = format!("\"{k}\"");
            raw.windows(quoted.len()).any(|w| w == quoted.as_bytes())
        })
}

fn message_edits(
    m: &MessageFound,
    map: &dyn Fn(&str) -> String,
    edits: &mut Vec<(Range<usize>, String)>,
) -> serde_json::Result<()> {
    if let Some((at, id)) = &m.task_id {
        edits.push((at.clone(), serde_json::to_string(&map(id))?));
    }
    if let Some((at, refs)) = &m.references {
        let refs: Vec<String> = refs.iter().map(|r| map(r)).collect();
        edits.push((at.clone(), serde_json::to_string(&refs)?));
    }
    Ok(())
}

/// A task or message object as read.
struct ReadObject {
    kind: RelayedKind,
    range: Range<usize>,
    found: Box<Found>,
    context_id: Option<String>,
}

/// Reads a JSON-RPC response's result (`None` when it has an error, or no result), or a
/// bare result (`envelope` false), in `dialect`'s shape.
///
/// Written by hand rather than with serde: the relay needs where a dozen values are, not
/// the values, and serde's visitors over the answer cost the relay more than all the rest
/// of its work (22k instructions for a 480-byte task). This reader validates what it
/// skips as strictly as serde_json (the grammar, control characters in strings, nesting
/// up to 128), and hands strings with escapes to serde_json to decode.
fn read_result(
    text: &str,
    dialect: Dialect,
    envelope: bool,
) -> Result<Option<ReadObject>, ReadError> {
    let mut r = Reader::new(text);
    let read = if envelope {
        let mut result = None;
        let mut error = false;
        r.object(0, |r, key| {
            match &*key {
                "result" if result.is_some() => return Err(ReadError::Invalid),
                "result" => result = Some(read_bare(r, dialect)?),
                "error" => {
                    error = true;
                    r.skip(1)?;
                }
                _ => {
                    r.skip(1)?;
                }
            }
            Ok(())
        })?;
        result.filter(|_| !error)
    } else {
        Some(read_bare(r.by_ref(), dialect)?)
    };
    r.end()?;
    Ok(read)
}

/// A send result: `{"task":{…}}` or `{"message":{…}}` in 1.0, the object itself (tagged
/// with `kind`) in 0.3.
fn read_bare(r: &mut Reader<'_>, dialect: Dialect) -> Result<ReadObject, ReadError> {
    if dialect != Dialect::V10 {
        let mut found = Box::<Found>::default();
        let (range, fields) = read_object(r, 1, false, &mut found)?;
        let kind = match fields.kind.as_deref() {
            Some("task") => RelayedKind::Task,
            Some("message") => RelayedKind::Message,
            _ => return Err(ReadError::Relay(RelayError::NoTaskOrMessage)),
        };
        return Ok(ReadObject {
            kind,
            range,
            found,
            context_id: fields.context_id,
        });
    }
    let mut read: Option<ReadObject> = None;
    r.object(1, |r, key| {
        let kind = match &*key {
            "task" => RelayedKind::Task,
            "message" => RelayedKind::Message,
            _ => return r.skip(2).map(drop),
        };
        // A task wins over a message, as the model reads a 1.0 result; null is no value.
        if r.null()? || read.as_ref().is_some_and(|o| o.kind == RelayedKind::Task) {
            return r.skip(2).map(drop);
        }
        let mut found = Box::<Found>::default();
        let (range, fields) = read_object(r, 2, false, &mut found)?;
        read = Some(ReadObject {
            kind,
            range,
            found,
            context_id: fields.context_id,
        });
        Ok(())
    })?;
    read.ok_or(ReadError::Relay(RelayError::NoTaskOrMessage))
}

/// Fields of the object read for the gateway's records.
#[derive(Default)]
struct Fields {
    kind: Option<String>,
    context_id: Option<String>,
}

/// Reads a task's or a result message's fields into `found` (a fresh one), or only where
/// a message (of a status or a history) names tasks (`message_only`). Written in place, not
/// returned: the found fields are large, and each return would copy them.
fn read_object(
    r: &mut Reader<'_>,
    depth: usize,
    message_only: bool,
    found: &mut Found,
) -> Result<(Range<usize>, Fields), ReadError> {
    let mut fields = Fields::default();
    let start = r.at_value()?;
    r.object(depth, |r, key| {
        found.fields = true;
        match &*key {
            "taskId" => found.message.task_id = r.opt_string()?,
            "referenceTaskIds" => found.message.references = r.opt_strings(depth + 1)?,
            "context_id" | "task_id" | "reference_task_ids" => {
                return Err(ReadError::Relay(RelayError::Spelling(spelling(&key))));
            }
            "role" if r.peek() == Some(b'"') => found.message.role = Some(r.string()?),
            "messageId" if r.peek() == Some(b'"') => {
                r.string()?;
                found.message.message_id = true;
            }
            "parts" if r.peek() == Some(b'[') => {
                r.skip(depth + 1)?;
                found.message.parts = true;
            }
            "kind" if message_only => {
                r.skip(depth + 1)?;
                found.message.kind = true;
            }
            _ if message_only => r.skip(depth + 1).map(drop)?,
            "id" => {
                let id = r.opt_string()?;
                found.id = Some(id.ok_or(ReadError::Relay(RelayError::MissingField("id")))?);
            }
            "contextId" => fields.context_id = r.opt_string()?.map(|(_, c)| c),
            "kind" => {
                fields.kind = r.opt_string()?.map(|(_, k)| k);
                found.message.kind = true;
            }
            "artifacts" => read_artifacts(r, depth + 1)?,
            "status" => found.status = Some(read_status(r, depth + 1)?),
            "history" => found.history = read_history(r, depth + 1)?,
            "metadata" => {
                // An object (the stamp goes in) or null (the stamp replaces it).
                if !(r.peek() == Some(b'{') || r.peek() == Some(b'n')) {
                    return Err(ReadError::Invalid);
                }
                found.metadata = Some(r.skip(depth + 1)?);
            }
            _ => r.skip(depth + 1).map(drop)?,
        }
        Ok(())
    })?;
    Ok((start..r.at, fields))
}

fn read_status(r: &mut Reader<'_>, depth: usize) -> Result<StatusFound, ReadError> {
    let mut status = StatusFound::default();
    let mut state = false;
    r.object(depth, |r, key| {
        match &*key {
            "state" => {
                // A string whatever it says; one the model does not read is relayed as
                // written, and only not recorded.
                if r.peek() != Some(b'"') {
                    return Err(ReadError::Invalid);
                }
                let (at, escaped) = r.string()?;
                status.state = match escaped {
                    false => TaskState::parse_lenient(r.slice(at.start + 1..at.end - 1)?),
                    true => TaskState::parse_lenient(&r.decoded(at.clone(), true)?),
                };
                status.state_at = Some((at, escaped));
                state = true;
            }
            // Checked (see the module's notes), and read when asked for (ListTasks on 0.3
            // upstreams). Only a string or null is a timestamp.
            "timestamp" if r.peek() == Some(b'"') => status.timestamp = Some(r.string()?),
            "timestamp" if !r.null()? => {
                return Err(ReadError::Relay(RelayError::NotAsWritten(
                    "a timestamp that is not a string",
                )))
            }
            "message" if !r.null()? => {
                let mut found = Found::default();
                let (whole, _) = read_object(r, depth + 1, true, &mut found)?;
                status.message = Some(Box::new(MessageFound {
                    whole: Some(whole),
                    ..found.message
                }));
            }
            _ => r.skip(depth + 1).map(drop)?,
        }
        Ok(())
    })?;
    match state {
        true => Ok(status),
        false => Err(ReadError::Relay(RelayError::MissingField("status"))),
    }
}

fn read_history(r: &mut Reader<'_>, depth: usize) -> Result<Option<Vec<MessageFound>>, ReadError> {
    if r.null()? {
        r.skip(depth)?;
        return Ok(None);
    }
    let mut messages = Vec::new();
    r.array(depth, |r| {
        let mut found = Found::default();
        let (whole, _) = read_object(r, depth + 1, true, &mut found)?;
        messages.push(MessageFound {
            whole: Some(whole),
            ..found.message
        });
        Ok(())
    })?;
    Ok(Some(messages))
}

/// A task's artifacts, each with its required `artifactId` (a string) and `parts` (a
/// list); null is none.
fn read_artifacts(r: &mut Reader<'_>, depth: usize) -> Result<(), ReadError> {
    if r.null()? {
        return r.skip(depth).map(drop);
    }
    r.array(depth, |r| {
        let (mut id, mut parts) = (false, false);
        // Passed on whole: its reader decides between two equal keys, as it would reading
        // the upstream (either way it has the field).
        r.object_with(depth + 1, false, |r, key| {
            match &*key {
                "artifactId" if r.peek() == Some(b'"') => id = true,
                "parts" if r.peek() == Some(b'[') => parts = true,
                _ => {}
            }
            r.skip(depth + 2).map(drop)
        })?;
        match id && parts {
            true => Ok(()),
            false => Err(ReadError::Relay(RelayError::NotAsWritten(
                "an artifact without its artifactId or parts",
            ))),
        }
    })
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, the form every SDK's parser takes (the
/// fields in their ranges; the day is not checked against the month).
fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let num = |at: usize, len: usize, max: u32| {
        b.get(at..at + len).is_some_and(|d| {
            d.iter().all(u8::is_ascii_digit)
                && d.iter().fold(0, |n, &c| n * 10 + u32::from(c - b'0')) <= max
        })
    };
    let is = |at: usize, c: &[u8]| b.get(at).is_some_and(|x| c.contains(x));
    let fields = num(0, 4, 9999)
        && is(4, b"-")
        && num(5, 2, 12)
        && is(7, b"-")
        && num(8, 2, 31)
        && is(10, b"Tt")
        && num(11, 2, 23)
        && is(13, b":")
        && num(14, 2, 59)
        && is(16, b":")
        && num(17, 2, 60)
        && b[5..7] != *b"00"
        && b[8..10] != *b"00";
    if !fields {
        return false;
    }
    let mut at = 19;
    if is(at, b".") {
        let digits = b[at + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 {
            return false;
        }
        at += 1 + digits;
    }
    match b.get(at) {
        Some(b'Z' | b'z') => at + 1 == b.len(),
        Some(b'+' | b'-') => {
            at + 6 == b.len() && num(at + 1, 2, 23) && is(at + 3, b":") && num(at + 4, 2, 59)
        }
        _ => false,
    }
}

/// Why the reader stopped.
#[derive(Debug)]
enum ReadError {
    /// Not JSON, or not the shape the relay reads.
    Invalid,
    Relay(RelayError),
}

impl From<serde_json::Error> for ReadError {
    fn from(_: serde_json::Error) -> ReadError {
        ReadError::Invalid
    }
}

impl From<ReadError> for RelayError {
    fn from(e: ReadError) -> RelayError {
        match e {
            ReadError::Relay(e) => e,
            ReadError::Invalid => {
                RelayError::Malformed(<serde_json::Error as serde::de::Error>::custom(
                    "not JSON, or not a result the relay reads",
                ))
            }
        }
    }
}

/// A value read, with where it is (None: null).
type Located<T> = Option<(Range<usize>, T)>;

/// The most values nest, as serde_json allows.
const MAX_DEPTH: usize = 128;

/// A cursor over JSON text that finds where values are, checking them as it goes.
struct Reader<'a> {
    /// Valid UTF-8 (a `str`'s), read as bytes; a range between two quotes is a `str`.
    str: &'a str,
    text: &'a [u8],
    at: usize,
    /// The keys of the objects being read, innermost last (one buffer for all of them).
    keys: Vec<Cow<'a, str>>,
}

impl<'a> Reader<'a> {
    fn new(text: &'a str) -> Reader<'a> {
        Reader {
            str: text,
            text: text.as_bytes(),
            at: 0,
            keys: Vec::with_capacity(32),
        }
    }

    /// The text at `range`, which starts and ends at an ASCII byte of it.
    fn slice(&self, range: Range<usize>) -> Result<&'a str, ReadError> {
        self.str.get(range).ok_or(ReadError::Invalid)
    }

    fn by_ref(&mut self) -> &mut Self {
        self
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.text.get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.text.get(self.at).copied()
    }

    /// Where the next value starts.
    fn at_value(&mut self) -> Result<usize, ReadError> {
        self.peek().ok_or(ReadError::Invalid)?;
        Ok(self.at)
    }

    fn eat(&mut self, b: u8) -> Result<(), ReadError> {
        match self.peek() {
            Some(c) if c == b => {
                self.at += 1;
                Ok(())
            }
            _ => Err(ReadError::Invalid),
        }
    }

    /// Whether the next value is `null` (not consumed).
    fn null(&mut self) -> Result<bool, ReadError> {
        Ok(self.peek() == Some(b'n'))
    }

    /// Nothing but whitespace is left.
    fn end(&mut self) -> Result<(), ReadError> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(ReadError::Invalid),
        }
    }

    /// Skips one value (checking it); where it was.
    fn skip(&mut self, depth: usize) -> Result<Range<usize>, ReadError> {
        if depth > MAX_DEPTH {
            return Err(ReadError::Invalid);
        }
        let start = self.at_value()?;
        match self.text[start] {
            b'"' => {
                self.string()?;
            }
            b'{' => self.object_with(depth, false, |r, _| r.skip(depth + 1).map(drop))?,
            b'[' => self.array(depth, |r| r.skip(depth + 1).map(drop))?,
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            _ => self.number()?,
        }
        Ok(start..self.at)
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), ReadError> {
        match self.text[self.at..].starts_with(word) {
            true => {
                self.at += word.len();
                Ok(())
            }
            false => Err(ReadError::Invalid),
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> Result<(), ReadError> {
        let digits = |r: &mut Reader<'_>| {
            let from = r.at;
            while r.text.get(r.at).is_some_and(u8::is_ascii_digit) {
                r.at += 1;
            }
            match r.at > from {
                true => Ok(()),
                false => Err(ReadError::Invalid),
            }
        };
        if self.text.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        match self.text.get(self.at) {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => digits(self)?,
            _ => return Err(ReadError::Invalid),
        }
        if self.text.get(self.at) == Some(&b'.') {
            self.at += 1;
            digits(self)?;
        }
        if let Some(b'e' | b'E') = self.text.get(self.at) {
            self.at += 1;
            if let Some(b'+' | b'-') = self.text.get(self.at) {
                self.at += 1;
            }
            digits(self)?;
        }
        Ok(())
    }

    /// A string: its range (quotes included) and whether it has escapes.
    #[inline]
    fn string(&mut self) -> Result<(Range<usize>, bool), ReadError> {
        let start = self.at;
        self.eat(b'"')?;
        let end = next_special(self.text, self.at).ok_or(ReadError::Invalid)?;
        if self.text[end] != b'"' {
            return self.escaped_string(start, end);
        }
        self.at = end + 1;
        Ok((start..self.at, false))
    }

    /// The rest of a string that has escapes (or a control character, which fails), from
    /// the first byte that is not plain text. Apart: most strings have none, and inline
    /// this path made every string's call cost more.
    #[cold]
    #[inline(never)]
    fn escaped_string(
        &mut self,
        start: usize,
        mut at: usize,
    ) -> Result<(Range<usize>, bool), ReadError> {
        loop {
            match self.text[at] {
                b'"' => break,
                b'\\' => at = next_special(self.text, at + 2).ok_or(ReadError::Invalid)?,
                _ => return Err(ReadError::Invalid),
            }
        }
        self.at = at + 1;
        let range = start..self.at;
        // Escapes are checked (and decoded, where wanted) by serde_json, as written: a
        // lone surrogate (`"\ud800"`) is JSON, and is relayed.
        serde_json::from_str::<&RawValue>(self.slice(range.clone())?)?;
        Ok((range, true))
    }

    /// The string at this range, decoded.
    fn decoded(&self, range: Range<usize>, escaped: bool) -> Result<String, ReadError> {
        let raw = self.slice(range)?;
        match escaped {
            false => Ok(raw[1..raw.len() - 1].to_string()),
            true => Ok(serde_json::from_str(raw)?),
        }
    }

    /// A string or null: where it is and what it says.
    fn opt_string(&mut self) -> Result<Located<String>, ReadError> {
        match self.peek() {
            Some(b'n') => self.literal(b"null").map(|()| None),
            Some(b'"') => {
                let (range, escaped) = self.string()?;
                let text = self.decoded(range.clone(), escaped)?;
                Ok(Some((range, text)))
            }
            _ => Err(ReadError::Invalid),
        }
    }

    /// A list of strings, or null.
    fn opt_strings(&mut self, depth: usize) -> Result<Located<Vec<String>>, ReadError> {
        if self.null()? {
            self.literal(b"null")?;
            return Ok(None);
        }
        let start = self.at_value()?;
        let mut all = Vec::new();
        self.array(depth, |r| {
            let (_, s) = r.opt_string()?.ok_or(ReadError::Invalid)?;
            all.push(s);
            Ok(())
        })?;
        Ok(Some((start..self.at, all)))
    }

    /// An object: `member` is given each key (decoded) and must read its value. Keys are
    /// unique: parsers disagree on which of two equal keys wins, and the relay would
    /// rewrite one and let the other through.
    fn object(
        &mut self,
        depth: usize,
        member: impl FnMut(&mut Self, Cow<'a, str>) -> Result<(), ReadError>,
    ) -> Result<(), ReadError> {
        self.object_with(depth, true, member)
    }

    /// [`Self::object`], checking that its keys are unique only when `unique` (an object
    /// passed on whole needs no check: its reader decides, as it would reading the
    /// upstream).
    fn object_with(
        &mut self,
        depth: usize,
        unique: bool,
        mut member: impl FnMut(&mut Self, Cow<'a, str>) -> Result<(), ReadError>,
    ) -> Result<(), ReadError> {
        if depth > MAX_DEPTH {
            return Err(ReadError::Invalid);
        }
        self.eat(b'{')?;
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        let mark = self.keys.len();
        let read = self.members(mark, unique, &mut member);
        self.keys.truncate(mark);
        read
    }

    fn members(
        &mut self,
        mark: usize,
        unique: bool,
        member: &mut impl FnMut(&mut Self, Cow<'a, str>) -> Result<(), ReadError>,
    ) -> Result<(), ReadError> {
        loop {
            self.ws();
            let (range, escaped) = self.string()?;
            let key: Cow<'a, str> = match escaped {
                false => Cow::Borrowed(self.slice(range.start + 1..range.end - 1)?),
                true => Cow::Owned(self.decoded(range, true)?),
            };
            if unique {
                if self.keys[mark..].contains(&key) {
                    return Err(ReadError::Invalid);
                }
                self.keys.push(key.clone());
            }
            self.eat(b':')?;
            member(self, key)?;
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(ReadError::Invalid),
            }
        }
    }

    /// An array: `element` must read each value.
    fn array(
        &mut self,
        depth: usize,
        mut element: impl FnMut(&mut Self) -> Result<(), ReadError>,
    ) -> Result<(), ReadError> {
        if depth > MAX_DEPTH {
            return Err(ReadError::Invalid);
        }
        self.eat(b'[')?;
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        loop {
            element(self)?;
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(ReadError::Invalid),
            }
        }
    }
}

fn spelling(key: &str) -> &'static str {
    match key {
        "context_id" => "context_id",
        "task_id" => "task_id",
        _ => "reference_task_ids",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(v: serde_json::Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&v).unwrap()
    }

    fn written(r: &Relayed, dialect: Dialect) -> serde_json::Value {
        let mut out = Vec::new();
        r.serialize_as(dialect, &mut serde_json::Serializer::new(&mut out))
            .unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn a_task_keeps_what_it_does_not_rewrite() {
        let result = raw(json!({"task": {
            "id": "t1", "contextId": "c1", "x-extension": {"keep": [1, 2]},
            "status": {"state": "TASK_STATE_COMPLETED",
                       "message": {"messageId": "a", "taskId": "t1", "role": "ROLE_AGENT", "parts": []}},
            "history": [
                {"messageId": "1", "taskId": "t1", "referenceTaskIds": ["t0"], "role": "ROLE_USER", "parts": []},
                {"messageId": "2", "taskId": "t1", "role": "ROLE_USER", "parts": []}
            ],
            "metadata": {"upstream": true}
        }}));
        let mut r = Relayed::read(Dialect::V10, &result).unwrap();
        r.rewrite(&|id| format!("agent.{id}"), Some(1)).unwrap();
        r.stamp
            .get_or_insert_with(Metadata::new)
            .insert("gateway/agent".into(), json!("agent"));
        assert_eq!(
            written(&r, Dialect::V10),
            json!({"task": {
                "id": "agent.t1", "contextId": "c1", "x-extension": {"keep": [1, 2]},
                "status": {"state": "TASK_STATE_COMPLETED",
                           "message": {"messageId": "a", "taskId": "agent.t1", "role": "ROLE_AGENT", "parts": []}},
                "history": [{"messageId": "2", "taskId": "agent.t1", "role": "ROLE_USER", "parts": []}],
                "metadata": {"upstream": true, "gateway/agent": "agent"}
            }})
        );
        assert_eq!(r.task_id.as_deref(), Some("agent.t1"));
        assert_eq!(r.context_id.as_deref(), Some("c1"));
        let status = r.status().unwrap();
        assert_eq!(status.state, TaskState::Completed);
        // The whole answer, as the caller gets it, with the caller's id.
        let id = crate::protocol::jsonrpc::RpcId::Value(json!(7));
        let answer: serde_json::Value =
            serde_json::from_slice(&r.answer(&id, Dialect::V10).unwrap()).unwrap();
        assert_eq!(answer["id"], 7);
        assert_eq!(answer["result"], written(&r, Dialect::V10));
    }

    #[test]
    fn the_stamp_goes_into_whatever_metadata_the_object_has() {
        let stamp = || {
            let mut m = Metadata::new();
            m.insert("gateway/agent".into(), json!("a"));
            m.insert("gateway/route".into(), json!("r"));
            m
        };
        let base = json!({"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}});
        for (metadata, want) in [
            (None, json!({"gateway/agent": "a", "gateway/route": "r"})),
            (
                Some(json!({})),
                json!({"gateway/agent": "a", "gateway/route": "r"}),
            ),
            (
                Some(json!(null)),
                json!({"gateway/agent": "a", "gateway/route": "r"}),
            ),
            (
                Some(json!({"gateway/agent": "theirs", "x": 1})),
                json!({"gateway/agent": "a", "gateway/route": "r", "x": 1}),
            ),
            (
                Some(json!({"x": [1]})),
                json!({"gateway/agent": "a", "gateway/route": "r", "x": [1]}),
            ),
        ] {
            let mut task = base.clone();
            if let Some(m) = metadata.clone() {
                task["metadata"] = m;
            }
            let mut r = Relayed::read(Dialect::V10, &raw(json!({ "task": task }))).unwrap();
            r.rewrite(&|id| id.into(), None).unwrap();
            r.stamp = Some(stamp());
            assert_eq!(
                written(&r, Dialect::V10)["task"]["metadata"],
                want,
                "{metadata:?}"
            );
        }
    }

    #[test]
    fn a_0_3_message_is_tagged_and_malformed_results_are_refused() {
        let m = raw(
            json!({"kind": "message", "messageId": "m", "contextId": "c", "taskId": "t", "role": "agent", "parts": []}),
        );
        let mut r = Relayed::read(Dialect::V03, &m).unwrap();
        assert_eq!(
            (r.kind, r.context_id.as_deref()),
            (RelayedKind::Message, Some("c"))
        );
        r.rewrite(&|id| format!("up.{id}"), None).unwrap();
        assert_eq!(written(&r, Dialect::V03)["taskId"], "up.t");
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
            (
                Dialect::V10,
                with(json!({"history": [{"messageId": "1", "taskId": "t"}, 5]})),
            ),
            (
                Dialect::V10,
                with(json!({"history": [{"messageId": "1", "taskId": 5}]})),
            ),
            (
                Dialect::V10,
                with(json!({"history": [{"messageId": "1", "task_id": "t"}]})),
            ),
            (
                Dialect::V10,
                with(json!({"status": {"state": "x", "message": "not an object"}})),
            ),
        ] {
            assert!(
                Relayed::read(dialect, &raw(bad.clone()))
                    .and_then(|mut r| r.rewrite(&|i| i.into(), Some(1)))
                    .is_err(),
                "{bad}"
            );
        }
        let duplicate = RawValue::from_string(
            r#"{"task": {"id": "t", "id": "u", "contextId": "c", "status": {"state": "x"}}}"#
                .into(),
        )
        .unwrap();
        assert!(Relayed::read(Dialect::V10, &duplicate).is_err());
    }

    #[test]
    fn a_response_with_an_error_or_another_shape_is_not_relayed() {
        let ok = br#"{"jsonrpc":"2.0","id":"up-1","result":{"task":{"id":"t","contextId":"c","status":{"state":"TASK_STATE_COMPLETED"}}}}"#;
        assert!(Relayed::from_response(Dialect::V10, &Bytes::from_static(ok)).is_some());
        assert!(Relayed::from_response(Dialect::V03, &Bytes::from_static(ok)).is_none());
        let error = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"no"}}"#;
        assert!(Relayed::from_response(Dialect::V10, &Bytes::from_static(error)).is_none());
        assert!(
            Relayed::from_response(Dialect::V10, &Bytes::from_static(b"{\"result\":")).is_none()
        );
    }

    #[test]
    fn history_trimmed_to_nothing_and_escaped_ids_stay_valid() {
        let result = raw(json!({"task": {
            "id": "t\"1", "contextId": "c", "status": {"state": "TASK_STATE_COMPLETED"},
            "history": [{"messageId": "1", "taskId": "t\"1", "role": "ROLE_USER", "parts": []}]
        }}));
        let mut r = Relayed::read(Dialect::V10, &result).unwrap();
        r.rewrite(&|id| format!("up.{id}"), Some(0)).unwrap();
        let task = written(&r, Dialect::V10)["task"].clone();
        assert_eq!(task["id"], "up.t\"1");
        assert_eq!(task["history"], json!([]));
    }

    /// What strict clients refuse is repaired in place (a timestamp without a zone, the
    /// other dialect's spellings) or left to the conversion path (what cannot be).
    #[test]
    fn relayed_answers_are_valid_in_their_dialect() {
        let task = |state: &str, timestamp: serde_json::Value, role: &str| {
            json!({"id": "t", "contextId": "c",
                   "status": {"state": state, "timestamp": timestamp,
                              "message": {"kind": "message", "messageId": "m", "role": role, "parts": []}},
                   "history": [{"kind": "message", "messageId": "h", "role": role, "parts": [{"kind": "text", "text": "x"}]}],
                   "artifacts": [{"artifactId": "a", "parts": []}]})
        };
        let relayed = |dialect: Dialect, task: serde_json::Value| {
            let wrapped = match dialect {
                Dialect::V10 => json!({ "task": task }),
                _ => {
                    let mut t = task;
                    t["kind"] = json!("task");
                    t
                }
            };
            Relayed::read(dialect, &raw(wrapped)).map(|mut r| {
                r.rewrite(&|i| i.into(), None).unwrap();
                let out = written(&r, dialect);
                match dialect {
                    Dialect::V10 => out["task"].clone(),
                    _ => out,
                }
            })
        };
        // Valid as written: nothing changes (an offset and nanoseconds are RFC 3339).
        for at in [
            "2026-11-25T13:56:08.999342123+01:00",
            "2026-11-25T13:56:08Z",
        ] {
            let t = task("TASK_STATE_WORKING", json!(at), "ROLE_AGENT");
            assert_eq!(relayed(Dialect::V10, t.clone()).unwrap(), t);
        }
        // A zone-less timestamp is read as UTC; the other dialect's spellings are
        // repaired, in both directions.
        let t = relayed(
            Dialect::V10,
            task("completed", json!("2026-11-25T13:56:08.999342"), "agent"),
        )
        .unwrap();
        assert_eq!(t["status"]["timestamp"], "2026-11-25T13:56:08.999Z");
        assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(t["status"]["message"]["role"], "ROLE_AGENT");
        assert_eq!(t["history"][0]["role"], "ROLE_AGENT");
        assert_eq!(t["history"][0]["parts"][0]["text"], "x");
        let t = relayed(
            Dialect::V03,
            task(
                "TASK_STATE_INPUT_REQUIRED",
                json!("2026-11-25 13:56:08"),
                "ROLE_USER",
            ),
        );
        // (A space for the T is not a timestamp the model reads either.)
        assert!(t.is_err());
        let t = relayed(
            Dialect::V03,
            task(
                "TASK_STATE_INPUT_REQUIRED",
                json!("2026-11-25T13:56:08"),
                "ROLE_USER",
            ),
        )
        .unwrap();
        assert_eq!(t["status"]["state"], "input-required");
        assert_eq!(t["status"]["timestamp"], "2026-11-25T13:56:08.000Z");
        assert_eq!(t["history"][0]["role"], "user");
        // A trimmed message's repair goes with it.
        let mut r = Relayed::read(
            Dialect::V10,
            &raw(json!({"task": task("TASK_STATE_WORKING", json!(null), "agent")})),
        )
        .unwrap();
        r.rewrite(&|i| i.into(), Some(0)).unwrap();
        assert_eq!(written(&r, Dialect::V10)["task"]["history"], json!([]));
        // What cannot be repaired in place goes to the conversion path.
        for (why, t) in [
            (
                "unknown state",
                task("TASK_STATE_PONDERING", json!(null), "agent"),
            ),
            ("unknown role", task("working", json!(null), "robot")),
            ("not a time", task("working", json!("yesterday"), "agent")),
            ("a number", task("working", json!(1764078968), "agent")),
            ("no parts", {
                let mut t = task("working", json!(null), "agent");
                t["history"][0].as_object_mut().unwrap().remove("parts");
                t
            }),
            ("no messageId", {
                let mut t = task("working", json!(null), "agent");
                t["status"]["message"]
                    .as_object_mut()
                    .unwrap()
                    .remove("messageId");
                t
            }),
            ("no artifactId", {
                let mut t = task("working", json!(null), "agent");
                t["artifacts"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("artifactId");
                t
            }),
        ] {
            assert!(relayed(Dialect::V10, t).is_err(), "{why}");
        }
        // 0.3 messages need their kind.
        let mut t = task("working", json!(null), "agent");
        t["history"][0].as_object_mut().unwrap().remove("kind");
        assert!(relayed(Dialect::V10, t.clone()).is_ok());
        assert!(relayed(Dialect::V03, t).is_err());
        for at in [
            "2026-13-01T00:00:00Z",
            "2026-11-25T24:00:00Z",
            "2026-11-25T13:56:08.Z",
            "2026-11-25T13:56:08+0100",
            "2026-11-25",
        ] {
            assert!(!is_rfc3339(at), "{at}");
        }
    }

    /// What the reader skips it checks as serde_json does: a value in an extension field
    /// is accepted exactly when serde_json accepts it.
    #[test]
    fn what_is_skipped_is_checked_as_serde_json_checks_it() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let values = [
            "0",
            "-0",
            "01",
            "1.",
            "1.5",
            ".5",
            "1e",
            "1e+",
            "1E-7",
            "-",
            "1e400",
            "tru",
            "true",
            "null",
            "nul",
            "\"\"",
            "\"a\\\"b\"",
            "\"\\u0041\"",
            "\"\\ud800\"",
            "\"\\ud83d\\ude00\"",
            "\"\\x\"",
            "\"tab\there\"",
            "[1,]",
            "[,1]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{1:2}",
            "[]",
            "{}",
            " [ 1 , { \"b\" : [ ] } ] ",
            "\"é\"",
            "[1 2]",
        ];
        let deep_ok = deep(100);
        let deep_bad = deep(200);
        for value in values
            .iter()
            .copied()
            .chain([deep_ok.as_str(), deep_bad.as_str()])
        {
            let text = format!(
                r#"{{"task":{{"id":"t","contextId":"c","status":{{"state":"TASK_STATE_WORKING"}},"x":{value}}}}}"#
            );
            // As written: a number past f64's range is JSON too.
            // Nesting is bounded as serde_json bounds it for values (its raw values are
            // not): past 128 levels the relay refuses, and so does the conversion path.
            let serde_ok =
                serde_json::from_str::<&RawValue>(&text).is_ok() && value != deep_bad.as_str();
            let ours = read_result(&text, Dialect::V10, false).is_ok();
            assert_eq!(ours, serde_ok, "{value}");
        }
    }
}

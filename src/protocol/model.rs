//! The gateway's one canonical A2A model.
//!
//! Shaped after the normative 1.0 proto: `Serialize` produces exact 1.0 ProtoJSON (camelCase,
//! enum names, defaults omitted). `Deserialize` is deliberately lenient so one parser serves
//! every dialect a client may speak: 0.3 `kind`-tagged parts, 0.1 `type` tags, snake_case keys,
//! lowercase or numeric enums. The 0.3 output shapes live in [`super::v03`].

use chrono::{DateTime, SecondsFormat, Utc};
use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub type Metadata = Map<String, Value>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    #[default]
    Unspecified,
    User,
    Agent,
}

impl Role {
    pub fn v10_name(self) -> &'static str {
        match self {
            Role::Unspecified => "ROLE_UNSPECIFIED",
            Role::User => "ROLE_USER",
            Role::Agent => "ROLE_AGENT",
        }
    }

    /// 0.3 has no "unspecified" role; an unspecified role can only come from a lenient
    /// parse, and "user" is what every 0.3 SDK assumes for inbound messages.
    pub fn v03_name(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::User | Role::Unspecified => "user",
        }
    }
}

impl Serialize for Role {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.v10_name())
    }
}

impl Role {
    pub(crate) fn from_name(name: &str) -> Option<Role> {
        let bare = strip_prefix_ignore_case(name, "role_");
        [
            ("user", Role::User),
            ("agent", Role::Agent),
            ("unspecified", Role::Unspecified),
        ]
        .into_iter()
        .find(|(n, _)| bare.eq_ignore_ascii_case(n))
        .map(|(_, r)| r)
    }

    fn from_number(n: i64) -> Option<Role> {
        match n {
            0 => Some(Role::Unspecified),
            1 => Some(Role::User),
            2 => Some(Role::Agent),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EnumVisitor {
            from_name: Role::from_name,
            from_number: Role::from_number,
            what: "a role (\"user\", \"agent\", \"ROLE_USER\", \"ROLE_AGENT\" or 1, 2)",
        })
    }
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> &'a str {
    match s.get(..prefix.len()) {
        Some(head) if head.eq_ignore_ascii_case(prefix) => &s[prefix.len()..],
        _ => s,
    }
}

/// ProtoJSON enums arrive as names or numbers; this reads either without buffering.
struct EnumVisitor<T> {
    from_name: fn(&str) -> Option<T>,
    from_number: fn(i64) -> Option<T>,
    what: &'static str,
}

impl<T> de::Visitor<'_> for EnumVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.what)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.from_name)(v).ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        (self.from_number)(v).ok_or_else(|| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        i64::try_from(v)
            .ok()
            .and_then(self.from_number)
            .ok_or_else(|| E::invalid_value(de::Unexpected::Unsigned(v), &self))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskState {
    #[default]
    Unspecified,
    Submitted,
    Working,
    Completed,
    Failed,
    Canceled,
    InputRequired,
    Rejected,
    AuthRequired,
}

impl TaskState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected
        )
    }

    /// Interrupted states wait for the client; blocking sends and streams end there too.
    pub fn is_interrupted(self) -> bool {
        matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }

    pub fn ends_stream(self) -> bool {
        self.is_terminal() || self.is_interrupted()
    }

    /// The error for a subscription or a message to task `id`, which has already ended in
    /// this state.
    pub(crate) fn already_ended(self, id: &str) -> crate::error::GatewayError {
        crate::error::GatewayError::UnsupportedOperation(format!(
            "task {id} is already {}; start a new task (it may list this one in referenceTaskIds)",
            self.v03_name()
        ))
    }

    pub fn v10_name(self) -> &'static str {
        match self {
            TaskState::Unspecified => "TASK_STATE_UNSPECIFIED",
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::Rejected => "TASK_STATE_REJECTED",
            TaskState::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
        }
    }

    pub fn v03_name(self) -> &'static str {
        match self {
            TaskState::Unspecified => "unknown",
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
            TaskState::InputRequired => "input-required",
            TaskState::Rejected => "rejected",
            TaskState::AuthRequired => "auth-required",
        }
    }

    /// Accepts 1.0 names, 0.3 kebab names, the 0.3 REST `CANCELLED` spelling and proto numbers.
    pub fn parse_lenient(token: &str) -> Option<TaskState> {
        // The 1.0 names, as almost every peer writes them, first.
        if let Some(state) = Self::from_v10_name(token) {
            return Some(state);
        }
        if token.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
            if let Ok(n) = token.parse::<i64>() {
                return Self::from_number(n);
            }
        }
        let bare = strip_prefix_ignore_case(token, "task_state_");
        // '-' and '_' are interchangeable: "input-required" and "INPUT_REQUIRED".
        let same = |name: &str| {
            bare.len() == name.len()
                && bare.bytes().zip(name.bytes()).all(|(a, b)| {
                    a.eq_ignore_ascii_case(&b) || (matches!(a, b'-' | b'_') && b == b'-')
                })
        };
        [
            ("unspecified", TaskState::Unspecified),
            ("unknown", TaskState::Unspecified),
            ("submitted", TaskState::Submitted),
            ("working", TaskState::Working),
            ("completed", TaskState::Completed),
            ("failed", TaskState::Failed),
            ("canceled", TaskState::Canceled),
            ("cancelled", TaskState::Canceled),
            ("input-required", TaskState::InputRequired),
            ("rejected", TaskState::Rejected),
            ("auth-required", TaskState::AuthRequired),
        ]
        .into_iter()
        .find(|(name, _)| same(name))
        .map(|(_, state)| state)
    }

    pub(crate) fn from_v10_name(token: &str) -> Option<TaskState> {
        Some(match token {
            "TASK_STATE_COMPLETED" => TaskState::Completed,
            "TASK_STATE_WORKING" => TaskState::Working,
            "TASK_STATE_SUBMITTED" => TaskState::Submitted,
            "TASK_STATE_INPUT_REQUIRED" => TaskState::InputRequired,
            "TASK_STATE_FAILED" => TaskState::Failed,
            "TASK_STATE_CANCELED" => TaskState::Canceled,
            "TASK_STATE_REJECTED" => TaskState::Rejected,
            "TASK_STATE_AUTH_REQUIRED" => TaskState::AuthRequired,
            "TASK_STATE_UNSPECIFIED" => TaskState::Unspecified,
            _ => return None,
        })
    }

    fn from_number(n: i64) -> Option<TaskState> {
        Some(match n {
            0 => TaskState::Unspecified,
            1 => TaskState::Submitted,
            2 => TaskState::Working,
            3 => TaskState::Completed,
            4 => TaskState::Failed,
            5 => TaskState::Canceled,
            6 => TaskState::InputRequired,
            7 => TaskState::Rejected,
            8 => TaskState::AuthRequired,
            _ => return None,
        })
    }
}

impl Serialize for TaskState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.v10_name())
    }
}

impl<'de> Deserialize<'de> for TaskState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EnumVisitor {
            from_name: TaskState::parse_lenient,
            from_number: TaskState::from_number,
            what: "a task state (e.g. \"completed\" or \"TASK_STATE_COMPLETED\")",
        })
    }
}

/// What a part carries; exactly one of these in 1.0.
#[derive(Debug, Clone, PartialEq)]
pub enum PartContent {
    Text(String),
    /// Base64 as received; the gateway never needs the bytes themselves.
    Raw(String),
    Url(String),
    Data(Value),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub content: PartContent,
    pub metadata: Option<Metadata>,
    pub filename: Option<String>,
    pub media_type: Option<String>,
}

impl Part {
    pub fn text(text: impl Into<String>) -> Part {
        Part {
            content: PartContent::Text(text.into()),
            metadata: None,
            filename: None,
            media_type: None,
        }
    }

    pub fn as_text(&self) -> Option<&str> {
        match &self.content {
            PartContent::Text(t) => Some(t),
            _ => None,
        }
    }
}

impl Serialize for Part {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match &self.content {
            PartContent::Text(t) => m.serialize_entry("text", t)?,
            PartContent::Raw(b) => m.serialize_entry("raw", b)?,
            PartContent::Url(u) => m.serialize_entry("url", u)?,
            PartContent::Data(v) => m.serialize_entry("data", v)?,
        }
        if let Some(md) = &self.metadata {
            m.serialize_entry("metadata", md)?;
        }
        if let Some(f) = &self.filename {
            m.serialize_entry("filename", f)?;
        }
        if let Some(mt) = &self.media_type {
            m.serialize_entry("mediaType", mt)?;
        }
        m.end()
    }
}

/// Union of every part shape clients send: 1.0 (`text`/`raw`/`url`/`data`), 0.3 JSON-RPC
/// (`kind` + `file.{bytes,uri}`), 0.3 REST (`file.fileWithBytes`) and 0.1 (`type`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    kind: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    text: Option<String>,
    raw: Option<String>,
    url: Option<String>,
    file: Option<WireFile>,
    #[serde(default, deserialize_with = "present_value")]
    data: Option<Value>,
    metadata: Option<Metadata>,
    #[serde(alias = "file_name")]
    filename: Option<String>,
    #[serde(alias = "media_type")]
    media_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireFile {
    #[serde(alias = "fileWithBytes", alias = "file_with_bytes")]
    bytes: Option<String>,
    #[serde(alias = "fileWithUri", alias = "file_with_uri")]
    uri: Option<String>,
    name: Option<String>,
    #[serde(alias = "mime_type", alias = "mediaType", alias = "media_type")]
    mime_type: Option<String>,
}

/// Distinguishes `"data": null` (present) from an absent key.
fn present_value<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// File bytes must be base64 (standard or URL-safe alphabet, padded or not): they are passed
/// on as received, so a peer must not be the first to find them broken.
fn checked_base64<E: de::Error>(b64: String) -> Result<String, E> {
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
    use base64::engine::DecodePaddingMode;
    use base64::Engine;
    let lenient =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let standard = GeneralPurpose::new(&base64::alphabet::STANDARD, lenient);
    let url_safe = GeneralPurpose::new(&base64::alphabet::URL_SAFE, lenient);
    let trimmed = b64.trim();
    if standard.decode(trimmed).is_ok() || url_safe.decode(trimmed).is_ok() {
        Ok(b64)
    } else {
        Err(E::custom("file bytes are not valid base64"))
    }
}

/// Marker the SDKs put on a 0.3 data part that wraps a non-object 1.0 value.
pub const DATA_COMPAT_KEY: &str = "data_part_compat";

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = WirePart::deserialize(d)?;
        let tag = w.kind.as_deref().or(w.legacy_type.as_deref());
        let mut filename = w.filename;
        let mut media_type = w.media_type;
        let mut metadata = w.metadata;
        let content = if let Some(text) = w.text {
            PartContent::Text(text)
        } else if let Some(raw) = w.raw {
            PartContent::Raw(checked_base64(raw)?)
        } else if let Some(url) = w.url {
            PartContent::Url(url)
        } else if let Some(file) = w.file {
            filename = filename.or(file.name);
            media_type = media_type.or(file.mime_type);
            match (file.bytes, file.uri) {
                (Some(b), _) => PartContent::Raw(checked_base64(b)?),
                (None, Some(u)) => PartContent::Url(u),
                (None, None) => {
                    return Err(de::Error::custom("file part needs \"bytes\" or \"uri\""))
                }
            }
        } else if let Some(data) = w.data {
            let compat = metadata
                .as_mut()
                .and_then(|m| m.remove(DATA_COMPAT_KEY))
                .is_some_and(|v| v == Value::Bool(true));
            if metadata.as_ref().is_some_and(|m| m.is_empty()) {
                metadata = None;
            }
            match data {
                Value::Object(mut obj) if compat && obj.len() == 1 && obj.contains_key("value") => {
                    PartContent::Data(obj.remove("value").unwrap_or(Value::Null))
                }
                other => PartContent::Data(other),
            }
        } else {
            let what = tag.map_or(String::new(), |t| format!(" (kind \"{t}\")"));
            return Err(de::Error::custom(format!(
                "part{what} has none of \"text\", \"raw\", \"url\", \"file\" or \"data\""
            )));
        };
        Ok(Part {
            content,
            metadata,
            filename,
            media_type,
        })
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    #[serde(alias = "message_id")]
    pub message_id: String,
    #[serde(default, alias = "context_id", skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    #[serde(default, alias = "task_id", skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    pub role: Role,
    /// 0.3 REST calls the parts `content`.
    #[serde(alias = "content")]
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
    #[serde(
        default,
        alias = "reference_task_ids",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub reference_task_ids: Vec<String>,
}

impl Message {
    /// The message as it goes into a conversation: in task `task_id` (None for a reply
    /// that creates no task) of context `context_id`.
    pub fn placed(mut self, task_id: Option<&str>, context_id: &str) -> Message {
        self.task_id = task_id.map(str::to_string);
        self.context_id = Some(context_id.to_string());
        self
    }

    pub fn agent_text(text: impl Into<String>) -> Message {
        Message {
            message_id: new_id(),
            context_id: None,
            task_id: None,
            role: Role::Agent,
            parts: vec![Part::text(text)],
            metadata: None,
            extensions: Vec::new(),
            reference_task_ids: Vec::new(),
        }
    }

    /// All text parts joined; what text-oriented backends act on.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for t in self.parts.iter().filter_map(Part::as_text) {
            out.push_str(t);
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    #[serde(alias = "artifact_id")]
    pub artifact_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    pub state: TaskState,
    /// Boxed: most statuses have none, and inline it made every task, event and stored
    /// task ~180 bytes larger to move and to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Box<Message>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_timestamp",
        deserialize_with = "de_timestamp"
    )]
    pub timestamp: Option<DateTime<Utc>>,
}

/// Peers write timestamps many ways (no zone, offsets, nanoseconds); an unreadable one is
/// dropped rather than failing the whole message.
fn de_timestamp<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
    let raw: Option<String> = Option::deserialize(d)?;
    Ok(raw.as_deref().and_then(parse_timestamp))
}

impl TaskStatus {
    pub fn now(state: TaskState, message: Option<Message>) -> TaskStatus {
        TaskStatus::at(state, message, Some(Utc::now()))
    }

    /// A status of a moment already read (a task answered at once finishes when it was
    /// submitted: one clock read, not two).
    pub fn at(
        state: TaskState,
        message: Option<Message>,
        timestamp: Option<DateTime<Utc>>,
    ) -> TaskStatus {
        TaskStatus {
            state,
            message: message.map(Box::new),
            timestamp,
        }
    }
}

/// Millisecond precision with `Z`: every SDK's timestamp parser accepts it.
fn ser_timestamp<S: Serializer>(ts: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
    match ts {
        Some(t) => match rfc3339_millis(t) {
            Some(buf) => s.serialize_str(std::str::from_utf8(&buf).unwrap_or_default()),
            None => s.serialize_str(&format_timestamp(t)),
        },
        None => s.serialize_none(),
    }
}

pub fn format_timestamp(t: &DateTime<Utc>) -> String {
    match rfc3339_millis(t) {
        Some(ascii) => ascii.iter().map(|&b| char::from(b)).collect(),
        None => t.to_rfc3339_opts(SecondsFormat::Millis, true),
    }
}

/// [`format_timestamp`] without the formatting machinery, which showed in profiles of
/// every reply; None outside the years 0 to 9999, which chrono writes differently.
pub(crate) fn rfc3339_millis(t: &DateTime<Utc>) -> Option<[u8; 24]> {
    use chrono::{Datelike, Timelike};
    let year = u32::try_from(t.year()).ok().filter(|y| *y <= 9999)?;
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, value: u32, digits: usize| {
        let mut v = value;
        for i in (at..at + digits).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, year, 4);
    put(5, t.month(), 2);
    put(8, t.day(), 2);
    put(11, t.hour(), 2);
    put(14, t.minute(), 2);
    // A leap second's nanoseconds run past 1e9; chrono prints them as 60.xxx.
    let (second, millis) = match t.nanosecond() / 1_000_000 {
        m if m >= 1000 => (60, m - 1000),
        m => (t.second(), m),
    };
    put(17, second, 2);
    put(20, millis, 3);
    Some(out)
}

/// A fresh random id, spelled the usual way (lowercase, hyphenated).
pub fn new_id() -> String {
    let mut id = String::with_capacity(36);
    push_new_id(&mut id);
    id
}

/// Appends a fresh random id to `out`, as [`new_id`] spells it.
pub fn push_new_id(out: &mut String) {
    let mut buf = uuid::Uuid::encode_buffer();
    out.push_str(uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf));
}

/// ISO 8601, with or without a zone (no zone means UTC, as the reference advises).
pub fn parse_timestamp(s: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc));
    }
    chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
        .ok()
        .map(|n| n.and_utc())
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub id: String,
    #[serde(alias = "context_id")]
    pub context_id: String,
    pub status: TaskStatus,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

/// Entries a reply adds to the metadata of what it returns as it is written, replacing any
/// the object carries under the same keys. One stored task can so be answered to each
/// caller with its own note, without a copy to write the note into.
#[derive(Debug, Clone, Copy)]
pub struct Stamp<'a>([Option<(&'a str, &'a str)>; 2]);

impl<'a> Stamp<'a> {
    pub const NONE: Stamp<'static> = Stamp([None, None]);

    pub fn new(first: (&'a str, &'a str), second: Option<(&'a str, &'a str)>) -> Stamp<'a> {
        Stamp([Some(first), second])
    }

    pub fn entries(&self) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.0.into_iter().flatten()
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    fn has(&self, key: &str) -> bool {
        self.entries().any(|(k, _)| k == key)
    }

    /// The metadata written for an object whose own is `own`; None when there is none.
    pub fn metadata(self, own: Option<&'a Metadata>) -> Option<StampedMetadata<'a>> {
        (own.is_some() || !self.is_empty()).then_some(StampedMetadata { own, stamp: self })
    }
}

/// An object's own metadata entries, then a [`Stamp`]'s.
pub struct StampedMetadata<'a> {
    own: Option<&'a Metadata>,
    stamp: Stamp<'a>,
}

impl<'a> StampedMetadata<'a> {
    /// The object's own entries the stamp does not replace.
    pub(crate) fn own(&self) -> impl Iterator<Item = (&'a String, &'a Value)> + '_ {
        (self.own.into_iter().flatten()).filter(|(k, _)| !self.stamp.has(k))
    }

    pub(crate) fn stamp(&self) -> Stamp<'a> {
        self.stamp
    }
}

impl Serialize for StampedMetadata<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        for (k, v) in self.own() {
            m.serialize_entry(k, v)?;
        }
        for (k, v) in self.stamp.entries() {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// A task written with a [`Stamp`] on its metadata.
#[derive(Clone, Copy)]
pub struct Stamped<'a, T> {
    pub value: &'a T,
    pub stamp: Stamp<'a>,
}

impl Serialize for Task {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Stamped {
            value: self,
            stamp: Stamp::NONE,
        }
        .serialize(s)
    }
}

impl Serialize for Stamped<'_, Task> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = self.value;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("id", &t.id)?;
        m.serialize_entry("contextId", &t.context_id)?;
        m.serialize_entry("status", &t.status)?;
        if !t.artifacts.is_empty() {
            m.serialize_entry("artifacts", &t.artifacts)?;
        }
        if !t.history.is_empty() {
            m.serialize_entry("history", &t.history)?;
        }
        if let Some(md) = self.stamp.metadata(t.metadata.as_ref()) {
            m.serialize_entry("metadata", &md)?;
        }
        m.end()
    }
}

impl Task {
    /// The task's current status as a stream event: what a stream that missed the event
    /// which brought it there is shown instead.
    pub fn status_event(&self) -> StreamItem {
        StreamItem::StatusUpdate(TaskStatusUpdateEvent {
            task_id: self.id.clone(),
            context_id: self.context_id.clone(),
            status: self.status.clone(),
            metadata: None,
        })
    }

    /// A new task, submitted with its first (user) message.
    pub fn submitted(id: String, context_id: String, first: Message) -> Task {
        Task {
            id,
            context_id,
            status: TaskStatus::now(TaskState::Submitted, None),
            artifacts: Vec::new(),
            history: vec![first],
            metadata: None,
        }
    }

    /// [`Task::view`] of a task the caller owns, without copying what it keeps.
    pub fn trimmed(mut self, history_length: Option<usize>, include_artifacts: bool) -> Task {
        if let Some(n) = history_length {
            let excess = self.history.len().saturating_sub(n);
            self.history.drain(..excess);
        }
        if !include_artifacts {
            self.artifacts.clear();
        }
        self
    }

    /// A copy trimmed for a reader: `history_length` newest messages (0 = none, None = all)
    /// and, when `include_artifacts` is false, no artifacts at all.
    pub fn view(&self, history_length: Option<usize>, include_artifacts: bool) -> Task {
        let history = match history_length {
            None => self.history.clone(),
            Some(n) => self.history[self.history.len().saturating_sub(n)..].to_vec(),
        };
        Task {
            id: self.id.clone(),
            context_id: self.context_id.clone(),
            status: self.status.clone(),
            artifacts: if include_artifacts {
                self.artifacts.clone()
            } else {
                Vec::new()
            },
            history,
            metadata: self.metadata.clone(),
        }
    }

    /// Moves the task to `status`; its message, if any, also joins the history.
    pub fn set_status(&mut self, status: TaskStatus) {
        if let Some(m) = &status.message {
            self.history.push(Message::clone(m));
        }
        self.status = status;
    }

    /// Folds one event into the task, the way every subscriber will see it.
    pub fn apply(&mut self, event: &TaskEvent) {
        match event {
            TaskEvent::Status(s) => self.set_status(s.status.clone()),
            TaskEvent::Artifact(a) => self.apply_artifact(a),
        }
    }

    fn apply_artifact(&mut self, a: &TaskArtifactUpdateEvent) {
        let existing = self
            .artifacts
            .iter_mut()
            .find(|x| x.artifact_id == a.artifact.artifact_id);
        match existing {
            Some(x) if a.append => x.parts.extend(a.artifact.parts.iter().cloned()),
            Some(x) => *x = a.artifact.clone(),
            None => self.artifacts.push(a.artifact.clone()),
        }
    }
}

/// Read from peers too; 0.3's `final` and `kind` are ignored (the gateway decides where
/// its own streams end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusUpdateEvent {
    #[serde(alias = "task_id")]
    pub task_id: String,
    #[serde(default, alias = "context_id")]
    pub context_id: String,
    pub status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskArtifactUpdateEvent {
    #[serde(alias = "task_id")]
    pub task_id: String,
    #[serde(default, alias = "context_id")]
    pub context_id: String,
    pub artifact: Artifact,
    #[serde(default, skip_serializing_if = "is_false")]
    pub append: bool,
    #[serde(default, alias = "last_chunk", skip_serializing_if = "is_false")]
    pub last_chunk: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

/// A change to a stored task.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEvent {
    Status(TaskStatusUpdateEvent),
    Artifact(TaskArtifactUpdateEvent),
}

/// What a task takes in memory, roughly: the bytes of its strings and values plus a fixed
/// cost per object. The store is bounded by it (`[limits] max_stored_bytes`); it need not
/// be exact, only proportional, and it is cheap (no serialization).
pub trait ApproxBytes {
    fn approx_bytes(&self) -> usize;
}

/// What a struct, a vector's slot and an allocation's header cost besides their contents.
const OBJECT: usize = 64;

impl ApproxBytes for Part {
    fn approx_bytes(&self) -> usize {
        let content = match &self.content {
            PartContent::Text(t) | PartContent::Raw(t) | PartContent::Url(t) => t.len(),
            PartContent::Data(v) => value_bytes(v),
        };
        OBJECT
            + content
            + self.metadata.as_ref().map_or(0, map_bytes)
            + self.filename.as_ref().map_or(0, String::len)
            + self.media_type.as_ref().map_or(0, String::len)
    }
}

impl ApproxBytes for Message {
    fn approx_bytes(&self) -> usize {
        OBJECT
            + self.message_id.len()
            + self.context_id.as_ref().map_or(0, String::len)
            + self.task_id.as_ref().map_or(0, String::len)
            + self.parts.iter().map(Part::approx_bytes).sum::<usize>()
            + self.metadata.as_ref().map_or(0, map_bytes)
            + strings_bytes(&self.extensions)
            + strings_bytes(&self.reference_task_ids)
    }
}

impl ApproxBytes for Artifact {
    fn approx_bytes(&self) -> usize {
        OBJECT
            + self.artifact_id.len()
            + self.name.as_ref().map_or(0, String::len)
            + self.description.as_ref().map_or(0, String::len)
            + self.parts.iter().map(Part::approx_bytes).sum::<usize>()
            + self.metadata.as_ref().map_or(0, map_bytes)
            + strings_bytes(&self.extensions)
    }
}

impl ApproxBytes for Task {
    fn approx_bytes(&self) -> usize {
        OBJECT
            + self.id.len()
            + self.context_id.len()
            + self
                .status
                .message
                .as_deref()
                .map_or(0, Message::approx_bytes)
            + self
                .artifacts
                .iter()
                .map(Artifact::approx_bytes)
                .sum::<usize>()
            + self
                .history
                .iter()
                .map(Message::approx_bytes)
                .sum::<usize>()
            + self.metadata.as_ref().map_or(0, map_bytes)
    }
}

impl ApproxBytes for StreamItem {
    /// What the item takes held on its own (in a task's resume log).
    fn approx_bytes(&self) -> usize {
        OBJECT
            + match self {
                StreamItem::Task(t) => t.approx_bytes(),
                StreamItem::Message(m) => m.approx_bytes(),
                StreamItem::StatusUpdate(s) => {
                    s.task_id.len()
                        + s.context_id.len()
                        + s.status.message.as_deref().map_or(0, Message::approx_bytes)
                        + s.metadata.as_ref().map_or(0, map_bytes)
                }
                StreamItem::ArtifactUpdate(a) => {
                    a.task_id.len()
                        + a.context_id.len()
                        + a.artifact.approx_bytes()
                        + a.metadata.as_ref().map_or(0, map_bytes)
                }
            }
    }
}

impl ApproxBytes for TaskEvent {
    /// What applying the event may add to its task (a replaced artifact or status is
    /// counted as added: the estimate errs high).
    fn approx_bytes(&self) -> usize {
        match self {
            TaskEvent::Status(s) => {
                s.status.message.as_deref().map_or(0, Message::approx_bytes)
                    + s.metadata.as_ref().map_or(0, map_bytes)
            }
            TaskEvent::Artifact(a) => {
                a.artifact.approx_bytes() + a.metadata.as_ref().map_or(0, map_bytes)
            }
        }
    }
}

fn strings_bytes(v: &[String]) -> usize {
    v.iter().map(|s| OBJECT / 2 + s.len()).sum()
}

fn map_bytes(m: &Metadata) -> usize {
    m.iter()
        .map(|(k, v)| OBJECT / 2 + k.len() + value_bytes(v))
        .sum()
}

fn value_bytes(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => OBJECT / 4,
        Value::String(s) => OBJECT / 2 + s.len(),
        Value::Array(a) => OBJECT + a.iter().map(value_bytes).sum::<usize>(),
        Value::Object(m) => OBJECT + map_bytes(m),
    }
}

impl TaskEvent {
    /// Whether a stream closes after this event.
    pub fn ends_stream(&self) -> bool {
        match self {
            TaskEvent::Status(s) => s.status.state.ends_stream(),
            TaskEvent::Artifact(_) => false,
        }
    }

    /// Whether the task is over after this event (a subscription ends here).
    pub fn finishes_task(&self) -> bool {
        match self {
            TaskEvent::Status(s) => s.status.state.is_terminal(),
            TaskEvent::Artifact(_) => false,
        }
    }
}

/// One item of a stream: the 1.0 `StreamResponse` oneof.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamItem {
    Task(Task),
    Message(Message),
    StatusUpdate(TaskStatusUpdateEvent),
    ArtifactUpdate(TaskArtifactUpdateEvent),
}

impl From<TaskEvent> for StreamItem {
    fn from(e: TaskEvent) -> Self {
        match e {
            TaskEvent::Status(s) => StreamItem::StatusUpdate(s),
            TaskEvent::Artifact(a) => StreamItem::ArtifactUpdate(a),
        }
    }
}

impl StreamItem {
    /// The task the item is about; none for a Message.
    pub fn task_id(&self) -> Option<&str> {
        match self {
            StreamItem::Task(t) => Some(&t.id),
            StreamItem::StatusUpdate(s) => Some(&s.task_id),
            StreamItem::ArtifactUpdate(a) => Some(&a.task_id),
            StreamItem::Message(_) => None,
        }
    }

    /// Whether the stream closes after this item.
    pub fn ends_stream(&self) -> bool {
        match self {
            StreamItem::Message(_) => true,
            StreamItem::Task(t) => t.status.state.ends_stream(),
            StreamItem::StatusUpdate(s) => s.status.state.ends_stream(),
            StreamItem::ArtifactUpdate(_) => false,
        }
    }

    /// Whether the task is over after this item: a subscription, unlike a send's stream,
    /// stays open through interrupted states until this.
    pub fn finishes_task(&self) -> bool {
        match self {
            StreamItem::Message(_) => true,
            StreamItem::Task(t) => t.status.state.is_terminal(),
            StreamItem::StatusUpdate(s) => s.status.state.is_terminal(),
            StreamItem::ArtifactUpdate(_) => false,
        }
    }

    /// Folds the item into `task` (None until a stream's first task arrives): the task
    /// after it, as a subscriber that read the stream so far sees it.
    pub fn fold_into<'t>(&self, task: &'t mut Option<Task>) -> Option<&'t Task> {
        match (self, task.as_mut()) {
            (StreamItem::Task(t), _) => *task = Some(t.clone()),
            (StreamItem::StatusUpdate(s), Some(t)) => t.set_status(s.status.clone()),
            (StreamItem::ArtifactUpdate(a), Some(t)) => t.apply_artifact(a),
            _ => return None,
        }
        task.as_ref()
    }
}

/// Where a stream of task events ends: a send's at the first terminal or interrupted state
/// (the caller answers and sends again), a subscription's only when the task is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    Interrupted,
    Terminal,
}

impl StreamEnd {
    /// Whether `item` is the last of such a stream (0.3 and 0.1 mark it `final`).
    pub fn closes(self, item: &StreamItem) -> bool {
        match self {
            StreamEnd::Interrupted => item.ends_stream(),
            StreamEnd::Terminal => item.finishes_task(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_stamp_adds_to_metadata_and_wins_over_its_own_keys() {
        let mut task = Task::submitted("t".into(), "c".into(), Message::default());
        let stamp = Stamp::new(
            ("gateway/agent", "echo"),
            Some(("gateway/route", "default")),
        );
        let written = |task: &Task| {
            let v10 = serde_json::to_value(Stamped { value: task, stamp }).unwrap();
            let v03 = serde_json::to_value(super::super::v03::V03(&Stamped { value: task, stamp }))
                .unwrap();
            assert_eq!(v10["metadata"], v03["metadata"]);
            v10["metadata"].clone()
        };
        assert_eq!(
            written(&task),
            json!({"gateway/agent": "echo", "gateway/route": "default"})
        );
        task.metadata = Some(
            json!({"gateway/agent": "old", "x": 1})
                .as_object()
                .unwrap()
                .clone(),
        );
        assert_eq!(
            written(&task),
            json!({"gateway/agent": "echo", "gateway/route": "default", "x": 1})
        );
        // Unstamped, a task is written as it is.
        assert_eq!(
            serde_json::to_value(&task).unwrap()["metadata"]["gateway/agent"],
            "old"
        );
        task.metadata = None;
        assert!(serde_json::to_value(&task)
            .unwrap()
            .get("metadata")
            .is_none());
    }

    #[test]
    fn timestamps_are_written_like_chrono_writes_them() {
        let cases = [
            "2026-11-22T05:25:36.863Z",
            "0001-01-01T00:00:00.000Z",
            "9999-12-31T23:59:59.999Z",
            "2016-12-31T23:59:60.500Z",
            "2024-02-29T12:07:03.040Z",
        ];
        for case in cases {
            let t = DateTime::parse_from_rfc3339(case)
                .unwrap()
                .with_timezone(&Utc);
            let chrono = t.to_rfc3339_opts(SecondsFormat::Millis, true);
            assert_eq!(format_timestamp(&t), chrono);
            assert_eq!(
                serde_json::to_value(TaskStatus {
                    state: TaskState::Working,
                    message: None,
                    timestamp: Some(t),
                })
                .unwrap()["timestamp"],
                json!(chrono)
            );
        }
        // Five-digit years fall back to chrono.
        let far = DateTime::parse_from_rfc3339("9999-12-31T23:59:59Z")
            .unwrap()
            .with_timezone(&Utc)
            + chrono::Duration::days(400);
        assert_eq!(
            format_timestamp(&far),
            far.to_rfc3339_opts(SecondsFormat::Millis, true)
        );
    }

    #[test]
    fn parts_parse_from_every_dialect() {
        let cases = [
            (
                json!({"kind":"text","text":"hi"}),
                PartContent::Text("hi".into()),
            ),
            (
                json!({"type":"text","text":"hi"}),
                PartContent::Text("hi".into()),
            ),
            (json!({"text":"hi"}), PartContent::Text("hi".into())),
            (json!({"raw":"aGk="}), PartContent::Raw("aGk=".into())),
            (
                json!({"kind":"file","file":{"bytes":"aGk="}}),
                PartContent::Raw("aGk=".into()),
            ),
            (
                json!({"file":{"fileWithUri":"http://x"}}),
                PartContent::Url("http://x".into()),
            ),
            (
                json!({"url":"http://x"}),
                PartContent::Url("http://x".into()),
            ),
            (json!({"data":[1,2]}), PartContent::Data(json!([1, 2]))),
            (
                json!({"kind":"data","data":{"value":3},"metadata":{"data_part_compat":true}}),
                PartContent::Data(json!(3)),
            ),
        ];
        for (input, want) in cases {
            let part: Part = serde_json::from_value(input.clone()).unwrap();
            assert_eq!(part.content, want, "input {input}");
        }
        assert!(serde_json::from_value::<Part>(json!({"kind":"text"})).is_err());
    }

    #[test]
    fn states_parse_leniently() {
        for (s, want) in [
            ("completed", TaskState::Completed),
            ("TASK_STATE_CANCELLED", TaskState::Canceled),
            ("input-required", TaskState::InputRequired),
            ("TASK_STATE_INPUT_REQUIRED", TaskState::InputRequired),
            ("3", TaskState::Completed),
        ] {
            assert_eq!(TaskState::parse_lenient(s), Some(want), "{s}");
        }
    }

    #[test]
    fn history_view_keeps_newest() {
        let mut t = Task {
            id: "t".into(),
            context_id: "c".into(),
            status: TaskStatus::now(TaskState::Working, None),
            artifacts: vec![],
            history: vec![],
            metadata: None,
        };
        for i in 0..3 {
            let mut m = Message::agent_text(i.to_string());
            m.message_id = i.to_string();
            t.history.push(m);
        }
        assert_eq!(t.view(Some(2), true).history[0].message_id, "1");
        assert!(t.view(Some(0), true).history.is_empty());
        assert_eq!(t.view(None, true).history.len(), 3);
        assert_eq!(t.clone().trimmed(Some(2), true).history[0].message_id, "1");
        assert!(t.clone().trimmed(Some(0), false).history.is_empty());
        assert_eq!(t.clone().trimmed(None, true), t.view(None, true));
    }
}

#[cfg(test)]
mod id_tests {
    #[test]
    fn new_ids_are_lowercase_hyphenated_version_4_uuids() {
        let id = super::new_id();
        let parsed = uuid::Uuid::try_parse(&id).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        assert_eq!(parsed.hyphenated().to_string(), id);
    }
}

#[cfg(test)]
mod state_name_tests {
    use super::TaskState;

    #[test]
    fn every_state_reads_back_from_its_1_0_and_0_3_names() {
        for state in [
            TaskState::Unspecified,
            TaskState::Submitted,
            TaskState::Working,
            TaskState::Completed,
            TaskState::Failed,
            TaskState::Canceled,
            TaskState::InputRequired,
            TaskState::Rejected,
            TaskState::AuthRequired,
        ] {
            assert_eq!(TaskState::parse_lenient(state.v10_name()), Some(state));
            if state != TaskState::Unspecified {
                assert_eq!(TaskState::parse_lenient(state.v03_name()), Some(state));
            }
        }
        assert_eq!(TaskState::parse_lenient("3"), Some(TaskState::Completed));
        assert_eq!(TaskState::parse_lenient("-1"), None);
        assert_eq!(
            TaskState::parse_lenient("CANCELLED"),
            Some(TaskState::Canceled)
        );
    }
}

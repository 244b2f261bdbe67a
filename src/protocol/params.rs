//! Request params of every operation, parsed leniently (camelCase or snake_case, unknown
//! fields ignored) and then checked, so the service layer only sees values it can act on.

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::model::{parse_timestamp, Message, Metadata, TaskState};
use super::Dialect;
use crate::error::GatewayError;

/// Decodes params, naming the offending field path in the error
/// (`params.message.parts[0]: ...`).
pub fn decode<T: DeserializeOwned>(raw: Option<&RawValue>) -> Result<T, GatewayError> {
    let text = raw.map_or("{}", RawValue::get);
    let text = if text.trim() == "null" { "{}" } else { text };
    // Path tracking costs a few percent of a request, so it runs only to explain a failure.
    if let Ok(value) = serde_json::from_str(text) {
        return Ok(value);
    }
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let msg = strip_position(&inner.to_string());
        if path == "." || path.is_empty() {
            GatewayError::InvalidParams(msg)
        } else {
            GatewayError::InvalidParams(format!("params.{path}: {msg}"))
        }
    })
}

/// serde_json appends "at line 1 column 57"; the field path says more.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendParams {
    pub message: Message,
    #[serde(default)]
    pub configuration: Option<SendConfiguration>,
    #[serde(default)]
    pub metadata: Option<Metadata>,
    /// 0.1 `tasks/send` named the conversation `sessionId`.
    #[serde(default, alias = "session_id")]
    pub session_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendConfiguration {
    #[serde(default, alias = "accepted_output_modes")]
    pub accepted_output_modes: Vec<String>,
    #[serde(default, alias = "history_length")]
    pub history_length: Option<i64>,
    #[serde(default)]
    pub blocking: Option<bool>,
    #[serde(default, alias = "return_immediately")]
    pub return_immediately: Option<bool>,
    #[serde(
        default,
        alias = "push_notification_config",
        alias = "taskPushNotificationConfig",
        alias = "task_push_notification_config"
    )]
    pub push_notification_config: Option<Value>,
}

impl SendConfiguration {
    /// `returnImmediately` (1.0) and `blocking` (0.3) are inverses; both default to blocking.
    pub fn blocking(&self) -> bool {
        !self.return_immediately.unwrap_or(false) && self.blocking.unwrap_or(true)
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskIdParams {
    #[serde(alias = "taskId", alias = "task_id")]
    pub id: String,
    #[serde(default, alias = "history_length")]
    pub history_length: Option<i64>,
    #[serde(default)]
    pub metadata: Option<Metadata>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksParams {
    #[serde(default, alias = "context_id")]
    pub context_id: Option<String>,
    #[serde(default, deserialize_with = "state_filter")]
    pub status: Option<TaskState>,
    #[serde(default, alias = "page_size")]
    pub page_size: Option<i64>,
    #[serde(default, alias = "page_token")]
    pub page_token: Option<String>,
    #[serde(default, alias = "history_length")]
    pub history_length: Option<i64>,
    #[serde(default, alias = "status_timestamp_after")]
    pub status_timestamp_after: Option<String>,
    #[serde(default, alias = "include_artifacts")]
    pub include_artifacts: Option<bool>,
}

/// The `status` filter of `ListTasks`, read as the official servers read it: an unset enum
/// as clients write it (`UNRECOGNIZED` from @a2a-js/sdk, the unspecified value, `null`) or a
/// spelling no state has means no filter. Only a value that is not an enum at all (an
/// object, a list, a boolean) is an error.
fn state_filter<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<TaskState>, D::Error> {
    struct Filter;
    impl serde::de::Visitor<'_> for Filter {
        type Value = Option<TaskState>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a task state (e.g. \"TASK_STATE_WORKING\")")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(TaskState::parse_lenient(v))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(TaskState::parse_lenient(&v.to_string()))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(TaskState::parse_lenient(&v.to_string()))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(Filter)
}

pub const DEFAULT_PAGE_SIZE: usize = 50;
pub const MAX_PAGE_SIZE: usize = 100;

/// A checked `ListTasks` query.
#[derive(Debug, Clone)]
pub struct ListQuery {
    pub context_id: Option<String>,
    pub state: Option<TaskState>,
    pub page_size: usize,
    pub page_token: Option<String>,
    pub history_length: Option<usize>,
    pub status_after: Option<DateTime<Utc>>,
    pub include_artifacts: bool,
}

impl ListQuery {
    /// The first page of `page_size` tasks, unfiltered, with artifacts when `artifacts`
    /// (what tests of the stores start from).
    #[cfg(test)]
    pub(crate) fn first_page(page_size: usize, artifacts: bool) -> ListQuery {
        ListQuery {
            context_id: None,
            state: None,
            page_size,
            page_token: None,
            history_length: None,
            status_after: None,
            include_artifacts: artifacts,
        }
    }
}

impl ListTasksParams {
    pub fn check(self) -> Result<ListQuery, GatewayError> {
        let page_size = match self.page_size {
            None | Some(0) => DEFAULT_PAGE_SIZE,
            Some(n) if (1..=MAX_PAGE_SIZE as i64).contains(&n) => n as usize,
            Some(n) => {
                return Err(GatewayError::InvalidParams(format!(
                    "params.pageSize: must be between 1 and {MAX_PAGE_SIZE}, got {n}"
                )))
            }
        };
        let status_after = match self.status_timestamp_after.as_deref() {
            None | Some("") => None,
            Some(s) => Some(parse_timestamp(s).ok_or_else(|| {
                GatewayError::InvalidParams(format!(
                    "params.statusTimestampAfter: \"{s}\" is not an ISO 8601 timestamp"
                ))
            })?),
        };
        Ok(ListQuery {
            context_id: self.context_id.filter(|c| !c.is_empty()),
            state: self.status.filter(|s| *s != TaskState::Unspecified),
            page_size,
            page_token: self.page_token.filter(|t| !t.is_empty()),
            history_length: history_length(self.history_length, Dialect::V10)?,
            status_after,
            include_artifacts: self.include_artifacts.unwrap_or(false),
        })
    }
}

/// `historyLength` per dialect: 1.0 `0` means no history, while 0.3 SDKs read `0` as "do
/// not trim" (trap 6 of the reference). `None` means the whole history.
pub fn history_length(raw: Option<i64>, dialect: Dialect) -> Result<Option<usize>, GatewayError> {
    match (raw, dialect) {
        // 0.1 clients that name no length get no history (its task answers carry none).
        (None, Dialect::V01) => Ok(Some(0)),
        (None, _) => Ok(None),
        (Some(n), _) if n < 0 => Err(GatewayError::InvalidParams(format!(
            "params.historyLength: must not be negative, got {n}"
        ))),
        (Some(0), Dialect::V03) => Ok(None),
        (Some(n), _) => Ok(Some(n as usize)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    #[test]
    fn errors_name_the_field() {
        let err = decode::<SendParams>(Some(&raw(
            r#"{"message":{"messageId":"m","role":"user","parts":[{"kind":"text"}]}}"#,
        )))
        .unwrap_err();
        assert!(err.to_string().contains("params.message.parts[0]"), "{err}");
        let err = decode::<SendParams>(Some(&raw("{}"))).unwrap_err();
        assert!(err.to_string().contains("missing field `message`"), "{err}");
    }

    #[test]
    fn an_unset_or_unknown_status_filter_is_no_filter() {
        let status = |json: &str| {
            decode::<ListTasksParams>(Some(&raw(json)))
                .map(|p| p.check().map(|q| q.state).ok())
                .ok()
        };
        for unset in [
            r#"{"status":"UNRECOGNIZED"}"#,
            r#"{"status":"TASK_STATE_UNSPECIFIED"}"#,
            r#"{"status":0}"#,
            r#"{"status":-1}"#,
            r#"{"status":null}"#,
            r#"{"status":"no-such-state"}"#,
            r#"{}"#,
        ] {
            assert_eq!(status(unset), Some(Some(None)), "{unset}");
        }
        assert_eq!(
            status(r#"{"status":"working"}"#),
            Some(Some(Some(TaskState::Working)))
        );
        assert_eq!(
            status(r#"{"status":6}"#),
            Some(Some(Some(TaskState::InputRequired)))
        );
        assert_eq!(status(r#"{"status":{"state":"working"}}"#), None);
        assert_eq!(status(r#"{"status":true}"#), None);
    }

    #[test]
    fn blocking_flags_are_inverses() {
        let c = |b, r| SendConfiguration {
            blocking: b,
            return_immediately: r,
            ..Default::default()
        };
        assert!(c(None, None).blocking());
        assert!(!c(Some(false), None).blocking());
        assert!(!c(None, Some(true)).blocking());
    }
}

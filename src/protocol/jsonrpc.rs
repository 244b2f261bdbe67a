//! JSON-RPC 2.0 envelopes: turning request bytes into a typed [`RpcRequest`] with a precise
//! error for every way a body can be wrong, and rendering results and errors per dialect.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use super::Dialect;
use crate::error::GatewayError;

/// Every A2A operation, whichever dialect named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    SendMessage,
    SendStreamingMessage,
    GetTask,
    ListTasks,
    CancelTask,
    SubscribeToTask,
    PushNotificationConfig,
    GetExtendedAgentCard,
}

impl Method {
    /// Maps a method name to the operation and the dialect the name belongs to.
    pub fn lookup(name: &str) -> Option<(Method, Dialect)> {
        use Dialect::*;
        use Method::*;
        Some(match name {
            "SendMessage" => (SendMessage, V10),
            "SendStreamingMessage" => (SendStreamingMessage, V10),
            "GetTask" => (GetTask, V10),
            "ListTasks" => (ListTasks, V10),
            "CancelTask" => (CancelTask, V10),
            "SubscribeToTask" => (SubscribeToTask, V10),
            "CreateTaskPushNotificationConfig"
            | "GetTaskPushNotificationConfig"
            | "ListTaskPushNotificationConfigs"
            | "DeleteTaskPushNotificationConfig" => (PushNotificationConfig, V10),
            "GetExtendedAgentCard" => (GetExtendedAgentCard, V10),
            // 0.1 names are aliases: same params as 0.3 apart from the ignored session fields.
            "message/send" | "tasks/send" => (SendMessage, V03),
            "message/stream" | "tasks/sendSubscribe" => (SendStreamingMessage, V03),
            "tasks/get" => (GetTask, V03),
            "tasks/cancel" => (CancelTask, V03),
            "tasks/resubscribe" => (SubscribeToTask, V03),
            "tasks/pushNotificationConfig/set"
            | "tasks/pushNotificationConfig/get"
            | "tasks/pushNotificationConfig/list"
            | "tasks/pushNotificationConfig/delete"
            | "tasks/pushNotification/set"
            | "tasks/pushNotification/get" => (PushNotificationConfig, V03),
            "agent/getAuthenticatedExtendedCard" => (GetExtendedAgentCard, V03),
            _ => return None,
        })
    }

    pub fn is_streaming(self) -> bool {
        matches!(self, Method::SendStreamingMessage | Method::SubscribeToTask)
    }
}

/// A validated request, borrowing from the body. `params` stays raw until the operation
/// knows its type.
#[derive(Debug)]
pub struct RpcRequest<'a> {
    pub id: Value,
    pub method: Method,
    pub dialect: Dialect,
    pub params: Option<&'a RawValue>,
}

/// A request that failed before it could be dispatched, with what is needed to answer it.
#[derive(Debug)]
pub struct RpcFailure {
    pub id: Value,
    pub dialect: Dialect,
    pub error: GatewayError,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<Text<'a>>,
    id: Option<Value>,
    #[serde(borrow)]
    method: Option<Text<'a>>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
}

/// A member that should be a string, read without copying it when it has no escapes;
/// anything else is only remembered as "not a string".
enum Text<'a> {
    Str(Cow<'a, str>),
    NotStr,
}

impl<'a> Text<'a> {
    fn as_str(&self) -> Option<&str> {
        match self {
            Text::Str(s) => Some(s),
            Text::NotStr => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> serde::de::Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text::Str(Cow::Owned(v.to_string())))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Text<'de>, E> {
                Ok(Text::NotStr)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Text<'de>, E> {
                Ok(Text::NotStr)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Text<'de>, E> {
                Ok(Text::NotStr)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Text<'de>, E> {
                Ok(Text::NotStr)
            }
            fn visit_unit<E>(self) -> Result<Text<'de>, E> {
                Ok(Text::NotStr)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Text<'de>, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Text::NotStr)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Text<'de>, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Text::NotStr)
            }
        }
        d.deserialize_any(TextVisitor)
    }
}

/// Parses and validates an envelope. `header` is the caller's `A2A-Version`, already parsed.
pub fn parse_request(body: &[u8], header: Option<Dialect>) -> Result<RpcRequest<'_>, RpcFailure> {
    let fallback = header.unwrap_or(Dialect::V03);
    let fail = |id: Value, dialect, error| RpcFailure { id, dialect, error };
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if first != Some(b'{') {
        let error = match serde_json::from_slice::<IgnoredAny>(body) {
            Err(e) => GatewayError::Parse(e.to_string()),
            Ok(_) if first == Some(b'[') => GatewayError::InvalidRequest(
                "batch requests are not supported; send one JSON-RPC request object per HTTP request".into(),
            ),
            Ok(_) => GatewayError::InvalidRequest(
                "the body must be a JSON-RPC 2.0 request object".into(),
            ),
        };
        return Err(fail(Value::Null, fallback, error));
    }
    let env: Envelope = serde_json::from_slice(body).map_err(|e| {
        let error = if e.is_data() {
            GatewayError::InvalidRequest(e.to_string())
        } else {
            GatewayError::Parse(e.to_string())
        };
        fail(Value::Null, fallback, error)
    })?;
    let id = match env.id {
        Some(id @ (Value::String(_) | Value::Number(_))) => id,
        Some(Value::Null) | None => {
            return Err(fail(
                Value::Null,
                fallback,
                GatewayError::InvalidRequest(
                    "\"id\" is required (a string or number); notifications are not supported"
                        .into(),
                ),
            ))
        }
        Some(_) => {
            return Err(fail(
                Value::Null,
                fallback,
                GatewayError::InvalidRequest("\"id\" must be a string or a number".into()),
            ))
        }
    };
    if env.jsonrpc.as_ref().and_then(Text::as_str) != Some("2.0") {
        return Err(fail(
            id,
            fallback,
            GatewayError::InvalidRequest("\"jsonrpc\" must be exactly \"2.0\"".into()),
        ));
    }
    let name = match env.method {
        Some(Text::Str(name)) => name,
        Some(Text::NotStr) => {
            return Err(fail(
                id,
                fallback,
                GatewayError::InvalidRequest("\"method\" must be a string".into()),
            ))
        }
        None => {
            return Err(fail(
                id,
                fallback,
                GatewayError::InvalidRequest("\"method\" is required".into()),
            ))
        }
    };
    let Some((method, dialect)) = Method::lookup(&name) else {
        return Err(fail(
            id,
            fallback,
            GatewayError::MethodNotFound(name.into_owned()),
        ));
    };
    if let Some(p) = &env.params {
        let kind = p.get().trim_start().as_bytes().first().copied();
        if kind != Some(b'{') && p.get().trim() != "null" {
            return Err(fail(
                id,
                dialect,
                GatewayError::InvalidParams("\"params\" must be an object".into()),
            ));
        }
    }
    Ok(RpcRequest {
        id,
        method,
        dialect,
        params: env.params,
    })
}

#[derive(Serialize)]
struct Success<'a, R: Serialize> {
    jsonrpc: &'static str,
    id: &'a Value,
    result: R,
}

#[derive(Serialize)]
struct Failure<'a> {
    jsonrpc: &'static str,
    id: &'a Value,
    error: ErrorObject,
}

#[derive(Serialize)]
struct ErrorObject {
    code: i64,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Value>,
}

/// Room for a typical answer (a one-message task is about 500 bytes), so writing one does
/// not grow the buffer several times over.
const RESULT_CAPACITY: usize = 1024;

pub fn render_result<R: Serialize>(id: &Value, result: R) -> Result<Vec<u8>, GatewayError> {
    let mut out = Vec::with_capacity(RESULT_CAPACITY);
    serde_json::to_writer(
        &mut out,
        &Success {
            jsonrpc: "2.0",
            id,
            result,
        },
    )
    .map_err(|e| GatewayError::Internal(format!("serializing result: {e}")))?;
    Ok(out)
}

pub fn render_error(id: &Value, dialect: Dialect, error: &GatewayError) -> Vec<u8> {
    let data = match dialect {
        Dialect::V03 => error.data_v03(),
        Dialect::V10 => Some(error.data_v10()),
    };
    let body = Failure {
        jsonrpc: "2.0",
        id,
        error: ErrorObject {
            code: error.code(),
            message: error.public_message(),
            data,
        },
    };
    // Serializing plain strings and numbers cannot fail; the fallback keeps the promise that
    // every failure is still a JSON-RPC body.
    serde_json::to_vec(&body).unwrap_or_else(|_| {
        br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal error"}}"#
            .to_vec()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str) -> i64 {
        parse_request(body.as_bytes(), None)
            .unwrap_err()
            .error
            .code()
    }

    #[test]
    fn envelope_errors_are_precise() {
        assert_eq!(code("{not json"), -32700);
        assert_eq!(code(""), -32700);
        assert_eq!(code("[1]"), -32600);
        assert_eq!(code("42"), -32600);
        assert_eq!(code(r#"{"jsonrpc":"2.0","method":"GetTask"}"#), -32600);
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":1,"method":"GetTask"}"#),
            -32600
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":7}"#), -32600);
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":"Nope"}"#), -32601);
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1]}"#),
            -32602
        );
    }

    #[test]
    fn method_names_pick_the_dialect() {
        let r = parse_request(
            br#"{"jsonrpc":"2.0","id":"a","method":"tasks/get","params":{"id":"x"}}"#,
            Some(Dialect::V10),
        )
        .unwrap();
        assert_eq!((r.method, r.dialect), (Method::GetTask, Dialect::V03));
    }
}

//! JSON-RPC 2.0 envelopes: turning request bytes into a typed [`RpcRequest`] with a precise
//! error for every way a body can be wrong, and rendering results and errors per dialect.

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use super::params::SendParams;
use super::push::PushOp;
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
    Push(PushOp),
    GetExtendedAgentCard,
}

impl Method {
    /// The 1.0 name.
    pub fn name(self) -> &'static str {
        match self {
            Method::SendMessage => "SendMessage",
            Method::SendStreamingMessage => "SendStreamingMessage",
            Method::GetTask => "GetTask",
            Method::ListTasks => "ListTasks",
            Method::CancelTask => "CancelTask",
            Method::SubscribeToTask => "SubscribeToTask",
            Method::Push(PushOp::Set) => "CreateTaskPushNotificationConfig",
            Method::Push(PushOp::Get) => "GetTaskPushNotificationConfig",
            Method::Push(PushOp::List) => "ListTaskPushNotificationConfigs",
            Method::Push(PushOp::Delete) => "DeleteTaskPushNotificationConfig",
            Method::GetExtendedAgentCard => "GetExtendedAgentCard",
        }
    }

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
            "CreateTaskPushNotificationConfig" => (Push(PushOp::Set), V10),
            "GetTaskPushNotificationConfig" => (Push(PushOp::Get), V10),
            "ListTaskPushNotificationConfigs" => (Push(PushOp::List), V10),
            "DeleteTaskPushNotificationConfig" => (Push(PushOp::Delete), V10),
            "GetExtendedAgentCard" => (GetExtendedAgentCard, V10),
            "message/send" => (SendMessage, V03),
            "message/stream" => (SendStreamingMessage, V03),
            // 0.1 shares its task method names with 0.3; those answer a 0.1 caller in its
            // own shapes when the task is one it named (see rpc.rs).
            "tasks/send" => (SendMessage, V01),
            "tasks/sendSubscribe" => (SendStreamingMessage, V01),
            "tasks/pushNotification/set" => (Push(PushOp::Set), V01),
            "tasks/pushNotification/get" => (Push(PushOp::Get), V01),
            "tasks/get" => (GetTask, V03),
            "tasks/cancel" => (CancelTask, V03),
            "tasks/resubscribe" => (SubscribeToTask, V03),
            "tasks/pushNotificationConfig/set" => (Push(PushOp::Set), V03),
            "tasks/pushNotificationConfig/get" => (Push(PushOp::Get), V03),
            "tasks/pushNotificationConfig/list" => (Push(PushOp::List), V03),
            "tasks/pushNotificationConfig/delete" => (Push(PushOp::Delete), V03),
            "agent/getAuthenticatedExtendedCard" => (GetExtendedAgentCard, V03),
            _ => return None,
        })
    }

    pub fn is_streaming(self) -> bool {
        matches!(self, Method::SendStreamingMessage | Method::SubscribeToTask)
    }
}

/// A request's id as the caller wrote it: strings, null and integers that fit 64 bits as
/// values; any other number (past 64 bits, a fraction, an exponent) as its text, so that it
/// comes back exactly as sent rather than rounded through a float.
#[derive(Debug, Clone)]
pub enum RpcId {
    Value(Value),
    Raw(Box<RawValue>),
}

impl RpcId {
    pub const NULL: RpcId = RpcId::Value(Value::Null);

    pub fn is_null(&self) -> bool {
        matches!(self, RpcId::Value(Value::Null))
    }

    /// An id as written, or None when it is not a string, a number or null.
    fn read(raw: &RawValue) -> Option<RpcId> {
        let text = raw.get();
        match serde_json::from_str::<Value>(text).ok()? {
            v @ (Value::Null | Value::String(_)) => Some(RpcId::Value(v)),
            Value::Number(n) if n.is_i64() || n.is_u64() => Some(RpcId::Value(Value::Number(n))),
            Value::Number(_) => Some(RpcId::Raw(raw.to_owned())),
            _ => None,
        }
    }
}

impl From<Value> for RpcId {
    fn from(v: Value) -> RpcId {
        RpcId::Value(v)
    }
}

impl PartialEq for RpcId {
    fn eq(&self, other: &RpcId) -> bool {
        match (self, other) {
            (RpcId::Value(a), RpcId::Value(b)) => a == b,
            (RpcId::Raw(a), RpcId::Raw(b)) => a.get() == b.get(),
            _ => false,
        }
    }
}

impl Serialize for RpcId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RpcId::Value(v) => v.serialize(s),
            RpcId::Raw(r) => r.serialize(s),
        }
    }
}

/// A validated request, borrowing from the body. `params` stays raw until the operation
/// knows its type, unless a send's were decoded in the envelope's pass (`send`).
#[derive(Debug)]
pub struct RpcRequest<'a> {
    pub id: RpcId,
    pub method: Method,
    pub dialect: Dialect,
    pub params: Option<&'a RawValue>,
    /// Boxed: the request is moved several times on its way, and a send's params are large.
    pub send: Option<Box<SendParams>>,
    /// Where a stream a client lost picks up (its `Last-Event-ID`), for the bindings that
    /// stream over SSE.
    pub resume: Option<super::resume::ResumeFrom>,
    /// The gRPC binding's: an answer carrying a task (a send's, `GetTask`'s, `CancelTask`'s)
    /// is written as protobuf ([`RpcReply::Protobuf`](crate::rpc::RpcReply)), not as JSON.
    pub protobuf_answer: bool,
}

/// A request that failed before it could be dispatched, with what is needed to answer it.
#[derive(Debug)]
pub struct RpcFailure {
    pub id: RpcId,
    pub dialect: Dialect,
    pub error: GatewayError,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    jsonrpc: Option<Value>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    method: Option<Value>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
}

/// `params`, when present, must be an object (a null reads as absent).
fn is_object(params: &RawValue) -> bool {
    params.get().trim_start().starts_with('{')
}

/// [`parse_request`] for an agent's own endpoint, where nothing reads a send's params before
/// the send does: when `method` comes before `params`, as every SDK writes them, the params
/// are decoded in the same pass instead of being kept raw and read again. A request this
/// pass does not accept goes through [`parse_request`], which explains what is wrong.
pub fn parse_request_for_agent(
    body: &[u8],
    header: Option<Dialect>,
) -> Result<RpcRequest<'_>, RpcFailure> {
    // Read as text: serde_json then need not check each string's UTF-8 on its own.
    let Ok(text) = std::str::from_utf8(body) else {
        return parse_request(body, header);
    };
    if let Some(send) = super::common_send::read(text, send_method) {
        let (method, dialect) = send.method;
        return Ok(RpcRequest {
            id: RpcId::Value(send.id),
            method,
            dialect,
            params: None,
            send: Some(send.params),
            resume: None,
            protobuf_answer: false,
        });
    }
    match serde_json::from_str::<OnePass>(text) {
        Ok(OnePass {
            version_ok: true,
            id: Some(id @ Value::String(_)),
            method: Some((method, dialect)),
            params,
            send,
        })
        | Ok(OnePass {
            version_ok: true,
            id: Some(id @ Value::Number(_)),
            method: Some((method, dialect)),
            params,
            send,
        }) if id.is_i64() || id.is_u64() => Ok(RpcRequest {
            id: RpcId::Value(id),
            method,
            dialect,
            params,
            send,
            resume: None,
            protobuf_answer: false,
        }),
        _ => parse_request(body, header),
    }
}

/// The method, when its name is a send whose params the one-pass readers decode (0.1
/// sends are read by their own reader, protocol::v01).
pub(super) fn send_method(name: &str) -> Option<(Method, Dialect)> {
    match Method::lookup(name)? {
        m @ (Method::SendMessage | Method::SendStreamingMessage, Dialect::V03 | Dialect::V10) => {
            Some(m)
        }
        _ => None,
    }
}

/// An envelope read in one pass (see [`parse_request_for_agent`]). Fails on anything out
/// of the ordinary, from a string with escapes where a plain one was expected to params
/// that are not an object.
#[derive(Default)]
struct OnePass<'a> {
    version_ok: bool,
    id: Option<Value>,
    method: Option<(Method, Dialect)>,
    params: Option<&'a RawValue>,
    send: Option<Box<SendParams>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for OnePass<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct OnePassVisitor;
        impl<'de> serde::de::Visitor<'de> for OnePassVisitor {
            type Value = OnePass<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON-RPC request object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<OnePass<'de>, A::Error> {
                use serde::de::Error;
                let mut out = OnePass::default();
                let mut seen = [false; 4];
                while let Some(key) = map.next_key::<&'de str>()? {
                    let slot = match key {
                        "jsonrpc" => 0,
                        "id" => 1,
                        "method" => 2,
                        "params" => 3,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    if std::mem::replace(&mut seen[slot], true) {
                        return Err(A::Error::custom("duplicate member"));
                    }
                    match slot {
                        0 => out.version_ok = map.next_value::<&str>()? == "2.0",
                        1 => out.id = Some(map.next_value()?),
                        2 => {
                            let name = map.next_value::<&str>()?;
                            out.method = Method::lookup(name);
                        }
                        _ => match out.method {
                            // 0.1 sends are read by their own reader (protocol::v01).
                            Some((
                                Method::SendMessage | Method::SendStreamingMessage,
                                Dialect::V03 | Dialect::V10,
                            )) => out.send = Some(map.next_value::<Object<Box<SendParams>>>()?.0),
                            _ => {
                                let raw = map.next_value::<&RawValue>()?;
                                if !is_object(raw) {
                                    return Err(A::Error::custom("params must be an object"));
                                }
                                out.params = Some(raw);
                            }
                        },
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(OnePassVisitor)
    }
}

/// A `T` that must be written as a JSON object (a derived struct would also take an array).
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for ObjectVisitor<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Object<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Object)
            }
        }
        d.deserialize_map(ObjectVisitor(std::marker::PhantomData))
    }
}

/// Parses and validates an envelope. `header` is the caller's `A2A-Version`, already parsed.
pub fn parse_request(body: &[u8], header: Option<Dialect>) -> Result<RpcRequest<'_>, RpcFailure> {
    let fallback = header.unwrap_or(Dialect::V03);
    let fail = |id: RpcId, dialect, error| RpcFailure { id, dialect, error };
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
        return Err(fail(RpcId::NULL, fallback, error));
    }
    let env: Envelope = serde_json::from_slice(body).map_err(|e| {
        let error = if e.is_data() {
            GatewayError::InvalidRequest(e.to_string())
        } else {
            GatewayError::Parse(e.to_string())
        };
        fail(RpcId::NULL, fallback, error)
    })?;
    // A2A has no notifications and clients wait for an answer, so a request without an
    // id is judged like one with `"id": null` (as the official SDKs do), not dropped.
    let id = match env.id.map(RpcId::read) {
        Some(Some(id)) => id,
        None => RpcId::NULL,
        Some(None) => {
            return Err(fail(
                RpcId::NULL,
                fallback,
                GatewayError::InvalidRequest("\"id\" must be a string or a number".into()),
            ))
        }
    };
    if env.jsonrpc.as_ref().and_then(Value::as_str) != Some("2.0") {
        return Err(fail(
            id,
            fallback,
            GatewayError::InvalidRequest("\"jsonrpc\" must be exactly \"2.0\"".into()),
        ));
    }
    let name = match env.method {
        Some(Value::String(name)) => name,
        Some(_) => {
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
        return Err(fail(id, fallback, GatewayError::MethodNotFound(name)));
    };
    if let Some(p) = env.params {
        if !is_object(p) {
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
        send: None,
        resume: None,
        protobuf_answer: false,
    })
}

#[derive(Serialize)]
struct Success<'a, R: Serialize> {
    jsonrpc: &'static str,
    id: &'a RpcId,
    result: R,
}

#[derive(Serialize)]
struct Failure<'a> {
    jsonrpc: &'static str,
    id: &'a RpcId,
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
pub(crate) const RESULT_CAPACITY: usize = 1024;

pub fn render_result<R: Serialize>(id: &RpcId, result: R) -> Result<Vec<u8>, GatewayError> {
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

pub fn render_error(id: &RpcId, dialect: Dialect, error: &GatewayError) -> Vec<u8> {
    let (code, data) = match dialect {
        Dialect::V01 => (super::v01::error_code(error.code()), error.data_v03()),
        Dialect::V03 => (error.code(), error.data_v03()),
        Dialect::V10 => (error.code(), Some(error.data_v10())),
    };
    let body = Failure {
        jsonrpc: "2.0",
        id,
        error: ErrorObject {
            code,
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
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":{},"method":"GetTask"}"#),
            -32600
        );
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

    /// The one-pass reader accepts what the two-pass one accepts, with the same send params,
    /// and leaves everything else to it, so every error stays the same.
    #[test]
    fn one_pass_agrees_with_two_passes() {
        let msg = r#"{"messageId":"m","role":"user","parts":[{"text":"hi"}]}"#;
        let bodies = [
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{{"message":{msg}}}}}"#),
            format!(r#"{{"params":{{"message":{msg}}},"method":"message/send","id":"a","jsonrpc":"2.0"}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"message/stream","params":{{"message":{msg},"x":[1]}},"extra":{{}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":[{{"message":{msg}}}]}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{{"message":{msg}}},"id":2}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"Send\u004dessage","params":{{"message":{msg}}}}}"#),
            format!(r#"{{"json\u0072pc":"2.0","id":1,"method":"SendMessage","params":{{"message":{msg}}}}}"#),
            format!(r#"{{"jsonrpc":"1.0","id":1,"method":"SendMessage","params":{{"message":{msg}}}}}"#),
            format!(r#"{{"jsonrpc":2,"id":1,"method":"SendMessage","params":{{"message":{msg}}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","method":"SendMessage","params":{{"message":{msg}}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":[1],"method":"SendMessage","params":{{"message":{msg}}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"Nope","params":{{"message":{msg}}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{{"message":{msg}}}}} x"#),
            r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":null}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"user"}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage"}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"t"}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":["t"]}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":null}"#.into(),
            r#"[{"jsonrpc":"2.0","id":1,"method":"GetTask"}]"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":"GetTask""#.into(),
        ];
        let decoded_at_once = |body: &String| {
            parse_request_for_agent(body.as_bytes(), None).is_ok_and(|r| r.send.is_some())
        };
        assert!(decoded_at_once(&bodies[0]) && decoded_at_once(&bodies[2]));
        assert!(
            !decoded_at_once(&bodies[1]),
            "params before the method are read later"
        );
        // Not UTF-8: the careful reader explains it.
        let bad = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"SendMessage\",\"params\":\"\xff\"}";
        let (one, two) = (
            parse_request_for_agent(bad, None).unwrap_err(),
            parse_request(bad, None).unwrap_err(),
        );
        assert_eq!(one.error.to_string(), two.error.to_string());
        assert_eq!(one.error.code(), -32700);
        for body in &bodies {
            let one = parse_request_for_agent(body.as_bytes(), Some(Dialect::V10));
            let two = parse_request(body.as_bytes(), Some(Dialect::V10));
            match (one, two) {
                (Ok(one), Ok(two)) => {
                    assert_eq!(
                        (&one.id, one.method, one.dialect),
                        (&two.id, two.method, two.dialect),
                        "{body}"
                    );
                    let decoded = |r: &RpcRequest<'_>| match &r.send {
                        Some(p) => Ok(format!("{p:?}")),
                        None => crate::protocol::params::decode::<SendParams>(r.params)
                            .map(|p| format!("{p:?}"))
                            .map_err(|e| e.to_string()),
                    };
                    if one.method == Method::SendMessage
                        || one.method == Method::SendStreamingMessage
                    {
                        assert_eq!(decoded(&one), decoded(&two), "{body}");
                    } else {
                        assert_eq!(
                            one.params.map(RawValue::get),
                            two.params.map(RawValue::get),
                            "{body}"
                        );
                    }
                }
                (Err(one), Err(two)) => assert_eq!(
                    (one.id, one.dialect, one.error.to_string()),
                    (two.id, two.dialect, two.error.to_string()),
                    "{body}"
                ),
                (one, two) => panic!("{body}: {one:?} vs {two:?}"),
            }
        }
    }

    /// A request without an id is judged like one with `"id": null`.
    #[test]
    fn a_missing_id_is_judged_as_null() {
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","method":"message/ssend","params":{}}"#),
            -32601
        );
        let r = parse_request(
            br#"{"jsonrpc":"2.0","method":"GetTask","params":{"id":"t"}}"#,
            None,
        )
        .unwrap();
        assert_eq!((r.id, r.method), (RpcId::NULL, Method::GetTask));
        let r = parse_request(br#"{"jsonrpc":"2.0","id":null,"method":"GetTask"}"#, None).unwrap();
        assert_eq!(r.id, RpcId::NULL);
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

//! ProtoJSON written straight as protobuf bytes, by walking the JSON beside the message's
//! descriptor: every gRPC answer takes this way out.
//!
//! Why not prost-reflect's `DynamicMessage` alone, which did this before: it builds the whole
//! message as a tree of dynamic values first, and its encoder computes the length of every
//! nested message again at each level it is nested in. Both cost about 100k instructions for
//! the echo's answer, half of a gRPC `SendMessage` (callgrind); written directly, a nested
//! message is encoded once into a buffer of its own. The well-known types (`Timestamp`,
//! `Struct`, `Value`, ...), whose JSON forms are special, are still read by prost-reflect,
//! so their rules live in one place; the tests compare both ways on whole answers.

use base64::Engine;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::Value;

/// `json` (ProtoJSON of `message`) as its protobuf encoding. Fields the message does not
/// have are left out, as ProtoJSON readers do.
pub(crate) fn to_protobuf(json: &str, message: &MessageDescriptor) -> Result<Vec<u8>, String> {
    let value: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(json.len());
    write_message(&value, message, &mut out)?;
    Ok(out)
}

fn write_message(
    value: &Value,
    message: &MessageDescriptor,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    if message.full_name().starts_with("google.protobuf.") {
        return write_well_known(value, message, out);
    }
    let Value::Object(fields) = value else {
        return Err(format!("{} is not an object", message.full_name()));
    };
    for (name, value) in fields {
        let field = match message.get_field_by_json_name(name) {
            Some(field) => field,
            None => match message.get_field_by_name(name) {
                Some(field) => field,
                None => continue,
            },
        };
        // null is the field's default, except for google.protobuf.Value, whose null is a value.
        if value.is_null() && !is_value_message(&field.kind()) {
            continue;
        }
        // A field without presence at its default is not written, as protobuf encoders do.
        if !field.supports_presence()
            && !field.is_list()
            && !field.is_map()
            && is_default(&field.kind(), value)
        {
            continue;
        }
        write_field(&field, value, out).map_err(|e| format!("{}: {e}", field.json_name()))?;
    }
    Ok(())
}

fn is_default(kind: &Kind, value: &Value) -> bool {
    match (kind, value) {
        (Kind::Enum(enumeration), Value::String(name)) => enumeration
            .get_value_by_name(name)
            .is_some_and(|v| v.number() == 0),
        (Kind::Message(_), _) => false,
        (_, Value::String(text)) => text.is_empty(),
        (_, Value::Bool(flag)) => !flag,
        (_, Value::Number(n)) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

fn is_value_message(kind: &Kind) -> bool {
    matches!(kind, Kind::Message(m) if m.full_name() == "google.protobuf.Value")
}

fn write_field(field: &FieldDescriptor, value: &Value, out: &mut Vec<u8>) -> Result<(), String> {
    let number = field.number();
    if field.is_map() {
        let Value::Object(entries) = value else {
            return Err("not an object".into());
        };
        let Kind::Message(entry) = field.kind() else {
            return Err("a map without entries".into());
        };
        // A map field's entry is a map entry (is_map says so): it has both fields.
        let (key_field, value_field) = (entry.map_entry_key_field(), entry.map_entry_value_field());
        for (key, value) in entries {
            let mut bytes = Vec::new();
            write_single(
                key_field.number(),
                &key_field.kind(),
                &map_key(key, &key_field.kind()),
                &mut bytes,
            )?;
            write_single(value_field.number(), &value_field.kind(), value, &mut bytes)?;
            delimited(number, &bytes, out);
        }
        return Ok(());
    }
    if field.is_list() {
        let Value::Array(items) = value else {
            return Err("not an array".into());
        };
        for item in items {
            write_single(number, &field.kind(), item, out)?;
        }
        return Ok(());
    }
    write_single(number, &field.kind(), value, out)
}

/// A map's key as its field reads it (JSON keys are always strings).
fn map_key(key: &str, kind: &Kind) -> Value {
    match kind {
        Kind::Bool => Value::Bool(key == "true"),
        _ => Value::String(key.to_owned()),
    }
}

fn write_single(number: u32, kind: &Kind, value: &Value, out: &mut Vec<u8>) -> Result<(), String> {
    match kind {
        Kind::Message(message) => {
            let mut bytes = Vec::new();
            write_message(value, message, &mut bytes)?;
            delimited(number, &bytes, out);
        }
        Kind::String => {
            let text = value.as_str().ok_or("not a string")?;
            delimited(number, text.as_bytes(), out);
        }
        Kind::Bytes => {
            let text = value.as_str().ok_or("not base64")?;
            delimited(number, &base64_bytes(text)?, out);
        }
        Kind::Bool => {
            let flag = value.as_bool().ok_or("not a boolean")?;
            varint(number, u64::from(flag), out);
        }
        Kind::Enum(enumeration) => {
            let n = match value {
                Value::String(name) => enumeration
                    .get_value_by_name(name)
                    .map(|v| v.number())
                    .ok_or_else(|| format!("{name} is not a {}", enumeration.full_name()))?,
                _ => integer(value)
                    .and_then(|n| i32::try_from(n).map_err(|_| "out of range".into()))?,
            };
            varint(number, n as i64 as u64, out);
        }
        Kind::Int32 | Kind::Int64 => varint(number, integer(value)? as u64, out),
        Kind::Uint32 | Kind::Uint64 => varint(number, unsigned(value)?, out),
        Kind::Sint32 | Kind::Sint64 => {
            let n = integer(value)?;
            varint(number, ((n << 1) ^ (n >> 63)) as u64, out);
        }
        Kind::Fixed32 => fixed(number, &(unsigned(value)? as u32).to_le_bytes(), out),
        Kind::Sfixed32 => fixed(number, &(integer(value)? as i32).to_le_bytes(), out),
        Kind::Fixed64 => fixed(number, &unsigned(value)?.to_le_bytes(), out),
        Kind::Sfixed64 => fixed(number, &integer(value)?.to_le_bytes(), out),
        Kind::Float => fixed(number, &(float(value)? as f32).to_le_bytes(), out),
        Kind::Double => fixed(number, &float(value)?.to_le_bytes(), out),
    }
    Ok(())
}

/// A well-known type through prost-reflect, which knows their JSON forms.
fn write_well_known(
    value: &Value,
    message: &MessageDescriptor,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(false);
    let dynamic = DynamicMessage::deserialize_with_options(message.clone(), value, &options)
        .map_err(|e| e.to_string())?;
    prost::Message::encode(&dynamic, out).map_err(|e| e.to_string())
}

fn delimited(number: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn varint(number: u32, n: u64, out: &mut Vec<u8>) {
    encode_key(number, WireType::Varint, out);
    encode_varint(n, out);
}

fn fixed<const N: usize>(number: u32, bytes: &[u8; N], out: &mut Vec<u8>) {
    let wire = if N == 4 {
        WireType::ThirtyTwoBit
    } else {
        WireType::SixtyFourBit
    };
    encode_key(number, wire, out);
    out.extend_from_slice(bytes);
}

/// ProtoJSON integers: numbers, or strings (64-bit ones are written as strings).
fn integer(value: &Value) -> Result<i64, String> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
            .ok_or_else(|| format!("{n} is not an integer")),
        Value::String(s) => s.parse().map_err(|_| format!("{s:?} is not an integer")),
        _ => Err("not an integer".into()),
    }
}

fn unsigned(value: &Value) -> Result<u64, String> {
    match value {
        Value::Number(n) => n
            .as_u64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                    .map(|f| f as u64)
            })
            .ok_or_else(|| format!("{n} is not an unsigned integer")),
        Value::String(s) => s
            .parse()
            .map_err(|_| format!("{s:?} is not an unsigned integer")),
        _ => Err("not an unsigned integer".into()),
    }
}

fn float(value: &Value) -> Result<f64, String> {
    match value {
        Value::Number(n) => n.as_f64().ok_or_else(|| format!("{n} is not a number")),
        Value::String(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            other => other
                .parse()
                .map_err(|_| format!("{other:?} is not a number")),
        },
        _ => Err("not a number".into()),
    }
}

/// ProtoJSON bytes: base64, standard or URL-safe, padded or not.
pub(super) fn base64_bytes(text: &str) -> Result<Vec<u8>, String> {
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
    use base64::engine::DecodePaddingMode;
    let config =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let standard = GeneralPurpose::new(&base64::alphabet::STANDARD, config);
    let url_safe = GeneralPurpose::new(&base64::alphabet::URL_SAFE, config);
    standard
        .decode(text)
        .or_else(|_| url_safe.decode(text))
        .map_err(|_| "not base64".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::grpc::rpc_of;
    use crate::protocol::jsonrpc::Method;
    use crate::protocol::Dialect;
    use prost::Message as _;

    /// What prost-reflect makes of `json` as `message`, and what `to_protobuf` wrote, read
    /// back: the same message.
    fn same_both_ways(json: &str, message: &MessageDescriptor) {
        let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(false);
        let mut de = serde_json::Deserializer::from_str(json);
        let parsed =
            DynamicMessage::deserialize_with_options(message.clone(), &mut de, &options).unwrap();
        // Read back from its own encoding: an empty list set in JSON and one never set are
        // the same on the wire, but not in a DynamicMessage.
        let expected =
            DynamicMessage::decode(message.clone(), parsed.encode_to_vec().as_slice()).unwrap();
        let written = to_protobuf(json, message).unwrap();
        let read = DynamicMessage::decode(message.clone(), written.as_slice()).unwrap();
        assert_eq!(read, expected, "{json}");
    }

    fn output(method: Method) -> MessageDescriptor {
        rpc_of(method, Dialect::V10).unwrap().output.clone()
    }

    #[test]
    fn answers_read_back_as_prost_reflect_reads_them() {
        let task = r#"{"task":{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_COMPLETED","timestamp":"2026-11-21T22:13:35.763Z","message":{"messageId":"m2","role":"ROLE_AGENT","parts":[{"text":"done","metadata":{"a":1,"b":[true,null,"x"],"c":{"d":2.5}}}]}},"artifacts":[{"artifactId":"echo","name":"echo","parts":[{"text":"hello"},{"raw":"aGVsbG8=","mediaType":"text/plain","filename":"h.txt"},{"url":"https://example.com/f","mediaType":"image/png"},{"data":{"k":[1,2,3]}}]}],"history":[{"messageId":"m1","contextId":"c1","taskId":"t1","role":"ROLE_USER","parts":[{"text":"hello"}],"extensions":["https://example.com/ext"],"referenceTaskIds":["t0"]}],"metadata":{"x":"y","n":null}}}"#;
        same_both_ways(task, &output(Method::SendMessage));
        let message = r#"{"message":{"messageId":"m1","role":"ROLE_AGENT","parts":[{"text":""},{"raw":"_-8"}],"unknownField":{"ignored":true}}}"#;
        same_both_ways(message, &output(Method::SendMessage));
        let listed = r#"{"tasks":[{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_WORKING"}}],"nextPageToken":"","pageSize":50,"totalSize":"1"}"#;
        same_both_ways(listed, &output(Method::ListTasks));
    }

    #[test]
    fn a_card_reads_back_as_prost_reflect_reads_it() {
        let card = r#"{"name":"a","description":"d","version":"1","supportedInterfaces":[{"url":"http://h/","protocolBinding":"JSONRPC","protocolVersion":"1.0"}],"capabilities":{"streaming":true,"pushNotifications":false,"extensions":[{"uri":"u","required":true,"params":{"p":1}}]},"securitySchemes":{"key":{"apiKeySecurityScheme":{"location":"header","name":"X-API-Key"}}},"securityRequirements":[{"schemes":{"key":{"list":[]}}}],"defaultInputModes":["text/plain"],"defaultOutputModes":["text/plain"],"skills":[{"id":"s","name":"S","description":"d","tags":["t"],"examples":["e"]}],"signatures":[{"protected":"p","signature":"s","header":{"kid":"k"}}]}"#;
        same_both_ways(card, &output(Method::GetExtendedAgentCard));
    }

    #[test]
    fn what_is_not_protojson_is_refused_by_name() {
        let out = output(Method::SendMessage);
        let wrong =
            to_protobuf(r#"{"task":{"status":{"state":"NOT_A_STATE"}}}"#, &out).unwrap_err();
        assert!(wrong.contains("NOT_A_STATE"), "{wrong}");
        let wrong = to_protobuf(r#"{"task":{"id":5}}"#, &out).unwrap_err();
        assert!(wrong.contains("id: not a string"), "{wrong}");
        assert!(to_protobuf("[1]", &out).is_err());
        assert!(to_protobuf("{", &out).is_err());
    }
}

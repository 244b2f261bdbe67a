//! A2A 1.0 over gRPC, on the wire: the service's descriptor (compiled from proto/ by
//! build.rs), its methods, frames left as bytes, messages to and from the ProtoJSON the
//! JSON bindings speak, and the `google.rpc` messages errors travel in. Shared by the gRPC
//! binding (src/grpc/) and the upstreams served over gRPC (agents/remote/grpc.rs).

use std::collections::HashMap;
use std::sync::LazyLock;

use bytes::{Buf, BufMut, Bytes};
use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, ServiceDescriptor};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use super::jsonrpc::Method;
use super::Dialect;

/// The full name of the service, and the first segment of every method's path.
pub const SERVICE: &str = "lf.a2a.v1.A2AService";

/// The spec's proto, compiled by build.rs.
static DESCRIPTOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/a2a_v1.descriptor.bin"));

static SERVICE_DESCRIPTOR: LazyLock<Option<ServiceDescriptor>> = LazyLock::new(|| {
    DescriptorPool::decode(DESCRIPTOR)
        .ok()?
        .get_service_by_name(SERVICE)
});

/// A method of the service: the operation, its path, and its input and output messages.
#[derive(Clone)]
pub struct Rpc {
    pub method: Method,
    pub path: String,
    pub input: MessageDescriptor,
    pub output: MessageDescriptor,
}

/// Every method, found once.
static RPCS: LazyLock<Vec<Rpc>> = LazyLock::new(|| {
    let Some(service) = SERVICE_DESCRIPTOR.as_ref() else {
        return Vec::new();
    };
    service
        .methods()
        .filter_map(|m| {
            let (method, _) = Method::lookup(m.name()).filter(|(_, d)| *d == Dialect::V10)?;
            Some(Rpc {
                method,
                path: format!("/{SERVICE}/{}", m.name()),
                input: m.input(),
                output: m.output(),
            })
        })
        .collect()
});

/// The method a request's path names (`/lf.a2a.v1.A2AService/<Method>`).
pub fn rpc_at(path: &str) -> Option<&'static Rpc> {
    RPCS.iter().find(|r| r.path == path)
}

/// The method of a 1.0 operation.
pub fn rpc_of(method: Method) -> Option<&'static Rpc> {
    RPCS.iter().find(|r| r.method == method)
}

/// How many methods the service has (every one of them dispatched: see the tests).
pub fn service_methods() -> usize {
    SERVICE_DESCRIPTOR.as_ref().map_or(0, |s| s.methods().len())
}

/// 1.0 JSON (ProtoJSON) as `message`'s protobuf encoding. Fields the proto does not have
/// are left out, as ProtoJSON readers do.
pub fn encode_json(json: &str, message: &MessageDescriptor) -> Result<DynamicMessage, String> {
    let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(false);
    let mut de = serde_json::Deserializer::from_str(json);
    DynamicMessage::deserialize_with_options(message.clone(), &mut de, &options)
        .map_err(|e| format!("not a {}: {e}", message.full_name()))
}

/// [`encode_json`], encoded.
pub fn json_to_bytes(json: &str, message: &MessageDescriptor) -> Result<Bytes, String> {
    encode_json(json, message).map(|m| Bytes::from(m.encode_to_vec()))
}

/// A protobuf-encoded `message`, read.
pub fn decode(bytes: Bytes, message: &MessageDescriptor) -> Result<DynamicMessage, String> {
    DynamicMessage::decode(message.clone(), bytes)
        .map_err(|e| format!("not a {}: {e}", message.full_name()))
}

/// The `tenant` a request names, taken out of it; none when empty.
pub fn take_tenant(message: &mut DynamicMessage) -> Option<String> {
    let tenant = match message.get_field_by_name("tenant")?.as_str() {
        Some("") | None => None,
        Some(t) => Some(t.to_string()),
    };
    message.clear_field_by_name("tenant");
    tenant
}

/// Sets a request's `tenant`, when its message has one.
pub fn set_tenant(message: &mut DynamicMessage, tenant: &str) {
    if prost_reflect::ReflectMessage::descriptor(message)
        .get_field_by_name("tenant")
        .is_some()
    {
        message.set_field_by_name("tenant", prost_reflect::Value::String(tenant.into()));
    }
}

/// Frames as tonic cuts them, left as bytes: which message a frame holds depends on the
/// method, so the message is read against the method's descriptor afterwards.
#[derive(Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<prost_types::Any>,
}

/// `google.rpc.ErrorInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ErrorInfo {
    #[prost(string, tag = "1")]
    pub reason: String,
    #[prost(string, tag = "2")]
    pub domain: String,
    #[prost(map = "string, string", tag = "3")]
    pub metadata: HashMap<String, String>,
}

pub const ERROR_INFO_TYPE: &str = "type.googleapis.com/google.rpc.ErrorInfo";

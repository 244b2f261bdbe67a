//! A2A over gRPC, on the wire: the services' descriptors (compiled from proto/ by
//! build.rs), their methods, frames left as bytes, messages to and from the ProtoJSON the
//! JSON bindings speak, and the `google.rpc` messages errors travel in. Shared by the gRPC
//! binding (src/grpc/, 1.0) and the upstreams served over gRPC (agents/remote/grpc.rs, 1.0
//! and 0.3).

use std::collections::HashMap;
use std::sync::LazyLock;

use bytes::{Buf, BufMut, Bytes};
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, ServiceDescriptor};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use super::jsonrpc::Method;
use super::push::PushOp;
use super::Dialect;

/// The full name of the 1.0 service, and the first segment of every method's path.
pub const SERVICE: &str = "lf.a2a.v1.A2AService";

/// 0.3's service: the gateway calls it on upstreams, and serves only 1.0's.
const SERVICE_V03: &str = "a2a.v1.A2AService";

/// The spec's protos, compiled by build.rs.
static DESCRIPTOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/a2a.descriptor.bin"));

/// The compiled protos as an encoded `FileDescriptorSet` (what gRPC reflection serves).
pub fn descriptor_set() -> &'static [u8] {
    DESCRIPTOR
}

static POOL: LazyLock<Option<DescriptorPool>> =
    LazyLock::new(|| DescriptorPool::decode(DESCRIPTOR).ok());

fn service(name: &str) -> Option<ServiceDescriptor> {
    POOL.as_ref()?.get_service_by_name(name)
}

/// A method of a service: the operation, its path, and its input and output messages.
#[derive(Clone)]
pub struct Rpc {
    pub method: Method,
    pub path: String,
    pub input: MessageDescriptor,
    pub output: MessageDescriptor,
}

/// The methods of `name` that stand for an operation, found once.
fn methods(name: &str, operation: fn(&str) -> Option<Method>) -> Vec<Rpc> {
    let Some(service) = service(name) else {
        return Vec::new();
    };
    service
        .methods()
        .filter_map(|m| {
            Some(Rpc {
                method: operation(m.name())?,
                path: format!("/{name}/{}", m.name()),
                input: m.input(),
                output: m.output(),
            })
        })
        .collect()
}

/// 1.0 names its gRPC methods as its JSON-RPC ones.
static RPCS: LazyLock<Vec<Rpc>> = LazyLock::new(|| {
    methods(SERVICE, |name| {
        Method::lookup(name)
            .filter(|(_, d)| *d == Dialect::V10)
            .map(|(m, _)| m)
    })
});

static RPCS_V03: LazyLock<Vec<Rpc>> = LazyLock::new(|| methods(SERVICE_V03, operation_v03));

/// The operation a method of 0.3's service stands for.
fn operation_v03(name: &str) -> Option<Method> {
    Some(match name {
        "SendMessage" => Method::SendMessage,
        "SendStreamingMessage" => Method::SendStreamingMessage,
        "GetTask" => Method::GetTask,
        "CancelTask" => Method::CancelTask,
        "TaskSubscription" => Method::SubscribeToTask,
        "CreateTaskPushNotificationConfig" => Method::Push(PushOp::Set),
        "GetTaskPushNotificationConfig" => Method::Push(PushOp::Get),
        "ListTaskPushNotificationConfig" => Method::Push(PushOp::List),
        "DeleteTaskPushNotificationConfig" => Method::Push(PushOp::Delete),
        "GetAgentCard" => Method::GetExtendedAgentCard,
        _ => return None,
    })
}

/// The 1.0 method a request's path names (`/lf.a2a.v1.A2AService/<Method>`).
pub fn rpc_at(path: &str) -> Option<&'static Rpc> {
    RPCS.iter().find(|r| r.path == path)
}

/// The method of an operation in a dialect's service (0.3 has no ListTasks).
pub fn rpc_of(method: Method, dialect: Dialect) -> Option<&'static Rpc> {
    let rpcs = match dialect {
        Dialect::V10 => &RPCS,
        Dialect::V03 => &RPCS_V03,
        Dialect::V01 => return None,
    };
    rpcs.iter().find(|r| r.method == method)
}

/// How many methods the 1.0 service has (every one of them dispatched: see the tests).
pub fn service_methods() -> usize {
    service(SERVICE).map_or(0, |s| s.methods().len())
}

/// ProtoJSON as `message`'s protobuf encoding. Fields the proto does not have
/// are left out, as ProtoJSON readers do.
pub fn encode_json(json: &str, message: &MessageDescriptor) -> Result<DynamicMessage, String> {
    let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(false);
    let mut de = serde_json::Deserializer::from_str(json);
    DynamicMessage::deserialize_with_options(message.clone(), &mut de, &options)
        .map_err(|e| format!("not a {}: {e}", message.full_name()))
}

/// [`encode_json`], encoded (written straight from the JSON: see `protojson`).
pub fn json_to_bytes(json: &str, message: &MessageDescriptor) -> Result<Bytes, String> {
    super::protojson::to_protobuf(json, message)
        .map(Bytes::from)
        .map_err(|e| format!("not a {}: {e}", message.full_name()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_of_the_0_3_service_is_an_operation_the_gateway_calls() {
        let service = service(SERVICE_V03).expect("the 0.3 proto is compiled in");
        assert_eq!(service.methods().len(), 10);
        assert_eq!(RPCS_V03.len(), 10);
        let subscribe = rpc_of(Method::SubscribeToTask, Dialect::V03).unwrap();
        assert_eq!(subscribe.path, "/a2a.v1.A2AService/TaskSubscription");
        assert_eq!(
            subscribe.input.full_name(),
            "a2a.v1.TaskSubscriptionRequest"
        );
        assert!(rpc_of(Method::ListTasks, Dialect::V03).is_none());
        let send = rpc_of(Method::SendMessage, Dialect::V10).unwrap();
        assert_eq!(send.input.full_name(), "lf.a2a.v1.SendMessageRequest");
    }
}

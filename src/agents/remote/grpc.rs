//! Upstreams served over gRPC (A2A 1.0's `lf.a2a.v1.A2AService`, or 0.3's
//! `a2a.v1.A2AService`): the remote backend's JSON-RPC calls in the upstream's dialect,
//! carried over gRPC and answered as JSON-RPC again, so that everything above the
//! transport (relaying, streams, subscriptions followed by polling, the dialect bridges,
//! 0.3's ledger of tasks) is the one the JSON-RPC upstreams use.
//!
//! tonic's client over a pooled hyper client built like the HTTP upstreams' (the same
//! resolver, which refuses link-local addresses, the same connect timeout, TLS for an
//! `https` URL), HTTP/2 only.

use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use http::uri::PathAndQuery;
use http::Uri;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::{Code, Status};

use super::failure::Failure;
use super::resolve::GuardedResolver;
use crate::config::A2aConfig;
use crate::protocol::grpc::{self as wire, ErrorInfo, RawCodec, RpcStatus, ERROR_INFO_TYPE};
use crate::protocol::grpc_v03;
use crate::protocol::jsonrpc::Method;
use crate::protocol::Dialect;

type Channel = Client<HttpsConnector<HttpConnector<GuardedResolver>>, tonic::body::Body>;

pub(super) struct GrpcTransport {
    client: Channel,
    timeout: Duration,
}

/// A JSON-RPC request as the remote backend writes it.
#[derive(Deserialize)]
struct Call<'a> {
    #[serde(borrow)]
    id: &'a RawValue,
    method: &'a str,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
}

/// Why a call has no answer to relay: the upstream's error status (relayed as a JSON-RPC
/// error), or no answer at all.
enum Refusal {
    Answered(Status),
    Failed(Failure),
}

impl From<Status> for Refusal {
    fn from(status: Status) -> Refusal {
        match status.code() == Code::Unavailable && status.details().is_empty() {
            true => Refusal::Failed(transport_failure(&status)),
            false => Refusal::Answered(status),
        }
    }
}

/// What a call sends: the method (its path and messages), and the request encoded.
struct Prepared {
    id: Box<RawValue>,
    rpc: &'static wire::Rpc,
    dialect: Dialect,
    path: PathAndQuery,
    request: tonic::Request<Bytes>,
}

impl GrpcTransport {
    pub(super) fn new(config: &A2aConfig, resolver: GuardedResolver) -> Result<Self, String> {
        let mut http = HttpConnector::new_with_resolver(resolver);
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(config.connect_timeout_secs)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(super::transport::tls_config(config)?)
            .https_or_http()
            .enable_http2()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .http2_only(true)
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(Duration::from_secs(30))
            .build(https);
        Ok(GrpcTransport {
            client,
            timeout: Duration::from_secs(config.timeout_secs),
        })
    }

    /// `body` (a JSON-RPC request in `dialect`) as the gRPC call it stands for, to
    /// `tenant`, with the upstream's deadline (`grpc-timeout`) when the whole call is
    /// bounded.
    fn prepare(
        &self,
        origin: &Uri,
        body: &[u8],
        dialect: Dialect,
        tenant: Option<&str>,
        headers: &http::HeaderMap,
        bounded: bool,
    ) -> Result<Prepared, Failure> {
        let bad = |e: String| Failure::Broken(format!("a call the gRPC upstream cannot take: {e}"));
        let call: Call = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        let rpc = Method::lookup(call.method)
            .and_then(|(m, _)| wire::rpc_of(m, dialect))
            .ok_or_else(|| bad(format!("no gRPC method for {}", call.method)))?;
        let params = call.params.map_or("{}", RawValue::get);
        let mut message = match dialect {
            // 0.3's JSON-RPC params are not its proto's ProtoJSON: converted first.
            Dialect::V03 => {
                let params = serde_json::from_str(params).map_err(|e| bad(e.to_string()))?;
                let proto = grpc_v03::request(rpc.method, params).map_err(bad)?;
                wire::encode_json(&proto.to_string(), &rpc.input)
            }
            _ => wire::encode_json(params, &rpc.input),
        }
        .map_err(bad)?;
        if let Some(tenant) = tenant {
            wire::set_tenant(&mut message, tenant);
        }
        let encoded = Bytes::from(prost::Message::encode_to_vec(&message));
        let path = PathAndQuery::try_from(rpc.path.as_str()).map_err(|e| bad(e.to_string()))?;
        let mut request = tonic::Request::new(encoded);
        if bounded {
            request.set_timeout(self.timeout);
        }
        let metadata = request.metadata_mut();
        // No version means 0.3, as over HTTP.
        if dialect == Dialect::V10 {
            metadata.insert("a2a-version", MetadataValue::from_static("1.0"));
        }
        for (name, value) in headers {
            put_header(metadata, name, value);
        }
        let extensions = super::transport::extension_header(Dialect::V10);
        for (name, value) in super::transport::trace_headers(origin).chain(extensions) {
            put_header(metadata, &name, &value);
        }
        Ok(Prepared {
            id: call.id.to_owned(),
            rpc,
            dialect,
            path,
            request,
        })
    }

    /// A client for `origin`, once it can take a call (a connection, pooled).
    async fn client(&self, origin: &Uri) -> Result<tonic::client::Grpc<Channel>, Refusal> {
        let mut client = tonic::client::Grpc::with_origin(self.client.clone(), origin.clone());
        let ready = client.ready().await;
        ready.map_err(|e| Refusal::Failed(transport_failure(&e)))?;
        Ok(client)
    }

    /// A unary call; its answer (or its error status) as a JSON-RPC response body.
    pub(super) async fn unary(
        &self,
        origin: &Uri,
        dialect: Dialect,
        tenant: Option<&str>,
        headers: &http::HeaderMap,
        body: &[u8],
    ) -> Result<Bytes, Failure> {
        let Prepared {
            id,
            rpc,
            dialect,
            path,
            request,
        } = self.prepare(origin, body, dialect, tenant, headers, true)?;
        let exchange = async {
            let mut client = self.client(origin).await?;
            Ok::<_, Refusal>(client.unary(request, path, RawCodec).await?)
        };
        let answer = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| Failure::Timeout)?;
        Ok(Bytes::from(match answer {
            Ok(response) => result_envelope(&id, response.into_inner(), rpc, dialect),
            Err(Refusal::Answered(status)) => error_envelope(&id, &status),
            Err(Refusal::Failed(failure)) => return Err(failure),
        }))
    }

    /// A server-streaming call, as the SSE bytes a JSON-RPC upstream would send: each
    /// message a `data:` event holding a JSON-RPC response, an error status the last one.
    pub(super) async fn stream(
        &self,
        origin: &Uri,
        dialect: Dialect,
        tenant: Option<&str>,
        headers: &http::HeaderMap,
        body: &[u8],
    ) -> Result<BoxStream<'static, Result<Bytes, super::BoxError>>, Failure> {
        // A stream lasts as long as its task; only opening it is bounded.
        let Prepared {
            id,
            rpc,
            dialect,
            path,
            request,
        } = self.prepare(origin, body, dialect, tenant, headers, false)?;
        let opening = async {
            let mut client = self.client(origin).await?;
            Ok::<_, Refusal>(client.server_streaming(request, path, RawCodec).await?)
        };
        let opened = tokio::time::timeout(self.timeout, opening)
            .await
            .map_err(|_| Failure::Timeout)?;
        let event = |envelope: Vec<u8>| {
            let mut data = b"data: ".to_vec();
            data.extend_from_slice(&envelope);
            data.extend_from_slice(b"\n\n");
            Ok(Bytes::from(data))
        };
        let messages = match opened {
            Ok(response) => response.into_inner(),
            Err(Refusal::Answered(status)) => {
                let only = event(error_envelope(&id, &status));
                return Ok(futures_util::stream::once(async move { only }).boxed());
            }
            Err(Refusal::Failed(failure)) => return Err(failure),
        };
        let events = futures_util::stream::unfold(Some(messages), move |messages| {
            let id = id.clone();
            async move {
                let mut messages = messages?;
                match messages.message().await {
                    Ok(Some(bytes)) => {
                        let answer = result_envelope(&id, bytes, rpc, dialect);
                        Some((event(answer), Some(messages)))
                    }
                    Ok(None) => None,
                    Err(status) => match Refusal::from(status) {
                        Refusal::Answered(status) => {
                            Some((event(error_envelope(&id, &status)), None))
                        }
                        Refusal::Failed(failure) => {
                            let broken: super::BoxError = failure.detail().into();
                            Some((Err(broken), None))
                        }
                    },
                }
            }
        });
        Ok(events.boxed())
    }
}

/// An HTTP header (the agent file's, trace context) as gRPC metadata.
fn put_header(metadata: &mut MetadataMap, name: &http::HeaderName, value: &http::HeaderValue) {
    let key = MetadataKey::from_bytes(name.as_str().as_bytes());
    let value = MetadataValue::try_from(value.as_bytes());
    if let (Ok(key), Ok(value)) = (key, value) {
        metadata.insert(key, value);
    }
}

/// A call that got no answer: no connection (classified as the HTTP upstreams' are), or
/// one that broke.
fn transport_failure(e: &(dyn std::error::Error + 'static)) -> Failure {
    let connecting = std::iter::successors(Some(e), |err| err.source()).any(|err| {
        err.downcast_ref::<hyper_util::client::legacy::Error>()
            .is_some_and(hyper_util::client::legacy::Error::is_connect)
    });
    Failure::classify(e, connecting)
}

/// A gRPC answer as the JSON-RPC response an upstream of `dialect` would have sent.
fn result_envelope(id: &RawValue, bytes: Bytes, rpc: &wire::Rpc, dialect: Dialect) -> Vec<u8> {
    let output = &rpc.output;
    let result = match wire::decode(bytes, output) {
        Ok(message) => serde_json::to_value(&message).unwrap_or(Value::Null),
        Err(e) => {
            let error = json!({"code": -32006, "message": format!("the upstream's answer is {e}")});
            return envelope(id, "error", error);
        }
    };
    let result = match (dialect, result) {
        (Dialect::V03, result) => grpc_v03::answer(rpc.method, result),
        // An empty answer (google.protobuf.Empty) is JSON-RPC's null result.
        (_, Value::Object(m)) if m.is_empty() && output.full_name() == "google.protobuf.Empty" => {
            Value::Null
        }
        (_, other) => other,
    };
    envelope(id, "result", result)
}

/// A gRPC error status as the JSON-RPC error an upstream would have sent: the A2A code of
/// its `ErrorInfo` reason (1.0), or of the error type its message names (a2a-sdk 0.3.x,
/// which sends no details), its message, and its details.
fn error_envelope(id: &RawValue, status: &Status) -> Vec<u8> {
    let details = prost::Message::decode(status.details())
        .ok()
        .map(|s: RpcStatus| s.details);
    let info = details
        .iter()
        .flatten()
        .find(|d| d.type_url == ERROR_INFO_TYPE)
        .and_then(|d| <ErrorInfo as prost::Message>::decode(d.value.as_slice()).ok());
    let named = grpc_v03::error_of(status.message()).filter(|_| info.is_none());
    let code = info
        .as_ref()
        .and_then(|i| crate::error::code_of_reason(&i.reason))
        .or(named.map(|(code, _)| code))
        .unwrap_or(match status.code() {
            Code::InvalidArgument => -32602,
            Code::Unimplemented => -32601,
            _ => -32603,
        });
    let message = named.map_or(status.message(), |(_, message)| message);
    let mut error = json!({"code": code, "message": message});
    if let Some(info) = info {
        error["data"] = json!([{
            "@type": ERROR_INFO_TYPE,
            "reason": info.reason,
            "domain": info.domain,
            "metadata": info.metadata,
        }]);
    }
    envelope(id, "error", error)
}

fn envelope(id: &RawValue, member: &str, value: Value) -> Vec<u8> {
    let mut out = format!(r#"{{"jsonrpc":"2.0","id":{},"{member}":"#, id.get()).into_bytes();
    // Writing a Value into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, &value);
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_back_as_the_json_rpc_errors_they_stand_for() {
        let id = RawValue::from_string("7".into()).unwrap();
        let info = ErrorInfo {
            reason: "TASK_NOT_FOUND".into(),
            domain: "a2a-protocol.org".into(),
            metadata: [("taskId".to_string(), "t-9".to_string())].into(),
        };
        let details = RpcStatus {
            code: Code::NotFound as i32,
            message: "Task not found: t-9".into(),
            details: vec![prost_types::Any {
                type_url: ERROR_INFO_TYPE.into(),
                value: prost::Message::encode_to_vec(&info),
            }],
        };
        let status = Status::with_details(
            Code::NotFound,
            "Task not found: t-9",
            Bytes::from(prost::Message::encode_to_vec(&details)),
        );
        let error: Value = serde_json::from_slice(&error_envelope(&id, &status)).unwrap();
        assert_eq!(error["id"], 7);
        assert_eq!(error["error"]["code"], -32001);
        assert_eq!(error["error"]["data"][0]["reason"], "TASK_NOT_FOUND");
        assert_eq!(error["error"]["data"][0]["metadata"]["taskId"], "t-9");
        let bare = Status::new(Code::FailedPrecondition, "no");
        let error: Value = serde_json::from_slice(&error_envelope(&id, &bare)).unwrap();
        assert_eq!(error["error"]["code"], -32603);
        // a2a-sdk 0.3.x names the error in the message, and sends no details.
        let sdk03 = Status::new(Code::NotFound, "TaskNotFoundError: Task not found");
        let error: Value = serde_json::from_slice(&error_envelope(&id, &sdk03)).unwrap();
        assert_eq!(error["error"]["code"], -32001);
        assert_eq!(error["error"]["message"], "Task not found");
    }

    #[test]
    fn answers_read_back_as_json_rpc_results() {
        let id = RawValue::from_string("\"a\"".into()).unwrap();
        let get = wire::rpc_of(Method::GetTask, Dialect::V10).unwrap();
        let task = wire::json_to_bytes(
            r#"{"id":"t","contextId":"c","status":{"state":"TASK_STATE_WORKING"}}"#,
            &get.output,
        )
        .unwrap();
        let answer: Value =
            serde_json::from_slice(&result_envelope(&id, task, get, Dialect::V10)).unwrap();
        assert_eq!(answer["id"], "a");
        assert_eq!(answer["result"]["status"]["state"], "TASK_STATE_WORKING");
        let delete = Method::Push(crate::protocol::push::PushOp::Delete);
        let delete = wire::rpc_of(delete, Dialect::V10).unwrap();
        let empty: Value =
            serde_json::from_slice(&result_envelope(&id, Bytes::new(), delete, Dialect::V10))
                .unwrap();
        assert_eq!(empty["result"], Value::Null);
    }
}

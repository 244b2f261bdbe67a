//! Benchmark baseline for the gRPC binding: the least a tonic unary `SendMessage` handler
//! does. It decodes the request into prost structs (as generated code would; only the fields
//! the echo reads are declared, the rest skipped as prost skips unknown fields) and answers a
//! fixed `SendMessageResponse` of the same shape and size as the echo agent's, over hyper's
//! HTTP/2 server with tonic's framing, as the gateway serves gRPC.
//!
//! `cargo run --release --example bare_grpc -- 127.0.0.1:9002`

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use a2a_gateway::protocol::grpc::{json_to_bytes, rpc_of, RawCodec};
use a2a_gateway::protocol::jsonrpc::Method;
use a2a_gateway::protocol::Dialect;
use bytes::Bytes;
use prost::Message;
use tonic::{Request, Response, Status};

const RESULT_OBJECT: &str = r#"{"task":{"id":"0bdcadd3-4bd1-40ad-9c00-0429134e5dbc","contextId":"461117a0-1503-431d-b982-5c588135eb66","status":{"state":"TASK_STATE_COMPLETED","timestamp":"2026-11-21T22:13:35.763Z"},"artifacts":[{"artifactId":"echo","name":"echo","parts":[{"text":"hello"}]}],"history":[{"messageId":"m1","contextId":"461117a0-1503-431d-b982-5c588135eb66","taskId":"0bdcadd3-4bd1-40ad-9c00-0429134e5dbc","role":"ROLE_USER","parts":[{"text":"hello"}]}]}}"#;

#[derive(Clone, PartialEq, prost::Message)]
struct SendMessageRequest {
    #[prost(string, tag = "1")]
    tenant: String,
    #[prost(message, optional, tag = "2")]
    message: Option<A2aMessage>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct A2aMessage {
    #[prost(string, tag = "1")]
    message_id: String,
    #[prost(string, tag = "2")]
    context_id: String,
    #[prost(string, tag = "3")]
    task_id: String,
    #[prost(int32, tag = "4")]
    role: i32,
    #[prost(message, repeated, tag = "5")]
    parts: Vec<Part>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Part {
    #[prost(string, tag = "1")]
    text: String,
}

#[derive(Clone)]
struct Fixed(Bytes);

impl tower_service::Service<Request<Bytes>> for Fixed {
    type Response = Response<Bytes>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Bytes>, Status>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let answer = match SendMessageRequest::decode(request.into_inner()) {
            Ok(req) if req.message.is_some() => Ok(Response::new(self.0.clone())),
            Ok(_) => Err(Status::invalid_argument("message is required")),
            Err(e) => Err(Status::invalid_argument(e.to_string())),
        };
        Box::pin(std::future::ready(answer))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9002".into());
    let rpc = rpc_of(Method::SendMessage, Dialect::V10).expect("SendMessage has a gRPC method");
    let answer = Fixed(json_to_bytes(RESULT_OBJECT, &rpc.output).expect("a valid constant"));
    let path = rpc.path.clone();
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (answer, path) = (answer.clone(), path.clone());
        let service = hyper::service::service_fn(move |req: http::Request<_>| {
            let (answer, path) = (answer.clone(), path.clone());
            async move {
                if req.uri().path() != path {
                    let status = Status::unimplemented(req.uri().path().to_owned());
                    return Ok::<_, Infallible>(status.into_http());
                }
                Ok(tonic::server::Grpc::new(RawCodec).unary(answer, req).await)
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`), so that generic clients
//! (grpcurl, `buf curl`, Postman, grpcio's reflection client) call the gateway without the
//! proto files. It describes the one service the port serves, `lf.a2a.v1.A2AService`, and
//! its messages: nothing a caller could not read in the spec, so it needs no credentials,
//! as the cards do not. tonic-reflection answers; it is built on first use.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

use tower_service::Service;

use super::Answer;
use crate::protocol::grpc as wire;

type Reflect = Box<
    dyn Fn(http::Request<hyper::body::Incoming>) -> Pin<Box<dyn Future<Output = Answer> + Send>>
        + Send
        + Sync,
>;

const V1: &str = "/grpc.reflection.v1.ServerReflection/";
const V1ALPHA: &str = "/grpc.reflection.v1alpha.ServerReflection/";

/// Whether `path` is a reflection method (asked only of paths the A2A service lacks).
pub(super) fn serves(path: &str) -> bool {
    path.starts_with(V1) || path.starts_with(V1ALPHA)
}

pub(super) async fn call(req: http::Request<hyper::body::Incoming>) -> Answer {
    match service() {
        Some(reflect) => reflect(req).await,
        None => tonic::Status::unimplemented("server reflection is unavailable").into_http(),
    }
}

fn service() -> Option<&'static Reflect> {
    static SERVICE: OnceLock<Option<Reflect>> = OnceLock::new();
    SERVICE
        .get_or_init(|| {
            let builder = || {
                tonic_reflection::server::Builder::configure()
                    .register_encoded_file_descriptor_set(wire::descriptor_set())
                    .with_service_name(wire::SERVICE)
            };
            let built = builder()
                .build_v1()
                .and_then(|v1| Ok((v1, builder().build_v1alpha()?)));
            let (v1, v1alpha) = built
                .inspect_err(|e| tracing::error!(error = %e, "gRPC reflection could not be built"))
                .ok()?;
            let reflect: Reflect = Box::new(move |req| {
                let infallible = |never: std::convert::Infallible| match never {};
                if req.uri().path().starts_with(V1) {
                    let mut v1 = v1.clone();
                    Box::pin(async move { v1.call(req).await.unwrap_or_else(infallible) })
                } else {
                    let mut v1alpha = v1alpha.clone();
                    Box::pin(async move { v1alpha.call(req).await.unwrap_or_else(infallible) })
                }
            });
            Some(reflect)
        })
        .as_ref()
}

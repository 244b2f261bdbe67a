//! The gRPC binding: A2A 1.0's `lf.a2a.v1.A2AService` on `[server] grpc_port`, served by
//! the gateway's own workers (hyper's HTTP/2 server, tonic's framing and statuses).
//!
//! A call names its agent with the `tenant` field every request message has (the per-agent
//! cards list the gRPC interface with the agent's name as its tenant); without one it is
//! routed as `/a2a` routes. Its message is read against the spec's descriptor, turned into
//! the ProtoJSON the 1.0 JSON bindings already speak, and goes through the same admission
//! and dispatch as a JSON-RPC call; the answer is read back into the method's output
//! message. The common send (a text message to a named agent) skips ProtoJSON, as do
//! answers carrying a task and a stream's items (see `protocol::grpc_send`). Errors are
//! statuses from the one error table (see [`status`]).

mod reflection;
pub(crate) mod status;

use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use actix_web::web;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use prost_reflect::MessageDescriptor;
use serde::Deserialize;
use serde_json::value::RawValue;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};

use crate::auth::Presented;
use crate::error::GatewayError;
use crate::http::admission::{self, Admitted, Head, Refused, Target};
use crate::http::{Addressed, AppState, Caller};
use crate::limits::RateInfo;
use crate::protocol::grpc::{self as wire, RawCodec, Rpc};
use crate::protocol::grpc_send;
use crate::protocol::jsonrpc::{Method, RpcId, RpcRequest};
use crate::protocol::Dialect;
use crate::routing::Served;
use crate::rpc::RpcReply;
use crate::telemetry;
use crate::usage::budgets::Standing;
use status::status_of;

/// Runs hyper's futures on the worker that accepted the connection: the calls hold the
/// worker's own handles on the configuration (see `http::live`), as HTTP requests do.
#[derive(Clone, Copy)]
struct LocalExec;

impl<F: Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, future: F) {
        tokio::task::spawn_local(future);
    }
}

/// Who is at the other end of a connection: its address, and the identity of the client
/// certificate its TLS session was verified with.
#[derive(Clone, Default)]
pub(crate) struct Peer {
    pub(crate) addr: Option<SocketAddr>,
    pub(crate) certificate: Option<Arc<str>>,
}

/// Serves one connection (HTTP/2: gRPC has no other) until its client or the gateway
/// closes it. The connection is pinged at the stream keep-alive period, so that a client
/// gone away is noticed and a quiet stream is kept open through proxies.
pub(crate) async fn serve_connection<IO>(stream: IO, peer: Peer, state: web::Data<AppState>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let keepalive = state.live().default_keepalive();
    let service = hyper::service::service_fn(move |req| {
        let (state, peer) = (state.clone(), peer.clone());
        async move { Ok::<_, Infallible>(call(req, state, peer).await) }
    });
    let served = hyper::server::conn::http2::Builder::new(LocalExec)
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(keepalive)
        .keep_alive_timeout(Duration::from_secs(20))
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "gRPC connection ended");
    }
}

type Answer = http::Response<tonic::body::Body>;

/// One call: its method, then tonic's framing around [`Handler`]; metrics and the access
/// log as every binding's.
async fn call(
    req: http::Request<hyper::body::Incoming>,
    state: web::Data<AppState>,
    peer: Peer,
) -> Answer {
    let start = Instant::now();
    let rpc = wire::rpc_at(req.uri().path());
    if rpc.is_none() && reflection::serves(req.uri().path()) {
        return reflection::call(req).await;
    }
    let trace = req.headers().get("traceparent").and_then(|parent| {
        let state = req.headers().get("tracestate").map(|v| v.as_bytes());
        telemetry::TraceParent::with_state(parent.as_bytes(), state)
    });
    let logged = tracing::enabled!(target: telemetry::ACCESS, tracing::Level::INFO);
    let path = logged.then(|| req.uri().path().to_owned());
    let trace_id = trace
        .as_ref()
        .filter(|_| logged)
        .map(|(t, _)| t.trace_id().to_string());
    let deadline = grpc_timeout(req.headers()).map(|d| (tokio::time::Instant::now() + d, d));
    let limit = state.bodies.max_bytes();
    let (parts, body) = req.into_parts();
    let head = GrpcHead {
        headers: parts.headers.clone(),
        peer: peer.addr.map(|p| p.ip()),
        certificate: peer.certificate,
        rate: Cell::new(None),
        budget: Default::default(),
    };
    let framed = {
        let state = state.clone();
        async move {
            // Refused before anything else, and accounted for as every call is: a method
            // the service does not have, or any while the gateway drains.
            let Some(rpc) = rpc else {
                let error = GatewayError::MethodNotFound(crate::http::quoted(parts.uri.path()));
                return status_of(&error).into_http();
            };
            telemetry::note_method(rpc.method.name(), Dialect::V10.version(), "grpc");
            if state.lifecycle.draining() {
                return status_of(&state.shutting_down()).into_http();
            }
            let caller = Caller::of(&head, &state);
            // The version and the credentials before the message is read: a caller that
            // cannot get in makes the gateway hold nothing for it.
            let refusal = check_version(&head.headers)
                .and_then(|()| caller.principal.as_ref().map(|_| ()).map_err(Clone::clone));
            if let Err(error) = refusal {
                return refused(&head, error.into()).into_http();
            }
            let body = match read_message(&state, &head, &caller, &parts.headers, body).await {
                Ok(body) => body,
                Err(error) => return refused(&head, error.into()).into_http(),
            };
            if state.usage.recording() {
                telemetry::note(|c| c.bytes_in = body.len() as u64);
            }
            // The card's URLs name the host the caller reached (when no public_url is set).
            let host = (rpc.method == Method::GetExtendedAgentCard)
                .then(|| parts.uri.host().map(str::to_owned))
                .flatten();
            let req = http::Request::from_parts(parts, http_body_util::Full::new(body));
            let handler = Handler {
                state,
                rpc,
                head,
                caller,
                deadline,
                host,
            };
            // The body was read within the limit; tonic's holds a compressed message to it
            // once inflated (RESOURCE_EXHAUSTED).
            let mut grpc =
                tonic::server::Grpc::new(RawCodec).apply_max_message_size_config(Some(limit), None);
            let handler = Some(handler);
            match rpc.method.is_streaming() {
                true => {
                    let call = Once {
                        handler,
                        answer: streaming,
                    };
                    grpc.server_streaming(call, req).await
                }
                false => {
                    grpc.unary(
                        Once {
                            handler,
                            answer: unary,
                        },
                        req,
                    )
                    .await
                }
            }
        }
    };
    let span = state.tracing.as_ref().map(|t| {
        let attributes = vec![
            opentelemetry::KeyValue::new("rpc.system", "grpc"),
            opentelemetry::KeyValue::new("rpc.service", "lf.a2a.v1.A2AService"),
            opentelemetry::KeyValue::new("a2a.binding", "grpc"),
        ];
        t.server_span(trace.as_ref(), "gRPC call".into(), attributes)
    });
    let (framed, scope) = telemetry::observed(trace, span, framed);
    let answer = framed.await;
    let call = scope.take();
    // The answer's bytes, counted as they go out (a stream's included).
    let streamed =
        crate::usage::Streamed::start(&state.usage, call.principal.clone(), call.agent.clone());
    let answer = match streamed {
        Some(counted) => answer.map(|inner| tonic::body::Body::new(Counting { inner, counted })),
        None => answer,
    };
    let mut answer = answer;
    if let Some(activated) = call.extensions_activated.as_deref() {
        if let Ok(value) = http::HeaderValue::from_str(activated) {
            let name = crate::protocol::extensions_header(Dialect::V10);
            answer.headers_mut().insert(name, value);
        }
    }
    let status = grpc_status(&answer).map_or(0, |c| c as u16);
    let logged = path.as_deref().map(|path| crate::http::Logged {
        method: "POST",
        path,
        status,
        trace_id: trace_id.as_deref(),
    });
    if let Some(span) = scope.span() {
        let route = answer
            .headers()
            .get("a2a-gateway-route")
            .and_then(|v| v.to_str().ok());
        span.finish(&call, status, true, route);
    }
    crate::http::account(&state, &call, start.elapsed().as_secs_f64(), logged);
    answer
}

/// The status an answer already carries in its headers (a trailers-only answer).
fn grpc_status(answer: &Answer) -> Option<tonic::Code> {
    let value = answer.headers().get("grpc-status")?.to_str().ok()?;
    Some(tonic::Code::from_i32(value.parse().ok()?))
}

/// `grpc-timeout`: digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

pin_project_lite::pin_project! {
    /// An answer's body, its bytes counted for usage as they go out.
    struct Counting {
        #[pin]
        inner: tonic::body::Body,
        counted: crate::usage::Streamed,
    }
}

impl http_body::Body for Counting {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        let me = self.project();
        let frame = std::task::ready!(me.inner.poll_frame(cx));
        if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(|f| f.data_ref())) {
            me.counted.bytes += data.map_or(0, |d| d.len() as u64);
        }
        std::task::Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// What admission reads of a gRPC call: its metadata, and the peer.
struct GrpcHead {
    headers: http::HeaderMap,
    peer: Option<IpAddr>,
    certificate: Option<Arc<str>>,
    rate: Cell<Option<RateInfo>>,
    budget: std::cell::RefCell<Option<Standing>>,
}

impl Head for GrpcHead {
    fn presented(&self) -> Presented<'_> {
        Presented::first_of(
            self.headers
                .get_all("x-api-key")
                .iter()
                .map(|v| v.as_bytes()),
            (self.headers.get_all(http::header::AUTHORIZATION).iter()).map(|v| v.as_bytes()),
        )
        .with_certificate(self.certificate.as_deref())
    }

    fn origin(&self) -> (Option<IpAddr>, Option<&str>) {
        let xff = self
            .headers
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok());
        (self.peer, xff)
    }

    fn peer(&self) -> Option<IpAddr> {
        self.peer
    }

    fn keep_rate(&self, info: RateInfo) {
        self.rate.set(Some(info));
    }

    fn keep_budget(&self, standing: Standing) {
        *self.budget.borrow_mut() = Some(standing);
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn extensions(&self) -> Option<&str> {
        crate::protocol::extensions_in(|name| self.headers.get(name).map(|v| v.as_bytes()))
    }
}

impl GrpcHead {
    /// The rate numbers and the agent that answered, as metadata on the answer or status.
    fn stamp(&self, metadata: &mut MetadataMap, served: Option<&Served>) {
        for (name, value) in self.rate.get().iter().flat_map(RateInfo::headers) {
            metadata.insert(name, MetadataValue::from(value));
        }
        for (name, value) in served.iter().flat_map(|s| s.headers()) {
            if let Ok(value) = value.parse() {
                metadata.insert(name, value);
            }
        }
        if let Some(standing) = self.budget.borrow().as_ref() {
            for (name, value) in standing.headers() {
                if let Ok(value) = value.parse() {
                    metadata.insert(name, value);
                }
            }
        }
    }
}

/// A call: its method, who makes it, and by when.
struct Handler {
    state: web::Data<AppState>,
    rpc: &'static Rpc,
    head: GrpcHead,
    caller: Caller,
    deadline: Option<(tokio::time::Instant, Duration)>,
    /// The host the caller reached, for `GetExtendedAgentCard` only.
    host: Option<String>,
}

/// A call's body, read through the budgets every body is (its size, its time, the bytes
/// held gateway-wide and by its caller) before tonic takes it: one message of at most
/// `max_body_bytes` and its five bytes of framing.
async fn read_message(
    state: &AppState,
    head: &GrpcHead,
    caller: &Caller,
    headers: &http::HeaderMap,
    body: hyper::body::Incoming,
) -> Result<Bytes, GatewayError> {
    use http_body_util::BodyExt;
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let principal = caller.principal.as_ref().ok();
    let hash = |h: &ahash::RandomState| caller.live.caller_hash(head, principal, h);
    let payer = crate::http::Payer {
        hash: &hash,
        anonymous: principal.is_none_or(|p| p.anonymous),
    };
    let limit = state.bodies.max_bytes().saturating_add(5);
    let read = crate::http::read_chunks(
        body.into_data_stream(),
        declared,
        limit,
        &state.bodies,
        &payer,
        crate::http::Feeding::Woken,
    );
    read.await.map_err(|e| match e {
        // The limit is the message's; its five bytes of framing are not the caller's to count.
        GatewayError::PayloadTooLarge(_) => GatewayError::PayloadTooLarge(state.bodies.max_bytes()),
        other => other,
    })
}

/// A JSON-RPC answer's result (none, or null, for an answer with no content).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    result: Option<&'a RawValue>,
}

impl Handler {
    /// The call read, admitted and dispatched, as a JSON-RPC call on `/a2a` (no `tenant`)
    /// or on the tenant's agent.
    async fn run(&self, message: Bytes) -> Result<(RpcReply, Admitted), Refused> {
        let (method, head) = (self.rpc.method, &self.head);
        let live = &self.caller.live;
        // Checked before the body was read.
        let principal = self.caller.principal.clone()?;
        // The common send is read straight into its params; anything else crosses ProtoJSON.
        let common = match method {
            Method::SendMessage | Method::SendStreamingMessage => grpc_send::read_send(&message),
            _ => None,
        };
        let (tenant, params, send) = match common {
            Some((tenant, send)) => (Some(tenant), None, Some(send)),
            None => {
                let mut message =
                    wire::decode(message, &self.rpc.input).map_err(GatewayError::Parse)?;
                let tenant = wire::take_tenant(&mut message);
                let params = serde_json::value::to_raw_value(&message).map_err(|e| {
                    GatewayError::Internal(format!("the message as ProtoJSON: {e}"))
                })?;
                (tenant, Some(params), None)
            }
        };
        let addressed = Addressed::of(&live.registry, tenant.as_deref());
        let principal = admission::at_the_door(live, Ok(principal), &addressed)?;
        let rpc = RpcRequest {
            id: RpcId::NULL,
            method,
            dialect: Dialect::V10,
            params: params.as_deref(),
            send,
            resume: None,
            protobuf_answer: true,
        };
        let streams = method.is_streaming();
        let target = Target::Rpc(&rpc);
        let state = &self.state;
        let admitted =
            admission::admit(state, head, live, &principal, addressed, target, streams).await?;
        let (agent, served) = (&admitted.agent, &admitted.served);
        let (_, _, outcome) = crate::rpc::run(&state.service, agent, &principal, rpc, served).await;
        match outcome {
            Ok(reply) => Ok((reply, admitted)),
            Err(error) => Err(Refused {
                error,
                served: Some(admitted.served),
            }),
        }
    }

    /// `GetExtendedAgentCard`, which the gateway answers itself (as every binding does:
    /// see `http::extended_card`), for the tenant's agent or, without one, the gateway.
    fn extended_card(&self, message: Bytes) -> Result<Bytes, Refused> {
        let live = &self.caller.live;
        let principal = self.caller.principal.clone()?;
        let mut message = wire::decode(message, &self.rpc.input).map_err(GatewayError::Parse)?;
        let tenant = wire::take_tenant(&mut message);
        let addressed = Addressed::of(&live.registry, tenant.as_deref());
        let base = match (live.config.public_url(), &self.host) {
            (Some(url), _) => url.to_string(),
            (None, host) => {
                let host = host.as_deref().unwrap_or("localhost");
                format!("http://{host}:{}", self.state.http_port)
            }
        };
        let state = &self.state;
        let card =
            crate::http::extended_card(state, live, &principal, &addressed, &base, Dialect::V10)?;
        let card = std::str::from_utf8(card.json())
            .map_err(|e| GatewayError::Internal(format!("a rendered card: {e}")))?;
        Ok(encode_json(card, &self.rpc.output)?)
    }

    /// `fut`, or the deadline's error if the caller's `grpc-timeout` passes first.
    async fn in_time<T>(
        &self,
        fut: impl Future<Output = Result<T, Refused>>,
    ) -> Result<T, Refused> {
        match self.deadline {
            Some((at, given)) => match tokio::time::timeout_at(at, fut).await {
                Ok(done) => done,
                Err(_) => Err(GatewayError::DeadlineExceeded(format!("{given:?}")).into()),
            },
            None => fut.await,
        }
    }
}

/// This binding is 1.0's; 0.3's gRPC service is another (`a2a.v1`), not served here.
fn check_version(headers: &http::HeaderMap) -> Result<(), GatewayError> {
    let version = headers
        .get("a2a-version")
        .map(|v| String::from_utf8_lossy(v.as_bytes()));
    admission::v10_only(
        version.as_deref(),
        "1.0 on the gRPC binding (lf.a2a.v1); 0.3 clients use JSON-RPC",
    )
}

/// A JSON-RPC result (the body of a JSON answer) as `output`'s protobuf encoding.
fn encode_result(body: &[u8], output: &MessageDescriptor) -> Result<Bytes, GatewayError> {
    let envelope: Envelope = serde_json::from_slice(body)
        .map_err(|e| GatewayError::Internal(format!("reading an answer: {e}")))?;
    match envelope.result {
        Some(result) if result.get() != "null" => encode_json(result.get(), output),
        _ => Ok(Bytes::new()),
    }
}

/// 1.0 JSON as `output`'s protobuf encoding; not matching it is the gateway's fault.
fn encode_json(json: &str, output: &MessageDescriptor) -> Result<Bytes, GatewayError> {
    wire::json_to_bytes(json, output)
        .map_err(|e| GatewayError::Internal(format!("an answer as protobuf: {e}")))
}

/// A refusal as the status it goes out with, with the metadata every answer carries.
fn refused(head: &GrpcHead, Refused { error, served }: Refused) -> Status {
    let mut status = status_of(&error);
    head.stamp(status.metadata_mut(), served.as_ref());
    status
}

type Boxed<T> = Pin<Box<dyn Future<Output = Result<Response<T>, Status>>>>;

/// A method as tonic calls it (once per call): `answer` runs the call.
struct Once<T> {
    handler: Option<Handler>,
    answer: fn(Handler, Bytes) -> Boxed<T>,
}

impl<T: 'static> tower_service::Service<Request<Bytes>> for Once<T> {
    type Response = Response<T>;
    type Error = Status;
    type Future = Boxed<T>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        match self.handler.take() {
            Some(handler) => (self.answer)(handler, request.into_inner()),
            None => Box::pin(std::future::ready(Err(Status::internal("called twice")))),
        }
    }
}

/// A unary method's answer.
fn unary(handler: Handler, message: Bytes) -> Boxed<Bytes> {
    Box::pin(async move {
        let head = &handler.head;
        if handler.rpc.method == Method::GetExtendedAgentCard {
            return match handler.extended_card(message) {
                Ok(card) => Ok(Response::new(card)),
                Err(refusal) => Err(refused(head, refusal)),
            };
        }
        let answered = handler
            .in_time(async {
                let (reply, admitted) = handler.run(message).await?;
                // As on the other bindings: with a shared store or synced commits, the
                // answer leaves once what the call changed is there.
                let store = &handler.state.store;
                if store.answers_wait() && !store.settled().await && store.sync {
                    return Err(Refused {
                        error: GatewayError::StoreUnavailable(
                            "the commit holding the call's changes failed".into(),
                        ),
                        served: Some(admitted.served),
                    });
                }
                let encoded = match reply {
                    RpcReply::Protobuf(encoded) => Bytes::from(encoded),
                    RpcReply::Json { body, .. } => encode_result(&body, &handler.rpc.output)
                        .map_err(|error| Refused {
                            error,
                            served: Some(admitted.served.clone()),
                        })?,
                    RpcReply::Stream { .. } => {
                        let error = GatewayError::Internal("a stream for a unary call".into());
                        return Err(error.into());
                    }
                };
                Ok((encoded, admitted.served))
            })
            .await;
        match answered {
            Ok((encoded, served)) => {
                let mut response = Response::new(encoded);
                head.stamp(response.metadata_mut(), Some(&served));
                Ok(response)
            }
            Err(refusal) => Err(refused(head, refusal)),
        }
    })
}

type Messages = BoxStream<'static, Result<Bytes, Status>>;

/// A server-streaming method's answer: the agent's events as `StreamResponse`s.
fn streaming(handler: Handler, message: Bytes) -> Boxed<Messages> {
    Box::pin(async move {
        let head = &handler.head;
        let opened = handler.in_time(handler.run(message)).await;
        let (reply, admitted) = opened.map_err(|refusal| refused(head, refusal))?;
        let Admitted { served, slot, .. } = admitted;
        let RpcReply::Stream { items, .. } = reply else {
            let error = GatewayError::Internal("no stream for a streaming call".into());
            return Err(refused(head, error.into()));
        };
        let Some(slot) = slot else {
            let error = GatewayError::Internal("a stream without a slot".into());
            return Err(refused(head, error.into()));
        };
        let output = handler.rpc.output.clone();
        // The slot is held as long as the stream is: a client that goes away drops both.
        let items = crate::http::watched(&handler.state, items, slot);
        let messages = items.map(move |item| {
            let item = item.map_err(|e| status_of(&e))?;
            if let Some(encoded) = grpc_send::stream_item(&item) {
                return Ok(Bytes::from(encoded));
            }
            let json = serde_json::to_string(&item)
                .map_err(|e| status_of(&GatewayError::Internal(e.to_string())))?;
            encode_json(&json, &output).map_err(|e| status_of(&e))
        });
        let messages: Messages = match handler.deadline {
            Some((at, given)) => Box::pin(until(messages, at, given)),
            None => Box::pin(messages),
        };
        let mut response = Response::new(messages);
        head.stamp(response.metadata_mut(), Some(&served));
        Ok(response)
    })
}

/// `messages` until the deadline, which ends the stream with its status.
fn until(
    messages: impl futures_util::Stream<Item = Result<Bytes, Status>> + Send + 'static,
    at: tokio::time::Instant,
    given: Duration,
) -> impl futures_util::Stream<Item = Result<Bytes, Status>> + Send + 'static {
    let messages = Box::pin(messages);
    futures_util::stream::unfold(Some(messages), move |messages| async move {
        let mut messages = messages?;
        match tokio::time::timeout_at(at, messages.next()).await {
            Ok(Some(item)) => Some((item, Some(messages))),
            Ok(None) => None,
            Err(_) => {
                let error = GatewayError::DeadlineExceeded(format!("{given:?}"));
                Some((Err(status_of(&error)), None))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_reflect::DynamicMessage;

    #[test]
    fn every_method_of_the_service_is_dispatched() {
        assert_eq!(wire::service_methods(), 11);
        for name in [
            "SendMessage",
            "SendStreamingMessage",
            "GetTask",
            "ListTasks",
            "CancelTask",
            "SubscribeToTask",
            "CreateTaskPushNotificationConfig",
            "GetTaskPushNotificationConfig",
            "ListTaskPushNotificationConfigs",
            "DeleteTaskPushNotificationConfig",
            "GetExtendedAgentCard",
        ] {
            let rpc = wire::rpc_at(&format!("/{}/{name}", wire::SERVICE))
                .unwrap_or_else(|| panic!("{name}"));
            assert_eq!(rpc.method.name(), name);
        }
        assert!(wire::rpc_at("/lf.a2a.v1.A2AService/Nope").is_none());
        assert!(wire::rpc_at("/a2a.v1.A2AService/SendMessage").is_none());
    }

    #[test]
    fn deadlines_read_as_grpc_writes_them() {
        let mut h = http::HeaderMap::new();
        for (v, d) in [
            ("1S", Some(Duration::from_secs(1))),
            ("250m", Some(Duration::from_millis(250))),
            ("2M", Some(Duration::from_secs(120))),
            ("5u", Some(Duration::from_micros(5))),
            ("S", None),
            ("123456789S", None),
            ("10x", None),
        ] {
            h.insert("grpc-timeout", v.parse().unwrap());
            assert_eq!(grpc_timeout(&h), d, "{v}");
        }
    }

    #[test]
    fn results_read_back_into_the_output_message() {
        let get = wire::rpc_at("/lf.a2a.v1.A2AService/GetTask").unwrap();
        let body = br#"{"jsonrpc":"2.0","id":null,"result":{"id":"t-1","contextId":"c-1","status":{"state":"TASK_STATE_COMPLETED","timestamp":"2026-11-26T00:00:00Z"},"metadata":{"a2a-gateway/agent":"echo"},"kind":"task"}}"#;
        let bytes = encode_result(body, &get.output).unwrap();
        let task = DynamicMessage::decode(get.output.clone(), bytes).unwrap();
        let json: serde_json::Value = serde_json::to_value(&task).unwrap();
        assert_eq!(json["id"], "t-1");
        assert_eq!(json["status"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(json["metadata"]["a2a-gateway/agent"], "echo");
        // A request's tenant names the agent and is not passed on.
        let send = wire::rpc_at("/lf.a2a.v1.A2AService/SendMessage").unwrap();
        let json = r#"{"tenant":"echo","message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"hi"}]}}"#;
        let mut request = wire::encode_json(json, &send.input).unwrap();
        assert_eq!(wire::take_tenant(&mut request).as_deref(), Some("echo"));
        let params = serde_json::to_value(&request).unwrap();
        assert!(params.get("tenant").is_none());
        assert_eq!(params["message"]["parts"][0]["text"], "hi");
    }
}

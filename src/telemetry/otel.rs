//! Spans over OTLP: one server span per request and child spans for the work it causes
//! (upstream calls, command runs, LLM calls, store commits waited for), and a span per push
//! delivery attempt linked to the request that made the task.
//!
//! The OpenTelemetry SDK makes the spans (ids, parent-based sampling, the resource from
//! `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`) and the official OTLP exporters send
//! them. Spans are not made through `tracing`: the edge already gathers in one note all
//! a request's span carries, and a `tracing` layer per request would cost every request
//! when export is off. Off (no endpoint), nothing here runs.
//!
//! Ended spans go to a bounded queue that a thread of its own drains in batches; when the
//! collector is slow or away the queue fills and spans are dropped and counted (the SDK's
//! batch processor drops too, but does not say how many), so a request never waits for
//! the collector.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter as _, SpanProcessor,
};
use opentelemetry_sdk::Resource;

use super::TraceParent;
use crate::config::{OtlpProtocol, TelemetryConfig};

/// Spans per export request.
const BATCH: usize = 512;
/// How long a batch waits to fill before it goes.
const BATCH_WAIT: Duration = Duration::from_secs(1);
/// Tasks whose originating request is remembered (for their push deliveries' links); past
/// this the memory starts over.
const ORIGINS: usize = 10_000;

/// The exporter of one gateway: made at start when an endpoint is configured.
pub(crate) struct Tracing {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    dropped: Arc<AtomicU64>,
    /// The server span of the request that made each task.
    origins: Mutex<HashMap<String, SpanContext>>,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing").finish_non_exhaustive()
    }
}

/// Where spans go, from the configuration or the standard environment variables.
fn endpoint_of(cfg: &TelemetryConfig) -> Option<(Option<String>, OtlpProtocol)> {
    let from_env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let protocol = cfg.otlp_protocol.unwrap_or_else(|| {
        match from_env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| from_env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .as_deref()
        {
            Some("grpc") => OtlpProtocol::Grpc,
            _ => OtlpProtocol::HttpProtobuf,
        }
    });
    match &cfg.otlp_endpoint {
        // Given here: the collector's base URL, as the environment variable takes it.
        Some(base) => {
            let url = match protocol {
                OtlpProtocol::HttpProtobuf
                    if !base.trim_end_matches('/').ends_with("/v1/traces") =>
                {
                    format!("{}/v1/traces", base.trim_end_matches('/'))
                }
                _ => base.clone(),
            };
            Some((Some(url), protocol))
        }
        // The exporter reads the variables itself, with their rules.
        None => (from_env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
            || from_env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some())
        .then_some((None, protocol)),
    }
}

impl Tracing {
    /// The exporter `[telemetry]` (or the environment) asks for, started; none when no
    /// endpoint is given. An endpoint that cannot be used is an error naming it.
    pub(crate) fn start(cfg: &TelemetryConfig) -> Result<Option<Arc<Tracing>>, String> {
        let Some((endpoint, protocol)) = endpoint_of(cfg) else {
            return Ok(None);
        };
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            let name = cfg.service_name.as_deref().unwrap_or("a2a-gateway");
            resource = resource.with_service_name(name.to_string());
        }
        let resource = resource
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let dropped = Arc::new(AtomicU64::new(0));
        let (tx, rx) = tokio::sync::mpsc::channel(cfg.max_queued_spans.max(1));
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let exporting = (resource.clone(), dropped.clone());
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx
                            .send(Err(format!("telemetry: a runtime for the exporter: {e}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    // Built here: a gRPC channel belongs to the runtime that made it.
                    let exporter = match exporter(endpoint, protocol) {
                        Ok(e) => e,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    export_loop(exporter, rx, exporting.0, exporting.1).await;
                });
            })
            .map_err(|e| format!("telemetry: the exporter thread: {e}"))?;
        ready_rx
            .recv()
            .map_err(|_| "telemetry: the exporter thread ended".to_string())??;
        let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(cfg.sample_ratio)));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Queue {
                tx,
                dropped: dropped.clone(),
            })
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "a2a-gateway");
        Ok(Some(Arc::new(Tracing {
            tracer,
            provider,
            dropped,
            origins: Mutex::default(),
        })))
    }

    /// Spans dropped so far (queue full, or the collector did not take them).
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Sends what is queued, waiting at most a few seconds (at shutdown). Blocks: called
    /// once the server has stopped.
    pub(crate) fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::debug!(error = %e, "telemetry: flush");
        }
    }

    /// A request's span, a child of the caller's `traceparent` or the root of a new trace.
    pub(crate) fn server_span(
        self: &Arc<Self>,
        caller: Option<&(TraceParent, Option<String>)>,
        name: String,
        attributes: Vec<KeyValue>,
    ) -> Arc<ServerSpan> {
        let parent = match caller.and_then(|(p, state)| remote_context(p, state.as_deref())) {
            Some(remote) => Context::new().with_remote_span_context(remote),
            None => Context::new(),
        };
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        Arc::new(ServerSpan {
            context: opentelemetry::trace::Span::span_context(&span).clone(),
            span: Mutex::new(span),
            tracing: self.clone(),
        })
    }

    /// Remembers the request that made `task_id`, for its later push deliveries.
    fn originated(&self, task_id: &str, context: &SpanContext) {
        let mut origins = self.origins.lock().unwrap_or_else(|e| e.into_inner());
        if origins.len() >= ORIGINS {
            origins.clear();
        }
        origins
            .entry(task_id.to_string())
            .or_insert_with(|| context.clone());
    }

    /// A span of its own trace for one push delivery attempt, linked to the request that
    /// made the task.
    pub(crate) fn push_attempt(&self, task_id: &str, attributes: Vec<KeyValue>) -> Child {
        let origin = (self.origins.lock().unwrap_or_else(|e| e.into_inner()))
            .get(task_id)
            .cloned();
        let links = origin.map(Link::with_context).into_iter().collect();
        let span = self
            .tracer
            .span_builder("push notification")
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .with_links(links)
            .start_with_context(&self.tracer, &Context::new());
        Child { span }
    }
}

/// A caller's `traceparent` as the parent of the gateway's span.
fn remote_context(parent: &TraceParent, state: Option<&str>) -> Option<SpanContext> {
    let trace_id = TraceId::from_hex(parent.trace_id()).ok()?;
    let span_id = SpanId::from_hex(parent.parent_id()).ok()?;
    let flags = u8::from_str_radix(parent.flags(), 16).ok()?;
    let state = state
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags),
        true,
        state,
    ))
}

/// The `traceparent` (and `tracestate`) naming a span as the parent of the next hop.
fn header_of(context: &SpanContext) -> (String, Option<String>) {
    let parent = format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    );
    let state = context.trace_state().header();
    (parent, (!state.is_empty()).then_some(state))
}

/// A request's span. It ends when the last holder lets go: the request when it answers,
/// or a stream it answered with when that ends.
pub(crate) struct ServerSpan {
    span: Mutex<opentelemetry_sdk::trace::Span>,
    context: SpanContext,
    tracing: Arc<Tracing>,
}

impl ServerSpan {
    /// Sets attributes (and with `error`, the status).
    pub(crate) fn record(&self, attributes: Vec<KeyValue>, error: Option<String>) {
        use opentelemetry::trace::Span as _;
        let mut span = self.span.lock().unwrap_or_else(|e| e.into_inner());
        span.set_attributes(attributes);
        if let Some(message) = error {
            span.set_status(Status::error(message));
        }
    }

    pub(crate) fn rename(&self, name: String) {
        use opentelemetry::trace::Span as _;
        self.span
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .update_name(name);
    }

    /// What the work this request causes is a child of.
    pub(crate) fn parent(&self) -> Parent {
        Parent {
            tracing: self.tracing.clone(),
            context: self.context.clone(),
        }
    }

    /// What the request turned out to be, from its note: the A2A attributes, the status
    /// (`status` is HTTP's, or gRPC's code with `grpc`), and which routing rule chose the
    /// agent. The span ends when the last holder lets go.
    pub(crate) fn finish(&self, call: &super::Call, status: u16, grpc: bool, route: Option<&str>) {
        let mut attributes = Vec::with_capacity(12);
        let mut put = |key: &'static str, value: Option<String>| {
            if let Some(v) = value {
                attributes.push(KeyValue::new(key, v));
            }
        };
        put("a2a.method", call.method.map(str::to_string));
        put("a2a.dialect", call.dialect.map(str::to_string));
        put("a2a.binding", call.binding.map(str::to_string));
        put("a2a.agent", call.agent.as_deref().map(str::to_string));
        put("a2a.task.id", call.task_id.clone());
        put("a2a.context.id", call.context_id.clone());
        put("a2a.route", route.map(str::to_string));
        put("enduser.id", call.principal.as_deref().map(str::to_string));
        if let Some((code, reason)) = call.error {
            attributes.push(KeyValue::new("a2a.error.code", code));
            attributes.push(KeyValue::new("a2a.error.reason", reason));
        }
        let failed = if grpc {
            attributes.push(KeyValue::new("rpc.grpc.status_code", i64::from(status)));
            // Internal, Unavailable, DataLoss, Unknown, DeadlineExceeded: the server's fault.
            matches!(status, 2 | 4 | 13 | 14 | 15)
        } else {
            attributes.push(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            status >= 500
        };
        let error = failed.then(|| match call.error {
            Some((_, reason)) => reason.to_string(),
            None => format!("status {status}"),
        });
        self.record(attributes, error);
        if let Some(method) = call.method {
            self.rename(method.to_string());
        }
    }

    /// What a stream's event says of its task: its ids and its latest state.
    pub(crate) fn task_event(&self, task_id: &str, context_id: &str, state: Option<&str>) {
        let mut attributes = vec![
            KeyValue::new("a2a.task.id", task_id.to_string()),
            KeyValue::new("a2a.context.id", context_id.to_string()),
        ];
        if let Some(state) = state {
            attributes.push(KeyValue::new("a2a.task.state", state.to_string()));
        }
        self.record(attributes, None);
    }

    /// Notes that this request made `task_id`.
    pub(crate) fn originated(&self, task_id: &str) {
        self.tracing.originated(task_id, &self.context);
    }
}

/// A span to make children of, sendable to the tasks that do a request's work later.
#[derive(Clone)]
pub(crate) struct Parent {
    tracing: Arc<Tracing>,
    context: SpanContext,
}

impl Parent {
    /// A child span starting now; it ends when dropped.
    pub(crate) fn child(&self, name: String, kind: SpanKind, attributes: Vec<KeyValue>) -> Child {
        let cx = Context::new().with_remote_span_context(self.context.clone());
        let span = (self.tracing.tracer.span_builder(name))
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&self.tracing.tracer, &cx);
        Child { span }
    }
}

/// A span of work a request caused; ends when dropped.
pub(crate) struct Child {
    span: opentelemetry_sdk::trace::Span,
}

impl Child {
    pub(crate) fn set(&mut self, attribute: KeyValue) {
        opentelemetry::trace::Span::set_attribute(&mut self.span, attribute);
    }

    pub(crate) fn fail(&mut self, message: String) {
        opentelemetry::trace::Span::set_status(&mut self.span, Status::error(message));
    }

    /// The `traceparent` and `tracestate` that make the next hop this span's child.
    pub(crate) fn header(&self) -> (String, Option<String>) {
        header_of(opentelemetry::trace::Span::span_context(&self.span))
    }
}

enum Queued {
    Span(Box<SpanData>),
    Flush(std::sync::mpsc::SyncSender<()>),
}

/// The span processor: ended spans into the bounded queue, never waiting.
#[derive(Debug)]
struct Queue {
    tx: tokio::sync::mpsc::Sender<Queued>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Queued")
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.tx.try_send(Queued::Span(Box::new(span))).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        if self.tx.try_send(Queued::Flush(done)).is_ok() {
            let _ = wait.recv_timeout(Duration::from_secs(5));
        }
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        self.force_flush()
    }
}

/// The exporter for the endpoint: HTTP/protobuf through reqwest, or gRPC through tonic.
fn exporter(
    endpoint: Option<String>,
    protocol: OtlpProtocol,
) -> Result<opentelemetry_otlp::SpanExporter, String> {
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    let timeout = Duration::from_secs(10);
    let built = match protocol {
        OtlpProtocol::HttpProtobuf => {
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .map_err(|e| format!("telemetry: the HTTP client: {e}"))?;
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_http_client(Reqwest(client))
                .with_timeout(timeout);
            if let Some(e) = endpoint {
                b = b.with_endpoint(e);
            }
            b.build()
        }
        OtlpProtocol::Grpc => {
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_timeout(timeout);
            if let Some(e) = endpoint {
                b = b.with_endpoint(e);
            }
            b.build()
        }
    };
    built.map_err(|e| format!("telemetry.otlp_endpoint: {e}"))
}

/// Sends batches as they fill or age; a batch the collector does not take is dropped and
/// counted (it is not retried: later spans matter more than old ones).
async fn export_loop(
    mut exporter: opentelemetry_otlp::SpanExporter,
    mut rx: tokio::sync::mpsc::Receiver<Queued>,
    resource: Resource,
    dropped: Arc<AtomicU64>,
) {
    exporter.set_resource(&resource);
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let first = rx.recv().await;
        let mut flushes = Vec::new();
        let mut open = true;
        match first {
            Some(Queued::Span(s)) => batch.push(*s),
            Some(Queued::Flush(done)) => flushes.push(done),
            None => open = false,
        }
        let deadline = tokio::time::Instant::now() + BATCH_WAIT;
        while open && flushes.is_empty() && batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Queued::Span(s))) => batch.push(*s),
                Ok(Some(Queued::Flush(done))) => flushes.push(done),
                Ok(None) => open = false,
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            let n = batch.len() as u64;
            if let Err(e) = exporter.export(std::mem::take(&mut batch)).await {
                dropped.fetch_add(n, Ordering::Relaxed);
                tracing::debug!(error = %e, spans = n, "telemetry: the collector did not take a batch");
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
        if !open {
            return;
        }
    }
}

/// The OTLP HTTP exporter's client: the gateway's reqwest (the exporter's own reqwest
/// support is for another major version).
#[derive(Debug)]
struct Reqwest(reqwest::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Reqwest {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let resp = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await?;
        let mut out = http::Response::builder().status(resp.status());
        if let Some(headers) = out.headers_mut() {
            *headers = resp.headers().clone();
        }
        Ok(out.body(resp.bytes().await?)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callers_traceparent_becomes_the_parent_and_the_next_hops_header() {
        let caller =
            TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let remote = remote_context(&caller, Some("vendor=x")).unwrap();
        assert_eq!(
            remote.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(remote.span_id().to_string(), "00f067aa0ba902b7");
        assert!(remote.is_sampled() && remote.is_remote());
        let (header, state) = header_of(&remote);
        assert_eq!(
            header,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(state.as_deref(), Some("vendor=x"));
    }

    #[test]
    fn the_endpoint_takes_the_signal_path_for_http_only() {
        let cfg = |endpoint: &str, protocol| TelemetryConfig {
            otlp_endpoint: Some(endpoint.into()),
            otlp_protocol: Some(protocol),
            ..TelemetryConfig::default()
        };
        let http = endpoint_of(&cfg("http://c:4318/", OtlpProtocol::HttpProtobuf));
        assert_eq!(http.unwrap().0.as_deref(), Some("http://c:4318/v1/traces"));
        let given = endpoint_of(&cfg("http://c:4318/v1/traces", OtlpProtocol::HttpProtobuf));
        assert_eq!(given.unwrap().0.as_deref(), Some("http://c:4318/v1/traces"));
        let grpc = endpoint_of(&cfg("http://c:4317", OtlpProtocol::Grpc));
        assert_eq!(grpc.unwrap().0.as_deref(), Some("http://c:4317"));
    }
}

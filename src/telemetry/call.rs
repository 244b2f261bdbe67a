//! What a request turned out to be, noted by whichever layer learns it (the handler its
//! agent and method, the renderer its error, the dispatcher its task) and read once by
//! the access log and the metrics when the answer goes out. A task-local, so no layer
//! passes it along; outside a request, noting does nothing.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use super::{Child, Parent, ServerSpan, TraceParent};
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;

#[derive(Default, Debug)]
pub(crate) struct Call {
    pub(crate) agent: Option<Arc<str>>,
    /// The canonical (1.0) method name.
    pub(crate) method: Option<&'static str>,
    pub(crate) dialect: Option<&'static str>,
    /// `jsonrpc` or `rest`.
    pub(crate) binding: Option<&'static str>,
    /// The error's code and reason; none for a success.
    pub(crate) error: Option<(i64, &'static str)>,
    pub(crate) principal: Option<Arc<str>>,
    pub(crate) task_id: Option<String>,
    pub(crate) context_id: Option<String>,
    /// The extensions the caller asked for, carried on to an upstream agent.
    pub(crate) extensions_asked: Option<Arc<str>>,
    /// The extensions the upstream agent says it activated, for the answer's header.
    pub(crate) extensions_activated: Option<String>,
    /// The request's body and the answer's, in bytes, where usage is counted (a stream's
    /// answer is counted as it is sent).
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
}

pub(crate) struct Scope {
    call: RefCell<Call>,
    trace: Option<(TraceParent, Option<String>)>,
    /// The request's span, when spans are exported.
    span: Option<Arc<ServerSpan>>,
    /// The upstream call in flight (its client span), ended when it answers.
    upstream: RefCell<Option<Child>>,
}

tokio::task_local! {
    // Behind an `Rc`: a task-local is swapped in and out of its slot on every poll, and
    // the note is a few hundred bytes; the request's own handle reads the note at the end.
    static CURRENT: Rc<Scope>;
    // The span of the request whose work a detached task does (see [`carried`]).
    static CARRIED: Parent;
}

/// A request's handling (`F`), run with a note of its own and the caller's trace context.
pub(crate) type Observed<F> = tokio::task::futures::TaskLocalFuture<Rc<Scope>, F>;

/// Runs `f` (a request's handling) with an empty note and the caller's trace context
/// (`traceparent` and `tracestate`); the note is read from the scope returned once `f`
/// is done ([`Scope::take`]).
pub(crate) fn observed<F: Future>(
    trace: Option<(TraceParent, Option<String>)>,
    span: Option<Arc<ServerSpan>>,
    f: F,
) -> (Observed<F>, Rc<Scope>) {
    let scope = Rc::new(Scope {
        call: RefCell::default(),
        trace,
        span,
        upstream: RefCell::default(),
    });
    (CURRENT.scope(scope.clone(), f), scope)
}

impl Scope {
    /// What was noted.
    pub(crate) fn take(&self) -> Call {
        self.call.take()
    }

    /// The request's span, when spans are exported.
    pub(crate) fn span(&self) -> Option<&Arc<ServerSpan>> {
        self.span.as_ref()
    }
}

/// The span the current request's (or detached task's) work is a child of.
pub(crate) fn parent() -> Option<Parent> {
    CURRENT
        .try_with(|s| s.span.as_ref().map(|span| span.parent()))
        .ok()
        .flatten()
        .or_else(|| CARRIED.try_with(Parent::clone).ok())
}

/// Runs `f`, work the current request hands to another task, as that request's: its spans
/// are children of the request's. Without exported spans, `f` as it is.
pub(crate) fn carried<F>(f: F) -> std::pin::Pin<Box<dyn Future<Output = F::Output> + Send>>
where
    F: Future + Send + 'static,
{
    match parent() {
        Some(parent) => Box::pin(CARRIED.scope(parent, f)),
        None => Box::pin(f),
    }
}

/// A span for work the current request causes, when spans are exported.
pub(crate) fn child_span(
    name: impl Into<String>,
    kind: SpanKind,
    attributes: Vec<KeyValue>,
) -> Option<Child> {
    parent().map(|p| p.child(name.into(), kind, attributes))
}

/// The request's span, for a stream that outlives the handler (it ends with the stream).
pub(crate) fn request_span() -> Option<Arc<ServerSpan>> {
    CURRENT.try_with(|s| s.span.clone()).ok().flatten()
}

/// Adds to the current request's note.
pub(crate) fn note(f: impl FnOnce(&mut Call)) {
    let _ = CURRENT.try_with(|s| f(&mut s.call.borrow_mut()));
}

/// Notes the A2A method, and puts it on the request's span.
pub(crate) fn note_method(method: &'static str, dialect: &'static str, binding: &'static str) {
    // The span exists only when the access log is on.
    if tracing::enabled!(target: super::ACCESS, tracing::Level::INFO) {
        tracing::Span::current().record("a2a.method", method);
    }
    note(|c| {
        c.method = Some(method);
        c.dialect = Some(dialect);
        c.binding = Some(binding);
    });
}

/// Notes the task a call is about, and puts it on the request's span.
pub(crate) fn note_task(task_id: &str, context_id: Option<&str>) {
    // Only the log and exported spans read task ids: without them, nothing to copy.
    let exported = CURRENT
        .try_with(|s| {
            let Some(span) = &s.span else { return false };
            let call = s.call.borrow();
            if matches!(call.method, Some("SendMessage" | "SendStreamingMessage")) {
                span.originated(task_id);
            }
            true
        })
        .unwrap_or(false);
    if !exported && !tracing::enabled!(target: super::ACCESS, tracing::Level::INFO) {
        return;
    }
    let span = tracing::Span::current();
    span.record("task_id", task_id);
    if let Some(c) = context_id {
        span.record("context_id", c);
    }
    note(|c| {
        c.task_id = Some(task_id.to_string());
        c.context_id = context_id.map(str::to_string);
    });
}

/// Reads the current request's note.
pub(crate) fn noted<R>(f: impl FnOnce(&Call) -> R) -> Option<R> {
    CURRENT.try_with(|s| f(&s.call.borrow())).ok()
}

/// Notes the state a call left its task in, for the request's span.
pub(crate) fn note_task_state(state: &str) {
    let _ = CURRENT.try_with(|s| {
        if let Some(span) = &s.span {
            span.record(
                vec![KeyValue::new("a2a.task.state", state.to_string())],
                None,
            );
        }
    });
}

/// The `traceparent` (and `tracestate`) to send to an upstream at `peer` for the current
/// request. With exported spans: a client span's, which ends when [`upstream_answered`]
/// says so; else a child of the caller's, or none when the caller sent none.
pub(crate) fn upstream_call(peer: &http::Uri) -> Option<(String, Option<String>)> {
    CURRENT
        .try_with(|s| match &s.span {
            Some(span) => {
                let agent = s.call.borrow().agent.as_deref().unwrap_or("").to_string();
                let mut attributes = vec![
                    KeyValue::new("server.address", peer.host().unwrap_or("").to_string()),
                    KeyValue::new("url.full", peer.to_string()),
                    KeyValue::new("a2a.agent", agent.clone()),
                ];
                if let Some(port) = peer.port_u16() {
                    attributes.push(KeyValue::new("server.port", i64::from(port)));
                }
                if let Some(method) = s.call.borrow().method {
                    attributes.push(KeyValue::new("a2a.method", method));
                }
                let child =
                    span.parent()
                        .child(format!("upstream {agent}"), SpanKind::Client, attributes);
                let header = child.header();
                *s.upstream.borrow_mut() = Some(child);
                Some(header)
            }
            None => s
                .trace
                .as_ref()
                .map(|(parent, state)| (parent.child(), state.clone())),
        })
        .ok()
        .flatten()
}

/// Ends the current upstream call's span: it got an answer, or none.
pub(crate) fn upstream_answered(answered: bool) {
    let _ = CURRENT.try_with(|s| {
        if let Some(mut span) = s.upstream.borrow_mut().take() {
            if !answered {
                span.set(KeyValue::new("error.type", "unavailable"));
                span.fail("the upstream did not answer".into());
            }
        }
    });
}

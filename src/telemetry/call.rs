//! What a request turned out to be, noted by whichever layer learns it (the handler its
//! agent and method, the renderer its error, the dispatcher its task) and read once by
//! the access log and the metrics when the answer goes out. A task-local, so no layer
//! passes it along; outside a request, noting does nothing.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use super::TraceParent;

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
}

pub(crate) struct Scope {
    call: RefCell<Call>,
    trace: Option<(TraceParent, Option<String>)>,
}

tokio::task_local! {
    // Behind an `Rc`: a task-local is swapped in and out of its slot on every poll, and
    // the note is a few hundred bytes; the request's own handle reads the note at the end.
    static CURRENT: Rc<Scope>;
}

/// A request's handling (`F`), run with a note of its own and the caller's trace context.
pub(crate) type Observed<F> = tokio::task::futures::TaskLocalFuture<Rc<Scope>, F>;

/// Runs `f` (a request's handling) with an empty note and the caller's trace context
/// (`traceparent` and `tracestate`); the note is read from the scope returned once `f`
/// is done ([`Scope::take`]).
pub(crate) fn observed<F: Future>(
    trace: Option<(TraceParent, Option<String>)>,
    f: F,
) -> (Observed<F>, Rc<Scope>) {
    let scope = Rc::new(Scope {
        call: RefCell::default(),
        trace,
    });
    (CURRENT.scope(scope.clone(), f), scope)
}

impl Scope {
    /// What was noted.
    pub(crate) fn take(&self) -> Call {
        self.call.take()
    }
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
    // Only the log reads task ids: without it, nothing to copy.
    if !tracing::enabled!(target: super::ACCESS, tracing::Level::INFO) {
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

/// The `traceparent` (and `tracestate`) to send upstream for the current request: a child
/// of the caller's, or none when the caller sent none.
pub(crate) fn outgoing_trace() -> Option<(String, Option<String>)> {
    CURRENT
        .try_with(|s| {
            s.trace
                .as_ref()
                .map(|(parent, state)| (parent.child(), state.clone()))
        })
        .ok()
        .flatten()
}

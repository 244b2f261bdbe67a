//! What operators see: Prometheus metrics, the access log, and the trace context passed on
//! to upstream agents. A leaf: it knows nothing of the layers that report to it.

/// The access log's target: `A2A_GATEWAY_LOG=info,a2a_gateway::access=off` silences it.
pub(crate) const ACCESS: &str = "a2a_gateway::access";

mod call;
mod metrics;
mod otel;
mod trace;

pub(crate) use call::{
    carried, child_span, note, note_method, note_task, note_task_state, noted, observed,
    request_span, upstream_answered, upstream_call, Call, Observed, Scope,
};
pub(crate) use metrics::{
    flush_everywhere, flush_periodically, AgentGauges, EdgeGauges, Metrics, StoreGauges,
    UpstreamCalls, UpstreamOutcome,
};
pub(crate) use otel::{Child, Parent, ServerSpan, Tracing};
pub(crate) use trace::TraceParent;

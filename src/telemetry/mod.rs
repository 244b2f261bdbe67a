//! What operators see: Prometheus metrics, the access log, and the trace context passed on
//! to upstream agents. A leaf: it knows nothing of the layers that report to it.

/// The access log's target: `A2A_GATEWAY_LOG=info,a2a_gateway::access=off` silences it.
pub(crate) const ACCESS: &str = "a2a_gateway::access";

mod call;
mod metrics;
mod trace;

pub(crate) use call::{
    note, note_method, note_task, noted, observed, outgoing_trace, Call, Observed, Scope,
};
pub(crate) use metrics::{
    flush_periodically, AgentGauges, EdgeGauges, Metrics, StoreGauges, UpstreamCalls,
    UpstreamOutcome,
};
pub(crate) use trace::TraceParent;

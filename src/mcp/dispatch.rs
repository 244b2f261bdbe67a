//! Running a tool call's A2A calls on the worker that took its HTTP request. rmcp runs a
//! session's handlers as `Send` tasks; the gateway's calls hold the worker's own handles
//! (the configuration it last saw, the request's note), as HTTP and gRPC calls do. So a
//! handler sends each call here, a queue the worker drains, and gets back the answer: a
//! JSON-RPC result, or a stream of events (which is `Send`).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

use actix_web::web;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

use super::McpHead;
use crate::error::GatewayError;
use crate::http::admission::{self, Target};
use crate::http::{Addressed, AppState, Caller};
use crate::protocol::jsonrpc::{Method, RpcId, RpcRequest};
use crate::protocol::model::StreamItem;
use crate::protocol::Dialect;
use crate::rpc::RpcReply;
use crate::telemetry;

/// A stream of an agent's events, ending with the task's.
pub(crate) type Events = futures_util::stream::BoxStream<'static, Result<StreamItem, GatewayError>>;

/// What a call answered.
pub(crate) enum Answer {
    /// A JSON-RPC response body (`result` or `error`).
    Json(Vec<u8>),
    Stream(Events),
}

/// One A2A call for the worker to make: 1.0 `method` with `params`, on agent `agent`.
struct Job {
    head: Arc<McpHead>,
    agent: String,
    method: Method,
    params: Box<RawValue>,
    answer: oneshot::Sender<Result<Answer, GatewayError>>,
}

/// The queue of one worker's calls.
#[derive(Clone)]
pub(crate) struct Dispatch(mpsc::UnboundedSender<Job>);

thread_local! {
    /// This worker's queue, made with its first MCP request.
    static QUEUE: RefCell<Option<Dispatch>> = const { RefCell::new(None) };
}

impl Dispatch {
    /// The queue of the worker this runs on (an actix worker, inside its local set).
    pub(crate) fn on_this_worker(state: web::Data<AppState>) -> Dispatch {
        QUEUE.with_borrow_mut(|queue| {
            if let Some(q) = queue.as_ref().filter(|q| !q.0.is_closed()) {
                return q.clone();
            }
            let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
            actix_web::rt::spawn(async move {
                while let Some(job) = rx.recv().await {
                    actix_web::rt::spawn(run(state.clone(), job));
                }
            });
            let q = Dispatch(tx);
            *queue = Some(q.clone());
            q
        })
    }

    /// Makes the call on the worker, as the caller whose head `head` is.
    pub(crate) async fn call(
        &self,
        head: &Arc<McpHead>,
        agent: &str,
        method: Method,
        params: Box<RawValue>,
    ) -> Result<Answer, GatewayError> {
        let (answer, answered) = oneshot::channel();
        let job = Job {
            head: head.clone(),
            agent: agent.to_owned(),
            method,
            params,
            answer,
        };
        self.0
            .send(job)
            .map_err(|_| GatewayError::ShuttingDown { replicas: false })?;
        answered
            .await
            .map_err(|_| GatewayError::ShuttingDown { replicas: false })?
    }
}

/// One call, as the other bindings make it: the caller, admission, dispatch; counted and
/// logged as an MCP call.
async fn run(state: web::Data<AppState>, job: Job) {
    let Job {
        head,
        agent,
        method,
        params,
        answer,
    } = job;
    let start = Instant::now();
    let span = state.tracing.as_ref().map(|t| {
        let attributes = vec![opentelemetry::KeyValue::new("a2a.binding", "mcp")];
        t.server_span(None, format!("MCP {}", method.name()), attributes)
    });
    let work = call(&state, &head, &agent, method, &params);
    let (work, scope) = telemetry::observed(None, span, work);
    let result = work.await;
    let mut call = scope.take();
    if let (Err(e), None) = (&result, call.error) {
        call.error = Some((e.code(), e.reason()));
    }
    let status = match &result {
        Ok(_) => 200,
        Err(e) => e.jsonrpc_http_status(),
    };
    if let Some(span) = scope.span() {
        span.finish(&call, status, false, None);
    }
    let logged = tracing::enabled!(target: telemetry::ACCESS, tracing::Level::INFO);
    let path = format!("mcp tools/call {agent}");
    let logged = logged.then(|| crate::http::Logged {
        method: "POST",
        path: &path,
        status,
        trace_id: None,
    });
    crate::http::account(&state, &call, start.elapsed().as_secs_f64(), logged);
    let _ = answer.send(result);
}

async fn call(
    state: &web::Data<AppState>,
    head: &McpHead,
    agent: &str,
    method: Method,
    params: &RawValue,
) -> Result<Answer, GatewayError> {
    telemetry::note_method(method.name(), Dialect::V10.version(), "mcp");
    let caller = Caller::of(head, state);
    let live = caller.live;
    let addressed = Addressed::of(&live.registry, Some(agent));
    let principal = admission::at_the_door(&live, caller.principal, &addressed)?;
    let rpc = RpcRequest {
        id: RpcId::NULL,
        method,
        dialect: Dialect::V10,
        params: Some(params),
        send: None,
        resume: None,
        protobuf_answer: false,
    };
    let streams = method.is_streaming();
    let admitted = admission::admit(
        state,
        head,
        &live,
        &principal,
        addressed,
        Target::Rpc(&rpc),
        streams,
    )
    .await
    .map_err(|refused| refused.error)?;
    let (_, _, outcome) = crate::rpc::run(
        &state.service,
        &admitted.agent,
        &principal,
        rpc,
        &admitted.served,
    )
    .await;
    match (outcome?, admitted.slot) {
        (RpcReply::Json { body, .. }, _) => Ok(Answer::Json(body)),
        (RpcReply::Stream { items, .. }, Some(slot)) => {
            // The slot is held as long as the stream is: a client that goes away drops both.
            Ok(Answer::Stream(Box::pin(crate::http::watched(
                state, items, slot,
            ))))
        }
        (RpcReply::Protobuf(_), _) => {
            Err(GatewayError::Internal("a protobuf answer on MCP".into()))
        }
        (RpcReply::Stream { .. }, None) => {
            Err(GatewayError::Internal("a stream without a slot".into()))
        }
    }
}

//! Which agent serves a request on the shared `/a2a` endpoint.
//!
//! Today: follow-ups (`GetTask`, `CancelTask`, `SubscribeToTask`, or a message carrying a
//! `taskId`) go to the agent that owns the task; everything else to the default agent.

use std::sync::Arc;

use serde::Deserialize;

use crate::agents::{Agent, Registry};
use crate::protocol::jsonrpc::{Method, RpcRequest};
use crate::tasks::Tasks;

#[derive(Deserialize)]
struct Probe {
    id: Option<String>,
    message: Option<MessageProbe>,
}

#[derive(Deserialize)]
struct MessageProbe {
    #[serde(rename = "taskId", alias = "task_id")]
    task_id: Option<String>,
}

/// The task a request is about, if it is a follow-up.
fn task_of(rpc: &RpcRequest) -> Option<String> {
    let params = rpc.params.as_deref()?;
    let probe: Probe = serde_json::from_str(params.get()).ok()?;
    match rpc.method {
        Method::GetTask | Method::CancelTask | Method::SubscribeToTask => probe.id,
        Method::SendMessage | Method::SendStreamingMessage => probe.message?.task_id,
        Method::ListTasks | Method::PushNotificationConfig | Method::GetExtendedAgentCard => None,
    }
    .filter(|id| !id.is_empty())
}

/// The agent that owns `task_id`: upstream ids name their agent (`<agent>.<id>`), the
/// gateway's own tasks are looked up in the store.
pub fn owner<'a>(registry: &'a Registry, tasks: &Tasks, task_id: &str) -> Option<&'a Arc<Agent>> {
    if let Some((prefix, _)) = task_id.split_once('.') {
        if let Some(agent) = registry.get(prefix).filter(|a| a.remote().is_some()) {
            return Some(agent);
        }
    }
    let owner = tasks.owner(task_id)?;
    registry.get(&owner)
}

/// The agent for a request on `/a2a`.
pub fn route<'a>(
    registry: &'a Registry,
    tasks: &Tasks,
    rpc: &RpcRequest,
) -> Option<&'a Arc<Agent>> {
    task_of(rpc)
        .and_then(|id| owner(registry, tasks, &id))
        .or_else(|| registry.default_agent())
}

//! A2A 0.1 calls. A 0.1 client names its tasks itself, so each call translates that name
//! to the gateway's task (per agent and caller) and answers under the client's name, in
//! the 0.1 shapes (`protocol::v01`). A send whose name is new starts a task and records
//! the name; one whose name is known continues that task.

use std::sync::Arc;

use futures_util::stream::{self, StreamExt};
use serde_json::value::RawValue;

use super::{json, send_request, RpcReply};
use crate::agents::Agent;
use crate::auth::Principal;
use crate::error::GatewayError;
use crate::protocol::jsonrpc::{render_result, Method, RpcId};
use crate::protocol::model::{StreamEnd, StreamItem, Task};
use crate::protocol::ops::ItemStream;
use crate::protocol::ops::{OnNewTask, SendResult};
use crate::protocol::params::TaskIdParams;
use crate::protocol::v01::{self as shapes, MessageAsTaskV01, SendV01, TaskV01};
use crate::protocol::Dialect;
use crate::routing::Served;
use crate::service::A2aService;

/// Methods named in 0.1 (`tasks/send`, `tasks/sendSubscribe`, `tasks/pushNotification/*`).
pub(super) async fn dispatch(
    service: &A2aService,
    agent: &Arc<Agent>,
    caller: &Principal,
    id: &RpcId,
    method: Method,
    params: Option<&RawValue>,
    served: &Served,
) -> Result<RpcReply, GatewayError> {
    match method {
        Method::SendMessage | Method::SendStreamingMessage => {
            let SendV01 {
                task_id: name,
                params: mut p,
            } = shapes::read_send(params)?;
            let names = service.legacy_names();
            names.fetch(agent, caller, &name).await?;
            let known = names.get(agent, caller, &name);
            p.message.task_id.clone_from(&known);
            let mut send = send_request(p, Dialect::V01)?;
            // Its notifications name the task as the client does.
            if let Some(config) = send.push.as_mut() {
                config.name = Some(name.clone());
            }
            let history_length = send.history_length;
            if method == Method::SendStreamingMessage {
                let items = service.stream(agent, caller, send).await?;
                let (names, owner, caller) = (names.clone(), agent.clone(), caller.clone());
                let items = items.map(move |item| {
                    item.map(|item| {
                        if let (StreamItem::Task(t), None) = (&item, &known) {
                            names.name(&owner, &caller, &name, &t.id);
                        }
                        renamed(item, &name)
                    })
                });
                return Ok(stream_reply(id, agent, served, ItemStream::new(items)));
            }
            if known.is_none() {
                // Named once the task is stored, so that the client can read or cancel it by
                // its name while this send waits for it to end.
                let (names, owner, caller, name) =
                    (names.clone(), agent.clone(), caller.clone(), name.clone());
                send.on_new_task = Some(OnNewTask(Arc::new(move |id: &str| {
                    names.name(&owner, &caller, &name, id)
                })));
            }
            let result = service.send(agent, caller, send).await?;
            // An upstream's task (and one answered at once) is known by the answer.
            if let (SendResult::Task(t), None) = (&result, &known) {
                if names.get(agent, caller, &name).as_deref() != Some(t.id.as_str()) {
                    names.name(agent, caller, &name, &t.id);
                }
            }
            let mut result = served.stamped(result);
            match &mut result {
                SendResult::Task(t) => t.id.clone_from(&name),
                SendResult::Message(m) => m.task_id = Some(name),
                SendResult::Relayed(_) => {}
            }
            ok(id, &result, history_length)
        }
        Method::Push(op) => {
            service.push().check_enabled()?;
            let mut call = crate::protocol::push::read_call(op, Dialect::V01, params)?;
            let name = std::mem::take(&mut call.task_id);
            let names = service.legacy_names();
            names.fetch(agent, caller, &name).await?;
            call.task_id = names
                .get(agent, caller, &name)
                .ok_or_else(|| GatewayError::TaskNotFound(name.clone()))?;
            let answer = Box::pin(service.push_call(agent, caller, op, call, Some(&name))).await?;
            Ok(json(render_result(
                id,
                super::push_answer(answer, Dialect::V01, &name),
            )?))
        }
        // 0.1 reads its tasks with the names 0.3 kept (see `task_call`).
        Method::GetTask
        | Method::CancelTask
        | Method::SubscribeToTask
        | Method::ListTasks
        | Method::GetExtendedAgentCard => Err(GatewayError::MethodNotFound(
            "this method has no 0.1 form".into(),
        )),
    }
}

/// `tasks/get`, `tasks/cancel` or `tasks/resubscribe` of `task_id`, the task a 0.1 client
/// named `p.id`.
#[allow(clippy::too_many_arguments)] // the dispatch context, passed on as is
pub(super) async fn task_call(
    service: &A2aService,
    agent: &Arc<Agent>,
    caller: &Principal,
    id: &RpcId,
    method: Method,
    p: TaskIdParams,
    task_id: &str,
    served: &Served,
) -> Result<RpcReply, GatewayError> {
    let name = p.id.clone();
    match method {
        Method::GetTask => get(service, agent, caller, id, p, task_id, served).await,
        Method::CancelTask => cancel(service, agent, caller, id, &name, task_id, served).await,
        _ => subscribe(service, agent, caller, id, &name, task_id, served).await,
    }
}

/// `tasks/get` of a task a 0.1 client named: with no history unless asked for.
async fn get(
    service: &A2aService,
    agent: &Agent,
    caller: &Principal,
    id: &RpcId,
    p: TaskIdParams,
    task_id: &str,
    served: &Served,
) -> Result<RpcReply, GatewayError> {
    let history = crate::protocol::params::history_length(p.history_length, Dialect::V01)?;
    let mut task = served.stamped(service.get(agent, caller, task_id, history).await?);
    task.id = p.id;
    Ok(json(render_task(id, &task, history)?))
}

async fn cancel(
    service: &A2aService,
    agent: &Agent,
    caller: &Principal,
    id: &RpcId,
    name: &str,
    task_id: &str,
    served: &Served,
) -> Result<RpcReply, GatewayError> {
    let mut task = served.stamped(service.cancel(agent, caller, task_id).await?);
    task.id = name.to_string();
    Ok(json(render_task(id, &task, Some(0))?))
}

/// `tasks/resubscribe`: 0.1 streams end at their final event, input-required included.
async fn subscribe(
    service: &A2aService,
    agent: &Arc<Agent>,
    caller: &Principal,
    id: &RpcId,
    name: &str,
    task_id: &str,
    served: &Served,
) -> Result<RpcReply, GatewayError> {
    let items = service.subscribe(agent, caller, task_id).await?;
    let name = name.to_string();
    let items = stream::unfold(Some(items), |items| async move {
        let mut items = items?;
        let item = items.next().await?;
        let more = matches!(&item, Ok(i) if !i.ends_stream());
        Some((item, more.then_some(items)))
    })
    .map(move |item| item.map(|item| renamed(item, &name)));
    Ok(stream_reply(id, agent, served, ItemStream::new(items)))
}

fn stream_reply(id: &RpcId, agent: &Agent, served: &Served, items: ItemStream) -> RpcReply {
    // 0.1 streams, subscriptions included, end at their final event.
    super::stream(
        id,
        Dialect::V01,
        StreamEnd::Interrupted,
        agent,
        served,
        items,
    )
}

/// The item under the name the client gave its task.
fn renamed(mut item: StreamItem, name: &str) -> StreamItem {
    match &mut item {
        StreamItem::Task(t) => t.id = name.to_string(),
        StreamItem::StatusUpdate(s) => s.task_id = name.to_string(),
        StreamItem::ArtifactUpdate(a) => a.task_id = name.to_string(),
        StreamItem::Message(m) => m.task_id = Some(name.to_string()),
    }
    item
}

pub(super) fn ok(
    id: &RpcId,
    result: &SendResult,
    history_length: Option<usize>,
) -> Result<RpcReply, GatewayError> {
    Ok(json(match result {
        SendResult::Task(t) => render_task(id, t, history_length)?,
        SendResult::Message(m) => {
            let name = m.task_id.as_deref().unwrap_or_default();
            render_result(
                id,
                MessageAsTaskV01 {
                    message: m,
                    id: name,
                },
            )?
        }
        // Relaying needs the upstream to speak the caller's dialect, and none speaks 0.1.
        SendResult::Relayed(_) => {
            return Err(GatewayError::Internal(
                "a relayed answer for a 0.1 caller".into(),
            ))
        }
    }))
}

pub(super) fn render_task(
    id: &RpcId,
    task: &Task,
    history_length: Option<usize>,
) -> Result<Vec<u8>, GatewayError> {
    render_result(
        id,
        TaskV01 {
            task,
            history_length,
        },
    )
}

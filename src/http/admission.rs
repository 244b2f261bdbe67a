//! Admission: the steps every binding takes between a call's arrival and its dispatch, in
//! one place. A binding (JSON-RPC, HTTP+JSON, gRPC) reads its request its own way and
//! renders its own answers; what decides whether a call goes through, and to which agent,
//! is here, so that a rule added to admission reaches every binding at once.
//!
//! 1. [`at_the_door`], from the request's head alone, before any body is read: the
//!    caller's credentials, and whether it may call what the path (or the gRPC metadata)
//!    names at all.
//! 2. [`admit`], once the request is read: the agent (named, or routed on the shared
//!    endpoints), authorization, the store's health, the rate limits, and for a stream a
//!    slot counted against the gateway's and the caller's caps.

use std::net::IpAddr;
use std::sync::Arc;

use actix_web::{HttpMessage, HttpRequest};
use serde_json::value::RawValue;

use super::{Addressed, AppState, Live};
use crate::agents::Agent;
use crate::auth::{Presented, Principal};
use crate::error::GatewayError;
use crate::limits::{RateInfo, StreamSlot};
use crate::policy::Facts;
use crate::protocol::jsonrpc::{Method, RpcRequest};
use crate::protocol::params::{self, TaskIdParams};
use crate::protocol::Dialect;
use crate::routing::{self, Reason, Served};
use crate::usage::budgets::Standing;

/// What admission reads of a call's transport, whatever the binding: the credentials it
/// presents, where it comes from (for the limits kept per address), and where the rate
/// numbers go to be sent back (HTTP headers, gRPC metadata).
pub(crate) trait Head {
    fn presented(&self) -> Presented<'_>;
    /// The peer's address and the `X-Forwarded-For` it sent (trusted only from the
    /// proxies configured).
    fn origin(&self) -> (Option<IpAddr>, Option<&str>);
    /// The peer's address alone (no header read).
    fn peer(&self) -> Option<IpAddr>;
    /// Keeps the caller's rate numbers for the answer, refusal or not.
    fn keep_rate(&self, info: RateInfo);
    /// Keeps where the call stands in the budget it came nearest to spending, for the
    /// answer, refusal or not (an MCP answer has nowhere to put it).
    fn keep_budget(&self, _standing: Standing) {}
    /// A header's (or gRPC metadata entry's) value, if it is text.
    fn header(&self, name: &str) -> Option<&str>;
    /// The extensions the call asks for: `A2A-Extensions` (1.0), else `X-A2A-Extensions`
    /// (0.3), comma-separated URIs.
    fn extensions(&self) -> Option<&str>;
}

impl Head for HttpRequest {
    fn presented(&self) -> Presented<'_> {
        let certificate = self.conn_data::<super::ClientCertificate>();
        Presented::in_headers(self.headers()).with_certificate(certificate.map(|c| &*c.0))
    }

    fn origin(&self) -> (Option<IpAddr>, Option<&str>) {
        let xff = self
            .headers()
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok());
        (self.peer_addr().map(|a| a.ip()), xff)
    }

    fn peer(&self) -> Option<IpAddr> {
        self.peer_addr().map(|a| a.ip())
    }

    fn keep_rate(&self, info: RateInfo) {
        // The edge service writes them as `X-RateLimit-*` headers.
        self.extensions_mut().insert(info);
    }

    fn keep_budget(&self, standing: Standing) {
        // The edge service writes them as `X-Budget-*` headers.
        self.extensions_mut().insert(standing);
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers().get(name).and_then(|v| v.to_str().ok())
    }

    fn extensions(&self) -> Option<&str> {
        crate::protocol::extensions_in(|name| self.headers().get(name).map(|v| v.as_bytes()))
    }
}

/// Refuses a call to an agent that requires an extension the call did not ask for, and
/// notes the ones asked for a call to an upstream agent carries on. Free for agents that
/// neither require extensions nor are upstreams.
fn check_extensions(head: &impl Head, agent: &Agent) -> Result<(), GatewayError> {
    if !agent.reads_extensions() {
        return Ok(());
    }
    let asked = head.extensions();
    if let Some(missing) = agent.missing_extension(asked) {
        return Err(GatewayError::ExtensionSupportRequired(missing));
    }
    if let (Some(asked), Some(_)) = (asked, agent.remote()) {
        crate::telemetry::note(|c| c.extensions_asked = Some(asked.trim().into()));
    }
    Ok(())
}

/// Refuses a call a policy denies. The method, dialect and binding are the request's
/// note's (each binding notes them as it reads the call); `skill` is asked only where a
/// rule reads it.
fn check_policies(
    head: &impl Head,
    live: &Live,
    caller: &Principal,
    agent: &Agent,
    skill: impl FnOnce() -> Option<String>,
    streams: bool,
) -> Result<(), GatewayError> {
    let policies = &live.policies;
    let noted = crate::telemetry::noted(|c| (c.method, c.dialect, c.binding));
    let (method, dialect, binding) = noted.unwrap_or_default();
    let skill = match policies.reads_skill(&agent.name) {
        true => skill(),
        false => None,
    };
    let headers: Vec<(&str, &str)> = (policies.headers().iter())
        .filter_map(|name| head.header(name).map(|value| (name.as_str(), value)))
        .collect();
    let facts = Facts {
        caller_id: &caller.id,
        caller_kind: caller.kind(),
        caller_tier: &caller.tier,
        claims: caller.claims.as_deref(),
        agent_name: &agent.name,
        agent_kind: agent.def.backend.kind(),
        method: method.unwrap_or_default(),
        dialect: dialect.unwrap_or_default(),
        binding: binding.unwrap_or_default(),
        skill: skill.as_deref().unwrap_or_default(),
        streaming: streams,
        headers: &headers,
    };
    policies.decide(&facts).map_err(|denial| {
        live.policy_denied(&denial.rule);
        GatewayError::PolicyDenied(denial.rule)
    })
}

/// What a call is about, which on the shared endpoints decides its agent.
#[derive(Clone, Copy)]
pub(crate) enum Target<'a> {
    /// A JSON-RPC call: its method and params say (see [`routing::Router::route`]).
    Rpc(&'a RpcRequest<'a>),
    /// A send, with its `SendMessageRequest`; `policies_checked` when the policies were
    /// checked before its body was read (see [`policies_before_body`]).
    Send {
        params: &'a RawValue,
        policies_checked: bool,
    },
    /// A call on a task.
    Task(&'a str),
    TaskList,
}

impl Target<'_> {
    fn sends(&self) -> bool {
        match self {
            Target::Rpc(rpc) => matches!(
                rpc.method,
                Method::SendMessage | Method::SendStreamingMessage
            ),
            Target::Send { .. } => true,
            Target::Task(_) | Target::TaskList => false,
        }
    }

    /// The skill a send names: its metadata's `gateway/skill` (`agent/skill`) or
    /// `a2a-gateway/skill` (an MCP tool's), else the agent's only skill, if it has one.
    fn skill(&self, agent: &Agent) -> Option<String> {
        let named = match self {
            // A send the envelope's reader decoded already (on an agent's own endpoint).
            Target::Rpc(RpcRequest {
                send: Some(send), ..
            }) => routing::skill_in(send.message.metadata.as_ref(), send.metadata.as_ref()),
            Target::Rpc(rpc) if self.sends() => rpc.params.and_then(routing::skill_named),
            Target::Send { params, .. } => routing::skill_named(params),
            _ => None,
        };
        let only = || match agent.def.skills.as_slice() {
            [skill] => Some(skill.id.clone()),
            _ => None,
        };
        named.or_else(only)
    }

    /// The task id a call on a task names, for the answer to a caller who may not see it.
    fn task_id(&self) -> Option<String> {
        match self {
            Target::Rpc(rpc) => match rpc.method {
                Method::GetTask
                | Method::CancelTask
                | Method::SubscribeToTask
                | Method::Push(_) => Some(
                    params::decode::<TaskIdParams>(rpc.params)
                        .map(|p| p.id)
                        .unwrap_or_default(),
                ),
                _ => None,
            },
            Target::Task(id) => Some(id.to_string()),
            Target::Send { .. } | Target::TaskList => None,
        }
    }
}

/// A call let through: who calls, the agent that answers, the note every answer carries,
/// and the stream slot a streaming call holds until its stream ends.
pub(crate) struct Admitted {
    pub(crate) agent: Arc<Agent>,
    pub(crate) served: Served,
    pub(crate) slot: Option<StreamSlot>,
}

/// A call refused; past authorization the answer names the agent (`served`), before it
/// not, so that a caller learns nothing about agents it may not call.
pub(crate) struct Refused {
    pub(crate) error: GatewayError,
    pub(crate) served: Option<Served>,
}

impl From<GatewayError> for Refused {
    fn from(error: GatewayError) -> Refused {
        Refused {
            error,
            served: None,
        }
    }
}

/// The version check of the bindings only 1.0 has (HTTP+JSON, gRPC): no version or 1.0
/// passes; 0.3 and 0.1 are refused, `supported` saying what to use instead.
pub(crate) fn v10_only(version: Option<&str>, supported: &'static str) -> Result<(), GatewayError> {
    match Dialect::from_version_header(version)? {
        None | Some(Dialect::V10) => Ok(()),
        Some(d @ (Dialect::V03 | Dialect::V01)) => Err(GatewayError::VersionNotSupported {
            requested: d.version().into(),
            supported,
        }),
    }
}

/// Step one, from the head alone: the caller, if its credentials are accepted and it may
/// call what is addressed (on the shared endpoints: some agent).
pub(crate) fn at_the_door(
    live: &Live,
    caller: Result<Principal, GatewayError>,
    addressed: &Addressed,
) -> Result<Principal, GatewayError> {
    let caller = caller?;
    live.admit_early(addressed, &caller)?;
    Ok(caller)
}

/// Between steps one and two, for a send on an agent's own HTTP+JSON route, whose method
/// the route names: where no rule for the agent reads the skill (which is in the body), the
/// caller's authorization and the policies are checked before the body is read, so that a
/// refused send is not read at all. Whether they were (then [`admit`] does not again).
pub(crate) fn policies_before_body(
    head: &impl Head,
    live: &Live,
    caller: &Principal,
    addressed: &Addressed,
    streams: bool,
) -> Result<bool, Refused> {
    let Addressed::Agent(agent) = addressed else {
        return Ok(false);
    };
    if live.policies.is_empty() || live.policies.reads_skill(&agent.name) {
        return Ok(false);
    }
    crate::telemetry::note(|c| c.agent = Some(agent.name.clone()));
    live.authorize(caller, agent)?;
    check_policies(head, live, caller, agent, || None, streams).map_err(|error| Refused {
        error,
        served: Some(Served::new(agent, None)),
    })?;
    Ok(true)
}

/// Step two, once the call is read: its agent, and whether it may go there now. A
/// streaming call (`streams`) also takes its slot here, so that a refusal costs nothing
/// upstream.
pub(crate) async fn admit(
    state: &AppState,
    head: &impl Head,
    live: &Live,
    caller: &Principal,
    addressed: Addressed,
    target: Target<'_>,
    streams: bool,
) -> Result<Admitted, Refused> {
    let (agent, reason) = match addressed {
        Addressed::Agent(agent) => (agent, None),
        Addressed::Unknown(name) => return Err(live.missing_agent(caller, &name).into()),
        Addressed::Shared => {
            let (agent, reason) = route(state, live, caller, target).await?;
            (agent, Some(reason))
        }
    };
    crate::telemetry::note(|c| c.agent = Some(agent.name.clone()));
    if let Err(e) = live.authorize(caller, &agent) {
        // On the shared endpoints a task call reached this agent through its task: a
        // caller who may not call the agent hears what an unknown id gets.
        let e = match (reason, target.task_id()) {
            (Some(Reason::Task), Some(id)) => GatewayError::TaskNotFound(id),
            _ => e,
        };
        return Err(e.into());
    }
    let served = Served::new(&agent, reason);
    let checked = matches!(
        target,
        Target::Send {
            policies_checked: true,
            ..
        }
    );
    if !live.policies.is_empty() && !checked {
        let skill = || target.skill(&agent);
        if let Err(error) = check_policies(head, live, caller, &agent, skill, streams) {
            return Err(Refused {
                error,
                served: Some(served),
            });
        }
    }
    if let Err(error) = check_extensions(head, &agent) {
        return Err(Refused {
            error,
            served: Some(served),
        });
    }
    state
        .admit(head, live, caller, &agent, target.sends())
        .await?;
    let slot = match streams {
        true => match state.open_stream(head, live, caller).await {
            Ok(slot) => Some(slot),
            Err(error) => {
                return Err(Refused {
                    error,
                    served: Some(served),
                })
            }
        },
        false => None,
    };
    Ok(Admitted {
        agent,
        served,
        slot,
    })
}

/// The agent a call on the shared endpoints goes to, and why.
async fn route(
    state: &AppState,
    live: &Live,
    caller: &Principal,
    target: Target<'_>,
) -> Result<(Arc<Agent>, Reason), GatewayError> {
    // Other replicas' tasks and conversations, when they share a store (boxed then, so
    // that every call's future does not carry it).
    if state.store.shared.is_some() {
        let router = &state.router;
        match target {
            Target::Rpc(rpc) => Box::pin(router.hydrate(rpc.params, caller)).await?,
            Target::Send { params, .. } => Box::pin(router.hydrate(Some(params), caller)).await?,
            Target::Task(id) => Box::pin(router.hydrate_task(id)).await?,
            Target::TaskList => {}
        }
    }
    let registry = &live.registry;
    let routed = match target {
        Target::Rpc(rpc) => state.router.route(registry, &live.rules, rpc, caller),
        Target::Send { params, .. } => {
            state
                .router
                .route_send(registry, &live.rules, params, caller)
        }
        Target::Task(id) => state.router.route_task(registry, Some(id)),
        Target::TaskList => routing::default(registry),
    };
    let (agent, reason) = routed.map_err(|e| live.unroutable(caller, e))?;
    tracing::debug!(agent = %agent.name, %reason, "routed");
    Ok((agent.clone(), reason))
}

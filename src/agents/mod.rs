//! Agents: the backend seam, the per-agent actor in front of each backend, and the registry.
//!
//! A backend only turns one user message into task events through an [`EventSink`]; task
//! ids, storage, ordering, concurrency and fan-out are the gateway's business, so every
//! backend gets them identically.

mod actor;
pub(crate) mod command;
pub(crate) mod echo;
pub(crate) mod openai;
pub(crate) mod remote;
mod sink;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

pub(crate) use actor::{ActorLimits, Admission, AgentActor};
pub(crate) use remote::RemoteAgent;
pub(crate) use sink::SinkSetup;
pub(crate) use sink::{EventSink, SinkClosed, SinkProbe, Update};

use crate::config::{AgentDef, BackendSpec};
use crate::protocol::model::{Artifact, Message, Task, TaskState};

/// One unit of work for a backend.
pub(crate) struct Execution {
    /// The user's message, with `taskId` and `contextId` filled in.
    pub(crate) message: Message,
    /// The task being continued (e.g. after input-required), as it was when work began.
    pub(crate) task: Option<Task>,
    /// Whether the caller streams; backends may chunk output more finely then.
    pub(crate) streaming: bool,
    pub(crate) events: EventSink,
    /// Fires when the task is canceled; the backend should stop promptly.
    pub(crate) cancel: CancellationToken,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum BackendError {
    /// Shown to the caller in the failed task's status message.
    #[error("{0}")]
    Failed(String),
    /// The agent cannot take work now (its program would not start): the caller is told
    /// to retry, or, when the task exists already, the task fails with this reason.
    #[error("{0}")]
    Unavailable(String),
    /// The message holds what this agent cannot take (a part it cannot read): the
    /// caller's error (-32602) when no task exists yet, else the task fails with it.
    #[error("{0}")]
    Refused(String),
    #[error("the task was closed while the agent was still producing output")]
    SinkClosed(#[from] SinkClosed),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AgentHealth {
    Healthy,
    Unhealthy,
}

/// The whole outcome of a new task's first message, known without waiting on anything.
#[derive(Debug)]
pub(crate) enum Immediate {
    /// The task gets these artifacts (distinct ids), then this state and agent message.
    Task {
        artifacts: Vec<Artifact>,
        state: TaskState,
        message: Option<Message>,
    },
    /// A plain Message and no task.
    Message(Message),
}

pub(crate) trait AgentBackend: Send + Sync + 'static {
    fn execute(&self, exec: Execution) -> BoxFuture<'static, Result<(), BackendError>>;

    /// For a non-streaming send that starts a task: the outcome, if the backend knows it at
    /// once. The gateway then stores the finished task on the caller's thread and skips
    /// scheduling an execution (the costliest part of a local send). Must be the same
    /// outcome `execute` would report for the message; backends that wait on anything
    /// answer None.
    fn answer_now(&self, _message: &Message) -> Option<Immediate> {
        None
    }

    fn health(&self) -> AgentHealth {
        AgentHealth::Healthy
    }

    /// Processes running, and calls waiting for one, for backends that run processes.
    fn processes(&self) -> Option<(usize, usize)> {
        None
    }
}

/// Who runs an agent's tasks.
#[derive(Clone)]
pub(crate) enum Backend {
    /// The gateway does: it stores the tasks and the backend produces their events.
    Local(Arc<dyn AgentBackend>),
    /// An upstream A2A server does: the gateway forwards every operation.
    Remote(Arc<RemoteAgent>),
}

/// A configured agent: its definition, its backend and the actor in front of it.
pub(crate) struct Agent {
    pub(crate) name: Arc<str>,
    pub(crate) def: AgentDef,
    pub(crate) backend: Backend,
    pub(crate) actor: AgentActor,
    /// The parent of every local task's cancel token: canceling it stops all the agent's
    /// work (a removed agent after its grace period, or shutdown).
    work: tokio_util::sync::CancellationToken,
}

impl Agent {
    /// What runs for a task of this agent, as a task that lost it is told ("… and its
    /// program did not survive").
    pub(crate) fn work(&self) -> &'static str {
        match &self.def.backend {
            BackendSpec::Echo(_) => "its work",
            BackendSpec::Command(_) => "its program",
            BackendSpec::OpenAi(_) => "its call to the model",
            BackendSpec::A2a(_) => "its call to the upstream agent",
        }
    }

    /// `card_changes` is counted up whenever an upstream's card changes (cards built from
    /// it are then stale).
    pub(crate) fn new(
        def: AgentDef,
        limits: ActorLimits,
        card_changes: &CardChanges,
        metrics: &crate::telemetry::Metrics,
    ) -> Result<Agent, String> {
        let backend = match &def.backend {
            BackendSpec::Echo(cfg) => Backend::Local(Arc::new(echo::EchoBackend::new(cfg.clone()))),
            BackendSpec::Command(cfg) => {
                Backend::Local(Arc::new(command::CommandBackend::new(cfg.clone())))
            }
            BackendSpec::OpenAi(cfg) => Backend::Local(Arc::new(openai::OpenAiBackend::new(
                &def.name,
                cfg.clone(),
            )?)),
            BackendSpec::A2a(cfg) => Backend::Remote(Arc::new(RemoteAgent::new(
                &def.name,
                cfg.clone(),
                card_changes.clone(),
                metrics.upstream(&def.name),
            )?)),
        };
        Ok(Agent {
            name: Arc::from(def.name.as_str()),
            actor: AgentActor::new(def.name.clone(), limits),
            def,
            backend,
            work: tokio_util::sync::CancellationToken::new(),
        })
    }

    /// This agent under a revised definition that runs the same backend with the same
    /// limits (only its card changed): the same backend, actor and work, so conversations
    /// waiting for input and upstream state carry over. None when the backend or limits
    /// changed, which needs a new agent.
    pub(crate) fn revised(&self, def: AgentDef, limits: ActorLimits) -> Option<Agent> {
        (self.def.backend == def.backend && self.actor.limits() == limits).then(|| Agent {
            name: self.name.clone(),
            def,
            backend: self.backend.clone(),
            actor: self.actor.clone(),
            work: self.work.clone(),
        })
    }

    /// A cancel token for one piece of this agent's work.
    pub(crate) fn work_token(&self) -> tokio_util::sync::CancellationToken {
        self.work.child_token()
    }

    /// Stops every piece of work in progress (command processes get SIGTERM, then SIGKILL
    /// after their grace period).
    pub(crate) fn stop_work(&self) {
        self.work.cancel();
    }

    /// What the agent reports when metrics are scraped.
    pub(crate) fn gauges(&self) -> crate::telemetry::AgentGauges<'_> {
        crate::telemetry::AgentGauges {
            agent: &self.name,
            mailbox_depth: self.actor.queued(),
            mailbox_rejections: self.actor.refused(),
            processes: match &self.backend {
                Backend::Local(b) => b.processes(),
                Backend::Remote(_) => None,
            },
            upstream_healthy: self.remote().map(|r| r.health() == AgentHealth::Healthy),
        }
    }

    pub(crate) fn health(&self) -> AgentHealth {
        match &self.backend {
            Backend::Local(b) => b.health(),
            Backend::Remote(r) => r.health(),
        }
    }

    pub(crate) fn remote(&self) -> Option<&Arc<RemoteAgent>> {
        match &self.backend {
            Backend::Remote(r) => Some(r),
            Backend::Local(_) => None,
        }
    }

    /// Whether `asked` (a request's `A2A-Extensions`) names every extension this agent
    /// requires (its file's and its upstream card's); the first one missing if not.
    pub(crate) fn missing_extension(&self, asked: Option<&str>) -> Option<String> {
        let asked_for = |uri: &str| {
            asked
                .into_iter()
                .flat_map(|v| v.split(','))
                .any(|a| a.trim() == uri)
        };
        let local = self.def.extensions.iter().filter(|e| e.required);
        if let Some(e) = local.map(|e| e.uri.as_str()).find(|uri| !asked_for(uri)) {
            return Some(e.to_string());
        }
        let remote = self.remote()?.required_extensions();
        remote.iter().find(|uri| !asked_for(uri)).cloned()
    }

    /// Whether a request to it may have to name extensions: it requires some, or it is an
    /// upstream (which gets what the request names).
    pub(crate) fn reads_extensions(&self) -> bool {
        self.remote().is_some() || self.def.extensions.iter().any(|e| e.required)
    }
}

/// Counts changes of upstream cards, so what is built from them knows when to rebuild.
#[derive(Clone, Default)]
pub(crate) struct CardChanges(Arc<AtomicU64>);

impl CardChanges {
    pub(crate) fn bump(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn current(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// Each registry built gets its own number, so what is kept per registry (rendered cards)
/// is never served from another.
static REGISTRIES: AtomicU64 = AtomicU64::new(0);

/// All agents: looked up by name in constant time, listed in name order.
pub(crate) struct Registry {
    id: u64,
    by_name: HashMap<Arc<str>, Arc<Agent>, ahash::RandomState>,
    sorted: Vec<Arc<Agent>>,
    /// Agents a reload removed: they take no new work, but their tasks stay readable.
    retired: HashMap<Arc<str>, Arc<Agent>, ahash::RandomState>,
    default_agent: Option<String>,
    card_changes: CardChanges,
}

impl Registry {
    #[cfg(test)]
    pub(crate) fn new(
        agents: Vec<Agent>,
        default_agent: Option<String>,
        card_changes: CardChanges,
    ) -> Registry {
        let agents = agents.into_iter().map(Arc::new).collect();
        Registry::from_shared(agents, HashMap::default(), default_agent, card_changes)
    }

    /// A registry of agents that may also be in another (a reload keeps unchanged ones).
    pub(crate) fn from_shared(
        mut sorted: Vec<Arc<Agent>>,
        retired: HashMap<Arc<str>, Arc<Agent>, ahash::RandomState>,
        default_agent: Option<String>,
        card_changes: CardChanges,
    ) -> Registry {
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        let by_name = sorted.iter().map(|a| (a.name.clone(), a.clone())).collect();
        Registry {
            id: REGISTRIES.fetch_add(1, Ordering::Relaxed),
            by_name,
            sorted,
            retired,
            default_agent,
            card_changes,
        }
    }

    /// A removed agent, for reading its tasks.
    pub(crate) fn retired_agent(&self, name: &str) -> Option<&Arc<Agent>> {
        self.retired.get(name)
    }

    pub(crate) fn retired(&self) -> impl Iterator<Item = &Arc<Agent>> {
        self.retired.values()
    }

    pub(crate) fn card_changes(&self) -> &CardChanges {
        &self.card_changes
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Arc<Agent>> {
        self.by_name.get(name)
    }

    pub(crate) fn default_agent(&self) -> Option<&Arc<Agent>> {
        self.default_agent.as_deref().and_then(|n| self.get(n))
    }

    /// What an unknown-agent error lists: the first 100 names (`/a2a/agents` lists all), so
    /// a mistyped name costs little to answer however many agents there are.
    pub(crate) fn first_names(&self) -> Vec<String> {
        self.sorted
            .iter()
            .take(100)
            .map(|a| a.def.name.clone())
            .collect()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<Agent>> {
        self.sorted.iter()
    }

    /// Changes whenever an upstream card does.
    pub(crate) fn card_generation(&self) -> u64 {
        self.card_changes.current()
    }

    /// This registry's number, distinct from every other built in this process.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EchoConfig;

    fn registry(names: &[&str]) -> Registry {
        let agents = names
            .iter()
            .map(|name| {
                let def = AgentDef {
                    name: name.to_string(),
                    description: "d".into(),
                    version: None,
                    provider: None,
                    documentation_url: None,
                    icon_url: None,
                    default_input_modes: None,
                    default_output_modes: None,
                    skills: Vec::new(),
                    extended: None,
                    extensions: Vec::new(),
                    backend: BackendSpec::Echo(EchoConfig::default()),
                    mailbox: None,
                    max_concurrency: None,
                    access: None,
                    mcp_tools: Default::default(),
                    policies: Vec::new(),
                    source: "a.toml".into(),
                    runtime: false,
                };
                let limits = ActorLimits {
                    mailbox: 4,
                    max_concurrency: 1,
                };
                let metrics = crate::telemetry::Metrics::new(false);
                Agent::new(def, limits, &CardChanges::default(), &metrics).unwrap()
            })
            .collect();
        Registry::new(agents, None, CardChanges::default())
    }

    #[test]
    fn looked_up_by_name_listed_in_order_and_numbered() {
        let first = registry(&["b", "a"]);
        assert_eq!(first.first_names(), ["a", "b"]);
        assert!(first.get("b").is_some() && first.get("c").is_none());
        let second = registry(&["c"]);
        assert_eq!(second.first_names(), ["c"]);
        assert_ne!(first.id(), second.id(), "each registry has its own number");
    }
}

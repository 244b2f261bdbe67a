//! Which agent serves a request on the shared `/a2a` endpoint. In order:
//!
//! 1. **Follow-ups** stay with their agent: the owner of the `taskId` (GetTask, CancelTask,
//!    SubscribeToTask, or a message carrying one), else the agent that served the message's
//!    `contextId` before (context affinity).
//! 2. **The caller's choice**, in the message's or the request's metadata:
//!    `gateway/agent` (an agent name) or `gateway/skill` (a skill id from the aggregated
//!    card, `agent/skill`).
//! 3. **Rules** from `gateway.toml` (`[[routing.rules]]`), first match wins; a rule matches
//!    when all its conditions do: `tags` (any of the message's `gateway/tags` metadata),
//!    `text` (a regular expression over the message text), `principal` (the caller's id,
//!    `key:<id>`, `bearer:<id>`, `jwt:<issuer>:<sub>`; a trailing `*` matches a prefix).
//! 4. The **default agent**; with none, an error listing the agents.

use std::sync::Arc;

use regex::Regex;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::agents::{Agent, Registry};
use crate::auth::Principal;
use crate::config::RuleConfig;
use crate::error::GatewayError;
use crate::protocol::jsonrpc::{Method, RpcRequest};
use crate::protocol::model::{Metadata, Stamp, StreamItem, Task};
use crate::protocol::ops::SendResult;
use crate::protocol::ops::{ItemStream, ListTasksResponse};
use crate::store::Shared;
use crate::store::{Journal, Kept, Table};
use crate::tasks::Tasks;

pub(crate) const AGENT_KEY: &str = "gateway/agent";
pub(crate) const SKILL_KEY: &str = "gateway/skill";
pub(crate) const TAGS_KEY: &str = "gateway/tags";
/// The skill an MCP tool made for one skill names in its message's metadata.
pub(crate) const TOOL_SKILL_KEY: &str = "a2a-gateway/skill";
/// Reply metadata: why the shared endpoint chose the agent (see [`Reason`]).
pub(crate) const ROUTE_KEY: &str = "gateway/route";
/// The same two facts as the transport's headers (HTTP) or metadata (gRPC).
pub(crate) const AGENT_HEADER: &str = "a2a-gateway-agent";
pub(crate) const ROUTE_HEADER: &str = "a2a-gateway-route";

/// The few request fields routing looks at, read leniently: a request routing cannot read
/// goes to the default agent, which then reports what is wrong with it.
#[derive(Deserialize, Default)]
struct Probe {
    id: Option<String>,
    /// Push calls name their task so (1.0's `id` there is the config's).
    #[serde(rename = "taskId", alias = "task_id")]
    task_id: Option<String>,
    message: Option<MessageProbe>,
    metadata: Option<Map<String, Value>>,
    /// 0.1 sends name the conversation beside the message.
    #[serde(rename = "sessionId")]
    session_id: Option<String>,
}

impl Probe {
    fn read(params: Option<&serde_json::value::RawValue>) -> Probe {
        params
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or_default()
    }
}

#[derive(Deserialize)]
struct MessageProbe {
    #[serde(rename = "taskId", alias = "task_id")]
    task_id: Option<String>,
    #[serde(rename = "contextId", alias = "context_id")]
    context_id: Option<String>,
    metadata: Option<Map<String, Value>>,
    #[serde(default, alias = "content")]
    parts: Vec<PartProbe>,
}

#[derive(Deserialize)]
struct PartProbe {
    text: Option<String>,
}

/// Why a request went where it went (logged, and sent back in a header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reason {
    Task,
    Context,
    MetadataAgent,
    MetadataSkill,
    Rule(usize),
    Default,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Task => f.write_str("task"),
            Reason::Context => f.write_str("context"),
            Reason::MetadataAgent => f.write_str("metadata-agent"),
            Reason::MetadataSkill => f.write_str("metadata-skill"),
            Reason::Rule(i) => write!(f, "rule-{}", i + 1),
            Reason::Default => f.write_str("default"),
        }
    }
}

/// Which agent served a request and, on the shared endpoints, why. Replies say it twice: in
/// the `A2A-Gateway-Agent` / `A2A-Gateway-Route` headers, and in the metadata of what they
/// return (`gateway/agent`, `gateway/route`), for clients that never see headers.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub(crate) agent: Arc<str>,
    /// The [`Reason`], as replies write it.
    route: Option<String>,
}

impl Served {
    pub(crate) fn new(agent: &Agent, reason: Option<Reason>) -> Served {
        Served {
            agent: agent.name.clone(),
            route: reason.as_ref().map(Reason::to_string),
        }
    }

    /// Why the agent was chosen, as replies write it; None on an agent's own endpoint.
    pub(crate) fn route(&self) -> Option<&str> {
        self.route.as_deref()
    }

    /// The note as every binding's transport carries it (HTTP headers, gRPC metadata):
    /// the agent, and on the shared endpoints the route.
    pub(crate) fn headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        std::iter::once((AGENT_HEADER, &*self.agent))
            .chain(self.route().map(|route| (ROUTE_HEADER, route)))
    }

    /// The metadata entries a reply carries, for writers that add them as they write.
    pub(crate) fn metadata_stamp(&self) -> Stamp<'_> {
        Stamp::new(
            (AGENT_KEY, &self.agent),
            self.route.as_deref().map(|r| (ROUTE_KEY, r)),
        )
    }

    fn stamp(&self, metadata: &mut Option<Metadata>) {
        let metadata = metadata.get_or_insert_with(Metadata::new);
        for (key, value) in self.metadata_stamp().entries() {
            metadata.insert(key.into(), Value::from(value));
        }
    }

    /// `answer` with this note in its metadata. The bindings' renderers call it, so a
    /// handler never stamps by hand.
    pub(crate) fn stamped<T: Stampable>(&self, mut answer: T) -> T {
        answer.stamp(self);
        answer
    }

    /// Every item of a stream: each event says who sent it.
    pub(crate) fn stamp_stream(self, items: ItemStream) -> ItemStream {
        items.map_items(move |mut item| {
            if let Ok(item) = &mut item {
                match item {
                    StreamItem::Task(t) => self.stamp(&mut t.metadata),
                    StreamItem::Message(m) => self.stamp(&mut m.metadata),
                    StreamItem::StatusUpdate(e) => self.stamp(&mut e.metadata),
                    StreamItem::ArtifactUpdate(e) => self.stamp(&mut e.metadata),
                }
            }
            item
        })
    }
}

/// An answer that carries the gateway's note ([`Served`]) in its metadata.
pub(crate) trait Stampable {
    fn stamp(&mut self, served: &Served);
}

impl Stampable for Task {
    fn stamp(&mut self, served: &Served) {
        served.stamp(&mut self.metadata);
    }
}

impl Stampable for SendResult {
    fn stamp(&mut self, served: &Served) {
        match self {
            SendResult::Task(t) => served.stamp(&mut t.metadata),
            SendResult::Message(m) => served.stamp(&mut m.metadata),
            SendResult::Relayed(r) => served.stamp(&mut r.stamp),
        }
    }
}

impl Stampable for ListTasksResponse {
    fn stamp(&mut self, served: &Served) {
        self.tasks.iter_mut().for_each(|t| t.stamp(served));
    }
}

/// Nothing to carry it (an answer that is an error).
impl Stampable for () {
    fn stamp(&mut self, _: &Served) {}
}

pub(crate) struct Rule {
    agent: String,
    tags: Vec<String>,
    text: Option<Regex>,
    principal: Option<String>,
}

impl Rule {
    pub(crate) fn build(cfg: &RuleConfig) -> Result<Rule, String> {
        let text = cfg
            .text
            .as_deref()
            .map(|t| {
                Regex::new(t).map_err(|e| format!("text is not a valid regular expression: {e}"))
            })
            .transpose()?;
        if cfg.tags.is_empty() && text.is_none() && cfg.principal.is_none() {
            return Err("a rule needs at least one of tags, text, principal".into());
        }
        Ok(Rule {
            agent: cfg.agent.get_ref().clone(),
            tags: cfg.tags.clone(),
            text,
            principal: cfg.principal.clone(),
        })
    }

    fn matches(&self, tags: &[&str], text: &str, caller: &Principal) -> bool {
        let tags_ok = self.tags.is_empty() || self.tags.iter().any(|t| tags.contains(&t.as_str()));
        let text_ok = self.text.as_ref().is_none_or(|r| r.is_match(text));
        let principal_ok = self
            .principal
            .as_deref()
            .is_none_or(|p| match p.strip_suffix('*') {
                Some(prefix) => caller.id.starts_with(prefix),
                None => *caller.id == *p,
            });
        tags_ok && text_ok && principal_ok
    }
}

/// A map bounded to about `capacity` entries: past it, entries are forgotten, the least
/// recently and least often used first (quick_cache's CLOCK-Pro).
/// Each entry is also written to the store's table, when there is a durable store.
pub(crate) struct BoundedMap<V> {
    map: quick_cache::sync::Cache<String, V>,
    journal: Option<(Journal, Table)>,
    /// Where other replicas' entries are read (a shared store).
    shared: Option<(Arc<Shared>, Table)>,
}

/// A value a [`BoundedMap`] can keep in the store, as text.
pub(crate) trait Recorded: Clone + Sized {
    fn encode(&self) -> String;
    fn decode(text: String) -> Self;
}

impl Recorded for String {
    fn encode(&self) -> String {
        self.clone()
    }
    fn decode(text: String) -> Self {
        text
    }
}

impl Recorded for Arc<str> {
    fn encode(&self) -> String {
        self.to_string()
    }
    fn decode(text: String) -> Self {
        text.into()
    }
}

impl<V: Recorded> BoundedMap<V> {
    /// Starts from what `kept` held and writes every insert behind to its table.
    pub(crate) fn new(capacity: usize, kept: Kept) -> BoundedMap<V> {
        let map = quick_cache::sync::Cache::new(capacity.max(10));
        for (key, value) in kept.loaded {
            map.insert(key, V::decode(value));
        }
        BoundedMap {
            map,
            journal: kept.journal.map(|j| (j, kept.table)),
            shared: kept.shared.map(|s| (s, kept.table)),
        }
    }

    /// Makes another replica's entry for `key` readable here (with a shared store; else
    /// nothing to do).
    pub(crate) async fn fetch(&self, key: &str) -> Result<(), GatewayError> {
        if self.map.get(key).is_some() {
            return Ok(());
        }
        self.refresh(key).await
    }

    /// Reads `key` from the shared store again, whatever is known here (another replica
    /// may have changed it); without a shared store, nothing to do.
    pub(crate) async fn refresh(&self, key: &str) -> Result<(), GatewayError> {
        let Some((shared, table)) = &self.shared else {
            return Ok(());
        };
        let found = shared
            .record(*table, key)
            .await
            .map_err(GatewayError::StoreUnavailable)?;
        if let Some(value) = found {
            self.map.insert(key.to_string(), V::decode(value));
        }
        Ok(())
    }

    /// [`Self::insert`], returning once a shared store holds it, where other replicas and
    /// this one's next [`Self::refresh`] read it.
    pub(crate) async fn insert_shared(&self, key: &str, value: V) {
        self.insert(key, value);
        if let (Some((journal, _)), Some(_)) = (&self.journal, &self.shared) {
            let _ = journal.barrier().await;
        }
    }

    pub(crate) fn insert(&self, key: &str, value: V) {
        if let Some((journal, table)) = &self.journal {
            journal.record(*table, key, value.encode());
        }
        self.map.insert(key.to_string(), value);
    }

    pub(crate) fn get(&self, key: &str) -> Option<V> {
        self.map.get(key)
    }
}

/// One caller's conversation: its contextId scoped by the caller, length-prefixed so no
/// choice of ids makes two callers' keys meet. Context affinity and an agent's context
/// lanes are per caller, so knowing another caller's contextId steers nothing of theirs.
pub(crate) fn conversation(principal: &str, context_id: &str) -> String {
    // Built by hand: `format!` showed in profiles of every upstream send.
    let len = principal.len().to_string();
    let mut key = String::with_capacity(len.len() + 1 + principal.len() + context_id.len());
    key.push_str(&len);
    key.push(':');
    key.push_str(principal);
    key.push_str(context_id);
    key
}

/// Which agent served each caller's contextId (the newest 100k conversations).
pub(crate) struct ContextIndex {
    agents: BoundedMap<Arc<str>>,
}

impl ContextIndex {
    pub(crate) fn new(kept: Kept) -> ContextIndex {
        ContextIndex {
            agents: BoundedMap::new(100_000, kept),
        }
    }

    pub(crate) fn record(&self, principal: &str, context_id: &str, agent: &Arc<str>) {
        if context_id.is_empty() {
            return;
        }
        let key = conversation(principal, context_id);
        // Most messages continue a known conversation: a read is cheaper than a write.
        if self.agents.get(&key).is_some_and(|a| a == *agent) {
            return;
        }
        self.agents.insert(&key, agent.clone());
    }

    /// Reads the caller's conversation from other replicas (with a shared store).
    async fn fetch(&self, principal: &str, context_id: &str) -> Result<(), GatewayError> {
        self.agents
            .fetch(&conversation(principal, context_id))
            .await
    }

    /// A contextId for a conversation the gateway starts with one of its own agents. It
    /// names the agent (`<agent>.<uuid>`, like upstream task ids), so routing finds the
    /// agent without a record: most conversations never need one.
    pub(crate) fn new_id(agent: &str) -> String {
        let mut id = String::with_capacity(agent.len() + 37);
        id.push_str(agent);
        id.push('.');
        crate::protocol::model::push_new_id(&mut id);
        id
    }

    /// The agent recorded for the caller's conversation, else the local agent its id names.
    fn agent<'a>(
        &self,
        registry: &'a Registry,
        principal: &str,
        context_id: &str,
    ) -> Option<&'a Arc<Agent>> {
        if let Some(name) = self.agents.get(&conversation(principal, context_id)) {
            return registry.get(&name);
        }
        let (prefix, _) = context_id.split_once('.')?;
        registry.get(prefix).filter(|a| a.remote().is_none())
    }
}

/// Chooses the agent on the shared endpoints. It owns what it routes by besides the
/// request and the configuration in force (agents, rules): which agent served each
/// conversation (recorded by the service as tasks are created), and the task store (a
/// task's agent). Both outlive reloads.
pub(crate) struct Router {
    tasks: Arc<Tasks>,
    contexts: Arc<ContextIndex>,
}

/// The agent that owns `task_id`: upstream ids name their agent (`<agent>.<id>`), the
/// gateway's own tasks are looked up in the store.
pub(crate) fn owner<'a>(
    registry: &'a Registry,
    tasks: &Tasks,
    task_id: &str,
) -> Option<&'a Arc<Agent>> {
    if let Some((prefix, _)) = task_id.split_once('.') {
        if let Some(agent) = registry.get(prefix).filter(|a| a.remote().is_some()) {
            return Some(agent);
        }
    }
    let owner = tasks.owner(task_id)?;
    registry.get(&owner)
}

/// The skill a send's metadata names (the message's, else the request's): the skill part of
/// `gateway/skill` (`agent/skill`), else `a2a-gateway/skill` (which an MCP tool for one
/// skill sets).
pub(crate) fn skill_named(params: &serde_json::value::RawValue) -> Option<String> {
    let probe = Probe::read(Some(params));
    let message = probe.message.as_ref().and_then(|m| m.metadata.as_ref());
    skill_in(message, probe.metadata.as_ref())
}

/// [`skill_named`], from a send's message metadata and request metadata already read.
pub(crate) fn skill_in(
    message: Option<&Map<String, Value>>,
    request: Option<&Map<String, Value>>,
) -> Option<String> {
    let meta = |key: &str| {
        (message.and_then(|m| m.get(key)))
            .or_else(|| request.and_then(|m| m.get(key)))
            .and_then(Value::as_str)
    };
    if let Some(named) = meta(SKILL_KEY) {
        return Some(
            named
                .split_once('/')
                .map_or(named, |(_, skill)| skill)
                .into(),
        );
    }
    meta(TOOL_SKILL_KEY).map(str::to_string)
}

fn text_of(message: &MessageProbe) -> String {
    message
        .parts
        .iter()
        .filter_map(|p| p.text.as_deref())
        .collect()
}

impl Router {
    pub(crate) fn new(tasks: Arc<Tasks>, contexts: ContextIndex) -> Router {
        Router {
            tasks,
            contexts: Arc::new(contexts),
        }
    }

    /// Which agent served each conversation; the service records into it.
    pub(crate) fn contexts(&self) -> &Arc<ContextIndex> {
        &self.contexts
    }

    /// Reads what routing `params` needs from other replicas first (with a shared store):
    /// the task it names, and the agent of the caller's conversation.
    pub(crate) async fn hydrate(
        &self,
        params: Option<&serde_json::value::RawValue>,
        caller: &Principal,
    ) -> Result<(), GatewayError> {
        if self.tasks.shared().is_none() {
            return Ok(());
        }
        let probe = Probe::read(params);
        let message = probe.message.as_ref();
        if let Some(id) = probe
            .task_id
            .as_deref()
            .or(probe.id.as_deref())
            .or(message.and_then(|m| m.task_id.as_deref()))
        {
            self.tasks.hydrate(id).await?;
        }
        if let Some(context) = message
            .and_then(|m| m.context_id.as_deref())
            .or(probe.session_id.as_deref())
            .filter(|c| !c.is_empty())
        {
            self.contexts.fetch(&caller.id, context).await?;
        }
        Ok(())
    }

    /// [`Self::hydrate`] for a request that names a task in its path.
    pub(crate) async fn hydrate_task(&self, id: &str) -> Result<(), GatewayError> {
        self.tasks.hydrate(id).await
    }

    /// Chooses the agent for `rpc` on `/a2a`.
    pub(crate) fn route<'a>(
        &self,
        registry: &'a Registry,
        rules: &[Rule],
        rpc: &RpcRequest,
        caller: &Principal,
    ) -> Result<(&'a Arc<Agent>, Reason), GatewayError> {
        let probe = Probe::read(rpc.params);
        match rpc.method {
            Method::SendMessage | Method::SendStreamingMessage => {
                self.route_message(registry, rules, probe, caller)
            }
            Method::GetTask | Method::CancelTask | Method::SubscribeToTask => {
                self.route_task(registry, probe.id.as_deref())
            }
            Method::Push(_) => {
                self.route_task(registry, probe.task_id.as_deref().or(probe.id.as_deref()))
            }
            _ => default(registry),
        }
    }

    /// Chooses the agent for a send whose parameters (`SendMessageRequest`) are `params`,
    /// as on `/a2a`; the HTTP+JSON binding's shared `message:send`/`message:stream` use it.
    pub(crate) fn route_send<'a>(
        &self,
        registry: &'a Registry,
        rules: &[Rule],
        params: &serde_json::value::RawValue,
        caller: &Principal,
    ) -> Result<(&'a Arc<Agent>, Reason), GatewayError> {
        self.route_message(registry, rules, Probe::read(Some(params)), caller)
    }

    /// A request about one task (get, cancel, subscribe) goes to the task's agent, else to the
    /// default agent (which then answers "task not found" in its own terms).
    pub(crate) fn route_task<'a>(
        &self,
        registry: &'a Registry,
        task_id: Option<&str>,
    ) -> Result<(&'a Arc<Agent>, Reason), GatewayError> {
        // A removed agent's tasks stay readable (and cancelable) here.
        let retired = |t: &str| {
            self.tasks
                .owner(t)
                .and_then(|name| registry.retired_agent(&name))
        };
        match task_id
            .filter(|t| !t.is_empty())
            .and_then(|t| owner(registry, &self.tasks, t).or_else(|| retired(t)))
        {
            Some(agent) => Ok((agent, Reason::Task)),
            None => default(registry),
        }
    }

    fn route_message<'a>(
        &self,
        registry: &'a Registry,
        rules: &[Rule],
        probe: Probe,
        caller: &Principal,
    ) -> Result<(&'a Arc<Agent>, Reason), GatewayError> {
        let tasks = &self.tasks;
        let Some(message) = probe.message.as_ref() else {
            return default(registry);
        };
        if let Some(agent) = message
            .task_id
            .as_deref()
            .filter(|t| !t.is_empty())
            .and_then(|t| owner(registry, tasks, t))
        {
            return Ok((agent, Reason::Task));
        }
        if let Some(agent) = message
            .context_id
            .as_deref()
            .or(probe.session_id.as_deref())
            .and_then(|c| self.contexts.agent(registry, &caller.id, c))
        {
            return Ok((agent, Reason::Context));
        }
        let meta = |key: &str| {
            message
                .metadata
                .as_ref()
                .and_then(|m| m.get(key))
                .or_else(|| probe.metadata.as_ref().and_then(|m| m.get(key)))
        };
        if let Some(name) = meta(AGENT_KEY).and_then(Value::as_str) {
            let agent = registry
                .get(name)
                .ok_or_else(|| GatewayError::AgentNotFound {
                    name: name.to_string(),
                    available: registry.first_names(),
                })?;
            return Ok((agent, Reason::MetadataAgent));
        }
        if let Some(skill) = meta(SKILL_KEY).and_then(Value::as_str) {
            let agent = skill
                .split_once('/')
                .and_then(|(agent, _)| registry.get(agent))
                .ok_or_else(|| {
                    GatewayError::InvalidParams(format!(
                        "metadata {SKILL_KEY}: \"{skill}\" is not a skill id of the gateway card (agent/skill)"
                    ))
                })?;
            return Ok((agent, Reason::MetadataSkill));
        }
        let tags: Vec<&str> = meta(TAGS_KEY)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let text = text_of(message);
        for (i, rule) in rules.iter().enumerate() {
            if rule.matches(&tags, &text, caller) {
                if let Some(agent) = registry.get(&rule.agent) {
                    return Ok((agent, Reason::Rule(i)));
                }
            }
        }
        default(registry)
    }
}

/// The default agent, or the error that lists the agents to choose from.
pub(crate) fn default(registry: &Registry) -> Result<(&Arc<Agent>, Reason), GatewayError> {
    registry
        .default_agent()
        .map(|a| (a, Reason::Default))
        .ok_or_else(|| GatewayError::AgentNotFound {
            name: "(no route: no rule matched and there is no default agent)".into(),
            available: registry.first_names(),
        })
}

//! Agents served by an upstream A2A server: every operation is forwarded (the caller's
//! turn taken on the agent's actor first), and since the upstream knows nothing of the
//! gateway's callers, the gateway remembers who created each task it handed out.

use std::sync::Arc;

use futures_util::future::{BoxFuture, LocalBoxFuture};

use super::{Operations, Sent, TaskWriter};
use crate::agents::remote::Ended;
use crate::agents::{Admission, Agent, RemoteAgent};
use crate::auth::Principal;
use crate::error::GatewayError;
use crate::protocol::model::{Message, StreamItem, Task};
use crate::protocol::ops::{ItemStream, ListTasksResponse, SendRequest, SendResult};
use crate::protocol::params::ListQuery;
use crate::protocol::resume::ResumeFrom;
use crate::routing::{conversation, BoundedMap, ContextIndex};
use crate::store::Kept;

pub(super) struct UpstreamOps {
    /// Where usage is counted (the tasks' own, though upstream tasks are not kept here).
    tasks: Arc<crate::tasks::Tasks>,
    owners: Arc<RemoteOwners>,
    contexts: Arc<ContextIndex>,
    /// The 0.3 upstreams' ledgers as a durable store held them (per agent, until the
    /// agent is first used), and where their changes go.
    ledgers: std::sync::Mutex<std::collections::HashMap<String, Vec<(String, String)>>>,
    ledger_journal: Option<crate::store::Journal>,
    /// What streamed sends relayed, for callers that resume them.
    logs: Arc<super::upstream_log::UpstreamLogs>,
}

impl UpstreamOps {
    /// The agent's upstream, for a task `caller` may see.
    async fn callers_task<'a>(
        &self,
        agent: &'a Agent,
        caller: &Principal,
        id: &str,
    ) -> Result<&'a Arc<RemoteAgent>, GatewayError> {
        self.owners.fetch(id).await?;
        self.owners.check(id, caller)?;
        self.remote(agent)
    }

    pub(super) fn new(
        tasks: Arc<crate::tasks::Tasks>,
        contexts: Arc<ContextIndex>,
        capacity: usize,
        owners: Kept,
        ledgers: Kept,
    ) -> UpstreamOps {
        let mut by_agent: std::collections::HashMap<String, Vec<(String, String)>> =
            Default::default();
        for (key, value) in ledgers.loaded {
            if let Some((agent, id)) = crate::store::ledger_key_parts(&key) {
                by_agent
                    .entry(agent.to_string())
                    .or_default()
                    .push((id.to_string(), value));
            }
        }
        UpstreamOps {
            tasks,
            owners: Arc::new(RemoteOwners::new(capacity, owners)),
            contexts,
            ledgers: std::sync::Mutex::new(by_agent),
            // With a shared store, other replicas read it at each ListTasks.
            ledger_journal: ledgers.journal,
            logs: Default::default(),
        }
    }

    /// The agent's upstream, its ledger kept in the durable store from its first use.
    fn remote<'a>(&self, agent: &'a Agent) -> Result<&'a Arc<RemoteAgent>, GatewayError> {
        let remote = remote_of(agent)?;
        // Without a store that reads the ledger back there is nothing to do (and every
        // upstream call comes through here).
        if let Some(journal) = &self.ledger_journal {
            remote.keep_ledger(journal, || {
                self.ledgers
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&*agent.name)
                    .unwrap_or_default()
            });
        }
        Ok(remote)
    }
}

fn remote_of(agent: &Agent) -> Result<&Arc<RemoteAgent>, GatewayError> {
    agent
        .remote()
        .ok_or_else(|| GatewayError::Internal(format!("agent {} has no upstream", agent.name)))
}

impl Operations for UpstreamOps {
    fn send<'a>(
        &'a self,
        agent: &'a Arc<Agent>,
        caller: &'a Principal,
        req: SendRequest,
        _writer: Option<TaskWriter<'a>>,
    ) -> LocalBoxFuture<'a, Result<Sent, GatewayError>> {
        Box::pin(async move {
            let remote = self.remote(agent)?;
            self.owners.check_message(&req.message, caller).await?;
            let _turn = take_turn(agent, caller, &req).await?;
            let meter = Meter::start(&self.tasks, &caller.id, &agent.name);
            let result = remote.send(&req).await?;
            remote.note_result(&caller.id, &result);
            if let Some(mut meter) = meter {
                meter.result(&result);
                drop(meter);
                // Answered once its tokens count against the budgets.
                if let Some(usage) = self.tasks.usage() {
                    usage.settled().await;
                }
            }
            match &result {
                SendResult::Task(t) => {
                    self.owners.record(&t.id, caller);
                    self.contexts.record(&caller.id, &t.context_id, &agent.name);
                }
                SendResult::Message(m) => {
                    if let Some(c) = &m.context_id {
                        self.contexts.record(&caller.id, c, &agent.name);
                    }
                }
                SendResult::Relayed(r) => {
                    if let Some(t) = &r.task_id {
                        self.owners.record(t, caller);
                    }
                    if let Some(c) = &r.context_id {
                        self.contexts.record(&caller.id, c, &agent.name);
                    }
                }
            }
            Ok(Sent::Result(result))
        })
    }

    fn stream<'a>(
        &'a self,
        agent: &'a Arc<Agent>,
        caller: &'a Principal,
        req: SendRequest,
    ) -> LocalBoxFuture<'a, Result<ItemStream, GatewayError>> {
        Box::pin(async move {
            let remote = self.remote(agent)?;
            self.owners.check_message(&req.message, caller).await?;
            // The turn is held for as long as the stream is open.
            let turn = take_turn(agent, caller, &req).await?;
            let items = remote.stream(&req).await?;
            let owners = self.owners.clone();
            let contexts = self.contexts.clone();
            let (caller, anonymous) = (caller.id.clone(), caller.anonymous);
            let owner = caller.clone();
            let agent_name = agent.name.clone();
            let upstream = remote.clone();
            let remote = remote.clone();
            let mut meter = Meter::start(&self.tasks, &caller, &agent_name);
            let items = items.map_items(move |item| {
                let _held = &turn;
                if let Ok(item) = &item {
                    remote.note_item(&caller, item);
                    if let Some(meter) = meter.as_mut() {
                        meter.item(item);
                    }
                }
                if let Ok(StreamItem::Task(t)) = &item {
                    owners.record_id(&t.id, &caller, anonymous);
                    contexts.record(&caller, &t.context_id, &agent_name);
                }
                item
            });
            let items = match self.tasks.usage().filter(|u| u.stops_streaming()) {
                Some(usage) => {
                    let usage = usage.clone();
                    stop_at_budget(items, usage, owner.clone(), agent.name.clone(), upstream)
                }
                None => items,
            };
            // Read to its end by a recorder, caller or not, and kept for resuming.
            Ok(self.logs.record(owner, items))
        })
    }

    fn get<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        id: &'a str,
        history_length: Option<usize>,
    ) -> LocalBoxFuture<'a, Result<Task, GatewayError>> {
        Box::pin(async move {
            let remote = self.callers_task(agent, caller, id).await?;
            let task = remote.get(id, history_length).await?;
            remote.note_task(&task);
            Ok(task)
        })
    }

    fn list<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        query: &'a ListQuery,
    ) -> LocalBoxFuture<'a, Result<ListTasksResponse, GatewayError>> {
        Box::pin(async move {
            let remote = self.remote(agent)?;
            if let Some(shared) = self.tasks.shared() {
                remote
                    .take_in_ledger(|| async {
                        (shared.ledger(&agent.name).await).map_err(GatewayError::StoreUnavailable)
                    })
                    .await?;
            }
            let mut page = remote.list(&caller.id, query).await?;
            // The remote does not know our callers: keep only what this one created
            // (through any replica).
            for t in &page.tasks {
                self.owners.fetch(&t.id).await?;
            }
            let listed = page.tasks.len();
            page.tasks
                .retain(|t| self.owners.check(&t.id, caller).is_ok());
            // What was not this caller's is not counted either: a page never says there
            // are tasks it does not show.
            page.total_size = page.total_size.saturating_sub(listed - page.tasks.len());
            Ok(page)
        })
    }

    fn cancel<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        id: &'a str,
    ) -> LocalBoxFuture<'a, Result<Task, GatewayError>> {
        Box::pin(async move {
            let remote = self.callers_task(agent, caller, id).await?;
            let task = remote.cancel(id).await?;
            remote.note_task(&task);
            Ok(task)
        })
    }

    fn subscribe<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        id: &'a str,
    ) -> LocalBoxFuture<'a, Result<ItemStream, GatewayError>> {
        Box::pin(async move {
            let remote = self.callers_task(agent, caller, id).await?;
            self.follow(remote, &caller.id, id, Ended::Refused).await
        })
    }

    fn resume<'a>(
        &'a self,
        agent: &'a Agent,
        caller: &'a Principal,
        from: &'a ResumeFrom,
    ) -> LocalBoxFuture<'a, Result<ItemStream, GatewayError>> {
        Box::pin(async move {
            let id = from.task_id.as_str();
            let remote = self.callers_task(agent, caller, id).await?;
            if let Some(items) = self.logs.resume(id, &caller.id, from.version) {
                return Ok(items);
            }
            // Not relayed here (another replica did, or an earlier process), or longer ago
            // than the log reaches: the task as it is now (as it ended, for a finished
            // one), then its live events.
            self.follow(remote, &caller.id, id, Ended::Shown).await
        })
    }
}

impl UpstreamOps {
    /// `owner`'s stream of task `id` from now on. A task the gateway is reading already (a
    /// subscription beside its streamed send) is joined: one upstream stream, one
    /// numbering of its events; where that recording stops before the task's end (a
    /// send's stream stops for input), a subscription upstream takes over.
    async fn follow(
        &self,
        remote: &Arc<RemoteAgent>,
        owner: &Arc<str>,
        id: &str,
        ended: Ended,
    ) -> Result<ItemStream, GatewayError> {
        let (logs, remote, owner) = (self.logs.clone(), remote.clone(), owner.clone());
        if let Some(joined) = self.logs.join(id, &owner) {
            let id = id.to_string();
            return Ok(until_finished(joined, move || {
                Box::pin(async move { subscription(&logs, &remote, owner, &id, ended).await })
            }));
        }
        subscription(&logs, &remote, owner, id, ended).await
    }
}

/// A subscription upstream to task `id` for `owner`, read to the task's end by a recorder
/// (caller or not) and kept for resuming.
async fn subscription(
    logs: &Arc<super::upstream_log::UpstreamLogs>,
    remote: &Arc<RemoteAgent>,
    owner: Arc<str>,
    id: &str,
    ended: Ended,
) -> Result<ItemStream, GatewayError> {
    let items = remote.subscribe(id, ended).await?;
    let (noted_by, caller) = (remote.clone(), owner.clone());
    let items = items.map_items(move |item| {
        if let Ok(item) = &item {
            noted_by.note_item(&caller, item);
        }
        item
    });
    Ok(logs.record(owner, items))
}

/// `items`, then, if they stop before the task is over (and without an error), the
/// stream `then` opens.
fn until_finished(
    items: ItemStream,
    then: impl FnOnce() -> BoxFuture<'static, Result<ItemStream, GatewayError>> + Send + 'static,
) -> ItemStream {
    use futures_util::stream::{self, StreamExt};
    use std::sync::atomic::{AtomicBool, Ordering};
    let over = Arc::new(AtomicBool::new(false));
    let seen = over.clone();
    let head = items.with_positions().inspect(move |item| {
        if matches!(item, Ok((item, _)) if item.finishes_task()) || item.is_err() {
            seen.store(true, Ordering::Relaxed);
        }
    });
    let tail = stream::once(async move {
        if over.load(Ordering::Relaxed) {
            return stream::empty().left_stream();
        }
        match then().await {
            Ok(items) => items.with_positions().right_stream().right_stream(),
            Err(e) => stream::iter([Err(e)]).left_stream().right_stream(),
        }
    })
    .flatten();
    ItemStream::positioned(head.chain(tail))
}

/// An upstream stream whose task's reported tokens reach a budget that stops streaming
/// tasks: the upstream task is canceled, and the stream ends, after the item that crossed
/// the budget, with the budget's refusal.
fn stop_at_budget(
    items: ItemStream,
    usage: Arc<crate::usage::Usage>,
    caller: Arc<str>,
    agent: Arc<str>,
    remote: Arc<RemoteAgent>,
) -> ItemStream {
    use futures_util::StreamExt;
    struct Watch {
        items: std::pin::Pin<
            Box<dyn futures_util::Stream<Item = crate::protocol::ops::Positioned> + Send>,
        >,
        running: crate::usage::Tokens,
        /// The refusal that ends the stream after the item that crossed the budget.
        refusal: Option<GatewayError>,
        stopped: bool,
    }
    let watch = Watch {
        items: items.with_positions(),
        running: Default::default(),
        refusal: None,
        stopped: false,
    };
    let stream = futures_util::stream::unfold(watch, move |mut w| {
        let (usage, caller, agent, remote) =
            (usage.clone(), caller.clone(), agent.clone(), remote.clone());
        async move {
            if w.stopped {
                return None;
            }
            if let Some(refusal) = w.refusal.take() {
                w.stopped = true;
                return Some((Err(refusal), w));
            }
            let next = w.items.next().await?;
            let Ok((item, _)) = &next else {
                return Some((next, w));
            };
            let tokens = match item {
                StreamItem::StatusUpdate(s) if !s.status.state.is_terminal() => {
                    crate::tasks::tokens_of_status(s)
                }
                StreamItem::ArtifactUpdate(a) => crate::tasks::tokens_of_artifact(a),
                _ => None,
            };
            let Some(tokens) = tokens else {
                return Some((next, w));
            };
            w.running.add(tokens);
            let Some(error) = usage.stopped_by(&caller, &agent, &w.running).await else {
                return Some((next, w));
            };
            if let Some(id) = item.task_id() {
                if let Err(e) = remote.cancel(id).await {
                    tracing::warn!(agent = %agent, task = id, error = %e, "a task over its budget could not be canceled upstream");
                }
            }
            w.refusal = Some(error);
            Some((next, w))
        }
    });
    ItemStream::positioned(stream)
}

/// An upstream task's usage as its answers show it (its state, tokens and time): counted
/// once, when it ends, or, for one the answers leave unfinished, what it reported so far
/// when they stop.
struct Meter {
    usage: Arc<crate::usage::Usage>,
    caller: Arc<str>,
    agent: Arc<str>,
    started: std::time::Instant,
    /// What events reported one by one, and what a task reported as its total.
    reported: crate::usage::Tokens,
    total: crate::usage::Tokens,
    ended: bool,
}

impl Meter {
    /// A meter while usage wants tokens (else none, and nothing is read).
    fn start(tasks: &crate::tasks::Tasks, caller: &Arc<str>, agent: &Arc<str>) -> Option<Meter> {
        let usage = tasks.usage().filter(|u| u.wants_tokens())?;
        Some(Meter {
            usage: usage.clone(),
            caller: caller.clone(),
            agent: agent.clone(),
            started: std::time::Instant::now(),
            reported: Default::default(),
            total: Default::default(),
            ended: false,
        })
    }

    fn result(&mut self, result: &SendResult) {
        match result {
            SendResult::Task(t) => self.task(t),
            SendResult::Message(m) => self.message(m),
            SendResult::Relayed(r) => {
                let json = r.object_bytes();
                match r.is_task() {
                    true => {
                        if let Ok(t) = serde_json::from_slice::<Task>(json) {
                            self.task(&t);
                        }
                    }
                    false => {
                        if let Ok(m) = serde_json::from_slice::<Message>(json) {
                            self.message(&m);
                        }
                    }
                }
            }
        }
    }

    fn item(&mut self, item: &StreamItem) {
        match item {
            StreamItem::Task(t) => self.task(t),
            StreamItem::Message(m) => self.message(m),
            StreamItem::StatusUpdate(s) => {
                if let Some(t) = crate::tasks::tokens_of_status(s) {
                    self.reported.add(t);
                }
                if s.status.state.is_terminal() {
                    self.end(Some(s.status.state.v03_name()));
                }
            }
            StreamItem::ArtifactUpdate(a) => {
                if let Some(t) = crate::tasks::tokens_of_artifact(a) {
                    self.reported.add(t);
                }
            }
        }
    }

    fn task(&mut self, t: &Task) {
        self.total = crate::tasks::tokens_of_task(t);
        if t.status.state.is_terminal() {
            self.end(Some(t.status.state.v03_name()));
        }
    }

    fn message(&mut self, m: &Message) {
        if let Some(t) = crate::usage::tokens::in_metadata(m.metadata.as_ref()) {
            self.reported.add(t);
        }
        self.end(None);
    }

    fn end(&mut self, state: Option<&'static str>) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let tokens = std::mem::take(&mut self.reported).larger(std::mem::take(&mut self.total));
        self.usage.task_ended(crate::usage::TaskEnd {
            caller: &self.caller,
            agent: &self.agent,
            state,
            ms: self.started.elapsed().as_millis() as i64,
            tokens,
        });
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        let reported = !(self.reported.is_empty() && self.total.is_empty());
        if reported && !self.ended {
            self.end(None);
        }
    }
}

/// Who created each upstream task. The remote owns the task and knows nothing of the
/// gateway's callers, so the gateway remembers, bounded, the creator of every task id it
/// has handed out. An id it does not remember (created before a restart, or long ago) is
/// visible only to the anonymous principal, which is what every caller is when no
/// credentials are configured.
pub(super) struct RemoteOwners {
    owners: BoundedMap<Arc<str>>,
}

impl RemoteOwners {
    fn new(capacity: usize, kept: Kept) -> RemoteOwners {
        RemoteOwners {
            owners: BoundedMap::new(capacity, kept),
        }
    }

    fn record(&self, task_id: &str, caller: &Principal) {
        self.record_id(task_id, &caller.id, caller.anonymous);
    }

    /// Anonymous callers are not recorded: an id nobody claimed is visible to exactly the
    /// anonymous principal anyway, so the record would change nothing (and cost on every
    /// call of a gateway without credentials).
    fn record_id(&self, task_id: &str, owner: &Arc<str>, anonymous: bool) {
        if !anonymous {
            self.owners.insert(task_id, owner.clone());
        }
    }

    fn check(&self, task_id: &str, caller: &Principal) -> Result<(), GatewayError> {
        let visible = match self.owners.get(task_id) {
            Some(owner) => *owner == *caller.id,
            None => caller.anonymous,
        };
        if visible {
            Ok(())
        } else {
            Err(GatewayError::TaskNotFound(task_id.to_string()))
        }
    }

    /// A follow-up message may only continue the caller's own task.
    async fn check_message(
        &self,
        message: &Message,
        caller: &Principal,
    ) -> Result<(), GatewayError> {
        match message.task_id.as_deref().filter(|t| !t.is_empty()) {
            Some(t) => {
                self.fetch(t).await?;
                self.check(t, caller)
            }
            None => Ok(()),
        }
    }

    /// Reads the task's owner from other replicas first (with a shared store).
    async fn fetch(&self, task_id: &str) -> Result<(), GatewayError> {
        self.owners.fetch(task_id).await
    }
}

/// Waits for the agent's actor to admit a forwarded message (mailbox, the caller's lane for
/// its context, concurrency).
async fn take_turn(
    agent: &Agent,
    caller: &Principal,
    req: &SendRequest,
) -> Result<Admission, GatewayError> {
    let lane = req
        .message
        .context_id
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(|c| conversation(&caller.id, c));
    Ok(agent.actor.enqueue(lane.as_deref())?.ready().await)
}

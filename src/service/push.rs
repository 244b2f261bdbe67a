//! Push notification configs (kept per task in the task store's records, so they are
//! durable and shared like the rest) and where each task's updates come from:
//! - a task the gateway runs, or an upstream task it can stream: a subscription the
//!   gateway holds itself, as any caller's;
//! - an upstream that pushes: the gateway registers its own webhook with it (a secret URL
//!   per task, with a token it checks) and relays what arrives; the upstream never sees
//!   the caller's URL;
//! - an upstream that can do neither: polled.
//!
//! Every update goes to each config in the dialect it was made in, through [`Pusher`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use futures_util::StreamExt;
use subtle::ConstantTimeEq;

use super::{A2aService, Sent};
use crate::agents::{Agent, RemoteAgent};
use crate::auth::Principal;
use crate::error::GatewayError;
use crate::protocol::model::{StreamItem, Task};
use crate::protocol::ops::{ItemStream, SendRequest, SendResult};
use crate::protocol::push::{PushCall, PushConfig, PushOp};
use crate::protocol::resume::ResumeFrom;
use crate::protocol::Dialect;
use crate::push::{Authorization, Notification, Pusher, Target};
use crate::routing::BoundedMap;
use crate::store::Kept;
use crate::store::Shared as SharedStore;

/// Where the gateway's own webhooks for upstream tasks are served (`/<secret>` after it).
pub(crate) const RELAY_PATH: &str = "/a2a/push";

/// How many tasks' configs are remembered (the least used are forgotten first).
const CONFIGS_CAPACITY: usize = 100_000;

/// Locks a task's configs change under (a task's is chosen by its id).
const LOCK_STRIPES: usize = 64;

/// How long an upstream task is polled at the most (one left waiting for input, say).
const MAX_POLL: Duration = Duration::from_secs(24 * 3600);

/// Failed reads in a row after which an upstream task is no longer polled.
const MAX_POLL_FAILURES: u32 = 30;

/// How long a change to the shared store is retried while the store is away (restarting).
const STORE_RETRY_FOR: Duration = Duration::from_secs(60);

/// How long adopting a task may take in all (its reads, or notifying a final state found)
/// before it is handed back.
const ADOPT_WITHIN: Duration = Duration::from_secs(20);

/// Adoption rounds (half a lease each) between looks for tasks held here that nobody here
/// follows; an adoption that failed starts one at once.
const LOOK_FOR_LOST_CLAIMS_EVERY: u64 = 5;

/// How long a send's config, and the hold on following its task, are retried while the
/// store is away: the send was answered by then, and waits.
const INLINE_RETRY_FOR: Duration = Duration::from_secs(10);

/// Upstream tasks relayed at once; more are followed instead.
const MAX_RELAYS: usize = 100_000;

/// What a push call answers.
pub(crate) enum PushAnswer {
    Config(PushConfig),
    /// One page, and the token of the next ("" on the last).
    Configs(Vec<PushConfig>, String),
    Deleted,
}

pub(crate) struct Push {
    shared: Arc<Shared>,
    /// A task's configs change under one of these (chosen by the task's id), so that two
    /// calls at once do not each write back what the other did not see.
    locks: Vec<tokio::sync::Mutex<()>>,
    /// The base URL upstreams reach the gateway's webhooks at.
    relay_url: Option<String>,
}

/// What the watchers, spawned apart from any request, need.
struct Shared {
    /// Task id -> its configs (JSON), written to the store's records.
    configs: BoundedMap<String>,
    /// Tasks some watcher follows already.
    watched: DashMap<String, (), ahash::RandomState>,
    /// The gateway's webhooks at upstreams: secret -> what arrives there is for.
    relays: DashMap<String, Arc<Relay>, ahash::RandomState>,
    /// None while push is off.
    pusher: Option<Arc<Pusher>>,
    /// While looking for tasks held here that nobody here follows (an adoption whose claim
    /// was made but whose answer was lost, say): those seen in the last look (an empty
    /// set before the first). Two looks apart, as a task handed over is unwatched a
    /// moment before its hold goes.
    lost_claims: std::sync::Mutex<Option<HashSet<String>>>,
    /// Rounds of adoption so far: every [`LOOK_FOR_LOST_CLAIMS_EVERY`] starts a look.
    adoption_rounds: std::sync::atomic::AtomicU64,
}

/// A task's entry in `watched` (and its hold, with a shared store) while its watcher is
/// being set up: removed (given up) if the setup ends, or is dropped, without handing the
/// task to a watcher, which removes it itself.
struct Watching<'a> {
    watched: &'a DashMap<String, (), ahash::RandomState>,
    id: Option<String>,
    hold: Option<Hold>,
}

impl Watching<'_> {
    /// The task goes to a watcher, with the hold.
    fn handed_over(&mut self) -> Option<Hold> {
        self.id = None;
        self.hold.take()
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.watched.remove(&id);
        }
        if let Some(hold) = self.hold.take() {
            tokio::spawn(async move { hold.release().await });
        }
    }
}

/// This replica's hold on following a task, when replicas share a store: one replica
/// follows each task, notifying every config whichever replica made it.
#[derive(Clone)]
struct Hold {
    store: Arc<SharedStore>,
    task_id: String,
}

impl Hold {
    /// Whether to send the task's next update: false once another replica adopted the
    /// task (this one stalled past its lease).
    async fn keeps(&self) -> bool {
        // The store away: the update waits for it. Away past the retries: sent, as nobody
        // adopts meanwhile.
        let check = || self.store.follow_check(&self.task_id);
        (retried(STORE_RETRY_FOR, |_| true, check).await).unwrap_or(true)
    }

    /// Notes the update that made the task `version` delivered to every config, once
    /// `deliveries` are: a successor resumes after it. Until then one that dies with this
    /// replica is sent again by its successor (with the same notification id), not lost.
    fn note_when_delivered(&self, version: u64, deliveries: Deliveries) {
        let hold = self.clone();
        tokio::spawn(async move {
            deliveries.delivered().await;
            let note = || hold.store.follow_note(&hold.task_id, version);
            if let Err(e) = retried(STORE_RETRY_FOR, |_| true, note).await {
                tracing::debug!(task = %hold.task_id, version, error = %e, "push: could not note an update delivered; a successor would send it again");
            }
        });
    }

    /// Hands the task to the next replica to adopt one (this one, maybe), which picks up
    /// after the last version notified.
    async fn abandon(&self) {
        let done = retried(
            STORE_RETRY_FOR,
            |_| true,
            || self.store.follow_abandon(&self.task_id),
        )
        .await;
        if let Err(e) = done {
            tracing::warn!(task = %self.task_id, error = %e, "push: could not hand the task over; it is followed again if this replica dies");
        }
    }

    /// Gives the hold up: the task finished, and every update was notified. Kept, a
    /// successor would notify again what came after the last version noted.
    async fn release(&self) {
        let done = retried(
            STORE_RETRY_FOR,
            |_| true,
            || self.store.follow_release(&self.task_id),
        )
        .await;
        if let Err(e) = done {
            tracing::warn!(task = %self.task_id, error = %e, "push: could not give up following the task; a survivor adopts it if this replica dies");
        }
    }
}

/// `op`, again every 250 ms while it fails in a way `transient` says passes (the store
/// away), for `within` at most.
async fn retried<T, E, F, Fut>(
    within: Duration,
    transient: impl Fn(&E) -> bool,
    mut op: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let until = tokio::time::Instant::now() + within;
    loop {
        match op().await {
            Err(e) if transient(&e) && tokio::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            done => return done,
        }
    }
}

/// What a replica adopting a task another one followed needs to know of it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Followed {
    agent: String,
    owner: String,
    anonymous: bool,
}

/// One task whose upstream pushes to the gateway.
struct Relay {
    task_id: String,
    token: String,
    remote: Arc<RemoteAgent>,
    /// Given up when the task finishes.
    hold: std::sync::Mutex<Option<Hold>>,
    /// The task as the notifications so far made it (0.3 and 0.1 receivers get it whole).
    task: tokio::sync::Mutex<Option<Task>>,
}

impl Push {
    pub(crate) fn new(pusher: Option<Arc<Pusher>>, relay_url: Option<String>, kept: Kept) -> Push {
        Push {
            shared: Arc::new(Shared {
                configs: BoundedMap::new(CONFIGS_CAPACITY, kept),
                watched: DashMap::default(),
                relays: DashMap::default(),
                pusher,
                lost_claims: std::sync::Mutex::default(),
                adoption_rounds: Default::default(),
            }),
            locks: (0..LOCK_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            relay_url: relay_url.map(|u| u.trim_end_matches('/').to_string()),
        }
    }

    fn lock(&self, task_id: &str) -> &tokio::sync::Mutex<()> {
        let hash = ahash::RandomState::with_seeds(1, 2, 3, 4).hash_one(task_id);
        &self.locks[(hash % LOCK_STRIPES as u64) as usize]
    }

    /// Adds `config` to the task's (replacing one of the same id), under the task's lock;
    /// refused past `max_configs_per_task`.
    async fn add(&self, task_id: &str, config: &PushConfig) -> Result<(), GatewayError> {
        let max = self.pusher()?.settings().max_configs_per_task;
        let _changing = self.lock(task_id).lock().await;
        let mut configs = self.configs(task_id).await?;
        let held = configs.len();
        match configs.iter_mut().find(|c| c.id == config.id) {
            Some(same) => {
                *same = config.clone();
                // What waits for the old one goes to its old URL no more.
                if let Some(pusher) = &self.shared.pusher {
                    pusher.forget(task_id, &config.id);
                }
            }
            None if held >= max => {
                return Err(GatewayError::InvalidParams(format!(
                    "task {task_id} has the maximum of {max} push notification configs; delete one first"
                )))
            }
            None => configs.push(config.clone()),
        }
        self.shared.keep(task_id, &configs).await;
        Ok(())
    }

    /// Deletes the config `id` of the task, if it has one.
    async fn remove(&self, task_id: &str, id: &str) -> Result<(), GatewayError> {
        let _changing = self.lock(task_id).lock().await;
        let mut configs = self.configs(task_id).await?;
        if configs.iter().any(|c| c.id == id) {
            configs.retain(|c| c.id != id);
            self.shared.keep(task_id, &configs).await;
            if let Some(pusher) = &self.shared.pusher {
                pusher.forget(task_id, id);
            }
        }
        Ok(())
    }

    pub(crate) fn enabled(&self) -> bool {
        self.shared.pusher.is_some()
    }

    /// The JWKS of the key notifications are signed with, while push is on.
    pub(crate) fn jwks(&self) -> Option<serde_json::Value> {
        self.shared.pusher.as_ref().map(|p| p.jwks())
    }

    /// What delivers webhooks, while push is on (budget alerts use it too).
    pub(crate) fn deliveries(&self) -> Option<Arc<Pusher>> {
        self.shared.pusher.clone()
    }

    fn pusher(&self) -> Result<&Arc<Pusher>, GatewayError> {
        self.shared
            .pusher
            .as_ref()
            .ok_or(GatewayError::PushNotSupported)
    }

    /// -32003 while push is off, before anything else is looked at.
    pub(crate) fn check_enabled(&self) -> Result<(), GatewayError> {
        self.pusher().map(drop)
    }

    /// Checks a config before anything is stored or sent: the destination policy, and
    /// what its authentication asks for.
    pub(crate) async fn check(&self, config: &PushConfig) -> Result<(), GatewayError> {
        let pusher = self.pusher()?;
        pusher
            .policy()
            .check_url(&config.url)
            .await
            .map_err(|why| {
                GatewayError::InvalidParams(format!("pushNotificationConfig.url: {why}"))
            })?;
        authorization(config)?;
        Ok(())
    }

    /// Takes a send's config out of it, checked: its destination and authentication, and
    /// room for it when the send continues a task. A refused config sends nothing.
    async fn take_checked(
        &self,
        req: &mut SendRequest,
    ) -> Result<Option<Box<PushConfig>>, GatewayError> {
        let Some(config) = req.push.take() else {
            return Ok(None);
        };
        self.check(&config).await?;
        self.check_room(req.message.task_id.as_deref(), &config)
            .await?;
        Ok(Some(config))
    }

    /// Refuses, before a follow-up is sent, a config its task has no room for.
    async fn check_room(
        &self,
        task_id: Option<&str>,
        config: &PushConfig,
    ) -> Result<(), GatewayError> {
        let Some(task_id) = task_id.filter(|t| !t.is_empty()) else {
            return Ok(());
        };
        let max = self.pusher()?.settings().max_configs_per_task;
        let id = if config.id.is_empty() {
            task_id
        } else {
            &config.id
        };
        let configs = self.configs(task_id).await?;
        if configs.len() >= max && !configs.iter().any(|c| c.id == id) {
            return Err(GatewayError::InvalidParams(format!(
                "task {task_id} has the maximum of {max} push notification configs; delete one first"
            )));
        }
        Ok(())
    }

    async fn configs(&self, task_id: &str) -> Result<Vec<PushConfig>, GatewayError> {
        // Another replica may have changed them since they were read here.
        self.shared.configs.refresh(task_id).await?;
        Ok(self.shared.configs_of(task_id))
    }
}

impl Shared {
    fn configs_of(&self, task_id: &str) -> Vec<PushConfig> {
        self.configs
            .get(task_id)
            .and_then(|json| serde_json::from_str(&json).ok())
            .unwrap_or_default()
    }

    /// Stores the task's configs; with a shared store, returns once it holds them.
    async fn keep(&self, task_id: &str, configs: &[PushConfig]) {
        if let Ok(json) = serde_json::to_string(configs) {
            self.configs.insert_shared(task_id, json).await;
        }
    }

    /// Sends what `item` did to `task` (the task after it) to every config of the task;
    /// the deliveries of a final state, to wait for.
    async fn notify(&self, task_id: &str, item: &StreamItem, task: &Task) -> Deliveries {
        self.notify_holding(task_id, item, task, None).await
    }

    /// [`Self::notify`] by the follower holding `hold`: a final state goes only while the
    /// hold is still this replica's when its turn comes (one stalled past its lease finds
    /// its successor sent it), and the deliveries of every update are to wait for (the
    /// follower notes an update once they are done).
    async fn notify_holding(
        &self,
        task_id: &str,
        item: &StreamItem,
        task: &Task,
        hold: Option<&Hold>,
    ) -> Deliveries {
        let Some(pusher) = &self.pusher else {
            return Deliveries::default();
        };
        // Another replica may have changed the configs (a shared store).
        if self.configs.refresh(task_id).await.is_err() {
            tracing::warn!(task = %task_id, "push: the store did not answer; using the configs known here");
        }
        let configs = self.configs_of(task_id);
        Deliveries(
            (configs.iter())
                .filter_map(|config| send(pusher, task_id, config, item, task, hold))
                .collect(),
        )
    }

    /// Follows `items` (a subscription, starting with the task, or a stream resumed after
    /// version `after`, notified before a handover, with `known`, the task as read before)
    /// to the task's end; an upstream task whose subscription ends before that is polled
    /// from there (`fallback`).
    async fn follow(
        self: Arc<Self>,
        task_id: String,
        (items, known, after): (ItemStream, Option<Task>, u64),
        fallback: Option<(Arc<RemoteAgent>, Duration)>,
        hold: Option<Hold>,
    ) {
        let mut items = items.with_positions();
        let mut task = known;
        let mut finished = false;
        while let Some(item) = items.next().await {
            let (item, version) = match item {
                // Version 0: the task as made, before any event (nothing to note).
                Ok((item, version)) => (item, version.filter(|v| *v > 0)),
                Err(e) => {
                    tracing::warn!(task = %task_id, error = %e, "push: the task's updates stopped coming");
                    break;
                }
            };
            let Some(now) = item.fold_into(&mut task) else {
                continue;
            };
            if version.is_some_and(|v| v <= after) {
                continue; // The task as it was when last notified (it has no log to resume).
            }
            // Each update is noted once delivered, the final state as the hold is given
            // up: one that dies with this replica first is sent again by its successor
            // (with the same notification id), not lost.
            let last = item.finishes_task();
            if !keeps(&hold).await {
                return self.stood_down(&task_id);
            }
            let deliveries = (self.notify_holding(&task_id, &item, now, hold.as_ref())).await;
            if last {
                deliveries.delivered().await;
                finished = true;
                break;
            }
            if let (Some(hold), Some(version)) = (&hold, version) {
                hold.note_when_delivered(version, deliveries);
            }
        }
        // Resumed after its last update (notified before a handover): nothing came.
        let finished = finished || task.as_ref().is_some_and(|t| t.status.state.is_terminal());
        match (finished, fallback, task, hold) {
            (false, Some((remote, every)), Some(task), hold) => {
                Box::pin(self.poll(task_id, remote, task, every, hold)).await;
            }
            // Its updates stopped coming (the shared store went away): a replica adopts
            // it again, resuming after the last update notified.
            (false, None, _, Some(hold)) => {
                // Not watched here first: whoever adopts it, this replica too, follows it.
                self.watched.remove(&task_id);
                hold.abandon().await;
            }
            (_, _, _, hold) => self.done(&task_id, hold).await,
        }
    }

    /// This replica no longer follows the task: it finished, or could not be followed.
    async fn done(&self, task_id: &str, hold: Option<Hold>) {
        if let Some(hold) = hold {
            hold.release().await;
        }
        self.watched.remove(task_id);
    }

    /// Another replica adopted the task while this one stalled: it follows it now.
    fn stood_down(&self, task_id: &str) {
        tracing::warn!(task = %task_id, "push: another replica follows the task now (this one stalled past its lease)");
        self.watched.remove(task_id);
    }

    /// Polls an upstream task that can neither stream nor push, notifying each change.
    async fn poll(
        self: Arc<Self>,
        task_id: String,
        remote: Arc<RemoteAgent>,
        mut task: Task,
        every: Duration,
        hold: Option<Hold>,
    ) {
        let mut failures = 0;
        let until = tokio::time::Instant::now() + MAX_POLL;
        loop {
            tokio::time::sleep(every).await;
            if tokio::time::Instant::now() > until {
                tracing::warn!(task = %task_id, "push: the upstream task has not finished in a day; no longer polled");
                break;
            }
            let now = match remote.get(&task_id, None).await {
                Ok(now) => {
                    failures = 0;
                    now
                }
                Err(e) if failures < MAX_POLL_FAILURES => {
                    failures += 1;
                    tracing::debug!(task = %task_id, error = %e, "push: polling the upstream task");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(task = %task_id, error = %e, "push: the upstream task cannot be read; no longer polled");
                    break;
                }
            };
            if now.status != task.status || now.artifacts != task.artifacts {
                if !keeps(&hold).await {
                    return self.stood_down(&task_id);
                }
                let item = StreamItem::Task(now.clone());
                let finals = (self.notify_holding(&task_id, &item, &now, hold.as_ref())).await;
                if now.status.state.is_terminal() {
                    finals.delivered().await;
                    break;
                }
                task = now;
            }
            if self.configs_of(&task_id).is_empty() {
                break;
            }
        }
        self.done(&task_id, hold).await;
    }
}

/// Whether a follower (with its hold, if replicas share a store) still notifies.
async fn keeps(hold: &Option<Hold>) -> bool {
    match hold {
        Some(hold) => hold.keeps().await,
        None => true,
    }
}

/// Queues what `item` did to `task` for `config`; for the task's final state, and for an
/// update its follower holds `hold` on, what says when it was delivered (or given up). A
/// final state goes only while `hold` (with a shared store) is still this replica's.
fn send(
    pusher: &Arc<Pusher>,
    task_id: &str,
    config: &PushConfig,
    item: &StreamItem,
    task: &Task,
    hold: Option<&Hold>,
) -> Option<tokio::sync::oneshot::Receiver<()>> {
    let name = config.name.as_deref().unwrap_or(task_id);
    let (body, content_type) = match notification(config.dialect, item, task, name) {
        Ok(rendered) => rendered,
        Err(e) => {
            tracing::error!(task = %task_id, error = %e, "push: serializing a notification");
            return None;
        }
    };
    let authorization = authorization(config).ok()?;
    let target = Target {
        task_id: task_id.to_string(),
        config_id: config.id.clone(),
        url: config.url.clone(),
        token: config.token.clone(),
        authorization,
    };
    let body = body.into();
    let last = item.finishes_task();
    let note = match last {
        true => Notification::final_state(body, content_type, task_id, &config.id),
        false => Notification::update(body, content_type, task_id, &config.id),
    };
    let still_ours: futures_util::future::BoxFuture<'static, bool> = match hold {
        // Not followed: an update goes untracked.
        None if !last => {
            pusher.enqueue(target, note);
            return None;
        }
        // A final state goes only while the hold is this replica's: the follower's own
        // check (asked again while the store fails: a call in flight when this process was
        // stopped fails as it wakes).
        Some(hold) if last => {
            let hold = hold.clone();
            Box::pin(async move { hold.keeps().await })
        }
        _ => Box::pin(std::future::ready(true)),
    };
    Some(pusher.enqueue_tracked(target, note, still_ours))
}

/// The deliveries of an update to a task's configs, which its follower waits for before it
/// notes the update delivered (or, for the final state, gives its hold up): when its
/// replica dies first, its successor sends them again rather than not at all.
#[derive(Default)]
struct Deliveries(Vec<tokio::sync::oneshot::Receiver<()>>);

impl Deliveries {
    /// Once each was delivered or given up (the pusher's retries bound it).
    async fn delivered(self) {
        for delivery in self.0 {
            let _ = delivery.await;
        }
    }
}

/// What one task update sends to a config made in `dialect`: 1.0 receivers get the event
/// itself (a `StreamResponse`), 0.3 and 0.1 receivers the whole task as it now is (what
/// their SDKs send). `task` is the task after `item`; `name` the id the caller knows it by.
fn notification(
    dialect: Dialect,
    item: &StreamItem,
    task: &Task,
    name: &str,
) -> Result<(Vec<u8>, &'static str), serde_json::Error> {
    match dialect {
        Dialect::V10 => Ok((serde_json::to_vec(item)?, "application/a2a+json")),
        Dialect::V03 => Ok((
            serde_json::to_vec(&crate::protocol::v03::V03(task))?,
            "application/json",
        )),
        Dialect::V01 => {
            let mut task = task.clone();
            task.id = name.to_string();
            let body = serde_json::to_vec(&crate::protocol::v01::TaskV01 {
                task: &task,
                history_length: None,
            })?;
            Ok((body, "application/json"))
        }
    }
}

/// What the config's authentication asks the gateway to send.
fn authorization(config: &PushConfig) -> Result<Authorization, GatewayError> {
    let Some(scheme) = config.schemes.first() else {
        return Ok(Authorization::None);
    };
    match &config.credentials {
        Some(c) => Ok(Authorization::Header(format!("{scheme} {c}"))),
        None if scheme.eq_ignore_ascii_case("bearer") => Ok(Authorization::GatewayJwt),
        None => Err(GatewayError::InvalidParams(format!(
            "pushNotificationConfig.authentication.credentials: required for the scheme {scheme} (Bearer without credentials asks the gateway to sign a JWT, see /.well-known/jwks.json)"
        ))),
    }
}

impl A2aService {
    /// A push call (create, get, list, delete) on `call.task_id`, which the caller must
    /// be able to see. `name` is what a 0.1 caller calls the task.
    pub(crate) async fn push_call(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        op: PushOp,
        call: PushCall,
        name: Option<&str>,
    ) -> Result<PushAnswer, GatewayError> {
        let push = &self.push;
        push.check_enabled()?;
        let task = self.get(agent, caller, &call.task_id, Some(0)).await?;
        if op == PushOp::Set {
            let mut config = call
                .config
                .ok_or_else(|| GatewayError::InvalidParams("params: no config given".into()))?;
            config.name = name.map(str::to_string);
            push.check(&config).await?;
            push.add(&call.task_id, &config).await?;
            self.watch(agent, caller, task, &config).await;
            return Ok(PushAnswer::Config(config));
        }
        let configs = push.configs(&call.task_id).await?;
        match op {
            PushOp::Set => Err(GatewayError::Internal("a set taken for a read".into())),
            PushOp::Get => {
                let found = match &call.config_id {
                    Some(id) => configs.into_iter().find(|c| &c.id == id),
                    // 0.3 and 0.1 may ask without naming one: the first.
                    None => configs.into_iter().next(),
                };
                found
                    .map(PushAnswer::Config)
                    .ok_or_else(|| GatewayError::PushConfigNotFound {
                        task: call.task_id.clone(),
                        id: call.config_id.clone().unwrap_or_default(),
                    })
            }
            PushOp::List => {
                let start = call.page_token.min(configs.len());
                let end = (start + call.page_size).min(configs.len());
                let next = if end < configs.len() {
                    end.to_string()
                } else {
                    String::new()
                };
                Ok(PushAnswer::Configs(configs[start..end].to_vec(), next))
            }
            PushOp::Delete => {
                let id = call.config_id.ok_or_else(|| {
                    GatewayError::InvalidParams(
                        "params: which config (id / pushNotificationConfigId) is missing".into(),
                    )
                })?;
                // Deleting what is not there succeeds: the config is gone either way.
                push.remove(&call.task_id, &id).await?;
                Ok(PushAnswer::Deleted)
            }
        }
    }

    /// A send with a config: the config is checked before the message goes anywhere (a
    /// refused one sends nothing), then kept for the task the send answers with.
    pub(super) async fn send_pushing(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        mut req: SendRequest,
    ) -> Result<Sent, GatewayError> {
        let config = self.push.take_checked(&mut req).await?;
        let sent = self.ops(agent).send(agent, caller, req, None).await?;
        let task = match &sent {
            Sent::Result(SendResult::Task(task)) => Some(task.clone()),
            Sent::Result(SendResult::Relayed(r)) => match &r.task_id {
                Some(id) => self.get(agent, caller, id, None).await.ok(),
                None => None,
            },
            _ => None,
        };
        if let (Some(task), Some(config)) = (task, config) {
            self.push_inline(agent, caller, task, *config).await;
        }
        Ok(sent)
    }

    /// [`Self::send_pushing`] for a streamed send: the task is known from the stream's
    /// first item, which the caller gets unchanged.
    pub(super) async fn stream_pushing(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        mut req: SendRequest,
    ) -> Result<ItemStream, GatewayError> {
        let config = self.push.take_checked(&mut req).await?;
        let items = self.ops(agent).stream(agent, caller, req).await?;
        let mut items = items.with_positions();
        let first = items.next().await;
        if let (Some(Ok((StreamItem::Task(task), _))), Some(config)) = (&first, config) {
            self.push_inline(agent, caller, task.clone(), *config).await;
        }
        let items = futures_util::stream::iter(first).chain(items);
        Ok(ItemStream::positioned(items))
    }

    /// Stores a config a send gave inline for the task it started (or continued), and
    /// starts notifying it. The config was checked before the send.
    async fn push_inline(
        &self,
        agent: &Arc<Agent>,
        caller: &Principal,
        task: Task,
        mut config: PushConfig,
    ) {
        if config.id.is_empty() {
            config.id.clone_from(&task.id);
        }
        // The send went through: its config waits out a store restarting rather than
        // being dropped.
        let unavailable = |e: &GatewayError| matches!(e, GatewayError::StoreUnavailable(_));
        let kept = retried(INLINE_RETRY_FOR, unavailable, || {
            self.push.add(&task.id, &config)
        })
        .await;
        if let Err(e) = kept {
            tracing::error!(task = %task.id, error = %e, "push: the send's config was not kept");
            return;
        }
        self.watch(agent, caller, task, &config).await;
    }

    /// Makes sure the task's updates reach its configs. A task already finished gets its
    /// final state sent to `config` (the one just made) alone.
    async fn watch(&self, agent: &Arc<Agent>, caller: &Principal, task: Task, config: &PushConfig) {
        let push = &self.push;
        let Some(pusher) = &push.shared.pusher else {
            return;
        };
        let id = task.id.clone();
        if task.status.state.is_terminal() {
            send(
                pusher,
                &id,
                config,
                &StreamItem::Task(task.clone()),
                &task,
                None,
            );
            return;
        }
        if push.shared.watched.insert(id.clone(), ()).is_some() {
            // Its watcher reads the configs at each update, this one included.
            return self.send_if_finished(agent, caller, &id, config).await;
        }
        // Until a watcher is under way, the entry goes with this call (which its caller
        // may drop at any await).
        let mut entry = Watching {
            watched: &push.shared.watched,
            id: Some(id.clone()),
            hold: None,
        };
        match self.hold(agent, caller, &id).await {
            Ok(hold) => entry.hold = hold,
            Err(holder) => {
                // Another replica follows the task, reading the configs at each update.
                tracing::debug!(task = %id, replica = %holder, "push: followed by another replica");
                drop(entry);
                return self.send_if_finished(agent, caller, &id, config).await;
            }
        }
        let shared = push.shared.clone();
        let every = Duration::from_secs(pusher.settings().poll_interval_secs);
        if let Some(remote) = agent.remote().cloned() {
            // Each relay is kept until its task ends upstream; past this many, watch.
            if remote.pushes() && push.shared.relays.len() < MAX_RELAYS {
                if let Some(base) = &push.relay_url {
                    match self.relay(&remote, base, &task, entry.hold.take()).await {
                        Ok(()) => return drop(entry.handed_over()),
                        Err((e, hold)) => {
                            entry.hold = hold;
                            tracing::warn!(task = %id, agent = %agent.name, error = %e, "push: the upstream did not take the gateway's webhook; watching the task instead")
                        }
                    }
                }
            }
            if remote.streams() {
                if let Ok(items) = self.subscribe(agent, caller, &id).await {
                    // Upstreams may end a subscription early (at input-required, say):
                    // polled from there.
                    let hold = entry.handed_over();
                    tokio::spawn(shared.follow(id, (items, None, 0), Some((remote, every)), hold));
                    return;
                }
            }
            tokio::spawn(shared.poll(id, remote, task, every, entry.handed_over()));
            return;
        }
        match self.subscribe(agent, caller, &id).await {
            Ok(items) => {
                tokio::spawn(shared.follow(id, (items, None, 0), None, entry.handed_over()));
            }
            Err(e) => {
                let hold = entry.handed_over();
                // Finished meanwhile: what it finished as is the one notification left
                // (the hold given up once it is delivered, apart from this call).
                let finals = match self.get(agent, caller, &id, None).await {
                    Ok(now) => {
                        let item = StreamItem::Task(now.clone());
                        shared.notify(&id, &item, &now).await
                    }
                    Err(_) => {
                        tracing::warn!(task = %id, error = %e, "push: cannot follow the task");
                        Deliveries::default()
                    }
                };
                tokio::spawn(async move {
                    finals.delivered().await;
                    shared.done(&id, hold).await;
                });
            }
        }
    }

    /// A config made for a task some watcher follows: that watcher notifies it, unless the
    /// task finished in the meantime; then its final state is sent to it here.
    async fn send_if_finished(
        &self,
        agent: &Agent,
        caller: &Principal,
        id: &str,
        config: &PushConfig,
    ) {
        let Some(pusher) = &self.push.shared.pusher else {
            return;
        };
        if let Ok(now) = self.get(agent, caller, id, None).await {
            if now.status.state.is_terminal() {
                send(
                    pusher,
                    id,
                    config,
                    &StreamItem::Task(now.clone()),
                    &now,
                    None,
                );
            }
        }
    }

    /// With a shared store, takes the hold on following task `id` cluster-wide (`Ok(None)`
    /// without one); the replica that holds it, if another does.
    async fn hold(
        &self,
        agent: &Agent,
        caller: &Principal,
        id: &str,
    ) -> Result<Option<Hold>, String> {
        let Some(store) = self.tasks.shared() else {
            return Ok(None);
        };
        let about = Followed {
            agent: agent.name.to_string(),
            owner: caller.id.to_string(),
            anonymous: caller.anonymous,
        };
        let about = serde_json::to_string(&about).unwrap_or_default();
        // Retried while the store is away (restarting): a replica following without the
        // hold may follow beside the one holding it, and both would notify.
        let claim = || store.follow_claim(id, &about);
        match retried(INLINE_RETRY_FOR, |_| true, claim).await {
            Ok(None) => Ok(Some(Hold {
                store: store.clone(),
                task_id: id.to_string(),
            })),
            Ok(Some(holder)) => Err(holder),
            Err(e) => {
                // Followed here rather than not at all.
                tracing::warn!(task = %id, error = %e, "push: the store did not answer; following the task here");
                Ok(None)
            }
        }
    }

    /// Follows the tasks replicas that died were following, as the survivors' reaper hands
    /// them over: from after the last update their follower notified. `registry` has the
    /// agents in force.
    pub(crate) async fn adopt_followed(&self, registry: &crate::agents::Registry) {
        let Some(store) = self.tasks.shared() else {
            return;
        };
        let Some(pusher) = &self.push.shared.pusher else {
            return;
        };
        let every = Duration::from_secs(pusher.settings().poll_interval_secs);
        loop {
            match store.follow_adopt().await {
                Ok(Some((id, about, seen))) => {
                    let hold = Hold {
                        store: store.clone(),
                        task_id: id,
                    };
                    self.adopt_within(registry, hold, (&about, seen), every)
                        .await;
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "push: could not look for tasks to adopt");
                    self.look_for_lost_claims();
                    return;
                }
            }
        }
        let rounds = &self.push.shared.adoption_rounds;
        if rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % LOOK_FOR_LOST_CLAIMS_EVERY
            == 0
        {
            self.look_for_lost_claims();
        }
        self.adopt_lost_claims(registry, every).await;
    }

    fn look_for_lost_claims(&self) {
        let mut lost = self.lost_claims();
        *lost = Some(lost.take().unwrap_or_default());
    }

    fn lost_claims(&self) -> std::sync::MutexGuard<'_, Option<HashSet<String>>> {
        let lost = self.push.shared.lost_claims.lock();
        lost.unwrap_or_else(|e| e.into_inner())
    }

    /// While looking: follows the tasks held here that nobody here follows, seen in two
    /// looks in a row.
    async fn adopt_lost_claims(&self, registry: &crate::agents::Registry, every: Duration) {
        let (Some(before), Some(store)) = (self.lost_claims().clone(), self.tasks.shared()) else {
            return;
        };
        let Ok(held) = store.follow_held().await else {
            return; // Looked for again next time.
        };
        let watched = &self.push.shared.watched;
        let unfollowed = held
            .into_iter()
            .filter(|(id, ..)| !watched.contains_key(id));
        let mut suspects = HashSet::new();
        for (id, about, seen) in unfollowed {
            if !before.contains(&id) {
                suspects.insert(id);
                continue;
            }
            tracing::info!(task = %id, "push: following a task held here that nobody followed (its adoption's answer was lost)");
            let hold = Hold {
                store: store.clone(),
                task_id: id,
            };
            self.adopt_within(registry, hold, (&about, seen), every)
                .await;
        }
        *self.lost_claims() = (!suspects.is_empty()).then_some(suspects);
    }

    /// [`Self::adopt`], handing the task back when it has not got under way within
    /// [`ADOPT_WITHIN`]: one that never does would hold up every adoption after it (and the
    /// looks for lost claims), as they run one after another.
    async fn adopt_within(
        &self,
        registry: &crate::agents::Registry,
        hold: Hold,
        about: (&str, u64),
        every: Duration,
    ) {
        let adopting = self.adopt(registry, hold.clone(), about, every);
        if tokio::time::timeout(ADOPT_WITHIN, adopting).await.is_err() {
            tracing::warn!(task = %hold.task_id, "push: adopting a task did not finish; handed back");
            self.push.shared.watched.remove(&hold.task_id);
            hold.abandon().await;
        }
    }

    /// Follows one adopted task (`about`: what it is; `seen`: the last version notified),
    /// polling an upstream that cannot stream `every` so long.
    async fn adopt(
        &self,
        registry: &crate::agents::Registry,
        hold: Hold,
        (about, seen): (&str, u64),
        every: Duration,
    ) {
        let id = hold.task_id.clone();
        let shared = self.push.shared.clone();
        let followed = serde_json::from_str::<Followed>(about).ok();
        let Some((agent, about)) =
            followed.and_then(|f| Some((super::agent_named(registry, &f.agent)?, f)))
        else {
            tracing::warn!(task = %id, "push: a task to adopt names no agent here; not followed");
            return hold.release().await;
        };
        let caller = super::checked_elsewhere(about.owner, about.anonymous);
        if shared.watched.insert(id.clone(), ()).is_some() {
            // Its follower here goes on (a config made here after it handed the task over
            // claimed it back): the hold is this replica's again, one follower is enough.
            tracing::debug!(task = %id, "push: adopted a task this replica follows already");
            return;
        }
        tracing::debug!(task = %id, after = seen, "push: adopting a task: reading it");
        // What the resumed events apply to (a subscription starts with the task itself).
        let known = match seen {
            0 => None,
            _ => self.get(&agent, &caller, &id, None).await.ok(),
        };
        let items = match seen {
            0 => self.subscribe(&agent, &caller, &id).await,
            version => {
                let from = ResumeFrom {
                    task_id: id.clone(),
                    version,
                };
                self.resume(&agent, &caller, &from).await
            }
        };
        let remote = agent.remote().cloned();
        tracing::info!(task = %id, after = seen, "push: following a task a replica that died followed");
        match (items, remote) {
            (Ok(items), remote) => {
                let fallback = remote.map(|r| (r, every));
                tokio::spawn(shared.follow(id, (items, known, seen), fallback, Some(hold)));
            }
            (Err(e), remote) => match (self.get(&agent, &caller, &id, None).await, remote) {
                // Finished before anything of it was notified (its replica died, and the
                // reaper failed it): that is the one notification left. (Past a version
                // noted, the resumed log holds the end.)
                (Ok(task), _) if task.status.state.is_terminal() => {
                    let item = StreamItem::Task(task.clone());
                    let finals = shared.notify(&id, &item, &task).await;
                    tokio::spawn(async move {
                        finals.delivered().await;
                        shared.done(&id, Some(hold)).await;
                    });
                }
                (Ok(task), Some(remote)) => {
                    tokio::spawn(shared.poll(id, remote, task, every, Some(hold)));
                }
                // The store away (restarting): adopted again once it is back.
                (Err(GatewayError::StoreUnavailable(_)), _) => {
                    tracing::info!(task = %id, "push: the store is away; an adopted task is handed back");
                    shared.watched.remove(&id);
                    hold.abandon().await;
                }
                _ => {
                    // Gone from the store, or unreadable: nothing more will come.
                    tracing::warn!(task = %id, error = %e, "push: cannot follow an adopted task");
                    shared.done(&id, Some(hold)).await;
                }
            },
        }
    }

    /// Tells the configs of tasks a restart failed (their work did not survive) so: the
    /// task's final state, like any other.
    pub(crate) async fn notify_lost(&self, ids: Vec<String>) {
        if !self.push.enabled() {
            return;
        }
        for id in ids {
            if let Some((task, _)) = self.tasks.inspect_any(&id) {
                self.push
                    .shared
                    .notify(&id, &StreamItem::Task(task.clone()), &task)
                    .await;
            }
        }
    }

    /// Registers the gateway's own webhook for `task` with its upstream.
    async fn relay(
        &self,
        remote: &Arc<RemoteAgent>,
        base: &str,
        task: &Task,
        hold: Option<Hold>,
    ) -> Result<(), (GatewayError, Option<Hold>)> {
        let secret = uuid::Uuid::new_v4().simple().to_string();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let url = format!("{base}{RELAY_PATH}/{secret}");
        let relay = Arc::new(Relay {
            task_id: task.id.clone(),
            token: token.clone(),
            remote: remote.clone(),
            task: tokio::sync::Mutex::new(Some(task.clone())),
            hold: std::sync::Mutex::new(hold),
        });
        self.push
            .shared
            .relays
            .insert(secret.clone(), relay.clone());
        let registered = remote.register_webhook(&task.id, &url, &token).await;
        registered.map_err(|e| {
            self.push.shared.relays.remove(&secret);
            let hold = relay.hold.lock().ok().and_then(|mut h| h.take());
            (e, hold)
        })
    }

    /// A notification an upstream pushed to the gateway's webhook `secret`, with the
    /// token it came with: relayed to the task's configs.
    pub(crate) async fn push_arrived(
        &self,
        secret: &str,
        token: Option<&str>,
        body: &[u8],
    ) -> Result<(), GatewayError> {
        let shared = &self.push.shared;
        let relay = shared
            .relays
            .get(secret)
            .map(|r| r.clone())
            .ok_or_else(|| GatewayError::TaskNotFound("no task is notified here".into()))?;
        let good = token.is_some_and(|t| bool::from(t.as_bytes().ct_eq(relay.token.as_bytes())));
        if !good {
            return Err(GatewayError::Unauthenticated {
                message: "the notification token is missing or wrong".into(),
                challenge: "A2A-Notification-Token".into(),
            });
        }
        let item = relay.remote.read_pushed(body)?;
        let about = match &item {
            StreamItem::Task(t) => Some(&t.id),
            StreamItem::StatusUpdate(s) => Some(&s.task_id),
            StreamItem::ArtifactUpdate(a) => Some(&a.task_id),
            StreamItem::Message(_) => None,
        };
        if about.is_some_and(|id| *id != relay.task_id) {
            return Err(GatewayError::InvalidParams(
                "the notification is about another task than this webhook's".into(),
            ));
        }
        // Held while the update is queued: notifications arriving at once keep their order.
        let mut task = relay.task.lock().await;
        let Some(now) = item.fold_into(&mut task) else {
            return Ok(());
        };
        shared.notify(&relay.task_id, &item, now).await;
        if now.status.state.is_terminal() {
            shared.relays.remove(secret);
            let hold = relay.hold.lock().ok().and_then(|mut h| h.take());
            shared.done(&relay.task_id, hold).await;
        }
        Ok(())
    }
}

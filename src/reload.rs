//! Hot reload: the configuration is read again (on SIGHUP, or when a watched file
//! changes), validated whole, and if valid put in force as one snapshot ([`Live`]); if not,
//! the running one keeps serving and every error is logged with its file:line:col.
//!
//! Agents whose definition did not change are carried over as they are (their actor,
//! upstream state and running processes); changed ones are built anew and take new work at
//! once, while their old instance finishes what it had. A removed agent takes no new work;
//! its tasks stay readable on the shared endpoints until evicted, and its work still
//! running after the grace period is stopped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::agents::{ActorLimits, Agent, CardChanges, Registry};
use crate::config::{AgentDef, GatewayConfig};
use crate::http::{AppState, Live};
use crate::setup::{Ready, Source};
use crate::telemetry::Metrics;

/// The agents of `defs`, reusing from `previous` every agent whose definition and limits
/// are unchanged. Also returns what changed.
pub(crate) fn registry(
    defs: &[AgentDef],
    gateway: &GatewayConfig,
    previous: Option<&Registry>,
    card_changes: &CardChanges,
    metrics: &Metrics,
) -> Result<(Registry, Changes), String> {
    let limits = &gateway.limits;
    let mut changes = Changes::default();
    let mut agents = Vec::with_capacity(defs.len());
    for def in defs {
        let actor_limits = ActorLimits {
            mailbox: def.mailbox.unwrap_or(limits.agent_mailbox),
            max_concurrency: def.max_concurrency.unwrap_or(limits.agent_max_concurrency),
        };
        let before = previous.and_then(|r| r.get(&def.name));
        if let Some(agent) = before.filter(|a| a.def == *def && a.actor.limits() == actor_limits) {
            agents.push(agent.clone());
            continue;
        }
        let name = def.name.clone();
        if let Some(before) = before {
            changes.changed.push(name.clone());
            if let Some(revised) = before.revised(def.clone(), actor_limits) {
                agents.push(Arc::new(revised));
                continue;
            }
            // A new backend: the old instance finishes its work (stopped at shutdown).
            changes.superseded.push(before.clone());
        } else {
            changes.added.push(name.clone());
        }
        let agent = Arc::new(
            Agent::new(def.clone(), actor_limits, card_changes, metrics)
                .map_err(|e| format!("agent {name}: {e}"))?,
        );
        if let Some(remote) = agent.remote() {
            changes.new_remotes.push(remote.clone());
        }
        agents.push(agent);
    }
    let kept: std::collections::HashSet<&str, ahash::RandomState> =
        defs.iter().map(|d| d.name.as_str()).collect();
    let mut retired: HashMap<Arc<str>, Arc<Agent>, ahash::RandomState> = HashMap::default();
    if let Some(previous) = previous {
        for agent in previous.iter() {
            if !kept.contains(&*agent.name) {
                changes.removed.push(agent.def.name.clone());
                // Upstream agents keep their tasks upstream: nothing here to read.
                if agent.remote().is_none() {
                    retired.insert(agent.name.clone(), agent.clone());
                }
            }
        }
        // Agents removed earlier stay readable, unless one of the same name is back.
        for agent in previous.retired() {
            if !kept.contains(&*agent.name) {
                retired
                    .entry(agent.name.clone())
                    .or_insert_with(|| agent.clone());
            }
        }
    }
    let registry = Registry::from_shared(
        agents,
        retired,
        gateway.default_agent_name().map(str::to_string),
        card_changes.clone(),
    );
    Ok((registry, changes))
}

/// What a reload changed among the agents.
#[derive(Default)]
pub(crate) struct Changes {
    pub(crate) added: Vec<String>,
    pub(crate) changed: Vec<String>,
    pub(crate) removed: Vec<String>,
    /// Instances replaced by ones with a new backend.
    pub(crate) superseded: Vec<Arc<Agent>>,
    /// Upstream agents built anew, whose cards are fetched before they take calls.
    pub(crate) new_remotes: Vec<Arc<crate::agents::RemoteAgent>>,
}

/// A short fingerprint of a configuration, for the `a2a_config_info` metric and the log.
pub(crate) fn fingerprint(gateway: &GatewayConfig, agents: &[AgentDef]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{gateway:?}{agents:?}").as_bytes());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// The live parts of `ready` over `registry`; `fingerprint` is the configuration's.
pub(crate) fn live(
    ready: Ready,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    fingerprint: String,
) -> Live {
    let Ready {
        settings,
        auth,
        rates,
        rules,
        ..
    } = ready;
    Live::new(
        settings.gateway,
        auth,
        rates,
        rules,
        registry,
        metrics,
        fingerprint,
    )
}

/// Reads the configuration again and puts it in force if it is valid. `force`: also when
/// it reads the same (SIGHUP: a key file may have changed under the same settings).
pub(crate) async fn reload(state: &AppState, source: &Source, why: &str, force: bool) {
    let loaded = {
        let source = source.clone();
        // Reading files (and key files) blocks: off the workers.
        tokio::task::spawn_blocking(move || source.load()).await
    };
    match loaded {
        Ok(Ok(ready)) => apply(state, ready, why, force).await,
        Ok(Err(diags)) => {
            state.metrics.reload(false);
            for d in &diags.0 {
                tracing::error!(error = %d, "reload refused; the running configuration stays");
            }
            tracing::error!(
                errors = diags.0.len(),
                trigger = why,
                "configuration invalid: not reloaded"
            );
        }
        Err(e) => {
            state.metrics.reload(false);
            tracing::error!(error = %e, "reload failed");
        }
    }
}

/// Puts a valid configuration in force. `[server]` is read once, at start, and stays as
/// it was. New upstream agents' cards and new JWKS are fetched first (in parallel, bounded
/// by their timeouts), so no call meets an agent or a key set that is not ready.
pub(crate) async fn apply(state: &AppState, mut ready: Ready, why: &str, force: bool) {
    let old = state.live();
    if old.config.server != ready.settings.gateway.server {
        tracing::warn!("[server] changed: it takes effect at the next restart");
    }
    ready.settings.gateway.server = old.config.server.clone();
    let hash = fingerprint(&ready.settings.gateway, &ready.settings.agents);
    if hash == old.fingerprint && !force {
        state.metrics.reload(true);
        tracing::debug!(trigger = why, "configuration unchanged");
        return;
    }
    warn_about_restart_only(&old.config, &ready.settings.gateway);
    let card_changes = old.registry.card_changes().clone();
    let built = registry(
        &ready.settings.agents,
        &ready.settings.gateway,
        Some(&old.registry),
        &card_changes,
        &state.metrics,
    );
    let (registry, changes) = match built {
        Ok(r) => r,
        Err(e) => {
            state.metrics.reload(false);
            tracing::error!(error = %e, "reload refused; the running configuration stays");
            return;
        }
    };
    let registry = Arc::new(registry);
    let grace = Duration::from_secs(ready.settings.gateway.server.shutdown_grace_secs);
    let jwks = ready.auth.jwks_sources();
    let client = reqwest::Client::new();
    let first_cards = changes
        .new_remotes
        .iter()
        .cloned()
        .map(crate::agents::RemoteAgent::first_refresh);
    let (keep_cards_fresh, _) = futures_util::future::join(
        futures_util::future::join_all(first_cards),
        futures_util::future::join_all(jwks.iter().map(|s| s.fetch(&client))),
    )
    .await;
    let live = live(ready, registry.clone(), state.metrics.clone(), hash.clone());
    state.live.store(Arc::new(live));
    state.metrics.reload(true);
    state.metrics.config_loaded(&hash);
    for keep_fresh in keep_cards_fresh {
        tokio::spawn(keep_fresh);
    }
    for source in jwks {
        tokio::spawn(source.keep_fresh());
    }
    state.supersede(changes.superseded);
    for name in &changes.removed {
        state.metrics.agent_removed(name);
        if let Some(agent) = old.registry.get(name).cloned() {
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                agent.stop_work();
            });
        }
    }
    tracing::info!(
        trigger = why,
        config = %hash,
        agents = registry.iter().count(),
        added = ?changes.added,
        changed = ?changes.changed,
        removed = ?changes.removed,
        "configuration reloaded"
    );
}

/// Settings read once at start: a reload that changes them says they wait for a restart.
fn warn_about_restart_only(old: &GatewayConfig, new: &GatewayConfig) {
    let mut pending = Vec::new();
    if old.metrics != new.metrics {
        pending.push("[metrics]");
    }
    if old.push != new.push {
        pending.push("[push]");
    }
    if old.store != new.store {
        pending.push("[store]");
    }
    let (a, b) = (&old.limits, &new.limits);
    if a.max_connections != b.max_connections
        || a.interrupted_ttl_secs != b.interrupted_ttl_secs
        || a.max_connections_per_ip != b.max_connections_per_ip
        || a.header_timeout_secs != b.header_timeout_secs
        || a.max_open_streams != b.max_open_streams
        || a.max_tasks != b.max_tasks
        || a.max_unfinished_tasks_per_caller != b.max_unfinished_tasks_per_caller
        || a.max_body_bytes != b.max_body_bytes
        || a.max_buffered_body_bytes != b.max_buffered_body_bytes
        || a.body_timeout_secs != b.body_timeout_secs
        || a.body_min_bytes_per_sec != b.body_min_bytes_per_sec
    {
        pending.push("[limits] (connections, bodies, streams, task store, interrupted_ttl_secs)");
    }
    if !pending.is_empty() {
        tracing::warn!(
            sections = ?pending,
            "these settings changed and take effect at the next restart"
        );
    }
}

/// Reloads on SIGHUP and, when `watch` is on, when a watched file changes (debounced, so
/// an editor's or kubelet's burst of writes is one reload). Runs until the gateway stops.
pub(crate) async fn run(state: Arc<AppState>, source: Source, watch: bool) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<&'static str>(4);
    let _watcher = if watch {
        match watch_files(&source.watched(), tx.clone()) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the configuration files; SIGHUP still reloads");
                None
            }
        }
    } else {
        None
    };
    let hangups = async {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            tracing::warn!("cannot listen for SIGHUP");
            return std::future::pending::<()>().await;
        };
        while hup.recv().await.is_some() {
            let _ = tx.send("SIGHUP").await;
        }
    };
    let reloads = async {
        while let Some(why) = rx.recv().await {
            reload(&state, &source, why, why == "SIGHUP").await;
        }
    };
    tokio::join!(hangups, reloads);
}

type Debouncer =
    notify_debouncer_mini::Debouncer<notify_debouncer_mini::notify::RecommendedWatcher>;

/// Watches the gateway file's directory and the agents directory (a file replaced by
/// rename, as editors and kubelet's ConfigMap updates do, is seen this way).
fn watch_files(
    paths: &[PathBuf],
    tx: tokio::sync::mpsc::Sender<&'static str>,
) -> Result<Debouncer, String> {
    use notify_debouncer_mini::notify::RecursiveMode;
    // Absolute, not canonical: a ConfigMap's files are symlinks that move on every update.
    let watched: Vec<PathBuf> = paths
        .iter()
        .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
        .collect();
    let relevant = watched.clone();
    let mut debouncer = notify_debouncer_mini::new_debouncer(
        Duration::from_millis(500),
        move |events: notify_debouncer_mini::DebounceEventResult| {
            let Ok(events) = events else { return };
            let touches = events.iter().any(|e| {
                relevant
                    .iter()
                    .any(|w| e.path.starts_with(w) || w.parent().is_some_and(|d| e.path == d))
                    || e.path.file_name().is_some_and(|n| n == "..data")
            });
            if touches {
                let _ = tx.try_send("file change");
            }
        },
    )
    .map_err(|e| e.to_string())?;
    for path in &watched {
        // A file is watched through its directory, which survives the file's replacement.
        let dir = if path.is_dir() {
            path.clone()
        } else {
            path.parent()
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."))
        };
        debouncer
            .watcher()
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        // And the file itself: a file bind-mounted into a container is written in place,
        // which its directory inside the container does not see.
        if path.is_file() {
            let _ = debouncer.watcher().watch(path, RecursiveMode::NonRecursive);
        }
    }
    Ok(debouncer)
}

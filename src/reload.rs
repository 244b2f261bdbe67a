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
use std::path::{Path, PathBuf};
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

/// A short fingerprint of a configuration, for the `a2a_config_info` metric and the log:
/// its settings and the contents of the files it names (`files`, see [`digest`]), so a new
/// key under the same settings is a new configuration.
pub(crate) fn fingerprint(gateway: &GatewayConfig, agents: &[AgentDef], files: &Digest) -> String {
    use sha2::{Digest as _, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(format!("{gateway:?}{agents:?}").as_bytes());
    hasher.update(files);
    hasher
        .finalize()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What a set of files holds: each path with its permissions and contents (or that it is
/// missing), in the order given.
pub(crate) type Digest = [u8; 32];

pub(crate) fn digest<'a>(files: impl IntoIterator<Item = &'a Path>) -> Digest {
    use sha2::{Digest as _, Sha256};
    use std::os::unix::fs::PermissionsExt;
    let mut hasher = Sha256::new();
    for file in files {
        hasher.update(file.as_os_str().as_encoded_bytes());
        match (std::fs::metadata(file), std::fs::read(file)) {
            (Ok(meta), Ok(bytes)) => {
                hasher.update(meta.permissions().mode().to_le_bytes());
                hasher.update((bytes.len() as u64).to_le_bytes());
                hasher.update(&bytes);
            }
            _ => hasher.update(b"\0missing"),
        }
    }
    hasher.finalize().into()
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
        policies,
        admin,
        ..
    } = ready;
    let parts = crate::http::Parts {
        auth,
        rates,
        rules,
        policies,
        admin,
    };
    Live::new(settings.gateway, parts, registry, metrics, fingerprint)
}

/// Reads the configuration again and puts it in force if it is valid. `force`: also when
/// it reads the same (SIGHUP: a key file may have changed under the same settings).
/// Returns the files the configuration now in force names, when a new one was read.
pub(crate) async fn reload(
    state: &AppState,
    source: &Source,
    why: &str,
    force: bool,
) -> Option<Vec<PathBuf>> {
    if let Some(certificate) = &state.certificate {
        // Its files are among the watched ones; a broken one keeps the certificate in use.
        if let Err(e) = certificate.reload() {
            tracing::error!(error = %e, "TLS certificate not reloaded: the one in use stays");
        }
    }
    let loaded = {
        let source = source.clone();
        // Reading files (and key files) blocks: off the workers.
        let runtime: Vec<AgentDef> = (state.live().registry.iter())
            .filter(|a| a.def.runtime)
            .map(|a| a.def.clone())
            .collect();
        tokio::task::spawn_blocking(move || {
            source.load_with(&runtime).map(|ready| {
                let named = ready.settings.named_files();
                let files = digest(named.iter().map(PathBuf::as_path));
                (ready, named, files)
            })
        })
        .await
    };
    match loaded {
        Ok(Ok((ready, named, files))) => {
            for w in &ready.warnings {
                tracing::warn!(warning = %w, "configuration");
            }
            apply(state, ready, &files, why, force)
                .await
                .then_some(named)
        }
        Ok(Err(diags)) => {
            state.metrics.reload("invalid");
            for d in &diags.0 {
                tracing::error!(error = %d, "reload refused; the running configuration stays");
            }
            tracing::error!(
                errors = diags.0.len(),
                trigger = why,
                "configuration invalid: not reloaded"
            );
            None
        }
        Err(e) => {
            state.metrics.reload("invalid");
            tracing::error!(error = %e, "reload failed");
            None
        }
    }
}

/// Puts a valid configuration in force (`files`: the digest of the files it names), and
/// says whether it did. `[server]` is read once, at start, and stays as it was. New
/// upstream agents' cards and new JWKS are fetched first (in parallel, bounded by their
/// timeouts), so no call meets an agent or a key set that is not ready.
pub(crate) async fn apply(
    state: &AppState,
    mut ready: Ready,
    files: &Digest,
    why: &str,
    force: bool,
) -> bool {
    let old = state.live();
    if old.config.server != ready.settings.gateway.server {
        tracing::warn!("[server] changed: it takes effect at the next restart");
    }
    ready.settings.gateway.server = old.config.server.clone();
    let hash = fingerprint(&ready.settings.gateway, &ready.settings.agents, files);
    if hash == old.fingerprint && !force {
        state.metrics.reload("unchanged");
        tracing::debug!(trigger = why, "files changed, the configuration did not");
        return true;
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
            state.metrics.reload("invalid");
            tracing::error!(error = %e, "reload refused; the running configuration stays");
            return false;
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
    state.usage.configure(&ready.settings.gateway);
    let live = live(ready, registry.clone(), state.metrics.clone(), hash.clone());
    state.live.store(Arc::new(live));
    state.reloaded.send_modify(|n| *n += 1);
    state.metrics.reload("ok");
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
    true
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

/// Reloads on SIGHUP and, when `watch` is on, when a file of the configuration changes
/// (see [`ConfigFiles`]). File events are gathered for a moment, so an editor's or
/// kubelet's burst of writes is one reload, and files that read as they did at the last
/// attempt are not read as a configuration again: opening or reading a file, the store
/// writing beside it, or a broken file's repeated events cost one digest, no reload and no
/// log line. Runs until the gateway stops.
pub(crate) async fn run(state: Arc<AppState>, source: Source, listener: Listener) {
    let Listener {
        tx,
        mut rx,
        files,
        mut watcher,
        hangup,
        mut seen,
    } = listener;
    let hangups = async {
        let Some(mut hup) = hangup else {
            return std::future::pending::<()>().await;
        };
        while hup.recv().await.is_some() {
            let _ = tx.send(SIGHUP).await;
        }
    };
    let reloads = async {
        while let Some(first) = rx.recv().await {
            let mut force = first == SIGHUP;
            if !force {
                tokio::time::sleep(GATHER_EVENTS).await;
            }
            while let Ok(more) = rx.try_recv() {
                force |= more == SIGHUP;
            }
            let now = files_digest(&files).await;
            if !force && now == seen {
                tracing::trace!("file events, no change");
                continue;
            }
            seen = now;
            let why = if force { SIGHUP } else { "file change" };
            if let Some(named) = reload(&state, &source, why, force).await {
                // The lock is not held while watching: the watcher's thread takes it to
                // read each event, and `watch` waits on that thread.
                let watched = {
                    let mut files = files
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    files.named = absolute_all(named);
                    files.watched()
                };
                if let Some(w) = watcher.as_mut() {
                    w.cover(watched);
                }
            }
        }
    };
    tokio::join!(hangups, reloads);
}

const SIGHUP: &str = "SIGHUP";

/// How long file events are gathered into one reload.
const GATHER_EVENTS: Duration = Duration::from_millis(300);

/// What asks for a reload, listening from before the gateway says it serves: SIGHUP, and
/// the watcher's file events, with the files' digest as they were when listening began.
/// A SIGHUP or an edit at any moment after [`listen`] returns is kept until [`run`] reads it.
pub(crate) struct Listener {
    tx: tokio::sync::mpsc::Sender<&'static str>,
    rx: tokio::sync::mpsc::Receiver<&'static str>,
    files: Arc<std::sync::RwLock<ConfigFiles>>,
    watcher: Option<FileWatcher>,
    hangup: Option<tokio::signal::unix::Signal>,
    seen: Option<Digest>,
}

/// Starts listening (in a Tokio runtime): SIGHUP first (its default action would end the
/// process), then the file watcher when `watch` is on, then the files' digest: an edit
/// made after the digest was read is an event the watcher already reports.
pub(crate) fn listen(source: &Source, named: Vec<PathBuf>, watch: bool) -> Listener {
    let hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hup) => Some(hup),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP");
            None
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<&'static str>(8);
    let files = Arc::new(std::sync::RwLock::new(ConfigFiles::new(source, named)));
    let watcher = match watch {
        true => match FileWatcher::start(files.clone(), tx.clone()) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the configuration files; SIGHUP still reloads");
                None
            }
        },
        false => None,
    };
    let seen = Some(
        files
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .digest(),
    );
    Listener {
        tx,
        rx,
        files,
        watcher,
        hangup,
        seen,
    }
}

async fn files_digest(files: &Arc<std::sync::RwLock<ConfigFiles>>) -> Option<Digest> {
    let files = files.clone();
    tokio::task::spawn_blocking(move || {
        files
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .digest()
    })
    .await
    .ok()
}

/// The files a configuration is read from: the gateway file, the agent files (every
/// `*.toml` directly in the agents directory) and the files they name. Paths are absolute,
/// not canonical: a ConfigMap's files are symlinks that move on every update.
pub(crate) struct ConfigFiles {
    gateway: Option<PathBuf>,
    agents_dir: PathBuf,
    named: Vec<PathBuf>,
}

impl ConfigFiles {
    pub(crate) fn new(source: &Source, named: Vec<PathBuf>) -> ConfigFiles {
        let gateway = match &source.config {
            Some(file) => Some(file.clone()),
            None => Some(PathBuf::from("gateway.toml")).filter(|p| p.exists()),
        };
        ConfigFiles {
            gateway: gateway.map(|p| absolute(&p)),
            agents_dir: absolute(&source.agents_dir),
            named: absolute_all(named),
        }
    }

    /// Whether an event on `path` may change the configuration. A kubelet update swaps the
    /// `..data` link of the mounted directory.
    pub(crate) fn concern(&self, path: &Path) -> bool {
        self.gateway.as_deref() == Some(path)
            || self.named.iter().any(|f| f == path)
            || path == self.agents_dir
            || (path.parent() == Some(self.agents_dir.as_path())
                && (is_agent_file(path) || path.file_name().is_some_and(|n| n == "..data")))
            || (path.file_name().is_some_and(|n| n == "..data")
                && self.gateway.as_deref().and_then(Path::parent) == path.parent())
    }

    /// The directories whose entries are watched (a file replaced by rename, as editors
    /// do, is seen there), and the files watched themselves (a file bind-mounted into a
    /// container is written in place, which its directory there does not see).
    fn watched(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let files: Vec<PathBuf> = self.gateway.iter().chain(&self.named).cloned().collect();
        let mut dirs: Vec<PathBuf> = files
            .iter()
            .filter_map(|f| f.parent().map(Path::to_path_buf))
            .collect();
        dirs.push(self.agents_dir.clone());
        dirs.sort();
        dirs.dedup();
        (dirs, files)
    }

    fn digest(&self) -> Digest {
        let mut agent_files: Vec<PathBuf> = std::fs::read_dir(&self.agents_dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| is_agent_file(p))
                    .collect()
            })
            .unwrap_or_default();
        agent_files.sort();
        let all = self.gateway.iter().chain(&agent_files).chain(&self.named);
        digest(all.map(PathBuf::as_path))
    }
}

fn is_agent_file(path: &Path) -> bool {
    path.extension().is_some_and(|x| x == "toml")
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

fn absolute_all(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    paths.iter().map(|p| absolute(p)).collect()
}

/// inotify (or the platform's watcher) over the directories and files of [`ConfigFiles`],
/// passing on only events that change a file it holds: creates, writes, removes, renames
/// and permission changes, never opens or reads (which the watcher reports too, and which
/// each reload would otherwise cause itself).
struct FileWatcher {
    watcher: notify::RecommendedWatcher,
    covered: std::collections::HashSet<PathBuf>,
}

impl FileWatcher {
    fn start(
        files: Arc<std::sync::RwLock<ConfigFiles>>,
        tx: tokio::sync::mpsc::Sender<&'static str>,
    ) -> Result<FileWatcher, String> {
        let relevant = files.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if !changes_a_file(&event.kind) {
                return;
            }
            let files = relevant
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if event.paths.iter().any(|p| files.concern(p)) {
                let _ = tx.try_send("file change");
            }
        })
        .map_err(|e| e.to_string())?;
        let mut this = FileWatcher {
            watcher,
            covered: Default::default(),
        };
        let (dirs, named) = files
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .watched();
        for dir in &dirs {
            use notify::Watcher;
            this.watcher
                .watch(dir, notify::RecursiveMode::NonRecursive)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            this.covered.insert(dir.clone());
        }
        this.cover((dirs, named));
        Ok(this)
    }

    /// Watches the directories and files given that are not watched yet (a reload may
    /// name new files).
    fn cover(&mut self, (dirs, files): (Vec<PathBuf>, Vec<PathBuf>)) {
        use notify::Watcher;
        for path in dirs
            .into_iter()
            .chain(files.into_iter().filter(|f| f.is_file()))
        {
            if self.covered.contains(&path) {
                continue;
            }
            match self
                .watcher
                .watch(&path, notify::RecursiveMode::NonRecursive)
            {
                Ok(()) => {
                    self.covered.insert(path);
                }
                Err(e) => tracing::debug!(path = %path.display(), error = %e, "not watched"),
            }
        }
    }
}

/// Whether an event kind may have changed what a file holds.
fn changes_a_file(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        EventKind::Any
        | EventKind::Create(_)
        | EventKind::Modify(_)
        | EventKind::Remove(_)
        | EventKind::Other => true,
    }
}

/// Puts the admin API's entries in force: the runtime keys (the ring every request reads),
/// and the enabled runtime agents beside the file agents, through the same path as a
/// reload (cards, the aggregated card, MCP tools and metrics follow). Returns the version
/// of the entries put in force.
pub(crate) async fn apply_control(state: &AppState) -> Result<u64, String> {
    use crate::store::control::Kind;
    let control = &state.store.control;
    let version = control.version().await?;
    let keys: Vec<crate::auth::KeyRecord> = (control.list(Kind::Key).await?.iter())
        .filter_map(|e| match serde_json::from_str(&e.value) {
            Ok(record) => Some(record),
            Err(err) => {
                tracing::warn!(key = %e.name, error = %err, "a stored runtime key does not read; it is left out");
                None
            }
        })
        .collect();
    let old = state.keys.ring.load();
    (state.keys.ring).store(Arc::new(crate::auth::KeyRing::build(&keys, &old)));
    let budgets = (control.list(Kind::Budget).await?.iter())
        .filter_map(|e| match serde_json::from_str::<crate::config::BudgetConfig>(&e.value) {
            Ok(mut budget) => {
                budget.id = e.name.clone();
                Some(budget)
            }
            Err(err) => {
                tracing::warn!(budget = %e.name, error = %err, "a stored budget does not read; it is not in force");
                None
            }
        })
        .collect();
    state.usage.set_runtime_budgets(budgets);
    let live = state.live();
    let dir = state.gateway_file.parent().unwrap_or(Path::new("."));
    let open_host = live.config.admin.allow_host_access;
    let mut runtime = Vec::new();
    for e in control.list(Kind::Agent).await? {
        let record = serde_json::from_str::<crate::config::AgentRecord>(&e.value);
        let agent = record
            .map_err(|err| err.to_string())
            .and_then(|r| match r.enabled {
                true => r.agent(&e.name, dir, open_host).map(Some).map_err(|errs| {
                    (errs.iter())
                        .map(|f| format!("{}: {}", f.field, f.message))
                        .collect::<Vec<_>>()
                        .join("; ")
                }),
                false => Ok(None),
            });
        match agent {
            Ok(Some(agent)) => runtime.push(agent),
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(agent = %e.name, error = %err, "a stored runtime agent does not check; it is not served")
            }
        }
    }
    let serving: Vec<&AgentDef> = (live.registry.iter())
        .filter(|a| a.def.runtime)
        .map(|a| &a.def)
        .collect();
    if serving.len() == runtime.len() && serving.iter().zip(&runtime).all(|(a, b)| **a == *b) {
        return Ok(version);
    }
    let mut settings = crate::config::Settings {
        gateway: live.config.clone(),
        agents: (live.registry.iter())
            .filter(|a| !a.def.runtime)
            .map(|a| a.def.clone())
            .collect(),
        gateway_file: state.gateway_file.clone(),
    };
    crate::setup::add_runtime(&mut settings, &runtime);
    let named = settings.named_files();
    let files = digest(named.iter().map(PathBuf::as_path));
    let ready = crate::setup::build(settings).map_err(|d| d.to_string())?;
    match apply(state, ready, &files, "admin change", false).await {
        true => Ok(version),
        false => Err("the runtime agents were not put in force (see the log)".into()),
    }
}

/// Keeps the admin API's entries in force on this replica: applies them whenever their
/// version moves (polled twice a second: a change made through another replica is in
/// force here within a second or so) or this replica's admin API says it changed them.
/// What is in force is announced on `state.control_applied`.
pub(crate) async fn follow_control(state: std::sync::Weak<AppState>) {
    let mut applied: Option<u64> = None;
    loop {
        let Some(state) = state.upgrade() else {
            return;
        };
        let seen = state.store.control.version().await;
        if seen.as_ref().ok() != applied.as_ref() {
            match apply_control(&state).await {
                Ok(version) => {
                    applied = Some(version);
                    state.control_applied.send_replace(version);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the admin API's entries were not put in force; trying again")
                }
            }
        }
        let wake = state.control_wake.clone();
        drop(state);
        let _ = tokio::time::timeout(Duration::from_millis(500), wake.notified()).await;
    }
}

/// Appends every refusal of a runtime key to the audit log, while the gateway runs.
pub(crate) async fn audit_key_refusals(state: std::sync::Weak<AppState>) {
    let Some(mut refusals) = state
        .upgrade()
        .and_then(|s| s.key_refusals.lock().ok()?.take())
    else {
        return;
    };
    while let Some(r) = refusals.recv().await {
        let Some(state) = state.upgrade() else {
            return;
        };
        let entry = crate::store::control::AuditEntry {
            seq: None,
            at: r.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            actor: format!("key:{}", r.id),
            action: "key.refused".into(),
            target: format!("key:{}", r.id),
            from: r.from.map(|ip| ip.to_string()),
            before: None,
            after: None,
            detail: Some(r.reason),
        };
        if let Err(e) = state.store.control.record(&entry).await {
            tracing::warn!(error = %e, "a runtime key's refusal was not audited");
        }
    }
}

/// How often each replica writes when its runtime keys were last used.
const KEY_USE_EVERY: Duration = Duration::from_secs(10);

/// Writes when the runtime keys were last used here, every [`KEY_USE_EVERY`] (a kill -9
/// loses at most that much of it), while the gateway runs.
pub(crate) async fn record_key_use(state: std::sync::Weak<AppState>) {
    let mut since = 0;
    loop {
        tokio::time::sleep(KEY_USE_EVERY).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        let used = state.keys.ring.load().used_since(since);
        if used.is_empty() {
            continue;
        }
        let newest = used.iter().map(|(_, at)| *at).max().unwrap_or(since);
        match state.store.control.used(used).await {
            Ok(()) => since = newest,
            Err(e) => tracing::debug!(error = %e, "keys' last use not written; tried again"),
        }
    }
}

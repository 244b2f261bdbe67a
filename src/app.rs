//! Building and running the server; shared by `main` and the tests, which bind port 0.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_service::{IntoServiceFactory, ServiceFactoryExt};
use actix_web::dev::{AppConfig, Extensions, Server, ServerHandle};
use actix_web::{web, App};

use crate::agents::RemoteAgent;
use crate::config::Settings;
use crate::http::{routes, AppState, Lifecycle};
use crate::limits::connections::{ConnectionLimits, Gate};
use crate::limits::StreamGauge;
use crate::service::A2aService;
use crate::setup::Ready;
use crate::signing::Signer;
use crate::store::Table;
use crate::tasks::{MemoryTaskStore, Tasks};
use crate::telemetry::Metrics;

pub struct Application {
    port: u16,
    metrics_port: Option<u16>,
    grpc_port: Option<u16>,
    /// Where the admin API has a listener of its own (`[admin] listen`).
    admin_port: Option<u16>,
    server: Server,
    state: Arc<AppState>,
    /// Where the configuration was read from, and what listens for reloads of it (from
    /// before the gateway says it serves: a SIGHUP or an edit right after is not lost).
    source: Option<(crate::setup::Source, crate::reload::Listener)>,
}

/// Wires the agents, the task store and the service from the ready parts; also returns
/// the tasks a restart failed (their work was lost), whose configs are told so.
pub(crate) fn build_state(ready: Ready) -> std::io::Result<(AppState, Vec<String>)> {
    let gateway = &ready.settings.gateway;
    let limits = &gateway.limits;
    let metrics = Arc::new(Metrics::new(gateway.metrics.enabled));
    let named = ready.settings.named_files();
    let files = crate::reload::digest(named.iter().map(std::path::PathBuf::as_path));
    let hash = crate::reload::fingerprint(gateway, &ready.settings.agents, &files);
    let (registry, _) = crate::reload::registry(
        &ready.settings.agents,
        gateway,
        None,
        &crate::agents::CardChanges::default(),
        &metrics,
    )
    .map_err(std::io::Error::other)?;
    let stored_bytes = limits
        .max_stored_bytes
        .unwrap_or_else(crate::limits::default_stored_bytes);
    let memory = Arc::new(MemoryTaskStore::new(
        limits.max_tasks,
        usize::try_from(stored_bytes).unwrap_or(usize::MAX),
    ));
    let quota = crate::tasks::Quota {
        tasks: limits.max_unfinished_tasks_per_caller,
        bytes: usize::try_from(
            limits
                .max_unfinished_bytes_per_caller
                .unwrap_or(stored_bytes / 4),
        )
        .unwrap_or(usize::MAX),
    };
    let tasks = Arc::new(Tasks::new(memory.clone(), quota, metrics.clone()));
    let base = ready
        .settings
        .gateway_file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."))
        .to_path_buf();
    let (store, mut loaded) =
        crate::store::open(&gateway.store, &base, memory.clone()).map_err(std::io::Error::other)?;
    let (keys, key_refusals) = crate::auth::RuntimeKeys::new();
    let gateway_file = ready.settings.gateway_file.clone();
    if let Some(journal) = &store.journal {
        memory.write_behind(journal.clone());
        match &store.shared {
            Some(shared) => tasks.share(journal.clone(), shared.clone()),
            None => tasks.keep_events(journal.clone()),
        }
    }
    if let Some(journal) = store.answers_wait_for() {
        tasks.answers_wait_for(journal.clone());
    }
    let rows = std::mem::take(&mut loaded.tasks);
    let restored = rows.len();
    let failed = tasks
        .restore(rows, &|agent| {
            registry.get(agent).map_or("its work", |a| a.work())
        })
        .map_err(|e| std::io::Error::other(format!("store: {e}")))?;
    if store.journal.is_some() {
        tracing::info!(store = %store.described, tasks = restored, failed_for_lost_work = failed.len(), "store opened");
    }
    let contexts = crate::routing::ContextIndex::new(loaded.kept(Table::Contexts, &store));
    let owners = loaded.kept(Table::UpstreamOwners, &store);
    let legacy_names = loaded.kept(Table::LegacyNames, &store);
    let ledgers = loaded.kept(Table::Ledger, &store);
    let (push_signer, card_signer) = signers(gateway, &base)?;
    let tracing =
        crate::telemetry::Tracing::start(&gateway.telemetry).map_err(std::io::Error::other)?;
    let push = push_service(
        gateway,
        push_signer,
        loaded.kept(Table::PushConfigs, &store),
        &metrics,
        tracing.clone(),
    )?;
    let router = crate::routing::Router::new(tasks.clone(), contexts);
    let stream_limit = limits
        .max_open_streams
        .unwrap_or_else(crate::limits::default_stream_limit);
    let streams = StreamGauge::new(stream_limit);
    let bodies = crate::http::BodyLimits::new(limits);
    let connections = connection_limits(limits);
    metrics.config_loaded(&hash);
    let usage = Arc::new(crate::usage::Usage::new(
        gateway,
        store.control.clone(),
        store.shared.is_some(),
        store.journal.is_some(),
        metrics.clone(),
    ));
    tasks.count_usage(usage.clone());
    let live = crate::reload::live(ready, Arc::new(registry), metrics.clone(), hash);
    let state = AppState {
        service: A2aService::new(
            tasks,
            router.contexts().clone(),
            owners,
            legacy_names,
            ledgers,
            push,
        ),
        store,
        router,
        live: arc_swap::ArcSwap::from_pointee(live),
        streams,
        bodies,
        connections,
        cards: crate::http::CardCache::new(),
        metrics,
        lifecycle: Lifecycle::default(),
        superseded: Default::default(),
        grpc_port: None,
        http_port: 0,
        card_signer,
        certificate: None,
        tracing,
        reloaded: tokio::sync::watch::channel(0).0,
        mcp_sessions: Default::default(),
        keys,
        key_refusals: std::sync::Mutex::new(Some(key_refusals)),
        control_applied: tokio::sync::watch::channel(0).0,
        control_wake: Default::default(),
        gateway_file,
        usage,
    };
    Ok((state, failed))
}

/// The gateway's signing keys (files relative to the gateway file's directory `base`):
/// push notifications' (`[push]`'s file, else one made now), and cards' (`[cards]`'s file,
/// else the same key, so that one key is published unless two are asked for).
fn signers(
    gateway: &crate::config::GatewayConfig,
    base: &std::path::Path,
) -> std::io::Result<(Arc<Signer>, Arc<Signer>)> {
    let issuer = gateway.public_url().unwrap_or(&gateway.name).to_string();
    let load = |file: &Option<std::path::PathBuf>, setting| {
        let file = file.as_ref().map(|p| base.join(p));
        Signer::load(file.as_deref(), &issuer, setting)
            .map(Arc::new)
            .map_err(std::io::Error::other)
    };
    let push = load(&gateway.push.signing_key_file, "push.signing_key_file")?;
    let cards = match &gateway.cards.signing_key_file {
        Some(_) => load(&gateway.cards.signing_key_file, "cards.signing_key_file")?,
        None => push.clone(),
    };
    Ok((push, cards))
}

/// Push notifications as `[push]` asks: off, or on with the signing key and the base URL
/// of the gateway's own webhooks.
fn push_service(
    gateway: &crate::config::GatewayConfig,
    signer: Arc<Signer>,
    kept: crate::store::Kept,
    metrics: &Arc<Metrics>,
    tracing: Option<Arc<crate::telemetry::Tracing>>,
) -> std::io::Result<crate::service::push::Push> {
    let settings = &gateway.push;
    let public = gateway
        .public_url()
        .map(|u| u.trim_end_matches('/').to_string());
    let pusher = match settings.enabled {
        false => None,
        true => {
            let pusher = crate::push::Pusher::new(settings, signer, metrics.clone(), tracing)
                .map_err(std::io::Error::other)?;
            Some(Arc::new(pusher))
        }
    };
    let relay_url = settings.relay_url.clone().or(public);
    Ok(crate::service::push::Push::new(pusher, relay_url, kept))
}

/// Usage and budgets: what budgets spent before a restart read back, counts written
/// every `flush_interval_ms`, and budget alerts posted to their webhooks by the push
/// machinery (when it is on).
async fn start_usage(state: &AppState) {
    let usage = &state.usage;
    usage.load().await;
    tokio::spawn(crate::usage::Usage::keep_writing(Arc::downgrade(usage)));
    if let Some(pusher) = state.service.push().deliveries() {
        usage.on_alert(Box::new(move |alert| {
            let Some(url) = alert.webhook.clone() else {
                return;
            };
            let Ok(body) = serde_json::to_vec(&alert) else {
                return;
            };
            let target = crate::push::Target {
                task_id: format!("budget:{}", alert.budget),
                config_id: url.clone(),
                url,
                token: None,
                authorization: crate::push::Authorization::GatewayJwt,
            };
            let note = crate::push::Notification::new(body.into(), "application/json");
            pusher.enqueue(target, note);
        }));
    }
}

/// Fetches every upstream card once (in parallel, bounded by each agent's timeouts), then
/// keeps them fresh in the background. An unreachable upstream does not delay startup
/// beyond its connect timeout, and does not stop it.
async fn start_upstreams(state: &AppState) {
    let remotes: Vec<_> = state
        .live()
        .registry
        .iter()
        .filter_map(|a| a.remote().cloned())
        .collect();
    let first = remotes.into_iter().map(RemoteAgent::first_refresh);
    for refresh in futures_util::future::join_all(first).await {
        tokio::spawn(refresh);
    }
}

/// Plain HTTP where others can reach it: said once, at start.
fn warn_if_exposed(addr: std::net::SocketAddr) {
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "serving plain HTTP on a non-loopback address: traffic (credentials included) is unencrypted; set [server.tls] or put a TLS proxy in front");
    }
}

/// The connection caps and first-byte deadline of `[limits]`.
fn connection_limits(limits: &crate::config::Limits) -> Arc<ConnectionLimits> {
    let max = limits
        .max_connections
        .unwrap_or_else(crate::limits::default_connection_limit);
    let per_ip = limits.max_connections_per_ip.unwrap_or(max / 4);
    let first_byte = Duration::from_secs(limits.header_timeout_secs.max(1));
    ConnectionLimits::new(max, per_ip, first_byte)
}

/// Runs `chore` every `period` for as long as the gateway lives.
async fn every(period: Duration, state: std::sync::Weak<AppState>, chore: impl Fn(&AppState)) {
    loop {
        tokio::time::sleep(period).await;
        match state.upgrade() {
            Some(state) => chore(&state),
            None => return,
        }
    }
}

/// The gateway's housekeeping, each on its own timer:
/// - every minute, forget the rate-limit buckets of callers back at a full allowance;
/// - cancel the tasks left in input-required (or auth-required) past
///   `interrupted_ttl_secs`, checking a few times per period;
/// - delete finished tasks past the store's retention, a few times per period.
fn start_housekeeping(state: &Arc<AppState>) {
    let weak = || Arc::downgrade(state);
    tokio::spawn(every(Duration::from_secs(60), weak(), |s| {
        s.live().rates.prune();
    }));
    let ttl = Duration::from_secs(state.live().config.limits.interrupted_ttl_secs.max(1));
    let period = (ttl / 4).clamp(Duration::from_millis(250), Duration::from_secs(60));
    tokio::spawn(every(period, weak(), move |s| {
        let n = s.service.tasks().expire_interrupted(ttl);
        if n > 0 {
            tracing::info!(tasks = n, "canceled tasks left waiting for input");
        }
    }));
    if let Some(retention) = state.store.retention {
        let period = (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        tokio::spawn(every(period, weak(), move |s| {
            let n = s.service.tasks().prune(retention);
            if n > 0 {
                tracing::info!(
                    tasks = n,
                    "deleted finished tasks past the store's retention"
                );
            }
        }));
    }
}

/// Asks a shared store every second whether it answers, so readiness follows it (and its
/// connection comes back by itself when it does).
async fn watch_store(store: Arc<crate::store::Shared>) {
    loop {
        store.ping().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Answers the commands other replicas send about tasks this one runs (cancels and
/// follow-ups; see `service::replicas`). Runs on the main thread's local set: the service's
/// futures stay on their thread.
async fn serve_replica_commands(state: std::sync::Weak<AppState>) {
    use futures_util::StreamExt;
    loop {
        let Some(store) = state.upgrade().and_then(|s| s.store.shared.clone()) else {
            return;
        };
        let mut messages = match store.commands().await {
            Ok(m) => m,
            Err(_) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        drop(store);
        while let Some(payload) = messages.next().await {
            let Ok(command) = serde_json::from_str::<crate::service::replicas::Command>(&payload)
            else {
                tracing::warn!("store: a replica command that does not parse was ignored");
                continue;
            };
            let Some(state) = state.upgrade() else {
                return;
            };
            actix_web::rt::spawn(async move {
                let reply = command.reply_to().to_string();
                let live = state.live();
                let answer = state.service.run_forwarded(command, &live.registry).await;
                // Answered once what it changed is in the store, as a call here would be.
                let _ = state.store.settled().await;
                let Ok(json) = serde_json::to_string(&answer) else {
                    return;
                };
                if let Some(store) = &state.store.shared {
                    store.answer(&reply, json).await;
                }
            });
        }
        // The connection dropped: subscribe again.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every half lease, follows the tasks whose push follower died with its replica (the
/// survivors' reaper hands them over).
async fn adopt_push_followers(state: std::sync::Weak<AppState>) {
    loop {
        let Some(state) = state.upgrade() else {
            return;
        };
        let Some(every) = state.store.shared.as_ref().map(|s| s.lease() / 2) else {
            return;
        };
        let live = state.live();
        state.service.adopt_followed(&live.registry).await;
        drop((live, state));
        tokio::time::sleep(every).await;
    }
}

impl Application {
    /// Builds the parts of `settings` (see [`crate::setup`]) and serves them.
    pub async fn build(settings: Settings) -> std::io::Result<Application> {
        let ready = crate::setup::build(settings)
            .map_err(|diags| std::io::Error::other(diags.to_string()))?;
        Application::serve(ready).await
    }

    /// Binds the configured host and port (port 0 picks a free one), and the metrics
    /// address when one is configured. A failure names the address.
    pub async fn serve(ready: Ready) -> std::io::Result<Application> {
        let gateway = &ready.settings.gateway;
        let server = &gateway.server;
        let listener = bind(&server.host, server.port)?;
        let metrics_listener = match (&gateway.metrics.listen, gateway.metrics.enabled) {
            (Some(addr), true) => Some(bind_addr(addr)?),
            _ => None,
        };
        let grpc_listener = match server.grpc_port {
            Some(port) => Some(bind(&server.host, port)?),
            None => None,
        };
        let admin_listener = match (&gateway.admin.listen, gateway.admin.enabled()) {
            (Some(addr), true) => Some(bind_addr(addr)?),
            _ => None,
        };
        let listeners = Listeners {
            http: listener,
            metrics: metrics_listener,
            grpc: grpc_listener,
            admin: admin_listener,
        };
        Application::with_listeners(ready, listeners).await
    }

    async fn with_listeners(ready: Ready, listeners: Listeners) -> std::io::Result<Application> {
        let Listeners {
            http: listener,
            metrics: metrics_listener,
            grpc: grpc_listener,
            admin: admin_listener,
        } = listeners;
        let admin_port = match &admin_listener {
            Some(l) => Some(l.local_addr()?.port()),
            None => None,
        };
        let addr = listener.local_addr()?;
        let metrics_port = match &metrics_listener {
            Some(l) => Some(l.local_addr()?.port()),
            None => None,
        };
        let grpc_port = match &grpc_listener {
            Some(l) => Some(l.local_addr()?.port()),
            None => None,
        };
        let workers = ready.settings.gateway.server.workers;
        let watch = ready.settings.gateway.server.watch_config;
        let source = ready.source.clone().map(|source| {
            let listener = crate::reload::listen(&source, ready.settings.named_files(), watch);
            (source, listener)
        });
        let tls = ready.settings.gateway.server.tls.clone();
        let base = ready
            .settings
            .gateway_file
            .parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default();
        let certificate = match &tls {
            Some(tls) => {
                let cert =
                    crate::http::Certificate::load(tls, &base).map_err(std::io::Error::other)?;
                Some(Arc::new(cert))
            }
            None => {
                warn_if_exposed(addr);
                None
            }
        };
        let tls_config = match &certificate {
            Some(cert) => Some((
                cert.server_config().map_err(std::io::Error::other)?,
                cert.clone(),
            )),
            None => None,
        };
        let (mut state, lost) = build_state(ready)?;
        state.grpc_port = grpc_port;
        state.certificate = certificate;
        state.http_port = addr.port();
        state.service.notify_lost(lost).await;
        start_upstreams(&state).await;
        for source in state.live().auth.jwks_sources() {
            tokio::spawn(source.keep_fresh());
        }
        let limits = state.live().config.limits.clone();
        let header_timeout = Duration::from_secs(limits.header_timeout_secs.max(1));
        let connections = state.connections.clone();
        let max_connections = connections.limit();
        let metrics_on = state.metrics.enabled();
        let metrics_here = metrics_on && metrics_listener.is_none();
        let console = {
            let c = &state.live().config.console;
            c.enabled.then(|| c.path.clone())
        };
        if metrics_on {
            // Work that reloads and background tasks do here is counted too.
            tokio::spawn(crate::telemetry::flush_periodically());
        }
        start_usage(&state).await;
        let state = web::Data::new(state);
        let shared = state.clone().into_inner();
        start_housekeeping(&shared);
        // The admin API's agents and keys are in force before the gateway says it serves.
        match crate::reload::apply_control(&shared).await {
            Ok(version) => {
                shared.control_applied.send_replace(version);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the admin API's entries were not read at start; trying again")
            }
        }
        tokio::spawn(crate::reload::follow_control(Arc::downgrade(&shared)));
        tokio::spawn(crate::reload::audit_key_refusals(Arc::downgrade(&shared)));
        tokio::spawn(crate::reload::record_key_use(Arc::downgrade(&shared)));
        if let Some(store) = shared.store.shared.clone() {
            let retention = shared.live().config.store.retention_secs;
            let keeping = store.clone();
            tokio::spawn(async move { keeping.keep_lease().await });
            let reaping = store.clone();
            tokio::spawn(async move {
                (reaping.reap_dead(crate::tasks::REPLICA_LOST, retention)).await
            });
            tokio::spawn(watch_store(store));
            actix_web::rt::spawn(serve_replica_commands(Arc::downgrade(&shared)));
            actix_web::rt::spawn(adopt_push_followers(Arc::downgrade(&shared)));
            tokio::spawn(crate::tasks::Tasks::exchange_unfinished(Arc::downgrade(
                shared.service.tasks(),
            )));
        }
        // The MCP endpoint, one for every worker (its sessions are the gateway's).
        let mcp = {
            let config = &shared.live().config;
            let hosts = crate::mcp::allowed_hosts(config);
            (config.mcp.enabled).then(|| {
                let endpoint = crate::mcp::Endpoint::start(shared.clone(), hosts);
                (config.mcp.path.clone(), endpoint)
            })
        };
        // The admin API, on the main listener unless it has one of its own.
        let admin = crate::admin::enabled(&shared.live().config)
            .then(|| web::Data::new(crate::admin::Admin::default()));
        let admin_here = admin.clone().filter(|_| admin_listener.is_none());
        // Each worker builds its app once, on its own thread: where its metrics flush runs.
        let app = move || {
            if metrics_on {
                actix_web::rt::spawn(crate::telemetry::flush_periodically());
            }
            App::new()
                .app_data(state.clone())
                .configure(|cfg| routes(cfg, metrics_here, console.as_deref()))
                .configure(|cfg| {
                    if let Some((path, endpoint)) = &mcp {
                        cfg.app_data(endpoint.clone())
                            .service(web::resource(path.as_str()).to(crate::mcp::serve));
                    }
                })
                .configure(|cfg| {
                    if let Some(admin) = &admin_here {
                        cfg.app_data(admin.clone());
                        crate::admin::configure(cfg);
                    }
                })
                // The one middleware: the trailing slash, drain, CORS preflights (before
                // auth and any limit), then every answer's headers, metrics and log line.
                .wrap(crate::http::Edge)
        };
        // actix-web's HttpServer serves the same App; it is built here by hand only to put
        // the connection gate (limits and the first-byte deadline) in front of HTTP.
        // actix stops accepting at its own cap, leaving the excess unanswered in the backlog;
        // set above the gate's, it leaves the refusing to the gate, which answers at once.
        // Signals are the gateway's own (see `run`): SIGTERM drains before stopping.
        let mut server = actix_server::Server::build()
            .disable_signals()
            // The drain (see `stop_on_signal`) has waited for calls already.
            .shutdown_timeout(1)
            .max_concurrent_connections(max_connections.saturating_add(1024));
        if workers > 0 {
            server = server.workers(workers);
        }
        let grpc_connections = connections.clone();
        // The one HTTP service, over TCP or over TLS (with what the connection tells its
        // requests: that its URLs say https, and who its client certificate names).
        macro_rules! http_service {
            ($($on_connect:expr)?) => {{
                let app = app()
                    .into_factory()
                    .map_err(|e: actix_web::Error| e.error_response());
                let http = actix_http::HttpService::build()
                    .keep_alive(actix_http::KeepAlive::Timeout(Duration::from_secs(5)))
                    // Slow clients cannot hold a worker: headers must arrive within this time.
                    .client_request_timeout(header_timeout)
                    // A client that closes its side has left: its handler is dropped and its
                    // socket closed at once, rather than when a long blocking send ends (as
                    // nginx does, 499). Clients that half-close and wait are not supported.
                    .h1_allow_half_closed(false)
                    // How long a closing connection may take: a rejected one reads what its
                    // client still sends for at most this long (see http/rejections.rs).
                    .client_disconnect_timeout(Duration::from_secs(2))
                    .local_addr(addr);
                $(let http = http.secure().on_connect_ext($on_connect);)?
                http.finish(actix_service::map_config(app, |_| AppConfig::default()))
            }};
        }
        server = match tls_config {
            // HTTP/2 without TLS is detected by its preface, so gateways can be chained
            // over multiplexed connections (see the `http2` upstream option).
            None => server.listen("a2a-gateway", listener, move || Gate {
                inner: crate::http::tcp_with_json_rejections(http_service!()),
                limits: connections.clone(),
            })?,
            // The handshake counts against the header deadline.
            Some((tls, certificate)) => server.listen("a2a-gateway", listener, move || {
                let certificate = certificate.clone();
                let on_connect = move |io: &crate::http::TlsConnection, ext: &mut Extensions| {
                    // Its requests' URLs say https, HTTP/1 ones too (see `Live::base_url`).
                    ext.insert(crate::http::OverTls);
                    if let Some(identity) = certificate.client_of(io.get_ref().get_ref().1) {
                        ext.insert(crate::http::ClientCertificate(identity));
                    }
                };
                Gate {
                    inner: crate::http::tls_with_json_rejections(
                        http_service!(on_connect),
                        tls.clone(),
                        header_timeout,
                    ),
                    limits: connections.clone(),
                }
            })?,
        };
        if let (Some(listener), Some(admin)) = (admin_listener, admin) {
            // Its own address: the admin routes only, behind the same edge (logs, metrics)
            // but not the connection gate's HTTP listener.
            let state = web::Data::from(shared.clone());
            server = server.listen("a2a-gateway-admin", listener, move || {
                let app = App::new()
                    .app_data(state.clone())
                    .app_data(admin.clone())
                    .configure(crate::admin::configure)
                    .wrap(crate::http::Edge)
                    .into_factory()
                    .map_err(|e: actix_web::Error| e.error_response());
                actix_http::HttpService::build()
                    .client_request_timeout(header_timeout)
                    .finish(actix_service::map_config(app, |_| AppConfig::default()))
                    .tcp()
            })?;
        }
        if let Some(listener) = metrics_listener {
            let shared = shared.clone();
            server = server.listen("a2a-gateway-metrics", listener, move || {
                let shared = shared.clone();
                actix_http::HttpService::build()
                    .finish(move |req: actix_http::Request| {
                        let shared = shared.clone();
                        async move {
                            let resp = if req.path() == crate::http::METRICS_PATH {
                                crate::telemetry::flush_everywhere().await;
                                crate::http::render_metrics(&shared)
                            } else {
                                actix_web::HttpResponse::NotFound().finish()
                            };
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    })
                    .tcp()
            })?;
        }
        if let Some(listener) = grpc_listener {
            // The gRPC binding on the same workers: its calls take the same admission,
            // configuration snapshot and connection gate as HTTP's.
            let state = web::Data::from(shared.clone());
            let connections = grpc_connections;
            // With [server.tls], the gRPC port speaks TLS too (h2 by ALPN), with the same
            // certificate; the handshake counts against the header deadline.
            let tls = match &shared.certificate {
                Some(cert) => Some((
                    cert.grpc_config().map_err(std::io::Error::other)?,
                    cert.clone(),
                )),
                None => None,
            };
            server = server.listen("a2a-gateway-grpc", listener, move || {
                let state = state.clone();
                let tls = tls.clone();
                let grpc = actix_service::fn_service(move |stream: tokio::net::TcpStream| {
                    let (state, tls) = (state.clone(), tls.clone());
                    async move {
                        let mut peer = crate::grpc::Peer {
                            addr: stream.peer_addr().ok(),
                            certificate: None,
                        };
                        let _ = stream.set_nodelay(true);
                        match tls {
                            None => crate::grpc::serve_connection(stream, peer, state).await,
                            Some((config, certificate)) => {
                                let accept = tokio_rustls::TlsAcceptor::from(config).accept(stream);
                                match tokio::time::timeout(header_timeout, accept).await {
                                    Ok(Ok(tls)) => {
                                        peer.certificate = certificate.client_of(tls.get_ref().1);
                                        crate::grpc::serve_connection(tls, peer, state).await
                                    }
                                    _ => tracing::debug!(
                                        peer = ?peer.addr,
                                        "gRPC TLS handshake failed"
                                    ),
                                }
                            }
                        }
                        Ok::<_, std::convert::Infallible>(())
                    }
                });
                Gate {
                    inner: grpc,
                    limits: connections.clone(),
                }
            })?;
        }
        let server = server.run();
        shared.lifecycle.ready();
        Ok(Application {
            port: addr.port(),
            metrics_port,
            grpc_port,
            admin_port,
            server,
            state: shared,
            source,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The gRPC binding's port, when `[server] grpc_port` sets one.
    pub fn grpc_port(&self) -> Option<u16> {
        self.grpc_port
    }

    /// The separate metrics listener's port, when `[metrics] listen` sets one.
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics_port
    }

    /// The admin API's own port, when `[admin] listen` gives it one.
    pub fn admin_port(&self) -> Option<u16> {
        self.admin_port
    }

    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until stopped through [`Application::handle`] (the tests' way).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let served = self.server.await;
        self.state.usage.flush().await;
        self.state.store.close();
        if let Some(tracing) = &self.state.tracing {
            tracing.flush();
        }
        served
    }

    /// Where the browser console is served, if it is.
    pub fn console_path(&self) -> Option<String> {
        let live = self.state.live();
        let c = &live.config.console;
        c.enabled.then(|| c.path.clone())
    }

    /// Push notifications, for the banner: where webhooks may point; None while off.
    pub fn push_described(&self) -> Option<String> {
        let live = self.state.live();
        let push = &live.config.push;
        if !self.state.service.push().enabled() {
            return None;
        }
        let scheme = if push.allow_http { "http(s)" } else { "https" };
        Some(match push.allow.is_empty() {
            true => format!("on: {scheme} webhooks at public addresses"),
            false => format!(
                "on: {scheme} webhooks at public addresses and {}",
                push.allow.join(", ")
            ),
        })
    }

    /// The task store in use, for the banner.
    pub fn store(&self) -> &str {
        &self.state.store.described
    }

    /// Serves until SIGTERM or SIGINT, then drains (see [`drain`]); reloads on SIGHUP and,
    /// if `watch_config` is on, when the configuration files change.
    pub async fn run(self) -> std::io::Result<()> {
        let Application {
            server,
            state,
            source,
            ..
        } = self;
        if let Some((source, listener)) = source {
            tokio::spawn(crate::reload::run(state.clone(), source, listener));
        } else {
            tracing::debug!("configuration made in memory: no reload");
        }
        let handle = server.handle();
        let stopping = tokio::spawn(stop_on_signal(state.clone(), handle));
        let served = server.await;
        stopping.abort();
        state.usage.flush().await;
        state.store.close();
        // The last requests' spans go before the exit.
        if let Some(tracing) = &state.tracing {
            tracing.flush();
        }
        if let Some(shared) = &state.store.shared {
            shared.release_lease().await;
        }
        served
    }
}

/// What the gateway listens on.
struct Listeners {
    http: TcpListener,
    metrics: Option<TcpListener>,
    grpc: Option<TcpListener>,
    admin: Option<TcpListener>,
}

fn bind(host: &str, port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind((host, port)).map_err(|e| bind_error(&format!("{host}:{port}"), e))
}

fn bind_addr(addr: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| bind_error(addr, e))
}

/// "address 127.0.0.1:8080 already in use", not just "Address in use (os error 98)".
fn bind_error(addr: &str, e: std::io::Error) -> std::io::Error {
    let what = match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            "already in use: another program (another gateway?) listens there; choose another port with --port N (or A2A_GATEWAY_PORT=N; 0 picks a free one)".to_string()
        }
        std::io::ErrorKind::PermissionDenied => {
            "not allowed (a port below 1024 needs privileges)".to_string()
        }
        std::io::ErrorKind::AddrNotAvailable => "not an address of this machine".to_string(),
        _ => e.to_string(),
    };
    std::io::Error::new(e.kind(), format!("address {addr} {what}"))
}

/// On SIGTERM or SIGINT: drain, then stop the server gracefully (it waits for calls in
/// flight up to its shutdown timeout). A second signal stops at once.
async fn stop_on_signal(state: Arc<AppState>, handle: ServerHandle) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for SIGTERM/SIGINT");
        return;
    };
    let which = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    let connections = state.connections.open();
    let streams = state.streams.open();
    tracing::info!(
        signal = which,
        open_connections = connections,
        open_streams = streams,
        "draining: refusing new calls, ending streams, finishing calls in flight"
    );
    state.lifecycle.drain();
    let grace = Duration::from_secs(state.live().config.server.shutdown_grace_secs);
    let orderly = async {
        // No new connections; those open finish their calls (new ones are refused with
        // `Connection: close`) until three seconds before the grace period ends.
        handle.pause().await;
        let calls_until =
            tokio::time::Instant::now() + grace.saturating_sub(Duration::from_secs(3));
        while state.connections.open() > 0 && tokio::time::Instant::now() < calls_until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Then the work still running, while its workers still run it: command processes
        // get SIGTERM and their kill grace, not the SIGKILL of a dropped runtime.
        stop_work(&state, Duration::from_secs(2)).await;
        handle.stop(true).await;
    };
    tokio::select! {
        _ = orderly => {}
        _ = term.recv() => { handle.stop(false).await; }
        _ = int.recv() => { handle.stop(false).await; }
    }
}

/// Stops the work still running (command processes get SIGTERM, then SIGKILL after their
/// kill grace) and waits up to `wait` for it to end.
async fn stop_work(state: &AppState, wait: Duration) {
    let agents = state.all_agents();
    let processes = || -> usize {
        agents
            .iter()
            .filter_map(|a| a.gauges().processes.map(|(running, _)| running))
            .sum()
    };
    let running = processes();
    for agent in &agents {
        agent.stop_work();
    }
    // Processes need their kill grace (SIGTERM, then SIGKILL) to be gone.
    let deadline = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < deadline {
        let left = processes();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::info!(
        stopped_processes = running,
        tasks = state.service.tasks().len(),
        "drained; exiting"
    );
}

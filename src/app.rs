//! Building and running the server; shared by `main` and the tests, which bind port 0.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_service::{IntoServiceFactory, ServiceFactoryExt};
use actix_web::dev::{AppConfig, Server, ServerHandle};
use actix_web::{web, App};
use tracing_actix_web::TracingLogger;

use crate::agents::{ActorLimits, Agent, Registry};
use crate::config::Settings;
use crate::http::{routes, AppState, LeanRootSpan};
use crate::limits::connections::{ConnectionLimits, Gate};
use crate::limits::StreamGauge;
use crate::service::A2aService;
use crate::setup::Ready;
use crate::tasks::{MemoryTaskStore, Tasks};

pub struct Application {
    port: u16,
    server: Server,
}

/// Wires the agents, the task store and the service from the ready parts.
pub(crate) fn build_state(ready: Ready) -> std::io::Result<AppState> {
    let Ready {
        settings,
        auth,
        rates,
        rules,
    } = ready;
    let Settings {
        gateway, agents, ..
    } = settings;
    let limits = &gateway.limits;
    let card_changes = crate::agents::CardChanges::default();
    let agents = agents
        .into_iter()
        .map(|def| {
            let actor_limits = ActorLimits {
                mailbox: def.mailbox.unwrap_or(limits.agent_mailbox),
                max_concurrency: def.max_concurrency.unwrap_or(limits.agent_max_concurrency),
            };
            let name = def.name.clone();
            Agent::new(def, actor_limits, &card_changes)
                .map_err(|e| std::io::Error::other(format!("agent {name}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let registry = Registry::new(
        agents,
        gateway.default_agent_name().map(str::to_string),
        card_changes,
    );
    let store = Arc::new(MemoryTaskStore::new(limits.max_tasks));
    let tasks = Arc::new(Tasks::new(store, limits.max_unfinished_tasks_per_caller));
    let router = crate::routing::Router::new(rules, tasks.clone());
    let stream_limit = limits
        .max_open_streams
        .unwrap_or_else(crate::limits::default_stream_limit);
    let public = |a: &Arc<Agent>| auth.access_of(&a.def) == crate::config::Access::Public;
    let open_to_all = !auth.enabled() && registry.iter().all(public);
    let no_public_agent = !registry.iter().any(public);
    Ok(AppState {
        auth,
        rates,
        service: A2aService::new(tasks, router.contexts().clone()),
        router,
        registry: crate::agents::Agents::new(registry),
        streams: StreamGauge::new(stream_limit),
        bodies: crate::http::BodyLimits::new(&gateway.limits),
        connections: connection_limits(&gateway.limits),
        cards: crate::http::CardCache::new(),
        open_to_all,
        no_public_agent,
        config: gateway,
    })
}

/// Fetches every upstream card once (in parallel, bounded by each agent's timeouts), then
/// keeps them fresh in the background. An unreachable upstream does not delay startup
/// beyond its connect timeout, and does not stop it.
async fn start_upstreams(state: &AppState) {
    let remotes: Vec<_> = state
        .registry
        .current()
        .iter()
        .filter_map(|a| a.remote().cloned())
        .collect();
    let first = remotes.iter().map(|r| {
        let r = r.clone();
        async move {
            let result = r.refresh().await;
            (r, result)
        }
    });
    for (remote, result) in futures_util::future::join_all(first).await {
        if let Err(e) = &result {
            tracing::warn!(error = %e, "upstream agent unavailable at startup");
        }
        let first_delay = remote.refresh_interval(result.is_ok());
        tokio::spawn(remote.keep_fresh(first_delay));
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

/// Every minute, forgets the rate-limit buckets of callers back at a full allowance; stops
/// with the gateway.
async fn prune_rate_buckets(state: std::sync::Weak<AppState>) {
    loop {
        tokio::time::sleep(Duration::from_secs(60)).await;
        match state.upgrade() {
            Some(state) => state.rates.prune(),
            None => return,
        }
    }
}

/// Cancels the tasks left in input-required (or auth-required) past `interrupted_ttl_secs`,
/// checking a few times per period; stops with the gateway.
async fn expire_interrupted_tasks(state: std::sync::Weak<AppState>) {
    let Some(ttl) = state
        .upgrade()
        .map(|s| Duration::from_secs(s.config.limits.interrupted_ttl_secs.max(1)))
    else {
        return;
    };
    let every = (ttl / 4).clamp(Duration::from_millis(250), Duration::from_secs(60));
    loop {
        tokio::time::sleep(every).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        let n = state.service.tasks().expire_interrupted(ttl);
        if n > 0 {
            tracing::info!(tasks = n, "canceled tasks left waiting for input");
        }
    }
}

/// CORS for browser clients, from `[cors]`. Disallowed origins get no CORS headers.
fn cors_middleware(cfg: &crate::config::CorsConfig) -> actix_cors::Cors {
    let mut cors = actix_cors::Cors::default()
        .allowed_methods(["GET", "POST", "OPTIONS"])
        .allowed_headers([
            "authorization",
            "x-api-key",
            "a2a-version",
            "content-type",
            "a2a-extensions",
            "x-a2a-extensions",
            "last-event-id",
        ])
        .expose_headers([
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "retry-after",
            "www-authenticate",
            "a2a-gateway-agent",
            "a2a-gateway-route",
            "a2a-extensions",
        ])
        .max_age(cfg.max_age_secs);
    for origin in &cfg.allowed_origins {
        cors = if origin == "*" {
            cors.allow_any_origin().send_wildcard()
        } else {
            cors.allowed_origin(origin)
        };
    }
    if cfg.allow_credentials {
        cors = cors.supports_credentials();
    }
    cors
}

impl Application {
    /// Builds the parts of `settings` (see [`crate::setup`]) and serves them.
    pub async fn build(settings: Settings) -> std::io::Result<Application> {
        let ready = crate::setup::build(settings)
            .map_err(|diags| std::io::Error::other(diags.to_string()))?;
        Application::serve(ready).await
    }

    /// Binds the configured host and port (port 0 picks a free one).
    pub async fn serve(ready: Ready) -> std::io::Result<Application> {
        let server = &ready.settings.gateway.server;
        let listener = TcpListener::bind((server.host.as_str(), server.port))?;
        Application::with_listener(ready, listener).await
    }

    async fn with_listener(ready: Ready, listener: TcpListener) -> std::io::Result<Application> {
        let addr = listener.local_addr()?;
        let workers = ready.settings.gateway.server.workers;
        let state = build_state(ready)?;
        start_upstreams(&state).await;
        for source in state.auth.jwks_sources() {
            tokio::spawn(source.keep_fresh());
        }
        let header_timeout = Duration::from_secs(state.config.limits.header_timeout_secs.max(1));
        let connections = state.connections.clone();
        let max_connections = connections.limit();
        let state = web::Data::new(state);
        tokio::spawn(prune_rate_buckets(Arc::downgrade(
            &state.clone().into_inner(),
        )));
        tokio::spawn(expire_interrupted_tasks(Arc::downgrade(
            &state.clone().into_inner(),
        )));
        let cors = state.config.cors.clone();
        let rate_limited = state.rates.active();
        let request_spans = crate::http::request_spans_enabled();
        let app = move || {
            App::new()
                .app_data(state.clone())
                .wrap(actix_web::middleware::Condition::new(
                    rate_limited,
                    actix_web::middleware::from_fn(crate::http::rate_limit_headers),
                ))
                .wrap(actix_web::middleware::Condition::new(
                    request_spans,
                    TracingLogger::<LeanRootSpan>::new(),
                ))
                .configure(routes)
                // Before routing: `/a2a/agents/echo/` is `/a2a/agents/echo` on every route.
                .wrap(crate::http::TrimTrailingSlash)
                // Registered last, so it runs first: preflights are answered before auth
                // and without touching any limit.
                .wrap(actix_web::middleware::Condition::new(
                    !cors.allowed_origins.is_empty(),
                    cors_middleware(&cors),
                ))
                .wrap(actix_web::middleware::Condition::new(
                    !cors.allowed_origins.is_empty(),
                    actix_web::middleware::from_fn(crate::http::cors_only_when_allowed),
                ))
        };
        // actix-web's HttpServer serves the same App; it is built here by hand only to put
        // the connection gate (limits and the first-byte deadline) in front of HTTP.
        // actix stops accepting at its own cap, leaving the excess unanswered in the backlog;
        // set above the gate's, it leaves the refusing to the gate, which answers at once.
        let mut server = actix_server::Server::build()
            .shutdown_timeout(5)
            .max_concurrent_connections(max_connections.saturating_add(1024));
        if workers > 0 {
            server = server.workers(workers);
        }
        let server = server
            .listen("a2a-gateway", listener, move || {
                let app = app()
                    .into_factory()
                    .map_err(|e: actix_web::Error| e.error_response());
                // HTTP/2 without TLS is detected by its preface, so gateways can be chained
                // over multiplexed connections (see the `http2` upstream option).
                let http = actix_http::HttpService::build()
                    .keep_alive(actix_http::KeepAlive::Timeout(Duration::from_secs(5)))
                    // Slow clients cannot hold a worker: headers must arrive within this time.
                    .client_request_timeout(header_timeout)
                    // A client that closes its side has left: its handler is dropped and its
                    // socket closed at once, rather than when a long blocking send ends (as
                    // nginx does, 499). Clients that half-close and wait are not supported.
                    .h1_allow_half_closed(false)
                    .local_addr(addr)
                    .finish(actix_service::map_config(app, |_| AppConfig::default()));
                let http = crate::http::tcp_with_json_rejections(http);
                Gate {
                    inner: http,
                    limits: connections.clone(),
                }
            })?
            .run();
        Ok(Application {
            port: addr.port(),
            server,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}

//! The admin API (`/admin/v1`): agents, keys and budgets managed at runtime, usage read
//! back, and the audit log of every change. A binding beside gRPC and MCP with a door of its own: admin credentials
//! (never a caller's), a rate limit of its own, never CORS. What it changes is written to
//! the store's control entries (`store::control`), which every replica puts in force
//! through the same path as a reload (`reload::follow_control`); an answer leaves once the
//! change is in force here.
//!
//! The routes are listed once ([`routes!`]): that list registers the handlers and makes the
//! OpenAPI document (`/admin/v1/openapi.json`), so the document cannot drift from them.

mod agents;
mod audit;
pub(crate) mod client;
mod keys;
mod openapi;
mod usage;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;

use crate::auth::AdminRefusal;
use crate::error::GatewayError;
use crate::http::{AppState, Live, Payer};
use crate::store::control::AuditEntry;

/// Where the admin API is mounted.
pub(crate) const PREFIX: &str = "/admin/v1";

/// Lists every route once: the handlers are registered from it, and the OpenAPI document
/// is made from it (each route's body, answer and query types are the handler's own).
macro_rules! routes {
    ($($method:ident $path:literal => $handler:path, $operation:literal, $summary:literal,
       body: $body:ty, answer: $status:literal $answer:ty, query: $query:ty;)*) => {
        /// Registers every route under [`PREFIX`].
        pub(crate) fn configure(cfg: &mut web::ServiceConfig) {
            cfg.service(
                web::scope(PREFIX)
                    $(.route($path, web::$method().to($handler)))*
                    .default_service(web::to(unknown_route)),
            );
        }

        /// Every route, as the OpenAPI document describes it.
        fn documented() -> Vec<openapi::Route> {
            vec![$(openapi::Route {
                method: stringify!($method),
                path: $path,
                operation: $operation,
                summary: $summary,
                body: openapi::schema_of::<$body>,
                status: $status,
                answer: openapi::schema_of::<$answer>,
                query: openapi::query_of::<$query>,
            }),*]
        }
    };
}

routes! {
    get "/openapi.json" => openapi::serve, "getOpenApi", "This document (OpenAPI 3.1)",
        body: (), answer: 200 serde_json::Value, query: ();
    get "/agents" => agents::list, "listAgents", "Every agent: those of files and those made at runtime, each saying where it comes from",
        body: (), answer: 200 agents::AgentList, query: ();
    get "/agents/{name}" => agents::get, "getAgent", "One agent",
        body: (), answer: 200 agents::AgentView, query: ();
    put "/agents/{name}" => agents::put, "putAgent", "Creates or replaces a runtime agent: the agent file's keys as JSON, checked as `a2a-gateway check` checks a file. With If-Match, only over that version; with If-None-Match: *, only if it does not exist (201 when created, 200 when replaced)",
        body: crate::config::AgentFile, answer: 200 agents::AgentView, query: ();
    delete "/agents/{name}" => agents::delete, "deleteAgent", "Deletes a runtime agent (an agent of a file is changed in its file)",
        body: (), answer: 204 (), query: ();
    post "/agents/{name}/enable" => agents::enable, "enableAgent", "Serves a runtime agent that was disabled",
        body: (), answer: 200 agents::AgentView, query: ();
    post "/agents/{name}/disable" => agents::disable, "disableAgent", "Stops serving a runtime agent, keeping it",
        body: (), answer: 200 agents::AgentView, query: ();
    post "/keys" => keys::create, "createKey", "Issues a key for callers; its secret is in this answer only",
        body: keys::KeyCreate, answer: 201 keys::KeyIssued, query: ();
    get "/keys" => keys::list, "listKeys", "Every runtime key (never a secret), with when it was last used",
        body: (), answer: 200 keys::KeyList, query: ();
    get "/keys/{id}" => keys::get, "getKey", "One runtime key",
        body: (), answer: 200 keys::KeyView, query: ();
    post "/keys/{id}/rotate" => keys::rotate, "rotateKey", "Gives a key a new secret; the old one works for the grace given",
        body: keys::KeyRotate, answer: 200 keys::KeyIssued, query: ();
    post "/keys/{id}/revoke" => keys::revoke, "revokeKey", "Revokes a key: refused on every replica from now on",
        body: (), answer: 200 keys::KeyView, query: ();
    get "/audit" => audit::list, "listAudit", "The audit log, newest first, filtered and paged with a cursor",
        body: (), answer: 200 audit::AuditPage, query: audit::AuditQuery;
    get "/usage" => usage::report, "getUsage", "Who used what: requests, tasks, bytes, tokens and cost per day, caller and agent, filtered and grouped; CSV with format=csv or Accept: text/csv",
        body: (), answer: 200 crate::usage::report::UsageReport, query: crate::usage::report::UsageQuery;
    get "/budgets" => usage::list, "listBudgets", "Every budget in force (of the gateway file and made here), with what its current window holds per key",
        body: (), answer: 200 usage::BudgetList, query: ();
    get "/budgets/{id}" => usage::get, "getBudget", "One budget",
        body: (), answer: 200 usage::BudgetView, query: ();
    put "/budgets/{id}" => usage::put, "putBudget", "Creates or replaces a runtime budget (201 when created); in force on every replica at once",
        body: crate::config::BudgetConfig, answer: 200 usage::BudgetView, query: ();
    delete "/budgets/{id}" => usage::delete, "deleteBudget", "Deletes a runtime budget (a file's budget is changed in its file)",
        body: (), answer: 204 (), query: ();
}

/// Whether the admin API is served: some credential can use it (read at start).
pub(crate) fn enabled(config: &crate::config::GatewayConfig) -> bool {
    config.admin.enabled()
}

/// The admin API's own state: its rate limiter (per admin, or per address before one is
/// known), made again when `[admin] requests_per_minute` changes.
#[derive(Default)]
pub(crate) struct Admin {
    limiter: Mutex<Option<(u32, Arc<Limiter>)>>,
}

type Limiter = governor::RateLimiter<
    String,
    governor::state::keyed::DashMapStateStore<String>,
    governor::clock::DefaultClock,
>;

impl Admin {
    fn limiter(&self, rpm: u32) -> Arc<Limiter> {
        let mut held = self.limiter.lock().unwrap_or_else(|e| e.into_inner());
        match &*held {
            Some((at, limiter)) if *at == rpm => limiter.clone(),
            _ => {
                let per_minute =
                    std::num::NonZeroU32::new(rpm.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
                let burst = std::num::NonZeroU32::new((rpm / 10).max(1))
                    .unwrap_or(std::num::NonZeroU32::MIN);
                let quota = governor::Quota::per_minute(per_minute).allow_burst(burst);
                let limiter = Arc::new(governor::RateLimiter::keyed(quota));
                *held = Some((rpm, limiter.clone()));
                limiter
            }
        }
    }
}

/// A request let through the door: the state, the configuration in force, the admin, and
/// where it comes from.
pub(crate) struct Door {
    state: web::Data<AppState>,
    live: Arc<Live>,
    actor: Arc<str>,
    from: Option<String>,
}

impl Door {
    /// The door: admin credentials (401 without, 403 for a caller's), then the rate limit
    /// (per admin; per address for those refused, so guessing is limited too).
    pub(super) fn of(req: &HttpRequest) -> Result<Door, GatewayError> {
        let state = req
            .app_data::<web::Data<AppState>>()
            .cloned()
            .ok_or_else(|| GatewayError::Internal("the application state is missing".into()))?;
        let admin = req.app_data::<web::Data<Admin>>().cloned();
        let live = state.live();
        let from = live.client_address(req).map(|ip| ip.to_string());
        let presented = crate::auth::Presented::in_headers(req.headers());
        let admitted = live.admin.admit(presented, &live.auth, &state.keys.ring);
        let bucket = match &admitted {
            Ok(actor) => actor.to_string(),
            Err(_) => format!("address:{}", from.as_deref().unwrap_or("unknown")),
        };
        if let Some(admin) = admin {
            let limiter = admin.limiter(live.config.admin.requests_per_minute);
            if let Err(not_until) = limiter.check_key(&bucket) {
                use governor::clock::Clock as _;
                let wait = not_until.wait_time_from(limiter.clock().now());
                return Err(GatewayError::RateLimited {
                    scope: "admin",
                    retry_after: wait.as_secs().max(1),
                });
            }
        }
        let actor = admitted.map_err(|refusal| match refusal {
            AdminRefusal::Unauthenticated => GatewayError::Unauthenticated {
                message: "admin credentials are required (Authorization: Bearer <admin secret>)"
                    .into(),
                challenge: "Bearer realm=\"a2a-gateway admin\"".into(),
            },
            AdminRefusal::NotAdmin => GatewayError::Forbidden,
        })?;
        Ok(Door {
            state,
            live,
            actor,
            from,
        })
    }

    /// An audit entry of this admin's, now.
    fn audit(&self, action: &str, target: String) -> AuditEntry {
        AuditEntry {
            seq: None,
            at: now(),
            actor: self.actor.to_string(),
            action: action.into(),
            target,
            from: self.from.clone(),
            before: None,
            after: None,
            detail: None,
        }
    }

    /// Records a change in the audit log, then has it put in force here (every replica
    /// follows within a second or so), waiting for that.
    async fn changed(&self, entry: AuditEntry) -> Result<(), GatewayError> {
        let control = &self.state.store.control;
        if let Err(e) = control.record(&entry).await {
            tracing::error!(error = %e, "an admin change was made but not audited");
        }
        let target = control
            .version()
            .await
            .map_err(GatewayError::StoreUnavailable)?;
        let mut applied = self.state.control_applied.subscribe();
        self.state.control_wake.notify_one();
        let in_force =
            tokio::time::timeout(Duration::from_secs(5), applied.wait_for(|v| *v >= target)).await;
        if !matches!(in_force, Ok(Ok(_))) {
            tracing::warn!(
                action = %entry.action,
                target = %entry.target,
                "an admin change is stored but not yet in force here (see the log)"
            );
        }
        Ok(())
    }
}

/// RFC 3339, milliseconds, UTC.
fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Answers `req` with what `handle` makes of it once through the door: its status and
/// JSON, or the error's `google.rpc.Status` body.
async fn answer<T, F, Fut>(req: &HttpRequest, handle: F) -> HttpResponse
where
    T: Serialize,
    F: FnOnce(Door) -> Fut,
    Fut: Future<Output = Result<(StatusCode, T), GatewayError>>,
{
    let handled = match Door::of(req) {
        Ok(door) => handle(door).await,
        Err(e) => Err(e),
    };
    match handled {
        Ok((StatusCode::NO_CONTENT, _)) => HttpResponse::NoContent().finish(),
        Ok((status, body)) => HttpResponse::build(status)
            .insert_header((header::CACHE_CONTROL, "no-store"))
            .json(body),
        Err(e) => error_response(&e),
    }
}

pub(super) fn error_response(e: &GatewayError) -> HttpResponse {
    if let GatewayError::Internal(detail) = e {
        tracing::error!(%detail, "admin API: internal error");
    }
    let status =
        StatusCode::from_u16(e.rest_http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = HttpResponse::build(status);
    if let Some(secs) = e.retry_after() {
        resp.insert_header((header::RETRY_AFTER, secs.to_string()));
    }
    if let Some(challenge) = e.challenge() {
        resp.insert_header((header::WWW_AUTHENTICATE, challenge.to_string()));
    }
    resp.json(e.rest_body())
}

/// A JSON body of at most `max_body_bytes` (the limits every body has), parsed as `T`;
/// a body that is not JSON, or not a `T`, is a 400 naming the field.
async fn json_body<T: serde::de::DeserializeOwned>(
    req: &HttpRequest,
    state: &AppState,
    body: web::Payload,
) -> Result<T, GatewayError> {
    crate::http::check_json_type(req, "application/json")?;
    let hash = |h: &ahash::RandomState| h.hash_one(req.peer_addr().map(|a| a.ip()));
    let payer = Payer {
        hash: &hash,
        anonymous: false,
    };
    let bytes = crate::http::read_body(req, body, &state.bodies, &payer).await?;
    let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let field = e.path().to_string();
        let field = if field == "." { String::new() } else { field };
        GatewayError::AdminInvalid(vec![(field, e.into_inner().to_string())])
    })
}

async fn unknown_route(req: HttpRequest) -> HttpResponse {
    answer(&req, |_door| async {
        Err::<(StatusCode, ()), _>(GatewayError::AdminNotFound(format!(
            "no admin route {} {} (the routes: {PREFIX}/openapi.json)",
            req.method(),
            crate::http::quoted(req.path())
        )))
    })
    .await
}

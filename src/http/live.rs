//! The configuration in force: everything a reload replaces, as one snapshot. A request
//! takes it once and decides everything (credentials, agent, rules, limits, CORS) from it,
//! so a reload never mixes two configurations in one answer.

use std::sync::Arc;

use actix_web::HttpRequest;

use super::admission::Head;
use super::Addressed;
use crate::agents::{Agent, Registry};
use crate::auth::{AdminAuth, AuthError, Authenticator, Principal, RuntimeKeys};
use crate::config::{Access, GatewayConfig};
use crate::error::GatewayError;
use crate::limits::RateLimits;
use crate::policy::Policies;
use crate::routing::Rule;
use crate::store::Shared;
use crate::telemetry::Metrics;

/// A request's hold on the configuration, counted per worker: a shared count (an `Arc`
/// clone, or an arc-swap guard, which falls back to one past a few per thread) is written
/// by every worker on every request, and cost a tenth of the echo path's throughput.
pub(crate) type LiveRef = std::rc::Rc<Arc<Live>>;

thread_local! {
    /// This worker's hold on the configuration last seen.
    static HELD: std::cell::RefCell<Option<LiveRef>> = const { std::cell::RefCell::new(None) };
}

/// The configuration in force, as this worker holds it.
pub(crate) fn current(swap: &arc_swap::ArcSwap<Live>) -> LiveRef {
    let now = swap.load();
    HELD.with_borrow_mut(|held| match held {
        Some(h) if Arc::ptr_eq(h, &now) => h.clone(),
        _ => {
            let fresh = std::rc::Rc::new(arc_swap::Guard::into_inner(now));
            *held = Some(fresh.clone());
            fresh
        }
    })
}

pub(crate) struct Live {
    pub(crate) config: GatewayConfig,
    pub(crate) auth: Authenticator,
    pub(crate) rates: RateLimits,
    pub(crate) rules: Vec<Rule>,
    pub(crate) policies: Policies,
    /// Who may use the admin API.
    pub(crate) admin: AdminAuth,
    pub(crate) registry: Arc<Registry>,
    /// No credentials configured and every agent public: access has nothing to check.
    pub(crate) open_to_all: bool,
    /// Every agent needs credentials: an anonymous call on a shared endpoint is refused
    /// before its body is read. (Worked out with `open_to_all` when the agents are loaded,
    /// not per request: with many agents that is a walk over all of them.)
    pub(crate) no_public_agent: bool,
    /// Identifies this configuration (a reload to an identical one changes nothing).
    pub(crate) fingerprint: String,
    metrics: Arc<Metrics>,
}

/// The request's A2A method, as its binding noted it: what a tier's `weights` read.
fn noted_method() -> Option<&'static str> {
    crate::telemetry::noted(|c| c.method).flatten()
}

/// What a configuration builds for the requests to use (see `setup`).
pub(crate) struct Parts {
    pub(crate) auth: Authenticator,
    pub(crate) rates: RateLimits,
    pub(crate) rules: Vec<Rule>,
    pub(crate) policies: Policies,
    pub(crate) admin: AdminAuth,
}

impl Live {
    pub(crate) fn new(
        config: GatewayConfig,
        parts: Parts,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        fingerprint: String,
    ) -> Live {
        let Parts {
            auth,
            rates,
            rules,
            policies,
            admin,
        } = parts;
        let public = |a: &Arc<Agent>| auth.access_of(&a.def) == Access::Public;
        let open_to_all = !auth.enabled() && registry.iter().all(public);
        let no_public_agent = !registry.iter().any(public);
        Live {
            config,
            auth,
            rates,
            rules,
            policies,
            admin,
            registry,
            open_to_all,
            no_public_agent,
            fingerprint,
            metrics,
        }
    }

    /// The base URL clients reach the gateway at: the configured public URL, else what the
    /// request says (Forwarded / X-Forwarded-Proto / X-Forwarded-Host / Host).
    pub(crate) fn base_url(&self, req: &HttpRequest) -> String {
        match self.config.public_url() {
            Some(url) => url.to_string(),
            None => {
                let info = req.connection_info();
                // actix reads an HTTP/1 request's scheme from its app config, which does not
                // know the connection; a TLS connection says so itself.
                let scheme = match (info.scheme(), req.conn_data::<super::OverTls>()) {
                    ("http", Some(_)) => "https",
                    (scheme, _) => scheme,
                };
                format!("{scheme}://{}", info.host())
            }
        }
    }

    pub(crate) fn default_keepalive(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.config.limits.stream_keepalive_secs.max(1))
    }

    /// The caller, or the 401 to answer with (a runtime key's refusal is audited). Runs
    /// before any body is read.
    pub(crate) fn authenticate(
        &self,
        head: &impl Head,
        keys: &RuntimeKeys,
    ) -> Result<Principal, GatewayError> {
        let caller = self.auth.authenticate(head.presented(), &keys.ring);
        if let Err(AuthError::KeyRefused { id, reason, .. }) = &caller {
            keys.refused(id, reason, head.peer());
        }
        caller.map_err(|e| self.auth_error(e))
    }

    /// Refuses from the headers alone, before any body is read, a caller that may not call
    /// the agent the path names, or on the shared endpoints any agent at all.
    pub(crate) fn admit_early(
        &self,
        addressed: &Addressed,
        caller: &Principal,
    ) -> Result<(), GatewayError> {
        if self.open_to_all {
            return Ok(());
        }
        match addressed {
            Addressed::Agent(agent) => self.authorize(caller, agent),
            // Answered later, with the request's id.
            Addressed::Unknown(_) => Ok(()),
            Addressed::Shared if caller.anonymous && self.no_public_agent => {
                Err(self.auth_error(AuthError::Missing))
            }
            Addressed::Shared => Ok(()),
        }
    }

    /// Whether `caller` may call `agent`: a 401 or a 403 if not.
    pub(crate) fn authorize(&self, caller: &Principal, agent: &Agent) -> Result<(), GatewayError> {
        self.auth
            .authorize(caller, &agent.def)
            .map_err(|e| self.auth_error(e))
    }

    pub(crate) fn policy_denied(&self, rule: &str) {
        self.metrics.policy_denied(rule);
        tracing::info!(%rule, "refused by policy");
    }

    pub(crate) fn auth_error(&self, e: AuthError) -> GatewayError {
        self.metrics.auth_failure(e.kind());
        match &e {
            // The reason, never the credential.
            AuthError::Rejected { reason, .. } => tracing::info!(%reason, "credentials rejected"),
            AuthError::KeyRefused { id, reason, .. } => {
                tracing::info!(key = %id, %reason, "credentials rejected: a runtime key")
            }
            _ => {}
        }
        match e {
            AuthError::Forbidden => GatewayError::Forbidden,
            other => GatewayError::Unauthenticated {
                message: other.to_string(),
                challenge: self.auth.challenge(&other),
            },
        }
    }

    /// The client's address: the peer's, or behind a trusted proxy the one it forwarded
    /// for (its header read only when proxies are trusted at all).
    pub(crate) fn client_address(&self, head: &impl Head) -> Option<std::net::IpAddr> {
        match self.rates.trusts_proxies() {
            false => head.peer(),
            true => {
                let (peer, forwarded) = head.origin();
                self.rates.client_ip(peer, forwarded)
            }
        }
    }

    /// The key a caller is counted under (its credential, or its address when anonymous).
    pub(crate) fn caller_key(&self, head: &impl Head, caller: &Principal) -> String {
        let (peer, xff) = head.origin();
        let ip = self.rates.client_ip(peer, xff);
        self.rates.caller_key(caller, ip)
    }

    /// The caller as [`Self::caller_key`] counts it, hashed by `hasher` without making
    /// the key: its credential, or its address when anonymous (or not known yet: `None`).
    pub(crate) fn caller_hash(
        &self,
        head: &impl Head,
        caller: Option<&Principal>,
        hasher: &ahash::RandomState,
    ) -> u64 {
        match caller {
            Some(c) if !c.anonymous => hasher.hash_one(&*c.id),
            _ => {
                let (peer, xff) = head.origin();
                let ip = self.rates.client_ip(peer, xff);
                hasher.hash_one(ip.map(crate::auth::address_group))
            }
        }
    }

    /// Counts one request against the caller's and the agent's rate; the numbers go out
    /// as `X-RateLimit-*` headers (see [`super::rate_limit_headers`]), also on a refusal.
    pub(crate) fn admit(
        &self,
        head: &impl Head,
        caller: &Principal,
        agent: &Agent,
    ) -> Result<(), GatewayError> {
        let key = || self.caller_key(head, caller);
        let counted = (self.rates).check(caller, key, &agent.def.name, noted_method);
        self.counted(head, &agent.name, counted)
    }

    /// Counts one request against the caller's rate alone: one no agent answers (an MCP
    /// session's own messages, `initialize` among them).
    pub(crate) fn admit_caller(
        &self,
        head: &impl Head,
        caller: &Principal,
    ) -> Result<(), GatewayError> {
        let key = || self.caller_key(head, caller);
        let counted = (self.rates).check(caller, key, "", noted_method);
        self.counted(head, "", counted)
    }

    /// [`Self::admit_caller`] against the allowance every replica shares.
    pub(crate) async fn admit_caller_shared(
        &self,
        head: &impl Head,
        caller: &Principal,
        shared: &Shared,
    ) -> Result<(), GatewayError> {
        let key = || self.caller_key(head, caller);
        let counted = self
            .rates
            .check_shared(shared, caller, key, "", noted_method)
            .await;
        self.counted(head, "", counted)
    }

    /// [`Self::admit`] against allowances every replica shares.
    pub(crate) async fn admit_shared(
        &self,
        head: &impl Head,
        caller: &Principal,
        agent: &Agent,
        shared: &Shared,
    ) -> Result<(), GatewayError> {
        let key = || self.caller_key(head, caller);
        let counted = self
            .rates
            .check_shared(shared, caller, key, &agent.def.name, noted_method)
            .await;
        self.counted(head, &agent.name, counted)
    }

    /// The outcome of a count: its numbers kept for the answer; a refusal counted by
    /// `agent` (empty for a request no agent answers).
    fn counted(
        &self,
        head: &impl Head,
        agent: &str,
        counted: Result<Option<crate::limits::RateInfo>, (GatewayError, crate::limits::RateInfo)>,
    ) -> Result<(), GatewayError> {
        match counted {
            Ok(info) => {
                if let Some(info) = info {
                    head.keep_rate(info);
                }
                Ok(())
            }
            Err((e, info)) => {
                if matches!(e, GatewayError::RateLimited { .. }) {
                    self.metrics.rate_limited(agent);
                    head.keep_rate(info);
                }
                Err(e)
            }
        }
    }

    /// An unknown agent is a 404, except for anonymous callers when agents are private by
    /// default: they learn nothing beyond "authenticate first".
    pub(crate) fn missing_agent(&self, caller: &Principal, name: &str) -> GatewayError {
        self.unroutable(caller, self.unknown_agent(name))
    }

    /// A request that reaches no agent (unknown by name, or unroutable on the shared
    /// endpoints): for anonymous callers when agents are private by default, "authenticate
    /// first" instead of the agent names the error would list.
    pub(crate) fn unroutable(&self, caller: &Principal, error: GatewayError) -> GatewayError {
        if caller.anonymous && self.auth.default_access() == Access::Authenticated {
            return self.auth_error(AuthError::Missing);
        }
        error
    }

    pub(crate) fn unknown_agent(&self, name: &str) -> GatewayError {
        GatewayError::AgentNotFound {
            name: name.to_string(),
            available: self.registry.first_names(),
        }
    }
}

//! Who is calling: API keys, static bearer tokens and JWTs, turned into a [`Principal`], and
//! whether that principal may call an agent.
//!
//! Secrets are never inline in configuration and are kept only as SHA-256 digests, compared
//! in constant time. Failures are deliberately vague: a caller learns that its credentials
//! were not accepted, never whether a key id or an agent exists.

mod jwt;
mod keys;

pub(crate) use jwt::JwksSource;
pub(crate) use keys::{
    new_secret, KeyRecord, KeyRing, PreviousSecret, Refusal, RuntimeKeys, SECRET_PREFIX,
};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use actix_web::http::header::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{Access, AdminConfig, AgentDef, AuthConfig, CredentialConfig};
use jwt::JwtVerifier;

pub(crate) const API_KEY_HEADER: &str = "X-API-Key";
/// [`API_KEY_HEADER`], parsed once: looking a header up by string parses the name each time.
static API_KEY_HEADER_NAME: HeaderName = HeaderName::from_static("x-api-key");

/// The credentials a request presents, whatever carries them (HTTP headers, gRPC metadata):
/// the first `X-API-Key`, the first `Authorization`, and whether there was more than one;
/// and the identity of the client certificate its connection was verified with.
#[derive(Default, Clone, Copy)]
pub(crate) struct Presented<'a> {
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) bearer: Option<&'a [u8]>,
    pub(crate) more: bool,
    pub(crate) certificate: Option<&'a str>,
}

impl<'a> Presented<'a> {
    /// What HTTP `headers` present.
    pub(crate) fn in_headers(headers: &'a HeaderMap) -> Presented<'a> {
        Presented::first_of(
            headers.get_all(&API_KEY_HEADER_NAME).map(|v| v.as_bytes()),
            (headers.get_all(actix_web::http::header::AUTHORIZATION)).map(|v| v.as_bytes()),
        )
    }

    /// The first key and the first `Authorization` of all a request carries.
    pub(crate) fn first_of(
        mut keys: impl Iterator<Item = &'a [u8]>,
        mut bearers: impl Iterator<Item = &'a [u8]>,
    ) -> Presented<'a> {
        let (key, bearer) = (keys.next(), bearers.next());
        Presented {
            key,
            bearer,
            more: keys.next().is_some() || bearers.next().is_some(),
            certificate: None,
        }
    }

    /// With the identity of the connection's client certificate, if it has one.
    pub(crate) fn with_certificate(self, certificate: Option<&'a str>) -> Presented<'a> {
        Presented {
            certificate,
            ..self
        }
    }
}

/// Which agents a principal may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    All,
    Agents(HashSet<String>),
}

impl Scope {
    fn from_list<I: IntoIterator<Item = String>>(list: I) -> Scope {
        let set: HashSet<String> = list.into_iter().collect();
        if set.contains("*") {
            Scope::All
        } else {
            Scope::Agents(set)
        }
    }

    fn allows(&self, agent: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Agents(set) => set.contains(agent),
        }
    }
}

/// What decides which agents a principal may see and call: principals with equal keys see
/// the same agents (so what is built for one can be served to the other).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum AccessKey {
    Anonymous,
    All,
    /// The agents named, sorted.
    Agents(Vec<String>),
}

/// The caller of a request. Anonymous callers share one principal: without credentials
/// there is no identity to keep tasks apart by.
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    /// Stable and unique per credential: `key:<id>`, `bearer:<id>`, `jwt:<id>:<sub>`,
    /// `cert:<identity>`.
    pub(crate) id: Arc<str>,
    pub(crate) scope: Scope,
    pub(crate) anonymous: bool,
    /// Rate-limit tier.
    pub(crate) tier: Arc<str>,
    /// A JWT's claims, for policies (`caller.claims`); none for other credentials.
    pub(crate) claims: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// An anonymous caller's address (the peer, or the forwarded client behind a trusted
    /// proxy): anonymous callers share one identity but not one quota.
    pub(crate) address: Option<std::net::IpAddr>,
}

impl Principal {
    pub(crate) fn access_key(&self) -> AccessKey {
        if self.anonymous {
            return AccessKey::Anonymous;
        }
        match &self.scope {
            Scope::All => AccessKey::All,
            Scope::Agents(set) => {
                let mut names: Vec<String> = set.iter().cloned().collect();
                names.sort_unstable();
                AccessKey::Agents(names)
            }
        }
    }

    /// How the caller is known, for policies: `anonymous`, `api_key`, `bearer`, `jwt`,
    /// `client_certificate`.
    pub(crate) fn kind(&self) -> &'static str {
        match self.id.split_once(':').map(|(kind, _)| kind) {
            _ if self.anonymous => "anonymous",
            Some("key") => "api_key",
            Some("bearer") => "bearer",
            Some("jwt") => "jwt",
            Some("cert") => "client_certificate",
            _ => "anonymous",
        }
    }

    pub(crate) fn anonymous() -> Principal {
        Principal {
            id: Arc::from("anonymous"),
            scope: Scope::Agents(HashSet::new()),
            anonymous: true,
            tier: Arc::from(DEFAULT_TIER),
            claims: None,
            address: None,
        }
    }

    /// What this caller's unfinished tasks are counted under when that is not its id: an
    /// anonymous caller's address group (an IPv4 address, an IPv6 /64), so that one
    /// anonymous client holding its quota locks no other out.
    pub(crate) fn quota_key(&self) -> Option<Arc<str>> {
        let address = self.address.filter(|_| self.anonymous)?;
        Some(Arc::from(format!("anonymous@{}", address_group(address))))
    }
}

/// The addresses counted as one anonymous client: an IPv4 address (an IPv4 address mapped
/// into IPv6 included), or an IPv6 /64, which one host or network is commonly given whole
/// (counting its addresses apart would give it 2^64 allowances).
pub(crate) fn address_group(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => {
                let [a, b, c, d, ..] = v6.segments();
                std::net::IpAddr::V6(std::net::Ipv6Addr::new(a, b, c, d, 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

pub(crate) const DEFAULT_TIER: &str = "default";

fn tier_of(t: &Option<String>) -> Arc<str> {
    Arc::from(t.as_deref().unwrap_or(DEFAULT_TIER))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthError {
    /// 401: no credentials where they are needed.
    #[error("credentials are required")]
    Missing,
    /// 401: credentials were presented and not accepted (any reason: unknown, revoked,
    /// expired, wrong signature...). The reason is logged, not sent.
    #[error("the credentials were not accepted")]
    Rejected { scheme: Scheme, reason: String },
    /// 401: a runtime key (one the admin API issued) that is revoked, expired or rotated
    /// out: as [`AuthError::Rejected`], and its refusal goes to the audit log.
    #[error("the credentials were not accepted")]
    KeyRefused {
        scheme: Scheme,
        id: String,
        reason: String,
    },
    /// 403: valid credentials that do not cover the agent.
    #[error("these credentials may not call this agent")]
    Forbidden,
}

impl AuthError {
    /// A metrics label: `missing`, `rejected_api_key`, `rejected_bearer`,
    /// `rejected_client_certificate`, `forbidden`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Rejected {
                scheme: Scheme::ApiKey,
                ..
            }
            | AuthError::KeyRefused {
                scheme: Scheme::ApiKey,
                ..
            } => "rejected_api_key",
            AuthError::Rejected {
                scheme: Scheme::Bearer,
                ..
            }
            | AuthError::KeyRefused {
                scheme: Scheme::Bearer | Scheme::ClientCertificate,
                ..
            } => "rejected_bearer",
            AuthError::Rejected {
                scheme: Scheme::ClientCertificate,
                ..
            } => "rejected_client_certificate",
            AuthError::Forbidden => "forbidden",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    ApiKey,
    Bearer,
    ClientCertificate,
}

/// What a verified client certificate with this identity may do.
struct CertificateHolder {
    scope: Scope,
    revoked: bool,
    tier: Arc<str>,
}

struct StaticCredential {
    id: String,
    digest: [u8; 32],
    scope: Scope,
    revoked: bool,
    tier: Arc<str>,
}

/// How long a verified JWT is trusted without checking its signature again (never past
/// its `exp`). Bounds how long a key dropped from a JWKS keeps working.
const JWT_CACHE_SECS: i64 = 60;
/// Verified tokens kept; past this the cache starts over.
const JWT_CACHE_ENTRIES: usize = 10_000;

pub(crate) struct Authenticator {
    default_access: Access,
    api_keys: Vec<StaticCredential>,
    bearer_tokens: Vec<StaticCredential>,
    jwt: Vec<JwtVerifier>,
    /// Holders of client certificates by identity; `*` stands for any other.
    certificate_holders: HashMap<String, CertificateHolder>,
    /// An RS256 check costs more than the rest of a request; a client sends the same
    /// token many times. Keyed by the token's digest; holds the principal and until when.
    verified: crate::tasks::FastMap<[u8; 32], (Principal, i64)>,
    /// Shared, so an anonymous request costs two reference counts, not two allocations.
    anonymous: Principal,
}

fn digest(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

fn load_static(c: &CredentialConfig, what: &str) -> Result<StaticCredential, String> {
    let sources = [
        c.secret_env.is_some(),
        c.secret_file.is_some(),
        c.secret_sha256.is_some(),
    ];
    if sources.iter().filter(|s| **s).count() != 1 {
        return Err(format!(
            "{what} \"{}\": give exactly one of secret_env, secret_file, secret_sha256",
            c.id
        ));
    }
    let digest = if let Some(var) = &c.secret_env {
        let value = std::env::var(var)
            .map_err(|_| format!("{what} \"{}\": environment variable {var} is not set", c.id))?;
        digest(value.trim().as_bytes())
    } else if let Some(path) = &c.secret_file {
        let value = std::fs::read_to_string(path)
            .map_err(|e| format!("{what} \"{}\": cannot read {}: {e}", c.id, path.display()))?;
        digest(value.trim().as_bytes())
    } else {
        let hex = c.secret_sha256.as_deref().unwrap_or_default();
        parse_hex32(hex)
            .ok_or_else(|| format!("{what} \"{}\": secret_sha256 must be 64 hex digits", c.id))?
    };
    Ok(StaticCredential {
        id: c.id.clone(),
        digest,
        scope: Scope::from_list(c.agents.iter().cloned()),
        revoked: c.revoked,
        tier: tier_of(&c.tier),
    })
}

fn parse_hex32(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Finds the credential whose digest is `d`, comparing against every entry so the time
/// taken does not depend on which one (or whether any) matched.
fn find<'a>(list: &'a [StaticCredential], d: &[u8; 32]) -> Option<&'a StaticCredential> {
    let mut found = None;
    for c in list {
        if bool::from(c.digest.ct_eq(d)) {
            found = Some(c);
        }
    }
    found
}

/// Who may use the admin API (`[admin]`): its keys, and a JWT claim that grants it.
pub(crate) struct AdminAuth {
    keys: Vec<StaticCredential>,
    jwt_claim: Option<String>,
    jwt_value: String,
}

/// Why a request may not use the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AdminRefusal {
    /// 401: no admin credential, or one not accepted.
    Unauthenticated,
    /// 403: a caller's credential, valid, that is not an admin's.
    NotAdmin,
}

impl AdminAuth {
    pub(crate) fn build(cfg: &AdminConfig) -> Result<AdminAuth, Vec<String>> {
        let mut errors = Vec::new();
        let mut keys = Vec::new();
        for k in &cfg.keys {
            let as_credential = CredentialConfig {
                id: k.id.clone(),
                secret_env: k.secret_env.clone(),
                secret_file: k.secret_file.clone(),
                secret_sha256: k.secret_sha256.clone(),
                agents: vec!["*".into()],
                revoked: false,
                tier: None,
            };
            match load_static(&as_credential, "admin key") {
                Ok(c) => keys.push(c),
                Err(e) => errors.push(e),
            }
        }
        match errors.is_empty() {
            true => Ok(AdminAuth {
                keys,
                jwt_claim: cfg.jwt_claim.clone(),
                jwt_value: cfg.jwt_value.clone(),
            }),
            false => Err(errors),
        }
    }

    /// The admin `presented` names (`admin-key:<id>`, or a JWT's `jwt:<issuer>:<sub>`), or
    /// why not. Admin credentials come as `Authorization: Bearer`.
    pub(crate) fn admit(
        &self,
        presented: Presented<'_>,
        callers: &Authenticator,
        ring: &arc_swap::ArcSwap<KeyRing>,
    ) -> Result<Arc<str>, AdminRefusal> {
        let token = (presented.bearer)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|t| !t.is_empty() && !presented.more && presented.key.is_none());
        if let Some(token) = token {
            if let Some(admin) = find(&self.keys, &digest(token.as_bytes())) {
                return Ok(Arc::from(format!("admin-key:{}", admin.id)));
            }
            if let (Some(claim), Ok(p)) = (&self.jwt_claim, callers.verify_jwt(token)) {
                let grants =
                    p.claims
                        .as_ref()
                        .and_then(|c| c.get(claim))
                        .is_some_and(|v| match v {
                            serde_json::Value::String(s) => *s == self.jwt_value,
                            serde_json::Value::Array(a) => a.iter().any(|x| *x == *self.jwt_value),
                            serde_json::Value::Bool(b) => *b,
                            _ => false,
                        });
                return match grants {
                    true => Ok(p.id.clone()),
                    false => Err(AdminRefusal::NotAdmin),
                };
            }
        }
        // Not an admin's: a caller's credential that is valid is forbidden, else unknown.
        match callers.authenticate(presented, ring) {
            Ok(p) if !p.anonymous => Err(AdminRefusal::NotAdmin),
            _ => Err(AdminRefusal::Unauthenticated),
        }
    }
}

impl Authenticator {
    /// Reads every secret and key the configuration names; errors name the credential.
    pub(crate) fn build(cfg: &AuthConfig) -> Result<Authenticator, Vec<String>> {
        let mut errors = Vec::new();
        let mut keep = |r: Result<StaticCredential, String>| match r {
            Ok(c) => Some(c),
            Err(e) => {
                errors.push(e);
                None
            }
        };
        let api_keys = cfg
            .api_keys
            .iter()
            .filter_map(|c| keep(load_static(c, "api key")))
            .collect();
        let bearer_tokens = cfg
            .bearer_tokens
            .iter()
            .filter_map(|c| keep(load_static(c, "bearer token")))
            .collect();
        let mut jwt = Vec::new();
        for j in &cfg.jwt {
            match JwtVerifier::build(j) {
                Ok(v) => jwt.push(v),
                Err(e) => errors.push(format!("jwt \"{}\": {e}", j.id)),
            }
        }
        let certificate_holders = (cfg.client_certificates.iter())
            .map(|c| {
                let holder = CertificateHolder {
                    scope: Scope::from_list(c.agents.iter().cloned()),
                    revoked: c.revoked,
                    tier: tier_of(&c.tier),
                };
                (c.identity.clone(), holder)
            })
            .collect();
        if errors.is_empty() {
            Ok(Authenticator {
                default_access: cfg.default_access,
                api_keys,
                bearer_tokens,
                jwt,
                certificate_holders,
                verified: Default::default(),
                anonymous: Principal::anonymous(),
            })
        } else {
            Err(errors)
        }
    }

    /// JWKS URLs to keep fetched (see [`JwksSource::keep_fresh`]).
    pub(crate) fn jwks_sources(&self) -> Vec<JwksSource> {
        self.jwt.iter().filter_map(|v| v.jwks_source()).collect()
    }

    /// Whether any credential is configured at all.
    pub(crate) fn enabled(&self) -> bool {
        !(self.api_keys.is_empty()
            && self.bearer_tokens.is_empty()
            && self.jwt.is_empty()
            && self.certificate_holders.is_empty())
    }

    pub(crate) fn default_access(&self) -> Access {
        self.default_access
    }

    pub(crate) fn access_of(&self, agent: &AgentDef) -> Access {
        agent.access.unwrap_or(self.default_access)
    }

    /// The caller, from `X-API-Key` or `Authorization: Bearer`, else from the connection's
    /// client certificate (a credential in a header is the request's own, and speaks for
    /// it over the connection's). Presented credentials that are not accepted are an error
    /// even for public agents: a client with a broken key should hear so, not be served as
    /// someone else.
    /// The caller `presented` names: a file's credential, else a runtime key from `ring`
    /// (looked at only when a key or a bearer matched no file's).
    pub(crate) fn authenticate(
        &self,
        presented: Presented<'_>,
        ring: &arc_swap::ArcSwap<KeyRing>,
    ) -> Result<Principal, AuthError> {
        let Presented {
            key,
            bearer,
            more,
            certificate,
        } = presented;
        // More than one credential (a key and a bearer, or either twice) is refused rather
        // than decided by which one is read first.
        if more || (key.is_some() && bearer.is_some()) {
            return Err(AuthError::Rejected {
                scheme: if key.is_some() {
                    Scheme::ApiKey
                } else {
                    Scheme::Bearer
                },
                reason: "more than one credential (X-API-Key, Authorization); send one".into(),
            });
        }
        if let Some(key) = key {
            let rejected = |reason: &str| AuthError::Rejected {
                scheme: Scheme::ApiKey,
                reason: reason.into(),
            };
            let d = digest(key);
            return match find(&self.api_keys, &d) {
                None => match ring.load().find(&d) {
                    Some(Ok(p)) => Ok(p),
                    Some(Err((id, reason))) => Err(AuthError::KeyRefused {
                        scheme: Scheme::ApiKey,
                        id,
                        reason,
                    }),
                    None => Err(rejected("unknown api key")),
                },
                Some(c) if c.revoked => Err(rejected(&format!("api key {} is revoked", c.id))),
                Some(c) => Ok(Principal {
                    id: Arc::from(format!("key:{}", c.id)),
                    scope: c.scope.clone(),
                    anonymous: false,
                    tier: c.tier.clone(),
                    claims: None,
                    address: None,
                }),
            };
        }
        let Some(auth) = bearer else {
            return match certificate {
                Some(identity) => self.certificate_holder(identity),
                None => Ok(self.anonymous.clone()),
            };
        };
        let rejected = |reason: String| AuthError::Rejected {
            scheme: Scheme::Bearer,
            reason,
        };
        let value = std::str::from_utf8(auth)
            .ok()
            .filter(|v| v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)))
            .ok_or_else(|| rejected("malformed Authorization header".into()))?;
        let token = match value.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            _ => return Err(rejected("Authorization is not a Bearer credential".into())),
        };
        if token.is_empty() {
            return Err(rejected("empty bearer token".into()));
        }
        let d = digest(token.as_bytes());
        if let Some(c) = find(&self.bearer_tokens, &d) {
            if c.revoked {
                return Err(rejected(format!("bearer token {} is revoked", c.id)));
            }
            return Ok(Principal {
                id: Arc::from(format!("bearer:{}", c.id)),
                scope: c.scope.clone(),
                anonymous: false,
                tier: c.tier.clone(),
                claims: None,
                address: None,
            });
        }
        if token.starts_with(SECRET_PREFIX) {
            return match ring.load().find(&d) {
                Some(Ok(p)) => Ok(p),
                Some(Err((id, reason))) => Err(AuthError::KeyRefused {
                    scheme: Scheme::Bearer,
                    id,
                    reason,
                }),
                None => Err(rejected("unknown bearer token".into())),
            };
        }
        if token.split('.').count() == 3 && !self.jwt.is_empty() {
            return self.verify_jwt(token).map_err(rejected);
        }
        Err(rejected("unknown bearer token".into()))
    }

    /// The holder of a verified client certificate: as listed under its identity, else as
    /// `*` says, else a known caller that may call only public agents.
    fn certificate_holder(&self, identity: &str) -> Result<Principal, AuthError> {
        if identity.is_empty() {
            return Err(AuthError::Rejected {
                scheme: Scheme::ClientCertificate,
                reason: "the client certificate lacks the name client_identity reads".into(),
            });
        }
        let holder =
            (self.certificate_holders.get(identity)).or_else(|| self.certificate_holders.get("*"));
        match holder {
            Some(h) if h.revoked => Err(AuthError::Rejected {
                scheme: Scheme::ClientCertificate,
                reason: format!("client certificate {identity} is revoked"),
            }),
            Some(h) => Ok(Principal {
                id: Arc::from(format!("cert:{identity}")),
                scope: h.scope.clone(),
                anonymous: false,
                tier: h.tier.clone(),
                claims: None,
                address: None,
            }),
            None => Ok(Principal {
                id: Arc::from(format!("cert:{identity}")),
                scope: Scope::Agents(HashSet::new()),
                anonymous: false,
                tier: Arc::from(DEFAULT_TIER),
                claims: None,
                address: None,
            }),
        }
    }

    pub(crate) fn verify_jwt(&self, token: &str) -> Result<Principal, String> {
        let key = digest(token.as_bytes());
        let now = chrono::Utc::now().timestamp();
        if let Some(hit) = self.verified.get(&key) {
            if hit.1 > now {
                return Ok(hit.0.clone());
            }
        }
        let mut last = String::from("no issuer accepted the token");
        for v in &self.jwt {
            match v.verify(token) {
                Ok((principal, exp)) => {
                    if self.verified.len() >= JWT_CACHE_ENTRIES {
                        self.verified.clear();
                    }
                    let until = exp.min(now + JWT_CACHE_SECS);
                    self.verified.insert(key, (principal.clone(), until));
                    return Ok(principal);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Whether `p` may call `agent`.
    pub(crate) fn authorize(&self, p: &Principal, agent: &AgentDef) -> Result<(), AuthError> {
        match self.access_of(agent) {
            Access::Public => Ok(()),
            Access::Authenticated if p.anonymous => Err(AuthError::Missing),
            Access::Authenticated if p.scope.allows(&agent.name) => Ok(()),
            Access::Authenticated => Err(AuthError::Forbidden),
        }
    }

    /// The `WWW-Authenticate` challenge for a 401.
    pub(crate) fn challenge(&self, error: &AuthError) -> String {
        match error {
            AuthError::Rejected {
                scheme: Scheme::ApiKey,
                ..
            }
            | AuthError::KeyRefused {
                scheme: Scheme::ApiKey,
                ..
            } => format!("ApiKey header=\"{API_KEY_HEADER}\", realm=\"a2a-gateway\""),
            AuthError::Rejected {
                scheme: Scheme::Bearer,
                ..
            }
            | AuthError::KeyRefused {
                scheme: Scheme::Bearer,
                ..
            } => "Bearer realm=\"a2a-gateway\", error=\"invalid_token\"".to_string(),
            _ if !(self.bearer_tokens.is_empty() && self.jwt.is_empty()) => {
                "Bearer realm=\"a2a-gateway\"".to_string()
            }
            _ if !self.api_keys.is_empty() => {
                format!("ApiKey header=\"{API_KEY_HEADER}\", realm=\"a2a-gateway\"")
            }
            // HTTP has no scheme for a TLS client certificate; this names what is wanted.
            _ => "ClientCertificate realm=\"a2a-gateway\"".to_string(),
        }
    }

    /// Security schemes as the configuration makes them, keyed by scheme name.
    pub(crate) fn schemes(&self) -> Vec<SchemeKind> {
        let mut out = Vec::new();
        if !self.api_keys.is_empty() {
            out.push(SchemeKind::ApiKey);
        }
        if !self.bearer_tokens.is_empty() || !self.jwt.is_empty() {
            out.push(SchemeKind::Bearer {
                jwt: !self.jwt.is_empty(),
            });
        }
        if !self.certificate_holders.is_empty() {
            out.push(SchemeKind::MutualTls);
        }
        out
    }
}

/// A security scheme the gateway accepts, for the cards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SchemeKind {
    ApiKey,
    Bearer { jwt: bool },
    MutualTls,
}

impl SchemeKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            SchemeKind::ApiKey => "apiKey",
            SchemeKind::Bearer { .. } => "bearer",
            SchemeKind::MutualTls => "mtls",
        }
    }
}

//! Configuration: `gateway.toml` (the gateway's own card, default agent and limits) and
//! `agents.d/*.toml` (one agent per file).
//!
//! Parsing is strict (unknown keys are errors) and reports every problem of every file in
//! one pass as `file:line:col: message`, so an operator fixes a directory in one go.

mod agents_d;
mod diagnostics;
mod openai;
mod push;
mod runtime;
mod schema;
mod usage;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

pub(crate) use agents_d::AgentFile;
pub use agents_d::{agent_from_json, load_agents_dir, FieldError};
pub use diagnostics::{Diagnostic, Diagnostics};
pub use openai::{ApiKey, OpenAiConfig};
pub use push::{AllowEntry, PushSettings};
pub use runtime::{definition_to_agent, AgentRecord};
pub use schema::{schema, SchemaOf};
pub use usage::{budget_problems, BudgetConfig, ModelPrice, Pricing, UsageConfig, Window};

/// Both files as read and checked, before anything is built from them (see `setup`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub gateway: GatewayConfig,
    pub agents: Vec<AgentDef>,
    /// The gateway file diagnostics name (`gateway.toml` when none was read).
    pub gateway_file: PathBuf,
}

impl Settings {
    /// The files this configuration names besides the gateway file and the agent files:
    /// secrets and keys, the push signing key, prompts, and command agents' programs and
    /// the scripts their arguments name. A change to one of them changes the configuration.
    pub fn named_files(&self) -> Vec<PathBuf> {
        let auth = &self.gateway.auth;
        let mut files: Vec<PathBuf> = auth
            .api_keys
            .iter()
            .chain(&auth.bearer_tokens)
            .filter_map(|c| c.secret_file.clone())
            .collect();
        for jwt in &auth.jwt {
            files.extend(
                [&jwt.secret_file, &jwt.public_key_file, &jwt.jwks_file]
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
        }
        let base = self.gateway_file.parent().unwrap_or(Path::new(""));
        let keys = [
            &self.gateway.push.signing_key_file,
            &self.gateway.cards.signing_key_file,
        ];
        files.extend(keys.into_iter().flatten().map(|key| base.join(key)));
        if let Some(tls) = &self.gateway.server.tls {
            files.extend([base.join(&tls.cert_file), base.join(&tls.key_file)]);
        }
        for agent in &self.agents {
            match &agent.backend {
                BackendSpec::Command(cmd) => files.extend(cmd.named_files()),
                BackendSpec::OpenAi(openai) => files.extend(openai.system_prompt_file.clone()),
                BackendSpec::Echo(_) | BackendSpec::A2a(_) => {}
            }
        }
        files
    }

    /// `serve --auth-token`: one bearer token that covers every agent, and every agent
    /// (public ones included) then requires credentials.
    pub fn require_bearer_token(&mut self, token: &str) -> Result<(), String> {
        use sha2::{Digest, Sha256};
        use std::fmt::Write as _;
        if token.trim().is_empty() {
            return Err("--auth-token / A2A_GATEWAY_AUTH_TOKEN: the token is empty".into());
        }
        let digest = Sha256::digest(token.as_bytes());
        let hex = digest.iter().fold(String::with_capacity(64), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        });
        self.gateway.auth.bearer_tokens.push(CredentialConfig {
            id: "auth-token".into(),
            secret_env: None,
            secret_file: None,
            secret_sha256: Some(hex),
            agents: all_agents(),
            revoked: false,
            tier: None,
        });
        self.gateway.auth.default_access = Access::Authenticated;
        for agent in &mut self.agents {
            agent.access = Some(Access::Authenticated);
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    #[serde(default = "default_gateway_name")]
    pub name: String,
    #[serde(default = "default_gateway_description")]
    pub description: String,
    #[serde(default = "default_version")]
    pub version: String,
    /// Absolute base URL clients use to reach the gateway (scheme, host, optional path
    /// prefix). Without it, card URLs are derived from each request's Host and
    /// X-Forwarded-* headers.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub public_url: Option<Spanned<String>>,
    /// Agent that serves `POST /a2a`. Unset with exactly one agent: that agent.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub default_agent: Option<Spanned<String>>,
    #[serde(default)]
    pub provider: Option<Provider>,
    #[serde(default)]
    pub documentation_url: Option<String>,
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub cors: CorsConfig,
    #[serde(default)]
    pub rate_limits: RateLimitConfig,
    #[serde(default)]
    pub routing: RoutingConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub console: ConsoleConfig,
    #[serde(default)]
    pub mcp: McpConfig,
    #[serde(default)]
    pub push: PushSettings,
    #[serde(default)]
    pub cards: CardsConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    #[serde(default)]
    pub usage: UsageConfig,
    #[serde(default)]
    pub pricing: Pricing,
    #[serde(default)]
    pub budgets: Vec<BudgetConfig>,
}

/// `[admin]`: the admin API (`/admin/v1`): agents and keys managed at runtime, kept in the
/// store every replica shares. Off unless a credential for it is configured.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Serve it on an address of its own (`"127.0.0.1:9090"`), not on the main listener.
    #[serde(default)]
    pub listen: Option<String>,
    /// Who may use it: each presented as `Authorization: Bearer <secret>`.
    #[serde(default)]
    pub keys: Vec<AdminKeyConfig>,
    /// A JWT from an issuer of `[[auth.jwt]]` grants admin when this claim holds
    /// `jwt_value` (or is a list that contains it).
    #[serde(default)]
    pub jwt_claim: Option<String>,
    #[serde(default = "default_admin_jwt_value")]
    pub jwt_value: String,
    /// Admin calls per minute, per admin credential (a burst of a tenth).
    #[serde(default = "default_admin_rpm")]
    pub requests_per_minute: u32,
    /// Runtime agents may name the gateway host's programs (`kind = "command"`), files
    /// (`*_file`) and environment variables (`*_env`, `${VAR}`): off, an admin credential
    /// is not a shell on the host, nor a way to read its secrets.
    #[serde(default)]
    pub allow_host_access: bool,
}

impl AdminConfig {
    /// Whether the admin API is served: some credential can use it.
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty() || self.jwt_claim.is_some()
    }
}

/// An admin credential: an id (named in the audit log) and its secret, never inline.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminKeyConfig {
    pub id: String,
    #[serde(default)]
    pub secret_env: Option<String>,
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    #[serde(default)]
    pub secret_sha256: Option<String>,
}

fn default_admin_jwt_value() -> String {
    "a2a-admin".into()
}
fn default_admin_rpm() -> u32 {
    600
}

/// `[cards]`: the key every card the gateway serves is signed with.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CardsConfig {
    /// PKCS#8 PEM, P-256, relative to this file; read at start. Unset: `[push]
    /// signing_key_file`, else a key made at each start (replicas behind one address must
    /// share a file, or a client may read a card from one and the JWKS from another).
    #[serde(default)]
    pub signing_key_file: Option<PathBuf>,
}

impl CardsConfig {
    /// The signing key's file, as this section or `[push]` names it.
    pub fn key_file<'a>(&'a self, push: &'a PushSettings) -> Option<&'a Path> {
        self.signing_key_file
            .as_deref()
            .or(push.signing_key_file.as_deref())
    }
}

/// `[console]`: the browser console (a page to see and try the agents).
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Where it is served: an absolute path of one or more segments.
    #[serde(default = "default_console_path")]
    pub path: String,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: true,
            path: default_console_path(),
        }
    }
}

fn default_console_path() -> String {
    "/console".into()
}

/// `[mcp]`: every agent as an MCP tool, over Streamable HTTP.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Where it is served: an absolute path of one or more segments.
    #[serde(default = "default_mcp_path")]
    pub path: String,
    /// The `Host`s it answers, against DNS rebinding (a page on another name reaching a
    /// gateway on this machine); `["*"]` for any. Unset: the loopback names, and the
    /// host of `public_url` when set.
    #[serde(default)]
    pub allowed_hosts: Option<Vec<String>>,
    /// Browser origins (`https://app.example`) whose pages may call it, beside those of
    /// `[cors] allowed_origins` and the gateway's own; a request from any other `Origin`
    /// gets 403 (as the MCP specification asks, against pages elsewhere and DNS rebinding).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Sessions open at once, gateway-wide; past it `initialize` gets 503. Default: what
    /// a 64th of the memory the gateway may use holds (at 96 KiB a session), from 256 to
    /// 10,000.
    #[serde(default)]
    pub max_sessions: Option<usize>,
    /// Sessions one caller (a credential; an anonymous client per address) may hold open;
    /// past it its `initialize` gets 429, and nobody else's.
    #[serde(default = "default_sessions_per_caller")]
    pub max_sessions_per_caller: usize,
    /// A session nothing has used for this long is closed (its client opens another).
    #[serde(default = "default_session_idle")]
    pub idle_timeout_secs: u64,
    /// A tool call whose HTTP client goes away before its answer (no
    /// `notifications/cancelled`) cancels its task, as the stdio bridge does when its
    /// client leaves; false leaves it to finish (for clients that resume their stream).
    #[serde(default = "default_true")]
    pub cancel_abandoned_calls: bool,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            enabled: true,
            path: default_mcp_path(),
            allowed_hosts: None,
            allowed_origins: Vec::new(),
            max_sessions: None,
            max_sessions_per_caller: default_sessions_per_caller(),
            idle_timeout_secs: default_session_idle(),
            cancel_abandoned_calls: true,
        }
    }
}

fn default_sessions_per_caller() -> usize {
    16
}
fn default_session_idle() -> u64 {
    600
}

fn default_mcp_path() -> String {
    "/mcp".into()
}

/// Where tasks and the gateway's records (context affinity, upstream task owners) live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// In this process only: a restart forgets everything.
    #[default]
    Memory,
    /// A SQLite file under `data_dir`: survives restarts and crashes (see `commit_interval_ms`).
    Sqlite,
    /// A Redis server shared by several replicas.
    Redis,
    /// A schema in a PostgreSQL database (`url`, `schema`): survives restarts of the
    /// gateway and of the server, for one gateway per schema.
    Postgres,
}

/// When an answer may leave, against what it changed being on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Changes are committed in batches every `commit_interval_ms`; an answer does not
    /// wait for its batch, so a crash loses the changes of the last interval or so,
    /// answered ones included.
    #[default]
    Batched,
    /// An answer leaves only once the commit that holds what its call changed is done
    /// (each commit takes whatever arrived while the last was written: group commit); a
    /// crash loses no answered task. An answer whose commit fails is a 503.
    Sync,
}

/// `[store]`: the task store.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    #[serde(default)]
    pub kind: StoreKind,
    /// SQLite: whether answers wait for their commit (`sync`) or not (`batched`).
    #[serde(default)]
    pub durability: Durability,
    /// SQLite: the directory of `gateway.db`, created on start; relative to the gateway
    /// file's directory.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// Changes are written in batches at most this far apart (group commit): a crash loses
    /// at most the updates of the last interval.
    #[serde(default = "default_commit_interval_ms")]
    pub commit_interval_ms: u64,
    /// Finished tasks older than this are deleted (0: kept until `max_tasks` evicts them).
    #[serde(default = "default_retention_secs")]
    pub retention_secs: u64,
    /// Redis: the server, as `redis://host:port/db` (or `rediss://`). PostgreSQL:
    /// `postgres://user:password@host:port/database`.
    #[serde(default = "default_redis_url")]
    pub url: String,
    /// PostgreSQL: the schema the gateway's tables are in, created on start; one gateway
    /// per schema.
    #[serde(default = "default_pg_schema")]
    pub schema: String,
    /// PostgreSQL: several gateways (replicas) share the schema, as they share a Redis
    /// store: each other's tasks, events, leases, limits and push holds.
    #[serde(default)]
    pub shared: bool,
    /// Redis: the prefix of every key, so several gateways can share one server.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Redis, shared PostgreSQL: a replica that has not renewed its lease for this long is taken for dead,
    /// and its unfinished tasks are marked failed by the others.
    #[serde(default = "default_lease_secs")]
    pub lease_secs: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::default(),
            durability: Durability::default(),
            data_dir: default_data_dir(),
            commit_interval_ms: default_commit_interval_ms(),
            retention_secs: default_retention_secs(),
            url: default_redis_url(),
            key_prefix: default_key_prefix(),
            schema: default_pg_schema(),
            shared: false,
            lease_secs: default_lease_secs(),
        }
    }
}

fn default_data_dir() -> PathBuf {
    PathBuf::from("./data")
}
fn default_commit_interval_ms() -> u64 {
    20
}
fn default_retention_secs() -> u64 {
    7 * 24 * 3600
}
fn default_redis_url() -> String {
    "redis://127.0.0.1:6379".into()
}
fn default_key_prefix() -> String {
    "a2a:".into()
}
/// `url` with its password, if any, as `***` (for messages and the log).
pub(crate) fn redacted_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

fn default_pg_schema() -> String {
    "a2a_gateway".into()
}
fn default_lease_secs() -> u64 {
    10
}

/// `GET /metrics` (Prometheus text format).
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Off: nothing is recorded and `/metrics` is not served.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// A separate address (`host:port`) to serve `/metrics` on, away from the A2A port;
    /// unset: on the main listener, beside the health endpoint.
    #[serde(default)]
    pub listen: Option<String>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            listen: None,
        }
    }
}

fn default_true() -> bool {
    true
}

/// `[telemetry]`: spans exported over OTLP. Off unless an endpoint is given here or in
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector: `http://host:4318` for HTTP/protobuf (spans go to `/v1/traces`
    /// under it), `http://host:4317` with `otlp_protocol = "grpc"`.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` or `grpc`; unset: `OTEL_EXPORTER_OTLP_PROTOCOL`, else HTTP.
    #[serde(default)]
    pub otlp_protocol: Option<OtlpProtocol>,
    /// The `service.name` resource attribute; `OTEL_SERVICE_NAME` wins, else
    /// `a2a-gateway`. `OTEL_RESOURCE_ATTRIBUTES` adds attributes.
    #[serde(default)]
    pub service_name: Option<String>,
    /// Traces started here are kept at this ratio (0 to 1); a caller's `traceparent`
    /// decides for its own trace (parent-based sampling).
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
    /// Ended spans waiting for export; past this, spans are dropped (and counted in
    /// `a2a_trace_spans_dropped_total`) rather than requests slowed.
    #[serde(default = "default_max_queued_spans")]
    pub max_queued_spans: usize,
}

/// How spans reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
pub enum OtlpProtocol {
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "grpc")]
    Grpc,
}

fn default_sample_ratio() -> f64 {
    1.0
}

fn default_max_queued_spans() -> usize {
    2048
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            otlp_protocol: None,
            service_name: None,
            sample_ratio: default_sample_ratio(),
            max_queued_spans: default_max_queued_spans(),
        }
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            name: default_gateway_name(),
            description: default_gateway_description(),
            version: default_version(),
            public_url: None,
            default_agent: None,
            provider: None,
            documentation_url: None,
            server: ServerConfig::default(),
            limits: Limits::default(),
            auth: AuthConfig::default(),
            cors: CorsConfig::default(),
            rate_limits: RateLimitConfig::default(),
            routing: RoutingConfig::default(),
            metrics: MetricsConfig::default(),
            telemetry: TelemetryConfig::default(),
            store: StoreConfig::default(),
            console: ConsoleConfig::default(),
            mcp: McpConfig::default(),
            push: PushSettings::default(),
            cards: CardsConfig::default(),
            admin: AdminConfig::default(),
            usage: UsageConfig::default(),
            pricing: Pricing::default(),
            budgets: Vec::new(),
        }
    }
}

impl GatewayConfig {
    pub fn public_url(&self) -> Option<&str> {
        self.public_url
            .as_ref()
            .map(|u| u.get_ref().trim_end_matches('/'))
    }

    pub fn default_agent_name(&self) -> Option<&str> {
        self.default_agent.as_ref().map(|a| a.get_ref().as_str())
    }
}

fn default_gateway_name() -> String {
    "a2a-gateway".into()
}

fn default_gateway_description() -> String {
    "A2A gateway: one front door for many agents".into()
}

fn default_version() -> String {
    env!("CARGO_PKG_VERSION").into()
}

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    #[serde(default = "default_host")]
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    /// Worker threads; 0 means one per core.
    #[serde(default)]
    pub workers: usize,
    /// On SIGTERM/SIGINT: how long calls in flight get to finish before the gateway
    /// exits anyway; also how long a removed agent's work may go on after a reload.
    #[serde(default = "default_shutdown_grace")]
    pub shutdown_grace_secs: u64,
    /// Reload when a file in agents.d/ or the gateway file changes (SIGHUP always does).
    #[serde(default = "default_true")]
    pub watch_config: bool,
    /// Serve the gRPC binding (A2A 1.0's `lf.a2a.v1.A2AService`, HTTP/2; TLS with `tls`) on
    /// this port of `host`; 0 picks a free one. Off when absent.
    #[serde(default)]
    pub grpc_port: Option<u16>,
    /// List the gRPC binding in the cards (`host:port`, as the A2A spec and its SDKs write
    /// a gRPC address). False leaves it out, for clients that check every interface's URL
    /// as an HTTP one (Google ADK's `RemoteA2aAgent`, which refuses a card whose URLs are
    /// not https, or http on a loopback host, of the card's own origin); gRPC clients then
    /// need the address from elsewhere.
    #[serde(default = "default_true")]
    pub grpc_in_cards: bool,
    /// HTTPS on the gateway's port (`[server.tls]`); plain HTTP when absent.
    #[serde(default)]
    pub tls: Option<TlsSettings>,
}

/// `[server.tls]`: the gateway's certificate, read at start and again when its files
/// change or on SIGHUP.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// The certificate chain, PEM, leaf first; relative to this file.
    pub cert_file: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1); relative to this file.
    pub key_file: PathBuf,
    /// Client certificates (mutual TLS): the CA certificates, PEM, whose certificates are
    /// accepted as credentials (see `[[auth.client_certificates]]`); read at start.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// With `client_ca_file`: `optional` (a client may present a certificate) or
    /// `required` (a handshake without a valid one fails).
    #[serde(default)]
    pub client_auth: ClientAuth,
    /// Which name of a verified client certificate identifies its holder.
    #[serde(default)]
    pub client_identity: ClientIdentity,
}

/// Whether a client must present a certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    #[default]
    Optional,
    Required,
}

/// The name of a client certificate that becomes the caller's identity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientIdentity {
    /// The subject's common name (CN).
    #[default]
    CommonName,
    /// The first DNS name among its subject alternative names.
    Dns,
    /// The first URI among them (a SPIFFE ID, say).
    Uri,
    /// The first e-mail address among them.
    Email,
}

fn default_shutdown_grace() -> u64 {
    20
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: default_host(),
            port: default_port(),
            workers: 0,
            shutdown_grace_secs: default_shutdown_grace(),
            watch_config: true,
            grpc_port: None,
            grpc_in_cards: true,
            tls: None,
        }
    }
}

fn default_host() -> String {
    "127.0.0.1".into()
}

fn default_port() -> u16 {
    8080
}

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest request body accepted, in bytes.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// Tasks kept in memory; the oldest finished ones are evicted first.
    #[serde(default = "default_max_tasks")]
    pub max_tasks: usize,
    /// Per-agent defaults, overridable in each agent file.
    #[serde(default = "default_mailbox")]
    pub agent_mailbox: usize,
    #[serde(default = "default_concurrency")]
    pub agent_max_concurrency: usize,
    /// `Cache-Control: max-age` of agent cards.
    #[serde(default = "default_card_max_age")]
    pub card_max_age_secs: u64,
    /// Comment lines on idle SSE streams, so proxies keep them open.
    #[serde(default = "default_keepalive")]
    pub stream_keepalive_secs: u64,
    /// SSE streams open at once, gateway-wide; beyond it new streams get 503. Default: what
    /// the open-file limit allows at two descriptors per relayed stream.
    #[serde(default)]
    pub max_open_streams: Option<usize>,
    /// Connections open at once; past it new ones get a 503 and are closed. Default: three
    /// quarters of what the open-file limit leaves after 512 descriptors for the rest.
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Connections open at once from one client address. Default: a quarter of
    /// `max_connections`.
    #[serde(default)]
    pub max_connections_per_ip: Option<usize>,
    /// A connection must send its first request head within this time, from accept.
    #[serde(default = "default_header_timeout")]
    pub header_timeout_secs: u64,
    /// A request body must arrive within this time, plus a second per
    /// `body_min_bytes_per_sec` it declares; past it: 408 and the connection closes.
    #[serde(default = "default_body_timeout")]
    pub body_timeout_secs: u64,
    #[serde(default = "default_body_min_rate")]
    pub body_min_bytes_per_sec: usize,
    /// Bytes held at once, gateway-wide, for request bodies still arriving; past it new
    /// bodies get 503 at once.
    #[serde(default = "default_body_budget")]
    pub max_buffered_body_bytes: usize,
    /// A caller's share of `max_buffered_body_bytes` (a principal; anonymous callers per
    /// client address): past it that caller's new bodies get 429, and nobody else's.
    /// Default: an eighth of `max_buffered_body_bytes`.
    #[serde(default)]
    pub max_buffered_body_bytes_per_caller: Option<usize>,
    /// Anonymous callers' part of `max_buffered_body_bytes`, all their addresses together:
    /// past it their new bodies get 503, while callers with credentials keep the rest.
    /// Default: half of `max_buffered_body_bytes`.
    #[serde(default)]
    pub max_buffered_body_bytes_anonymous: Option<usize>,
    /// Unfinished tasks one caller (a principal; all anonymous callers are one) may hold;
    /// past it that caller's new tasks get -32052, and nobody else's.
    #[serde(default = "default_tasks_per_caller")]
    pub max_unfinished_tasks_per_caller: usize,
    /// Bytes of tasks kept in memory (approximately: their text, data and files), beside
    /// `max_tasks`; the oldest finished ones are evicted first, and when only unfinished
    /// tasks are left new ones get 503 -32052. Default: a quarter of the memory the
    /// gateway may use (its cgroup's limit, else the machine's), at least 64 MiB.
    #[serde(default)]
    pub max_stored_bytes: Option<u64>,
    /// Bytes of unfinished tasks one caller (a principal; all anonymous callers are one)
    /// may hold; past it that caller's new tasks get 429 -32052, and nobody else's.
    /// Default: a quarter of `max_stored_bytes`.
    #[serde(default)]
    pub max_unfinished_bytes_per_caller: Option<u64>,
    /// A task left in input-required or auth-required this long is canceled.
    #[serde(default = "default_interrupted_ttl")]
    pub interrupted_ttl_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: default_max_body(),
            max_tasks: default_max_tasks(),
            agent_mailbox: default_mailbox(),
            agent_max_concurrency: default_concurrency(),
            card_max_age_secs: default_card_max_age(),
            stream_keepalive_secs: default_keepalive(),
            max_open_streams: None,
            max_connections: None,
            max_connections_per_ip: None,
            header_timeout_secs: default_header_timeout(),
            body_timeout_secs: default_body_timeout(),
            body_min_bytes_per_sec: default_body_min_rate(),
            max_buffered_body_bytes: default_body_budget(),
            max_buffered_body_bytes_per_caller: None,
            max_buffered_body_bytes_anonymous: None,
            max_unfinished_tasks_per_caller: default_tasks_per_caller(),
            max_stored_bytes: None,
            max_unfinished_bytes_per_caller: None,
            interrupted_ttl_secs: default_interrupted_ttl(),
        }
    }
}

/// libpq's `sslmode` values a PostgreSQL store URL may give, each with whether it means TLS.
pub(crate) const POSTGRES_SSL_MODES: &[(&str, bool)] = &[
    ("disable", false),
    ("allow", false),
    ("prefer", false),
    ("require", true),
    ("verify-ca", true),
    ("verify-full", true),
];

/// A byte count as people read it: "512 bytes", "64 MiB", "1.5 GiB".
pub(crate) fn bytes_text(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size {
            let whole = n / size;
            let tenths = (n % size) * 10 / size;
            return match tenths {
                0 => format!("{whole} {unit}"),
                t => format!("{whole}.{t} {unit}"),
            };
        }
    }
    format!("{n} bytes")
}

fn default_header_timeout() -> u64 {
    10
}
fn default_body_timeout() -> u64 {
    10
}
fn default_body_min_rate() -> usize {
    16 * 1024
}
fn default_body_budget() -> usize {
    64 * 1024 * 1024
}
fn default_tasks_per_caller() -> usize {
    1_000
}
fn default_interrupted_ttl() -> u64 {
    3_600
}

fn default_max_body() -> usize {
    1024 * 1024
}
fn default_max_tasks() -> usize {
    100_000
}
fn default_mailbox() -> usize {
    1024
}
fn default_concurrency() -> usize {
    256
}
fn default_card_max_age() -> u64 {
    300
}
fn default_keepalive() -> u64 {
    15
}

/// Who may call an agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Anyone, with or without credentials.
    #[default]
    Public,
    /// Only callers with valid credentials that name this agent (or all agents).
    Authenticated,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Access of agents whose file does not say.
    #[serde(default)]
    pub default_access: Access,
    /// Keys presented in `X-API-Key`.
    #[serde(default)]
    pub api_keys: Vec<CredentialConfig>,
    /// Static tokens presented as `Authorization: Bearer <token>`.
    #[serde(default)]
    pub bearer_tokens: Vec<CredentialConfig>,
    /// JWT issuers whose tokens are accepted as `Authorization: Bearer <jwt>`.
    #[serde(default)]
    pub jwt: Vec<JwtConfig>,
    /// Holders of client certificates (mutual TLS, `[server.tls] client_ca_file`), by the
    /// identity `client_identity` reads; `identity = "*"` covers every other verified one.
    #[serde(default)]
    pub client_certificates: Vec<ClientCertificateConfig>,
    /// Rules over a request's facts (its caller, agent, method, skill, headers, time) in
    /// CEL; see docs/security.md#policies.
    #[serde(default)]
    pub policies: Vec<PolicyConfig>,
}

/// One policy rule: when `when` holds for a request to one of `agents` (all agents when
/// empty), `effect` applies.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Named in refusals, logs and `a2a_policy_denials_total{rule}`; never the expression.
    pub id: String,
    pub effect: Effect,
    /// Agents it applies to; empty (the default): every agent. Not allowed in an agent
    /// file, whose rules apply to its agent.
    #[serde(default)]
    pub agents: Vec<String>,
    /// A CEL expression that yields a bool.
    #[schemars(with = "String")]
    pub when: Spanned<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// A request matching any deny rule is refused.
    Deny,
    /// Where allow rules apply to an agent, a request to it must match one.
    Allow,
}

/// What the holder of a verified client certificate may do.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientCertificateConfig {
    /// The certificate's identity (its common name, or the SAN `client_identity` names),
    /// or `*` for any verified certificate not listed otherwise.
    pub identity: String,
    /// Agents it may call; `["*"]` (the default) means all.
    #[serde(default = "all_agents")]
    pub agents: Vec<String>,
    #[serde(default)]
    pub revoked: bool,
    /// Rate-limit tier; unset: `default`.
    #[serde(default)]
    pub tier: Option<String>,
}

/// A shared secret, never inline: from an environment variable, a file, or given as the
/// hex SHA-256 of the secret (so the file holds no secret at all).
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    pub id: String,
    #[serde(default)]
    pub secret_env: Option<String>,
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    #[serde(default)]
    pub secret_sha256: Option<String>,
    /// Agents it may call; `["*"]` (the default) means all.
    #[serde(default = "all_agents")]
    pub agents: Vec<String>,
    #[serde(default)]
    pub revoked: bool,
    /// Rate-limit tier; unset: `default`.
    #[serde(default)]
    pub tier: Option<String>,
}

fn all_agents() -> Vec<String> {
    vec!["*".into()]
}

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    pub id: String,
    /// Pinned: tokens signed any other way (or `none`) are refused. HS256, RS256 or ES256.
    pub algorithm: String,
    /// HS256 secret, from the environment or a file.
    #[serde(default)]
    pub secret_env: Option<String>,
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// RS256/ES256: a PEM public key, or a JWKS file (keys chosen by `kid`).
    #[serde(default)]
    pub public_key_file: Option<PathBuf>,
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// A JWKS fetched over HTTP(S), kept and fetched again every `jwks_refresh_secs`.
    #[serde(default)]
    pub jwks_url: Option<String>,
    #[serde(default = "default_jwks_refresh")]
    pub jwks_refresh_secs: u64,
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default)]
    pub audience: Option<String>,
    /// Claim listing the agents a token may call (array, or space-separated string; "*"
    /// means all). Without the claim, the token may call no restricted agent.
    #[serde(default = "default_agents_claim")]
    pub agents_claim: String,
    #[serde(default = "default_leeway")]
    pub leeway_secs: u64,
    /// Rate-limit tier of its tokens; unset: `default`.
    #[serde(default)]
    pub tier: Option<String>,
}

/// How `POST /a2a` chooses an agent beyond follow-ups and explicit choices.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoutingConfig {
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
}

/// One routing rule: all the conditions it has must match.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    #[schemars(with = "String")]
    pub agent: Spanned<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub principal: Option<String>,
}

/// Requests per caller (by tier) and per agent. Nothing configured: no limits.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Proxies whose `X-Forwarded-For` is believed when identifying anonymous callers:
    /// addresses (`10.0.0.1`, `fd00::1`) or networks (`10.0.0.0/8`, `fd00::/8`), such as a
    /// load balancer's.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// By name; `default` applies to anonymous callers and credentials without a tier.
    #[serde(default)]
    pub tiers: std::collections::BTreeMap<String, TierConfig>,
    /// Per agent, all callers together.
    #[serde(default)]
    pub agents: std::collections::BTreeMap<String, QuotaConfig>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    pub requests_per_minute: u32,
    /// Requests allowed at once before the rate applies; default: a tenth of a minute's.
    #[serde(default)]
    pub burst: Option<u32>,
    /// Streams one caller may hold open.
    #[serde(default)]
    pub max_streams: Option<usize>,
    /// What a call costs against the allowance, by its 1.0 method name
    /// (`{ SendMessage = 5, GetTask = 1 }`); unnamed methods cost 1.
    #[serde(default)]
    pub weights: std::collections::BTreeMap<String, u32>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    pub requests_per_minute: u32,
    #[serde(default)]
    pub burst: Option<u32>,
}

fn default_jwks_refresh() -> u64 {
    300
}

fn default_agents_claim() -> String {
    "agents".into()
}
fn default_leeway() -> u64 {
    30
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CorsConfig {
    /// Origins browsers may call from (`"*"` for any). Empty: no CORS headers at all.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    #[serde(default)]
    pub allow_credentials: bool,
    #[serde(default = "default_cors_max_age")]
    pub max_age_secs: usize,
}

fn default_cors_max_age() -> usize {
    600
}

#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    pub organization: String,
    pub url: String,
}

/// One agent, as defined by one file in `agents.d/`.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentDef {
    pub name: String,
    /// Empty only for upstream agents, whose card then supplies it.
    pub description: String,
    /// Unset fields of an upstream agent come from its card; of a local one, defaults.
    pub version: Option<String>,
    pub provider: Option<Provider>,
    pub documentation_url: Option<String>,
    pub icon_url: Option<String>,
    pub default_input_modes: Option<Vec<String>>,
    pub default_output_modes: Option<Vec<String>>,
    pub skills: Vec<Skill>,
    /// What the agent's extended card adds (`[extended]`), for authenticated callers.
    pub extended: Option<ExtendedCard>,
    /// The A2A extensions it supports (`[[extensions]]`), listed in its card.
    pub extensions: Vec<Extension>,
    pub backend: BackendSpec,
    pub mailbox: Option<usize>,
    pub max_concurrency: Option<usize>,
    /// Unset: `auth.default_access`.
    pub access: Option<Access>,
    /// How it shows as MCP tools (`[mcp] tools` in its file).
    pub mcp_tools: McpTools,
    /// `[[policies]]` of the agent file: rules for calls to this agent.
    pub policies: Vec<PolicyConfig>,
    /// The file it came from, for messages.
    pub source: PathBuf,
    /// Made through the admin API and kept in the store, not read from a file.
    pub runtime: bool,
}

/// `[mcp]` in an agent file: how the agent shows in the gateway's MCP endpoint.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentMcp {
    #[serde(default)]
    pub tools: McpTools,
}

/// One tool for the agent (the default), or one per skill (named `<agent>.<skill id>`;
/// the message then says which skill in its metadata, `a2a-gateway/skill`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum McpTools {
    #[default]
    Agent,
    Skills,
}

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Skill {
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub examples: Vec<String>,
    #[serde(default)]
    pub input_modes: Vec<String>,
    #[serde(default)]
    pub output_modes: Vec<String>,
}

/// `[[extensions]]` in an agent file: an A2A extension the agent supports, as its card's
/// `capabilities.extensions` lists it.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Extension {
    pub uri: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A request must ask for it (`A2A-Extensions`), or it is refused (-32008).
    #[serde(default)]
    pub required: bool,
    /// The extension's own parameters, as its specification defines them.
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    pub params: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `[extended]` in an agent file: what the agent's extended card adds to its public one,
/// shown only to authenticated callers that may call the agent.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendedCard {
    /// Replaces the public card's description.
    #[serde(default)]
    pub description: Option<String>,
    /// Skills only the extended card lists, after the public ones.
    #[serde(default)]
    pub skills: Vec<Skill>,
}

/// What answers for an agent; `kind` in the `[backend]` table selects it.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum BackendSpec {
    Echo(EchoConfig),
    /// An A2A agent served elsewhere, reached over JSON-RPC.
    A2a(A2aConfig),
    /// A local program, one process per task.
    Command(CommandConfig),
    /// An OpenAI-compatible chat completions endpoint.
    OpenAi(OpenAiConfig),
}

impl BackendSpec {
    /// The `kind` the agent file gives it: `echo`, `a2a`, `command`, `openai`.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendSpec::Echo(_) => "echo",
            BackendSpec::A2a(_) => "a2a",
            BackendSpec::Command(_) => "command",
            BackendSpec::OpenAi(_) => "openai",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CommandIo {
    /// Message text on stdin; each stdout line is an artifact chunk.
    #[default]
    Text,
    /// The message as one JSON line on stdin; stdout lines are JSON events.
    Jsonl,
}

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// argv; no shell is involved. A program path with a `/` is relative to the agent
    /// file's directory (after loading: absolute).
    pub command: Vec<String>,
    /// Working directory, relative to the agent file's directory; default: that directory.
    /// After loading: absolute.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The only environment the process gets, besides PATH, HOME and LANG; `${VAR}` is
    /// replaced from the gateway's environment.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub io: CommandIo,
    /// A process living longer than this, waiting for input included, is stopped and its
    /// task failed.
    #[serde(default = "default_command_timeout")]
    pub timeout_secs: u64,
    /// Processes running at once for this agent; more wait their turn. A process whose task
    /// waits for input (jsonl) is not running: it gives its slot up while it waits and takes
    /// one again when the answer comes.
    #[serde(default = "default_command_concurrency")]
    pub max_concurrent: usize,
    /// Processes waiting for input at once (jsonl), at least 1. Parking one more stops the
    /// one that has waited longest and fails its task, so the agent never has more than
    /// `max_concurrent + max_waiting` processes (besides any it is stopping).
    #[serde(default = "default_command_waiting")]
    pub max_waiting: usize,
    /// Between SIGTERM and SIGKILL when stopping a process. A process waiting for input is
    /// given as long again before the SIGTERM to exit by itself once its stdin is closed.
    #[serde(default = "default_kill_grace")]
    pub kill_grace_ms: u64,
    /// The largest message given to the program (its text, or its JSON line); a larger one
    /// fails its task without starting anything.
    #[serde(default = "default_command_input")]
    pub max_input_bytes: usize,
    /// The most a process may write to stdout in its life; past it, it is stopped and its
    /// task failed (like the 16 MiB cap on upstream answers).
    #[serde(default = "default_command_output")]
    pub max_output_bytes: usize,
}

impl CommandConfig {
    /// The program when given by path, and the arguments that look like files (see
    /// [`looks_like_file`]), resolved against the working directory.
    pub(crate) fn named_files(&self) -> impl Iterator<Item = PathBuf> + '_ {
        let cwd = self.cwd.as_deref().unwrap_or(Path::new(""));
        let program = self
            .command
            .first()
            .filter(|p| p.contains('/'))
            .map(|p| cwd.join(p));
        let args = self
            .command
            .iter()
            .skip(1)
            .filter(|a| looks_like_file(a))
            .map(|a| cwd.join(a));
        program.into_iter().chain(args)
    }
}

/// An argument that names a file: a path with a `/` and an extension (`scripts/greet.py`,
/// `/opt/agent/main.js`), not an option, a URL or text with spaces. These are checked
/// when the configuration is read, and watched like the agent file.
pub(crate) fn looks_like_file(arg: &str) -> bool {
    arg.contains('/')
        && !arg.starts_with('-')
        && !arg.contains("://")
        && !arg.contains('=')
        && !arg.chars().any(char::is_whitespace)
        && Path::new(arg)
            .extension()
            .is_some_and(|x| !x.is_empty() && x.len() <= 5)
}

fn default_command_input() -> usize {
    1024 * 1024
}
fn default_command_output() -> usize {
    16 * 1024 * 1024
}

fn default_command_timeout() -> u64 {
    300
}
fn default_command_concurrency() -> usize {
    4
}
fn default_command_waiting() -> usize {
    16
}
fn default_kill_grace() -> u64 {
    2000
}

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct A2aConfig {
    /// Base URL of the remote agent (its card is at `/.well-known/agent-card.json`), or
    /// the URL of its card.
    pub url: String,
    /// "0.3" or "1.0"; otherwise learned from the remote card (1.0 preferred).
    #[serde(default)]
    pub protocol: Option<String>,
    /// Sent with every request upstream; `${VAR}` is replaced from the environment.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Limit for one non-streaming call, in seconds.
    #[serde(default = "default_upstream_timeout")]
    pub timeout_secs: u64,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_secs: u64,
    /// Overrides `limits.stream_keepalive_secs` for this agent's streams.
    #[serde(default)]
    pub stream_keepalive_secs: Option<u64>,
    /// How often the remote card is fetched again.
    #[serde(default = "default_card_refresh")]
    pub card_refresh_secs: u64,
    /// While the remote is unreachable, how often to try again.
    #[serde(default = "default_retry")]
    pub retry_secs: u64,
    /// Speak HTTP/2 without TLS (prior knowledge) to the remote: every call and stream
    /// shares a few connections instead of one descriptor each.
    #[serde(default)]
    pub http2: bool,
    /// Calls go to the origin `url` names; a card naming another origin is followed only
    /// when this says so, and then without the file's `headers` (they never cross origins).
    #[serde(default)]
    pub follow_card_url: bool,
    /// Serve the agent only while its card carries a signature that verifies against
    /// `card_jwks_url` or `card_jwks_file` (one of them is required).
    #[serde(default)]
    pub verify_card_signature: bool,
    /// The JWKS the card's signature is checked against, fetched with every card.
    #[serde(default)]
    pub card_jwks_url: Option<String>,
    /// The same, from a file (relative to the agent file), read with every card.
    #[serde(default)]
    pub card_jwks_file: Option<PathBuf>,
    /// Roots trusted for an `https` upstream besides the system's (PEM; relative to the
    /// agent file).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The client certificate (PEM chain) and key the gateway presents to the upstream.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
}

fn default_upstream_timeout() -> u64 {
    30
}
fn default_connect_timeout() -> u64 {
    5
}
fn default_card_refresh() -> u64 {
    300
}
fn default_retry() -> u64 {
    5
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EchoConfig {
    /// Pause between streamed chunks, to make streaming visible in demos.
    #[serde(default)]
    pub chunk_delay_ms: u64,
    /// The longest `/delay` a caller may ask for; longer ones wait this long.
    #[serde(default = "default_echo_max_delay")]
    pub max_delay_secs: u64,
}

fn default_echo_max_delay() -> u64 {
    60
}

/// Reads and checks both files. `config_path` None means "gateway.toml if present". What
/// is built from them (credentials, rate limits, rules) is checked by `setup::load`.
pub fn load(config_path: Option<&Path>, agents_dir: &Path) -> Result<Settings, Diagnostics> {
    let (settings, diags) = read(config_path, agents_dir);
    diags.into_result(settings)
}

/// Like [`load`], but returns what could be read beside every problem found, so that
/// later checks can add theirs.
pub fn read(config_path: Option<&Path>, agents_dir: &Path) -> (Settings, Diagnostics) {
    let mut diags = Diagnostics::default();
    let gateway = load_gateway(config_path, &mut diags);
    let agents = load_agents_dir(agents_dir, &mut diags);
    let mut gateway = gateway.unwrap_or_default();
    let gateway_file = config_path
        .unwrap_or(Path::new(DEFAULT_CONFIG_FILE))
        .to_path_buf();
    validate_gateway(&mut gateway, &gateway_file, &agents, &mut diags);
    (
        Settings {
            gateway,
            agents,
            gateway_file,
        },
        diags,
    )
}

const DEFAULT_CONFIG_FILE: &str = "gateway.toml";

fn load_gateway(path: Option<&Path>, diags: &mut Diagnostics) -> Option<GatewayConfig> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None if Path::new(DEFAULT_CONFIG_FILE).exists() => PathBuf::from(DEFAULT_CONFIG_FILE),
        None => return Some(GatewayConfig::default()),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            diags.push(Diagnostic::file(&path, format!("cannot read: {e}")));
            return None;
        }
    };
    match toml::from_str::<GatewayConfig>(&text) {
        Ok(cfg) => Some(cfg),
        Err(e) => {
            diags.push(Diagnostic::from_toml(&path, &text, &e));
            None
        }
    }
}

/// A policy id travels in refusals and as a metric label: letters, digits and `-_.:`,
/// at most 64 of them.
pub(crate) fn check_policy_id(id: &str) -> Result<(), String> {
    let fits = |c: char| c.is_ascii_alphanumeric() || "-_.:".contains(c);
    if id.is_empty() || id.len() > 64 || !id.chars().all(fits) {
        return Err(format!(
            "policy id \"{id}\" must be 1 to 64 letters, digits or -_.: characters"
        ));
    }
    Ok(())
}

/// Client certificates are credentials only where the TLS port asks for them.
fn check_client_certificates(gateway: &GatewayConfig, file: &Path, diags: &mut Diagnostics) {
    let tls = gateway.server.tls.as_ref();
    let asks = tls.is_some_and(|t| t.client_ca_file.is_some());
    if !asks && tls.is_some_and(|t| t.client_auth == ClientAuth::Required) {
        diags.push(Diagnostic::file(
            file,
            "server.tls: client_auth = \"required\" needs client_ca_file (the CA that issues client certificates)".to_string(),
        ));
    }
    let listed = &gateway.auth.client_certificates;
    if !asks && !listed.is_empty() {
        diags.push(Diagnostic::file(
            file,
            "auth.client_certificates needs [server.tls] with client_ca_file: no client presents a certificate otherwise".to_string(),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for c in listed {
        if c.identity.is_empty() {
            diags.push(Diagnostic::file(
                file,
                "auth.client_certificates: identity is empty".to_string(),
            ));
        } else if !seen.insert(c.identity.as_str()) {
            diags.push(Diagnostic::file(
                file,
                format!(
                    "auth.client_certificates: identity \"{}\" is listed twice",
                    c.identity
                ),
            ));
        }
    }
}

fn validate_gateway(
    gateway: &mut GatewayConfig,
    file: &Path,
    agents: &[AgentDef],
    diags: &mut Diagnostics,
) {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    if let Some(url) = &gateway.public_url {
        let u = url.get_ref();
        if !(u.starts_with("http://") || u.starts_with("https://")) || u.len() < 10 {
            diags.push(Diagnostic::at(
                file,
                &text,
                url.span().start,
                format!("public_url must be an absolute http(s) URL, got \"{u}\""),
            ));
        }
    }
    match &gateway.default_agent {
        Some(name) if !agents.iter().any(|a| a.name == *name.get_ref()) => {
            let known: Vec<_> = agents.iter().map(|a| a.name.as_str()).collect();
            diags.push(Diagnostic::at(
                file,
                &text,
                name.span().start,
                format!(
                    "default_agent \"{}\" is not defined in agents.d (defined: {})",
                    name.get_ref(),
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        None if agents.len() == 1 => {
            gateway.default_agent = Some(Spanned::new(0..0, agents[0].name.clone()));
        }
        _ => {}
    }
    let cors = &gateway.cors;
    // "null" is the origin of sandboxed frames and local files: any page can claim it,
    // so with credentials it is as open as "*".
    for open in ["*", "null"] {
        if cors.allow_credentials && cors.allowed_origins.iter().any(|o| o == open) {
            diags.push(Diagnostic::file(
                file,
                format!("cors: allow_credentials cannot be combined with the origin \"{open}\" (any page can claim it)"),
            ));
        }
    }
    check_client_certificates(gateway, file, diags);
    let t = &gateway.telemetry;
    if !(0.0..=1.0).contains(&t.sample_ratio) {
        diags.push(Diagnostic::file(
            file,
            format!(
                "telemetry.sample_ratio must be between 0 and 1, got {}",
                t.sample_ratio
            ),
        ));
    }
    if let Some(endpoint) = &t.otlp_endpoint {
        if url::Url::parse(endpoint).map_or(true, |u| !matches!(u.scheme(), "http" | "https")) {
            diags.push(Diagnostic::file(
                file,
                format!("telemetry.otlp_endpoint must be an http(s) URL, got \"{endpoint}\""),
            ));
        }
    }
    for (i, rule) in gateway.routing.rules.iter().enumerate() {
        let at = rule.agent.span().start;
        if !agents.iter().any(|a| a.name == *rule.agent.get_ref()) {
            diags.push(Diagnostic::at(
                file,
                &text,
                at,
                format!(
                    "routing rule {}: agent \"{}\" is not defined in agents.d",
                    i + 1,
                    rule.agent.get_ref()
                ),
            ));
        }
    }
    let mut policy_ids = std::collections::HashSet::new();
    for policy in &gateway.auth.policies {
        let at = |message: String| Diagnostic::at(file, &text, policy.when.span().start, message);
        if let Err(e) = check_policy_id(&policy.id) {
            diags.push(at(format!("auth.policies: {e}")));
        } else if !policy_ids.insert(policy.id.as_str()) {
            diags.push(at(format!(
                "auth.policies: policy \"{}\" is defined twice",
                policy.id
            )));
        }
        for name in &policy.agents {
            if !agents.iter().any(|a| &a.name == name) {
                diags.push(at(format!(
                    "auth.policies: policy \"{}\": agent \"{name}\" is not defined in agents.d",
                    policy.id
                )));
            }
        }
    }
    for name in gateway.rate_limits.agents.keys() {
        if !agents.iter().any(|a| &a.name == name) {
            diags.push(Diagnostic::file(
                file,
                format!("rate_limits.agents.{name}: no such agent in agents.d"),
            ));
        }
    }
    let l = &gateway.limits;
    // Every count and duration but `card_max_age_secs` (0: cards are not cached): a 0
    // would refuse everything or be raised silently, so it is refused here, by name.
    let set = |n: Option<usize>| n.map_or(1, |n| n as u64);
    for (key, value) in [
        ("limits.max_body_bytes", l.max_body_bytes as u64),
        ("limits.max_tasks", l.max_tasks as u64),
        ("limits.agent_mailbox", l.agent_mailbox as u64),
        (
            "limits.agent_max_concurrency",
            l.agent_max_concurrency as u64,
        ),
        ("limits.stream_keepalive_secs", l.stream_keepalive_secs),
        ("limits.max_open_streams", set(l.max_open_streams)),
        ("limits.max_connections", set(l.max_connections)),
        (
            "limits.max_connections_per_ip",
            set(l.max_connections_per_ip),
        ),
        ("limits.header_timeout_secs", l.header_timeout_secs),
        ("limits.body_timeout_secs", l.body_timeout_secs),
        (
            "limits.body_min_bytes_per_sec",
            l.body_min_bytes_per_sec as u64,
        ),
        (
            "limits.max_buffered_body_bytes",
            l.max_buffered_body_bytes as u64,
        ),
        (
            "limits.max_buffered_body_bytes_per_caller",
            set(l.max_buffered_body_bytes_per_caller),
        ),
        (
            "limits.max_buffered_body_bytes_anonymous",
            set(l.max_buffered_body_bytes_anonymous),
        ),
        (
            "limits.max_unfinished_tasks_per_caller",
            l.max_unfinished_tasks_per_caller as u64,
        ),
        ("limits.max_stored_bytes", l.max_stored_bytes.unwrap_or(1)),
        (
            "limits.max_unfinished_bytes_per_caller",
            l.max_unfinished_bytes_per_caller.unwrap_or(1),
        ),
        ("limits.interrupted_ttl_secs", l.interrupted_ttl_secs),
    ] {
        if value == 0 {
            diags.push(Diagnostic::file(file, format!("{key} must be at least 1")));
        }
    }
    let mcp = &gateway.mcp;
    for (key, value) in [
        ("mcp.max_sessions", mcp.max_sessions.unwrap_or(1) as u64),
        (
            "mcp.max_sessions_per_caller",
            mcp.max_sessions_per_caller as u64,
        ),
        ("mcp.idle_timeout_secs", mcp.idle_timeout_secs),
    ] {
        if value == 0 {
            diags.push(Diagnostic::file(file, format!("{key} must be at least 1")));
        }
    }
    for origin in &mcp.allowed_origins {
        let parsed = url::Url::parse(origin).ok().filter(|u| {
            matches!(u.scheme(), "http" | "https") && u.path() == "/" && !origin.ends_with('/')
        });
        if origin != "*" && parsed.is_none() {
            diags.push(Diagnostic::file(
                file,
                format!("mcp.allowed_origins: {origin:?} is not an origin (scheme://host[:port], as browsers send it, or \"*\")"),
            ));
        }
    }
    let reserved = ["/a2a", "/.well-known", "/metrics"];
    for (key, path, like) in [
        ("console.path", &gateway.console.path, "/console"),
        ("mcp.path", &gateway.mcp.path, "/mcp"),
    ] {
        if !path.starts_with('/')
            || path.len() < 2
            || path.ends_with('/')
            || path.contains(['?', '#', ' ', '{', '}'])
            || reserved
                .iter()
                .any(|r| path == r || path.starts_with(&format!("{r}/")))
        {
            diags.push(Diagnostic::file(
                file,
                format!("{key} {path:?}: an absolute path like \"{like}\", outside /a2a, /.well-known and /metrics"),
            ));
        }
    }
    if gateway.console.enabled && gateway.mcp.enabled && gateway.console.path == gateway.mcp.path {
        diags.push(Diagnostic::file(
            file,
            format!("mcp.path {:?} is the console's too", gateway.mcp.path),
        ));
    }
    push::check(&gateway.push, file, diags);
    usage::check(
        &gateway.usage,
        &gateway.pricing,
        &gateway.budgets,
        gateway.push.enabled,
        file,
        diags,
    );
    let store = &gateway.store;
    if !(1..=10_000).contains(&store.commit_interval_ms) {
        diags.push(Diagnostic::file(
            file,
            "store.commit_interval_ms must be between 1 and 10000",
        ));
    }
    if store.retention_secs > 100 * 365 * 24 * 3600 {
        diags.push(Diagnostic::file(
            file,
            "store.retention_secs must be at most 100 years (3153600000)",
        ));
    }
    if store.shared && store.kind != StoreKind::Postgres {
        diags.push(Diagnostic::file(
            file,
            "store.shared applies to kind = \"postgres\" (a Redis store is always shared)",
        ));
    }
    if (store.kind == StoreKind::Redis || store.shared) && store.lease_secs < 2 {
        diags.push(Diagnostic::file(
            file,
            "store.lease_secs must be at least 2",
        ));
    }
    if store.kind == StoreKind::Redis {
        if store.retention_secs == 0 {
            diags.push(Diagnostic::file(
                file,
                "store.retention_secs must be at least 1 with kind = \"redis\": finished tasks leave Redis only by expiring",
            ));
        }
        if let Err(e) = url::Url::parse(&store.url)
            .map_err(|e| e.to_string())
            .and_then(|u| match u.scheme() {
                "redis" | "rediss" | "redis+unix" | "unix" => Ok(()),
                other => Err(format!("the scheme {other}: is not redis:// or rediss://")),
            })
        {
            diags.push(Diagnostic::file(file, format!("store.url: {e}")));
        }
        if store.key_prefix.is_empty() {
            diags.push(Diagnostic::file(file, "store.key_prefix must not be empty"));
        }
    }
    if store.kind == StoreKind::Postgres {
        let scheme = url::Url::parse(&store.url).map(|u| u.scheme().to_string());
        if !matches!(scheme.as_deref(), Ok("postgres" | "postgresql")) {
            diags.push(Diagnostic::file(
                file,
                format!(
                    "store.url: kind = \"postgres\" needs a postgres://user@host:port/database URL (got {:?})",
                    redacted_url(&store.url)
                ),
            ));
        }
        let mode = url::Url::parse(&store.url).ok().and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == "sslmode")
                .map(|(_, v)| v.into_owned())
        });
        if let Some(mode) = mode.filter(|m| !POSTGRES_SSL_MODES.iter().any(|(n, _)| n == m)) {
            let names: Vec<&str> = POSTGRES_SSL_MODES.iter().map(|(n, _)| *n).collect();
            diags.push(Diagnostic::file(
                file,
                format!("store.url: sslmode={mode} is none of {}", names.join(", ")),
            ));
        }
        let name_ok = store.schema.len() <= 63
            && store
                .schema
                .starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && store
                .schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !name_ok {
            diags.push(Diagnostic::file(
                file,
                "store.schema must be 1 to 63 lowercase letters, digits and _, not starting with a digit",
            ));
        }
    }
}

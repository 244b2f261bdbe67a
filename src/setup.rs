//! From settings to the parts the gateway runs with. The credentials (secrets and keys read
//! from their variables and files), the rate limits and the routing rules are built here,
//! once; a part that cannot be built is reported like any load error, so `check` and
//! `serve` report every problem of a configuration in one go.
//!
//! `config` reads and checks the files and knows nothing of what is built from them; this
//! module sits above it and the modules it builds (auth, limits, routing).

use std::path::{Path, PathBuf};

use crate::auth::{AdminAuth, Authenticator};
use crate::config::{self, Diagnostic, Diagnostics, Settings};
use crate::limits::RateLimits;
use crate::policy::Policies;
use crate::routing::Rule;

/// Settings with their parts built.
pub struct Ready {
    pub settings: Settings,
    pub(crate) auth: Authenticator,
    pub(crate) rates: RateLimits,
    pub(crate) rules: Vec<Rule>,
    pub(crate) policies: Policies,
    /// Who may use the admin API.
    pub(crate) admin: AdminAuth,
    /// Where they were read from, to read them again on reload; none for settings made
    /// in memory (which then cannot be reloaded).
    pub source: Option<Source>,
    /// What loads but likely does not mean what it says (`check` prints these, `serve`
    /// and reloads log them).
    pub warnings: Vec<Diagnostic>,
}

/// Where the configuration comes from, and what the command line adds to it each time it
/// is read.
#[derive(Debug, Clone)]
pub struct Source {
    pub config: Option<PathBuf>,
    pub agents_dir: PathBuf,
    /// `serve --auth-token`, applied again on every reload.
    pub auth_token: Option<String>,
    /// `serve --host/--port/--workers`, over `[server]`.
    pub host: Option<String>,
    pub port: Option<u16>,
    pub workers: Option<usize>,
    /// `serve --grpc-port`, over `[server] grpc_port`.
    pub grpc_port: Option<u16>,
    /// `serve --data-dir`, over `[store] data_dir`.
    pub data_dir: Option<PathBuf>,
}

impl Source {
    /// Reads and builds the configuration; every problem of it, or the ready parts.
    pub fn load(&self) -> Result<Ready, Diagnostics> {
        self.load_with(&[])
    }

    /// [`Self::load`], with `runtime` agents (the admin API's) beside the files' ones. A
    /// file's agent of the same name wins: the runtime one is left out, and a warning says
    /// so.
    pub fn load_with(&self, runtime: &[config::AgentDef]) -> Result<Ready, Diagnostics> {
        let (mut settings, mut diags) = config::read(self.config.as_deref(), &self.agents_dir);
        add_runtime(&mut settings, runtime);
        let server = &mut settings.gateway.server;
        if let Some(host) = &self.host {
            server.host.clone_from(host);
        }
        if let Some(port) = self.port {
            server.port = port;
        }
        if let Some(workers) = self.workers {
            server.workers = workers;
        }
        if let Some(port) = self.grpc_port {
            server.grpc_port = Some(port);
        }
        if let Some(dir) = &self.data_dir {
            // A flag's path is the shell's: relative to where the gateway was started.
            settings.gateway.store.data_dir =
                std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        }
        if let Some(token) = &self.auth_token {
            if let Err(e) = settings.require_bearer_token(token) {
                diags.push(Diagnostic::file(&settings.gateway_file, e));
            }
        }
        let parts = parts(&settings, &mut diags);
        match parts {
            Some((auth, rates, rules, policies, admin)) if diags.0.is_empty() => Ok(Ready {
                warnings: warnings(&policies),
                settings,
                auth,
                rates,
                rules,
                policies,
                admin,
                source: Some(self.clone()),
            }),
            _ => Err(diags),
        }
    }
}

/// Adds `runtime` agents to `settings`, but those a file defines already.
pub fn add_runtime(settings: &mut Settings, runtime: &[config::AgentDef]) {
    for agent in runtime {
        match settings.agents.iter().find(|a| a.name == agent.name) {
            Some(file) => tracing::warn!(
                agent = %agent.name,
                file = %file.source.display(),
                "an agent file defines the name of a runtime agent: the file's is served"
            ),
            None => settings.agents.push(agent.clone()),
        }
    }
}

/// Reads both files and builds their parts; every problem of either, or the ready parts.
pub fn load(config_path: Option<&Path>, agents_dir: &Path) -> Result<Ready, Diagnostics> {
    let (settings, mut diags) = config::read(config_path, agents_dir);
    let parts = parts(&settings, &mut diags);
    match parts {
        Some((auth, rates, rules, policies, admin)) if diags.0.is_empty() => Ok(Ready {
            warnings: warnings(&policies),
            settings,
            auth,
            rates,
            rules,
            policies,
            admin,
            source: None,
        }),
        _ => Err(diags),
    }
}

/// Builds the parts of settings already read (and perhaps changed, as `--auth-token` does).
pub fn build(settings: Settings) -> Result<Ready, Diagnostics> {
    let mut diags = Diagnostics::default();
    match parts(&settings, &mut diags) {
        Some((auth, rates, rules, policies, admin)) => Ok(Ready {
            warnings: warnings(&policies),
            settings,
            auth,
            rates,
            rules,
            policies,
            admin,
            source: None,
        }),
        None => Err(diags),
    }
}

fn parts(
    settings: &Settings,
    diags: &mut Diagnostics,
) -> Option<(Authenticator, RateLimits, Vec<Rule>, Policies, AdminAuth)> {
    let gateway = &settings.gateway;
    let file = settings.gateway_file.as_path();
    let before = diags.0.len();
    let auth = Authenticator::build(&gateway.auth)
        .map_err(|errors| {
            for e in errors {
                diags.push(Diagnostic::file(file, format!("auth: {e}")));
            }
        })
        .ok();
    let admin = AdminAuth::build(&gateway.admin)
        .map_err(|errors| {
            for e in errors {
                diags.push(Diagnostic::file(file, format!("admin: {e}")));
            }
        })
        .ok();
    let rates = RateLimits::build(&gateway.rate_limits, &gateway.auth)
        .map_err(|errors| {
            for e in errors {
                diags.push(Diagnostic::file(file, format!("rate_limits: {e}")));
            }
        })
        .ok();
    let mut text = None;
    let mut rules = Vec::new();
    for (i, rule) in gateway.routing.rules.iter().enumerate() {
        match Rule::build(rule) {
            Ok(r) => rules.push(r),
            Err(e) => {
                // The file again, only to turn the rule's offset into a line and column.
                let text =
                    text.get_or_insert_with(|| std::fs::read_to_string(file).unwrap_or_default());
                diags.push(Diagnostic::at(
                    file,
                    text,
                    rule.agent.span().start,
                    format!("routing rule {}: {e}", i + 1),
                ));
            }
        }
    }
    let policies = Policies::build(file, &gateway.auth.policies, &settings.agents)
        .map_err(|errors| {
            for e in errors {
                let text = std::fs::read_to_string(&e.file).unwrap_or_default();
                let at = expression_start(&text, e.when_at) + e.offset;
                diags.push(Diagnostic::at(&e.file, &text, at, e.message));
            }
        })
        .ok();
    if diags.0.len() > before {
        return None;
    }
    Some((auth?, rates?, rules, policies?, admin?))
}

/// The policies' warnings, each where its rule's expression says what it warns about.
fn warnings(policies: &Policies) -> Vec<Diagnostic> {
    (policies.warnings().iter())
        .map(|w| {
            let text = std::fs::read_to_string(&w.file).unwrap_or_default();
            let at = expression_start(&text, w.when_at) + w.offset;
            Diagnostic::at(&w.file, &text, at, w.message.clone())
        })
        .collect()
}

/// Where the text of the TOML string at `at` begins: past its opening quotes, and past
/// the newline right after `"""` or `'''` (which TOML drops). Offsets inside it are exact
/// for strings without escapes.
fn expression_start(text: &str, at: usize) -> usize {
    let rest = text.get(at..).unwrap_or_default();
    for quotes in ["\"\"\"", "'''"] {
        if let Some(after) = rest.strip_prefix(quotes) {
            let newline = [("\r\n", 2), ("\n", 1)]
                .iter()
                .find(|(nl, _)| after.starts_with(nl))
                .map_or(0, |(_, n)| *n);
            return at + 3 + newline;
        }
    }
    at + 1
}

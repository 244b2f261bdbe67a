//! The command line: `serve` and `check`. Flags fall back to `A2A_GATEWAY_*` environment
//! variables, then to `gateway.toml`, then to defaults.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::app::Application;
use crate::card::agent_path;
use crate::config;

/// Exit status for an invalid configuration (EX_USAGE), as supervisors expect.
const EXIT_BAD_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "a2a-gateway",
    version,
    about = "One front door for many A2A agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the gateway.
    Serve(ServeArgs),
    /// Validate gateway.toml and agents.d/, printing every error as file:line:col: message.
    Check(ConfigArgs),
    /// Print the JSON schema of gateway.toml or of an agent file, for editors.
    Schema {
        #[arg(value_enum)]
        of: config::SchemaOf,
    },
    /// Speak MCP on stdin/stdout, relaying to a running gateway's MCP endpoint: for MCP
    /// clients that launch a local server.
    Mcp(McpArgs),
    /// Call a running gateway's admin API (`/admin/v1`): agents and keys, for scripts.
    Admin {
        #[command(flatten)]
        at: AdminArgs,
        #[command(subcommand)]
        what: AdminCommand,
    },
    /// Runtime agents (made through the admin API) as agent files.
    Agents {
        #[command(subcommand)]
        what: AgentsCommand,
    },
    /// Certificates for serving HTTPS.
    Cert {
        #[command(subcommand)]
        what: CertCommand,
    },
}

#[derive(Subcommand)]
enum CertCommand {
    /// A local CA (made once, kept) and a server certificate it signs for localhost,
    /// 127.0.0.1 and ::1; prints the [server.tls] lines and how to trust the CA.
    Dev {
        /// Where to write ca.pem, ca.key, server.pem and server.key
        #[arg(default_value = "dev-certs")]
        dir: PathBuf,
        /// Another name or IP address for the server certificate (repeatable)
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
}

#[derive(Args)]
struct AdminArgs {
    /// The gateway (or its admin listener)
    #[arg(long, env = "A2A_GATEWAY_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// The environment variable holding an admin secret ([[admin.keys]])
    #[arg(long, default_value = "A2A_GATEWAY_ADMIN_TOKEN")]
    token_env: String,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Runtime keys for callers.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Agents: list them, put or delete a runtime one.
    #[command(subcommand)]
    Agents(AdminAgentsCommand),
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Issue a key; its secret is printed this once.
    Create {
        #[arg(long, default_value = "")]
        description: String,
        /// An agent it may call (repeat; none: all)
        #[arg(long = "agent")]
        agents: Vec<String>,
        /// Its rate-limit tier
        #[arg(long)]
        tier: Option<String>,
        /// When it stops working (RFC 3339)
        #[arg(long)]
        expires_at: Option<String>,
    },
    List,
    /// A new secret; the old one works for --grace-secs more.
    Rotate {
        id: String,
        #[arg(long, default_value_t = 0)]
        grace_secs: u64,
    },
    Revoke {
        id: String,
    },
}

#[derive(Subcommand)]
enum AdminAgentsCommand {
    List,
    /// Create or replace runtime agent NAME from FILE (an agent file, or its keys as .json).
    Put {
        name: String,
        file: PathBuf,
    },
    Delete {
        name: String,
    },
}

#[derive(Subcommand)]
enum AgentsCommand {
    /// Write every runtime agent as DIR/<name>.toml, to move into Git.
    Export {
        dir: PathBuf,
        #[command(flatten)]
        at: AdminArgs,
    },
}

#[derive(Args)]
struct McpArgs {
    /// The gateway's MCP endpoint
    #[arg(
        long,
        env = "A2A_GATEWAY_MCP_URL",
        default_value = "http://127.0.0.1:8080/mcp"
    )]
    url: String,
    /// The environment variable holding an API key to send as X-API-Key
    #[arg(long)]
    api_key_env: Option<String>,
    /// A CA certificate (PEM) to trust besides the system's, for a gateway serving HTTPS
    /// with a certificate of its own (`a2a-gateway cert dev` prints the one to pass)
    #[arg(long, env = "A2A_GATEWAY_CA_FILE")]
    ca_file: Option<PathBuf>,
}

#[derive(Args)]
struct ConfigArgs {
    /// Gateway settings file [default: gateway.toml if it exists]
    #[arg(long, env = "A2A_GATEWAY_CONFIG")]
    config: Option<PathBuf>,
    /// Directory of agent definitions, one *.toml per agent
    #[arg(long, env = "A2A_GATEWAY_AGENTS_DIR", default_value = "agents.d")]
    agents_dir: PathBuf,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Address to listen on [default: server.host in gateway.toml, else 127.0.0.1]
    #[arg(long, env = "A2A_GATEWAY_HOST")]
    host: Option<String>,
    /// Port to listen on; 0 picks a free port [default: server.port, else 8080]
    #[arg(long, env = "A2A_GATEWAY_PORT")]
    port: Option<u16>,
    /// Worker threads [default: one per core]
    #[arg(long, env = "A2A_GATEWAY_WORKERS")]
    workers: Option<usize>,
    /// Serve the gRPC binding on this port too; 0 picks a free one [default:
    /// server.grpc_port, else off]
    #[arg(long, env = "A2A_GATEWAY_GRPC_PORT")]
    grpc_port: Option<u16>,
    /// One bearer token for every agent, which all then require it
    /// (`Authorization: Bearer TOKEN`), beside any credentials gateway.toml names
    #[arg(long, env = "A2A_GATEWAY_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// Directory of the SQLite store [default: store.data_dir in gateway.toml]
    #[arg(long, env = "A2A_GATEWAY_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Write the gateway's process id to this file once it listens (removed when it
    /// exits), for `kill -HUP $(cat FILE)`: a reload that signals this gateway only
    #[arg(long, env = "A2A_GATEWAY_PID_FILE")]
    pid_file: Option<PathBuf>,
    /// Log lines as text (colours only on a terminal) or one JSON object per line
    #[arg(
        long,
        env = "A2A_GATEWAY_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

pub fn run() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => check(&args),
        Command::Serve(args) => serve(args),
        Command::Mcp(args) => mcp(&args),
        Command::Admin { at, what } => admin(&at, what),
        Command::Agents {
            what: AgentsCommand::Export { dir, at },
        } => export(&at, &dir),
        Command::Cert {
            what: CertCommand::Dev { dir, hosts },
        } => cert_dev(&dir, &hosts),
        Command::Schema { of } => {
            let text = serde_json::to_string_pretty(&config::schema(of)).unwrap_or_default();
            use std::io::Write as _;
            let _ = writeln!(std::io::stdout().lock(), "{text}");
            ExitCode::SUCCESS
        }
    }
}

fn cert_dev(dir: &std::path::Path, hosts: &[String]) -> ExitCode {
    let issued = match crate::devcert::issue(dir, hosts) {
        Ok(issued) => issued,
        Err(e) => {
            eprintln!("cert dev: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ca = issued.ca_cert.display();
    let ca_said = match issued.ca_made {
        true => "a new CA",
        false => "the CA already there",
    };
    let text = format!(
        "Wrote {cert} and {key}, signed by {ca_said} ({ca}),\n\
         for {names}, valid until {expires}.\n\
         \n\
         Serve HTTPS with them: add to gateway.toml\n\
         \n\
         [server.tls]\n\
         cert_file = \"{cert}\"\n\
         key_file = \"{key}\"\n\
         \n\
         Then trust the CA (and only it: keep ca.key private):\n\
         \x20 curl          curl --cacert {ca} https://127.0.0.1:8080/a2a/health\n\
         \x20 Python        SSL_CERT_FILE={ca} python client.py   (httpx, so the A2A SDK; requests: REQUESTS_CA_BUNDLE)\n\
         \x20 Node.js       NODE_EXTRA_CA_CERTS={ca} node client.mjs\n\
         \x20 stdio bridge  a2a-gateway mcp --url https://127.0.0.1:8080 --ca-file {ca}\n\
         \x20 grpcurl       grpcurl -cacert {ca} 127.0.0.1:GRPC_PORT list",
        cert = issued.cert.display(),
        key = issued.key.display(),
        names = issued.names.join(", "),
        expires = issued.expires,
    );
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
    ExitCode::SUCCESS
}

/// The admin API's target, or why there is none.
fn admin_target(at: &AdminArgs) -> Result<crate::admin::client::Target, ExitCode> {
    match std::env::var(&at.token_env) {
        Ok(token) if !token.trim().is_empty() => Ok(crate::admin::client::Target {
            url: at.url.clone(),
            token: token.trim().to_string(),
        }),
        _ => {
            eprintln!(
                "admin: set {} to an admin secret ([[admin.keys]] in gateway.toml), or name another variable with --token-env",
                at.token_env
            );
            Err(ExitCode::from(EXIT_BAD_CONFIG))
        }
    }
}

/// Runs `fut` on a runtime of its own, with the TLS provider the gateway uses.
fn block_on<T>(fut: impl std::future::Future<Output = T>) -> Result<T, ExitCode> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Ok(rt.block_on(fut)),
        Err(e) => {
            eprintln!("{e}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// `admin …`: one call, its answer printed as JSON.
fn admin(at: &AdminArgs, what: AdminCommand) -> ExitCode {
    use crate::admin::client::Call;
    let target = match admin_target(at) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let call = match what {
        AdminCommand::Keys(KeysCommand::Create {
            description,
            agents,
            tier,
            expires_at,
        }) => Call::CreateKey {
            description,
            agents,
            tier,
            expires_at,
        },
        AdminCommand::Keys(KeysCommand::List) => Call::ListKeys,
        AdminCommand::Keys(KeysCommand::Rotate { id, grace_secs }) => {
            Call::RotateKey { id, grace_secs }
        }
        AdminCommand::Keys(KeysCommand::Revoke { id }) => Call::RevokeKey(id),
        AdminCommand::Agents(AdminAgentsCommand::List) => Call::ListAgents,
        AdminCommand::Agents(AdminAgentsCommand::Put { name, file }) => {
            Call::PutAgent { name, file }
        }
        AdminCommand::Agents(AdminAgentsCommand::Delete { name }) => Call::DeleteAgent(name),
    };
    match block_on(crate::admin::client::run(&target, call)) {
        Ok(Ok(answer)) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&answer).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("admin: {e}");
            ExitCode::FAILURE
        }
        Err(code) => code,
    }
}

/// `agents export DIR`.
fn export(at: &AdminArgs, dir: &std::path::Path) -> ExitCode {
    let target = match admin_target(at) {
        Ok(t) => t,
        Err(code) => return code,
    };
    match block_on(crate::admin::client::export(&target, dir)) {
        Ok(Ok(written)) => {
            for file in &written {
                println!("{file}");
            }
            eprintln!(
                "{} runtime agent(s) written to {}",
                written.len(),
                dir.display()
            );
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("agents export: {e}");
            ExitCode::FAILURE
        }
        Err(code) => code,
    }
}

/// `mcp`: the stdio bridge. Stdout carries the protocol, so what goes wrong goes to stderr.
fn mcp(args: &McpArgs) -> ExitCode {
    let key = match &args.api_key_env {
        Some(name) => match std::env::var(name) {
            Ok(key) if !key.trim().is_empty() => Some(key.trim().to_string()),
            _ => {
                eprintln!("mcp: the environment variable {name} (--api-key-env) is not set");
                return ExitCode::from(EXIT_BAD_CONFIG);
            }
        },
        None => None,
    };
    // rmcp's HTTP client (reqwest, rustls) takes the process's provider: ring, as the
    // gateway's own TLS uses.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mcp: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ca = match &args.ca_file {
        Some(path) => match std::fs::read(path) {
            Ok(pem) => Some(pem),
            Err(e) => {
                eprintln!("mcp: --ca-file {}: {e}", path.display());
                return ExitCode::from(EXIT_BAD_CONFIG);
            }
        },
        None => None,
    };
    let target = crate::mcp::BridgeTarget {
        url: args.url.clone(),
        api_key: key,
        ca_pem: ca,
    };
    match runtime.block_on(crate::mcp::bridge(target)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp: {e}");
            ExitCode::FAILURE
        }
    }
}

fn check(args: &ConfigArgs) -> ExitCode {
    match crate::setup::load(args.config.as_deref(), &args.agents_dir) {
        Ok(crate::setup::Ready {
            settings, warnings, ..
        }) => {
            for w in &warnings {
                eprintln!("warning: {w}");
            }
            println!(
                "ok: {} agent(s) in {}: {}",
                settings.agents.len(),
                args.agents_dir.display(),
                settings
                    .agents
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            ExitCode::SUCCESS
        }
        Err(diags) => {
            eprint!("{diags}");
            eprintln!("{} error(s)", diags.0.len());
            ExitCode::from(1)
        }
    }
}

/// Logging to stderr through a writer thread; the guard flushes it when dropped at exit.
fn init_tracing(format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_env("A2A_GATEWAY_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal();
    // Not lossy: under a flood of lines the workers wait rather than drop an error line.
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .finish(std::io::stderr());
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        // One object per line, with the request span's fields, for log collectors.
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(writer)
                    .with_filter(OrdinaryEvents),
            )
            .try_init(),
        // Colours only for people: files and log collectors get plain text.
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(writer)
                    .with_filter(OrdinaryEvents),
            )
            .try_init(),
    };
    guard
}

/// Leaves out what a library logs as an error although it is an ordinary event: rmcp's
/// "failed to send pending response during drain", logged whenever a call is canceled or
/// its client leaves (its answer has nobody to go to). An operator should not see errors
/// for normal events.
struct OrdinaryEvents;

impl<S> tracing_subscriber::layer::Filter<S> for OrdinaryEvents {
    fn enabled(
        &self,
        _: &tracing::Metadata<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        true
    }

    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let meta = event.metadata();
        if *meta.level() != tracing::Level::ERROR || !meta.target().starts_with("rmcp") {
            return true;
        }
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    let text = format!("{value:?}");
                    self.0 |= text == "failed to send pending response during drain";
                }
            }
        }
        let mut ordinary = Message(false);
        event.record(&mut ordinary);
        !ordinary.0
    }
}

fn refuse_to_start(diags: &config::Diagnostics) -> ExitCode {
    eprint!("{diags}");
    eprintln!(
        "refusing to start: {} configuration error(s)",
        diags.0.len()
    );
    ExitCode::from(EXIT_BAD_CONFIG)
}

fn serve(args: ServeArgs) -> ExitCode {
    let _flush_logs_at_exit = init_tracing(args.log_format);
    if let Some(limit) = crate::limits::raise_open_file_limit() {
        tracing::debug!(limit, "open-file limit");
    }
    let source = crate::setup::Source {
        config: args.config.config.clone(),
        agents_dir: args.config.agents_dir.clone(),
        auth_token: args.auth_token.clone(),
        host: args.host.clone(),
        port: args.port,
        workers: args.workers,
        grpc_port: args.grpc_port,
        data_dir: args.data_dir.clone(),
    };
    // Read, checked and built whole (the same path a reload takes).
    let ready = match source.load() {
        Ok(ready) => ready,
        Err(diags) => return refuse_to_start(&diags),
    };
    for w in &ready.warnings {
        tracing::warn!(warning = %w, "configuration");
    }
    let settings = &ready.settings;
    let host = settings.gateway.server.host.clone();
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let no_auth = settings.gateway.auth.api_keys.is_empty()
        && settings.gateway.auth.bearer_tokens.is_empty()
        && settings.gateway.auth.jwt.is_empty();
    if no_auth && !loopback {
        tracing::warn!(
            %host,
            "serving without authentication on a non-loopback address: anyone who can reach it can call every agent"
        );
    }
    let settings = &ready.settings;
    let public_url = settings.gateway.public_url().map(str::to_string);
    let agents: Vec<String> = settings.agents.iter().map(|a| a.name.clone()).collect();
    let default_agent = settings.gateway.default_agent_name().map(str::to_string);
    let pid_file = args.pid_file.clone();
    let scheme = match settings.gateway.server.tls {
        Some(_) => "https",
        None => "http",
    };

    let result = actix_web::rt::System::new().block_on(async move {
        // SIGHUP's default action ends the process: taken over before anything slow
        // (upstream cards), so a reload sent while starting is not fatal.
        let _ = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        let app = match Application::serve(ready).await {
            Ok(app) => app,
            Err(e) => {
                eprintln!("cannot start: {e}");
                return Err(e);
            }
        };
        let base = public_url.unwrap_or_else(|| format!("{scheme}://{host}:{}", app.port()));
        let console = app.console_path();
        let _pid_file = match pid_file.map(PidFile::write).transpose() {
            Ok(f) => f,
            Err(e) => {
                eprintln!("cannot start: {e}");
                return Err(e);
            }
        };
        let grpc = app.grpc_port().map(|port| format!("{host}:{port}"));
        let push = app.push_described();
        let banner = Banner {
            base: &base,
            agents: &agents,
            default_agent: default_agent.as_deref(),
            grpc: grpc.as_deref(),
            metrics_port: app.metrics_port(),
            store: app.store(),
            console: console.as_deref(),
            push: push.as_deref(),
        };
        banner.print();
        app.run().await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// The file `--pid-file` names, holding this process's id while it runs.
struct PidFile(PathBuf);

impl PidFile {
    fn write(path: PathBuf) -> std::io::Result<PidFile> {
        std::fs::write(&path, format!("{}\n", std::process::id())).map_err(|e| {
            std::io::Error::new(e.kind(), format!("--pid-file {}: {e}", path.display()))
        })?;
        Ok(PidFile(path))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        // Only if it is still ours: another gateway may have been started on the same file.
        let ours = std::fs::read_to_string(&self.0)
            .is_ok_and(|s| s.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// What `serve` prints once it listens.
struct Banner<'a> {
    base: &'a str,
    agents: &'a [String],
    default_agent: Option<&'a str>,
    grpc: Option<&'a str>,
    metrics_port: Option<u16>,
    store: &'a str,
    console: Option<&'a str>,
    push: Option<&'a str>,
}

impl Banner<'_> {
    fn print(&self) {
        use std::fmt::Write as _;
        use std::io::Write as _;
        let Banner {
            base,
            agents,
            default_agent,
            grpc,
            metrics_port,
            store,
            console,
            push,
        } = *self;
        let mut banner = format!(
            "a2a-gateway {} listening on {base}\n",
            env!("CARGO_PKG_VERSION")
        );
        let _ = writeln!(
            banner,
            "  gateway card   {base}/.well-known/agent-card.json"
        );
        let metrics = match metrics_port {
            Some(port) => format!("port {port} /metrics"),
            None => format!("{base}/metrics"),
        };
        let _ = writeln!(
            banner,
            "  health         {base}/a2a/health   ready {base}/a2a/ready   metrics {metrics}"
        );
        let _ = writeln!(banner, "  agent list     {base}/a2a/agents");
        if let Some(target) = grpc {
            let _ = writeln!(
                banner,
                "  grpc           {target} (lf.a2a.v1.A2AService; the tenant field names the agent)"
            );
        }
        let pid = std::process::id();
        let _ = writeln!(
            banner,
            "  process        pid {pid}: kill -HUP {pid} reloads, kill -TERM {pid} drains and stops"
        );
        let _ = writeln!(banner, "  task store     {store}");
        if let Some(path) = console {
            let _ = writeln!(banner, "  console        {base}{path}");
        }
        if let Some(push) = push {
            let _ = writeln!(
                banner,
                "  push           {push}; keys {base}/.well-known/jwks.json"
            );
        }
        let _ = writeln!(
            banner,
            "  POST {base}/a2a  ->  {}",
            default_agent.unwrap_or("(no default agent)")
        );
        for name in agents {
            let path = agent_path(name);
            let _ = writeln!(
                banner,
                "  agent {name:<12} POST {base}{path}   card {base}{path}/card"
            );
        }
        // Whoever started the gateway may have stopped reading (`| head`, a supervisor that
        // closed the pipe): println! would then panic and take the gateway down with it.
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(banner.as_bytes()).and_then(|()| out.flush());
    }
}

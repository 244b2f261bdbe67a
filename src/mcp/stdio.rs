//! `a2a-gateway mcp --url URL [--ca-file CA.pem]`: MCP on stdin/stdout for clients that launch a local server,
//! relaying to a running gateway's `/mcp` over HTTP. Both sides are rmcp's: an MCP server on
//! stdio whose handlers call the gateway as an MCP client. Progress, the agents' questions
//! and a changed tool list travel back to the local client.
//!
//! The gateway is reached in the local client's protocol era: a client of the handshake
//! era (through 2025-11-25) gets the gateway's questions as `elicitation/create` requests,
//! which the bridge puts to it; a 2026-07-28 client gets them as input requests, passed
//! through as they come, and answers them by calling again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CancelledNotificationParam,
    ClientCapabilities, ClientRequest, ElicitRequestParams, ElicitResult, ElicitationAction,
    InitializeRequestParams, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, ProtocolVersion, ResultType, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ErrorData as McpError, Peer, RoleClient, RoleServer, ServerHandler};

/// What the gateway's side shares with the local one: the local client, once it has
/// connected (where the gateway's messages go), and which local progress token each
/// call's own token stands for.
#[derive(Default)]
struct Shared {
    local: OnceLock<Peer<RoleServer>>,
    tokens: Mutex<HashMap<ProgressToken, ProgressToken>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ProgressToken, ProgressToken>> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }
}

type Remote = Arc<RunningService<RoleClient, Messages>>;

/// Where the bridge relays to: the gateway's MCP endpoint (or its base URL, to which
/// `/mcp` is added), the API key sent as `X-API-Key`, and a CA to trust besides the
/// system's.
pub(crate) struct BridgeTarget {
    pub(crate) url: String,
    pub(crate) api_key: Option<String>,
    pub(crate) ca_pem: Option<Vec<u8>>,
}

/// The gateway as the bridge calls it.
struct Gateway {
    url: Arc<str>,
    api_key: Option<String>,
    client: reqwest013::Client,
}

impl Gateway {
    fn of(target: BridgeTarget) -> Result<Gateway, String> {
        let url = endpoint(&target.url)?;
        let mut client = reqwest013::Client::builder();
        if let Some(pem) = &target.ca_pem {
            let certs = reqwest013::Certificate::from_pem_bundle(pem)
                .map_err(|e| format!("--ca-file: not PEM certificates: {e}"))?;
            if certs.is_empty() {
                return Err("--ca-file: no certificate in the file".into());
            }
            client = client.tls_certs_merge(certs);
        }
        let client = client
            .build()
            .map_err(|e| format!("the HTTP client: {e}"))?;
        Ok(Gateway {
            url: url.into(),
            api_key: target.api_key,
            client,
        })
    }
}

/// The MCP endpoint `url` names: the URL itself, or `/mcp` under a gateway's base URL
/// (`https://host:8080` or `…/`).
fn endpoint(url: &str) -> Result<String, String> {
    let mut parsed = url::Url::parse(url).map_err(|e| format!("--url {url}: not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "--url {url}: the gateway is reached over http or https"
        ));
    }
    if parsed.path() == "/" {
        parsed.set_path("/mcp");
    }
    Ok(parsed.into())
}

/// Why a connection failed, in words that say what to do about it: the whole chain of
/// causes, and the trust step when the certificate was not verified.
fn unreachable(url: &str, error: &dyn std::error::Error) -> String {
    let said = crate::error::error_chain(error);
    let lower = said.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("unknownissuer") {
        format!(
            "{url}: TLS verification failed ({said}). The gateway's certificate is not \
             signed by a CA this machine trusts: pass that CA with --ca-file CA.pem (for a \
             certificate made by `a2a-gateway cert dev`, its ca.pem)"
        )
    } else {
        format!("{url}: {said}")
    }
}

/// Serves MCP on stdin/stdout until the local client goes, relaying to the gateway's MCP
/// endpoint. An error says why it could not start (the gateway is reached once at start).
pub(crate) async fn bridge(target: BridgeTarget) -> Result<(), String> {
    let gateway = Arc::new(Gateway::of(target)?);
    let shared = Arc::new(Shared::default());
    let handshake = connect(&gateway, &shared, ProtocolVersion::V_2025_11_25).await?;
    let info = handshake
        .peer_info()
        .map(|peer| {
            let mut info = InitializeResult::new(peer.capabilities.clone());
            if let Some(server) = &peer.server_info {
                info = info.with_server_info(server.clone());
            }
            info.instructions = peer.instructions.clone();
            info
        })
        .unwrap_or_else(|| InitializeResult::new(Default::default()));
    let relay = Relay {
        handshake,
        modern: Arc::default(),
        gateway,
        info,
        shared: shared.clone(),
    };
    let served = rmcp::serve_server(relay, rmcp::transport::stdio())
        .await
        .map_err(|e| format!("stdio: {e}"))?;
    let _ = shared.local.set(served.peer().clone());
    served.waiting().await.map_err(|e| format!("stdio: {e}"))?;
    Ok(())
}

/// The gateway's MCP endpoint, as a client of protocol `version`.
async fn connect(
    gateway: &Gateway,
    shared: &Arc<Shared>,
    version: ProtocolVersion,
) -> Result<Remote, String> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(gateway.url.clone());
    if let Some(key) = &gateway.api_key {
        let value = key
            .parse()
            .map_err(|_| "the API key is not a valid header value".to_string())?;
        config
            .custom_headers
            .insert(http::HeaderName::from_static("x-api-key"), value);
    }
    let transport = StreamableHttpClientTransport::with_client(gateway.client.clone(), config);
    let messages = Messages {
        shared: shared.clone(),
        version: version.clone(),
    };
    // The handshake era's `initialize`, or 2026-07-28's `server/discover`.
    let lifecycle = match version.has_initialize() {
        true => rmcp::service::ClientLifecycleMode::Initialize,
        false => rmcp::service::ClientLifecycleMode::Discover {
            preferred_versions: vec![version],
        },
    };
    match rmcp::service::serve_client_with_lifecycle(messages, transport, lifecycle).await {
        Ok(remote) => Ok(Arc::new(remote)),
        // rmcp's error keeps the HTTP client's only as text, without its causes (the
        // certificate not trusted, the connection refused): one plain request finds them.
        Err(e) => match gateway.client.get(&*gateway.url).send().await {
            Err(cause) => Err(unreachable(&gateway.url, &cause)),
            Ok(_) => Err(unreachable(&gateway.url, &e)),
        },
    }
}

fn relayed(e: rmcp::ServiceError) -> McpError {
    match e {
        rmcp::ServiceError::McpError(e) => e,
        other => McpError::internal_error(format!("the gateway: {other}"), None),
    }
}

/// The MCP server the local client talks to.
#[derive(Clone)]
struct Relay {
    /// The gateway in the handshake era, and (made when a 2026-07-28 client first calls) in
    /// that era.
    handshake: Remote,
    modern: Arc<tokio::sync::OnceCell<Remote>>,
    gateway: Arc<Gateway>,
    info: InitializeResult,
    shared: Arc<Shared>,
}

impl Relay {
    /// The gateway, in the era of the local client that sent `context`'s request.
    async fn remote(&self, context: &RequestContext<RoleServer>) -> Result<&Remote, McpError> {
        let _ = self.shared.local.set(context.peer.clone());
        let modern = context
            .protocol_version()
            .is_some_and(|v| !v.has_initialize());
        if !modern {
            return Ok(&self.handshake);
        }
        self.modern
            .get_or_try_init(|| connect(&self.gateway, &self.shared, ProtocolVersion::LATEST))
            .await
            .map_err(|e| McpError::internal_error(e, None))
    }
}

impl ServerHandler for Relay {
    fn get_info(&self) -> InitializeResult {
        self.info.clone()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let remote = self.remote(&context).await?;
        let mut tools = remote.list_tools(request).await.map_err(relayed)?;
        // Stated for a 2026-07-28 client; rmcp drops it for one of the handshake era.
        tools.result_type = Some(ResultType::COMPLETE);
        Ok(tools)
    }

    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let remote = self.remote(&context).await?;
        request.meta = None;
        let handle = remote
            .send_request_with_option(
                ClientRequest::CallToolRequest(CallToolRequest::new(request)),
                PeerRequestOptions::no_options(),
            )
            .await
            .map_err(relayed)?;
        // The gateway's progress comes under the token rmcp gave the call: it goes to the
        // local client under the one that client gave.
        let token = handle.progress_token.clone();
        if let Some(local) = context.meta.get_progress_token() {
            self.shared.lock().insert(token.clone(), local);
        }
        let id = handle.id.clone();
        let answer = tokio::select! {
            answer = handle.await_response() => answer,
            () = context.ct.cancelled() => {
                // The local client canceled: the gateway cancels the call's task.
                let why = Some("canceled by the client".to_string());
                let cancel = CancelledNotificationParam::new(Some(id), why);
                let _ = remote.notify_cancelled(cancel).await;
                Err(rmcp::ServiceError::Cancelled { reason: None })
            }
        };
        self.shared.lock().remove(&token);
        match answer.map_err(relayed)? {
            ServerResult::CallToolResult(mut result) => {
                // Stated for a 2026-07-28 client; rmcp drops it for one of the handshake era.
                result.result_type = Some(ResultType::COMPLETE);
                Ok(CallToolResponse::Complete(result))
            }
            ServerResult::InputRequiredResult(result) => {
                Ok(CallToolResponse::InputRequired(result))
            }
            _ => Err(McpError::internal_error(
                "the gateway answered a call with something else",
                None,
            )),
        }
    }
}

/// The MCP client's side: what the gateway sends the bridge, passed to the local client.
#[derive(Clone)]
struct Messages {
    shared: Arc<Shared>,
    version: ProtocolVersion,
}

impl ClientHandler for Messages {
    fn get_info(&self) -> InitializeRequestParams {
        let mut capabilities = ClientCapabilities::default();
        capabilities.elicitation = Some(Default::default());
        InitializeRequestParams::new(
            capabilities,
            rmcp::model::Implementation::new("a2a-gateway-mcp-bridge", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(self.version.clone())
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, McpError> {
        let declined = ElicitResult::new(ElicitationAction::Decline);
        match self.shared.local.get() {
            Some(local) if !local.supported_elicitation_modes().is_empty() => {
                Ok(local.create_elicitation(request).await.unwrap_or(declined))
            }
            _ => Ok(declined),
        }
    }

    async fn on_progress(
        &self,
        mut params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let token = self.shared.lock().get(&params.progress_token).cloned();
        if let (Some(local), Some(token)) = (self.shared.local.get(), token) {
            params.progress_token = token;
            let _ = local.notify_progress(params).await;
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(local) = self.shared.local.get() {
            let _ = local.notify_tool_list_changed().await;
        }
    }
}

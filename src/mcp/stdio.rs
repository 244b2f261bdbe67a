//! `a2a-gateway mcp --url URL`: MCP on stdin/stdout for clients that launch a local server,
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

/// Serves MCP on stdin/stdout until the local client goes, relaying to `url` (the gateway's
/// MCP endpoint) with `api_key` as `X-API-Key`. An error says why it could not start (the
/// gateway is reached once at start).
pub(crate) async fn bridge(url: &str, api_key: Option<String>) -> Result<(), String> {
    let shared = Arc::new(Shared::default());
    let handshake = connect(
        url,
        api_key.as_deref(),
        &shared,
        ProtocolVersion::V_2025_11_25,
    )
    .await?;
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
        url: url.into(),
        api_key,
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
    url: &str,
    api_key: Option<&str>,
    shared: &Arc<Shared>,
    version: ProtocolVersion,
) -> Result<Remote, String> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(key) = api_key {
        let value = key
            .parse()
            .map_err(|_| "the API key is not a valid header value".to_string())?;
        config
            .custom_headers
            .insert(http::HeaderName::from_static("x-api-key"), value);
    }
    let transport = StreamableHttpClientTransport::from_config(config);
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
    let remote = rmcp::service::serve_client_with_lifecycle(messages, transport, lifecycle)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    Ok(Arc::new(remote))
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
    url: Arc<str>,
    api_key: Option<String>,
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
            .get_or_try_init(|| {
                let key = self.api_key.as_deref();
                connect(&self.url, key, &self.shared, ProtocolVersion::LATEST)
            })
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

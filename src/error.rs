//! The one error type requests can fail with, and the one table that maps it to a JSON-RPC
//! code, an `ErrorInfo` reason and HTTP statuses. Other layers have their own error enums
//! (config, store, backend) and convert into this at their boundary.

use serde_json::{json, Map, Value};

/// JSON-RPC codes the gateway adds for conditions A2A does not name. They sit in the
/// implementation-defined server range, away from A2A's -32001..-32009.
pub mod gateway_codes {
    pub const AGENT_NOT_FOUND: i64 = -32040;
    pub const ENDPOINT_NOT_FOUND: i64 = -32044;
    pub const UNAUTHENTICATED: i64 = -32041;
    pub const FORBIDDEN: i64 = -32043;
    pub const AGENT_BUSY: i64 = -32050;
    pub const AGENT_UNAVAILABLE: i64 = -32051;
    pub const TASK_STORE_FULL: i64 = -32052;
    pub const UPSTREAM_TIMEOUT: i64 = -32053;
    pub const STREAM_CAPACITY: i64 = -32054;
    pub const RATE_LIMITED: i64 = -32070;
    pub const TOO_MANY_STREAMS: i64 = -32071;
    pub const PAYLOAD_TOO_LARGE: i64 = -32060;
    pub const REQUEST_TIMEOUT: i64 = -32061;
    pub const BODIES_OVER_BUDGET: i64 = -32062;
    pub const SHUTTING_DOWN: i64 = -32055;
    pub const DEADLINE_EXCEEDED: i64 = -32056;
    pub const SESSION_CAPACITY: i64 = -32057;
    pub const ADMIN_NOT_FOUND: i64 = -32080;
    pub const ADMIN_CONFLICT: i64 = -32081;
    pub const ADMIN_INVALID: i64 = -32082;
    pub const TOO_MANY_SESSIONS: i64 = -32072;
    pub const BUDGET_EXCEEDED: i64 = -32073;
}

/// A spent budget: which, its limit as people read it, what was used, when it resets
/// (RFC 3339) and the seconds until then.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetSpent {
    pub budget: String,
    pub limit: String,
    pub used: String,
    pub resets_at: String,
    pub retry_after: u64,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    #[error("Parse error: {0}")]
    Parse(String),
    #[error("Invalid request: {0}")]
    InvalidRequest(String),
    #[error("Method not found: {0}")]
    MethodNotFound(String),
    #[error("Invalid params: {0}")]
    InvalidParams(String),
    /// The detail is logged, never sent.
    #[error("Internal error")]
    Internal(String),
    #[error("Task not found: {0}")]
    TaskNotFound(String),
    #[error("Task {id} cannot be canceled: it is already {state}")]
    TaskNotCancelable { id: String, state: &'static str },
    #[error("Push notifications are not supported by this agent")]
    PushNotSupported,
    #[error("Invalid params: task {task} has no push notification config {id:?}")]
    PushConfigNotFound { task: String, id: String },
    #[error("Unsupported operation: {0}")]
    UnsupportedOperation(String),
    #[error("Content type not supported: {0}")]
    ContentTypeNotSupported(String),
    #[error("Invalid agent response: {0}")]
    InvalidAgentResponse(String),
    #[error("This agent has no extended agent card")]
    ExtendedCardNotConfigured,
    /// The agent requires an extension (its URI) the request did not ask for.
    #[error("Extension support required: the agent requires {0}; ask for it in A2A-Extensions")]
    ExtensionSupportRequired(String),
    #[error("A2A protocol version {requested} is not supported (supported: {supported})")]
    VersionNotSupported {
        requested: String,
        supported: &'static str,
    },
    /// 401, with the challenge for `WWW-Authenticate`.
    #[error("Unauthenticated: {message}")]
    Unauthenticated { message: String, challenge: String },
    #[error("Forbidden: these credentials may not call this agent")]
    Forbidden,
    /// A policy refused the call; names the rule, never its expression.
    #[error("Forbidden: refused by policy \"{0}\"")]
    PolicyDenied(std::sync::Arc<str>),
    #[error("Unknown agent: {name}")]
    AgentNotFound {
        name: String,
        available: Vec<String>,
    },
    /// A POST to a path that is no JSON-RPC endpoint.
    #[error(
        "No endpoint at {0}: JSON-RPC calls go to /a2a or /a2a/agents/<name> (see /a2a/agents)"
    )]
    EndpointNotFound(String),
    #[error("Agent {0} is busy: its mailbox is full, retry later")]
    AgentBusy(String),
    #[error("Agent {agent} is unavailable: {reason}")]
    AgentUnavailable { agent: String, reason: String },
    #[error("Agent {agent} did not answer within {secs} s")]
    UpstreamTimeout { agent: String, secs: u64 },
    /// The caller's own deadline (gRPC's `grpc-timeout`) passed before the answer.
    #[error("The call's deadline ({0}) passed before the agent answered")]
    DeadlineExceeded(String),
    /// An upstream agent's own JSON-RPC error, passed through with its code.
    #[error("{message}")]
    Upstream {
        code: i64,
        message: String,
        data: Option<Value>,
    },
    /// The bound reached: "N unfinished tasks" or "N bytes of unfinished tasks".
    #[error("The gateway is holding its maximum of {0}; retry later")]
    TaskStoreFull(String),
    /// The task store cannot take changes (a shared one does not answer, or commits
    /// fail); the detail goes to the log.
    #[error("The task store is unavailable; retry later")]
    StoreUnavailable(String),
    /// One caller's share of the store is full; everyone else is still served.
    #[error("You hold the maximum of {0}; finish or cancel some, or retry later")]
    TaskQuota(String),
    #[error("The gateway is holding its maximum of {0} open streams; retry later")]
    StreamCapacity(usize),
    #[error("Rate limit exceeded ({scope}): retry in {retry_after} s")]
    RateLimited {
        scope: &'static str,
        retry_after: u64,
    },
    #[error("Too many open streams: this caller may hold {0} at once")]
    TooManyStreams(usize),
    /// An MCP client opening one session more than its caller may hold.
    #[error("Too many MCP sessions: this caller may hold {0} at once; end one (DELETE) or retry once one has been idle {1} s")]
    TooManySessions(usize, u64),
    #[error("The gateway is holding its maximum of {0} MCP sessions; retry later")]
    SessionCapacity(usize),
    /// A budget is spent (boxed: the other variants are smaller, and every result carries
    /// the largest).
    #[error("Budget \"{}\" is spent ({}; {} used); it resets at {}", .0.budget, .0.limit, .0.used, .0.resets_at)]
    BudgetExceeded(Box<BudgetSpent>),
    /// The admin API: what the path names is not there.
    #[error("Not found: {0}")]
    AdminNotFound(String),
    /// The admin API: the change conflicts with what is there (a name taken, a file's
    /// agent, a version that moved on).
    #[error("Conflict: {0}")]
    AdminConflict(String),
    /// The admin API: a body that does not check; each problem with the field it is about.
    #[error("Invalid: {}", .0.iter().map(|(f, m)| if f.is_empty() { m.clone() } else { format!("{f}: {m}") }).collect::<Vec<_>>().join("; "))]
    AdminInvalid(Vec<(String, String)>),
    /// A browser page on an origin the endpoint does not allow (MCP asks servers to check).
    #[error(
        "Forbidden: requests from the origin {0} are not allowed here (see [mcp] allowed_origins)"
    )]
    OriginNotAllowed(String),
    #[error("Request body exceeds the limit of {0} bytes")]
    PayloadTooLarge(usize),
    /// Answered with `Connection: close`: the rest of the body is not waited for.
    #[error("The request body did not arrive within {0} s")]
    RequestTimeout(u64),
    #[error("The gateway is receiving its maximum of request bodies at once; retry later")]
    BodiesOverBudget,
    /// One caller's share of the bytes of bodies still arriving is taken; everyone else is
    /// still served.
    #[error("You are sending the maximum of {0} of request bodies at once; finish those, or retry later")]
    BodiesOverShare(String),
    /// Anonymous callers together hold their part of the bytes of bodies still arriving;
    /// callers with credentials are still served.
    #[error("Anonymous callers are sending their maximum of {0} of request bodies at once; retry later, or send credentials")]
    AnonymousBodiesOverBudget(String),
    /// Draining before exit: new calls are refused (with `Connection: close`), and open
    /// streams end with this as their last event, so clients reconnect or resubscribe.
    /// `replicas`: other replicas share this one's tasks, and take the call at once.
    #[error(
        "The gateway is shutting down; retry, or resubscribe to the task, {}",
        after_shutdown(.replicas)
    )]
    ShuttingDown { replicas: bool },
}

/// Where a caller goes when the gateway drains.
fn after_shutdown(replicas: &bool) -> &'static str {
    match replicas {
        true => "through another replica",
        false => "once it is back",
    }
}

/// One row of the error table: everything that says how an error goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    code: i64,
    /// `google.rpc.ErrorInfo.reason`.
    reason: &'static str,
    /// The gateway's own condition (domain `a2a-gateway`), not one A2A or JSON-RPC names.
    ours: bool,
    /// HTTP status on the JSON-RPC binding. Protocol errors travel with 200 as JSON-RPC
    /// requires; conditions a proxy or load balancer must see (no such route, too large,
    /// overloaded) get their HTTP status too, with the same JSON-RPC body.
    jsonrpc_status: u16,
    /// HTTP status on the HTTP+JSON binding (A2A 1.0.1's mapping for A2A codes).
    rest_status: u16,
    /// An overload a client may retry in a second (`Retry-After: 1`).
    retry: bool,
    /// The gRPC status code (A2A 1.0.1's mapping for A2A codes).
    grpc: GrpcCode,
}

/// gRPC status codes, by their number on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcCode {
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl GrpcCode {
    /// The code the HTTP status of a condition of the gateway's own stands for.
    const fn of_http(status: u16) -> GrpcCode {
        match status {
            400 | 415 | 431 => GrpcCode::InvalidArgument,
            405 => GrpcCode::Unimplemented,
            401 => GrpcCode::Unauthenticated,
            403 => GrpcCode::PermissionDenied,
            404 => GrpcCode::NotFound,
            409 => GrpcCode::AlreadyExists,
            413 | 429 => GrpcCode::ResourceExhausted,
            503 => GrpcCode::Unavailable,
            408 | 504 => GrpcCode::DeadlineExceeded,
            _ => GrpcCode::Internal,
        }
    }

    /// The name `google.rpc.Status` bodies carry in `status`.
    pub fn name(self) -> &'static str {
        match self {
            GrpcCode::InvalidArgument => "INVALID_ARGUMENT",
            GrpcCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            GrpcCode::NotFound => "NOT_FOUND",
            GrpcCode::AlreadyExists => "ALREADY_EXISTS",
            GrpcCode::PermissionDenied => "PERMISSION_DENIED",
            GrpcCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GrpcCode::FailedPrecondition => "FAILED_PRECONDITION",
            GrpcCode::Unimplemented => "UNIMPLEMENTED",
            GrpcCode::Internal => "INTERNAL",
            GrpcCode::Unavailable => "UNAVAILABLE",
            GrpcCode::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl Row {
    const fn retry(self) -> Row {
        Row {
            retry: true,
            ..self
        }
    }
}

/// A JSON-RPC or A2A code: 200 on JSON-RPC, `rest` on HTTP+JSON, `grpc` on gRPC.
const fn protocol(code: i64, reason: &'static str, rest: u16, grpc: GrpcCode) -> Row {
    Row {
        code,
        reason,
        ours: false,
        jsonrpc_status: 200,
        rest_status: rest,
        retry: false,
        grpc,
    }
}

/// A condition of the gateway's own, with the same HTTP status on both bindings.
const fn ours(code: i64, reason: &'static str, status: u16) -> Row {
    Row {
        code,
        reason,
        ours: true,
        jsonrpc_status: status,
        rest_status: status,
        retry: false,
        grpc: GrpcCode::of_http(status),
    }
}

/// The codes of JSON-RPC and A2A, each once: the rows of the variants that carry them, and
/// how a bare code from an upstream is read.
const PROTOCOL_ROWS: [Row; 15] = [
    protocol(-32700, "PARSE_ERROR", 400, GrpcCode::InvalidArgument),
    protocol(-32600, "INVALID_REQUEST", 400, GrpcCode::InvalidArgument),
    protocol(-32601, "METHOD_NOT_FOUND", 404, GrpcCode::Unimplemented),
    protocol(-32602, "INVALID_PARAMS", 400, GrpcCode::InvalidArgument),
    protocol(-32603, "INTERNAL", 500, GrpcCode::Internal),
    protocol(-32001, "TASK_NOT_FOUND", 404, GrpcCode::NotFound),
    protocol(
        -32002,
        "TASK_NOT_CANCELABLE",
        400,
        GrpcCode::FailedPrecondition,
    ),
    protocol(
        -32003,
        "PUSH_NOTIFICATION_NOT_SUPPORTED",
        400,
        GrpcCode::FailedPrecondition,
    ),
    protocol(
        -32004,
        "UNSUPPORTED_OPERATION",
        400,
        GrpcCode::FailedPrecondition,
    ),
    // The gateway raises -32005 only for the request's own Content-Type, which HTTP answers
    // with 415 on either binding (see its variant's row). 1.0.1 maps it to 400, where it
    // means a part's media type: that is how an upstream's -32005 is read.
    protocol(
        -32005,
        "CONTENT_TYPE_NOT_SUPPORTED",
        400,
        GrpcCode::InvalidArgument,
    ),
    protocol(-32006, "INVALID_AGENT_RESPONSE", 500, GrpcCode::Internal),
    protocol(
        -32007,
        "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
        400,
        GrpcCode::FailedPrecondition,
    ),
    protocol(
        -32008,
        "EXTENSION_SUPPORT_REQUIRED",
        400,
        GrpcCode::FailedPrecondition,
    ),
    protocol(
        -32009,
        "VERSION_NOT_SUPPORTED",
        400,
        GrpcCode::FailedPrecondition,
    ),
    // Any other code an upstream sends.
    protocol(0, "INTERNAL", 500, GrpcCode::Internal),
];

/// The A2A or JSON-RPC code whose `ErrorInfo` reason is `reason` (an upstream's error
/// read from a gRPC status).
pub fn code_of_reason(reason: &str) -> Option<i64> {
    PROTOCOL_ROWS[..PROTOCOL_ROWS.len() - 1]
        .iter()
        .find(|row| row.reason == reason)
        .map(|row| row.code)
}

/// The protocol row of `code`; an unknown code reads as an internal error's.
const fn protocol_row(code: i64) -> Row {
    let mut i = 0;
    while i < PROTOCOL_ROWS.len() - 1 {
        if PROTOCOL_ROWS[i].code == code {
            return PROTOCOL_ROWS[i];
        }
        i += 1;
    }
    Row {
        code,
        ..PROTOCOL_ROWS[PROTOCOL_ROWS.len() - 1]
    }
}

impl GatewayError {
    /// This error's row of the table. Every variant has exactly one.
    fn row(&self) -> Row {
        use gateway_codes::*;
        match self {
            GatewayError::Parse(_) => protocol_row(-32700),
            GatewayError::InvalidRequest(_) => protocol_row(-32600),
            GatewayError::MethodNotFound(_) => protocol_row(-32601),
            GatewayError::InvalidParams(_) => protocol_row(-32602),
            GatewayError::Internal(_) => protocol_row(-32603),
            GatewayError::TaskNotFound(_) => protocol_row(-32001),
            GatewayError::TaskNotCancelable { .. } => protocol_row(-32002),
            GatewayError::PushNotSupported => protocol_row(-32003),
            // The params name something that is not there: invalid params, but a missing
            // resource to HTTP+JSON clients.
            GatewayError::PushConfigNotFound { .. } => Row {
                rest_status: 404,
                grpc: GrpcCode::NotFound,
                ..protocol_row(-32602)
            },
            GatewayError::UnsupportedOperation(_) => protocol_row(-32004),
            GatewayError::ContentTypeNotSupported(_) => Row {
                jsonrpc_status: 415,
                rest_status: 415,
                ..protocol_row(-32005)
            },
            GatewayError::InvalidAgentResponse(_) => protocol_row(-32006),
            GatewayError::ExtendedCardNotConfigured => protocol_row(-32007),
            GatewayError::ExtensionSupportRequired(_) => protocol_row(-32008),
            GatewayError::VersionNotSupported { .. } => protocol_row(-32009),
            GatewayError::Upstream { code, .. } => protocol_row(*code),
            GatewayError::AgentNotFound { .. } => ours(AGENT_NOT_FOUND, "AGENT_NOT_FOUND", 404),
            GatewayError::EndpointNotFound(_) => {
                ours(ENDPOINT_NOT_FOUND, "ENDPOINT_NOT_FOUND", 404)
            }
            GatewayError::Unauthenticated { .. } => ours(UNAUTHENTICATED, "UNAUTHENTICATED", 401),
            GatewayError::Forbidden | GatewayError::PolicyDenied(_) => {
                ours(FORBIDDEN, "PERMISSION_DENIED", 403)
            }
            GatewayError::AgentBusy(_) => ours(AGENT_BUSY, "AGENT_BUSY", 503).retry(),
            GatewayError::AgentUnavailable { .. } => {
                ours(AGENT_UNAVAILABLE, "AGENT_UNAVAILABLE", 503).retry()
            }
            GatewayError::UpstreamTimeout { .. } => ours(UPSTREAM_TIMEOUT, "UPSTREAM_TIMEOUT", 504),
            GatewayError::DeadlineExceeded(_) => ours(DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", 504),
            GatewayError::TaskStoreFull(_) => ours(TASK_STORE_FULL, "TASK_STORE_FULL", 503).retry(),
            GatewayError::StoreUnavailable(_) => {
                ours(TASK_STORE_FULL, "TASK_STORE_UNAVAILABLE", 503).retry()
            }
            GatewayError::TaskQuota(_) => ours(TASK_STORE_FULL, "TASK_QUOTA_EXCEEDED", 429).retry(),
            GatewayError::StreamCapacity(_) => {
                ours(STREAM_CAPACITY, "STREAM_CAPACITY", 503).retry()
            }
            GatewayError::RateLimited { .. } => ours(RATE_LIMITED, "RATE_LIMITED", 429),
            GatewayError::TooManyStreams(_) => {
                ours(TOO_MANY_STREAMS, "TOO_MANY_STREAMS", 429).retry()
            }
            GatewayError::TooManySessions(..) => {
                ours(TOO_MANY_SESSIONS, "TOO_MANY_SESSIONS", 429).retry()
            }
            GatewayError::SessionCapacity(_) => {
                ours(SESSION_CAPACITY, "SESSION_CAPACITY", 503).retry()
            }
            GatewayError::BudgetExceeded(_) => ours(BUDGET_EXCEEDED, "BUDGET_EXCEEDED", 429),
            GatewayError::OriginNotAllowed(_) => ours(FORBIDDEN, "ORIGIN_NOT_ALLOWED", 403),
            GatewayError::AdminNotFound(_) => ours(ADMIN_NOT_FOUND, "NOT_FOUND", 404),
            GatewayError::AdminConflict(_) => ours(ADMIN_CONFLICT, "CONFLICT", 409),
            GatewayError::AdminInvalid(_) => ours(ADMIN_INVALID, "INVALID_ARGUMENT", 400),
            GatewayError::PayloadTooLarge(_) => ours(PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE", 413),
            GatewayError::RequestTimeout(_) => ours(REQUEST_TIMEOUT, "REQUEST_TIMEOUT", 408),
            GatewayError::BodiesOverBudget => {
                ours(BODIES_OVER_BUDGET, "BODIES_OVER_BUDGET", 503).retry()
            }
            GatewayError::BodiesOverShare(_) => {
                ours(BODIES_OVER_BUDGET, "BODIES_OVER_SHARE", 429).retry()
            }
            GatewayError::AnonymousBodiesOverBudget(_) => {
                ours(BODIES_OVER_BUDGET, "ANONYMOUS_BODIES_OVER_BUDGET", 503).retry()
            }
            GatewayError::ShuttingDown { .. } => ours(SHUTTING_DOWN, "SHUTTING_DOWN", 503).retry(),
        }
    }

    pub fn code(&self) -> i64 {
        self.row().code
    }

    /// `google.rpc.ErrorInfo.reason`; A2A reasons for A2A codes.
    pub fn reason(&self) -> &'static str {
        self.row().reason
    }

    /// The `ErrorInfo` domain: A2A's own for A2A and JSON-RPC codes, ours for the rest.
    pub fn domain(&self) -> &'static str {
        if self.row().ours {
            "a2a-gateway"
        } else {
            "a2a-protocol.org"
        }
    }

    /// HTTP status on the JSON-RPC binding (see [`Row::jsonrpc_status`]).
    pub fn jsonrpc_http_status(&self) -> u16 {
        self.row().jsonrpc_status
    }

    /// HTTP status on the HTTP+JSON binding (A2A 1.0.1 mapping).
    pub fn rest_http_status(&self) -> u16 {
        self.row().rest_status
    }

    /// Status code on the gRPC binding (A2A 1.0.1 mapping).
    pub fn grpc_code(&self) -> GrpcCode {
        self.row().grpc
    }

    /// `google.rpc.ErrorInfo`'s fields: reason, domain and string-valued metadata.
    pub fn error_info(&self) -> (&'static str, &'static str, Vec<(String, String)>) {
        let metadata = self
            .metadata()
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect();
        (self.reason(), self.domain(), metadata)
    }

    /// Seconds a client should wait before retrying, for overload answers.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            GatewayError::RateLimited { retry_after, .. } => Some(*retry_after),
            GatewayError::BudgetExceeded(spent) => Some(spent.retry_after),
            other => other.row().retry.then_some(1),
        }
    }

    /// Whether the connection must close after the answer (the rest of its request was
    /// never read).
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            GatewayError::RequestTimeout(_) | GatewayError::ShuttingDown { .. }
        )
    }

    /// The `WWW-Authenticate` challenge of a 401.
    pub fn challenge(&self) -> Option<&str> {
        match self {
            GatewayError::Unauthenticated { challenge, .. } => Some(challenge),
            _ => None,
        }
    }

    /// The message sent to the client. `Internal` never carries its detail out.
    pub fn public_message(&self) -> String {
        self.to_string()
    }

    /// Structured facts a client can act on; `ErrorInfo.metadata` is string-valued.
    fn metadata(&self) -> Map<String, Value> {
        let mut m = Map::new();
        match self {
            GatewayError::TaskNotFound(id) | GatewayError::TaskNotCancelable { id, .. } => {
                m.insert("taskId".into(), Value::String(id.clone()));
            }
            GatewayError::EndpointNotFound(path) => {
                m.insert("path".into(), Value::String(path.clone()));
            }
            GatewayError::MethodNotFound(method) => {
                m.insert("method".into(), Value::String(method.clone()));
            }
            GatewayError::VersionNotSupported { requested, .. } => {
                m.insert("requestedVersion".into(), Value::String(requested.clone()));
            }
            GatewayError::AgentNotFound { name, available } => {
                m.insert("agent".into(), Value::String(name.clone()));
                m.insert("availableAgents".into(), Value::String(available.join(",")));
            }
            GatewayError::AgentBusy(name)
            | GatewayError::AgentUnavailable { agent: name, .. }
            | GatewayError::UpstreamTimeout { agent: name, .. } => {
                m.insert("agent".into(), Value::String(name.clone()));
            }
            GatewayError::ExtensionSupportRequired(uri) => {
                m.insert("extension".into(), Value::String(uri.clone()));
            }
            GatewayError::PayloadTooLarge(limit) => {
                m.insert("limitBytes".into(), Value::String(limit.to_string()));
            }
            GatewayError::BudgetExceeded(spent) => {
                m.insert("budget".into(), Value::String(spent.budget.clone()));
                m.insert("limit".into(), Value::String(spent.limit.clone()));
                m.insert("resetsAt".into(), Value::String(spent.resets_at.clone()));
            }
            _ => {}
        }
        m
    }

    /// `error.data` for a 0.3 caller: any JSON value, or none.
    pub fn data_v03(&self) -> Option<Value> {
        match self {
            GatewayError::Upstream { data, .. } => data.clone(),
            GatewayError::AgentNotFound { available, .. } => {
                Some(json!({ "availableAgents": available }))
            }
            _ => {
                let md = self.metadata();
                (!md.is_empty()).then_some(Value::Object(md))
            }
        }
    }

    /// `error.data` for a 1.0 caller: an array of google.rpc detail objects.
    pub fn data_v10(&self) -> Value {
        if let GatewayError::Upstream {
            data: Some(d @ Value::Array(_)),
            ..
        } = self
        {
            return d.clone();
        }
        let mut details = vec![json!({
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": self.reason(),
            "domain": self.domain(),
            "metadata": self.metadata(),
        })];
        if let GatewayError::InvalidParams(msg) = self {
            details.push(json!({
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": "params", "description": msg}],
            }));
        }
        if let GatewayError::AdminInvalid(fields) = self {
            let violations: Vec<Value> = (fields.iter())
                .map(|(field, description)| json!({"field": field, "description": description}))
                .collect();
            details.push(json!({
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": violations,
            }));
        }
        Value::Array(details)
    }

    /// The `google.rpc.Status` body of the HTTP+JSON binding.
    pub fn rest_body(&self) -> Value {
        let mut body = status_body(
            self.rest_http_status(),
            &self.public_message(),
            Some(self.data_v10()),
        );
        // The status name is the row's, which for A2A codes is not always the one its
        // HTTP status stands for (a task that cannot be canceled: 400, FAILED_PRECONDITION).
        body["error"]["status"] = Value::from(self.grpc_code().name());
        body
    }
}

/// Every error body that is not JSON-RPC's, in `google.rpc.Status` form:
/// `{"error": {"code": <HTTP status>, "status": <its gRPC name>, "message", "details"?}}`.
/// The HTTP+JSON binding, routes outside any agent (404, 405), the connection gate's refusal
/// and the rejections actix-http writes itself all answer with it.
pub fn status_body(http: u16, message: &str, details: Option<Value>) -> Value {
    let mut error = json!({
        "code": http,
        "status": grpc_status_name(http),
        "message": message,
    });
    if let (Some(details), Some(obj)) = (details, error.as_object_mut()) {
        obj.insert("details".into(), details);
    }
    json!({ "error": error })
}

fn grpc_status_name(http: u16) -> &'static str {
    GrpcCode::of_http(http).name()
}

/// An error and its causes, joined, for the log (reqwest's and hyper's own text leaves the
/// cause out).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn each_protocol_code_has_one_row_and_upstream_codes_read_by_it() {
        let codes: Vec<i64> = PROTOCOL_ROWS.iter().map(|r| r.code).collect();
        let mut unique = codes.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), codes.len(), "{codes:?}");
        let upstream = |code| GatewayError::Upstream {
            code,
            message: "m".into(),
            data: None,
        };
        assert_eq!(upstream(-32001).reason(), "TASK_NOT_FOUND");
        assert_eq!(upstream(-32001).rest_http_status(), 404);
        assert_eq!(upstream(-32001).jsonrpc_http_status(), 200);
        assert_eq!(upstream(-32005).rest_http_status(), 400);
        assert_eq!(upstream(-32099).reason(), "INTERNAL");
        assert_eq!(
            upstream(-32099).code(),
            -32099,
            "the upstream's code is kept"
        );
        assert_eq!(upstream(-32099).rest_http_status(), 500);
        // The gateway's own -32005 is about the request's Content-Type: HTTP's 415.
        let own = GatewayError::ContentTypeNotSupported("text/plain".into());
        assert_eq!((own.code(), own.rest_http_status()), (-32005, 415));
        assert_eq!(own.jsonrpc_http_status(), 415);
        assert_eq!(own.domain(), "a2a-protocol.org");
        assert_eq!(GatewayError::Forbidden.domain(), "a2a-gateway");
    }
}

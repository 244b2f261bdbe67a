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
    #[error("Unsupported operation: {0}")]
    UnsupportedOperation(String),
    #[error("Content type not supported: {0}")]
    ContentTypeNotSupported(String),
    #[error("Invalid agent response: {0}")]
    InvalidAgentResponse(String),
    #[error("This agent has no extended agent card")]
    ExtendedCardNotConfigured,
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
    /// An upstream agent's own JSON-RPC error, passed through with its code.
    #[error("{message}")]
    Upstream {
        code: i64,
        message: String,
        data: Option<Value>,
    },
    #[error("The gateway is holding its maximum of {0} unfinished tasks; retry later")]
    TaskStoreFull(usize),
    /// One caller's share of the store is full; everyone else is still served.
    #[error("You hold the maximum of {0} unfinished tasks; finish or cancel some, or retry later")]
    TaskQuota(usize),
    #[error("The gateway is holding its maximum of {0} open streams; retry later")]
    StreamCapacity(usize),
    #[error("Rate limit exceeded ({scope}): retry in {retry_after} s")]
    RateLimited {
        scope: &'static str,
        retry_after: u64,
    },
    #[error("Too many open streams: this caller may hold {0} at once")]
    TooManyStreams(usize),
    #[error("Request body exceeds the limit of {0} bytes")]
    PayloadTooLarge(usize),
    /// Answered with `Connection: close`: the rest of the body is not waited for.
    #[error("The request body did not arrive within {0} s")]
    RequestTimeout(u64),
    #[error("The gateway is receiving its maximum of request bodies at once; retry later")]
    BodiesOverBudget,
}

impl GatewayError {
    pub fn code(&self) -> i64 {
        use gateway_codes::*;
        match self {
            GatewayError::Parse(_) => -32700,
            GatewayError::InvalidRequest(_) => -32600,
            GatewayError::MethodNotFound(_) => -32601,
            GatewayError::InvalidParams(_) => -32602,
            GatewayError::Internal(_) => -32603,
            GatewayError::TaskNotFound(_) => -32001,
            GatewayError::TaskNotCancelable { .. } => -32002,
            GatewayError::PushNotSupported => -32003,
            GatewayError::UnsupportedOperation(_) => -32004,
            GatewayError::ContentTypeNotSupported(_) => -32005,
            GatewayError::InvalidAgentResponse(_) => -32006,
            GatewayError::ExtendedCardNotConfigured => -32007,
            GatewayError::VersionNotSupported { .. } => -32009,
            GatewayError::AgentNotFound { .. } => AGENT_NOT_FOUND,
            GatewayError::EndpointNotFound(_) => ENDPOINT_NOT_FOUND,
            GatewayError::Unauthenticated { .. } => UNAUTHENTICATED,
            GatewayError::Forbidden => FORBIDDEN,
            GatewayError::AgentBusy(_) => AGENT_BUSY,
            GatewayError::AgentUnavailable { .. } => AGENT_UNAVAILABLE,
            GatewayError::UpstreamTimeout { .. } => UPSTREAM_TIMEOUT,
            GatewayError::Upstream { code, .. } => *code,
            GatewayError::TaskStoreFull(_) | GatewayError::TaskQuota(_) => TASK_STORE_FULL,
            GatewayError::StreamCapacity(_) => STREAM_CAPACITY,
            GatewayError::RateLimited { .. } => RATE_LIMITED,
            GatewayError::TooManyStreams(_) => TOO_MANY_STREAMS,
            GatewayError::PayloadTooLarge(_) => PAYLOAD_TOO_LARGE,
            GatewayError::RequestTimeout(_) => REQUEST_TIMEOUT,
            GatewayError::BodiesOverBudget => BODIES_OVER_BUDGET,
        }
    }

    /// `google.rpc.ErrorInfo.reason`; A2A reasons for A2A codes.
    pub fn reason(&self) -> &'static str {
        match self {
            GatewayError::Parse(_) => "PARSE_ERROR",
            GatewayError::InvalidRequest(_) => "INVALID_REQUEST",
            GatewayError::MethodNotFound(_) => "METHOD_NOT_FOUND",
            GatewayError::InvalidParams(_) => "INVALID_PARAMS",
            GatewayError::Internal(_) => "INTERNAL",
            GatewayError::TaskNotFound(_) => "TASK_NOT_FOUND",
            GatewayError::TaskNotCancelable { .. } => "TASK_NOT_CANCELABLE",
            GatewayError::PushNotSupported => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            GatewayError::UnsupportedOperation(_) => "UNSUPPORTED_OPERATION",
            GatewayError::ContentTypeNotSupported(_) => "CONTENT_TYPE_NOT_SUPPORTED",
            GatewayError::InvalidAgentResponse(_) => "INVALID_AGENT_RESPONSE",
            GatewayError::ExtendedCardNotConfigured => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            GatewayError::VersionNotSupported { .. } => "VERSION_NOT_SUPPORTED",
            GatewayError::AgentNotFound { .. } => "AGENT_NOT_FOUND",
            GatewayError::EndpointNotFound(_) => "ENDPOINT_NOT_FOUND",
            GatewayError::Unauthenticated { .. } => "UNAUTHENTICATED",
            GatewayError::Forbidden => "PERMISSION_DENIED",
            GatewayError::AgentBusy(_) => "AGENT_BUSY",
            GatewayError::AgentUnavailable { .. } => "AGENT_UNAVAILABLE",
            GatewayError::UpstreamTimeout { .. } => "UPSTREAM_TIMEOUT",
            GatewayError::Upstream { code, .. } => reason_for_code(*code),
            GatewayError::TaskStoreFull(_) => "TASK_STORE_FULL",
            GatewayError::TaskQuota(_) => "TASK_QUOTA_EXCEEDED",
            GatewayError::StreamCapacity(_) => "STREAM_CAPACITY",
            GatewayError::RateLimited { .. } => "RATE_LIMITED",
            GatewayError::TooManyStreams(_) => "TOO_MANY_STREAMS",
            GatewayError::PayloadTooLarge(_) => "PAYLOAD_TOO_LARGE",
            GatewayError::RequestTimeout(_) => "REQUEST_TIMEOUT",
            GatewayError::BodiesOverBudget => "BODIES_OVER_BUDGET",
        }
    }

    /// The `ErrorInfo` domain: A2A's own for A2A and JSON-RPC codes, ours for the rest.
    pub fn domain(&self) -> &'static str {
        match self {
            GatewayError::AgentNotFound { .. }
            | GatewayError::EndpointNotFound(_)
            | GatewayError::Unauthenticated { .. }
            | GatewayError::Forbidden
            | GatewayError::AgentBusy(_)
            | GatewayError::AgentUnavailable { .. }
            | GatewayError::UpstreamTimeout { .. }
            | GatewayError::TaskStoreFull(_)
            | GatewayError::TaskQuota(_)
            | GatewayError::StreamCapacity(_)
            | GatewayError::RateLimited { .. }
            | GatewayError::TooManyStreams(_)
            | GatewayError::PayloadTooLarge(_)
            | GatewayError::RequestTimeout(_)
            | GatewayError::BodiesOverBudget => "a2a-gateway",
            _ => "a2a-protocol.org",
        }
    }

    /// HTTP status on the JSON-RPC binding. Protocol errors travel with 200 as JSON-RPC
    /// requires; conditions a proxy or load balancer must see (no such route, too large,
    /// overloaded) get their HTTP status too, with the same JSON-RPC body.
    pub fn jsonrpc_http_status(&self) -> u16 {
        match self {
            GatewayError::AgentNotFound { .. } | GatewayError::EndpointNotFound(_) => 404,
            GatewayError::Unauthenticated { .. } => 401,
            GatewayError::Forbidden => 403,
            GatewayError::RateLimited { .. }
            | GatewayError::TooManyStreams(_)
            | GatewayError::TaskQuota(_) => 429,
            GatewayError::PayloadTooLarge(_) => 413,
            GatewayError::RequestTimeout(_) => 408,
            GatewayError::ContentTypeNotSupported(_) => 415,
            GatewayError::BodiesOverBudget
            | GatewayError::AgentBusy(_)
            | GatewayError::AgentUnavailable { .. }
            | GatewayError::StreamCapacity(_)
            | GatewayError::TaskStoreFull(_) => 503,
            GatewayError::UpstreamTimeout { .. } => 504,
            GatewayError::Upstream { .. }
            | GatewayError::Parse(_)
            | GatewayError::InvalidRequest(_)
            | GatewayError::MethodNotFound(_)
            | GatewayError::InvalidParams(_)
            | GatewayError::Internal(_)
            | GatewayError::TaskNotFound(_)
            | GatewayError::TaskNotCancelable { .. }
            | GatewayError::PushNotSupported
            | GatewayError::UnsupportedOperation(_)
            | GatewayError::InvalidAgentResponse(_)
            | GatewayError::ExtendedCardNotConfigured
            | GatewayError::VersionNotSupported { .. } => 200,
        }
    }

    /// HTTP status on the HTTP+JSON binding (A2A 1.0.1 mapping).
    pub fn rest_http_status(&self) -> u16 {
        match self {
            GatewayError::Parse(_)
            | GatewayError::InvalidRequest(_)
            | GatewayError::InvalidParams(_)
            | GatewayError::TaskNotCancelable { .. }
            | GatewayError::PushNotSupported
            | GatewayError::UnsupportedOperation(_)
            | GatewayError::ExtendedCardNotConfigured
            | GatewayError::VersionNotSupported { .. } => 400,
            // The gateway raises this only for the request's own Content-Type, which HTTP
            // answers with 415 on either binding. (1.0.1 maps -32005 to 400, but there it
            // means a part's media type, which the gateway never refuses.)
            GatewayError::ContentTypeNotSupported(_) => 415,
            GatewayError::MethodNotFound(_)
            | GatewayError::TaskNotFound(_)
            | GatewayError::AgentNotFound { .. }
            | GatewayError::EndpointNotFound(_) => 404,
            GatewayError::Unauthenticated { .. } => 401,
            GatewayError::Forbidden => 403,
            GatewayError::RateLimited { .. }
            | GatewayError::TooManyStreams(_)
            | GatewayError::TaskQuota(_) => 429,
            GatewayError::PayloadTooLarge(_) => 413,
            GatewayError::RequestTimeout(_) => 408,
            GatewayError::Internal(_) | GatewayError::InvalidAgentResponse(_) => 500,
            GatewayError::BodiesOverBudget
            | GatewayError::AgentBusy(_)
            | GatewayError::AgentUnavailable { .. }
            | GatewayError::StreamCapacity(_)
            | GatewayError::TaskStoreFull(_) => 503,
            GatewayError::UpstreamTimeout { .. } => 504,
            GatewayError::Upstream { code, .. } => rest_status_for_code(*code),
        }
    }

    /// Seconds a client should wait before retrying, for overload answers.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            GatewayError::AgentBusy(_)
            | GatewayError::AgentUnavailable { .. }
            | GatewayError::StreamCapacity(_)
            | GatewayError::TooManyStreams(_)
            | GatewayError::BodiesOverBudget
            | GatewayError::TaskQuota(_)
            | GatewayError::TaskStoreFull(_) => Some(1),
            GatewayError::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// Whether the connection must close after the answer (the rest of its request was
    /// never read).
    pub fn closes_connection(&self) -> bool {
        matches!(self, GatewayError::RequestTimeout(_))
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
            GatewayError::PayloadTooLarge(limit) => {
                m.insert("limitBytes".into(), Value::String(limit.to_string()));
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
        Value::Array(details)
    }

    /// The `google.rpc.Status` body of the HTTP+JSON binding.
    pub fn rest_body(&self) -> Value {
        json!({"error": {
            "code": self.rest_http_status(),
            "status": grpc_status_name(self.rest_http_status()),
            "message": self.public_message(),
            "details": self.data_v10(),
        }})
    }
}

/// The A2A `ErrorInfo` reason of a code, for errors that arrive as bare codes.
fn reason_for_code(code: i64) -> &'static str {
    match code {
        -32700 => "PARSE_ERROR",
        -32600 => "INVALID_REQUEST",
        -32601 => "METHOD_NOT_FOUND",
        -32602 => "INVALID_PARAMS",
        -32001 => "TASK_NOT_FOUND",
        -32002 => "TASK_NOT_CANCELABLE",
        -32003 => "PUSH_NOTIFICATION_NOT_SUPPORTED",
        -32004 => "UNSUPPORTED_OPERATION",
        -32005 => "CONTENT_TYPE_NOT_SUPPORTED",
        -32006 => "INVALID_AGENT_RESPONSE",
        -32007 => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
        -32008 => "EXTENSION_SUPPORT_REQUIRED",
        -32009 => "VERSION_NOT_SUPPORTED",
        _ => "INTERNAL",
    }
}

/// A2A 1.0.1's HTTP mapping, by code.
fn rest_status_for_code(code: i64) -> u16 {
    match code {
        -32001 | -32601 => 404,
        -32700 | -32600 | -32602 | -32005..=-32002 | -32009..=-32007 => 400,
        _ => 500,
    }
}

fn grpc_status_name(http: u16) -> &'static str {
    match http {
        400 | 415 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        429 => "RESOURCE_EXHAUSTED",
        404 => "NOT_FOUND",
        413 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        408 | 504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

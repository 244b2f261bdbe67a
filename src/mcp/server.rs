//! The MCP server: the tools a caller may use, and a call as an A2A task followed to its
//! end: its progress as `notifications/progress`, a question as elicitation, cancel as
//! the task's cancel, the artifacts as the result.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as Content,
    ElicitRequestParams, ElicitationAction, InitializeResult, InputRequiredResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};

use super::content::{self, Input, Outcome};
use super::dispatch::Answer;
use super::Door;
use crate::agents::Agent;
use crate::error::GatewayError;
use crate::http::AppState;
use crate::protocol::jsonrpc::Method;

/// The key of the one input request a question makes.
const ANSWER: &str = "answer";

/// One session's server; who calls is read per request (see [`Door`]).
#[derive(Clone)]
pub(super) struct Tools {
    state: Arc<AppState>,
}

impl Tools {
    pub(super) fn new(state: Arc<AppState>) -> Tools {
        Tools { state }
    }

    /// The agents the caller may use, by tool name.
    fn agents(&self, door: &Door) -> Vec<Arc<Agent>> {
        let live = self.state.live.load_full();
        // Not `Live::authorize`, which counts a refusal: hiding a tool refuses nothing.
        live.registry
            .iter()
            .filter(|a| live.auth.authorize(&door.principal, &a.def).is_ok())
            .cloned()
            .collect()
    }
}

/// The door the request came through (the HTTP request's caller, set by `serve`).
fn door_of(context: &RequestContext<RoleServer>) -> Result<Door, McpError> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Door>())
        .cloned()
        .ok_or_else(|| McpError::internal_error("the request's caller is unknown", None))
}

impl ServerHandler for Tools {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        InitializeResult::new(capabilities)
            .with_server_info(rmcp::model::Implementation::new(
                "a2a-gateway",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Each tool is an A2A agent behind this gateway: send it a message; a result's \
                 _meta names the task and conversation (a2a-gateway/taskId, \
                 a2a-gateway/contextId) to continue with.",
            )
    }

    /// A session with a stream for the server's messages hears of reloads (the tools may
    /// have changed) until it closes.
    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        let mut reloads = self.state.reloaded.subscribe();
        let peer = context.peer;
        tokio::spawn(async move {
            while reloads.changed().await.is_ok() {
                if peer.notify_tool_list_changed().await.is_err() {
                    break;
                }
            }
        });
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let door = door_of(&context)?;
        let agents = self.agents(&door);
        let tools = (agents.iter())
            .flat_map(|a| content::tools_of(a))
            .filter_map(|named| content::tool_for(&named))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let door = door_of(&context)?;
        // An agent the caller may not use is a tool that does not exist, as in the list.
        let agents = self.agents(&door);
        let (agent, skill) = (agents.iter())
            .flat_map(|a| content::tools_of(a))
            .find(|named| named.name() == request.name)
            .map(|named| (named.agent.name.clone(), named.skill.map(|s| s.id.clone())))
            .ok_or_else(|| {
                McpError::invalid_params(format!("unknown tool: {}", request.name), None)
            })?;
        let params = match (&request.input_responses, &request.request_state) {
            // The answer to a question this server asked (see `ask`).
            (Some(responses), Some(state)) => match answered(responses, state) {
                Ok(params) => params,
                Err(result) => return Ok(result.into()),
            },
            _ => {
                let input = Input::parse(request.arguments.clone())
                    .map_err(|why| McpError::invalid_params(why, None))?;
                input.params(skill.as_deref())
            }
        };
        let call = Call {
            door: &door,
            agent: &agent,
            context: &context,
            progress: context.meta.get_progress_token(),
        };
        call.run(params).await
    }
}

/// The answer to a question, from the client's input responses: the follow-up message's
/// params, or the result to give when the user declined.
fn answered(
    responses: &std::collections::BTreeMap<String, Value>,
    state: &str,
) -> Result<Value, CallToolResult> {
    let (task_id, context_id) = state.split_once(' ').unwrap_or((state, ""));
    let answer = responses.get(ANSWER).cloned().unwrap_or(Value::Null);
    match answer["action"].as_str() {
        Some("accept") => {
            let text = match &answer["content"][ANSWER] {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            let context_id = (!context_id.is_empty()).then_some(context_id);
            Ok(content::message_params(
                vec![json!({"text": text})],
                Some(task_id),
                context_id,
            ))
        }
        _ => {
            let mut result = CallToolResult::success(vec![Content::text(
                "No answer was given; the task still waits for one. To answer later, call the \
                 tool again with task_id and context_id from this result's _meta.",
            )]);
            result.meta = serde_json::from_value(json!({
                content::META_TASK: task_id,
                content::META_CONTEXT: context_id,
            }))
            .ok();
            Err(result)
        }
    }
}

/// One tool call in progress.
struct Call<'a> {
    door: &'a Door,
    agent: &'a str,
    context: &'a RequestContext<RoleServer>,
    progress: Option<ProgressToken>,
}

impl Call<'_> {
    /// Sends `params` as a streamed A2A message and follows the task until it ends or asks
    /// a question; a question is asked through elicitation where the client can answer one
    /// in this call, else given back to answer with a second call.
    async fn run(&self, mut params: Value) -> Result<CallToolResponse, McpError> {
        loop {
            let outcome = match self.follow(params).await? {
                Ok(outcome) => outcome,
                Err(result) => return Ok(result.into()),
            };
            if !outcome.waits_for_input() {
                return Ok(outcome.result().into());
            }
            match self.ask(&outcome).await {
                Asked::Answer(next) => params = next,
                Asked::Respond(response) => return Ok(response),
            }
        }
    }

    /// The task's events until it settles; a refusal (an unknown agent, a rate limit, a
    /// full gateway) is the tool's error result, as the agent's own failures are.
    async fn follow(&self, params: Value) -> Result<Result<Outcome, CallToolResult>, McpError> {
        let params = serde_json::value::to_raw_value(&params)
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let answer = self
            .door
            .dispatch
            .call(
                &self.door.head,
                self.agent,
                Method::SendStreamingMessage,
                params,
            )
            .await;
        let mut events = match answer {
            Ok(Answer::Stream(events)) => events,
            Ok(Answer::Json(body)) => return Ok(Err(refused_by_body(&body))),
            Err(e) => return Ok(Err(refused(&e))),
        };
        let mut outcome = Outcome::default();
        loop {
            use futures_util::StreamExt as _;
            let abandoned = async {
                match &self.door.abandoned {
                    Some(token) => token.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                next = events.next() => next,
                () = self.context.ct.cancelled() => {
                    self.cancel(&outcome).await;
                    return Ok(Err(CallToolResult::error(vec![Content::text("canceled")])));
                }
                () = abandoned => {
                    // Its client went away without a word: nobody will read the answer.
                    self.cancel(&outcome).await;
                    return Ok(Err(CallToolResult::error(vec![Content::text("canceled: the client went away")])));
                }
            };
            let Some(item) = next else { break };
            let item = match item {
                Ok(item) => item,
                Err(e) => return Ok(Err(refused(&e))),
            };
            let said = outcome.take(item);
            if let (Some(token), Some(said)) = (&self.progress, said) {
                let _ = self
                    .context
                    .peer
                    .notify_progress(
                        ProgressNotificationParam::new(token.clone(), f64::from(outcome.events))
                            .with_message(said),
                    )
                    .await;
            }
            if outcome.settled() {
                break;
            }
        }
        Ok(Ok(outcome))
    }

    /// The MCP client canceled its call: the task is canceled too.
    async fn cancel(&self, outcome: &Outcome) {
        let Some(task_id) = &outcome.task_id else {
            return;
        };
        if let Ok(params) = serde_json::value::to_raw_value(&json!({"id": task_id})) {
            let dispatch = &self.door.dispatch;
            let _ = dispatch
                .call(&self.door.head, self.agent, Method::CancelTask, params)
                .await;
        }
    }

    /// The agent's question, to the user, where the client said it can elicit: on a
    /// 2026-07-28 call as an input request it answers by calling again; on an older
    /// session through `elicitation/create`. Else the result says how to answer with a
    /// second call.
    async fn ask(&self, outcome: &Outcome) -> Asked {
        let question = match outcome.said.as_deref() {
            Some(q) if !q.is_empty() => q.to_string(),
            _ => format!("{} needs more input to go on.", self.agent),
        };
        let form = json!({
            "mode": "form",
            "message": question,
            "requestedSchema": {
                "type": "object",
                "properties": {ANSWER: {"type": "string", "title": "Answer", "description": question}},
                "required": [ANSWER]
            }
        });
        let task_id = outcome.task_id.clone().unwrap_or_default();
        let context_id = outcome.context_id.clone().unwrap_or_default();
        let modern = self
            .context
            .protocol_version()
            .is_some_and(|v| !v.has_initialize());
        // A 2026-07-28 request carries its client's capabilities; an older one's are the
        // session's, from its handshake.
        let can_elicit = match modern {
            true => (self.context.client_capabilities()).is_some_and(|c| c.elicitation.is_some()),
            false => !self.context.peer.supported_elicitation_modes().is_empty(),
        };
        if modern && can_elicit {
            let required = json!({
                "resultType": "input_required",
                "inputRequests": {ANSWER: {"method": "elicitation/create", "params": form}},
                "requestState": format!("{task_id} {context_id}"),
                "_meta": outcome.meta(),
            });
            if let Ok(required) = serde_json::from_value::<InputRequiredResult>(required) {
                return Asked::Respond(CallToolResponse::InputRequired(required));
            }
        }
        if can_elicit && !modern {
            if let Ok(params) = serde_json::from_value::<ElicitRequestParams>(form) {
                if let Ok(answer) = self.context.peer.create_elicitation(params).await {
                    let answer = json!({
                        "action": match answer.action {
                            ElicitationAction::Accept => "accept",
                            ElicitationAction::Decline => "decline",
                            _ => "cancel",
                        },
                        "content": answer.content,
                    });
                    let responses = [(ANSWER.to_string(), answer)].into_iter().collect();
                    return match answered(&responses, &format!("{task_id} {context_id}")) {
                        Ok(next) => Asked::Answer(next),
                        Err(result) => Asked::Respond(result.into()),
                    };
                }
            }
        }
        let text = format!(
            "{} asks: {question}\nTo answer, call this tool again with your answer as message, \
             and task_id \"{task_id}\" and context_id \"{context_id}\".",
            self.agent
        );
        let mut result = CallToolResult::success(vec![Content::text(text)]);
        result.meta = serde_json::from_value(Value::Object(outcome.meta())).ok();
        Asked::Respond(result.into())
    }
}

enum Asked {
    /// The user answered: the follow-up's params.
    Answer(Value),
    Respond(CallToolResponse),
}

/// A refusal as the tool's error result, in the gateway's words (the error table's).
fn refused(error: &GatewayError) -> CallToolResult {
    let mut text = error.to_string();
    if let Some(secs) = error.retry_after() {
        text.push_str(&format!(" (retry after {secs} s)"));
    }
    CallToolResult::error(vec![Content::text(text)])
}

/// A JSON-RPC answer where a stream was asked for: its error, or the result's text.
fn refused_by_body(body: &[u8]) -> CallToolResult {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let message = parsed["error"]["message"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    CallToolResult::error(vec![Content::text(message)])
}

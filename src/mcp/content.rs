//! What MCP clients see of agents and their tasks: a tool per agent (its input schema), the
//! A2A message a call's arguments make, and the MCP result a task's events make.

use base64::Engine as _;
use rmcp::model::{CallToolResult, Tool};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::agents::Agent;
use crate::config::{McpTools, Skill};
use crate::protocol::model::{Artifact, Message, Part, PartContent, StreamItem, TaskState};

/// `_meta` keys of a result: the A2A task, its conversation and its state.
pub(super) const META_TASK: &str = "a2a-gateway/taskId";
pub(super) const META_CONTEXT: &str = "a2a-gateway/contextId";
pub(super) const META_STATE: &str = "a2a-gateway/state";
/// The message metadata naming the skill a skill's tool was called for.
pub(super) const META_SKILL: &str = crate::routing::TOOL_SKILL_KEY;

/// An agent's tool name: its name where MCP allows it (letters, digits, `_`, `-`, `.`, at
/// most 128), else with `_` for what it does not.
pub(super) fn tool_name(agent: &str) -> String {
    agent
        .chars()
        .take(128)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' | '.' => c,
            _ => '_',
        })
        .collect()
}

/// A tool of the gateway's: an agent, or one of its skills (`[mcp] tools = "skills"`).
pub(super) struct Named<'a> {
    pub(super) agent: &'a Agent,
    pub(super) skill: Option<&'a Skill>,
}

impl Named<'_> {
    pub(super) fn name(&self) -> String {
        match self.skill {
            None => tool_name(&self.agent.name),
            Some(s) => tool_name(&format!("{}.{}", self.agent.name, s.id)),
        }
    }
}

/// The tools of `agent`: one, or one per skill when its file asks for that.
pub(super) fn tools_of(agent: &Agent) -> Vec<Named<'_>> {
    match agent.def.mcp_tools {
        McpTools::Skills if !agent.def.skills.is_empty() => (agent.def.skills.iter())
            .map(|skill| Named {
                agent,
                skill: Some(skill),
            })
            .collect(),
        _ => vec![Named { agent, skill: None }],
    }
}

fn describe(skill: &Skill) -> String {
    let mut out = format!("{}: {}", skill.name, skill.description);
    if !skill.examples.is_empty() {
        out.push_str(&format!(" (e.g. \"{}\")", skill.examples.join("\", \"")));
    }
    out
}

/// The tool that sends a message to an agent: its description and skills as the card
/// says (or the one skill's).
pub(super) fn tool_for(named: &Named<'_>) -> Option<Tool> {
    let def = &named.agent.def;
    let mut description = match def.description.trim() {
        "" => format!("The A2A agent \"{}\", behind the gateway.", def.name),
        d => d.to_string(),
    };
    match named.skill {
        Some(skill) => description = format!("{}\n{description}", describe(skill)),
        None => {
            for skill in &def.skills {
                description.push_str(&format!("\n- {}", describe(skill)));
            }
        }
    }
    let title = match named.skill {
        Some(skill) => format!("{}: {}", def.name, skill.name),
        None => def.name.clone(),
    };
    let tool = json!({
        "name": named.name(),
        "title": title,
        "description": description.trim(),
        "inputSchema": {
            "type": "object",
            "properties": {
                "message": {"type": "string", "description": "What to say to the agent."},
                "context_id": {"type": "string",
                    "description": "Continue the conversation a previous result named (its _meta a2a-gateway/contextId)."},
                "task_id": {"type": "string",
                    "description": "Answer the task a previous result said needs input (its _meta a2a-gateway/taskId)."},
                "data": {"type": "object", "description": "Structured input, sent as a data part."},
                "files": {"type": "array", "description": "Files, each by URL or as base64 bytes.",
                    "items": {"type": "object", "properties": {
                        "uri": {"type": "string"}, "bytes": {"type": "string"},
                        "name": {"type": "string"}, "media_type": {"type": "string"}},
                        "additionalProperties": false}}
            },
            "required": ["message"],
            "additionalProperties": false
        },
        "annotations": {"openWorldHint": true}
    });
    serde_json::from_value(tool).ok()
}

/// A call's arguments, checked against the schema the tool gives.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Input {
    pub(super) message: String,
    #[serde(default)]
    pub(super) context_id: Option<String>,
    #[serde(default)]
    pub(super) task_id: Option<String>,
    #[serde(default)]
    data: Option<Map<String, Value>>,
    #[serde(default)]
    files: Vec<FileInput>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileInput {
    #[serde(default)]
    uri: Option<String>,
    #[serde(default)]
    bytes: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    media_type: Option<String>,
}

impl Input {
    /// The arguments of a call; an error says what is wrong with them.
    pub(super) fn parse(arguments: Option<Map<String, Value>>) -> Result<Input, String> {
        let arguments = Value::Object(arguments.unwrap_or_default());
        let input: Input =
            serde_json::from_value(arguments).map_err(|e| format!("the arguments: {e}"))?;
        for (i, f) in input.files.iter().enumerate() {
            match (&f.uri, &f.bytes) {
                (Some(_), None) => {}
                (None, Some(b)) => {
                    base64::engine::general_purpose::STANDARD
                        .decode(b)
                        .map_err(|e| format!("files[{i}].bytes is not base64: {e}"))?;
                }
                _ => return Err(format!("files[{i}]: give exactly one of uri and bytes")),
            }
        }
        Ok(input)
    }

    /// The 1.0 `SendMessage` params this call makes (for a skill's tool, the message's
    /// metadata names the skill).
    pub(super) fn params(&self, skill: Option<&str>) -> Value {
        let mut parts = vec![json!({"text": self.message})];
        if let Some(data) = &self.data {
            parts.push(json!({"data": data}));
        }
        for f in &self.files {
            let mut part = match (&f.uri, &f.bytes) {
                (Some(uri), _) => json!({"url": uri}),
                (_, Some(bytes)) => json!({"raw": bytes}),
                _ => continue,
            };
            if let Some(name) = &f.name {
                part["filename"] = json!(name);
            }
            if let Some(media_type) = &f.media_type {
                part["mediaType"] = json!(media_type);
            }
            parts.push(part);
        }
        let mut params = message_params(parts, self.task_id.as_deref(), self.context_id.as_deref());
        if let Some(skill) = skill {
            params["message"]["metadata"] = json!({META_SKILL: skill});
        }
        params
    }
}

/// 1.0 `SendMessage` params: a user message of `parts`, on a task and conversation if given.
pub(super) fn message_params(
    parts: Vec<Value>,
    task_id: Option<&str>,
    context_id: Option<&str>,
) -> Value {
    let mut message = json!({
        "role": "ROLE_USER",
        "messageId": uuid::Uuid::new_v4().to_string(),
        "parts": parts,
    });
    if let Some(t) = task_id {
        message["taskId"] = json!(t);
    }
    if let Some(c) = context_id {
        message["contextId"] = json!(c);
    }
    json!({"message": message})
}

/// What a task's events have said so far.
#[derive(Default)]
pub(super) struct Outcome {
    pub(super) task_id: Option<String>,
    pub(super) context_id: Option<String>,
    pub(super) state: Option<TaskState>,
    /// The last status message's text (a question, a failure's reason).
    pub(super) said: Option<String>,
    artifacts: Vec<Artifact>,
    /// A reply without a task.
    reply: Option<Message>,
    pub(super) events: u32,
}

impl Outcome {
    /// Takes in one event; what to tell a client watching progress, if anything.
    pub(super) fn take(&mut self, item: StreamItem) -> Option<String> {
        self.events += 1;
        match item {
            StreamItem::Task(task) => {
                self.task_id = Some(task.id);
                self.context_id = Some(task.context_id);
                self.state = Some(task.status.state);
                self.said = task.status.message.as_deref().map(Message::text);
                for a in task.artifacts {
                    self.artifact(a, false);
                }
                Some(format!("task {}", task.status.state.v03_name()))
            }
            StreamItem::StatusUpdate(u) => {
                self.task_id = Some(u.task_id);
                self.context_id = Some(u.context_id);
                self.state = Some(u.status.state);
                self.said = u.status.message.as_deref().map(Message::text);
                Some(match &self.said {
                    Some(said) if !said.is_empty() => {
                        format!("{}: {said}", u.status.state.v03_name())
                    }
                    _ => u.status.state.v03_name().to_string(),
                })
            }
            StreamItem::ArtifactUpdate(a) => {
                let text: String = a.artifact.parts.iter().filter_map(Part::as_text).collect();
                self.artifact(a.artifact, a.append);
                (!text.is_empty()).then_some(text)
            }
            StreamItem::Message(m) => {
                self.context_id = m.context_id.clone().or(self.context_id.take());
                let text = m.text();
                self.reply = Some(m);
                Some(text)
            }
        }
    }

    fn artifact(&mut self, artifact: Artifact, append: bool) {
        match self
            .artifacts
            .iter_mut()
            .find(|a| a.artifact_id == artifact.artifact_id)
        {
            Some(known) if append => known.parts.extend(artifact.parts),
            Some(known) => *known = artifact,
            None => self.artifacts.push(artifact),
        }
    }

    /// Whether the task is done, or waits for its caller.
    pub(super) fn settled(&self) -> bool {
        self.reply.is_some()
            || self
                .state
                .is_some_and(|s| s.is_terminal() || s.is_interrupted())
    }

    pub(super) fn waits_for_input(&self) -> bool {
        self.state.is_some_and(TaskState::is_interrupted)
    }

    /// The `_meta` that lets a second call continue: the task, its conversation, its state.
    pub(super) fn meta(&self) -> Map<String, Value> {
        let mut meta = Map::new();
        if let Some(t) = &self.task_id {
            meta.insert(META_TASK.into(), json!(t));
        }
        if let Some(c) = &self.context_id {
            meta.insert(META_CONTEXT.into(), json!(c));
        }
        if let Some(s) = self.state {
            meta.insert(META_STATE.into(), json!(s.v03_name()));
        }
        meta
    }

    /// The tool's result: the artifacts (or the reply) as content, an error for a task
    /// that failed, was rejected or canceled, and the ids to continue with in `_meta`.
    pub(super) fn result(&self) -> CallToolResult {
        let failed = self.state.is_some_and(|s| {
            matches!(
                s,
                TaskState::Failed | TaskState::Rejected | TaskState::Canceled
            )
        });
        let mut content = Vec::new();
        let mut structured = None;
        // A message's or an artifact's text parts (a stream's chunks) make one text block.
        let groups =
            (self.reply.iter().map(|m| &m.parts)).chain(self.artifacts.iter().map(|a| &a.parts));
        for parts in groups {
            let mut text = String::new();
            for part in parts {
                if let PartContent::Text(t) = &part.content {
                    text.push_str(t);
                    continue;
                }
                if !text.is_empty() {
                    content.push(json!({"type": "text", "text": std::mem::take(&mut text)}));
                }
                let (block, data) = content_of(part);
                content.extend(block);
                if data.is_some() && structured.is_none() {
                    structured = data;
                }
            }
            if !text.is_empty() {
                content.push(json!({"type": "text", "text": text}));
            }
        }
        if failed || content.is_empty() {
            let state = self.state.map_or("answered", TaskState::v03_name);
            let said = self.said.clone().unwrap_or_default();
            let text = match (failed, said.is_empty()) {
                (true, true) => format!("The task ended {state}."),
                (true, false) => format!("The task ended {state}: {said}"),
                (false, _) => said,
            };
            if !text.is_empty() || content.is_empty() {
                content.insert(0, json!({"type": "text", "text": text}));
            }
        }
        // `resultType` as the constructors set it (rmcp drops it for older sessions).
        let mut result = json!({
            "resultType": "complete",
            "content": content,
            "isError": failed,
            "_meta": self.meta(),
        });
        if let Some(s) = structured {
            result["structuredContent"] = s;
        }
        serde_json::from_value(result).unwrap_or_else(|e| {
            CallToolResult::error(vec![rmcp::model::ContentBlock::text(format!(
                "the agent's answer as MCP content: {e}"
            ))])
        })
    }
}

/// One A2A part as MCP content: text as text; data as its JSON text (and the structured
/// content); a file inline as an embedded resource, by URL as a resource link.
fn content_of(part: &Part) -> (Option<Value>, Option<Value>) {
    let media = part.media_type.clone();
    match &part.content {
        PartContent::Text(t) => (Some(json!({"type": "text", "text": t})), None),
        PartContent::Data(d) => (
            Some(json!({"type": "text", "text": d.to_string()})),
            Some(d.clone()),
        ),
        PartContent::Raw(bytes) => {
            let name = part.filename.clone().unwrap_or_else(|| "file".into());
            let mut resource = json!({"uri": format!("a2a-gateway:file/{name}"), "blob": bytes});
            if let Some(m) = media {
                resource["mimeType"] = json!(m);
            }
            (
                Some(json!({"type": "resource", "resource": resource})),
                None,
            )
        }
        PartContent::Url(url) => {
            let name = part.filename.clone().unwrap_or_else(|| url.clone());
            let mut link = json!({"type": "resource_link", "uri": url, "name": name});
            if let Some(m) = media {
                link["mimeType"] = json!(m);
            }
            (Some(link), None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_keep_what_mcp_allows() {
        assert_eq!(tool_name("echo"), "echo");
        assert_eq!(tool_name("my agent/v2"), "my_agent_v2");
        assert_eq!(tool_name(&"x".repeat(200)).len(), 128);
    }

    #[test]
    fn arguments_are_checked() {
        let args = |v: Value| v.as_object().cloned();
        assert!(Input::parse(args(json!({"message": "hi"}))).is_ok());
        let missing = Input::parse(args(json!({}))).err().unwrap();
        assert!(missing.contains("message"), "{missing}");
        let unknown = Input::parse(args(json!({"message": "hi", "nope": 1})))
            .err()
            .unwrap();
        assert!(unknown.contains("nope"), "{unknown}");
        let both = Input::parse(args(json!({"message": "hi",
            "files": [{"uri": "https://x/y", "bytes": "aGk="}]})))
        .err()
        .unwrap();
        assert!(both.contains("files[0]"), "{both}");
        let bad = Input::parse(args(json!({"message": "hi", "files": [{"bytes": "***"}]})))
            .err()
            .unwrap();
        assert!(bad.contains("base64"), "{bad}");
    }
}

//! The jsonl protocol: one JSON object per stdout line, each a task event (see the module
//! documentation of `command`).

use serde::Deserialize;
use serde_json::Value;

use crate::agents::{BackendError, EventSink};
use crate::protocol::model::{Artifact, Message, Metadata, Part, PartContent, TaskState};

pub(super) fn artifact(id: &str, part: Part) -> Artifact {
    Artifact {
        artifact_id: id.into(),
        name: Some(id.into()),
        description: None,
        parts: vec![part],
        metadata: None,
        extensions: Vec::new(),
    }
}

/// What one jsonl event meant for the run.
pub(super) enum Step {
    More,
    /// The program reported the end of the task.
    Reported,
    /// The program asked for input.
    Asked,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    status: Option<String>,
    message: Option<String>,
    artifact: Option<Value>,
    name: Option<String>,
    #[serde(default)]
    append: bool,
    #[serde(default)]
    last_chunk: bool,
    input_required: Option<String>,
    result: Option<String>,
    error: Option<String>,
    /// Goes with the event (an artifact's, a status's, the result's): token usage, say.
    metadata: Option<Metadata>,
}

/// One line of a jsonl program's output, understood.
#[derive(Debug, PartialEq)]
pub(super) enum Line {
    Blank,
    Failed(String),
    InputRequired(String),
    Result(String),
    Artifact {
        name: String,
        content: PartContent,
        append: bool,
        last_chunk: bool,
    },
    Status {
        state: TaskState,
        message: Option<String>,
    },
    /// An object with none of the keys above: nothing to do.
    Nothing,
}

/// Reads one line of output; a line that is no event the protocol knows fails the task.
#[cfg(test)]
pub(super) fn parse_line(line: &str) -> Result<Line, BackendError> {
    parse_event(line).map(|(line, _)| line)
}

/// [`parse_line`], with the event's `metadata`.
pub(super) fn parse_event(line: &str) -> Result<(Line, Option<Metadata>), BackendError> {
    if line.trim().is_empty() {
        return Ok((Line::Blank, None));
    }
    let mut ev: Event = serde_json::from_str(line).map_err(|e| {
        BackendError::Failed(format!("the agent's program wrote an invalid event: {e}"))
    })?;
    let metadata = ev.metadata.take();
    understood(ev).map(|line| (line, metadata))
}

fn understood(ev: Event) -> Result<Line, BackendError> {
    if let Some(text) = ev.error {
        return Ok(Line::Failed(text));
    }
    if let Some(question) = ev.input_required {
        return Ok(Line::InputRequired(question));
    }
    if let Some(text) = ev.result {
        return Ok(Line::Result(text));
    }
    if let Some(a) = ev.artifact {
        let content = match (a.get("text").and_then(Value::as_str), a.get("data")) {
            (Some(t), _) => PartContent::Text(t.to_string()),
            (None, Some(d)) => PartContent::Data(d.clone()),
            _ => {
                return Err(BackendError::Failed(
                    "an artifact event needs \"text\" or \"data\"".into(),
                ))
            }
        };
        return Ok(Line::Artifact {
            name: ev.name.unwrap_or_else(|| "output".into()),
            content,
            append: ev.append,
            last_chunk: ev.last_chunk,
        });
    }
    if let Some(state) = ev.status {
        let state = TaskState::parse_lenient(&state)
            .filter(|s| !s.ends_stream())
            .ok_or_else(|| BackendError::Failed(format!("unknown or final status \"{state}\" in an event; use result/error/inputRequired")))?;
        return Ok(Line::Status {
            state,
            message: ev.message,
        });
    }
    Ok(Line::Nothing)
}

/// Applies one line of output to the task.
pub(super) async fn jsonl_event(events: &mut EventSink, line: &str) -> Result<Step, BackendError> {
    let (line, metadata) = parse_event(line)?;
    match line {
        Line::Blank | Line::Nothing => Ok(Step::More),
        Line::Failed(text) => {
            events
                .status(TaskState::Failed, Some(Message::agent_text(text)))
                .await?;
            Ok(Step::Reported)
        }
        Line::InputRequired(question) => {
            events
                .status(
                    TaskState::InputRequired,
                    Some(Message::agent_text(question)),
                )
                .await?;
            Ok(Step::Asked)
        }
        Line::Result(text) => {
            events
                .artifact(artifact("result", Part::text(text)), false, true)
                .await?;
            events
                .status_noted(TaskState::Completed, None, metadata)
                .await?;
            Ok(Step::Reported)
        }
        Line::Artifact {
            name,
            content,
            append,
            last_chunk,
        } => {
            let part = Part {
                content,
                metadata: None,
                filename: None,
                media_type: None,
            };
            let mut artifact = artifact(&name, part);
            artifact.metadata = metadata;
            events.artifact(artifact, append, last_chunk).await?;
            Ok(Step::More)
        }
        Line::Status { state, message } => {
            events
                .status_noted(state, message.map(Message::agent_text), metadata)
                .await?;
            Ok(Step::More)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn failure(line: &str) -> String {
        match parse_line(line) {
            Err(BackendError::Failed(why)) => why,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn each_event_of_the_protocol() {
        assert_eq!(parse_line("  ").unwrap(), Line::Blank);
        assert_eq!(parse_line("{}").unwrap(), Line::Nothing);
        // Keys the protocol does not know are left to later versions of it.
        assert_eq!(parse_line(r#"{"colour": "red"}"#).unwrap(), Line::Nothing);
        assert_eq!(
            parse_line(r#"{"error": "no"}"#).unwrap(),
            Line::Failed("no".into())
        );
        assert_eq!(
            parse_line(r#"{"inputRequired": "name?"}"#).unwrap(),
            Line::InputRequired("name?".into())
        );
        assert_eq!(
            parse_line(r#"{"result": "done"}"#).unwrap(),
            Line::Result("done".into())
        );
        assert_eq!(
            parse_line(r#"{"artifact": {"text": "a"}, "append": true}"#).unwrap(),
            Line::Artifact {
                name: "output".into(),
                content: PartContent::Text("a".into()),
                append: true,
                last_chunk: false
            }
        );
        assert_eq!(
            parse_line(r#"{"artifact": {"data": {"k": 1}}, "name": "out", "lastChunk": true}"#)
                .unwrap(),
            Line::Artifact {
                name: "out".into(),
                content: PartContent::Data(json!({"k": 1})),
                append: false,
                last_chunk: true
            }
        );
        assert_eq!(
            parse_line(r#"{"status": "working", "message": "busy"}"#).unwrap(),
            Line::Status {
                state: TaskState::Working,
                message: Some("busy".into())
            }
        );
    }

    #[test]
    fn an_error_outranks_the_rest_of_its_line() {
        assert_eq!(
            parse_line(r#"{"result": "x", "error": "y", "inputRequired": "z"}"#).unwrap(),
            Line::Failed("y".into())
        );
    }

    #[test]
    fn lines_that_are_no_event_fail_the_task() {
        assert!(failure("not json").contains("invalid event"));
        assert!(failure(r#"{"artifact": {"file": "x"}}"#).contains("\"text\" or \"data\""));
        assert!(failure(r#"{"status": "completed"}"#).contains("final status"));
        assert!(failure(r#"{"status": "sleeping"}"#).contains("unknown"));
    }
}

//! The built-in `echo` agent: deterministic, and able to walk every part of the task
//! lifecycle on request, for demos, health checks and conformance testing.
//!
//! What it does is chosen, in order, by:
//! 1. a messageId prefix of the A2A TCK test agent (`tck-...`, `test-resubscribe-...`);
//! 2. `metadata.echo.mode` (`delay` with `seconds`, `input`, `auth`, `fail`, `reject`,
//!    `message`);
//! 3. a leading command in the text: `/delay <secs> <text>`, `/input <question>`,
//!    `/auth <why>` (auth-required, answered like a question), `/fail`, `/reject`,
//!    `/message <text>`;
//! 4. otherwise it echoes the text back as an artifact named "echo".

use std::time::Duration;

use base64::Engine;
use futures_util::future::BoxFuture;
use serde_json::json;

use super::{AgentBackend, BackendError, EventSink, Execution, Immediate};
use crate::config::EchoConfig;
use crate::protocol::model::{Artifact, Message, Part, PartContent, TaskState};

/// Upper bound on `/delay`, so a typo cannot park a worker for a day.
const MAX_DELAY_SECS: f64 = 3600.0;
const ARTIFACT_ID: &str = "echo";

pub(crate) struct EchoBackend {
    config: EchoConfig,
}

impl EchoBackend {
    pub(crate) fn new(config: EchoConfig) -> EchoBackend {
        EchoBackend { config }
    }
}

impl AgentBackend for EchoBackend {
    fn execute(&self, exec: Execution) -> BoxFuture<'static, Result<(), BackendError>> {
        let chunk_delay = Duration::from_millis(self.config.chunk_delay_ms);
        let max_delay = Duration::from_secs(self.config.max_delay_secs);
        Box::pin(run(exec, chunk_delay, max_delay))
    }

    fn answer_now(&self, message: &Message) -> Option<Immediate> {
        outcome(choose(message), false).ok()
    }
}

/// What the echo agent was asked to do.
#[derive(Debug, Clone, PartialEq)]
enum Behaviour {
    Echo(String),
    Delay(Duration, String),
    Input(String),
    /// Waits for the caller to authorize, as a question waits for an answer.
    Auth(String),
    Fail(String),
    Reject,
    Message(String),
    Tck(Tck),
}

/// The TCK's test-agent conventions, keyed by messageId prefix.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Tck {
    CompleteTask,
    InputRequired,
    ArtifactText,
    ArtifactFile,
    ArtifactFileUrl,
    ArtifactData,
    MessageResponse,
    RejectTask,
    StreamChunkedFile,
    StreamStraightToCompleted,
    Stream,
    Resubscribe,
}

/// Longest prefix first, so `tck-artifact-file-url` is not taken for `tck-artifact-file`.
const TCK_PREFIXES: &[(&str, Tck)] = &[
    ("tck-stream-artifact-file-chunked", Tck::StreamChunkedFile),
    ("test-resubscribe-message-id", Tck::Resubscribe),
    ("tck-artifact-file-url", Tck::ArtifactFileUrl),
    ("tck-message-response", Tck::MessageResponse),
    ("tck-input-required", Tck::InputRequired),
    ("tck-artifact-file", Tck::ArtifactFile),
    ("tck-artifact-text", Tck::ArtifactText),
    ("tck-artifact-data", Tck::ArtifactData),
    ("tck-complete-task", Tck::CompleteTask),
    ("tck-reject-task", Tck::RejectTask),
    ("tck-stream-002", Tck::StreamStraightToCompleted),
    ("tck-stream-", Tck::Stream),
];

fn choose(message: &Message) -> Behaviour {
    if let Some((_, tck)) = TCK_PREFIXES
        .iter()
        .find(|(prefix, _)| message.message_id.starts_with(prefix))
    {
        return Behaviour::Tck(*tck);
    }
    let text = message.text();
    if let Some(mode) = metadata_mode(message, &text) {
        return mode;
    }
    parse_command(&text)
}

fn metadata_mode(message: &Message, text: &str) -> Option<Behaviour> {
    let echo = message.metadata.as_ref()?.get("echo")?;
    let mode = echo.get("mode")?.as_str()?;
    Some(match mode {
        "delay" => {
            let secs = echo.get("seconds").and_then(|s| s.as_f64()).unwrap_or(1.0);
            Behaviour::Delay(delay(secs), text.to_string())
        }
        "input" | "input-required" => Behaviour::Input(text.to_string()),
        "auth" | "auth-required" => Behaviour::Auth(text.to_string()),
        "fail" => Behaviour::Fail(text.to_string()),
        "reject" => Behaviour::Reject,
        "message" => Behaviour::Message(text.to_string()),
        _ => Behaviour::Echo(text.to_string()),
    })
}

fn delay(secs: f64) -> Duration {
    Duration::from_secs_f64(if secs.is_finite() {
        secs.clamp(0.0, MAX_DELAY_SECS)
    } else {
        0.0
    })
}

fn parse_command(text: &str) -> Behaviour {
    let trimmed = text.trim_start();
    let (command, rest) = match trimmed.split_once(char::is_whitespace) {
        Some((c, r)) => (c, r.trim_start()),
        None => (trimmed, ""),
    };
    match command {
        "/delay" => {
            let (secs, rest) = match rest.split_once(char::is_whitespace) {
                Some((s, r)) => (s, r.trim_start()),
                None => (rest, ""),
            };
            match secs.parse::<f64>() {
                Ok(s) => Behaviour::Delay(delay(s), rest.to_string()),
                Err(_) => Behaviour::Echo(text.to_string()),
            }
        }
        "/input" => Behaviour::Input(rest.to_string()),
        "/auth" => Behaviour::Auth(rest.to_string()),
        "/fail" => Behaviour::Fail(rest.to_string()),
        "/reject" => Behaviour::Reject,
        "/message" => Behaviour::Message(rest.to_string()),
        _ => Behaviour::Echo(text.to_string()),
    }
}

fn artifact(parts: Vec<Part>) -> Artifact {
    Artifact {
        artifact_id: ARTIFACT_ID.into(),
        name: Some("echo".into()),
        description: None,
        parts,
        metadata: None,
        extensions: Vec::new(),
    }
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn file_part(content: PartContent) -> Part {
    Part {
        content,
        metadata: None,
        filename: Some("output.txt".into()),
        media_type: Some("text/plain".into()),
    }
}

/// Splits text into up to three chunks at word boundaries; concatenated, they are the text.
fn chunks(text: &str) -> Vec<&str> {
    let words: Vec<usize> = text
        .split_inclusive(char::is_whitespace)
        .scan(0, |end, w| {
            *end += w.len();
            Some(*end)
        })
        .collect();
    if words.len() <= 1 {
        return vec![text];
    }
    let n = words.len();
    let pieces = n.min(3);
    let mut out = Vec::with_capacity(pieces);
    let mut start = 0;
    for i in 1..=pieces {
        let end = if i == pieces {
            text.len()
        } else {
            words[i * n / pieces - 1]
        };
        out.push(&text[start..end]);
        start = end;
    }
    out
}

/// The outcome of a behaviour whose events all come at once, with nothing shown in between;
/// other behaviours come back unchanged. Both `answer_now` and `execute` take it from
/// here, so a task settled on the caller's thread is the task an execution would leave.
fn outcome(behaviour: Behaviour, streaming: bool) -> Result<Immediate, Behaviour> {
    let task = |artifacts, state, message: Option<&str>| Immediate::Task {
        artifacts,
        state,
        message: message.map(Message::agent_text),
    };
    let completed_with = |parts| task(vec![artifact(parts)], TaskState::Completed, None);
    let or = |text: String, fallback: &str| {
        if text.is_empty() {
            fallback.to_string()
        } else {
            text
        }
    };
    Ok(match behaviour {
        // Streamed, these show their steps (working, chunks) one by one.
        Behaviour::Echo(text) if !streaming => completed_with(vec![Part::text(text)]),
        Behaviour::Input(q) if !streaming => task(
            vec![],
            TaskState::InputRequired,
            Some(or(q, "What should I echo?").as_str()),
        ),
        Behaviour::Auth(why) if !streaming => task(
            vec![],
            TaskState::AuthRequired,
            Some(
                or(
                    why,
                    "Authorization needed: answer on this task once it is granted",
                )
                .as_str(),
            ),
        ),
        Behaviour::Fail(reason) if !streaming => task(
            vec![],
            TaskState::Failed,
            Some(or(reason, "failure requested").as_str()),
        ),
        Behaviour::Tck(Tck::Stream) if !streaming => {
            completed_with(vec![Part::text("Stream content")])
        }
        Behaviour::Reject => task(vec![], TaskState::Rejected, Some("rejected on request")),
        Behaviour::Message(text) => Immediate::Message(Message::agent_text(text)),
        Behaviour::Tck(tck) => match tck {
            Tck::CompleteTask => task(vec![], TaskState::Completed, Some("Hello from TCK")),
            Tck::InputRequired => task(
                vec![],
                TaskState::InputRequired,
                Some("Please provide more input"),
            ),
            Tck::MessageResponse => {
                Immediate::Message(Message::agent_text("Direct message response"))
            }
            Tck::RejectTask => task(vec![], TaskState::Rejected, Some("Task rejected")),
            Tck::StreamStraightToCompleted => task(vec![], TaskState::Completed, None),
            Tck::ArtifactText => completed_with(vec![Part::text("Generated text content")]),
            Tck::ArtifactFile => completed_with(vec![file_part(PartContent::Raw(b64(
                "Generated file content",
            )))]),
            Tck::ArtifactFileUrl => completed_with(vec![file_part(PartContent::Url(
                "https://example.com/output.txt".into(),
            ))]),
            Tck::ArtifactData => completed_with(vec![Part {
                content: PartContent::Data(json!({"key": "value", "count": 42})),
                metadata: None,
                filename: None,
                media_type: Some("application/json".into()),
            }]),
            Tck::Stream | Tck::StreamChunkedFile | Tck::Resubscribe => {
                return Err(Behaviour::Tck(tck))
            }
        },
        other => return Err(other),
    })
}

async fn echo_text(
    sink: &mut EventSink,
    text: &str,
    streaming: bool,
    chunk_delay: Duration,
) -> Result<(), BackendError> {
    if streaming {
        sink.status(TaskState::Working, None).await?;
        let pieces = chunks(text);
        let last = pieces.len() - 1;
        for (i, piece) in pieces.into_iter().enumerate() {
            if i > 0 && !chunk_delay.is_zero() {
                tokio::time::sleep(chunk_delay).await;
            }
            sink.artifact(artifact(vec![Part::text(piece)]), i > 0, i == last)
                .await?;
        }
    } else {
        sink.artifact(artifact(vec![Part::text(text)]), false, true)
            .await?;
    }
    sink.status(TaskState::Completed, None).await?;
    Ok(())
}

async fn run(
    exec: Execution,
    chunk_delay: Duration,
    max_delay: Duration,
) -> Result<(), BackendError> {
    let Execution {
        message,
        streaming,
        mut events,
        cancel,
        ..
    } = exec;
    let sink = &mut events;
    let wait = |d: Duration| {
        let cancel = cancel.clone();
        async move {
            tokio::select! {
                _ = tokio::time::sleep(d) => true,
                _ = cancel.cancelled() => false,
            }
        }
    };
    let behaviour = match outcome(choose(&message), streaming) {
        Ok(now) => return Ok(sink.settle(now).await?),
        Err(later) => later,
    };
    match behaviour {
        Behaviour::Echo(text) => echo_text(sink, &text, streaming, chunk_delay).await?,
        Behaviour::Delay(d, text) => {
            let d = d.min(max_delay);
            sink.status(TaskState::Working, None).await?;
            // A zero delay arms no timer: its tick would cost a millisecond.
            if d.is_zero() || wait(d).await {
                echo_text(sink, &text, streaming, chunk_delay).await?;
            }
        }
        // Streamed: working first, then what `outcome` settles at once otherwise.
        b @ (Behaviour::Input(_)
        | Behaviour::Auth(_)
        | Behaviour::Fail(_)
        | Behaviour::Tck(Tck::Stream)) => {
            sink.status(TaskState::Working, None).await?;
            if let Ok(rest) = outcome(b, false) {
                sink.settle(rest).await?;
            }
        }
        Behaviour::Tck(Tck::Resubscribe) => {
            sink.status(TaskState::Working, None).await?;
            if wait(Duration::from_secs(4)).await {
                sink.status(TaskState::Completed, None).await?;
            }
        }
        Behaviour::Tck(Tck::StreamChunkedFile) => {
            let chunk = |s: &str| artifact(vec![file_part(PartContent::Raw(b64(s)))]);
            sink.status(TaskState::Working, None).await?;
            sink.artifact(chunk("chunk one, "), false, false).await?;
            sink.artifact(chunk("chunk two"), true, true).await?;
            sink.status(TaskState::Completed, None).await?;
        }
        // `outcome` settles every other behaviour, streamed or not.
        Behaviour::Reject | Behaviour::Message(_) | Behaviour::Tck(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_reassemble_exactly() {
        for text in [
            "one two three four five six",
            "a b",
            "single",
            "",
            "  lead  x y z ",
        ] {
            let c = chunks(text);
            assert_eq!(c.concat(), text);
            assert!(c.len() <= 3);
        }
        assert_eq!(
            chunks("one two three four five six"),
            vec!["one two ", "three four ", "five six"]
        );
    }

    #[test]
    fn commands_parse() {
        assert_eq!(
            parse_command("/delay 2 hi there"),
            Behaviour::Delay(Duration::from_secs(2), "hi there".into())
        );
        assert_eq!(
            parse_command("/input Name?"),
            Behaviour::Input("Name?".into())
        );
        assert_eq!(
            parse_command("/auth sign in"),
            Behaviour::Auth("sign in".into())
        );
        assert_eq!(
            parse_command("/delay x"),
            Behaviour::Echo("/delay x".into())
        );
        assert_eq!(parse_command("hello"), Behaviour::Echo("hello".into()));
    }

    #[test]
    fn longest_tck_prefix_wins() {
        let mut m = Message::agent_text("x");
        m.message_id = "tck-artifact-file-url-123".into();
        assert_eq!(choose(&m), Behaviour::Tck(Tck::ArtifactFileUrl));
        m.message_id = "tck-stream-002-x".into();
        assert_eq!(choose(&m), Behaviour::Tck(Tck::StreamStraightToCompleted));
        m.message_id = "tck-stream-001".into();
        assert_eq!(choose(&m), Behaviour::Tck(Tck::Stream));
    }
}

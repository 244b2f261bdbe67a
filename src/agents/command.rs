//! The `command` backend: a local program as an A2A agent, one process per task.
//!
//! `io = "text"`: the message text goes to stdin; each stdout line is streamed as an
//! artifact chunk; exit 0 completes the task, anything else fails it with the tail of
//! stderr. `io = "jsonl"`: the message goes to stdin as one JSON line (A2A 1.0 shape);
//! each stdout line is one event:
//!
//! ```text
//! {"status": "working", "message": "optional text"}
//! {"artifact": {"text": "..."} | {"data": {...}}, "name": "out", "append": false, "lastChunk": true}
//! {"inputRequired": "question"}        the task waits for input (the process then ends)
//! {"result": "text"}                   completes the task with this text as an artifact
//! {"error": "text"}                    fails the task
//! ```
//!
//! Processes run in their own process group with only PATH, HOME, LANG and the configured
//! `env`. Cancel and timeout send SIGTERM to the group, then SIGKILL after the grace
//! period; a process is killed if its task is dropped (gateway shutdown), and reaped.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Semaphore;

use super::{AgentBackend, BackendError, EventSink, Execution};
use crate::config::{CommandConfig, CommandIo};
use crate::protocol::model::{Artifact, Message, Part, PartContent, TaskState};

/// How much of stderr a failed task reports.
const STDERR_TAIL_BYTES: usize = 2048;

pub struct CommandBackend {
    config: Arc<CommandConfig>,
    slots: Arc<Semaphore>,
}

impl CommandBackend {
    pub fn new(config: CommandConfig) -> CommandBackend {
        CommandBackend {
            slots: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
            config: Arc::new(config),
        }
    }
}

impl AgentBackend for CommandBackend {
    fn execute(&self, exec: Execution) -> BoxFuture<'static, Result<(), BackendError>> {
        Box::pin(run(self.config.clone(), self.slots.clone(), exec))
    }
}

fn artifact(id: &str, part: Part) -> Artifact {
    Artifact {
        artifact_id: id.into(),
        name: Some(id.into()),
        description: None,
        parts: vec![part],
        metadata: None,
        extensions: Vec::new(),
    }
}

fn spawn(cfg: &CommandConfig) -> std::io::Result<Child> {
    let mut cmd = Command::new(&cfg.command[0]);
    cmd.args(&cfg.command[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0)
        .env_clear();
    for key in ["PATH", "HOME", "LANG"] {
        if let Ok(v) = std::env::var(key) {
            cmd.env(key, v);
        }
    }
    cmd.envs(&cfg.env);
    if let Some(cwd) = &cfg.cwd {
        cmd.current_dir(cwd);
    }
    cmd.spawn()
}

/// SIGTERM to the process group, SIGKILL after `grace`.
async fn stop(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id() {
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
    let _ = child.kill().await;
}

/// How a run ended, before the exit status is known.
enum Ending {
    Eof,
    Canceled,
    TimedOut,
    /// The program reported the outcome itself (jsonl).
    Reported,
}

async fn run(
    cfg: Arc<CommandConfig>,
    slots: Arc<Semaphore>,
    exec: Execution,
) -> Result<(), BackendError> {
    let Execution {
        message,
        mut events,
        cancel,
        ..
    } = exec;
    let _slot = tokio::select! {
        slot = slots.acquire_owned() => slot.ok(),
        _ = cancel.cancelled() => return Ok(()),
    };
    let mut child = spawn(&cfg).map_err(|e| {
        BackendError::Failed(format!("the agent's program could not start: {}", e.kind()))
    })?;
    events.status(TaskState::Working, None).await?;

    let input = match cfg.io {
        CommandIo::Text => format!("{}\n", message.text()),
        CommandIo::Jsonl => serde_json::to_string(&message)
            .map(|s| s + "\n")
            .map_err(|e| BackendError::Failed(format!("encoding the message: {e}")))?,
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A program that does not read its input is its own business.
        let _ = stdin.write_all(input.as_bytes()).await;
    }
    let stderr = child.stderr.take();
    let tail = tokio::spawn(async move {
        let mut buf = Vec::new();
        if let Some(mut s) = stderr {
            let _ = s.read_to_end(&mut buf).await;
        }
        let start = buf.len().saturating_sub(STDERR_TAIL_BYTES);
        String::from_utf8_lossy(&buf[start..]).trim().to_string()
    });
    let Some(stdout) = child.stdout.take() else {
        return Err(BackendError::Failed("the program has no stdout".into()));
    };
    let mut lines = BufReader::new(stdout).lines();
    let deadline = tokio::time::sleep(Duration::from_secs(cfg.timeout_secs));
    tokio::pin!(deadline);
    let mut held: Option<String> = None;
    let mut chunks = 0usize;
    let ending = loop {
        let line = tokio::select! {
            line = lines.next_line() => line,
            _ = cancel.cancelled() => break Ending::Canceled,
            _ = &mut deadline => break Ending::TimedOut,
        };
        let Ok(Some(line)) = line else {
            break Ending::Eof;
        };
        match cfg.io {
            CommandIo::Text => {
                // One line behind, so the last chunk can say it is the last.
                if let Some(prev) = held.replace(line) {
                    let part = Part::text(format!("{prev}\n"));
                    events
                        .artifact(artifact("output", part), chunks > 0, false)
                        .await?;
                    chunks += 1;
                }
            }
            CommandIo::Jsonl => {
                if jsonl_event(&mut events, &line).await? {
                    break Ending::Reported;
                }
            }
        }
    };
    let grace = Duration::from_millis(cfg.kill_grace_ms);
    match ending {
        Ending::Canceled => {
            stop(&mut child, grace).await;
            return Ok(());
        }
        Ending::TimedOut => {
            stop(&mut child, grace).await;
            let msg = format!(
                "the agent's program did not finish within {} s",
                cfg.timeout_secs
            );
            events
                .status(TaskState::Failed, Some(Message::agent_text(msg)))
                .await?;
            return Ok(());
        }
        Ending::Reported => {
            stop(&mut child, grace).await;
            return Ok(());
        }
        Ending::Eof => {}
    }
    if let Some(last) = held {
        let part = Part::text(format!("{last}\n"));
        events
            .artifact(artifact("output", part), chunks > 0, true)
            .await?;
    }
    let status = tokio::select! {
        s = child.wait() => s,
        _ = cancel.cancelled() => {
            stop(&mut child, grace).await;
            return Ok(());
        }
    };
    let stderr_tail = tail.await.unwrap_or_default();
    match status {
        Ok(s) if s.success() => {
            events.status(TaskState::Completed, None).await?;
        }
        Ok(s) => {
            let code = s
                .code()
                .map_or("a signal".to_string(), |c| format!("exit status {c}"));
            let msg = if stderr_tail.is_empty() {
                format!("the agent's program failed with {code}")
            } else {
                format!("the agent's program failed with {code}: {stderr_tail}")
            };
            events
                .status(TaskState::Failed, Some(Message::agent_text(msg)))
                .await?;
        }
        Err(e) => {
            return Err(BackendError::Failed(format!(
                "waiting for the program: {}",
                e.kind()
            )))
        }
    }
    Ok(())
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
}

/// Applies one jsonl event; true when the program reported the end of the task.
async fn jsonl_event(events: &mut EventSink, line: &str) -> Result<bool, BackendError> {
    if line.trim().is_empty() {
        return Ok(false);
    }
    let ev: Event = serde_json::from_str(line).map_err(|e| {
        BackendError::Failed(format!("the agent's program wrote an invalid event: {e}"))
    })?;
    if let Some(text) = ev.error {
        events
            .status(TaskState::Failed, Some(Message::agent_text(text)))
            .await?;
        return Ok(true);
    }
    if let Some(question) = ev.input_required {
        events
            .status(
                TaskState::InputRequired,
                Some(Message::agent_text(question)),
            )
            .await?;
        return Ok(true);
    }
    if let Some(text) = ev.result {
        events
            .artifact(artifact("result", Part::text(text)), false, true)
            .await?;
        events.status(TaskState::Completed, None).await?;
        return Ok(true);
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
        let part = Part {
            content,
            metadata: None,
            filename: None,
            media_type: None,
        };
        let id = ev.name.as_deref().unwrap_or("output");
        events
            .artifact(artifact(id, part), ev.append, ev.last_chunk)
            .await?;
        return Ok(false);
    }
    if let Some(state) = ev.status {
        let state = TaskState::parse_lenient(&state)
            .filter(|s| !s.ends_stream())
            .ok_or_else(|| BackendError::Failed(format!("unknown or final status \"{state}\" in an event; use result/error/inputRequired")))?;
        events
            .status(state, ev.message.map(Message::agent_text))
            .await?;
    }
    Ok(false)
}

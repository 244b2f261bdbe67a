//! The `command` backend: a local program as an A2A agent, one process per task.
//!
//! `io = "text"`: the message text goes to stdin, which is then closed; each stdout line is
//! streamed as an artifact chunk; exit 0 completes the task, anything else fails it with the
//! tail of stderr. `io = "jsonl"`: the message goes to stdin as one JSON line (A2A 1.0
//! shape) and stdin stays open for the task's later messages, so a program reads it a line
//! at a time, not to its end; each stdout line is one event:
//!
//! ```text
//! {"status": "working", "message": "optional text"}
//! {"artifact": {"text": "..."} | {"data": {...}}, "name": "out", "append": false, "lastChunk": true}
//! {"inputRequired": "question"}        the task waits for input, and so does the process
//! {"result": "text"}                   completes the task with this text as an artifact
//! {"error": "text"}                    fails the task
//! ```
//!
//! After `inputRequired` the call returns but the process lives on, parked by task id: the
//! task's next message is written to its stdin as one more JSON line and its events are read
//! as before (it may ask again). Waiting for an answer is not running: a parked process
//! gives its `max_concurrent` slot back, and the answer takes a slot again before it is
//! written, so new tasks (in the same context too) never wait on a parked process. At most
//! `max_waiting` processes wait at once: parking one more stops the one that has waited
//! longest and fails its task. An agent thus has at most `max_concurrent + max_waiting`
//! processes, besides those it is stopping. `timeout_secs` bounds a process's whole life,
//! waiting for input (or for a slot) included: a parked process that runs out of time is
//! stopped and its task failed. Canceling the task stops a parked process too. A parked
//! process is stopped by closing its stdin first, so that a program can exit on its own at
//! EOF; SIGTERM follows if it has not within the grace period.
//!
//! The program is started anew with the answer alone when the answer cannot reach the
//! process that asked: none is parked (it exited after asking, or the gateway restarted),
//! it has exited by the time the answer is to be written, its stdin is closed (EPIPE), or
//! it ends with the answer still unread in its stdin. So programs that ask and exit keep
//! working, and a program that read the answer is never run a second time for it: ending
//! without a result then is like any run ending so (exit 0 completes the task).
//!
//! Processes run in their own process group with only PATH, HOME, LANG and the configured
//! `env`. Cancel and timeout send SIGTERM to the group, then SIGKILL after the grace
//! period; a process is killed if its task is dropped (gateway shutdown), and reaped. A
//! gateway killed outright takes its programs with it (the parent-death signal).

mod jsonl;
mod parked;
mod process;

use jsonl::{artifact, jsonl_event, Step};
use parked::Parked;
use process::{reap_group_later, start, stop, take_back_unread, Proc};

use std::io::ErrorKind;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::Semaphore;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;

use super::{AgentBackend, BackendError, EventSink, Execution};
use crate::config::{CommandConfig, CommandIo};
use crate::protocol::model::{Message, Part, TaskState};

/// How long a finished program's stderr is read for what it still holds; a descendant
/// that keeps the pipe open is not waited for.
const STDERR_AFTER_EXIT: Duration = Duration::from_millis(200);

pub(crate) struct CommandBackend {
    config: Arc<CommandConfig>,
    /// Running processes, `max_concurrent` of them; a parked process holds none.
    slots: Arc<Semaphore>,
    parked: Arc<Parked>,
    /// Calls waiting for a free slot.
    waiting: Arc<AtomicUsize>,
}

impl CommandBackend {
    pub(crate) fn new(config: CommandConfig) -> CommandBackend {
        CommandBackend {
            slots: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
            parked: Arc::new(Parked::new(config.max_waiting)),
            waiting: Arc::default(),
            config: Arc::new(config),
        }
    }
}

impl AgentBackend for CommandBackend {
    fn execute(&self, exec: Execution) -> BoxFuture<'static, Result<(), BackendError>> {
        // The run's span, when spans are exported: from the wait for a slot to the end.
        let span = crate::telemetry::child_span(
            "command",
            opentelemetry::trace::SpanKind::Internal,
            vec![
                opentelemetry::KeyValue::new(
                    "process.executable.name",
                    self.config.command.first().cloned().unwrap_or_default(),
                ),
                opentelemetry::KeyValue::new("a2a.task.id", exec.events.task_id().to_string()),
            ],
        );
        let run = run(
            self.config.clone(),
            self.slots.clone(),
            self.parked.clone(),
            self.waiting.clone(),
            exec,
        );
        match span {
            None => Box::pin(run),
            Some(mut span) => Box::pin(async move {
                let outcome = run.await;
                if let Err(e) = &outcome {
                    span.fail(e.to_string());
                }
                outcome
            }),
        }
    }

    fn processes(&self) -> Option<(usize, usize)> {
        let max = self.config.max_concurrent.max(1);
        let running = max.saturating_sub(self.slots.available_permits());
        Some((running, self.waiting.load(Ordering::Relaxed)))
    }
}

/// Counts a call waiting for a slot while it is alive.
struct Waiting(Arc<AtomicUsize>);

impl Waiting {
    fn new(count: Arc<AtomicUsize>) -> Waiting {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn run(
    cfg: Arc<CommandConfig>,
    slots: Arc<Semaphore>,
    parked: Arc<Parked>,
    waiting: Arc<AtomicUsize>,
    exec: Execution,
) -> Result<(), BackendError> {
    let Execution {
        message,
        task,
        mut events,
        cancel,
        ..
    } = exec;
    let input = match cfg.io {
        CommandIo::Text => format!("{}\n", message.text()),
        CommandIo::Jsonl => serde_json::to_string(&message)
            .map(|s| s + "\n")
            .map_err(|e| BackendError::Failed(format!("encoding the message: {e}")))?,
    };
    let task_id = events.task_id().to_string();
    if input.len() > cfg.max_input_bytes {
        parked.discard(&task_id);
        let msg = format!(
            "the message is larger than this agent takes ({} bytes, at most {})",
            input.len(),
            cfg.max_input_bytes
        );
        events
            .status(TaskState::Failed, Some(Message::agent_text(msg)))
            .await?;
        return Ok(());
    }
    // A follow-up takes its slot before it claims its parked process: until then the
    // process stays parked, counted in max_waiting and minded by its watcher (deadline,
    // eviction). The watcher no longer sees cancel, though: the follow-up has the task's
    // cancel token now.
    let continuing = task.is_some();
    let ended = if continuing {
        parked.ended(&task_id)
    } else {
        None
    };
    let waiting = Waiting::new(waiting);
    let slot = tokio::select! {
        slot = slots.clone().acquire_owned() => slot.map_err(|_| {
            BackendError::Failed("the agent is shutting down".into())
        })?,
        _ = cancel.cancelled() => {
            parked.discard(&task_id);
            return Ok(());
        }
        // The watcher ended the task (its time ran out, or it made room for another) and
        // said so: nothing is left to run.
        _ = async move {
            match ended {
                Some(ended) => ended.cancelled_owned().await,
                None => std::future::pending::<()>().await,
            }
        } => return Ok(()),
    };
    drop(waiting);
    let mut resumed = if continuing {
        parked.resume(&task_id).await
    } else {
        None
    };
    let mut said_working = false;
    loop {
        let was_resumed = resumed.is_some();
        let proc = match resumed.take() {
            Some(proc) => proc,
            None => start(&cfg)?,
        };
        if !said_working {
            events.status(TaskState::Working, None).await?;
            said_working = true;
        }
        match drive(&cfg, proc, &input, was_resumed, &mut events, &cancel).await? {
            Outcome::Finished => return Ok(()),
            Outcome::Waiting(proc) => {
                // Waiting for an answer is not running: the slot goes back at once, or
                // parked processes would starve (or, in one context, deadlock) new work.
                drop(slot);
                parked.park(proc, events, cancel, &cfg);
                return Ok(());
            }
            // Its slot (still this run's) goes to the process started in its place.
            Outcome::Gone => {}
        }
    }
}

/// How reading a process's output ended, before the exit status is known.
enum Ending {
    Eof,
    Canceled,
    TimedOut,
    /// The program reported the outcome itself (jsonl).
    Reported,
    /// The program asked for input (jsonl).
    Asked,
    /// A resumed program closed its stdin before the message reached it.
    StdinClosed,
    /// The program wrote more than `max_output_bytes`.
    TooMuchOutput,
}

/// What became of a process after one message's run.
enum Outcome {
    Finished,
    /// It asked for input and waits for the task's next message.
    Waiting(Box<Proc>),
    /// A resumed process that the message never reached: it had exited or closed its
    /// stdin, or ended leaving the message unread. It is gone (stopped and reaped).
    Gone,
}

async fn write_input(
    stdin: &mut Option<ChildStdin>,
    input: &str,
    io: CommandIo,
) -> std::io::Result<()> {
    let written = match stdin.as_mut() {
        Some(s) => s.write_all(input.as_bytes()).await,
        None => Ok(()),
    };
    if io == CommandIo::Text {
        // Text programs may read to the end of their input.
        *stdin = None;
    }
    written
}

/// Gives the process `input` and turns its output into task events until it ends, reports
/// an outcome or asks for input.
async fn drive(
    cfg: &CommandConfig,
    mut proc: Box<Proc>,
    input: &str,
    resumed: bool,
    events: &mut EventSink,
    cancel: &CancellationToken,
) -> Result<Outcome, BackendError> {
    let deadline = proc.deadline;
    let grace = Duration::from_millis(cfg.kill_grace_ms);
    // It exited after asking, before the message came: it cannot take it.
    if resumed && matches!(proc.child.try_wait(), Ok(Some(_))) {
        return Ok(Outcome::Gone);
    }
    // Written while the output is read: a program that writes as it reads (`cat`) would
    // otherwise block on a full stdout pipe while the gateway blocks on its full stdin.
    let mut stdin = proc.stdin.take();
    let mut held: Option<String> = None;
    let mut chunks = 0usize;
    let ending = {
        let write = write_input(&mut stdin, input, cfg.io);
        tokio::pin!(write);
        let mut writing = true;
        let mut exited = false;
        loop {
            let line = tokio::select! {
                // A program that exits while what it started holds its stdout open: those
                // are stopped after the grace, which ends the output.
                _ = proc.child.wait(), if !exited => {
                    exited = true;
                    reap_group_later(proc.group, grace);
                    continue;
                }
                written = &mut write, if writing => {
                    writing = false;
                    match written {
                        // Nobody reads its stdin any more: it is exiting, or closed it
                        // after asking.
                        Err(e) if resumed && e.kind() == ErrorKind::BrokenPipe => {
                            break Ending::StdinClosed
                        }
                        // A program that does not read its input is its own business.
                        _ => continue,
                    }
                }
                line = proc.lines.next_line() => line,
                _ = cancel.cancelled() => break Ending::Canceled,
                _ = sleep_until(deadline) => break Ending::TimedOut,
            };
            let Ok(Some(line)) = line else {
                break Ending::Eof;
            };
            proc.output += line.len() + 1;
            if proc.output > cfg.max_output_bytes {
                break Ending::TooMuchOutput;
            }
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
                CommandIo::Jsonl => match jsonl_event(events, &line).await? {
                    Step::More => {}
                    Step::Reported => break Ending::Reported,
                    Step::Asked => break Ending::Asked,
                },
            }
        }
    };
    proc.stdin = stdin;
    match ending {
        Ending::Canceled | Ending::Reported => {
            stop(&mut proc.child, grace).await;
            return Ok(Outcome::Finished);
        }
        Ending::TimedOut => {
            stop(&mut proc.child, grace).await;
            timed_out(events, cfg.timeout_secs, "").await?;
            return Ok(Outcome::Finished);
        }
        Ending::Asked => return Ok(Outcome::Waiting(proc)),
        Ending::StdinClosed => {
            stop(&mut proc.child, grace).await;
            return Ok(Outcome::Gone);
        }
        Ending::TooMuchOutput => {
            stop(&mut proc.child, grace).await;
            let msg = format!(
                "the agent's program wrote more than {} bytes and was stopped",
                cfg.max_output_bytes
            );
            events
                .status(TaskState::Failed, Some(Message::agent_text(msg)))
                .await?;
            return Ok(Outcome::Finished);
        }
        Ending::Eof => {}
    }
    // A resumed program that asked and then exited without reading on may have been
    // written to in the instant before it went: the message it never read is still in the
    // pipe, and is taken back so that nothing else reads it either.
    let never_read = resumed
        && proc
            .stdin
            .as_ref()
            .is_some_and(|stdin| take_back_unread(stdin, input));
    // It will say nothing more; one still reading its input can now see the end of it.
    proc.stdin = None;
    if let Some(last) = held {
        let part = Part::text(format!("{last}\n"));
        events
            .artifact(artifact("output", part), chunks > 0, true)
            .await?;
    }
    let status = tokio::select! {
        s = proc.child.wait() => s,
        _ = cancel.cancelled() => {
            stop(&mut proc.child, grace).await;
            return Ok(Outcome::Finished);
        }
        _ = sleep_until(deadline) => {
            stop(&mut proc.child, grace).await;
            timed_out(events, cfg.timeout_secs, "").await?;
            return Ok(Outcome::Finished);
        }
    };
    reap_group_later(proc.group, grace);
    if never_read && status.is_ok() {
        return Ok(Outcome::Gone);
    }
    let stderr_tail = tokio::time::timeout(STDERR_AFTER_EXIT, &mut proc.stderr_tail)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
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
                // The log keeps the tail whole; the caller's copy names no server paths.
                tracing::warn!(%code, stderr = %stderr_tail, "an agent's program failed");
                format!(
                    "the agent's program failed with {code}: {}",
                    without_paths(&stderr_tail)
                )
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
    Ok(Outcome::Finished)
}

/// `text` with every absolute path (two components or more) cut to its last one, as
/// `…/name`: a program's error messages tell the caller what failed, not where the
/// gateway keeps its files.
fn without_paths(text: &str) -> std::borrow::Cow<'_, str> {
    static PATH: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r#"(?:/[^/\s'"`:,;()\[\]<>]+){2,}"#).expect("a valid pattern")
    });
    PATH.replace_all(text, |m: &regex::Captures<'_>| {
        let path = &m[0];
        let name = path.rsplit('/').next().unwrap_or_default();
        format!("…/{name}")
    })
}

async fn timed_out(events: &mut EventSink, secs: u64, note: &str) -> Result<(), BackendError> {
    let msg = format!("the agent's program did not finish within {secs} s{note}");
    events
        .status(TaskState::Failed, Some(Message::agent_text(msg)))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::without_paths;

    #[test]
    fn a_callers_copy_of_stderr_names_no_server_paths() {
        let python = "python3: can't open file '/srv/gw/agents.d/scripts/nope.py': [Errno 2] No such file or directory";
        assert_eq!(
            without_paths(python),
            "python3: can't open file '…/nope.py': [Errno 2] No such file or directory"
        );
        let trace =
            "  File \"/usr/lib/python3/x.py\", line 3, in <module>\nValueError: a/b is not 1/2";
        assert_eq!(
            without_paths(trace),
            "  File \"…/x.py\", line 3, in <module>\nValueError: a/b is not 1/2"
        );
        assert_eq!(without_paths("boom happened"), "boom happened");
    }
}

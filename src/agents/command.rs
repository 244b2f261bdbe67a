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
//! as before (it may ask again). A parked process keeps its place in `max_concurrent`.
//! `timeout_secs` bounds a process's whole life, waiting for input included: a parked
//! process that runs out of time is stopped and its task failed. Canceling the task stops a
//! parked process too. When the next message finds no parked process (it exited after
//! asking, or the gateway restarted), the program is started anew with that message alone,
//! so programs that ask and exit keep working; the same happens when a resumed process exits
//! successfully without writing a line, as it had ended before the message reached it.
//!
//! Processes run in their own process group with only PATH, HOME, LANG and the configured
//! `env`. Cancel and timeout send SIGTERM to the group, then SIGKILL after the grace
//! period; a process is killed if its task is dropped (gateway shutdown), and reaped. A
//! gateway killed outright takes its programs with it (the parent-death signal).

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dashmap::DashMap;
use futures_util::future::BoxFuture;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use super::{AgentBackend, BackendError, EventSink, Execution};
use crate::config::{CommandConfig, CommandIo};
use crate::protocol::model::{Artifact, Message, Part, PartContent, TaskState};

/// How much of stderr a failed task reports.
const STDERR_TAIL_BYTES: usize = 2048;

pub struct CommandBackend {
    config: Arc<CommandConfig>,
    slots: Arc<Semaphore>,
    parked: Arc<Parked>,
}

impl CommandBackend {
    pub fn new(config: CommandConfig) -> CommandBackend {
        CommandBackend {
            slots: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
            config: Arc::new(config),
            parked: Arc::default(),
        }
    }
}

impl AgentBackend for CommandBackend {
    fn execute(&self, exec: Execution) -> BoxFuture<'static, Result<(), BackendError>> {
        Box::pin(run(
            self.config.clone(),
            self.slots.clone(),
            self.parked.clone(),
            exec,
        ))
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

#[allow(unsafe_code)] // pre_exec, below; the crate's only unsafe code
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
    // Shutdown kills every process group the gateway started, but a gateway that is itself
    // killed (SIGKILL, OOM, crash) runs no code: the kernel then kills the program for it.
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
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

/// `secs` from now; a timeout too large to represent never fires rather than panicking.
fn deadline_after(secs: u64) -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_secs(secs))
        .unwrap_or_else(|| now + Duration::from_secs(86400 * 365 * 30))
}

/// A live process and everything a run needs to carry on with it. It moves from the run
/// that started it to a watcher while its task waits for input, and on to the next run.
struct Proc {
    child: GroupChild,
    /// Open for as long as the process may be sent another message (jsonl only).
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    stderr_tail: JoinHandle<String>,
    /// A parked process is still a running process, so it keeps its slot.
    slot: OwnedSemaphorePermit,
    /// The end of the process's time, fixed when it starts: waiting for input counts too.
    deadline: Instant,
}

/// A child whose whole process group is killed if it is dropped alive. Only paths that
/// could not stop it gracefully (an error, the runtime going away) drop it alive, and
/// `kill_on_drop` alone would spare the rest of its group.
struct GroupChild(Child);

impl Drop for GroupChild {
    fn drop(&mut self) {
        // No id once reaped, so a recycled pid is never signaled.
        if let Some(pid) = self.0.id() {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

impl std::ops::Deref for GroupChild {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for GroupChild {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

fn start(cfg: &CommandConfig, slot: OwnedSemaphorePermit) -> Result<Box<Proc>, BackendError> {
    let mut child = spawn(cfg).map_err(|e| {
        BackendError::Failed(format!("the agent's program could not start: {}", e.kind()))
    })?;
    let deadline = deadline_after(cfg.timeout_secs);
    let stderr = child.stderr.take();
    let stderr_tail = tokio::spawn(async move {
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
    Ok(Box::new(Proc {
        stdin: child.stdin.take(),
        child: GroupChild(child),
        lines: BufReader::new(stdout).lines(),
        stderr_tail,
        slot,
        deadline,
    }))
}

async fn run(
    cfg: Arc<CommandConfig>,
    slots: Arc<Semaphore>,
    parked: Arc<Parked>,
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
    let mut resumed = match task {
        Some(_) => parked.resume(events.task_id()).await,
        None => None,
    };
    let mut freed_slot = None;
    let mut said_working = false;
    loop {
        let was_resumed = resumed.is_some();
        let proc = match resumed.take() {
            Some(proc) => proc,
            None => {
                let slot = match freed_slot.take() {
                    Some(slot) => slot,
                    None => tokio::select! {
                        slot = slots.clone().acquire_owned() => slot.map_err(|_| {
                            BackendError::Failed("the agent is shutting down".into())
                        })?,
                        _ = cancel.cancelled() => return Ok(()),
                    },
                };
                start(&cfg, slot)?
            }
        };
        if !said_working {
            events.status(TaskState::Working, None).await?;
            said_working = true;
        }
        match drive(&cfg, proc, &input, was_resumed, &mut events, &cancel).await? {
            Outcome::Finished => return Ok(()),
            Outcome::Waiting(proc) => {
                parked.park(proc, events, cancel, &cfg);
                return Ok(());
            }
            Outcome::Gone(slot) => freed_slot = Some(slot),
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
}

/// What became of a process after one message's run.
enum Outcome {
    Finished,
    /// It asked for input and waits for the task's next message.
    Waiting(Box<Proc>),
    /// A resumed process that exited without a word: it had ended after asking, before the
    /// message reached it. Its slot goes to the process started in its place.
    Gone(OwnedSemaphorePermit),
}

async fn write_input(stdin: &mut Option<ChildStdin>, input: &str, io: CommandIo) {
    if let Some(s) = stdin.as_mut() {
        // A program that does not read its input is its own business.
        let _ = s.write_all(input.as_bytes()).await;
    }
    if io == CommandIo::Text {
        // Text programs may read to the end of their input.
        *stdin = None;
    }
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
    // Bounded like the rest of the run: a program that neither reads its input nor stops
    // writing would otherwise stall the write forever.
    let early = tokio::select! {
        _ = write_input(&mut proc.stdin, input, cfg.io) => None,
        _ = cancel.cancelled() => Some(Ending::Canceled),
        _ = sleep_until(deadline) => Some(Ending::TimedOut),
    };
    let mut held: Option<String> = None;
    let mut chunks = 0usize;
    let mut heard = false;
    let ending = match early {
        Some(ending) => ending,
        None => loop {
            let line = tokio::select! {
                line = proc.lines.next_line() => line,
                _ = cancel.cancelled() => break Ending::Canceled,
                _ = sleep_until(deadline) => break Ending::TimedOut,
            };
            let Ok(Some(line)) = line else {
                break Ending::Eof;
            };
            heard = true;
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
        },
    };
    let grace = Duration::from_millis(cfg.kill_grace_ms);
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
        Ending::Eof => {}
    }
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
    let stderr_tail = (&mut proc.stderr_tail).await.unwrap_or_default();
    match status {
        Ok(s) if s.success() && resumed && !heard => return Ok(Outcome::Gone(proc.slot)),
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
    Ok(Outcome::Finished)
}

async fn timed_out(events: &mut EventSink, secs: u64, note: &str) -> Result<(), BackendError> {
    let msg = format!("the agent's program did not finish within {secs} s{note}");
    events
        .status(TaskState::Failed, Some(Message::agent_text(msg)))
        .await?;
    Ok(())
}

/// Processes whose tasks wait for input, by task id. Each is owned by a watcher task; the
/// entry here is the way to ask that watcher for it.
#[derive(Default)]
struct Parked {
    waiting: DashMap<String, Waiting>,
    serial: AtomicU64,
}

struct Waiting {
    /// Tells this parking from a later one of the same task, so that a watcher only ever
    /// removes its own entry.
    serial: u64,
    /// Where to send the channel that the process is to come back on.
    resume: oneshot::Sender<oneshot::Sender<Box<Proc>>>,
}

impl Parked {
    fn park(
        self: &Arc<Self>,
        proc: Box<Proc>,
        events: EventSink,
        cancel: CancellationToken,
        cfg: &CommandConfig,
    ) {
        let task_id = events.task_id().to_string();
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let (resume, asked) = oneshot::channel();
        self.waiting
            .insert(task_id.clone(), Waiting { serial, resume });
        let watch = Watch {
            parked: Arc::downgrade(self),
            task_id,
            serial,
            events,
            cancel,
            grace: Duration::from_millis(cfg.kill_grace_ms),
            timeout_secs: cfg.timeout_secs,
        };
        tokio::spawn(watch.run(proc, asked));
    }

    /// The task's parked process, if it is still there to be had.
    async fn resume(&self, task_id: &str) -> Option<Box<Proc>> {
        // Removing the entry is what claims the process: only one caller can, and the
        // watcher either hands the process over or, having stopped it, drops the request.
        let (_, waiting) = self.waiting.remove(task_id)?;
        let (back, comes_back) = oneshot::channel();
        waiting.resume.send(back).ok()?;
        comes_back.await.ok()
    }
}

/// Looks after a parked process until its task's next message claims it, or stops it.
struct Watch {
    /// Weak, so that the backend going away drops every entry and with it every request
    /// channel, which tells the watchers to stop their processes.
    parked: Weak<Parked>,
    task_id: String,
    serial: u64,
    /// The parked run's sink, to fail the task if its time runs out while it waits.
    events: EventSink,
    /// The parked run's token: CancelTask on the waiting task fires it.
    cancel: CancellationToken,
    grace: Duration,
    timeout_secs: u64,
}

enum Wake {
    Resume(oneshot::Sender<Box<Proc>>),
    Canceled,
    TimedOut,
    Exited,
    Abandoned,
}

impl Watch {
    async fn run(
        self,
        mut proc: Box<Proc>,
        mut asked: oneshot::Receiver<oneshot::Sender<Box<Proc>>>,
    ) {
        let deadline = proc.deadline;
        let wake = tokio::select! {
            r = &mut asked => r.map_or(Wake::Abandoned, Wake::Resume),
            _ = self.cancel.cancelled() => Wake::Canceled,
            _ = sleep_until(deadline) => Wake::TimedOut,
            _ = proc.child.wait() => Wake::Exited,
        };
        // A request that arrives from now on goes unanswered, and its run starts anew.
        drop(asked);
        let wake = match wake {
            // Exited in the same instant: starting anew serves the message better than a
            // process that cannot read it.
            Wake::Resume(_) if matches!(proc.child.try_wait(), Ok(Some(_))) => Wake::Exited,
            Wake::Resume(back) => {
                if let Err(mut proc) = back.send(proc) {
                    // The run that asked is gone (its caller's work was dropped).
                    stop(&mut proc.child, self.grace).await;
                }
                return;
            }
            other => other,
        };
        if let Some(parked) = self.parked.upgrade() {
            parked
                .waiting
                .remove_if(&self.task_id, |_, w| w.serial == self.serial);
        }
        stop(&mut proc.child, self.grace).await;
        drop(proc);
        if let Wake::TimedOut = wake {
            let mut events = self.events;
            let _ = timed_out(
                &mut events,
                self.timeout_secs,
                " (it was waiting for input)",
            )
            .await;
        }
    }
}

/// What one jsonl event meant for the run.
enum Step {
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
}

/// Applies one jsonl event.
async fn jsonl_event(events: &mut EventSink, line: &str) -> Result<Step, BackendError> {
    if line.trim().is_empty() {
        return Ok(Step::More);
    }
    let ev: Event = serde_json::from_str(line).map_err(|e| {
        BackendError::Failed(format!("the agent's program wrote an invalid event: {e}"))
    })?;
    if let Some(text) = ev.error {
        events
            .status(TaskState::Failed, Some(Message::agent_text(text)))
            .await?;
        return Ok(Step::Reported);
    }
    if let Some(question) = ev.input_required {
        events
            .status(
                TaskState::InputRequired,
                Some(Message::agent_text(question)),
            )
            .await?;
        return Ok(Step::Asked);
    }
    if let Some(text) = ev.result {
        events
            .artifact(artifact("result", Part::text(text)), false, true)
            .await?;
        events.status(TaskState::Completed, None).await?;
        return Ok(Step::Reported);
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
        return Ok(Step::More);
    }
    if let Some(state) = ev.status {
        let state = TaskState::parse_lenient(&state)
            .filter(|s| !s.ends_stream())
            .ok_or_else(|| BackendError::Failed(format!("unknown or final status \"{state}\" in an event; use result/error/inputRequired")))?;
        events
            .status(state, ev.message.map(Message::agent_text))
            .await?;
    }
    Ok(Step::More)
}

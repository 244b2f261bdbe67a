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

use std::collections::HashMap;
use std::io::ErrorKind;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines, Take};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use super::{AgentBackend, BackendError, EventSink, Execution};
use crate::config::{CommandConfig, CommandIo};
use crate::protocol::model::{Artifact, Message, Part, PartContent, TaskState};

/// How much of stderr a failed task reports.
const STDERR_TAIL_BYTES: usize = 2048;
/// How much of stderr is read at a time; with the tail, all that is ever held of it.
const STDERR_CHUNK_BYTES: usize = 8192;
/// How long a finished program's stderr is read for what it still holds; a descendant
/// that keeps the pipe open is not waited for.
const STDERR_AFTER_EXIT: Duration = Duration::from_millis(200);

pub struct CommandBackend {
    config: Arc<CommandConfig>,
    /// Running processes, `max_concurrent` of them; a parked process holds none.
    slots: Arc<Semaphore>,
    parked: Arc<Parked>,
}

impl CommandBackend {
    pub fn new(config: CommandConfig) -> CommandBackend {
        CommandBackend {
            slots: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
            parked: Arc::new(Parked::new(config.max_waiting)),
            config: Arc::new(config),
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

/// Closes the process's stdin so that a program waiting for its next message can exit on
/// its own at EOF, and [`stop`]s it if it has not within `grace`.
async fn close_and_stop(proc: &mut Proc, grace: Duration) {
    proc.stdin = None;
    if !matches!(
        tokio::time::timeout(grace, proc.child.wait()).await,
        Ok(Ok(_))
    ) {
        stop(&mut proc.child, grace).await;
    }
}

/// `secs` from now; a timeout too large to represent never fires rather than panicking.
fn deadline_after(secs: u64) -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_secs(secs))
        .unwrap_or_else(|| now + Duration::from_secs(86400 * 365 * 30))
}

/// A live process and everything a run needs to carry on with it. It moves from the run
/// that started it to a watcher while its task waits for input, and on to the next run.
/// Its running slot is the run's, not its own: a parked process must not hold one.
struct Proc {
    child: GroupChild,
    /// Open for as long as the process may be sent another message (jsonl only).
    stdin: Option<ChildStdin>,
    /// Capped at `max_output_bytes` (plus one byte, to tell the cap from a clean end).
    lines: Lines<BufReader<Take<ChildStdout>>>,
    /// Bytes of output read so far, against `max_output_bytes`.
    output: usize,
    /// The process group the program leads, to stop what it leaves behind.
    group: Option<i32>,
    stderr_tail: JoinHandle<String>,
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

fn start(cfg: &CommandConfig) -> Result<Box<Proc>, BackendError> {
    // The caller learns that it failed, not where the program lives or what the OS said.
    let mut child = spawn(cfg).map_err(|e| {
        tracing::error!(program = ?cfg.command, cwd = ?cfg.cwd, error = %e, "an agent's program could not start");
        BackendError::Unavailable("its program could not start".into())
    })?;
    let deadline = deadline_after(cfg.timeout_secs);
    let stderr = child.stderr.take();
    // Drained for the process's whole life, which may span many messages, so only the tail
    // that a failure reports is kept; draining also keeps a chatty program from blocking
    // on a full pipe.
    let stderr_tail = tokio::spawn(async move {
        let mut tail = Vec::with_capacity(STDERR_TAIL_BYTES + STDERR_CHUNK_BYTES);
        let mut cut = false;
        if let Some(mut s) = stderr {
            let mut chunk = vec![0; STDERR_CHUNK_BYTES];
            loop {
                match s.read(&mut chunk).await {
                    Ok(0) => break,
                    Ok(n) => {
                        tail.extend_from_slice(&chunk[..n]);
                        let excess = tail.len().saturating_sub(STDERR_TAIL_BYTES);
                        if excess > 0 {
                            tail.drain(..excess);
                            cut = true;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        }
        tail_text(&tail, cut)
    });
    let Some(stdout) = child.stdout.take() else {
        return Err(BackendError::Failed("the program has no stdout".into()));
    };
    let cap = u64::try_from(cfg.max_output_bytes).unwrap_or(u64::MAX);
    let group = child.id().and_then(|p| i32::try_from(p).ok());
    Ok(Box::new(Proc {
        group,
        stdin: child.stdin.take(),
        child: GroupChild(child),
        lines: BufReader::new(stdout.take(cap.saturating_add(1))).lines(),
        output: 0,
        stderr_tail,
        deadline,
    }))
}

/// The kept end of stderr as text. A `cut` tail may begin inside a character, whose
/// leftover bytes would show as a replacement character: they are dropped.
fn tail_text(tail: &[u8], cut: bool) -> String {
    let start = if cut {
        tail.iter()
            .take(3)
            .take_while(|b| (**b & 0xC0) == 0x80)
            .count()
    } else {
        0
    };
    String::from_utf8_lossy(&tail[start..]).trim().to_string()
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

/// Takes `input` back out of the process's stdin pipe if all of it is still there, unread:
/// then the program never saw any of it. The pipe is opened again for reading through
/// /proc; a pipe's bytes go to one reader only, so a program still running cannot also
/// read what is taken back (it is called once the program's stdout has ended, when it is
/// as good as gone). Anything else, /proc not being there included, counts as read: the
/// safe side, as a message that was read must not be run twice.
fn take_back_unread(stdin: &ChildStdin, input: &str) -> bool {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;

    let path = format!("/proc/self/fd/{}", stdin.as_raw_fd());
    // Non-blocking: reading what is there must not wait for more.
    let Ok(mut pipe) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    let mut back = vec![0; input.len()];
    let mut got = 0;
    while got < back.len() {
        match pipe.read(&mut back[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    got == back.len() && back == input.as_bytes()
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

/// What a program that has exited left running (its process group) is killed after
/// `grace`, and nothing waits for it: a descendant holding the program's stdout or stderr
/// would otherwise hold its task until the timeout.
fn reap_group_later(group: Option<i32>, grace: Duration) {
    if let Some(group) = group {
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
        });
    }
}

async fn timed_out(events: &mut EventSink, secs: u64, note: &str) -> Result<(), BackendError> {
    let msg = format!("the agent's program did not finish within {secs} s{note}");
    events
        .status(TaskState::Failed, Some(Message::agent_text(msg)))
        .await?;
    Ok(())
}

/// Processes whose tasks wait for input, by task id, at most `max_waiting` of them. Each is
/// owned by a watcher task; the entry here is the way to ask that watcher for it.
struct Parked {
    max_waiting: usize,
    /// A plain mutex, held for no await: checking the count, making room and adding an
    /// entry must be one step, or two tasks parking at once could both take the last place.
    list: Mutex<Waitlist>,
}

#[derive(Default)]
struct Waitlist {
    by_task: HashMap<String, Waiting>,
    /// Parking order: the smallest serial has waited longest.
    next_serial: u64,
}

struct Waiting {
    /// Tells this parking from a later one of the same task, so that a watcher only ever
    /// removes its own entry; and orders parkings, oldest first.
    serial: u64,
    /// What the watcher is to do with the process.
    claim: oneshot::Sender<Claim>,
    /// Fired by the watcher once it has ended the task itself, for a follow-up waiting for
    /// a slot to stop waiting.
    ended: CancellationToken,
}

enum Claim {
    /// Hand the process over on this channel.
    Resume(oneshot::Sender<Box<Proc>>),
    /// Too many wait: stop the process and fail its task.
    Evict,
    /// Stop the process; its task is taken care of (canceled).
    Stop,
}

impl Parked {
    fn new(max_waiting: usize) -> Parked {
        Parked {
            max_waiting: max_waiting.max(1),
            list: Mutex::default(),
        }
    }

    fn list(&self) -> MutexGuard<'_, Waitlist> {
        // Nothing here panics while holding the lock; if something did, the map is still
        // whole, and refusing every later task would be worse.
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn park(
        self: &Arc<Self>,
        proc: Box<Proc>,
        events: EventSink,
        cancel: CancellationToken,
        cfg: &CommandConfig,
    ) {
        let task_id = events.task_id().to_string();
        let (claim, claims) = oneshot::channel();
        let ended = CancellationToken::new();
        let (serial, evicted) = {
            let mut list = self.list();
            let serial = list.next_serial;
            list.next_serial += 1;
            let mut evicted = Vec::new();
            while list.by_task.len() >= self.max_waiting {
                let oldest = list
                    .by_task
                    .iter()
                    .min_by_key(|(_, w)| w.serial)
                    .map(|(id, _)| id.clone());
                match oldest.and_then(|id| list.by_task.remove(&id)) {
                    Some(w) => evicted.push(w),
                    None => break,
                }
            }
            let waiting = Waiting {
                serial,
                claim,
                ended: ended.clone(),
            };
            // A task is parked at most once at a time (its process is claimed before its
            // next run), so nothing is replaced; were something, dropping it would still
            // have its watcher stop its process.
            list.by_task.insert(task_id.clone(), waiting);
            (serial, evicted)
        };
        for w in evicted {
            // A watcher that has just woken for another reason no longer listens, and
            // ends its process anyway.
            let _ = w.claim.send(Claim::Evict);
        }
        let watch = Watch {
            parked: Arc::downgrade(self),
            task_id,
            serial,
            events,
            cancel,
            ended,
            grace: Duration::from_millis(cfg.kill_grace_ms),
            timeout_secs: cfg.timeout_secs,
            max_waiting: self.max_waiting,
        };
        tokio::spawn(watch.run(proc, claims));
    }

    /// Fires once the watcher of the task's parked process has ended the task itself.
    fn ended(&self, task_id: &str) -> Option<CancellationToken> {
        self.list().by_task.get(task_id).map(|w| w.ended.clone())
    }

    /// Removing the entry is what claims the process: only one caller can.
    fn take(&self, task_id: &str) -> Option<Waiting> {
        self.list().by_task.remove(task_id)
    }

    /// The task's parked process, if it is still there to be had.
    async fn resume(&self, task_id: &str) -> Option<Box<Proc>> {
        // The watcher either hands the process over or, having stopped it, drops the
        // request.
        let waiting = self.take(task_id)?;
        let (back, comes_back) = oneshot::channel();
        waiting.claim.send(Claim::Resume(back)).ok()?;
        comes_back.await.ok()
    }

    /// Has the task's parked process, if any, stopped.
    fn discard(&self, task_id: &str) {
        if let Some(waiting) = self.take(task_id) {
            let _ = waiting.claim.send(Claim::Stop);
        }
    }

    /// Removes a watcher's own entry, not a later parking of the same task.
    fn forget(&self, task_id: &str, serial: u64) {
        let mut list = self.list();
        if list
            .by_task
            .get(task_id)
            .is_some_and(|w| w.serial == serial)
        {
            list.by_task.remove(task_id);
        }
    }
}

/// Looks after a parked process until its task's next message claims it, or stops it.
struct Watch {
    /// Weak, so that the backend going away drops every entry and with it every claim
    /// channel, which tells the watchers to stop their processes.
    parked: Weak<Parked>,
    task_id: String,
    serial: u64,
    /// The parked run's sink, to fail the task if its time runs out while it waits.
    events: EventSink,
    /// The parked run's token: CancelTask on the waiting task fires it.
    cancel: CancellationToken,
    ended: CancellationToken,
    grace: Duration,
    timeout_secs: u64,
    max_waiting: usize,
}

enum Wake {
    Resume(oneshot::Sender<Box<Proc>>),
    Evicted,
    Stop,
    Canceled,
    TimedOut,
    Exited,
    Abandoned,
}

impl Watch {
    async fn run(self, mut proc: Box<Proc>, mut claims: oneshot::Receiver<Claim>) {
        let deadline = proc.deadline;
        let wake = tokio::select! {
            c = &mut claims => match c {
                Ok(Claim::Resume(back)) => Wake::Resume(back),
                Ok(Claim::Evict) => Wake::Evicted,
                Ok(Claim::Stop) => Wake::Stop,
                Err(_) => Wake::Abandoned,
            },
            _ = self.cancel.cancelled() => Wake::Canceled,
            _ = sleep_until(deadline) => Wake::TimedOut,
            _ = proc.child.wait() => Wake::Exited,
        };
        // A claim that arrives from now on goes unanswered: a resumed run starts anew.
        drop(claims);
        if let Wake::Resume(back) = wake {
            // Even one that exited in the meantime: the run finds that out and starts anew.
            if let Err(mut proc) = back.send(proc) {
                // The run that asked is gone (its caller's work was dropped).
                close_and_stop(&mut proc, self.grace).await;
            }
            return;
        }
        if let Some(parked) = self.parked.upgrade() {
            parked.forget(&self.task_id, self.serial);
        }
        let mut events = self.events;
        // The task is failed before the process is stopped, which may take two grace
        // periods, so that its caller hears at once.
        let _ = match wake {
            Wake::TimedOut => {
                timed_out(
                    &mut events,
                    self.timeout_secs,
                    " (it was waiting for input)",
                )
                .await
            }
            Wake::Evicted => {
                let msg = format!(
                    "stopped waiting for input: too many tasks of this agent are waiting \
                     (max_waiting = {})",
                    self.max_waiting
                );
                events
                    .status(TaskState::Failed, Some(Message::agent_text(msg)))
                    .await
                    .map_err(BackendError::from)
            }
            _ => Ok(()),
        };
        // A process that exited by itself leaves its task to the next message, which
        // starts the program anew; every other ending is final for the task.
        if !matches!(wake, Wake::Exited) {
            self.ended.cancel();
        }
        close_and_stop(&mut proc, self.grace).await;
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

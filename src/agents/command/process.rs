//! A program's process: started in its own process group with a clean environment, its
//! stderr drained into a bounded tail, stopped (SIGTERM to the group, SIGKILL after a grace)
//! and reaped, and whatever it leaves behind killed.

use std::io::ErrorKind;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines, Take};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::agents::BackendError;
use crate::config::CommandConfig;

/// How much of stderr a failed task reports.
pub(super) const STDERR_TAIL_BYTES: usize = 2048;
/// How much of stderr is read at a time; with the tail, all that is ever held of it.
pub(super) const STDERR_CHUNK_BYTES: usize = 8192;

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
pub(super) async fn stop(child: &mut Child, grace: Duration) {
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
pub(super) async fn close_and_stop(proc: &mut Proc, grace: Duration) {
    proc.stdin = None;
    if !matches!(
        tokio::time::timeout(grace, proc.child.wait()).await,
        Ok(Ok(_))
    ) {
        stop(&mut proc.child, grace).await;
    }
}

/// `secs` from now; a timeout too large to represent never fires rather than panicking.
pub(super) fn deadline_after(secs: u64) -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_secs(secs))
        .unwrap_or_else(|| now + Duration::from_secs(86400 * 365 * 30))
}

/// A live process and everything a run needs to carry on with it. It moves from the run
/// that started it to a watcher while its task waits for input, and on to the next run.
/// Its running slot is the run's, not its own: a parked process must not hold one.
pub(super) struct Proc {
    pub(super) child: GroupChild,
    /// Open for as long as the process may be sent another message (jsonl only).
    pub(super) stdin: Option<ChildStdin>,
    /// Capped at `max_output_bytes` (plus one byte, to tell the cap from a clean end).
    pub(super) lines: Lines<BufReader<Take<ChildStdout>>>,
    /// Bytes of output read so far, against `max_output_bytes`.
    pub(super) output: usize,
    /// The process group the program leads, to stop what it leaves behind.
    pub(super) group: Option<i32>,
    pub(super) stderr_tail: JoinHandle<String>,
    /// The end of the process's time, fixed when it starts: waiting for input counts too.
    pub(super) deadline: Instant,
}

/// A child whose whole process group is killed if it is dropped alive. Only paths that
/// could not stop it gracefully (an error, the runtime going away) drop it alive, and
/// `kill_on_drop` alone would spare the rest of its group.
pub(super) struct GroupChild(Child);

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

pub(super) fn start(cfg: &CommandConfig) -> Result<Box<Proc>, BackendError> {
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
pub(super) fn tail_text(tail: &[u8], cut: bool) -> String {
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

/// Takes `input` back out of the process's stdin pipe if all of it is still there, unread:
/// then the program never saw any of it. The pipe is opened again for reading through
/// /proc; a pipe's bytes go to one reader only, so a program still running cannot also
/// read what is taken back (it is called once the program's stdout has ended, when it is
/// as good as gone). Anything else, /proc not being there included, counts as read: the
/// safe side, as a message that was read must not be run twice.
pub(super) fn take_back_unread(stdin: &ChildStdin, input: &str) -> bool {
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

/// What a program that has exited left running (its process group) is killed after
/// `grace`, and nothing waits for it: a descendant holding the program's stdout or stderr
/// would otherwise hold its task until the timeout.
pub(super) fn reap_group_later(group: Option<i32>, grace: Duration) {
    if let Some(group) = group {
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(script: &str) -> CommandConfig {
        toml::from_str(&format!(
            "command = [\"/bin/sh\", \"-c\", {}]",
            toml::Value::String(script.into())
        ))
        .unwrap()
    }

    /// Live (not zombie) processes in process group `group`, from /proc.
    fn live_in_group(group: i32) -> usize {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
            .filter(|stat| {
                // pid (comm) state ppid pgrp ...; comm may hold spaces, so split after ')'.
                let Some((_, rest)) = stat.rsplit_once(')') else {
                    return false;
                };
                let fields: Vec<&str> = rest.split_whitespace().collect();
                fields.len() > 3 && fields[0] != "Z" && fields[2] == group.to_string()
            })
            .count()
    }

    async fn gone(group: i32) -> bool {
        for _ in 0..50 {
            if live_in_group(group) == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    #[tokio::test]
    async fn stopping_a_program_stops_what_it_started() {
        let mut proc = start(&config("sleep 30 & echo started; wait")).unwrap();
        assert_eq!(
            proc.lines.next_line().await.unwrap().as_deref(),
            Some("started")
        );
        let group = proc.group.unwrap();
        assert_eq!(live_in_group(group), 2, "the shell and its sleep");
        stop(&mut proc.child, Duration::from_millis(500)).await;
        assert!(gone(group).await, "{} left", live_in_group(group));
    }

    #[tokio::test]
    async fn a_process_dropped_alive_takes_its_group_with_it() {
        let mut proc = start(&config("sleep 30 & echo started; wait")).unwrap();
        proc.lines.next_line().await.unwrap();
        let group = proc.group.unwrap();
        drop(proc);
        assert!(gone(group).await, "{} left", live_in_group(group));
    }

    #[tokio::test]
    async fn stderr_is_kept_as_its_tail() {
        let script =
            "i=0; while [ $i -lt 500 ]; do echo \"line $i of stderr\" >&2; i=$((i+1)); done";
        let mut proc = start(&config(script)).unwrap();
        proc.child.wait().await.unwrap();
        let tail = (&mut proc.stderr_tail).await.unwrap();
        assert!(tail.len() <= STDERR_TAIL_BYTES, "{}", tail.len());
        assert!(tail.ends_with("line 499 of stderr"), "{tail}");
        assert!(!tail.contains("line 0 of"), "only the end is kept");
    }

    #[test]
    fn a_cut_tail_drops_a_partial_character() {
        let text = "é and more";
        let cut = &text.as_bytes()[1..];
        assert_eq!(tail_text(cut, true), "and more");
        assert_eq!(tail_text(text.as_bytes(), false), text);
        // Far-off deadlines are clamped, not a panic.
        assert!(deadline_after(u64::MAX) > Instant::now());
    }
}

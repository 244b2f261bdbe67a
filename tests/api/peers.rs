//! Real upstream agents for the proxy tests: the official SDKs' servers (and, only where
//! no SDK can be made to misbehave, a stdlib fault injector), each on a free port.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::helpers::repo_root;
use crate::interop::{node, python};

/// A running peer process, killed when dropped.
pub struct Peer {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Peer {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `program args.. --port <port> --ready-file F` and waits for the bound port.
async fn start(program: PathBuf, args: &[&str], port: u16) -> Peer {
    let dir = tempfile::tempdir().expect("temp dir");
    let ready = dir.path().join("port");
    let log_path = dir.path().join("log");
    let log = std::fs::File::create(&log_path).expect("peer log");
    let child = Command::new(&program)
        .args(args)
        .args(["--port", &port.to_string(), "--ready-file"])
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
    let mut peer = Peer {
        child,
        port: 0,
        _dir: dir,
    };
    // A minute: LiteLLM's proxy takes 12-18 s to import on two cores.
    for _ in 0..1200 {
        if let Ok(text) = std::fs::read_to_string(&ready) {
            if let Ok(port) = text.trim().parse() {
                peer.port = port;
                return peer;
            }
        }
        if let Ok(Some(status)) = peer.child.try_wait() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!(
                "{} {args:?} exited early: {status}\n{log}",
                program.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} {args:?} did not become ready", program.display());
}

/// The Python SDK echo agent, serving `dialects` ("1.0", "0.3" or "1.0,0.3").
pub async fn python_agent(dialects: &str, port: u16) -> Peer {
    let script = repo_root().join("tests/interop/echo_reference_agent.py");
    start(
        python(),
        &[script.to_str().unwrap(), "--dialects", dialects],
        port,
    )
    .await
}

/// [`python_agent`] on a free port, with more of its options (`--push`).
pub async fn python_agent_with(dialects: &str, extra: &[&str]) -> Peer {
    let script = repo_root().join("tests/interop/echo_reference_agent.py");
    let mut args = vec![script.to_str().unwrap(), "--dialects", dialects];
    args.extend_from_slice(extra);
    start(python(), &args, 0).await
}

/// An agent on the official SDK's last 0.3 release (a2a-sdk 0.3.x), which refuses
/// subscriptions to tasks waiting for input.
pub async fn sdk03_agent() -> Peer {
    sdk03_agent_with(&[]).await
}

/// [`sdk03_agent`] with more of its options (`--grpc`).
pub async fn sdk03_agent_with(extra: &[&str]) -> Peer {
    let script = repo_root().join("tests/interop/sdk03_agent.py");
    let mut args = vec![script.to_str().unwrap()];
    args.extend_from_slice(extra);
    start(crate::interop::sdk03_python(), &args, 0).await
}

/// pydantic-ai's A2A server (fasta2a) in front of a FunctionModel: a third-party upstream.
pub async fn fasta2a_agent() -> Peer {
    let script = repo_root().join("tests/interop/fasta2a_agent.py");
    start(
        crate::interop::thirdparty_python(),
        &[script.to_str().unwrap()],
        0,
    )
    .await
}

/// LiteLLM's proxy with mock models (`mock-gpt`, `mock-gpt-slow`), keyed `master_key`.
pub async fn litellm_proxy(master_key: &str) -> Peer {
    let script = repo_root().join("tests/interop/litellm_proxy.py");
    let args = [script.to_str().unwrap(), "--master-key", master_key];
    start(crate::interop::thirdparty_python(), &args, 0).await
}

/// The JavaScript SDK echo agent.
pub async fn js_agent(dialects: &str) -> Peer {
    let script = repo_root().join("tests/interop/js/echo_agent.mjs");
    start(
        node(),
        &[script.to_str().unwrap(), "--dialects", dialects],
        0,
    )
    .await
}

/// A deliberately broken upstream (`garbage`, `invalid`, `slow`, `error`).
pub async fn fault_server(mode: &str, delay_secs: u32) -> Peer {
    fault_server_with(mode, delay_secs, &[]).await
}

/// [`fault_server`] with more of its options (`--card-interface URL`, ...).
pub async fn fault_server_with(mode: &str, delay_secs: u32, extra: &[&str]) -> Peer {
    let script = repo_root().join("tests/interop/fault_server.py");
    let delay = delay_secs.to_string();
    let mut args = vec![script.to_str().unwrap(), "--mode", mode, "--delay", &delay];
    args.extend_from_slice(extra);
    start(PathBuf::from("python3"), &args, 0).await
}

/// A port nothing listens on (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// An agent file proxying to `url`, with extra `[backend]` lines.
pub fn upstream_agent(name: &str, url: &str, extra: &str) -> String {
    format!("name = \"{name}\"\n[backend]\nkind = \"a2a\"\nurl = \"{url}\"\n{extra}\n")
}

//! The official A2A SDKs against the gateway. Their environments are installed by the
//! scripts under `scripts/` (idempotent, quick when present); a missing prerequisite fails
//! the test loudly rather than skipping it.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::helpers::{repo_root, spawn};

/// Runs a setup script once per test run; panics with its output if it fails.
fn setup(script: &str) {
    let out = Command::new("bash")
        .arg(repo_root().join(script))
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} could not set up the interop environment:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The venv's python, with the official `a2a-sdk` installed.
pub fn python() -> PathBuf {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| setup("scripts/interop-venv.sh"));
    repo_root().join("target/interop/venv/bin/python")
}

/// `node`, with `@a2a-js/sdk` installed under tests/interop/js.
pub fn node() -> PathBuf {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| setup("scripts/interop-node.sh"));
    PathBuf::from("node")
}

/// Runs an SDK client script against the echo agent's card and expects all checks to pass.
async fn run_client(program: PathBuf, script: &str, dialect: &str) {
    let gw = spawn().await;
    let card = gw.url("/a2a/agents/echo/card");
    let script = repo_root().join(script);
    let dialect = dialect.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(program)
            .arg(&script)
            .args(["--card-url", &card, "--dialect", &dialect])
            .output()
    })
    .await
    .expect("client thread")
    .expect("running the SDK client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("7 passed, 0 failed"),
        "SDK client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn python_sdk_client_over_1_0() {
    run_client(python(), "tests/interop/sdk_client.py", "1.0").await;
}

#[tokio::test]
async fn python_sdk_client_over_0_3() {
    run_client(python(), "tests/interop/sdk_client.py", "0.3").await;
}

#[tokio::test]
async fn javascript_sdk_client_over_1_0() {
    run_client(node(), "tests/interop/js/sdk_client.mjs", "1.0").await;
}

#[tokio::test]
async fn javascript_sdk_client_over_0_3() {
    run_client(node(), "tests/interop/js/sdk_client.mjs", "0.3").await;
}

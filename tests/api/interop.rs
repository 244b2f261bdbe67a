//! The official A2A SDKs against the gateway. Their environments are installed by the
//! scripts under `scripts/` (idempotent, quick when present); a missing prerequisite fails
//! the test loudly rather than skipping it.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::helpers::{repo_root, spawn, TestGateway};

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

/// A venv's python with a2a-sdk 0.3.x (its own: 0.3.x and 1.x are one package name).
pub fn sdk03_python() -> PathBuf {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| setup("scripts/sdk03-venv.sh"));
    repo_root().join("target/sdk03/venv/bin/python")
}

/// A venv's python with third-party peers: LiteLLM's proxy and pydantic-ai's A2A server.
pub fn thirdparty_python() -> PathBuf {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| setup("scripts/thirdparty-venv.sh"));
    repo_root().join("target/thirdparty/venv/bin/python")
}

/// `node`, with `@a2a-js/sdk` installed under tests/interop/js.
pub fn node() -> PathBuf {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| setup("scripts/interop-node.sh"));
    PathBuf::from("node")
}

/// Runs an official SDK's client (`python` or `javascript`) against `agent`'s card on `gw`
/// and expects all its checks to pass.
pub async fn run_client_at(gw: &TestGateway, agent: &str, sdk: &str, dialect: &str) {
    run_sdk_client(
        gw,
        &format!("/a2a/agents/{agent}/card"),
        agent,
        sdk,
        dialect,
        &[],
    )
    .await;
}

/// [`run_client_at`] with the card at `card_path` and extra client flags.
pub(crate) async fn run_sdk_client(
    gw: &TestGateway,
    card_path: &str,
    agent: &str,
    sdk: &str,
    dialect: &str,
    extra: &[&str],
) {
    let (program, script) = match sdk {
        "python" => (python(), "tests/interop/sdk_client.py"),
        _ => (node(), "tests/interop/js/sdk_client.mjs"),
    };
    let card = gw.url(card_path);
    let script = repo_root().join(script);
    let mut args = [
        "--card-url",
        &card,
        "--dialect",
        dialect,
        "--expect-name",
        agent,
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = tokio::task::spawn_blocking(move || {
        Command::new(program).arg(&script).args(&args).output()
    })
    .await
    .expect("client thread")
    .expect("running the SDK client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(" passed, 0 failed"),
        "{sdk} SDK client over {dialect} against {agent} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn run_client(sdk: &str, dialect: &str) {
    let gw = spawn().await;
    run_client_at(&gw, "echo", sdk, dialect).await;
}

#[tokio::test]
async fn python_sdk_client_over_1_0() {
    run_client("python", "1.0").await;
}

#[tokio::test]
async fn python_sdk_client_over_0_3() {
    run_client("python", "0.3").await;
}

#[tokio::test]
async fn javascript_sdk_client_over_1_0() {
    run_client("javascript", "1.0").await;
}

#[tokio::test]
async fn javascript_sdk_client_over_0_3() {
    run_client("javascript", "0.3").await;
}

/// Clients that take a card's URL as a base URL post to `<url>/`: both SDKs, with a card
/// path and JSON-RPC URLs that end in a slash, in both dialects.
#[tokio::test]
async fn sdk_clients_with_trailing_slashes() {
    let gw = spawn().await;
    for sdk in ["python", "javascript"] {
        for dialect in ["1.0", "0.3"] {
            let flags = ["--trailing-slash"];
            run_sdk_client(&gw, "/a2a/agents/echo/card/", "echo", sdk, dialect, &flags).await;
        }
    }
}

/// Python's httpx with `base_url=` set to an agent's URL, posting to `/` as such clients do,
/// and to paths that are no endpoint: every answer is JSON-RPC a client can read.
#[tokio::test]
async fn httpx_with_a_base_url_reaches_the_agent() {
    let gw = spawn().await;
    let script = repo_root().join("tests/interop/httpx_base_url.py");
    let base = gw.url("/a2a/agents/echo");
    let root = gw.url("");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(&script)
            .args(["--agent-url", &base, "--gateway-url", &root])
            .output()
    })
    .await
    .expect("client thread")
    .expect("running the httpx client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(" passed, 0 failed"),
        "httpx base_url client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

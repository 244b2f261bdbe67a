//! The official A2A SDKs against the gateway. Their environments are installed by the
//! scripts under `scripts/` (idempotent, quick when present); a missing prerequisite fails
//! the test loudly rather than skipping it.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::helpers::{repo_root, spawn};

/// Runs the setup script once per test run and returns the venv's python.
fn python() -> &'static PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo_root().join("scripts/interop-venv.sh"))
            .output()
            .expect("running scripts/interop-venv.sh");
        assert!(
            out.status.success(),
            "Python interop environment could not be set up:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let py = repo_root().join("target/interop/venv/bin/python");
        assert!(py.exists(), "{} missing after setup", py.display());
        py
    })
}

async fn run_python_client(dialect: &str) {
    let py = python().clone();
    let gw = spawn().await;
    let card = gw.url("/a2a/agents/echo/card");
    let script = repo_root().join("tests/interop/sdk_client.py");
    let dialect = dialect.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(py)
            .arg(script)
            .args(["--card-url", &card, "--dialect", &dialect])
            .output()
    })
    .await
    .unwrap()
    .expect("running the Python SDK client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("7 passed, 0 failed"),
        "Python a2a-sdk client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn python_sdk_client_over_1_0() {
    run_python_client("1.0").await;
}

#[tokio::test]
async fn python_sdk_client_over_0_3() {
    run_python_client("0.3").await;
}

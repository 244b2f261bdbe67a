//! The binary itself: `check` and `serve`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::helpers::{repo_root, write_config, ECHO};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
}

/// `serve` configured only through the environment, its stdout piped for the banner.
fn serve_from_env(
    dir: &std::path::Path,
    agents: &std::path::Path,
    port: u16,
) -> std::process::Child {
    bin()
        .current_dir(dir)
        .arg("serve")
        .env("A2A_GATEWAY_PORT", port.to_string())
        .env("A2A_GATEWAY_AGENTS_DIR", agents)
        .env("A2A_GATEWAY_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn check_accepts_the_shipped_configuration() {
    let out = bin()
        .current_dir(repo_root())
        .arg("check")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: "));
}

#[test]
fn check_prints_every_error_and_fails() {
    let (dir, agents, _) = write_config(
        &[
            (
                "a.toml",
                "name = \"A\"\ndescription = \"d\"\n[backend]\nkind = \"echo\"\n",
            ),
            ("b.toml", "name = \"b\"\n[backend]\nkind = \"nope\"\n"),
        ],
        None,
    );
    let out = bin()
        .current_dir(dir.path())
        .arg("check")
        .arg("--agents-dir")
        .arg(&agents)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let a = agents.join("a.toml");
    let b = agents.join("b.toml");
    assert!(
        err.contains(&format!("{}:1:8: name \"A\" must start", a.display())),
        "{err}"
    );
    assert!(err.contains(&format!("{}:", b.display())), "{err}");
    assert!(err.trim_end().ends_with("2 error(s)"), "{err}");
}

#[test]
fn serve_refuses_a_bad_configuration_with_exit_64() {
    let (dir, agents, _) = write_config(&[("a.toml", "name = 1\n")], None);
    let out = bin()
        .current_dir(dir.path())
        .args(["serve", "--port", "0"])
        .arg("--agents-dir")
        .arg(&agents)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to start"));
}

#[test]
fn serve_prints_a_banner_and_takes_settings_from_the_environment() {
    let (dir, agents, _) = write_config(&[("echo.toml", ECHO)], None);
    let mut child = serve_from_env(dir.path(), &agents, 0);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let base = first
        .split("listening on ")
        .nth(1)
        .expect("banner")
        .trim()
        .to_string();
    let banner: Vec<String> = lines.by_ref().take(5).map(Result::unwrap).collect();
    assert!(
        banner
            .iter()
            .any(|l| l.contains(&format!("{base}/.well-known/agent-card.json"))),
        "{banner:?}"
    );
    assert!(
        banner
            .iter()
            .any(|l| l.contains(&format!("{base}/a2a/health"))),
        "{banner:?}"
    );
    assert!(
        banner
            .iter()
            .any(|l| l.contains(&format!("{base}/a2a/agents/echo"))),
        "{banner:?}"
    );
    let health = std::process::Command::new("curl")
        .args(["-sf", &format!("{base}/a2a/health")])
        .output();
    child.kill().unwrap();
    let _ = child.wait();
    let health = health.expect("curl is available");
    assert!(String::from_utf8_lossy(&health.stdout).contains("\"status\":\"ok\""));
}

/// A gateway whose stdout nobody reads any more (`| head`, a closed pipe) keeps serving.
#[test]
fn serve_survives_a_closed_stdout() {
    let (dir, agents, _) = write_config(&[("echo.toml", ECHO)], None);
    let port = crate::peers::free_port();
    let mut child = serve_from_env(dir.path(), &agents, port);
    drop(child.stdout.take());
    let health = format!("http://127.0.0.1:{port}/a2a/health");
    let mut served = false;
    for _ in 0..100 {
        let out = Command::new("curl").args(["-sf", &health]).output();
        if out.is_ok_and(|o| o.status.success()) {
            served = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let exited = child.try_wait().unwrap();
    child.kill().unwrap();
    let _ = child.wait();
    assert!(served && exited.is_none(), "the gateway died: {exited:?}");
}

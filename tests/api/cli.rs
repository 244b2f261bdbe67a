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
    assert!(
        err.contains(&format!("{}:3:8: unknown variant `nope`", b.display())),
        "{err}"
    );
    // b.toml's other problem, found although its backend does not parse.
    assert!(
        err.contains(&format!("{}:1:1: missing field `description`", b.display())),
        "{err}"
    );
    assert!(err.trim_end().ends_with("3 error(s)"), "{err}");
}

/// A rule that names one method of a pair, or a method of another dialect, loads (it is
/// valid) but `check` warns, at the spot, and still says ok.
#[test]
fn check_warns_about_a_rule_on_one_method_of_a_pair() {
    let gateway = "[[auth.policies]]\nid = \"no-sends\"\neffect = \"deny\"\nwhen = \"a2a.method == 'SendMessage'\"\n\n[[auth.policies]]\nid = \"old-name\"\neffect = \"deny\"\nwhen = \"a2a.method == 'tasks/cancel'\"\n";
    let (dir, agents, config) = write_config(&[("echo.toml", ECHO)], Some(gateway));
    let config = config.unwrap();
    let out = bin()
        .current_dir(dir.path())
        .arg("check")
        .arg("--config")
        .arg(&config)
        .arg("--agents-dir")
        .arg(&agents)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: "));
    let at = format!(
        "warning: {}:4:23: policy \"no-sends\": names SendMessage but not SendStreamingMessage",
        config.display()
    );
    assert!(err.contains(&at), "{err}");
    assert!(err.contains("a2a.operation in ['send']"), "{err}");
    assert!(
        err.contains("policy \"old-name\": a2a.method is the A2A 1.0 name whatever the caller's dialect: 'tasks/cancel' never matches; write 'CancelTask'"),
        "{err}"
    );
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
    // Up to the last agent's line (the banner's last).
    let mut banner = Vec::new();
    for line in lines.by_ref().take(20) {
        let line = line.unwrap();
        let last = line.contains("agent echo");
        banner.push(line);
        if last {
            break;
        }
    }
    let pid = child.id();
    assert!(
        banner
            .iter()
            .any(|l| l.contains(&format!("pid {pid}: kill -HUP {pid} reloads"))),
        "{banner:?}"
    );
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

/// `--pid-file` names this gateway alone to signal: it holds the pid while the gateway
/// runs, a SIGHUP through it reloads, and it is gone once the gateway has stopped.
#[test]
fn the_pid_file_signals_this_gateway_only_and_goes_with_it() {
    let (dir, agents, _) = write_config(&[("echo.toml", ECHO)], None);
    let pid_file = dir.path().join("run/gateway.pid");
    std::fs::create_dir_all(pid_file.parent().unwrap()).unwrap();
    let mut child = bin()
        .current_dir(dir.path())
        .args(["serve", "--port", "0", "--pid-file"])
        .arg(&pid_file)
        .arg("--agents-dir")
        .arg(&agents)
        .env("A2A_GATEWAY_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = base_url(&mut child);
    let written = std::fs::read_to_string(&pid_file).unwrap();
    assert_eq!(written.trim(), child.id().to_string());
    let hup = Command::new("sh")
        .arg("-c")
        .arg(format!("kill -HUP $(cat {})", pid_file.display()))
        .status()
        .unwrap();
    assert!(hup.success());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let health = Command::new("curl")
        .args(["-sf", &format!("{base}/a2a/health")])
        .output()
        .unwrap();
    assert!(health.status.success(), "still serving after the reload");
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!pid_file.exists(), "removed at exit");
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

/// Reads the banner's first line for the base URL the gateway serves on.
fn base_url(child: &mut std::process::Child) -> String {
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let base = first.split("listening on ").nth(1).expect("banner").trim();
    // Keep draining the banner so the gateway never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    base.to_string()
}

/// POSTs a JSON-RPC send with `headers`; returns (HTTP status, body).
fn curl_send(url: &str, headers: &[&str]) -> (u16, serde_json::Value) {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"kind":"message","messageId":"m","role":"user","parts":[{"kind":"text","text":"hi"}]}}}"#;
    let mut cmd = Command::new("curl");
    cmd.args([
        "-s",
        "-w",
        "\n%{http_code}",
        "-H",
        "content-type: application/json",
        "-d",
        body,
    ]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(url).output().expect("curl is available");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').expect("status line");
    (
        status.parse().unwrap(),
        serde_json::from_str(body).unwrap_or_default(),
    )
}

/// `serve --auth-token` (or A2A_GATEWAY_AUTH_TOKEN): one bearer token that every agent,
/// public ones included, then requires.
#[test]
fn serve_with_one_auth_token_requires_it_everywhere() {
    let public = "name = \"open\"\ndescription = \"public\"\naccess = \"public\"\n[backend]\nkind = \"echo\"\n";
    let (dir, agents, _) = write_config(&[("echo.toml", ECHO), ("open.toml", public)], None);
    for by_env in [false, true] {
        let mut cmd = bin();
        cmd.current_dir(dir.path())
            .args(["serve", "--port", "0"])
            .arg("--agents-dir")
            .arg(&agents)
            .env("A2A_GATEWAY_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if by_env {
            cmd.env("A2A_GATEWAY_AUTH_TOKEN", "s3cret-token");
        } else {
            cmd.args(["--auth-token", "s3cret-token"]);
        }
        let mut child = cmd.spawn().unwrap();
        let base = base_url(&mut child);
        for agent in ["echo", "open"] {
            let url = format!("{base}/a2a/agents/{agent}");
            let (status, body) = curl_send(&url, &[]);
            assert_eq!(status, 401, "{agent} without the token: {body}");
            assert_eq!(body["error"]["code"], -32041, "{body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("Unauthenticated"),
                "{body}"
            );
            let (status, _) = curl_send(&url, &["Authorization: Bearer wrong"]);
            assert_eq!(status, 401, "{agent} with a wrong token");
            let (status, body) = curl_send(&url, &["Authorization: Bearer s3cret-token"]);
            assert_eq!(status, 200, "{agent} with the token: {body}");
            assert_eq!(body["result"]["status"]["state"], "completed", "{body}");
        }
        child.kill().unwrap();
        let _ = child.wait();
    }
    let out = bin()
        .current_dir(dir.path())
        .args(["serve", "--port", "0", "--auth-token", " "])
        .arg("--agents-dir")
        .arg(&agents)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "an empty token is refused");
}

/// Log lines carry no colour codes when stderr is not a terminal (a file, a pipe).
#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let port = crate::peers::free_port();
    let unreachable = format!(
        "name = \"far\"\n[backend]\nkind = \"a2a\"\nurl = \"http://127.0.0.1:{port}\"\nconnect_timeout_secs = 1\n"
    );
    let (dir, agents, _) = write_config(&[("far.toml", &unreachable)], None);
    let mut child = bin()
        .current_dir(dir.path())
        .args(["serve", "--port", "0"])
        .arg("--agents-dir")
        .arg(&agents)
        .env("A2A_GATEWAY_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _base = base_url(&mut child);
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    child.kill().unwrap();
    let _ = child.wait();
    assert!(line.contains("upstream agent unavailable"), "{line:?}");
    assert!(!line.contains('\u{1b}'), "no ANSI escapes: {line:?}");
}

//! What operators run: metrics, access logs, trace context, hot reload (SIGHUP and the file
//! watcher, on the real binary), drain on SIGTERM, and readiness.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::{rpc, series, sha, spawn_with, write_config, D, ECHO, OTHER};
use crate::peers::{fault_server_with, upstream_agent};
use crate::running::Running;

fn message(text: &str) -> Value {
    json!({"message": D::V10.message(text)})
}

const NAMED: &str = "name = \"named\"\ndescription = \"d\"\n[backend]\nkind = \"echo\"\n";

/// A copy of a directory tree (the shipped agents.d/ with its scripts).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The reloads counted so far, by outcome.
async fn reloads(gw: &Running) -> [f64; 3] {
    let metrics = gw.metrics().await;
    ["ok", "invalid", "unchanged"].map(|outcome| {
        series(
            &metrics,
            "a2a_config_reloads_total",
            &[&format!("outcome=\"{outcome}\"")],
        )
        .unwrap_or(0.0)
    })
}

/// The shipped gateway.toml and agents.d/ (SQLite beside the gateway file, the watcher on)
/// reload only when a file of the configuration changes: not when the store writes, not
/// when someone reads the files, not twice for one edit, and a broken file is reported
/// once, however often it is read or touched.
#[tokio::test]
async fn the_shipped_configuration_reloads_only_when_it_changes() {
    let root = crate::helpers::repo_root();
    let copy = tempfile::tempdir().unwrap();
    let agents = copy.path().join("agents.d");
    copy_tree(&root.join("agents.d"), &agents);
    let shipped = std::fs::read_to_string(root.join("gateway.toml")).unwrap();
    let gw = Running::start_with_agents(&agents, &shipped, "info");
    gw.wait_for_agents(&["echo", "greet", "greeter", "shout"])
        .await;
    assert!(
        gw.dir.path().join("data/gateway.db").exists(),
        "the shipped store"
    );

    // Ten seconds of tasks written to the store while another process reads every file.
    let files: Vec<std::path::PathBuf> = std::iter::once(gw.gateway.clone())
        .chain(
            std::fs::read_dir(&agents)
                .unwrap()
                .map(|e| e.unwrap().path()),
        )
        .chain(
            std::fs::read_dir(agents.join("scripts"))
                .unwrap()
                .map(|e| e.unwrap().path()),
        )
        .filter(|p| p.is_file())
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for f in &files {
                    let status = Command::new("cat").arg(f).output().unwrap().status;
                    assert!(status.success());
                    reads += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            reads
        })
    };
    let until = Instant::now() + Duration::from_secs(10);
    let mut sent = 0;
    while Instant::now() < until {
        let r = gw
            .call("/a2a/agents/echo", "SendMessage", message("hi"))
            .await;
        assert!(r.get("result").is_some(), "{r}");
        sent += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().unwrap();
    assert!(sent > 100 && reads > 100, "{sent} sends, {reads} reads");
    assert_eq!(reloads(&gw).await, [0.0, 0.0, 0.0], "idle: no reload");

    // One edit: exactly one reload.
    let echo = agents.join("echo.toml");
    let text = std::fs::read_to_string(&echo).unwrap();
    std::fs::write(
        &echo,
        text.replace("description = \"", "description = \"Edited. "),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads(&gw).await[0] < 1.0 {
        assert!(Instant::now() < deadline, "the edit was not reloaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(reloads(&gw).await, [1.0, 0.0, 0.0], "one edit, one reload");

    // A comment changes the file, not the configuration: not a reload.
    std::fs::write(
        &echo,
        format!("{}\n# a comment\n", std::fs::read_to_string(&echo).unwrap()),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads(&gw).await[2] < 1.0 {
        assert!(Instant::now() < deadline, "the comment was not read");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(reloads(&gw).await, [1.0, 0.0, 1.0]);

    // A broken file: reported once, then not again while it is read and touched.
    let broken = agents.join("broken.toml");
    std::fs::write(&broken, "name = \"broken\"\n[backend]\nkind = \"nope\"\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads(&gw).await[1] < 1.0 {
        assert!(Instant::now() < deadline, "the broken file was not read");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..10 {
        let _ = std::fs::read(&broken).unwrap();
        let status = Command::new("touch").arg(&broken).status().unwrap();
        assert!(status.success());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(reloads(&gw).await, [1.0, 1.0, 1.0], "reported once");
    let refused = gw
        .log_lines()
        .iter()
        .filter(|l| l["fields"]["message"] == "configuration invalid: not reloaded")
        .count();
    assert_eq!(refused, 1, "one report");
    // A script an agent names is part of its configuration.
    std::fs::remove_file(&broken).unwrap();
    let script = agents.join("scripts/shout.py");
    let text = std::fs::read_to_string(&script).unwrap();
    std::fs::write(&script, format!("{text}\n# edited\n")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads(&gw).await[0] < 2.0 {
        assert!(Instant::now() < deadline, "the script's edit was not seen");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A reload asked for the moment the banner says the gateway serves is not lost: a SIGHUP
/// at once, and (the watcher on) a file written at once. The gateway listens for both
/// before it says it serves; several starts, as the window was a race.
#[tokio::test]
async fn a_reload_asked_for_right_after_start_is_not_lost() {
    for round in 0..4 {
        // SIGHUP with the watcher off, so the signal alone must do it.
        let gw = Running::start(
            &[("echo.toml", ECHO)],
            "[server]\nwatch_config = false\n",
            "info",
        );
        std::fs::write(gw.agents.join("named.toml"), NAMED).unwrap();
        gw.signal("HUP");
        gw.wait_for_agents(&["echo", "named"]).await;
        // A file written at once, no signal.
        let gw = Running::start(&[("echo.toml", ECHO)], "", "info");
        std::fs::write(gw.agents.join("named.toml"), NAMED).unwrap();
        gw.wait_for_agents(&["echo", "named"]).await;
        let _ = round;
    }
}

/// A scrape counts every call answered before it, whichever worker answered it (each
/// worker adds its own counts to the shared series when a scrape asks): an MCP tool call
/// and a scrape, each on a connection of its own, so on the two workers in turn.
#[tokio::test]
async fn a_scrape_sees_every_call_answered_before_it_on_any_worker() {
    let gw = Running::start_workers(&[("echo.toml", ECHO)], "", "warn", 2);
    gw.wait_for_agents(&["echo"]).await;
    // No connection kept between requests: each is accepted by the next worker.
    let fresh = || {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
    };
    let mcp = |body: Value, session: Option<&str>| {
        let mut req = fresh()
            .post(gw.url("/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        req.json(&body).send()
    };
    let opened = mcp(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "scrape", "version": "1"}}}),
        None,
    )
    .await
    .unwrap();
    let session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = opened.text().await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let _ = mcp(initialized, Some(&session)).await.unwrap().text().await;
    for round in 1..=6 {
        let call = json!({"jsonrpc": "2.0", "id": round + 1, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": "counted"}}});
        let answer = mcp(call, Some(&session))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(answer.contains("counted"), "{answer}");
        let text = fresh()
            .get(gw.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let calls = series(
            &text,
            "a2a_requests_total",
            &["binding=\"mcp\"", "outcome=\"ok\""],
        );
        assert_eq!(calls, Some(f64::from(round)), "round {round}");
    }
}

#[tokio::test]
async fn sighup_and_file_changes_reload_and_a_bad_file_keeps_the_running_configuration() {
    let gw = Running::start(&[("echo.toml", ECHO)], "default_agent = \"echo\"\n", "info");
    gw.wait_for_agents(&["echo"]).await;

    // SIGHUP: a new agent serves at once.
    std::fs::write(gw.agents.join("named.toml"), NAMED).unwrap();
    gw.signal("HUP");
    gw.wait_for_agents(&["echo", "named"]).await;
    let reloaded = gw
        .wait_for_log("saying what was added", |l| {
            l["fields"]["message"] == "configuration reloaded"
                && l["fields"]["added"]
                    .as_str()
                    .is_some_and(|a| a.contains("named"))
        })
        .await;
    assert_eq!(reloaded["level"], "INFO");
    let r: Value = gw
        .call("/a2a/agents/named", "SendMessage", message("hi"))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let named_task = D::V10.task_of(&r["result"])["id"].clone();

    // A broken file: refused whole, every error logged where it is, the old agents serve.
    std::fs::write(
        gw.agents.join("broken.toml"),
        "name = \"broken\"\n[backend]\nkind = \"nope\"\n",
    )
    .unwrap();
    gw.signal("HUP");
    let error = gw
        .wait_for_log("naming the broken file", |l| {
            l["level"] == "ERROR"
                && l["fields"]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("broken.toml:3:"))
        })
        .await;
    assert!(
        error["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("reload refused"),
        "{error}"
    );
    assert_eq!(gw.agent_names().await, ["echo", "named"]);
    let metrics = gw.metrics().await;
    assert_eq!(
        series(
            &metrics,
            "a2a_config_reloads_total",
            &["outcome=\"invalid\""]
        ),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        series(&metrics, "a2a_config_reloads_total", &["outcome=\"ok\""]).unwrap_or(0.0) >= 1.0
    );

    // The watcher: fixing the file and removing an agent reload without a signal.
    std::fs::remove_file(gw.agents.join("broken.toml")).unwrap();
    std::fs::remove_file(gw.agents.join("named.toml")).unwrap();
    gw.wait_for_agents(&["echo"]).await;
    let r: Value = gw
        .call("/a2a/agents/named", "SendMessage", message("hi"))
        .await;
    assert_eq!(
        r["error"]["code"], -32040,
        "a removed agent takes no work: {r}"
    );
    // Its tasks stay readable on the shared endpoint.
    let read: Value = gw.call("/a2a", "GetTask", json!({"id": named_task})).await;
    assert_eq!(read["result"]["id"], named_task, "{read}");

    // gateway.toml: credentials change at once.
    std::fs::write(
        gw.dir.path().join("gateway.toml"),
        format!(
            "default_agent = \"echo\"\n[auth]\ndefault_access = \"authenticated\"\n[[auth.api_keys]]\nid = \"ops\"\nsecret_sha256 = \"{}\"\n",
            sha("ops-key")
        ),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = gw
            .client
            .post(gw.url("/a2a/agents/echo"))
            .header("A2A-Version", "1.0")
            .body(rpc("SendMessage", message("hi")))
            .send()
            .await
            .unwrap()
            .status();
        if status == 401 {
            break;
        }
        assert!(Instant::now() < deadline, "credentials did not apply");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let with_key = gw
        .client
        .post(gw.url("/a2a/agents/echo"))
        .header("A2A-Version", "1.0")
        .header("X-API-Key", "ops-key")
        .body(rpc("SendMessage", message("hi")))
        .send()
        .await
        .unwrap();
    crate::helpers::answered(with_key).await;
}

#[tokio::test]
async fn agents_change_under_load_and_no_request_fails() {
    let gw = Running::start(
        &[("echo.toml", ECHO), ("other.toml", OTHER)],
        "default_agent = \"echo\"\n",
        "warn",
    );
    gw.wait_for_agents(&["echo", "other"]).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for i in 0..8 {
        let (client, url, stop) = (gw.client.clone(), gw.base.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let path = if i % 2 == 0 {
                "/a2a"
            } else {
                "/a2a/agents/echo"
            };
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = client
                    .post(format!("{url}{path}"))
                    .header("A2A-Version", "1.0")
                    .body(rpc("SendMessage", message("under load")))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 200 => {
                        let body: Value = r.json().await.unwrap_or_default();
                        if body.get("result").is_some() {
                            ok += 1;
                        } else {
                            failed.push(body.to_string());
                        }
                    }
                    Ok(r) => failed.push(format!("status {}", r.status())),
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (ok, failed)
        }));
    }
    // Agents come and go, echo's definition changes, SIGHUP and the watcher both reload.
    for round in 0..6 {
        std::fs::write(
            gw.agents.join(format!("extra{round}.toml")),
            NAMED.replace("named", &format!("extra{round}")),
        )
        .unwrap();
        std::fs::write(
            gw.agents.join("echo.toml"),
            ECHO.replace(
                "description = ",
                &format!("description = \"round {round}\"\n# "),
            ),
        )
        .unwrap();
        if round > 0 {
            let _ = std::fs::remove_file(gw.agents.join(format!("extra{}.toml", round - 1)));
        }
        if round % 2 == 0 {
            gw.signal("HUP");
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    gw.wait_for_agents(&["echo", "extra5", "other"]).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for c in clients {
        let (o, f) = c.await.unwrap();
        ok += o;
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(ok > 100, "only {ok} requests went through");
    let reloads = gw
        .log_lines()
        .into_iter()
        .filter(|l| l["fields"]["message"] == "configuration reloaded")
        .count();
    assert_eq!(reloads, 0, "the log level was warn");
    let metrics = gw.metrics().await;
    let ok_reloads = series(&metrics, "a2a_config_reloads_total", &["outcome=\"ok\""]);
    assert!(ok_reloads.unwrap_or(0.0) >= 3.0, "{metrics}");
    let card: Value = gw
        .client
        .get(gw.url("/a2a/agents/echo/card"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        card["description"], "round 5",
        "the changed definition serves"
    );
}

/// An HTTP/1.1 request on an open connection; the status line and the whole head.
fn raw_request(conn: &mut std::net::TcpStream, request: &str) -> (u16, String, String) {
    conn.write_all(request.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = conn.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "connection closed: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = conn.read(&mut chunk).unwrap();
        assert!(n > 0);
        buf.extend_from_slice(&chunk[..n]);
    }
    let status = head[9..12].parse().unwrap();
    let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).to_string();
    (status, head, body)
}

#[tokio::test]
async fn sigterm_drains_streams_finishes_calls_and_exits_zero() {
    let mut gw = Running::start(
        &[("echo.toml", ECHO)],
        "default_agent = \"echo\"\n[server]\nshutdown_grace_secs = 8\n",
        "info",
    );
    let addr = gw.base.trim_start_matches("http://").to_string();
    let mut idle = std::net::TcpStream::connect(&addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let get_ready = format!("GET /a2a/ready HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let (status, _, body) = raw_request(&mut idle, &get_ready);
    assert_eq!(status, 200, "{body}");

    // A stream that would run 30 s, and a blocking call that needs 2 s.
    let stream = gw
        .client
        .post(gw.url("/a2a/agents/echo"))
        .header("A2A-Version", "1.0")
        .body(rpc("SendStreamingMessage", message("/delay 30 long")))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let mut stream = stream.bytes_stream();
    use futures_util::StreamExt;
    let first = stream.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("data:"));
    let blocking = {
        let (client, url) = (gw.client.clone(), gw.url("/a2a/agents/echo"));
        tokio::spawn(async move {
            client
                .post(url)
                .header("A2A-Version", "1.0")
                .body(rpc("SendMessage", message("/delay 2 finished")))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.signal("TERM");

    // The stream ends with an event telling the client to go elsewhere.
    let mut rest = String::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the stream ends promptly")
    {
        rest.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(rest.contains("event: error"), "{rest}");
    assert!(rest.contains("-32055"), "{rest}");

    // Readiness says why; a new call on an open connection is refused and closed.
    let (status, _, body) = raw_request(&mut idle, &get_ready);
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "draining"
    );
    let post = format!(
        "POST /a2a HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nContent-Length: {}\r\n\r\n{}",
        rpc("SendMessage", message("late")).len(),
        rpc("SendMessage", message("late"))
    );
    let (status, head, body) = raw_request(&mut idle, &post);
    assert_eq!(status, 503, "{body}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    let refusal: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(refusal["error"]["code"], -32055, "a JSON-RPC error: {body}");
    assert!(body.contains("SHUTTING_DOWN"), "{body}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );

    // The call in flight finishes; the process exits 0 within the grace period.
    let answer = blocking.await.unwrap();
    assert!(
        answer["result"].to_string().contains("finished"),
        "{answer}"
    );
    let (status, took) = gw.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    let drained = gw
        .wait_for_log("about the drain", |l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("draining"))
        })
        .await;
    assert_eq!(drained["fields"]["signal"], "SIGTERM");
    assert_eq!(drained["fields"]["open_streams"], 1);
}

#[tokio::test]
async fn command_processes_are_stopped_on_sigterm() {
    let sleeper = "name = \"sleeper\"\ndescription = \"d\"\n[backend]\nkind = \"command\"\ncommand = [\"/bin/sh\", \"-c\", \"echo $$ > pid; exec sleep 300\"]\ncwd = \"..\"\ntimeout_secs = 600\nkill_grace_ms = 200\n";
    let mut gw = Running::start(
        &[("sleeper.toml", sleeper)],
        "[server]\nshutdown_grace_secs = 4\n",
        "info",
    );
    let r: Value = gw
        .client
        .post(gw.url("/a2a/agents/sleeper"))
        .header("A2A-Version", "1.0")
        .body(rpc(
            "SendMessage",
            json!({"message": D::V10.message("x"), "configuration": {"returnImmediately": true}}),
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(r.get("result").is_some(), "{r}");
    let pid_file = gw.dir.path().join("pid");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pid_file.exists() {
        assert!(Instant::now() < deadline, "the command did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    let metrics = gw.metrics().await;
    assert_eq!(
        series(
            &metrics,
            "a2a_command_processes",
            &["agent=\"sleeper\"", "state=\"running\""]
        ),
        Some(1.0),
        "{metrics}"
    );
    gw.signal("TERM");
    let (status, _) = gw.wait_exit(Duration::from_secs(6));
    assert!(status.success(), "{status:?}");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the command's process {pid} outlived the gateway"
    );
    let drained = gw
        .wait_for_log("about the stopped work", |l| {
            l["fields"]["message"] == "drained; exiting"
        })
        .await;
    assert_eq!(drained["fields"]["stopped_processes"], 1, "{drained}");
}

#[tokio::test]
async fn metrics_count_calls_by_agent_method_dialect_binding_and_outcome() {
    let gw = spawn_with(
        &[("echo.toml", ECHO), ("other.toml", OTHER)],
        &format!(
            "default_agent = \"echo\"\n[[auth.api_keys]]\nid = \"k\"\nsecret_sha256 = \"{}\"\nagents = [\"other\"]\n[auth]\ndefault_access = \"public\"\n",
            sha("good-key")
        ),
    )
    .await;
    let ok = gw
        .call("/a2a/agents/echo", D::V10, "SendMessage", message("hi"))
        .await;
    assert!(ok.body.get("result").is_some(), "{}", ok.body);
    gw.call(
        "/a2a/agents/echo",
        D::V03,
        "message/send",
        json!({"message": D::V03.message("hi")}),
    )
    .await;
    // A caller-chosen name is never a label.
    let unknown = gw
        .call(
            "/a2a/agents/zz-caller-made-this",
            D::V10,
            "SendMessage",
            message("hi"),
        )
        .await;
    assert_eq!(unknown.code(), -32040);
    let bad_key = gw
        .client
        .post(gw.url("/a2a/agents/other"))
        .header("A2A-Version", "1.0")
        .header("X-API-Key", "wrong")
        .body(rpc("SendMessage", message("hi")))
        .send()
        .await
        .unwrap();
    assert_eq!(bad_key.status(), 401);
    let rest = gw
        .client
        .post(gw.url("/a2a/agents/echo/rest/message:send"))
        .header("A2A-Version", "1.0")
        .header("Content-Type", "application/a2a+json")
        .body(message("hi").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), 200);
    let events = gw
        .sse(
            "/a2a/agents/echo",
            D::V10,
            "SendStreamingMessage",
            message("streamed"),
        )
        .await;
    assert!(!events.is_empty());

    let resp = gw.client.get(gw.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = resp.text().await.unwrap();
    let want = |name: &str, labels: &[&str]| {
        series(&text, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in:\n{text}"))
    };
    let ok_v10 = [
        "agent=\"echo\"",
        "method=\"SendMessage\"",
        "dialect=\"1.0\"",
        "binding=\"jsonrpc\"",
        "outcome=\"ok\"",
    ];
    assert_eq!(want("a2a_requests_total", &ok_v10), 1.0);
    assert_eq!(
        want(
            "a2a_requests_total",
            &[
                "agent=\"echo\"",
                "dialect=\"0.3\"",
                "method=\"SendMessage\""
            ]
        ),
        1.0
    );
    assert_eq!(
        want(
            "a2a_requests_total",
            &["agent=\"\"", "outcome=\"AGENT_NOT_FOUND\""]
        ),
        1.0
    );
    assert_eq!(
        want(
            "a2a_requests_total",
            &["binding=\"rest\"", "agent=\"echo\""]
        ),
        1.0
    );
    assert!(
        !text.contains("zz-caller-made-this"),
        "caller input in a label"
    );
    assert_eq!(
        want("a2a_auth_failures_total", &["kind=\"rejected_api_key\""]),
        1.0
    );
    assert!(want("a2a_request_duration_seconds_count", &["agent=\"echo\""]) >= 1.0);
    assert_eq!(
        want(
            "a2a_stream_first_event_seconds_count",
            &["agent=\"echo\"", "method=\"SendStreamingMessage\""]
        ),
        1.0
    );
    assert_eq!(want("a2a_open_streams", &["agent=\"echo\""]), 0.0);
    assert!(want("a2a_tasks", &["state=\"completed\""]) >= 3.0);
    assert!(
        want(
            "a2a_task_transitions_total",
            &["agent=\"echo\"", "state=\"completed\""]
        ) >= 3.0
    );
    assert!(want("a2a_stored_tasks", &[]) >= 3.0);
    assert_eq!(want("a2a_mailbox_depth", &["agent=\"other\""]), 0.0);
    assert_eq!(want("a2a_config_info", &["hash=\""]), 1.0);
    assert!(want("a2a_open_connections", &[]) >= 1.0);
}

#[tokio::test]
async fn metrics_can_be_moved_to_their_own_listener_or_turned_off() {
    let off = spawn_with(&[("echo.toml", ECHO)], "[metrics]\nenabled = false\n").await;
    let r = off.client.get(off.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 404);

    let port = crate::peers::free_port();
    let (dir, agents, gateway) = write_config(
        &[("echo.toml", ECHO)],
        Some(&format!(
            "[server]\nport = 0\nworkers = 1\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"
        )),
    );
    let settings = a2a_gateway::config::load(gateway.as_deref(), &agents).unwrap();
    let app = a2a_gateway::app::Application::build(settings)
        .await
        .unwrap();
    assert_eq!(app.metrics_port(), Some(port));
    let main = format!("http://127.0.0.1:{}", app.port());
    let handle = app.handle();
    tokio::spawn(app.run_until_stopped());
    let client = crate::helpers::client();
    let on_main = client.get(format!("{main}/metrics")).send().await.unwrap();
    assert_eq!(on_main.status(), 404, "not on the A2A port");
    let text = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("a2a_config_info"), "{text}");
    handle.stop(false).await;
    drop(dir);
}

#[tokio::test]
async fn the_address_in_use_is_named() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
        .current_dir(crate::helpers::repo_root())
        .args(["serve", "--port", &port.to_string()])
        .env("A2A_GATEWAY_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("address 127.0.0.1:{port} already in use")),
        "{err}"
    );
}

#[tokio::test]
async fn access_log_is_one_json_line_per_request_without_secrets() {
    let gateway = format!(
        "default_agent = \"echo\"\n[[auth.api_keys]]\nid = \"alice\"\nsecret_sha256 = \"{}\"\n",
        sha("alice-secret-key")
    );
    let gw = Running::start(&[("echo.toml", ECHO)], &gateway, "info");
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r: Value = gw
        .client
        .post(gw.url("/a2a/agents/echo"))
        .header("A2A-Version", "1.0")
        .header("X-API-Key", "alice-secret-key")
        .header("traceparent", trace)
        .body(rpc("SendMessage", message("the private words")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task_id = D::V10.task_of(&r["result"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let bad = gw
        .client
        .post(gw.url("/a2a/agents/echo"))
        .header("A2A-Version", "1.0")
        .header("X-API-Key", "wrong-secret-key")
        .body(rpc("SendMessage", message("hi")))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 401);
    let line = gw
        .wait_for_log("for the call", |l| {
            l["target"] == "a2a_gateway::access" && l["fields"]["status"] == 200
        })
        .await;
    let f = &line["fields"];
    assert_eq!(f["method"], "POST");
    assert_eq!(f["path"], "/a2a/agents/echo");
    assert_eq!(f["agent"], "echo");
    assert_eq!(f["a2a.method"], "SendMessage");
    assert_eq!(f["a2a.dialect"], "1.0");
    assert_eq!(f["principal"], "key:alice");
    assert_eq!(f["task_id"], task_id);
    assert_eq!(f["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert!(f["duration_ms"].as_f64().is_some());
    // Milliseconds to the microsecond, without float noise.
    for l in gw.log_lines() {
        if let Some(ms) = l["fields"]["duration_ms"].as_f64() {
            let written = ms.to_string();
            let decimals = written.split_once('.').map_or(0, |(_, d)| d.len());
            assert!(decimals <= 3, "duration_ms {written}");
        }
    }
    let refused = gw
        .wait_for_log("for the refusal", |l| {
            l["target"] == "a2a_gateway::access" && l["fields"]["status"] == 401
        })
        .await;
    assert_eq!(refused["fields"]["code"], -32041);
    let log = std::fs::read_to_string(&gw.log).unwrap();
    for secret in ["alice-secret-key", "wrong-secret-key", "the private words"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}

#[tokio::test]
async fn traceparent_reaches_the_upstream_as_a_child_of_the_callers() {
    let log = tempfile::tempdir().unwrap();
    let seen = log.path().join("seen.jsonl");
    let upstream =
        fault_server_with("extended", 0, &["--log-requests", seen.to_str().unwrap()]).await;
    let gw = spawn_with(
        &[("up.toml", &upstream_agent("up", &upstream.url(), ""))],
        "",
    )
    .await;
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for method in ["SendMessage", "SendStreamingMessage"] {
        let r = gw
            .client
            .post(gw.url("/a2a/agents/up"))
            .header("A2A-Version", "1.0")
            .header("traceparent", trace)
            .header("tracestate", "vendor=abc")
            .body(rpc(method, message("traced")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let _ = r.bytes().await;
    }
    // Without one, none is made up.
    gw.call("/a2a/agents/up", D::V10, "SendMessage", message("untraced"))
        .await;
    let posts: Vec<Value> = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["method"] == "POST")
        .collect();
    assert_eq!(posts.len(), 3, "{posts:?}");
    for post in &posts[..2] {
        let tp = post["headers"]["traceparent"].as_str().unwrap_or_default();
        assert!(
            tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && tp.ends_with("-01"),
            "{post}"
        );
        assert_ne!(
            &tp[36..52],
            "00f067aa0ba902b7",
            "the gateway's own span is the parent"
        );
        assert_eq!(post["headers"]["tracestate"], "vendor=abc");
    }
    assert!(
        posts[2]["headers"].get("traceparent").is_none(),
        "{}",
        posts[2]
    );
}

#[tokio::test]
async fn cors_follows_a_reload() {
    let gw = Running::start(
        &[("echo.toml", ECHO)],
        "[cors]\nallowed_origins = [\"https://one.example\"]\n",
        "warn",
    );
    let allowed = |origin: &'static str| {
        let gw = &gw;
        async move {
            gw.client
                .request(reqwest::Method::OPTIONS, gw.url("/a2a/agents/echo"))
                .header("Origin", origin)
                .header("Access-Control-Request-Method", "POST")
                .send()
                .await
                .unwrap()
                .headers()
                .get("access-control-allow-origin")
                .map(|v| v.to_str().unwrap().to_string())
        }
    };
    assert_eq!(
        allowed("https://one.example").await.as_deref(),
        Some("https://one.example")
    );
    assert_eq!(allowed("https://two.example").await, None);
    std::fs::write(
        gw.dir.path().join("gateway.toml"),
        "[cors]\nallowed_origins = [\"https://two.example\"]\n",
    )
    .unwrap();
    gw.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while allowed("https://two.example").await.is_none() {
        assert!(Instant::now() < deadline, "CORS did not follow the reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(allowed("https://one.example").await, None);
}

/// Asks once, then answers the second line it reads: a fresh process given the answer
/// would ask again.
const TWO_STEP: &str = r#"
import json, sys
sys.stdin.readline()
print(json.dumps({"inputRequired": "and then?"}), flush=True)
if sys.stdin.readline():
    print(json.dumps({"result": "answered by the process that asked"}), flush=True)
"#;

#[tokio::test]
async fn a_card_only_change_keeps_a_conversation_waiting_for_input() {
    let agent = "name = \"two\"\ndescription = \"asks once\"\n[backend]\nkind = \"command\"\ncommand = [\"python3\", \"two.py\"]\nio = \"jsonl\"\n";
    let gw = Running::start(&[("two.toml", agent), ("two.py", TWO_STEP)], "", "info");
    let first = gw
        .call("/a2a/agents/two", "SendMessage", message("start"))
        .await;
    let task = D::V10.task_of(&first["result"]);
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{first}"
    );

    // Only the card changes: the waiting program is the one that gets the answer.
    std::fs::write(
        gw.agents.join("two.toml"),
        agent.replace("asks once", "asks once, politely"),
    )
    .unwrap();
    gw.signal("HUP");
    gw.wait_for_log("saying the agent changed", |l| {
        l["fields"]["message"] == "configuration reloaded"
            && l["fields"]["changed"]
                .as_str()
                .is_some_and(|c| c.contains("two"))
    })
    .await;
    let card: Value = gw
        .client
        .get(gw.url("/a2a/agents/two/card"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(card["description"], "asks once, politely");
    let mut answer = D::V10.message("this");
    answer["taskId"] = task["id"].clone();
    answer["contextId"] = task["contextId"].clone();
    let done = gw
        .call("/a2a/agents/two", "SendMessage", json!({"message": answer}))
        .await;
    let task = D::V10.task_of(&done["result"]);
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert!(
        done.to_string().contains("the process that asked"),
        "{done}"
    );
}

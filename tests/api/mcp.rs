//! Every agent as an MCP tool (`/mcp`, Streamable HTTP), driven by the official MCP Python
//! SDK's client (tests/interop/mcp_client.py): the tools a caller may use, calls to the
//! echo agent, a command agent that asks a question (answered through elicitation), an
//! upstream agent and an LLM agent; progress, cancel, refusals, and sessions kept apart.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};

use crate::helpers::{repo_root, sha, spawn_with, TestGateway, D, ECHO};

pub(crate) fn mcp_python() -> PathBuf {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PathBuf::from(PATH.get_or_init(|| {
        crate::helpers::provided_by("scripts/mcp-venv.sh", "set up the MCP client's venv")
    }))
}

/// Runs a scenario of mcp_client.py; its JSON, or a panic with what it printed.
async fn client(gw: &TestGateway, key: Option<&str>, mode: &str, args: &[&str]) -> Value {
    client_at(&gw.url("/mcp"), key, mode, args).await
}

async fn client_at(url: &str, key: Option<&str>, mode: &str, args: &[&str]) -> Value {
    let mut cmd = Command::new(mcp_python());
    cmd.arg(repo_root().join("tests/interop/mcp_client.py"))
        .arg(url)
        .args(args)
        .args(["--mode", mode]);
    if let Some(key) = key {
        cmd.args(["--api-key", key]);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .expect("mcp_client.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    match serde_json::from_str(last) {
        Ok(v) if out.status.success() => v,
        _ => panic!(
            "mcp_client.py {args:?} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A raw MCP message to `/mcp` (handshake era), as `key`, on `session`.
pub(crate) fn raw_post(
    gw: &TestGateway,
    body: &Value,
    key: Option<&str>,
    session: Option<&str>,
) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> {
    let mut req = gw
        .client
        .post(gw.url("/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(key) = key {
        req = req.header("X-API-Key", key);
    }
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    req.json(body).send()
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}})
}

/// A handshake-era session opened by raw messages, as `key`: its id.
pub(crate) async fn raw_session(gw: &TestGateway, key: Option<&str>) -> String {
    let opened = raw_post(gw, &initialize(), key, None).await.unwrap();
    assert_eq!(opened.status(), 200);
    let session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = opened.text().await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let _ = raw_post(gw, &initialized, key, Some(&session))
        .await
        .unwrap();
    session
}

fn greet() -> String {
    let script = repo_root().join("agents.d/scripts/greet.py");
    format!(
        "name = \"greet\"\ndescription = \"Greets you by name\"\n[[skills]]\nid = \"greet\"\nname = \"Greet\"\ndescription = \"Asks for a name, then greets.\"\n[backend]\nkind = \"command\"\ncommand = [\"python3\", {:?}]\nio = \"jsonl\"\n",
        script.display().to_string()
    )
}

const PRIVATE: &str = r#"
name = "vault"
description = "Only for the ops key"
access = "authenticated"
[backend]
kind = "echo"
"#;

async fn gateway() -> TestGateway {
    let keys = format!(
        "[[auth.api_keys]]\nid = \"ops\"\nsecret_sha256 = \"{}\"\nagents = [\"*\"]\n",
        sha("ops-key")
    );
    spawn_with(
        &[
            ("echo.toml", ECHO),
            ("greet.toml", &greet()),
            ("vault.toml", PRIVATE),
        ],
        &keys,
    )
    .await
}

#[tokio::test]
async fn tools_are_the_agents_a_caller_may_use_and_a_call_is_a_task() {
    let gw = gateway().await;
    for mode in ["auto", "legacy"] {
        // Anonymous: the public agents; with the key, the private one too.
        let listed = client(&gw, None, mode, &["list"]).await;
        let names: Vec<&str> = listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(names, ["echo", "greet"], "{mode}: {listed}");
        let echo = &listed["tools"][0];
        assert_eq!(
            echo["inputSchema"]["required"],
            json!(["message"]),
            "{echo}"
        );
        assert!(
            echo["description"].as_str().unwrap().contains("echo"),
            "{echo}"
        );
        let keyed = client(&gw, Some("ops-key"), mode, &["list"]).await;
        assert_eq!(
            keyed["tools"].as_array().unwrap().len(),
            3,
            "{mode}: {keyed}"
        );

        // A call: the agent's artifact as text, the task and its conversation in _meta.
        let called = client(&gw, None, mode, &["call", "echo", "hello tools"]).await;
        let result = &called["result"];
        assert_eq!(result["isError"], false, "{mode}: {called}");
        assert_eq!(text_of(result), "hello tools", "{mode}: {called}");
        let task = result["_meta"]["a2a-gateway/taskId"].as_str().unwrap();
        assert_eq!(result["_meta"]["a2a-gateway/state"], "completed");
        // The task is the caller's A2A task, readable over A2A.
        let got = gw
            .call("/a2a/agents/echo", D::V10, "GetTask", json!({"id": task}))
            .await;
        assert_eq!(
            got.result()["status"]["state"],
            "TASK_STATE_COMPLETED",
            "{}",
            got.body
        );

        // Progress: the task's states and the artifact's chunks, as they come.
        let progressed = client(&gw, None, mode, &["progress", "echo", "one two three"]).await;
        let seen = progressed["progress"].as_array().unwrap();
        assert!(seen.len() >= 3, "{mode}: {progressed}");
        assert!(
            seen.iter().any(|p| p["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("working"))),
            "{progressed}"
        );
        assert_eq!(text_of(&progressed["result"]), "one two three");

        // A failed task is an error result with the agent's words.
        let failed = client(&gw, None, mode, &["call", "echo", "/fail out of coffee"]).await;
        assert_eq!(failed["result"]["isError"], true, "{failed}");
        assert!(
            text_of(&failed["result"]).contains("out of coffee"),
            "{failed}"
        );
    }
}

#[tokio::test]
async fn a_question_is_asked_through_elicitation_and_answered_on_the_same_task() {
    let gw = gateway().await;
    for mode in ["auto", "legacy"] {
        let asked = client(&gw, None, mode, &["elicit", "greet", "hello", "Ada"]).await;
        assert_eq!(
            asked["asked"].as_array().map(Vec::len),
            Some(1),
            "{mode}: {asked}"
        );
        let result = &asked["result"];
        assert_eq!(result["isError"], false, "{mode}: {asked}");
        assert!(text_of(result).contains("Ada"), "{mode}: {asked}");
        assert_eq!(result["_meta"]["a2a-gateway/state"], "completed", "{asked}");
    }
    // A client that cannot elicit (it declared no elicitation capability: in the
    // 2026-07-28 era on each request, before it in its handshake) gets no input request it
    // could not handle: the result says how to answer, with the ids to answer on.
    for mode in ["auto", "legacy"] {
        let waiting = client(&gw, None, mode, &["noelicit", "greet", "hello"]).await;
        let result = &waiting["result"];
        assert_eq!(
            result["_meta"]["a2a-gateway/state"], "input-required",
            "{mode}: {waiting}"
        );
        let task = result["_meta"]["a2a-gateway/taskId"].as_str().unwrap();
        let context = result["_meta"]["a2a-gateway/contextId"].as_str().unwrap();
        assert!(text_of(result).contains(task), "{mode}: {waiting}");
        let more = json!({"task_id": task, "context_id": context}).to_string();
        let answered = client(&gw, None, mode, &["call", "greet", "Grace", &more]).await;
        assert!(
            text_of(&answered["result"]).contains("Grace"),
            "{mode}: {answered}"
        );
    }
    // Anonymous calls that succeed are no authentication failures, although an agent
    // (vault) requires credentials.
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("a2a_auth_failures_total{kind=\"missing\"} 0"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("auth_failures"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn refusals_are_precise_and_a_session_is_its_openers() {
    let gw = gateway().await;
    // A tool the caller may not use does not exist for it; arguments are checked.
    let post = |body: Value, key: Option<&'static str>, session: Option<String>| {
        raw_post(&gw, &body, key, session.as_deref())
    };
    let session = raw_session(&gw, Some("ops-key")).await;
    // Another caller (anonymous) with that session id: no such session.
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let stolen = post(list.clone(), None, Some(session.clone()))
        .await
        .unwrap();
    assert_eq!(stolen.status(), 404);
    // A wrong key: refused at the door, as on the A2A endpoints.
    let wrong = post(initialize(), Some("wrong-key"), None).await.unwrap();
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers().contains_key("www-authenticate"));
    let body: Value = wrong.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32041, "{body}");

    let call = |args: Value| {
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "echo", "arguments": args}})
    };
    let read = |text: String| -> Value {
        let data = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .next_back()
            .map(str::to_owned)
            .unwrap_or(text);
        serde_json::from_str(&data).unwrap_or(Value::Null)
    };
    for (args, why) in [
        (json!({}), "message"),
        (json!({"message": "hi", "colour": "red"}), "colour"),
        (json!({"message": 7}), "string"),
    ] {
        let r = post(call(args), Some("ops-key"), Some(session.clone()))
            .await
            .unwrap();
        let answer = read(r.text().await.unwrap());
        assert_eq!(answer["error"]["code"], -32602, "{answer}");
        assert!(
            answer["error"]["message"].as_str().unwrap().contains(why),
            "{answer}"
        );
    }
    let unknown = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                         "params": {"name": "nope", "arguments": {"message": "hi"}}});
    let r = post(unknown, Some("ops-key"), Some(session.clone()))
        .await
        .unwrap();
    let answer = read(r.text().await.unwrap());
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    // Arguments past the body limit: refused before rmcp reads them.
    let huge = call(json!({"message": "x".repeat(12 << 20)}));
    let r = post(huge, Some("ops-key"), Some(session.clone()))
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // The private agent, to an anonymous MCP client: an unknown tool.
    let anonymous = client(&gw, None, "legacy", &["list"]).await;
    assert!(!anonymous.to_string().contains("vault"), "{anonymous}");
    // The gateway is healthy after all of it.
    assert_eq!(gw.get_json("/a2a/health").await["status"], "ok");
}

#[tokio::test]
async fn a_canceled_call_cancels_its_task() {
    let gw = gateway().await;
    let gave_up = client(
        &gw,
        None,
        "legacy",
        &["cancel", "echo", "/delay 30 slow", "1.5"],
    )
    .await;
    assert!(
        gave_up["outcome"].as_str().unwrap().starts_with("gave up"),
        "{gave_up}"
    );
    // The task the call made is canceled.
    let mut state = Value::Null;
    for _ in 0..50 {
        let listed = gw
            .call("/a2a/agents/echo", D::V10, "ListTasks", json!({}))
            .await;
        state = listed.result()["tasks"][0]["status"]["state"].clone();
        if state == "TASK_STATE_CANCELED" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(state, "TASK_STATE_CANCELED");
}

/// Canceled calls and clients that leave are ordinary events: the gateway's log (the
/// binary's, JSON) has no error for them, in either protocol era.
#[tokio::test]
async fn ordinary_cancels_log_no_errors() {
    let gw = crate::running::Running::start(&[("echo.toml", ECHO)], "", "info");
    gw.wait_for_agents(&["echo"]).await;
    for mode in ["auto", "legacy"] {
        let url = gw.url("/mcp");
        let gave_up = client_at(&url, None, mode, &["cancel", "echo", "/delay 5 slow", "1"]).await;
        assert!(
            gave_up["outcome"].as_str().unwrap().starts_with("gave up"),
            "{gave_up}"
        );
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let errors: Vec<Value> = (gw.log_lines().into_iter())
        .filter(|l| l["level"] == "ERROR")
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

#[tokio::test]
async fn upstream_and_llm_agents_answer_as_tools_counted_as_mcp_calls() {
    let upstream = crate::peers::python_agent_with("1.0", &[]).await;
    let llm = crate::openai::StandIn::start().await;
    crate::openai::set_key();
    let gw = spawn_with(
        &[
            (
                "up.toml",
                &crate::peers::upstream_agent("up", &upstream.url(), ""),
            ),
            (
                "assistant.toml",
                &crate::openai::agent("assistant", &llm.base_url, ""),
            ),
        ],
        "",
    )
    .await;
    let relayed = client(&gw, None, "auto", &["call", "up", "through the gateway"]).await;
    assert_eq!(relayed["result"]["isError"], false, "{relayed}");
    assert!(
        text_of(&relayed["result"]).contains("through the gateway"),
        "{relayed}"
    );
    let asked = client(&gw, None, "auto", &["call", "assistant", "what is A2A?"]).await;
    assert_eq!(asked["result"]["isError"], false, "{asked}");
    assert!(
        text_of(&asked["result"]).contains("echo: what is A2A?"),
        "{asked}"
    );
    let metrics = gw.metrics().await;
    for agent in ["up", "assistant"] {
        let line = format!(
            "a2a_requests_total{{agent=\"{agent}\",binding=\"mcp\",dialect=\"1.0\",method=\"SendStreamingMessage\",outcome=\"ok\"}} 1"
        );
        assert!(metrics.contains(&line), "{line} not in\n{metrics}");
    }
}

/// A reload that adds an agent: a session with the server's stream open hears that the
/// tools changed, and lists the new one.
#[test]
fn a_reload_tells_sessions_the_tools_changed() {
    use std::io::BufRead as _;
    let gw = crate::running::Running::start(&[("echo.toml", ECHO)], "", "info");
    let mut child = Command::new(mcp_python())
        .arg(repo_root().join("tests/interop/mcp_client.py"))
        .arg(gw.url("/mcp"))
        .args(["watch", "30", "--mode", "legacy"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("mcp_client.py");
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    let first = lines.next();
    assert_eq!(first.and_then(Result::ok).as_deref(), Some("listening"));
    let other = ECHO.replace("name = \"echo\"", "name = \"second\"");
    std::fs::write(gw.agents.join("second.toml"), other).unwrap();
    gw.signal("HUP");
    let last = lines.map_while(Result::ok).last().unwrap_or_default();
    let _ = child.wait();
    let watched: Value = serde_json::from_str(&last).unwrap_or(Value::Null);
    assert_eq!(watched["before"], json!(["echo"]), "{last}");
    assert_eq!(watched["notified"], true, "{last}");
    assert_eq!(watched["after"], json!(["echo", "second"]), "{last}");
}

/// The MCP Inspector's command-line mode (npm), as users check a server with it.
#[tokio::test]
async fn the_mcp_inspector_lists_and_calls_the_tools() {
    let gw = gateway().await;
    let inspector = crate::helpers::provided_by("scripts/mcp-node.sh", "install the MCP Inspector");
    let url = gw.url("/mcp");
    // Its catalog (it keeps one) in a directory of this test's own, not the user's home.
    let catalog = tempfile::tempdir().unwrap();
    let catalog_file = catalog.path().join("mcp.json");
    let run = move |args: Vec<String>| {
        let out = Command::new(&inspector)
            .env("MCP_CATALOG_PATH", &catalog_file)
            .arg("--cli")
            .arg(&url)
            .args(&args)
            .output()
            .expect("mcp-inspector");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "mcp-inspector {args:?}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str::<Value>(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    };
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (list, keyed, call) = tokio::task::spawn_blocking(move || {
        let list = run(args(&["--method", "tools/list"]));
        let keyed = run(args(&[
            "--method",
            "tools/list",
            "--header",
            "X-API-Key: ops-key",
        ]));
        let call = run(args(&[
            "--method",
            "tools/call",
            "--tool-name",
            "echo",
            "--tool-arg",
            "message=hello inspector",
        ]));
        (list, keyed, call)
    })
    .await
    .unwrap();
    let names = |v: &Value| -> Vec<String> {
        v["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str().map(String::from))
            .collect()
    };
    assert_eq!(names(&list), ["echo", "greet"], "{list}");
    assert_eq!(names(&keyed), ["echo", "greet", "vault"], "{keyed}");
    assert_eq!(text_of(&call), "hello inspector", "{call}");
    assert_eq!(call["_meta"]["a2a-gateway/state"], "completed", "{call}");
}

/// `a2a-gateway mcp --url …`, launched by the SDK's client as a stdio server: the tools the
/// key may use, a call with its progress, and greet's question answered through the
/// client's elicitation, in both protocol eras.
#[tokio::test]
async fn the_stdio_bridge_relays_to_a_running_gateway() {
    let gw = gateway().await;
    let bin = env!("CARGO_BIN_EXE_a2a-gateway");
    for mode in ["auto", "legacy"] {
        let out = client(&gw, Some("ops-key"), mode, &["stdio", bin]).await;
        assert_eq!(
            out["tools"],
            json!(["echo", "greet", "vault"]),
            "{mode}: {out}"
        );
        assert_eq!(text_of(&out["result"]), "over stdio", "{mode}: {out}");
        let progress = out["progress"].as_array().unwrap();
        assert!(progress.iter().any(|p| p == "completed"), "{mode}: {out}");
        assert_eq!(out["asked"], json!(["What is your name?"]), "{mode}: {out}");
        assert!(text_of(&out["greeted"]).contains("Ada"), "{mode}: {out}");
    }
}

/// `[mcp] tools = "skills"` in an agent file: a tool per skill, and the message says which.
#[tokio::test]
async fn an_agent_may_show_as_one_tool_per_skill() {
    let multi = "name = \"multi\"\ndescription = \"Two things\"\n\
        [[skills]]\nid = \"upper\"\nname = \"Upper\"\ndescription = \"Shouts\"\n\
        [[skills]]\nid = \"lower\"\nname = \"Lower\"\ndescription = \"Whispers\"\n\
        [backend]\nkind = \"echo\"\n[mcp]\ntools = \"skills\"\n";
    let gw = spawn_with(&[("echo.toml", ECHO), ("multi.toml", multi)], "").await;
    let listed = client(&gw, None, "auto", &["list"]).await;
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["echo", "multi.upper", "multi.lower"], "{listed}");
    let lower = &listed["tools"][2];
    assert!(
        lower["description"]
            .as_str()
            .unwrap()
            .starts_with("Lower: Whispers"),
        "{lower}"
    );
    let called = client(&gw, None, "auto", &["call", "multi.lower", "psst"]).await;
    let task = called["result"]["_meta"]["a2a-gateway/taskId"]
        .as_str()
        .unwrap();
    let got = gw
        .call(
            "/a2a/agents/multi",
            D::V10,
            "GetTask",
            json!({"id": task, "historyLength": 10}),
        )
        .await;
    let history = &got.result()["history"];
    assert_eq!(
        history[0]["metadata"]["a2a-gateway/skill"], "lower",
        "{}",
        got.body
    );
}

/// The state of echo's only task, once it is not working any more (or after 6 s).
async fn settled_state(gw: &TestGateway) -> Value {
    let mut state = Value::Null;
    for _ in 0..60 {
        let listed = gw
            .call("/a2a/agents/echo", D::V10, "ListTasks", json!({}))
            .await;
        state = listed.result()["tasks"][0]["status"]["state"].clone();
        if state != "TASK_STATE_WORKING" && state != "TASK_STATE_SUBMITTED" && !state.is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    state
}

/// A client that goes away mid-call (its request dropped, no cancel sent): its task is
/// canceled, as the stdio bridge does when its client leaves; with
/// `cancel_abandoned_calls = false` it is left to finish. The gateway goes on serving.
#[tokio::test]
async fn a_call_whose_client_goes_away_cancels_its_task_unless_configured_not_to() {
    for (config, expected) in [
        ("", "TASK_STATE_CANCELED"),
        (
            "[mcp]\ncancel_abandoned_calls = false\n",
            "TASK_STATE_COMPLETED",
        ),
    ] {
        let gw = spawn_with(&[("echo.toml", ECHO)], config).await;
        let session = raw_session(&gw, None).await;
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": "/delay 2 still here"}}});
        let answering = raw_post(&gw, &call, None, Some(&session)).await.unwrap();
        assert_eq!(answering.status(), 200);
        // The task is running before the client leaves.
        let mut running = 0;
        for _ in 0..50 {
            let listed = gw
                .call("/a2a/agents/echo", D::V10, "ListTasks", json!({}))
                .await;
            running = listed.result()["tasks"].as_array().map_or(0, Vec::len);
            if running == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(running, 1, "the call's task never started");
        drop(answering);
        assert_eq!(settled_state(&gw).await, expected, "with {config:?}");
        assert_eq!(gw.get_json("/a2a/health").await["status"], "ok");
    }
}

/// A browser MCP client on an allowed origin: its preflight (DELETE, the MCP headers) is
/// answered, and the session id it needs is exposed.
#[tokio::test]
async fn a_browser_client_on_an_allowed_origin_may_use_mcp() {
    let gw = spawn_with(
        &[("echo.toml", ECHO)],
        "[cors]\nallowed_origins = [\"https://app.example\"]\n",
    )
    .await;
    let preflight = gw
        .client
        .request(reqwest::Method::OPTIONS, gw.url("/mcp"))
        .header("Origin", "https://app.example")
        .header("Access-Control-Request-Method", "DELETE")
        .header(
            "Access-Control-Request-Headers",
            "content-type, mcp-session-id, mcp-protocol-version",
        )
        .send()
        .await
        .unwrap();
    assert!(preflight.status().is_success(), "{}", preflight.status());
    let allowed = |name: &str| {
        preflight.headers()[name]
            .to_str()
            .unwrap()
            .to_ascii_lowercase()
    };
    assert!(allowed("access-control-allow-methods").contains("delete"));
    let headers = allowed("access-control-allow-headers");
    for h in ["mcp-session-id", "mcp-protocol-version"] {
        assert!(headers.contains(h), "{headers}");
    }
    let opened = gw
        .client
        .post(gw.url("/mcp"))
        .header("Origin", "https://app.example")
        .header("accept", "application/json, text/event-stream")
        .json(&initialize())
        .send()
        .await
        .unwrap();
    let exposed = opened.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(exposed.contains("mcp-session-id"), "{exposed}");
    assert!(opened.headers().contains_key("mcp-session-id"));
}

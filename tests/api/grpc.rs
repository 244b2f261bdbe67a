//! The gRPC binding, over real HTTP/2: the official Python SDK's gRPC client through the
//! gateway, raw calls (grpcio with the SDK's message classes, tests/interop/grpc_probe.py)
//! for every error class, tasks made on one binding and read on another, and refusals that
//! read the same on every binding.

use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::helpers::{
    inner, kind, repo_root, rpc, sha, spawn_with_grpc, TestGateway, D, ECHO, OTHER,
};
use crate::interop::{python, run_sdk_client};
use crate::peers::{
    fault_server_with, python_agent, python_agent_with, sdk03_agent_with, upstream_agent,
};

/// Runs `calls` (see grpc_probe.py) in order on one channel to the gateway's gRPC port.
pub(crate) async fn probe(gw: &TestGateway, calls: Value) -> Vec<Value> {
    probe_over(gw, calls, &[]).await
}

/// [`probe`], over TLS when `tls` names files: the CA trusted (alone), then a client
/// certificate and its key.
pub(crate) async fn probe_over(
    gw: &TestGateway,
    calls: Value,
    tls: &[&std::path::Path],
) -> Vec<Value> {
    let target = gw.grpc.clone().expect("the gateway serves gRPC");
    let script = repo_root().join("tests/interop/grpc_probe.py");
    let python = python();
    let tls: Vec<_> = tls.iter().map(|p| p.to_path_buf()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(python)
            .arg(script)
            .arg(target)
            .args(tls)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running grpc_probe.py");
        let stdin = child.stdin.take().expect("stdin");
        serde_json::to_writer(stdin, &calls).expect("writing the calls");
        child.wait_with_output().expect("grpc_probe.py output")
    })
    .await
    .expect("probe thread");
    assert!(
        out.status.success(),
        "grpc_probe.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("grpc_probe.py prints JSON")
}

/// One call's outcome.
pub(crate) async fn probe_one(gw: &TestGateway, call: Value) -> Value {
    probe(gw, json!([call])).await.remove(0)
}

/// A POST on the HTTP+JSON binding, in 1.0; its JSON answer.
async fn rest_post(gw: &TestGateway, path: &str, body: Value) -> Value {
    let response = gw
        .client
        .post(gw.url(path))
        .header("content-type", "application/a2a+json")
        .header("A2A-Version", "1.0")
        .body(body.to_string())
        .send()
        .await
        .expect("request");
    response.json().await.expect("a JSON answer")
}

pub(crate) fn message(text: &str) -> Value {
    D::V10.message(text)
}

/// The ErrorInfo reason of a refused call.
fn reason(outcome: &Value) -> &str {
    outcome["error_info"]["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("no ErrorInfo: {outcome}"))
}

/// A metadata entry of an answer, initial or trailing (a refusal is trailers-only).
fn meta<'a>(outcome: &'a Value, key: &str) -> &'a Value {
    match &outcome["trailing"][key] {
        Value::Null => &outcome["initial"][key],
        found => found,
    }
}

fn expect_refused(outcome: &Value, code: &str, why: &str) {
    assert_eq!(outcome["code"], code, "{outcome}");
    assert_eq!(reason(outcome), why, "{outcome}");
}

async fn echo_gateway(extra: &str) -> TestGateway {
    spawn_with_grpc(&[("echo.toml", ECHO), ("other.toml", OTHER)], extra).await
}

#[tokio::test]
async fn cards_list_the_grpc_interface_with_the_agent_as_tenant() {
    let gw = echo_gateway("default_agent = \"echo\"").await;
    let target = gw.grpc.clone().unwrap();
    let card = gw.get_json("/a2a/agents/echo/card").await;
    let grpc: Vec<&Value> = card["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["protocolBinding"] == "GRPC")
        .collect();
    assert_eq!(grpc.len(), 1, "{card}");
    assert_eq!(grpc[0]["url"], target.as_str());
    assert_eq!(grpc[0]["tenant"], "echo");
    assert_eq!(grpc[0]["protocolVersion"], "1.0");
    let aggregated = gw.get_json("/.well-known/agent-card.json").await;
    let shared = aggregated["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["protocolBinding"] == "GRPC")
        .unwrap_or_else(|| panic!("{aggregated}"));
    assert_eq!(shared["url"], target.as_str());
    assert!(
        shared.get("tenant").is_none(),
        "the shared endpoint routes: {shared}"
    );
    // `host:port`, as the spec's proto and the official SDKs write a gRPC address (their
    // clients hand the URL to gRPC as it is: a scheme would not resolve).
    assert!(!target.contains("://"), "{target}");

    // Left out of the cards for clients that check every URL as an HTTP one.
    let (dir, agents, gateway) = crate::helpers::write_config(
        &[("echo.toml", ECHO)],
        Some("[server]\nport = 0\nworkers = 1\ngrpc_port = 0\ngrpc_in_cards = false\n"),
    );
    let settings = a2a_gateway::config::load(gateway.as_deref(), &agents).unwrap();
    let unlisted = crate::helpers::start(settings, dir).await;
    for path in ["/a2a/agents/echo/card", "/.well-known/agent-card.json"] {
        let card = unlisted.get_json(path).await;
        let bindings: Vec<&Value> = card["supportedInterfaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| &i["protocolBinding"])
            .collect();
        assert!(!bindings.contains(&&json!("GRPC")), "{path}: {card}");
        assert!(bindings.contains(&&json!("JSONRPC")), "{path}: {card}");
    }
}

#[tokio::test]
async fn the_python_sdk_grpc_client_against_the_echo_agent() {
    let gw = echo_gateway("").await;
    let flags = ["--binding", "grpc"];
    run_sdk_client(
        &gw,
        "/a2a/agents/echo/card",
        "echo",
        "python",
        "1.0",
        &flags,
    )
    .await;
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains(r#"binding="grpc""#) && metrics.contains(r#"method="SendMessage""#),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_python_sdk_grpc_client_against_an_upstream_json_rpc_agent() {
    let peer = python_agent("1.0", 0).await;
    let agent = upstream_agent("reference", &peer.url(), "");
    let gw = spawn_with_grpc(&[("reference.toml", &agent)], "").await;
    let flags = ["--binding", "grpc", "--expect-name", "reference"];
    run_sdk_client(
        &gw,
        "/a2a/agents/reference/card",
        "reference",
        "python",
        "1.0",
        &flags,
    )
    .await;
}

/// The official SDK's agent served over gRPC only, behind the gateway: its SDK clients
/// over JSON-RPC in both dialects and over gRPC, and the HTTP+JSON binding.
#[tokio::test]
async fn a_grpc_only_sdk_agent_is_served_on_every_binding_in_both_dialects() {
    let peer = python_agent_with("1.0", &["--grpc"]).await;
    let agent = upstream_agent("grpcpeer", &peer.url(), "");
    let gw = spawn_with_grpc(&[("grpcpeer.toml", &agent)], "").await;
    let card = gw.get_json("/a2a/agents/grpcpeer/card").await;
    assert_eq!(card["name"], "grpcpeer", "{card}");
    for (dialect, binding) in [("1.0", "jsonrpc"), ("0.3", "jsonrpc"), ("1.0", "grpc")] {
        let flags = ["--binding", binding];
        run_sdk_client(
            &gw,
            "/a2a/agents/grpcpeer/card",
            "grpcpeer",
            "python",
            dialect,
            &flags,
        )
        .await;
    }
    let body = json!({"message": message("over rest")});
    let sent = rest_post(&gw, "/a2a/agents/grpcpeer/rest/message:send", body).await;
    assert_eq!(
        sent["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{sent}"
    );
    assert!(
        sent["task"]["artifacts"].to_string().contains("over rest"),
        "{sent}"
    );
    // The upstream's own errors come back as what they are.
    let params = json!({"id": "no-such-task"});
    let missing = gw
        .call("/a2a/agents/grpcpeer", D::V10, "GetTask", params)
        .await;
    assert_eq!(missing.code(), -32001, "{}", missing.body);
    let metrics = gw.metrics().await;
    assert!(metrics.contains("a2a_upstream"), "{metrics}");
}

/// The official SDK's last 0.3 release (a2a-sdk 0.3.x) serving 0.3's gRPC binding only
/// (package `a2a.v1`), behind the gateway: sends, streams, questions, reads and lists in
/// both JSON-RPC dialects, over HTTP+JSON and over the gateway's own gRPC; the errors it
/// names in its status messages come back as what they are.
#[tokio::test]
async fn a_0_3_grpc_only_sdk_agent_is_served_on_every_binding_in_both_dialects() {
    let peer = sdk03_agent_with(&["--grpc"]).await;
    let agent = upstream_agent("grpc03", &peer.url(), "");
    let gw = spawn_with_grpc(&[("grpc03.toml", &agent)], "").await;
    let path = "/a2a/agents/grpc03";
    let card = gw.get_json("/a2a/agents/grpc03/card").await;
    assert_eq!(card["capabilities"]["streaming"], true, "{card}");
    let mut made = Vec::new();
    for d in [D::V10, D::V03] {
        let params = json!({"message": d.message("hello over 0.3 grpc")});
        let sent = gw.call(path, d, d.send(), params).await;
        let task = d.task_of(sent.result());
        assert_eq!(task["status"]["state"], d.state("completed"), "{task}");
        let text = task["artifacts"][0]["parts"][0]["text"].clone();
        assert_eq!(text, "hello over 0.3 grpc", "{task}");
        made.push(task["id"].as_str().unwrap().to_string());

        let params = json!({"message": d.message("streamed")});
        let events = gw.sse(path, d, d.stream(), params).await;
        let kinds: Vec<String> = events.iter().map(|e| kind(d, &e.data["result"])).collect();
        assert_eq!(kinds.first().map(String::as_str), Some("task"), "{kinds:?}");
        let last = inner(d, &events.last().unwrap().data["result"]);
        assert_eq!(last["status"]["state"], d.state("completed"), "{kinds:?}");
        assert!(kinds.contains(&"artifact-update".to_string()), "{kinds:?}");
        if d == D::V03 {
            assert_eq!(last["final"], true, "{last}");
        }

        // A question, and its answer on the same task.
        let params = json!({"message": d.message("/input your name?")});
        let asked = d.task_of(gw.call(path, d, d.send(), params).await.result());
        assert_eq!(
            asked["status"]["state"],
            d.state("input-required"),
            "{asked}"
        );
        let question = &asked["status"]["message"]["parts"][0]["text"];
        assert_eq!(question, "your name?", "{asked}");
        let mut answer = d.message("Ada");
        answer["taskId"] = asked["id"].clone();
        answer["contextId"] = asked["contextId"].clone();
        let done = gw.call(path, d, d.send(), json!({"message": answer})).await;
        let done = d.task_of(done.result());
        assert_eq!(done["id"], asked["id"], "{done}");
        assert_eq!(done["status"]["state"], d.state("completed"), "{done}");

        let read = gw.call(path, d, d.get(), json!({"id": made.last()})).await;
        assert_eq!(read.result()["status"]["state"], d.state("completed"));
        // Its own errors, named in its status messages, as what they are.
        let missing = gw
            .call(path, d, d.get(), json!({"id": "grpc03.no-such-task"}))
            .await;
        assert_eq!(missing.code(), -32001, "{}", missing.body);
        let finished = json!({"id": made.last()});
        let refused = gw.call(path, d, d.cancel(), finished).await;
        assert_eq!(refused.code(), -32002, "{}", refused.body);
    }
    // 0.3 has no ListTasks: the gateway's ledger of the tasks it relayed answers.
    let listed = gw.call(path, D::V10, "ListTasks", json!({})).await;
    let listed = listed.result()["tasks"].to_string();
    assert!(made.iter().all(|id| listed.contains(id)), "{listed}");
    let body = json!({"message": message("over rest")});
    let sent = rest_post(&gw, "/a2a/agents/grpc03/rest/message:send", body).await;
    assert_eq!(
        sent["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{sent}"
    );
    let out = probe(
        &gw,
        json!([
            {"method": "SendMessage", "request": {"tenant": "grpc03", "message": message("over grpc")}},
            {"method": "GetTask", "request": {"tenant": "grpc03", "id": "grpc03.none"}},
        ]),
    )
    .await;
    let task = &out[0]["response"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_COMPLETED",
        "{}",
        out[0]
    );
    assert!(
        task["artifacts"].to_string().contains("over grpc"),
        "{task}"
    );
    expect_refused(&out[1], "NOT_FOUND", "TASK_NOT_FOUND");
}

/// A gRPC caller's trace context (`traceparent`, `tracestate` metadata) reaches the
/// upstream as it does from the JSON bindings: a child of the caller's span.
#[tokio::test]
async fn a_grpc_callers_trace_context_reaches_the_upstream() {
    let log = tempfile::tempdir().unwrap();
    let seen = log.path().join("seen.jsonl");
    let args = ["--log-requests", seen.to_str().unwrap()];
    let upstream = fault_server_with("extended", 0, &args).await;
    let agent = upstream_agent("up", &upstream.url(), "");
    let gw = spawn_with_grpc(&[("up.toml", &agent)], "").await;
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let metadata = json!({"traceparent": trace, "tracestate": "vendor=abc"});
    let sent = probe_one(
        &gw,
        json!({"method": "SendMessage", "metadata": metadata,
               "request": {"tenant": "up", "message": message("traced")}}),
    )
    .await;
    assert_eq!(sent["code"], "OK", "{sent}");
    let post = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["method"] == "POST")
        .expect("the upstream was called");
    let parent = post["headers"]["traceparent"].as_str().unwrap_or_default();
    assert!(
        parent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && parent.ends_with("-01"),
        "{post}"
    );
    assert_ne!(&parent[36..52], "00f067aa0ba902b7", "{post}");
    assert_eq!(post["headers"]["tracestate"], "vendor=abc", "{post}");
}

#[tokio::test]
async fn a_command_agent_over_grpc_answers_and_streams() {
    let script = repo_root().join("agents.d/scripts/shout.py");
    let shout = format!(
        "name = \"shout\"\ndescription = \"test\"\n[backend]\nkind = \"command\"\nio = \"text\"\ncommand = [\"python3\", {:?}]\n",
        script.display().to_string()
    );
    let gw = spawn_with_grpc(&[("shout.toml", &shout)], "").await;
    let out = probe(
        &gw,
        json!([
            {"method": "SendMessage", "request": {"tenant": "shout", "message": message("hello grpc")}},
            {"method": "SendStreamingMessage", "request": {"tenant": "shout", "message": message("one\ntwo")}},
        ]),
    )
    .await;
    assert_eq!(out[0]["code"], "OK", "{}", out[0]);
    let task = &out[0]["response"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let text = task["artifacts"].to_string();
    assert!(text.contains("HELLO GRPC"), "{task}");
    assert_eq!(meta(&out[0], "a2a-gateway-agent"), "shout");
    assert_eq!(out[1]["code"], "OK", "{}", out[1]);
    let events = out[1]["responses"].as_array().unwrap();
    assert!(
        events[0].get("task").is_some(),
        "the task first: {events:?}"
    );
    let last = events.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{events:?}"
    );
    let streamed = out[1]["responses"].to_string();
    assert!(
        streamed.contains("ONE") && streamed.contains("TWO"),
        "{streamed}"
    );
}

#[tokio::test]
async fn every_error_class_has_its_status_and_the_gateway_stays_healthy() {
    let gw = echo_gateway("[limits]\nmax_body_bytes = 4096").await;
    let done = probe_one(
        &gw,
        json!({"method": "SendMessage", "request": {"tenant": "echo", "message": message("done")}}),
    )
    .await;
    let done_id = done["response"]["task"]["id"].as_str().unwrap().to_string();
    let big = "x".repeat(10_000);
    let out = probe(
        &gw,
        json!([
            // 0: a method the service does not have.
            {"method": "Nope", "raw": ""},
            // 1: bytes that are no protobuf message.
            {"method": "SendMessage", "raw": "ffffffff0f"},
            // 2: an unknown task.
            {"method": "GetTask", "request": {"tenant": "echo", "id": "no-such-task"}},
            // 3: a finished task cannot be canceled.
            {"method": "CancelTask", "request": {"tenant": "echo", "id": done_id}},
            // 4: an agent that does not exist.
            {"method": "SendMessage", "request": {"tenant": "nobody", "message": message("x")}},
            // 5: a message over the body limit.
            {"method": "SendMessage", "request": {"tenant": "echo", "message": message(&big)}},
            // 6: a dialect this binding does not speak.
            {"method": "GetTask", "request": {"tenant": "echo", "id": "t"}, "metadata": {"a2a-version": "0.3"}},
            // 7: push is off.
            {"method": "ListTaskPushNotificationConfigs", "request": {"tenant": "echo", "taskId": done_id}},
            // 8: no extended card.
            {"method": "GetExtendedAgentCard", "request": {"tenant": "echo"}},
            // 9: a version nobody speaks.
            {"method": "GetTask", "request": {"tenant": "echo", "id": "t"}, "metadata": {"a2a-version": "9.9"}},
            // 10: a task that is not there, streamed.
            {"method": "SubscribeToTask", "request": {"tenant": "echo", "id": "no-such-task"}},
            // 11: still healthy.
            {"method": "SendMessage", "request": {"tenant": "echo", "message": message("still here")}},
        ]),
    )
    .await;
    assert_eq!(out[0]["code"], "UNIMPLEMENTED", "{}", out[0]);
    expect_refused(&out[1], "INVALID_ARGUMENT", "PARSE_ERROR");
    expect_refused(&out[2], "NOT_FOUND", "TASK_NOT_FOUND");
    assert_eq!(out[2]["error_info"]["metadata"]["taskId"], "no-such-task");
    expect_refused(&out[3], "FAILED_PRECONDITION", "TASK_NOT_CANCELABLE");
    expect_refused(&out[4], "NOT_FOUND", "AGENT_NOT_FOUND");
    expect_refused(&out[5], "RESOURCE_EXHAUSTED", "PAYLOAD_TOO_LARGE");
    expect_refused(&out[6], "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED");
    expect_refused(
        &out[7],
        "FAILED_PRECONDITION",
        "PUSH_NOTIFICATION_NOT_SUPPORTED",
    );
    expect_refused(&out[8], "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION");
    expect_refused(&out[9], "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED");
    expect_refused(&out[10], "NOT_FOUND", "TASK_NOT_FOUND");
    assert_eq!(out[11]["code"], "OK", "{}", out[11]);
    let health = gw.get_json("/a2a/health").await;
    assert_eq!(health["status"], "ok", "{health}");
}

#[tokio::test]
async fn deadlines_end_calls_and_streams_and_hold_nothing() {
    let gw = echo_gateway("").await;
    let out = probe(
        &gw,
        json!([
            // The client's deadline travels as grpc-timeout; the call is dropped at it.
            {"method": "SendMessage", "request": {"tenant": "echo", "message": message("/delay 5 slow")}, "timeout": 0.5},
            {"method": "SendStreamingMessage", "request": {"tenant": "echo", "message": message("/delay 5 slow")}, "timeout": 0.5},
            // A stream its client leaves after the first event.
            {"method": "SendStreamingMessage", "request": {"tenant": "echo", "message": message("/delay 5 left")}, "take": 1},
        ]),
    )
    .await;
    assert_eq!(out[0]["code"], "DEADLINE_EXCEEDED", "{}", out[0]);
    assert_eq!(out[1]["code"], "DEADLINE_EXCEEDED", "{}", out[1]);
    assert_eq!(
        out[2]["responses"].as_array().unwrap().len(),
        1,
        "{}",
        out[2]
    );
    // Nothing is held for the calls that ended: no stream stays open.
    let mut open = String::new();
    for _ in 0..50 {
        let metrics = gw.metrics().await;
        open = metrics
            .lines()
            .filter(|l| l.starts_with("a2a_open_streams"))
            .map(str::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        if open.lines().all(|l| l.ends_with(" 0")) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("streams still open after their clients left:\n{open}");
}

#[tokio::test]
async fn a_task_made_on_one_binding_is_read_watched_and_canceled_on_another() {
    let gw = echo_gateway("default_agent = \"echo\"").await;
    // Made over JSON-RPC, watched over gRPC until it completes.
    let made = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": message("/delay 1 watched"), "configuration": {"returnImmediately": true}}),
        )
        .await;
    let watched = made.result()["task"]["id"].as_str().unwrap().to_string();
    // Made over REST, to be canceled over gRPC.
    let body = json!({"message": message("/delay 30 canceled"), "configuration": {"returnImmediately": true}});
    let rest = rest_post(&gw, "/a2a/agents/echo/rest/message:send", body).await;
    let canceled = rest["task"]["id"].as_str().unwrap().to_string();
    let out = probe(
        &gw,
        json!([
            {"method": "SubscribeToTask", "request": {"tenant": "echo", "id": watched}},
            {"method": "GetTask", "request": {"tenant": "echo", "id": watched}},
            {"method": "CancelTask", "request": {"tenant": "echo", "id": canceled}},
            // No tenant: routed by the task, as /a2a routes it.
            {"method": "GetTask", "request": {"id": canceled}},
            {"method": "ListTasks", "request": {"tenant": "echo"}},
        ]),
    )
    .await;
    let events = out[0]["responses"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", out[0]));
    assert_eq!(events[0]["task"]["id"], watched.as_str(), "{events:?}");
    let last = events.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{events:?}"
    );
    assert_eq!(
        out[1]["response"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    assert_eq!(
        out[2]["response"]["status"]["state"], "TASK_STATE_CANCELED",
        "{}",
        out[2]
    );
    assert_eq!(
        out[3]["response"]["status"]["state"], "TASK_STATE_CANCELED",
        "{}",
        out[3]
    );
    assert_eq!(meta(&out[3], "a2a-gateway-route"), "task", "{}", out[3]);
    let listed = out[4]["response"]["tasks"].to_string();
    assert!(
        listed.contains(&watched) && listed.contains(&canceled),
        "{listed}"
    );
    // Made over gRPC, read over JSON-RPC.
    let sent = probe_one(
        &gw,
        json!({"method": "SendMessage", "request": {"tenant": "echo", "message": message("from grpc")}}),
    )
    .await;
    let id = sent["response"]["task"]["id"].as_str().unwrap();
    let read = gw.get_task(D::V10, id).await;
    assert_eq!(read.result()["id"], id);
}

/// The common send (a text message to a named agent) is read and answered without the
/// descriptor; the same send with metadata goes the descriptor's way: both answer alike.
#[tokio::test]
async fn a_common_send_answers_as_one_read_by_the_descriptor() {
    let gw = echo_gateway("").await;
    let plain = message("alike");
    let mut noted = plain.clone();
    noted["metadata"] = json!({"k": "v"});
    let out = probe(
        &gw,
        json!([
            {"method": "SendMessage", "request": {"tenant": "echo", "message": plain}},
            {"method": "SendMessage", "request": {"tenant": "echo", "message": noted}},
        ]),
    )
    .await;
    let (common, other) = (&out[0]["response"]["task"], &out[1]["response"]["task"]);
    assert_eq!(
        common["status"]["state"], "TASK_STATE_COMPLETED",
        "{}",
        out[0]
    );
    for field in ["artifacts", "metadata"] {
        assert_eq!(common[field], other[field], "{field}: {common} / {other}");
    }
    assert_eq!(common["metadata"]["gateway/agent"], "echo", "{common}");
    let said = &common["history"][0];
    assert_eq!(said["parts"], other["history"][0]["parts"], "{common}");
    assert_eq!(said["role"], "ROLE_USER", "{common}");
    assert_eq!(said["taskId"], common["id"], "{common}");
    assert!(common["status"]["timestamp"].is_string(), "{common}");
    for outcome in &out {
        assert_eq!(meta(outcome, "a2a-gateway-agent"), "echo", "{outcome}");
    }
}

/// The refusal's reason on each binding: JSON-RPC, HTTP+JSON and gRPC.
async fn refusals(gw: &TestGateway, agent: &str, key: &str, stream: bool) -> [String; 3] {
    let (method, rest) = match stream {
        true => ("SendStreamingMessage", "message:stream"),
        false => ("SendMessage", "message:send"),
    };
    let params = json!({"message": message("hi")});
    let jsonrpc = gw
        .post_raw(
            &format!("/a2a/agents/{agent}"),
            &[
                ("content-type", "application/json"),
                ("A2A-Version", "1.0"),
                ("X-API-Key", key),
            ],
            rpc(method, params.clone()),
        )
        .await;
    let rest = gw
        .post_raw(
            &format!("/a2a/agents/{agent}/rest/{rest}"),
            &[
                ("content-type", "application/a2a+json"),
                ("A2A-Version", "1.0"),
                ("X-API-Key", key),
            ],
            params.to_string(),
        )
        .await;
    let grpc = probe_one(
        gw,
        json!({"method": method, "request": {"tenant": agent, "message": message("hi")},
               "metadata": {"x-api-key": key}}),
    )
    .await;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    [
        text(&jsonrpc.body["error"]["data"][0]["reason"]),
        text(&rest.body["error"]["details"][0]["reason"]),
        grpc["error_info"]["reason"]
            .as_str()
            .unwrap_or("")
            .to_string(),
    ]
}

#[tokio::test]
async fn a_refusal_reads_the_same_on_every_binding() {
    let gateway = format!(
        r#"
[auth]
default_access = "authenticated"
[[auth.api_keys]]
id = "narrow"
secret_sha256 = "{narrow}"
agents = ["echo"]
tier = "streamless"
[[auth.api_keys]]
id = "counted"
secret_sha256 = "{counted}"
tier = "one"
[rate_limits.tiers.default]
requests_per_minute = 6000
[rate_limits.tiers.streamless]
requests_per_minute = 6000
max_streams = 0
[rate_limits.tiers.one]
requests_per_minute = 1
burst = 1
"#,
        narrow = sha("narrow-key"),
        counted = sha("counted-key"),
    );
    let gw = echo_gateway(&gateway).await;
    // An agent this caller may not call.
    let denied = refusals(&gw, "other", "narrow-key", false).await;
    assert_eq!(
        denied,
        ["PERMISSION_DENIED"; 3].map(String::from),
        "{denied:?}"
    );
    // A stream beyond the caller's cap (none for this tier).
    let capped = refusals(&gw, "echo", "narrow-key", true).await;
    assert_eq!(
        capped,
        ["TOO_MANY_STREAMS"; 3].map(String::from),
        "{capped:?}"
    );
    // Past the rate limit: the first call of the three is let through, the others refused.
    let limited = refusals(&gw, "echo", "counted-key", false).await;
    assert_eq!(
        limited[1..],
        ["RATE_LIMITED"; 2].map(String::from),
        "{limited:?}"
    );
    let grpc = probe_one(
        &gw,
        json!({"method": "GetTask", "request": {"tenant": "echo", "id": "t"},
               "metadata": {"x-api-key": "counted-key"}}),
    )
    .await;
    expect_refused(&grpc, "RESOURCE_EXHAUSTED", "RATE_LIMITED");
    assert_eq!(meta(&grpc, "x-ratelimit-limit"), "1", "{grpc}");
    assert_eq!(meta(&grpc, "x-ratelimit-remaining"), "0", "{grpc}");
    assert!(meta(&grpc, "retry-after").is_string(), "{grpc}");
    // No credentials at all.
    let anonymous = probe_one(
        &gw,
        json!({"method": "SendMessage", "request": {"tenant": "echo", "message": message("hi")}}),
    )
    .await;
    expect_refused(&anonymous, "UNAUTHENTICATED", "UNAUTHENTICATED");
    assert!(
        meta(&anonymous, "www-authenticate").is_string(),
        "{anonymous}"
    );
}

/// A gRPC call whose message trickles in: it holds its bytes against the body budget while
/// it arrives, and is given up at the body deadline, as an HTTP body is.
#[tokio::test]
async fn a_slow_grpc_message_is_given_up_at_the_body_deadline() {
    use http_body_util::BodyExt;
    let gw =
        echo_gateway("[limits]\nbody_timeout_secs = 1\nbody_min_bytes_per_sec = 1048576").await;
    let target = gw.grpc.clone().unwrap();
    let stream = tokio::net::TcpStream::connect(&target).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .unwrap();
    tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel::<
        Result<hyper::body::Frame<bytes::Bytes>, std::convert::Infallible>,
    >(4);
    let body = http_body_util::StreamBody::new(tokio_stream_of(rx));
    let request = http::Request::post(format!("http://{target}/lf.a2a.v1.A2AService/SendMessage"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    // A frame that announces 4,000 bytes, and ten of them.
    let mut start = vec![0u8, 0, 0, 0x0f, 0xa0];
    start.extend_from_slice(&[0x0a; 10]);
    tx.send(Ok(hyper::body::Frame::data(bytes::Bytes::from(start))))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let answer = sender.send_request(request).await.unwrap();
    let waited = started.elapsed();
    let status = answer
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_string());
    let message = answer
        .headers()
        .get("grpc-message")
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    // DEADLINE_EXCEEDED, from the table's row for a body that did not arrive in time.
    assert_eq!(
        status.as_deref(),
        Some("4"),
        "{:?} {message}",
        answer.headers()
    );
    assert!(
        message.contains("did%20not%20arrive") || message.contains("did not arrive"),
        "{message}"
    );
    assert!(waited >= std::time::Duration::from_secs(1), "{waited:?}");
    let _ = answer.into_body().collect().await;
    drop(tx);
    let health = gw.get_json("/a2a/health").await;
    assert_eq!(health["bufferedBodyBytes"], 0, "{health}");
}

/// The receiving half of a channel as a stream (what tokio-stream's wrapper does).
fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Server reflection, as grpcio's reflection client (v1alpha) reads it: the one service the
/// port serves and every method of it, resolved without the proto files. (`buf curl`, a v1 client, is run by
/// tests/api/examples.rs.)
#[tokio::test]
async fn reflection_describes_the_service_to_a_generic_client() {
    let gw = echo_gateway("").await;
    let target = gw.grpc.clone().unwrap();
    let code = r#"
import json, sys, grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
db = ProtoReflectionDescriptorDatabase(grpc.insecure_channel(sys.argv[1]))
services = sorted(db.get_services())
service = DescriptorPool(db).FindServiceByName('lf.a2a.v1.A2AService')
print(json.dumps({'services': services, 'methods': sorted(m.name for m in service.methods),
                  'send_input': service.methods_by_name['SendMessage'].input_type.full_name}))
"#;
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .args(["-c", code, &target])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["services"], json!(["lf.a2a.v1.A2AService"]), "{seen}");
    let methods = seen["methods"].as_array().unwrap();
    assert_eq!(methods.len(), 11, "{seen}");
    assert!(methods.contains(&json!("SendMessage")) && methods.contains(&json!("SubscribeToTask")));
    assert_eq!(seen["send_input"], "lf.a2a.v1.SendMessageRequest");
}

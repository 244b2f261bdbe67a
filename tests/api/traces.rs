//! Spans over OTLP (`[telemetry] otlp_endpoint`), received by an OTLP receiver the test
//! starts (tests/interop/otlp_receiver.py, decoding each export with the OpenTelemetry
//! protocol's own Python messages): the server span of each request with its A2A
//! attributes, the upstream call as its child with the same trace at the upstream, the LLM
//! call with the GenAI attributes, push deliveries linked to the request that made the task;
//! over HTTP/protobuf and gRPC; and a collector that is away costs dropped spans (counted),
//! never a failed request.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{repo_root, sha, spawn_with, TestGateway, D, ECHO};
use crate::peers::{python_agent_with, upstream_agent};

/// The receiver's python (its own small venv).
fn otlp_python() -> PathBuf {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PathBuf::from(PATH.get_or_init(|| {
        crate::helpers::provided_by("scripts/otlp-venv.sh", "set up the OTLP receiver's venv")
    }))
}

/// The OTLP receiver, killed when dropped.
struct Receiver {
    child: Child,
    http: u16,
    grpc: u16,
    dir: tempfile::TempDir,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    async fn start(extra: &[&str]) -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let child = Command::new(otlp_python())
            .arg(repo_root().join("tests/interop/otlp_receiver.py"))
            .arg("--out")
            .arg(dir.path().join("spans.jsonl"))
            .arg("--ready-file")
            .arg(&ready)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting otlp_receiver.py");
        // Killed and waited for when dropped, ready or not.
        let mut receiver = Receiver {
            child,
            http: 0,
            grpc: 0,
            dir,
        };
        for _ in 0..400 {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                let ports: Vec<u16> = text.split(' ').filter_map(|p| p.parse().ok()).collect();
                if let [http, grpc] = ports[..] {
                    (receiver.http, receiver.grpc) = (http, grpc);
                    return receiver;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the OTLP receiver did not start");
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("spans.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a span line"))
            .collect()
    }

    /// The spans received once `done` says they are all there (10 s at most).
    async fn wait(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        for _ in 0..200 {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what}: not received; got\n{}", pretty(&self.spans()));
    }
}

fn pretty(spans: &[Value]) -> String {
    spans
        .iter()
        .map(|s| format!("{} {} {}", s["name"], s["span_id"], s["attributes"]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn named<'a>(spans: &'a [Value], name: &str, attr: (&str, &str)) -> Option<&'a Value> {
    spans
        .iter()
        .find(|s| s["name"] == name && s["attributes"][attr.0] == attr.1)
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// An HTTP server that answers 200 to everything and keeps each request's headers.
async fn webhook() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let keep = keep.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let n = s.read(&mut buf).await.unwrap_or(0);
                keep.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    (format!("http://127.0.0.1:{port}/hook"), seen)
}

#[tokio::test]
async fn spans_follow_a_request_upstream_to_the_llm_and_to_webhooks() {
    let otlp = Receiver::start(&[]).await;
    let log = tempfile::tempdir().unwrap();
    let seen = log.path().join("seen.jsonl");
    let upstream = python_agent_with("1.0", &["--log-traceparent", seen.to_str().unwrap()]).await;
    let llm = crate::openai::StandIn::start().await;
    crate::openai::set_key();
    let (hook, hooked) = webhook().await;
    let gateway = format!(
        "default_agent = \"echo\"\n\
         [[routing.rules]]\nagent = \"up\"\ntext = \"^upstream\"\n\
         [telemetry]\notlp_endpoint = \"http://127.0.0.1:{}\"\nservice_name = \"gw-under-test\"\n\
         [push]\nenabled = true\nallow_http = true\nallow = [\"127.0.0.1\"]\n\
         [[auth.api_keys]]\nid = \"tracer\"\nsecret_sha256 = \"{}\"\n",
        otlp.http,
        sha("tracer-key")
    );
    let gw = spawn_with(
        &[
            ("echo.toml", ECHO),
            ("up.toml", &upstream_agent("up", &upstream.url(), "")),
            (
                "assistant.toml",
                &crate::openai::agent("assistant", &llm.base_url, ""),
            ),
        ],
        &gateway,
    )
    .await;
    let call = |path: &str, method: &str, params: Value| {
        gw.client
            .post(gw.url(path))
            .header("A2A-Version", "1.0")
            .header("X-API-Key", "tracer-key")
            .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
    };

    // A streamed send, routed by a rule to the upstream agent.
    let streamed = call(
        "/a2a",
        "SendStreamingMessage",
        json!({"message": D::V10.message("upstream a b c")}),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(streamed.contains("TASK_STATE_COMPLETED"), "{streamed}");
    let spans = otlp
        .wait("the stream's server span and upstream span", |s| {
            named(s, "SendStreamingMessage", ("a2a.agent", "up")).is_some()
                && s.iter().any(|x| x["name"] == "upstream up")
        })
        .await;
    let server = named(&spans, "SendStreamingMessage", ("a2a.agent", "up")).unwrap();
    assert_eq!(server["trace_id"], CALLER_TRACE, "{server}");
    assert_eq!(server["parent_span_id"], CALLER_SPAN, "{server}");
    assert_eq!(server["kind"], 2, "SPAN_KIND_SERVER: {server}");
    let a = &server["attributes"];
    for (key, want) in [
        ("a2a.method", "SendStreamingMessage"),
        ("a2a.dialect", "1.0"),
        ("a2a.binding", "jsonrpc"),
        ("a2a.agent", "up"),
        ("a2a.task.state", "completed"),
        ("a2a.route", "rule-1"),
        ("enduser.id", "key:tracer"),
        ("http.request.method", "POST"),
        ("url.path", "/a2a"),
        ("url.scheme", "http"),
        ("network.protocol.version", "1.1"),
    ] {
        assert_eq!(a[key], want, "{key} in {server}");
    }
    assert_eq!(a["http.response.status_code"], 200, "{server}");
    for key in ["a2a.task.id", "a2a.context.id", "client.address"] {
        assert!(
            a[key].as_str().is_some_and(|v| !v.is_empty()),
            "{key} in {server}"
        );
    }
    assert_eq!(server["resource"]["service.name"], "gw-under-test");
    let client = spans.iter().find(|s| s["name"] == "upstream up").unwrap();
    assert_eq!(client["trace_id"], CALLER_TRACE, "{client}");
    assert_eq!(client["parent_span_id"], server["span_id"], "{client}");
    assert_eq!(client["kind"], 3, "SPAN_KIND_CLIENT: {client}");
    assert_eq!(
        client["attributes"]["server.address"], "127.0.0.1",
        "{client}"
    );
    // The upstream got the client span as its parent.
    let parents = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(
        parents.lines().next().unwrap_or_default(),
        format!(
            "00-{CALLER_TRACE}-{}-01",
            client["span_id"].as_str().unwrap()
        ),
        "{parents}"
    );

    // An A2A error on a span: its code.
    let _ = call("/a2a/agents/echo", "GetTask", json!({"id": "no-such-task"}))
        .await
        .unwrap()
        .text()
        .await;
    let spans = otlp
        .wait("the error's span", |s| {
            named(s, "GetTask", ("a2a.agent", "echo")).is_some()
        })
        .await;
    let failed = named(&spans, "GetTask", ("a2a.agent", "echo")).unwrap();
    assert_eq!(failed["attributes"]["a2a.error.code"], -32001, "{failed}");

    // A send whose task pushes to a webhook: the delivery's span has a trace of its own,
    // linked to the send's span, and the webhook gets it as its parent.
    let sent: Value = call(
        "/a2a/agents/echo",
        "SendMessage",
        json!({"message": D::V10.message("pushed"),
               "configuration": {"pushNotificationConfig": {"url": hook}}}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let task_id = sent["result"]["task"]["id"].as_str().unwrap().to_string();
    let spans = otlp
        .wait("the push delivery's span", |s| {
            s.iter().any(|x| x["name"] == "push notification")
        })
        .await;
    let send = spans
        .iter()
        .find(|s| s["name"] == "SendMessage" && s["attributes"]["a2a.task.id"] == task_id.as_str())
        .unwrap_or_else(|| panic!("the send's span:\n{}", pretty(&spans)));
    let push = spans
        .iter()
        .find(|s| s["name"] == "push notification")
        .unwrap();
    assert_eq!(
        push["attributes"]["a2a.task.id"],
        task_id.as_str(),
        "{push}"
    );
    assert_eq!(
        push["attributes"]["a2a.push.outcome"], "delivered",
        "{push}"
    );
    assert_eq!(
        push["links"],
        json!([{"trace_id": send["trace_id"], "span_id": send["span_id"]}]),
        "{push}"
    );
    let hooked = hooked.lock().unwrap().join("\n").to_lowercase();
    let want = format!(
        "traceparent: 00-{}-{}-01",
        push["trace_id"].as_str().unwrap(),
        push["span_id"].as_str().unwrap()
    );
    assert!(hooked.contains(&want), "{want} not in\n{hooked}");

    // An LLM agent's call: the GenAI attributes, and the provider gets its context.
    let asked = call(
        "/a2a/agents/assistant",
        "SendMessage",
        json!({"message": D::V10.message("what is a gateway?")}),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(asked.contains("TASK_STATE_COMPLETED"), "{asked}");
    // The provider's last request names its span (a retried call, on a loaded machine,
    // has one per attempt).
    let llm_parent = llm
        .last()
        .headers
        .get("traceparent")
        .cloned()
        .unwrap_or_default();
    let is_parent = |x: &Value| {
        x["name"] == "chat stand-in-model"
            && llm_parent.ends_with(&format!("-{}-01", x["span_id"].as_str().unwrap_or("?")))
    };
    let spans = otlp
        .wait("the LLM call's span", |s| s.iter().any(is_parent))
        .await;
    let chat = spans.iter().find(|s| is_parent(s)).unwrap();
    let a = &chat["attributes"];
    assert_eq!(a["gen_ai.request.model"], "stand-in-model", "{chat}");
    assert_eq!(a["gen_ai.operation.name"], "chat", "{chat}");
    assert!(
        a["gen_ai.usage.input_tokens"]
            .as_i64()
            .is_some_and(|n| n > 0),
        "{chat}"
    );
    assert!(
        a["gen_ai.usage.output_tokens"]
            .as_i64()
            .is_some_and(|n| n > 0),
        "{chat}"
    );
    assert_eq!(chat["trace_id"], CALLER_TRACE, "{chat}");
    assert_eq!(
        llm_parent,
        format!("00-{CALLER_TRACE}-{}-01", chat["span_id"].as_str().unwrap()),
    );
}

#[tokio::test]
async fn spans_go_over_grpc_and_a_request_without_traceparent_starts_the_trace() {
    let otlp = Receiver::start(&[]).await;
    // A shared store, whose commits calls wait for, and a command agent.
    let url = crate::replicas::redis_url();
    let prefix = crate::replicas::Prefix::new(url);
    let gateway = format!(
        "[telemetry]\notlp_endpoint = \"http://127.0.0.1:{}\"\notlp_protocol = \"grpc\"\n\
         [store]\nkind = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{}\"\n",
        otlp.grpc, prefix.prefix
    );
    let upper = "name = \"upper\"\ndescription = \"test\"\n[backend]\nkind = \"command\"\nio = \"text\"\ncommand = [\"tr\", \"a-z\", \"A-Z\"]\n";
    // The real binary: a shared store's replica duties run on the gateway's own runtime.
    let gw = crate::running::Running::start(
        &[("echo.toml", ECHO), ("upper.toml", upper)],
        &gateway,
        "warn",
    );
    let message = json!({"message": D::V10.message("over grpc")});
    let sent = gw.call("/a2a/agents/echo", "SendMessage", message).await;
    assert!(sent.get("result").is_some(), "{sent}");
    let spans = otlp
        .wait("a span over gRPC", |s| {
            s.iter().any(|x| x["name"] == "SendMessage")
        })
        .await;
    let span = spans.iter().find(|s| s["name"] == "SendMessage").unwrap();
    assert_eq!(span["protocol"], "grpc");
    assert_eq!(span["parent_span_id"], "", "a root: {span}");
    assert_eq!(span["attributes"]["a2a.task.state"], "completed", "{span}");
    assert_eq!(span["resource"]["service.name"], "a2a-gateway");
    // The call waited for the shared store to take its changes: a child span says how long.
    let spans = otlp
        .wait("the store commit's span", |s| {
            s.iter().any(|x| x["name"] == "store commit")
        })
        .await;
    let commit = spans.iter().find(|s| s["name"] == "store commit").unwrap();
    assert_eq!(commit["trace_id"], span["trace_id"], "{commit}");
    assert_eq!(commit["parent_span_id"], span["span_id"], "{commit}");
    // A command agent's run.
    let message = json!({"message": D::V10.message("quiet")});
    let shouted = gw.call("/a2a/agents/upper", "SendMessage", message).await;
    assert!(shouted.get("result").is_some(), "{shouted}");
    let spans = otlp
        .wait("the command's span", |s| {
            s.iter().any(|x| x["name"] == "command")
        })
        .await;
    let command = spans.iter().find(|s| s["name"] == "command").unwrap();
    assert_eq!(
        command["attributes"]["process.executable.name"], "tr",
        "{command}"
    );
    let server = spans
        .iter()
        .find(|s| s["span_id"] == command["parent_span_id"])
        .unwrap_or_else(|| panic!("the command's parent: {}", pretty(&spans)));
    assert_eq!(server["attributes"]["a2a.agent"], "upper", "{server}");
}

/// A collector that is away, or too slow for the spans made: spans are dropped and
/// counted, and every request is answered.
#[tokio::test]
async fn a_collector_away_or_slow_costs_spans_not_requests() {
    let away = crate::helpers::RefusingPort::new();
    let slow = Receiver::start(&["--delay", "3"]).await;
    for (endpoint, queue) in [(away.port, 2048), (slow.http, 4)] {
        let gateway = format!(
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:{endpoint}\"\nmax_queued_spans = {queue}\n"
        );
        let gw = spawn_with(&[("echo.toml", ECHO)], &gateway).await;
        for i in 0..50 {
            let sent = gw
                .call(
                    "/a2a/agents/echo",
                    D::V10,
                    "SendMessage",
                    json!({"message": D::V10.message(&format!("n{i}"))}),
                )
                .await;
            assert!(sent.body.get("result").is_some(), "{}", sent.body);
        }
        let dropped = wait_for_dropped(&gw).await;
        assert!(dropped > 0, "port {endpoint}: {dropped} dropped");
    }
}

async fn wait_for_dropped(gw: &TestGateway) -> u64 {
    let mut last = 0;
    for _ in 0..100 {
        let text = gw.metrics().await;
        last = text
            .lines()
            .find_map(|l| l.strip_prefix("a2a_trace_spans_dropped_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if last > 0 {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

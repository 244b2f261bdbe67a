//! Third-party peers nobody here wrote, installed by `scripts/thirdparty-venv.sh` (pinned,
//! under `target/thirdparty`): pydantic-ai's A2A server (fasta2a) as an upstream agent, and
//! LiteLLM's proxy as the model provider of an `openai` agent. Each starts slowly (LiteLLM
//! takes about 15 s), so each is started once and its cases run in turn.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{inner, kind, spawn_with, text_of, TestGateway, D, ECHO};
use crate::openai::read_events_until;
use crate::peers::{fasta2a_agent, litellm_proxy, upstream_agent};

const UP: &str = "/a2a/agents/up";

/// `YYYY-MM-DDTHH:MM:SS[.f](Z|±HH:MM)`: what protobuf-based clients take.
fn has_zone(timestamp: &Value) -> bool {
    let t = timestamp.as_str().unwrap_or_default();
    t.len() >= 20
        && t.as_bytes()[10] == b'T'
        && (t.ends_with('Z') || t[t.len() - 6..].starts_with(['+', '-']))
}

/// An artifact as a client that follows the spec builds it from a stream's chunks: a chunk
/// with `append` adds to an artifact it must already have, one without starts or replaces
/// it.
fn assemble(chunks: &[Value]) -> Result<String, String> {
    let mut text: Option<String> = None;
    for c in chunks {
        let part = text_of(&json!([c["artifact"]]));
        match (c["append"] == true, &mut text) {
            (true, Some(t)) => t.push_str(&part),
            (true, None) => return Err(format!("append=true for a nonexistent artifact: {c}")),
            (false, t) => *t = Some(part),
        }
    }
    text.ok_or_else(|| "no artifact".into())
}

/// Streams `text` to the agent at `path` in dialect `d`; the stream's results.
async fn stream(gw: &TestGateway, path: &str, d: D, text: &str) -> Vec<Value> {
    gw.sse(path, d, d.stream(), json!({"message": d.message(text)}))
        .await
        .into_iter()
        .map(|e| e.data["result"].clone())
        .collect()
}

/// pydantic-ai's A2A server through the gateway, with 1.0 and 0.3 callers. Where it departs
/// from the spec, the gateway repairs what it can (each case says which).
#[tokio::test]
async fn pydantic_ai_fasta2a_upstream_in_both_dialects() {
    let peer = fasta2a_agent().await;
    let gw = spawn_with(
        &[
            ("echo.toml", ECHO),
            ("up.toml", &upstream_agent("up", &peer.url(), "")),
        ],
        "default_agent = \"echo\"",
    )
    .await;
    for d in [D::V10, D::V03] {
        // fasta2a answers every send at once, `submitted`: a blocking send waits for the
        // task through the gateway. Timestamps it writes without a zone are given one.
        let r = gw
            .call(UP, d, d.send(), json!({"message": d.message("hello")}))
            .await;
        let task = d.task_of(r.result());
        assert_eq!(
            task["status"]["state"],
            d.state("completed"),
            "{d:?}: {task}"
        );
        assert_eq!(text_of(&task["artifacts"]), "echo: hello", "{d:?}");
        assert!(has_zone(&task["status"]["timestamp"]), "{d:?}: {task}");
        let id = task["id"].as_str().unwrap().to_string();

        // A send that does not wait is relayed as written (1.0), or converted (0.3):
        // either way with a timestamp a strict client reads.
        let config = match d {
            D::V10 => json!({"returnImmediately": true}),
            D::V03 => json!({"blocking": false}),
        };
        let r = gw
            .call(
                UP,
                d,
                d.send(),
                json!({"message": d.message("/delay 0.3 later"), "configuration": config}),
            )
            .await;
        let pending = d.task_of(r.result());
        assert!(
            has_zone(&pending["status"]["timestamp"]),
            "{d:?}: {pending}"
        );
        assert!(
            [d.state("submitted"), d.state("working")].contains(
                &pending["status"]["state"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            ),
            "{d:?}: {pending}"
        );

        // GetTask, converted in both dialects.
        let got = gw.call(UP, d, d.get(), json!({"id": id})).await;
        assert_eq!(got.result()["status"]["state"], d.state("completed"));
        assert!(
            has_zone(&got.result()["status"]["timestamp"]),
            "{}",
            got.body
        );

        // fasta2a sends an artifact's first chunk with append=true and repeats it whole
        // at the end: the first chunk of an id starts it, so assembling gives the text once.
        let events = stream(&gw, UP, d, "/chunks 3 one two three").await;
        let kinds: Vec<String> = events.iter().map(|e| kind(d, e)).collect();
        assert_eq!(
            kinds.first().map(String::as_str),
            Some("task"),
            "{d:?}: {kinds:?}"
        );
        let chunks: Vec<Value> = events
            .iter()
            .filter(|e| kind(d, e) == "artifact-update")
            .map(|e| inner(d, e))
            .collect();
        assert!(chunks.len() >= 3, "{d:?}: {kinds:?}");
        assert_ne!(chunks[0]["append"], true, "{d:?}: {}", chunks[0]);
        assert_eq!(
            assemble(&chunks).as_deref(),
            Ok("echo: one two three"),
            "{d:?}"
        );
        let last = inner(d, events.last().unwrap());
        assert_eq!(last["status"]["state"], d.state("completed"), "{d:?}");

        // Cancel of a finished task: fasta2a returns the task unchanged; the spec's
        // answer is not-cancelable.
        let r = gw.call(UP, d, d.cancel(), json!({"id": id})).await;
        assert_eq!(r.code(), -32002, "{d:?}: {}", r.body);
        // Subscribing to a finished task: fasta2a sends it and closes; the spec's answer
        // is unsupported.
        let r = gw.call(UP, d, d.subscribe(), json!({"id": id})).await;
        assert_eq!(r.code(), -32004, "{d:?}: {}", r.body);
    }
    // The official SDK's client, in both dialects, reads every answer (its protobuf reader
    // refuses the zone-less timestamps fasta2a writes) and sees the repairs.
    for dialect in ["1.0", "0.3"] {
        crate::interop::run_sdk_client(
            &gw,
            "/a2a/agents/up/card",
            "up",
            "python",
            dialect,
            &["--peer", "fasta2a"],
        )
        .await;
    }
    // fasta2a has no ListTasks: its refusal is passed on.
    let r = gw.call(UP, D::V10, "ListTasks", json!({})).await;
    assert_eq!(r.code(), -32004, "{}", r.body);
    // The gateway is none the worse.
    let health = gw.client.get(gw.url("/a2a/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

const LITELLM_KEY: &str = "sk-a2a-gateway-tests-7d41c9e2";
const KEY_VAR: &str = "A2A_TEST_LITELLM_KEY";
const WRONG_KEY_VAR: &str = "A2A_TEST_LITELLM_WRONG_KEY";

fn llm_agent(name: &str, base_url: &str, model: &str, key_var: &str) -> String {
    format!(
        r#"name = "{name}"
description = "An assistant behind LiteLLM"
[backend]
kind = "openai"
base_url = "{base_url}"
model = "{model}"
api_key_env = "{key_var}"
"#
    )
}

/// LiteLLM's proxy as a real OpenAI-compatible provider (mock models, no network): blocking,
/// streamed in several chunks, a follow-up carrying the earlier turns, a wrong key, an
/// unknown model, and cancel while the model is answering.
#[tokio::test]
async fn litellm_proxy_as_the_model_provider() {
    std::env::set_var(KEY_VAR, LITELLM_KEY);
    std::env::set_var(WRONG_KEY_VAR, "sk-not-the-master-key");
    let proxy = litellm_proxy(LITELLM_KEY).await;
    let base = format!("{}/v1", proxy.url());
    let gw = spawn_with(
        &[
            ("llm.toml", &llm_agent("llm", &base, "mock-gpt", KEY_VAR)),
            (
                "slow.toml",
                &llm_agent("slow", &base, "mock-gpt-slow", KEY_VAR),
            ),
            (
                "badkey.toml",
                &llm_agent("badkey", &base, "mock-gpt", WRONG_KEY_VAR),
            ),
            (
                "nomodel.toml",
                &llm_agent("nomodel", &base, "no-such-model", KEY_VAR),
            ),
        ],
        "default_agent = \"llm\"",
    )
    .await;
    let answer = "Hello from the LiteLLM mock.";

    // Blocking, in both dialects.
    for d in [D::V10, D::V03] {
        let r = gw
            .call(
                "/a2a/agents/llm",
                d,
                d.send(),
                json!({"message": d.message("hi")}),
            )
            .await;
        let task = d.task_of(r.result());
        assert_eq!(
            task["status"]["state"],
            d.state("completed"),
            "{d:?}: {task}"
        );
        assert_eq!(text_of(&task["artifacts"]), answer, "{d:?}");
    }

    // Streamed: LiteLLM's mock sends 3-character deltas, then a chunk with an empty delta
    // and the usage.
    let events = stream(&gw, "/a2a/agents/llm", D::V10, "hi").await;
    let chunks: Vec<Value> = events
        .iter()
        .filter(|e| kind(D::V10, e) == "artifact-update")
        .map(|e| inner(D::V10, e))
        .collect();
    assert!(chunks.len() >= 5, "several chunks: {events:?}");
    assert_eq!(assemble(&chunks).as_deref(), Ok(answer));
    let last = inner(D::V10, events.last().unwrap());
    assert_eq!(last["status"]["state"], "TASK_STATE_COMPLETED", "{last}");

    // A follow-up in the same context carries the earlier turns: LiteLLM counts the
    // prompt it was given (its streamed usage), and the follow-up's holds the first turn,
    // the model's answer and the new question.
    let prompt_tokens = |events: &[Value]| {
        let last = inner(D::V10, events.last().unwrap());
        assert_eq!(last["status"]["state"], "TASK_STATE_COMPLETED", "{last}");
        last["metadata"]["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("usage: {last}"))
    };
    let first = stream(&gw, "/a2a/agents/llm", D::V10, "my name is Ada").await;
    let context = inner(D::V10, &first[0])["contextId"].clone();
    let mut next = D::V10.message("what is my name?");
    next["contextId"] = context.clone();
    let second: Vec<Value> = gw
        .sse(
            "/a2a/agents/llm",
            D::V10,
            "SendStreamingMessage",
            json!({"message": next}),
        )
        .await
        .into_iter()
        .map(|e| e.data["result"].clone())
        .collect();
    assert_eq!(inner(D::V10, &second[0])["contextId"], context);
    let (alone, with_history) = (prompt_tokens(&first), prompt_tokens(&second));
    assert!(
        with_history > alone + 10,
        "the follow-up's prompt ({with_history} tokens) holds the earlier turns (the first: {alone})"
    );

    // A key LiteLLM does not know (it answers 400 "No connected db.") and a model it does
    // not serve (400): the task fails with the provider's refusal, and nothing leaks.
    for (agent, want) in [
        ("badkey", "refused the request (HTTP 400)"),
        ("nomodel", "refused the request (HTTP 400)"),
    ] {
        let r = gw
            .call(
                &format!("/a2a/agents/{agent}"),
                D::V10,
                "SendMessage",
                json!({"message": D::V10.message("hi")}),
            )
            .await;
        let task = D::V10.task_of(r.result());
        assert_eq!(
            task["status"]["state"], "TASK_STATE_FAILED",
            "{agent}: {task}"
        );
        let why = task["status"]["message"]["parts"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(why.contains(want), "{agent}: {why}");
        assert!(!task.to_string().contains(LITELLM_KEY), "{agent}: {task}");
    }

    // Cancel while the model is still answering (the slow model waits a second before
    // its first byte): the stream ends canceled at once, and the gateway stays healthy.
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
                      "params": {"message": D::V10.message("tell me a story")}});
    let resp = gw
        .client
        .post(gw.url("/a2a/agents/slow"))
        .header("A2A-Version", "1.0")
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let mut events = Box::pin(resp.bytes_stream());
    let mut buf = String::new();
    let seen = read_events_until(&mut events, &mut buf, |e| !e.is_empty()).await;
    let id = seen[0].data["result"]["task"]["id"].clone();
    let canceled = gw
        .call("/a2a/agents/slow", D::V10, "CancelTask", json!({"id": id}))
        .await;
    assert_eq!(
        canceled.result()["status"]["state"],
        "TASK_STATE_CANCELED",
        "{}",
        canceled.body
    );
    let rest = read_events_until(&mut events, &mut buf, |_| false).await;
    let last = &rest.last().unwrap().data["result"]["statusUpdate"];
    assert_eq!(last["status"]["state"], "TASK_STATE_CANCELED", "{rest:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got = gw
        .call("/a2a/agents/slow", D::V10, "GetTask", json!({"id": id}))
        .await;
    assert_eq!(got.result()["status"]["state"], "TASK_STATE_CANCELED");
    let r = gw
        .call(
            "/a2a/agents/llm",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("still there?")}),
        )
        .await;
    assert_eq!(
        D::V10.task_of(r.result())["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
}

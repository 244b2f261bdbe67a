//! The `openai` backend against a stand-in for the paid APIs: a local server, written here,
//! that speaks the chat completions wire format exactly (JSON answers; with `stream: true`
//! SSE `data:` chunks of `choices[0].delta.content`, a chunk with `finish_reason`, a usage
//! chunk, then `data: [DONE]`; errors in OpenAI's shape with their statuses) and records
//! every request it gets and every client that hangs up on it mid-answer.
//!
//! What the stand-in does is chosen by the last message's text: `!status N`,
//! `!ratelimit N` (429 with `retry-after-ms` N times, then an answer), `!ratelimit-nowait`,
//! `!ratelimit-long`, `!garbage`, `!nochoices`, `!slow` (two deltas, then nothing until
//! the client hangs up), `!hang`, `!length`, `!nousage`, `!midfail`, `!cutoff`; anything
//! else is answered "echo: <text>".

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use base64::Engine;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{
    inner, kind, load_errors, parse_sse, repo_root, spawn_with, text_of, write_config, TestGateway,
    D,
};
use crate::running::Running;

const KEY_VAR: &str = "A2A_TEST_OPENAI_KEY";
const KEY: &str = "sk-test-5f0c2d9b7a8e41d3b6c0";

/// The key the agents' `api_key_env` names, set once for the whole test binary.
pub(crate) fn set_key() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| std::env::set_var(KEY_VAR, KEY));
}

// ---------------------------------------------------------------------------------------
// The stand-in.

#[derive(Debug, Clone)]
pub(crate) struct Request {
    method: String,
    path: String,
    /// Lowercase names.
    pub(crate) headers: HashMap<String, String>,
    body: Value,
}

impl Request {
    fn messages(&self) -> Vec<(String, String)> {
        self.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                (
                    m["role"].as_str().unwrap_or("?").to_string(),
                    m["content"].as_str().unwrap_or("?").to_string(),
                )
            })
            .collect()
    }

    fn last_text(&self) -> String {
        self.messages()
            .last()
            .map(|m| m.1.clone())
            .unwrap_or_default()
    }
}

#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<Request>>,
    disconnects: AtomicUsize,
}

pub(crate) struct StandIn {
    /// What an agent file's `base_url` names: `http://127.0.0.1:<port>/v1`.
    pub(crate) base_url: String,
    seen: Arc<Seen>,
}

impl StandIn {
    pub(crate) async fn start() -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let seen = Arc::new(Seen::default());
        let s = seen.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(serve(sock, s.clone()));
            }
        });
        StandIn {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            seen,
        }
    }

    fn requests(&self) -> Vec<Request> {
        self.seen.requests.lock().unwrap().clone()
    }

    pub(crate) fn last(&self) -> Request {
        self.requests()
            .pop()
            .expect("a request reached the stand-in")
    }

    fn count(&self) -> usize {
        self.seen.requests.lock().unwrap().len()
    }

    fn disconnects(&self) -> usize {
        self.seen.disconnects.load(Ordering::SeqCst)
    }

    /// Waits (10 s at most) until `n` clients have hung up mid-answer.
    async fn wait_disconnects(&self, n: usize) {
        for _ in 0..500 {
            if self.disconnects() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "the stand-in saw {} disconnects, not {n}",
            self.disconnects()
        );
    }

    /// Waits (10 s at most) until `n` requests have come.
    async fn wait_requests(&self, n: usize) {
        for _ in 0..500 {
            if self.count() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the stand-in got {} requests, not {n}", self.count());
    }
}

async fn read_request(sock: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Request {
        method,
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

async fn respond(sock: &mut TcpStream, status: u16, extra_headers: &[(&str, &str)], body: &str) {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        reason(status),
        body.len()
    );
    for (k, v) in extra_headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = sock.write_all(head.as_bytes()).await;
    let _ = sock.write_all(body.as_bytes()).await;
    let _ = sock.shutdown().await;
}

/// An error body exactly as OpenAI writes it.
fn error_body(message: &str, kind: &str, code: Option<&str>) -> String {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}}).to_string()
}

fn usage(req: &Request) -> Value {
    let prompt = req.messages().len() as u64;
    json!({"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7})
}

fn completion(answer: &str, finish: &str, usage: Option<Value>) -> String {
    let mut c = json!({
        "id": "chatcmpl-standin", "object": "chat.completion", "created": 1_700_000_000,
        "model": "stand-in-model-0613",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                     "logprobs": null, "finish_reason": finish}],
    });
    if let Some(u) = usage {
        c["usage"] = u;
    }
    c.to_string()
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    json!({
        "id": "chatcmpl-standin", "object": "chat.completion.chunk", "created": 1_700_000_000,
        "model": "stand-in-model-0613",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
    })
    .to_string()
}

/// A streamed answer, written as chunked SSE.
struct Sse<'a>(&'a mut TcpStream);

impl Sse<'_> {
    async fn open(sock: &mut TcpStream) -> Sse<'_> {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
        let _ = sock.write_all(head.as_bytes()).await;
        Sse(sock)
    }

    async fn data(&mut self, data: &str) {
        let event = format!("data: {data}\n\n");
        let framed = format!("{:x}\r\n{event}\r\n", event.len());
        let _ = self.0.write_all(framed.as_bytes()).await;
        let _ = self.0.flush().await;
    }

    async fn end(self) {
        let _ = self.0.write_all(b"0\r\n\r\n").await;
        let _ = self.0.shutdown().await;
    }
}

/// Waits for the client to hang up (30 s at most), and counts it if it does.
async fn until_hung_up(sock: &mut TcpStream, seen: &Seen) {
    let mut buf = [0u8; 64];
    let gone = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok();
    if gone {
        seen.disconnects.fetch_add(1, Ordering::SeqCst);
    }
}

async fn serve(mut sock: TcpStream, seen: Arc<Seen>) {
    let Some(req) = read_request(&mut sock).await else {
        return;
    };
    let text = req.last_text();
    let streaming = req.body["stream"] == true;
    let earlier_same = {
        let mut all = seen.requests.lock().unwrap();
        let n = all.iter().filter(|r| r.last_text() == text).count();
        all.push(req.clone());
        n
    };
    let mut words = text.split_whitespace();
    let command = words.next().unwrap_or("");
    let arg: Option<u32> = words.next().and_then(|w| w.parse().ok());
    let answer = format!("echo: {text}");
    match command {
        "!status" => {
            let status = arg.unwrap_or(500) as u16;
            let key = req
                .headers
                .get("authorization")
                .and_then(|a| a.strip_prefix("Bearer "))
                .unwrap_or("");
            // Providers may repeat the key they were given (in part, or whole).
            let body = match status {
                401 => error_body(&format!("Incorrect API key provided: {key}. You can find your API key at https://platform.openai.com/account/api-keys."), "invalid_request_error", Some("invalid_api_key")),
                403 => error_body(&format!("Project of key {key} does not have access to model"), "invalid_request_error", Some("model_not_found")),
                400 => error_body("This model's maximum context length is 8 tokens.", "invalid_request_error", Some("context_length_exceeded")),
                _ => error_body("The server had an error while processing your request.", "server_error", None),
            };
            respond(&mut sock, status, &[], &body).await;
        }
        "!ratelimit" if earlier_same < arg.unwrap_or(1) as usize => {
            let body = error_body(
                "Rate limit reached for requests",
                "requests",
                Some("rate_limit_exceeded"),
            );
            respond(&mut sock, 429, &[("retry-after-ms", "50")], &body).await;
        }
        "!ratelimit-nowait" | "!ratelimit-long" => {
            let body = error_body(
                "Rate limit reached for requests",
                "requests",
                Some("rate_limit_exceeded"),
            );
            let headers: &[(&str, &str)] = match command {
                "!ratelimit-long" => &[("retry-after", "3600")],
                _ => &[],
            };
            respond(&mut sock, 429, headers, &body).await;
        }
        "!garbage" => respond(&mut sock, 200, &[], "this is not JSON").await,
        "!nochoices" => {
            let body = json!({"id": "x", "object": "chat.completion", "choices": []});
            respond(&mut sock, 200, &[], &body.to_string()).await;
        }
        "!hang" => until_hung_up(&mut sock, &seen).await,
        "!slow" if streaming => {
            let mut sse = Sse::open(&mut sock).await;
            sse.data(&chunk(json!({"role": "assistant", "content": ""}), None))
                .await;
            sse.data(&chunk(json!({"content": "one "}), None)).await;
            sse.data(&chunk(json!({"content": "two "}), None)).await;
            until_hung_up(sse.0, &seen).await;
        }
        "!slow" => until_hung_up(&mut sock, &seen).await,
        "!midfail" | "!cutoff" if streaming => {
            let mut sse = Sse::open(&mut sock).await;
            sse.data(&chunk(
                json!({"role": "assistant", "content": "partial "}),
                None,
            ))
            .await;
            if command == "!midfail" {
                sse.data(
                    &json!({"error": {"message": "The server had an error while processing your request.", "type": "server_error", "param": null, "code": null}}).to_string(),
                )
                .await;
            }
            sse.end().await;
        }
        _ => {
            let finish = if command == "!length" {
                "length"
            } else {
                "stop"
            };
            let usage = (command != "!nousage").then(|| usage(&req));
            if !streaming {
                let body = completion(&answer, finish, usage);
                respond(&mut sock, 200, &[], &body).await;
                return;
            }
            let mut sse = Sse::open(&mut sock).await;
            sse.data(&chunk(json!({"role": "assistant", "content": ""}), None))
                .await;
            for piece in answer.split_inclusive(' ') {
                sse.data(&chunk(json!({"content": piece}), None)).await;
            }
            sse.data(&chunk(json!({}), Some(finish))).await;
            if let Some(u) = usage {
                let last = json!({"id": "chatcmpl-standin", "object": "chat.completion.chunk",
                                  "created": 1_700_000_000, "model": "stand-in-model-0613",
                                  "choices": [], "usage": u});
                sse.data(&last.to_string()).await;
            }
            sse.data("[DONE]").await;
            sse.end().await;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Agents and calls.

const PATH: &str = "/a2a/agents/assistant";

/// An openai agent named `name` in front of `base_url`; `more` goes into `[backend]`
/// (tables of its own, like `[backend.extra]` or `[limits]`, after it).
pub(crate) fn agent(name: &str, base_url: &str, more: &str) -> String {
    format!(
        r#"name = "{name}"
description = "An assistant that answers in one sentence"
[[skills]]
id = "answer"
name = "Answer"
description = "Answers a question tersely, remembering the conversation"
tags = ["llm"]
[backend]
kind = "openai"
base_url = "{base_url}"
model = "stand-in-model"
system_prompt = "You are terse."
{more}
"#
    )
}

async fn gateway(files: &[(&str, &str)]) -> TestGateway {
    set_key();
    spawn_with(files, "").await
}

/// A 1.0 send; the task it returns.
async fn send(gw: &TestGateway, path: &str, message: Value) -> Value {
    let r = gw
        .call(path, D::V10, "SendMessage", json!({"message": message}))
        .await;
    D::V10.task_of(r.result())
}

fn in_context(text: &str, context: &Value) -> Value {
    let mut m = D::V10.message(text);
    m["contextId"] = context.clone();
    m
}

fn status_text(task: &Value) -> String {
    task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn pair(role: &str, content: &str) -> (String, String) {
    (role.to_string(), content.to_string())
}

// ---------------------------------------------------------------------------------------
// The tests.

#[tokio::test]
async fn a_send_is_one_completion_made_from_the_file() {
    let llm = StandIn::start().await;
    let file = agent(
        "assistant",
        &llm.base_url,
        &format!(
            "api_key_env = \"{KEY_VAR}\"\ntemperature = 0.2\nmax_tokens = 50\nheaders = {{ X-Team = \"docs\" }}\n[backend.extra]\ntop_p = 0.5\nstop = [\"\\n\\n\"]"
        ),
    );
    let gw = gateway(&[("assistant.toml", &file)]).await;
    let task = send(&gw, PATH, D::V10.message("hello")).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(task["artifacts"][0]["artifactId"], "answer");
    assert_eq!(text_of(&task["artifacts"]), "echo: hello");
    assert_eq!(
        status_text(&task),
        "echo: hello",
        "the answer is the agent's message"
    );
    assert_eq!(task["status"]["message"]["role"], "ROLE_AGENT");
    let metadata = &task["metadata"];
    assert_eq!(
        metadata["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 7, "total_tokens": 9}),
        "{task}"
    );
    assert_eq!(metadata["model"], "stand-in-model-0613");
    assert_eq!(metadata["finish_reason"], "stop");
    let history = task["history"].as_array().unwrap();
    assert_eq!(history.len(), 2, "the question and the answer: {task}");

    let req = llm.last();
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(req.headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(req.headers["x-team"], "docs");
    assert_eq!(req.headers["content-type"], "application/json");
    assert_eq!(
        req.body,
        json!({
            "model": "stand-in-model",
            "messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "hello"}],
            "temperature": 0.2,
            "max_tokens": 50,
            "top_p": 0.5,
            "stop": ["\n\n"],
            "stream": false,
        })
    );

    // GetTask reads the same task, metadata included.
    let got = gw
        .call(PATH, D::V10, "GetTask", json!({"id": task["id"]}))
        .await;
    assert_eq!(got.result()["metadata"], task["metadata"]);
}

#[tokio::test]
async fn a_stream_appends_each_delta_between_working_and_completed() {
    let llm = StandIn::start().await;
    let gw = gateway(&[("assistant.toml", &agent("assistant", &llm.base_url, ""))]).await;
    let events = gw
        .sse(
            PATH,
            D::V10,
            "SendStreamingMessage",
            json!({"message": D::V10.message("hello there world")}),
        )
        .await;
    let results: Vec<&Value> = events.iter().map(|e| &e.data["result"]).collect();
    let kinds: Vec<String> = results.iter().map(|r| kind(D::V10, r)).collect();
    assert_eq!(
        kinds,
        [
            "task",
            "status-update",
            "artifact-update",
            "artifact-update",
            "artifact-update",
            "artifact-update",
            "status-update"
        ],
        "{events:?}"
    );
    assert_eq!(
        results[1]["statusUpdate"]["status"]["state"],
        "TASK_STATE_WORKING"
    );
    let chunks: Vec<(String, bool, bool)> = results[2..6]
        .iter()
        .map(|r| {
            let a = &r["artifactUpdate"];
            (
                a["artifact"]["parts"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                a["append"] == true,
                a["lastChunk"] == true,
            )
        })
        .collect();
    assert_eq!(
        chunks,
        [
            ("echo: ", false, false),
            ("hello ", true, false),
            ("there ", true, false),
            ("world", true, true)
        ]
        .map(|(t, a, l)| (t.to_string(), a, l))
    );
    let last = &results[6]["statusUpdate"];
    assert_eq!(last["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(
        last["status"]["message"]["parts"][0]["text"],
        "echo: hello there world"
    );
    let usage = json!({"prompt_tokens": 2, "completion_tokens": 7, "total_tokens": 9});
    assert_eq!(last["metadata"]["usage"], usage, "{last}");

    let req = llm.last();
    assert_eq!(req.body["stream"], true);
    assert_eq!(req.body["stream_options"], json!({"include_usage": true}));
    assert_eq!(
        req.messages(),
        [
            pair("system", "You are terse."),
            pair("user", "hello there world")
        ]
    );
    let id = inner(D::V10, results[0])["id"].clone();
    let got = gw.call(PATH, D::V10, "GetTask", json!({"id": id})).await;
    let task = got.result();
    assert_eq!(
        task["metadata"]["usage"], usage,
        "usage is the task's metadata"
    );
    assert_eq!(text_of(&task["artifacts"]), "echo: hello there world");
}

#[tokio::test]
async fn a_follow_up_on_the_same_context_carries_the_earlier_turns() {
    let llm = StandIn::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prompt = dir.path().join("prompt.md");
    std::fs::write(&prompt, "You remember.").unwrap();
    let file = agent("assistant", &llm.base_url, "").replace(
        "system_prompt = \"You are terse.\"",
        &format!("system_prompt_file = {:?}", prompt.display().to_string()),
    );
    let gw = gateway(&[("assistant.toml", &file)]).await;
    let first = send(&gw, PATH, D::V10.message("first")).await;
    let ctx = first["contextId"].clone();
    assert_eq!(llm.last().messages()[0], pair("system", "You remember."));

    let second = send(&gw, PATH, in_context("second", &ctx)).await;
    assert_eq!(second["contextId"], ctx);
    assert_eq!(
        llm.last().messages(),
        [
            pair("system", "You remember."),
            pair("user", "first"),
            pair("assistant", "echo: first"),
            pair("user", "second"),
        ]
    );
    // A failed turn is no part of the conversation: the model never answered it.
    let failed = send(&gw, PATH, in_context("!status 500", &ctx)).await;
    assert_eq!(failed["status"]["state"], "TASK_STATE_FAILED");
    // Streamed, and in 0.3: the same conversation.
    let mut third = D::V03.message("third");
    third["contextId"] = ctx.clone();
    let events = gw
        .sse(PATH, D::V03, "message/stream", json!({"message": third}))
        .await;
    assert_eq!(
        events.last().unwrap().data["result"]["status"]["state"],
        "completed"
    );
    assert_eq!(
        llm.last().messages(),
        [
            pair("system", "You remember."),
            pair("user", "first"),
            pair("assistant", "echo: first"),
            pair("user", "second"),
            pair("assistant", "echo: second"),
            pair("user", "third"),
        ]
    );
    // Another context starts afresh.
    send(&gw, PATH, D::V10.message("elsewhere")).await;
    assert_eq!(
        llm.last().messages(),
        [pair("system", "You remember."), pair("user", "elsewhere")]
    );
}

#[tokio::test]
async fn history_is_bounded_in_messages_and_tokens_newest_kept() {
    let llm = StandIn::start().await;
    let by_count = agent("counted", &llm.base_url, "max_history_messages = 3");
    // "echo: " and 24 characters: 30 characters, 8 tokens; a question of 24, 6.
    let by_tokens = agent("weighed", &llm.base_url, "max_history_tokens = 15");
    let gw = gateway(&[("counted.toml", &by_count), ("weighed.toml", &by_tokens)]).await;
    for path in ["/a2a/agents/counted", "/a2a/agents/weighed"] {
        let first = send(&gw, path, D::V10.message("aaaaaaaaaaaaaaaaaaaaaaaa")).await;
        let ctx = first["contextId"].clone();
        send(&gw, path, in_context("bbbbbbbbbbbbbbbbbbbbbbbb", &ctx)).await;
        send(&gw, path, in_context("cccccccccccccccccccccccc", &ctx)).await;
    }
    let requests = llm.requests();
    let counted = requests[2].messages();
    assert_eq!(
        counted,
        [
            pair("system", "You are terse."),
            pair("assistant", "echo: aaaaaaaaaaaaaaaaaaaaaaaa"),
            pair("user", "bbbbbbbbbbbbbbbbbbbbbbbb"),
            pair("assistant", "echo: bbbbbbbbbbbbbbbbbbbbbbbb"),
            pair("user", "cccccccccccccccccccccccc"),
        ]
    );
    let weighed = requests[5].messages();
    assert_eq!(
        weighed,
        [
            pair("system", "You are terse."),
            pair("user", "bbbbbbbbbbbbbbbbbbbbbbbb"),
            pair("assistant", "echo: bbbbbbbbbbbbbbbbbbbbbbbb"),
            pair("user", "cccccccccccccccccccccccc"),
        ]
    );
}

/// Reads a streamed call's events as they come, until `until` says stop.
pub(crate) async fn read_events_until(
    resp: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buf: &mut String,
    until: impl Fn(&[crate::helpers::Sse]) -> bool,
) -> Vec<crate::helpers::Sse> {
    let read = async {
        loop {
            let events = parse_sse(buf);
            if until(&events) {
                return events;
            }
            match resp.next().await {
                Some(Ok(bytes)) => buf.push_str(&String::from_utf8_lossy(&bytes)),
                _ => return parse_sse(buf),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the events came")
}

#[tokio::test]
async fn cancel_aborts_the_upstream_call_at_once() {
    let llm = StandIn::start().await;
    let gw = gateway(&[("assistant.toml", &agent("assistant", &llm.base_url, ""))]).await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
                      "params": {"message": D::V10.message("!slow")}});
    let resp = gw
        .client
        .post(gw.url(PATH))
        .header("A2A-Version", "1.0")
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let mut stream = Box::pin(resp.bytes_stream());
    let mut buf = String::new();
    // Mid-answer: the first delta has reached the caller, the model is still "writing".
    let seen = read_events_until(&mut stream, &mut buf, |events| {
        events
            .iter()
            .any(|e| e.data["result"].get("artifactUpdate").is_some())
    })
    .await;
    let id = seen[0].data["result"]["task"]["id"].clone();
    assert_eq!(
        seen.last().unwrap().data["result"]["artifactUpdate"]["artifact"]["parts"][0]["text"],
        "one "
    );
    assert_eq!(llm.disconnects(), 0);
    let canceled = gw.call(PATH, D::V10, "CancelTask", json!({"id": id})).await;
    assert_eq!(canceled.result()["status"]["state"], "TASK_STATE_CANCELED");
    llm.wait_disconnects(1).await;
    let rest = read_events_until(&mut stream, &mut buf, |_| false).await;
    assert_eq!(
        rest.last().unwrap().data["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_CANCELED"
    );

    // A send waiting for a whole answer is cut off the same way.
    let r = gw
        .call(
            PATH,
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("!hang"), "configuration": {"returnImmediately": true}}),
        )
        .await;
    let id = r.result()["task"]["id"].clone();
    llm.wait_requests(2).await;
    let canceled = gw.call(PATH, D::V10, "CancelTask", json!({"id": id})).await;
    assert_eq!(canceled.result()["status"]["state"], "TASK_STATE_CANCELED");
    llm.wait_disconnects(2).await;
    let got = gw.call(PATH, D::V10, "GetTask", json!({"id": id})).await;
    assert_eq!(got.result()["status"]["state"], "TASK_STATE_CANCELED");
}

#[tokio::test]
async fn each_provider_error_fails_the_task_with_a_safe_message() {
    let llm = StandIn::start().await;
    let refusing = crate::helpers::RefusingPort::new();
    let closed = format!("http://127.0.0.1:{}/v1", refusing.port);
    let with_key = format!("api_key_env = \"{KEY_VAR}\"");
    let gw = gateway(&[
        (
            "assistant.toml",
            &agent("assistant", &llm.base_url, &with_key),
        ),
        ("gone.toml", &agent("gone", &closed, &with_key)),
    ])
    .await;
    let cases: &[(&str, bool, &str)] = &[
        ("!status 401", false, "the model provider refused the gateway's credentials (HTTP 401)"),
        ("!status 403", false, "the model provider refused the gateway's credentials (HTTP 403)"),
        ("!ratelimit-nowait", false, "the model provider is rate-limiting the gateway (HTTP 429); retry later"),
        ("!ratelimit-long", false, "the model provider is rate-limiting the gateway (HTTP 429); retry in 3600 s"),
        ("!status 500", false, "the model provider failed to answer (HTTP 500); retry later"),
        ("!status 503", true, "the model provider failed to answer (HTTP 503); retry later"),
        ("!status 400", false, "the model provider refused the request (HTTP 400): This model's maximum context length is 8 tokens."),
        ("!garbage", false, "the model provider's answer could not be read"),
        ("!nochoices", false, "the model provider's answer could not be read"),
        ("!midfail", true, "the model provider failed in the middle of its answer; retry later"),
        ("!cutoff", true, "the model provider's answer broke off before it was complete; retry later"),
    ];
    for (text, streamed, want) in cases {
        let task = if *streamed {
            let events = gw
                .sse(
                    PATH,
                    D::V10,
                    "SendStreamingMessage",
                    json!({"message": D::V10.message(text)}),
                )
                .await;
            let id = events[0].data["result"]["task"]["id"].clone();
            let last = &events.last().unwrap().data["result"]["statusUpdate"];
            assert_eq!(
                last["status"]["state"], "TASK_STATE_FAILED",
                "{text}: {last}"
            );
            gw.call(PATH, D::V10, "GetTask", json!({"id": id}))
                .await
                .result()
                .clone()
        } else {
            send(&gw, PATH, D::V10.message(text)).await
        };
        assert_eq!(
            task["status"]["state"], "TASK_STATE_FAILED",
            "{text}: {task}"
        );
        assert_eq!(status_text(&task), *want, "{text}");
        assert!(
            !task.to_string().contains(KEY),
            "{text}: the key leaked: {task}"
        );
    }
    // The 401's body repeated the key; it went nowhere.
    let refused = llm
        .requests()
        .into_iter()
        .find(|r| r.last_text() == "!status 401")
        .unwrap();
    assert_eq!(refused.headers["authorization"], format!("Bearer {KEY}"));

    let task = send(&gw, "/a2a/agents/gone", D::V10.message("anyone?")).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED");
    assert_eq!(
        status_text(&task),
        "the model provider could not be reached; retry later"
    );
    // The gateway is none the worse.
    let task = send(&gw, PATH, D::V10.message("still there?")).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    let health = gw.client.get(gw.url("/a2a/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn a_429_that_says_when_is_retried_within_the_timeout() {
    let llm = StandIn::start().await;
    let gw = gateway(&[("assistant.toml", &agent("assistant", &llm.base_url, ""))]).await;
    let task = send(&gw, PATH, D::V10.message("!ratelimit 2")).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(text_of(&task["artifacts"]), "echo: !ratelimit 2");
    let tries = llm
        .requests()
        .iter()
        .filter(|r| r.last_text() == "!ratelimit 2")
        .count();
    assert_eq!(tries, 3, "two refusals, then the answer");
}

#[tokio::test]
async fn an_unanswered_call_fails_at_the_timeout_and_hangs_up() {
    let llm = StandIn::start().await;
    let gw = gateway(&[(
        "assistant.toml",
        &agent("assistant", &llm.base_url, "timeout_secs = 1"),
    )])
    .await;
    let task = send(&gw, PATH, D::V10.message("!hang")).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED");
    assert_eq!(status_text(&task), "the model did not answer within 1 s");
    llm.wait_disconnects(1).await;
}

#[tokio::test]
async fn parts_become_content_and_files_it_cannot_read_are_refused() {
    let llm = StandIn::start().await;
    let gw = gateway(&[("assistant.toml", &agent("assistant", &llm.base_url, ""))]).await;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let message = json!({"role": "ROLE_USER", "messageId": uuid::Uuid::new_v4().to_string(),
    "parts": [
        {"text": "Summarize:"},
        {"data": {"k": 1}},
        {"raw": b64("# Notes\nshort"), "filename": "notes.md", "mediaType": "text/markdown"},
    ]});
    let task = send(&gw, PATH, message).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(
        llm.last().last_text(),
        "Summarize:\n{\"k\":1}\n[notes.md (text/markdown)]\n# Notes\nshort"
    );

    let before = llm.count();
    let image = json!({"role": "ROLE_USER", "messageId": "m-img",
        "parts": [{"text": "what is this?"}, {"raw": b64("png"), "mediaType": "image/png"}]});
    let linked = json!({"role": "ROLE_USER", "messageId": "m-url",
        "parts": [{"url": "https://example.com/a.txt", "mediaType": "text/plain"}]});
    let legacy = json!({"kind": "message", "role": "user", "messageId": "m-03",
        "parts": [{"kind": "file", "file": {"bytes": b64("%PDF"), "mimeType": "application/pdf"}}]});
    for (d, message, want) in [
        (
            D::V10,
            &image,
            "Invalid params: params.message.parts[1]: a file of type image/png cannot be sent to this agent's model",
        ),
        (
            D::V10,
            &linked,
            "Invalid params: params.message.parts[0]: this agent does not fetch files by URL",
        ),
        (
            D::V03,
            &legacy,
            "Invalid params: params.message.parts[0]: a file of type application/pdf",
        ),
    ] {
        let r = gw
            .call(PATH, d, d.send(), json!({"message": message}))
            .await;
        assert_eq!(r.code(), -32602, "{}", r.body);
        assert!(r.message().starts_with(want), "{}", r.body);
        // Streamed, it is refused the same way.
        let events = gw
            .sse(PATH, d, d.stream(), json!({"message": message}))
            .await;
        let error = &events.last().unwrap().data["error"];
        assert_eq!(error["code"], -32602, "{events:?}");
    }
    assert_eq!(llm.count(), before, "nothing refused reached the model");
    let listed = gw.call(PATH, D::V10, "ListTasks", json!({})).await;
    assert_eq!(
        listed.result()["tasks"].as_array().unwrap().len(),
        1,
        "refused messages made no task"
    );
}

#[tokio::test]
async fn every_dialect_and_binding_reaches_the_model() {
    let llm = StandIn::start().await;
    let gw = gateway(&[("assistant.toml", &agent("assistant", &llm.base_url, ""))]).await;
    let c = &gw.client;

    // 1.0 and 0.3 JSON-RPC, sent and streamed.
    for d in [D::V10, D::V03] {
        let r = gw
            .call(PATH, d, d.send(), json!({"message": d.message("rpc")}))
            .await;
        let task = d.task_of(r.result());
        assert_eq!(task["status"]["state"], d.state("completed"), "{task}");
        assert_eq!(text_of(&task["artifacts"]), "echo: rpc");
        let events = gw
            .sse(
                PATH,
                d,
                d.stream(),
                json!({"message": d.message("rpc stream")}),
            )
            .await;
        let last = inner(d, &events.last().unwrap().data["result"]);
        assert_eq!(last["status"]["state"], d.state("completed"), "{events:?}");
        assert_eq!(llm.last().body["stream"], true);
    }

    // 0.1: tasks/send, under the id the client chose.
    let id = "4b6fd7bc-1c1f-4d3e-9f3a-0d0c0a0b0c0d";
    let r = gw
        .post_raw(
            PATH,
            &[("content-type", "application/json")],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/send",
                   "params": {"id": id, "message": {"role": "user", "parts": [{"type": "text", "text": "legacy"}]}}})
                .to_string(),
        )
        .await;
    let task = &r.body["result"];
    assert_eq!(task["id"], id, "{}", r.body);
    assert_eq!(task["status"]["state"], "completed");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "echo: legacy");
    assert_eq!(llm.last().body["stream"], false);

    // HTTP+JSON.
    let rest = gw.url(&format!("{PATH}/rest"));
    let sent: Value = c
        .post(format!("{rest}/message:send"))
        .json(&json!({"message": D::V10.message("rest")}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        sent["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{sent}"
    );
    assert_eq!(text_of(&sent["task"]["artifacts"]), "echo: rest");
    let streamed = parse_sse(
        &c.post(format!("{rest}/message:stream"))
            .json(&json!({"message": D::V10.message("rest stream")}))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    let chunks: String = streamed
        .iter()
        .filter_map(|e| e.data["artifactUpdate"]["artifact"]["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(chunks, "echo: rest stream");
    assert_eq!(
        streamed.last().unwrap().data["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
}

#[tokio::test]
async fn a_cut_answer_says_so_and_usage_is_optional() {
    let llm = StandIn::start().await;
    let gw = gateway(&[("assistant.toml", &agent("assistant", &llm.base_url, ""))]).await;
    let task = send(&gw, PATH, D::V10.message("!length")).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(task["metadata"]["finish_reason"], "length", "{task}");
    for streamed in [false, true] {
        let task = if streamed {
            let events = gw
                .sse(
                    PATH,
                    D::V10,
                    "SendStreamingMessage",
                    json!({"message": D::V10.message("!nousage")}),
                )
                .await;
            let id = events[0].data["result"]["task"]["id"].clone();
            gw.call(PATH, D::V10, "GetTask", json!({"id": id}))
                .await
                .result()
                .clone()
        } else {
            send(&gw, PATH, D::V10.message("!nousage")).await
        };
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
        assert_eq!(text_of(&task["artifacts"]), "echo: !nousage");
        assert!(task["metadata"].get("usage").is_none(), "{task}");
        assert_eq!(task["metadata"]["finish_reason"], "stop");
    }
}

#[tokio::test]
async fn the_card_is_built_from_the_file() {
    let llm = StandIn::start().await;
    let gw = gateway(&[("assistant.toml", &agent("assistant", &llm.base_url, ""))]).await;
    let card = gw.get_json(&format!("{PATH}/card")).await;
    assert_eq!(card["name"], "assistant");
    assert_eq!(
        card["description"],
        "An assistant that answers in one sentence"
    );
    assert_eq!(
        card["skills"][0]["description"],
        "Answers a question tersely, remembering the conversation"
    );
    assert_eq!(card["capabilities"]["streaming"], true);
    assert_eq!(llm.count(), 0, "the card costs no call to the model");
}

#[tokio::test]
async fn concurrency_and_the_mailbox_apply() {
    let llm = StandIn::start().await;
    let file = agent(
        "assistant",
        &llm.base_url,
        "\n[limits]\nmax_concurrency = 1\nmailbox = 1",
    );
    let gw = gateway(&[("assistant.toml", &file)]).await;
    let later = json!({"returnImmediately": true});
    // One running (the model hangs), one waiting its turn: the next is refused.
    let r = gw
        .call(
            PATH,
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("!hang"), "configuration": later}),
        )
        .await;
    let running = r.result()["task"]["id"].clone();
    llm.wait_requests(1).await;
    let waiting = {
        let gw_url = gw.url(PATH);
        let client = gw.client.clone();
        let body = json!({"jsonrpc": "2.0", "id": 2, "method": "SendMessage",
                          "params": {"message": D::V10.message("queued")}});
        tokio::spawn(async move {
            client
                .post(gw_url)
                .header("A2A-Version", "1.0")
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    // The mailbox holds the queued call once the metrics say so.
    let mut queued = false;
    for _ in 0..500 {
        let metrics = gw.metrics().await;
        if metrics.contains("a2a_mailbox_depth{agent=\"assistant\"} 1") {
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(queued, "the second call waits in the mailbox");
    let busy = gw
        .call(
            PATH,
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("one more")}),
        )
        .await;
    assert_eq!(busy.code(), -32050, "{}", busy.body);
    gw.call(PATH, D::V10, "CancelTask", json!({"id": running}))
        .await;
    let queued = waiting.await.unwrap();
    assert_eq!(
        queued["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{queued}"
    );
}

// ---------------------------------------------------------------------------------------
// Configuration.

#[test]
fn bad_agent_files_are_refused_with_their_place() {
    set_key();
    let base = "http://127.0.0.1:9/v1";
    let cases: Vec<(String, &str)> = vec![
        (
            agent("a", base, "api_key_env = \"A2A_TEST_OPENAI_NOT_SET\""),
            "a.toml:13:1: environment variable A2A_TEST_OPENAI_NOT_SET (backend.api_key_env) is not set",
        ),
        (
            agent("a", base, "[backend.extra]\nstream = true"),
            "backend.extra.stream: the gateway sets `stream` itself",
        ),
        (
            agent("a", base, "[backend.extra]\nmessages = []"),
            "backend.extra.messages: the gateway sets `messages` itself",
        ),
        (
            agent("a", base, "system_prompt_file = \"prompt.md\""),
            "backend.system_prompt and backend.system_prompt_file: set one of them",
        ),
        (
            agent("a", base, "").replace("system_prompt = ", "system_prompt_file = \"missing.md\"\n#"),
            "backend.system_prompt_file: cannot read ",
        ),
        (
            agent("a", "localhost:11434", ""),
            "a.toml:10:1: backend.base_url must be an http(s) URL like \"http://localhost:11434/v1\", got \"localhost:11434\"",
        ),
        (
            agent("a", base, "temperature = 0.3\n[backend.extra]\ntemperature = 0.5"),
            "backend.temperature and backend.extra.temperature: set one of them",
        ),
        (
            agent(
                "a",
                base,
                &format!("api_key_env = \"{KEY_VAR}\"\nheaders = {{ Authorization = \"Bearer x\" }}"),
            ),
            "backend.headers.Authorization and backend.api_key_env both set Authorization",
        ),
        (
            agent("a", base, "timeout_secs = 0"),
            "backend.timeout_secs must be at least 1",
        ),
        (
            agent("a", base, "headers = { api-key = \"${A2A_TEST_OPENAI_NOT_SET}\" }"),
            "environment variable A2A_TEST_OPENAI_NOT_SET (used in header api-key) is not set",
        ),
        (
            agent("a", base, "modle = \"x\""),
            "unknown field `modle`",
        ),
    ];
    for (file, want) in cases {
        let errors = load_errors(&[("a.toml", &file)], "");
        assert!(
            errors.contains(want),
            "want {want:?} in:\n{errors}\nfor:\n{file}"
        );
    }
    // A key that cannot be sent is refused without being shown.
    std::env::set_var("A2A_TEST_OPENAI_BAD_KEY", "sk-bad\u{7}key-value");
    let errors = load_errors(
        &[(
            "a.toml",
            &agent("a", base, "api_key_env = \"A2A_TEST_OPENAI_BAD_KEY\""),
        )],
        "",
    );
    assert!(errors.contains("A2A_TEST_OPENAI_BAD_KEY (backend.api_key_env) holds characters an HTTP header cannot carry"), "{errors}");
    assert!(!errors.contains("key-value"), "{errors}");
    // Loaded, the key is never printed with the configuration.
    let settings = load(&[(
        "a.toml",
        &agent("a", base, &format!("api_key_env = \"{KEY_VAR}\"")),
    )]);
    assert!(!format!("{settings:?}").contains(KEY));
}

/// Agent files loaded beside an empty gateway file (not the repository's own).
fn load(files: &[(&str, &str)]) -> a2a_gateway::config::Settings {
    let (_dir, agents, gateway) = write_config(files, Some(""));
    a2a_gateway::config::load(gateway.as_deref(), &agents).unwrap_or_else(|d| panic!("{d}"))
}

/// The first (uncommented) `[backend]` of the example replaced by its commented-out
/// hosted one.
fn hosted_variant(example: &str) -> String {
    let (head, rest) = example.split_once("[backend]").expect("a [backend]");
    let hosted: String = rest
        .lines()
        .skip_while(|l| !l.starts_with("# [backend]"))
        .take_while(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim_start())
        .collect::<Vec<_>>()
        .join("\n");
    let after: String = rest
        .lines()
        .skip_while(|l| !l.starts_with('['))
        .collect::<Vec<_>>()
        .join("\n");
    format!("{head}{hosted}\n{after}\n")
}

#[test]
fn the_shipped_example_is_not_loaded_but_loads_as_a_file() {
    let root = repo_root();
    let example = std::fs::read_to_string(root.join("agents.d/assistant.toml.example"))
        .expect("agents.d/assistant.toml.example is shipped");
    let shipped =
        a2a_gateway::config::load(Some(&root.join("gateway.toml")), &root.join("agents.d"))
            .expect("the shipped configuration loads");
    assert!(
        shipped.agents.iter().all(|a| a.name != "assistant"),
        "*.example files are not agents"
    );

    let local = load(&[("assistant.toml", &example)]);
    match &local.agents[0].backend {
        a2a_gateway::config::BackendSpec::OpenAi(cfg) => {
            assert_eq!(cfg.base_url, "http://localhost:11434/v1");
            assert!(cfg.api_key.is_none(), "a local server needs no key");
            assert!(cfg.system_prompt.is_some());
        }
        other => panic!("not an openai agent: {other:?}"),
    }

    let hosted = hosted_variant(&example);
    std::env::set_var("OPENAI_API_KEY", "sk-example-not-a-real-key");
    let hosted = load(&[("assistant.toml", &hosted)]);
    match &hosted.agents[0].backend {
        a2a_gateway::config::BackendSpec::OpenAi(cfg) => {
            assert_eq!(cfg.base_url, "https://api.openai.com/v1");
            assert_eq!(cfg.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
            assert!(cfg.api_key.is_some());
        }
        other => panic!("not an openai agent: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// The binary's log.

#[tokio::test]
async fn the_log_has_the_details_and_never_the_key() {
    set_key();
    let llm = StandIn::start().await;
    let file = agent(
        "assistant",
        &llm.base_url,
        &format!("api_key_env = \"{KEY_VAR}\""),
    );
    let gw = Running::start(&[("assistant.toml", &file)], "", "info");
    let r: Value = gw
        .client
        .post(gw.url(PATH))
        .header("A2A-Version", "1.0")
        .header("content-type", "application/json")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                   "params": {"message": D::V10.message("!status 401")}})
            .to_string(),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["result"]["task"]["status"]["state"], "TASK_STATE_FAILED");
    let logged = gw
        .wait_for_log("the provider's refusal", |l| l["fields"]["status"] == 401)
        .await;
    let fields = &logged["fields"];
    assert_eq!(fields["agent"], "assistant");
    assert_eq!(fields["provider_code"], "invalid_api_key");
    assert!(
        fields["provider_message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Incorrect API key provided: [redacted].")),
        "{logged}"
    );
    let log = std::fs::read_to_string(&gw.log).unwrap();
    assert!(!log.contains(KEY), "the key is in the log:\n{log}");
    assert!(!r.to_string().contains(KEY));
}

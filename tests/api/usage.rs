//! Usage and budgets: every call counted per caller, agent and day and read back through
//! the admin API (JSON and CSV) and by the caller itself; budgets refused on every binding
//! with what remains and when they reset, kept across a restart, shared by replicas (the
//! LiteLLM proxy reporting the tokens), rolling over with the calendar under a test clock,
//! and warning through the push machinery.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::grpc::probe;
use crate::helpers::{load_errors, sha, spawn_with, spawn_with_grpc, D, ECHO};
use crate::mcp::{raw_post, raw_session};
use crate::running::Running;

const ADMIN: &str = "usage-admin-secret";

/// An admin key, and a caller's key per name.
fn keys(callers: &[&str]) -> String {
    let mut out = format!(
        "[admin]\n[[admin.keys]]\nid = \"ops\"\nsecret_sha256 = \"{}\"\n",
        sha(ADMIN)
    );
    for id in callers {
        out.push_str(&format!(
            "[[auth.api_keys]]\nid = \"{id}\"\nsecret_sha256 = \"{}\"\n",
            sha(&secret(id))
        ));
    }
    out
}

fn secret(id: &str) -> String {
    format!("secret-of-{id}")
}

async fn admin_get(client: &reqwest::Client, base: &str, path: &str) -> reqwest::Response {
    client
        .get(format!("{base}/admin/v1{path}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
}

async fn admin_json(client: &reqwest::Client, base: &str, path: &str) -> (u16, Value) {
    let resp = admin_get(client, base, path).await;
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn admin_send(
    client: &reqwest::Client,
    base: &str,
    method: reqwest::Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let resp = client
        .request(method, format!("{base}/admin/v1{path}"))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A JSON-RPC send as `key` at `base`: the status, the headers, the answer.
async fn send_as(
    client: &reqwest::Client,
    base: &str,
    agent: &str,
    key: &str,
    text: &str,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": D::V10.message(text)}});
    let resp = client
        .post(format!("{base}/a2a/agents/{agent}"))
        .header("content-type", "application/json")
        .header("A2A-Version", "1.0")
        .header("X-API-Key", secret(key))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.json().await.unwrap_or(Value::Null))
}

/// A JSON-RPC stream as `key` at `agent`: its events' data, read to the end.
async fn stream_as(
    gw: &crate::helpers::TestGateway,
    agent: &str,
    key: &str,
    text: &str,
) -> Vec<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": D::V10.message(text)}});
    let answer = gw
        .client
        .post(gw.url(&format!("/a2a/agents/{agent}")))
        .header("content-type", "application/json")
        .header("A2A-Version", "1.0")
        .header("Accept", "text/event-stream")
        .header("X-API-Key", secret(key))
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    crate::helpers::parse_sse(&answer)
        .into_iter()
        .map(|e| e.data)
        .collect()
}

/// The next midnight, UTC, as RFC 3339.
fn next_midnight() -> String {
    let tomorrow = chrono::Utc::now().date_naive() + chrono::TimeDelta::days(1);
    format!("{tomorrow}T00:00:00Z")
}

/// A budget of 3 requests a day, each caller on its own: on JSON-RPC, HTTP+JSON, gRPC and
/// MCP the fourth call is refused (429, RESOURCE_EXHAUSTED, an MCP tool error) naming the
/// budget and its reset, with the `X-Budget-*` numbers; another caller is untouched. Usage
/// read back matches the calls made, in JSON and CSV, for the admin and for each caller.
#[tokio::test]
async fn a_request_budget_refuses_the_fourth_call_on_every_binding_and_usage_matches() {
    let gateway = format!(
        "default_agent = \"echo\"\n[usage]\nenabled = true\nflush_interval_ms = 100\n[[budgets]]\nid = \"three-a-day\"\ncallers = [\"*\"]\nwindow = \"day\"\nmax_requests = 3\n{}",
        keys(&["rpc", "rest", "grpc", "mcp", "other"])
    );
    let gw = spawn_with_grpc(&[("echo.toml", ECHO)], &gateway).await;
    let midnight = next_midnight();

    // JSON-RPC.
    let mut remaining = Vec::new();
    for i in 0..3 {
        let (status, headers, answer) =
            send_as(&gw.client, &gw.base, "echo", "rpc", &format!("hi {i}")).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(headers["x-budget-id"], "three-a-day");
        assert_eq!(headers["x-budget-limit"], "3");
        remaining.push(headers["x-budget-remaining"].to_str().unwrap().to_string());
    }
    assert_eq!(remaining, ["2", "1", "0"]);
    let (status, headers, refused) = send_as(&gw.client, &gw.base, "echo", "rpc", "four").await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"]["code"], -32073, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("three-a-day") && message.contains(&midnight),
        "{message}"
    );
    assert_eq!(headers["x-budget-remaining"], "0");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry), "{retry}");
    let info = &refused["error"]["data"][0];
    assert_eq!(info["reason"], "BUDGET_EXCEEDED", "{refused}");
    assert_eq!(info["metadata"]["resetsAt"], midnight.as_str());

    // HTTP+JSON.
    let rest = |text: &str| {
        gw.client
            .post(gw.url("/a2a/agents/echo/rest/message:send"))
            .header("content-type", "application/a2a+json")
            .header("X-API-Key", secret("rest"))
            .body(json!({"message": D::V10.message(text)}).to_string())
            .send()
    };
    for i in 0..3 {
        assert_eq!(rest(&format!("rest {i}")).await.unwrap().status(), 200);
    }
    let refused = rest("four").await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["x-budget-id"], "three-a-day");
    let body: Value = refused.json().await.unwrap();
    let details = body["error"]["details"].to_string();
    assert!(
        details.contains("BUDGET_EXCEEDED") && details.contains(&midnight),
        "{body}"
    );

    // gRPC: the numbers as metadata, RESOURCE_EXHAUSTED with the reason.
    let call = json!({"method": "SendMessage", "request": {"tenant": "echo",
        "message": {"messageId": "g", "role": "ROLE_USER", "parts": [{"text": "grpc"}]}},
        "metadata": {"x-api-key": secret("grpc")}});
    let outcomes = probe(&gw, json!([call, call, call, call])).await;
    for ok in &outcomes[..3] {
        assert_eq!(ok["code"], "OK", "{ok}");
    }
    let refused = &outcomes[3];
    assert_eq!(refused["code"], "RESOURCE_EXHAUSTED", "{refused}");
    assert_eq!(
        refused["error_info"]["reason"], "BUDGET_EXCEEDED",
        "{refused}"
    );
    assert_eq!(
        refused["error_info"]["metadata"]["resetsAt"],
        midnight.as_str()
    );
    assert_eq!(refused["trailing"]["x-budget-remaining"], "0", "{refused}");

    // MCP: the session's own messages are free; the fourth tool call is a tool error.
    let key = secret("mcp");
    let session = raw_session(&gw, Some(&key)).await;
    let mut texts = Vec::new();
    for i in 0..4 {
        let call = json!({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": format!("mcp {i}")}}});
        let answer = raw_post(&gw, &call, Some(&key), Some(&session))
            .await
            .unwrap();
        texts.push(answer.text().await.unwrap());
    }
    for ok in &texts[..3] {
        assert!(!ok.contains("\"isError\":true"), "{ok}");
    }
    assert!(texts[3].contains("\"isError\":true"), "{}", texts[3]);
    assert!(
        texts[3].contains("three-a-day") && texts[3].contains(&midnight),
        "{}",
        texts[3]
    );

    // Another caller has a budget of its own.
    let (status, headers, _) = send_as(&gw.client, &gw.base, "echo", "other", "me").await;
    assert_eq!(
        (status, &headers["x-budget-remaining"]),
        (200, &"2".parse().unwrap())
    );

    // The budget's window as the admin API shows it.
    let (status, budget) = admin_json(&gw.client, &gw.base, "/budgets/three-a-day").await;
    assert_eq!(status, 200, "{budget}");
    assert_eq!(budget["source"], "file");
    assert_eq!(budget["resets_at"], midnight.as_str());
    let spent: Vec<(String, i64)> = (budget["standing"].as_array().unwrap().iter())
        .map(|s| {
            (
                s["caller"].as_str().unwrap().to_string(),
                s["requests"].as_i64().unwrap(),
            )
        })
        .collect();
    for caller in ["key:rpc", "key:rest", "key:grpc", "key:mcp"] {
        assert!(
            spent.contains(&(caller.to_string(), 3)),
            "{caller}: {spent:?}"
        );
    }

    // Usage: 4 requests per caller (the refused one an error), 3 tasks, on its binding.
    let (status, report) = admin_json(&gw.client, &gw.base, "/usage?group_by=caller,agent").await;
    assert_eq!(status, 200, "{report}");
    let row = |caller: &str| -> Value {
        (report["rows"].as_array().unwrap().iter())
            .find(|r| r["caller"] == caller)
            .cloned()
            .unwrap_or_else(|| panic!("no row for {caller}: {report}"))
    };
    // An MCP tool call runs as a stream; its bytes are the session's, not counted.
    for (caller, method, bytes) in [
        ("key:rpc", "jsonrpc SendMessage", true),
        ("key:rest", "rest SendMessage", true),
        ("key:grpc", "grpc SendMessage", true),
        ("key:mcp", "mcp SendStreamingMessage", false),
    ] {
        let r = row(caller);
        assert_eq!(r["agent"], "echo", "{r}");
        assert_eq!(r["requests"], 4, "{caller}: {r}");
        assert_eq!(r["errors"], 1, "{caller}: {r}");
        assert_eq!(r["tasks"], 3, "{caller}: {r}");
        assert_eq!(r["tasks_by_state"]["completed"], 3, "{caller}: {r}");
        assert_eq!(r["requests_by"][method], 4, "{r}");
        if bytes {
            assert!(r["bytes_in"].as_u64().unwrap() > 100, "{r}");
            assert!(r["bytes_out"].as_u64().unwrap() > 100, "{r}");
        }
    }
    assert_eq!(report["total"]["requests"], 17, "{report}");

    // The same as CSV.
    let csv = admin_get(&gw.client, &gw.base, "/usage?group_by=caller&format=csv").await;
    assert_eq!(csv.status(), 200);
    assert!(csv.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    let csv = csv.text().await.unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(
        &header[..4],
        ["caller", "requests", "errors", "tasks"],
        "{csv}"
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let rpc = rows
        .iter()
        .find(|r| r[0] == "key:rpc")
        .expect("key:rpc's row");
    assert_eq!(&rpc[1..5], ["4", "1", "3", "3"], "{csv}");
    assert_eq!(rows.len(), 5, "{csv}");
    // Accept: text/csv chooses it too.
    let accepted = gw
        .client
        .get(gw.url("/admin/v1/usage"))
        .bearer_auth(ADMIN)
        .header("Accept", "text/csv")
        .send()
        .await
        .unwrap();
    assert!(accepted.text().await.unwrap().starts_with("requests,"));

    // A caller reads its own usage, and nobody else's.
    let own: Value = gw
        .client
        .get(gw.url("/a2a/usage?group_by=day"))
        .header("X-API-Key", secret("rest"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(own["total"]["requests"], 4, "{own}");
    assert_eq!(
        own["rows"][0]["day"],
        chrono::Utc::now().date_naive().to_string()
    );
    let theirs = gw
        .client
        .get(gw.url("/a2a/usage?caller=key:rpc"))
        .header("X-API-Key", secret("rest"))
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.status(), 403);
    let anonymous = gw.client.get(gw.url("/a2a/usage")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    // A caller's key is not an admin's.
    let not_admin = gw
        .client
        .get(gw.url("/admin/v1/usage"))
        .header("X-API-Key", secret("rpc"))
        .send()
        .await
        .unwrap();
    assert_eq!(not_admin.status(), 403);

    // The metrics count the refusals.
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("a2a_budget_refusals_total{budget=\"three-a-day\"} 4"),
        "{metrics}"
    );
}

/// Bad reads and bad budgets get a 400 naming the field; a file's budget is read-only; bad
/// `[usage]`, `[pricing]` and `[[budgets]]` settings are refused at load, by name. The
/// gateway stays healthy throughout.
#[tokio::test]
async fn bad_usage_queries_and_budgets_are_refused_precisely() {
    let gateway = format!(
        "[usage]\nenabled = true\n[[budgets]]\nid = \"in-file\"\nwindow = \"month\"\nmax_tasks = 10\n{}",
        keys(&["a"])
    );
    let gw = spawn_with(&[("echo.toml", ECHO)], &gateway).await;
    for (query, field) in [
        ("?from=2026-05-02&to=2026-05-01", "from"),
        ("?from=2020-01-01&to=2026-01-01", "from"),
        ("?group_by=model", "group_by"),
        ("?format=xml", "format"),
        ("?from=yesterday", "query"),
        ("?colour=blue", "query"),
    ] {
        let (status, body) = admin_json(&gw.client, &gw.base, &format!("/usage{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        let violations = body["error"]["details"].to_string();
        assert!(
            violations.contains(&format!("\"{field}\"")),
            "{query}: {body}"
        );
    }
    let put = |id: &str, body: Value| {
        let path = format!("/budgets/{id}");
        let (client, base) = (gw.client.clone(), gw.base.clone());
        async move { admin_send(&client, &base, reqwest::Method::PUT, &path, body).await }
    };
    for (body, field) in [
        (json!({"window": "day"}), "max_requests"),
        (json!({"window": "day", "max_requests": 0}), "max_requests"),
        (
            json!({"window": "day", "max_requests": 5, "soft_percent": 100}),
            "soft_percent",
        ),
        (json!({"window": "day", "max_cost": -1.0}), "max_cost"),
        (
            json!({"window": "day", "max_requests": 5, "webhook": "https://hooks.example/b"}),
            "webhook",
        ),
        (
            json!({"window": "day", "max_requests": 5, "callers": []}),
            "callers",
        ),
        (
            json!({"window": "day", "max_requests": 5, "callers": ["*", "key:a"]}),
            "callers",
        ),
        (
            json!({"window": "day", "max_requests": 5, "stop_streaming": true}),
            "stop_streaming",
        ),
        (json!({"window": "week", "max_requests": 5}), "window"),
        (
            json!({"id": "other", "window": "day", "max_requests": 5}),
            "id",
        ),
    ] {
        let (status, answer) = put("runtime-one", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.to_string().contains(field), "{body}: {answer}");
    }
    let (status, answer) = put("in-file", json!({"window": "day", "max_requests": 5})).await;
    assert_eq!(status, 409, "{answer}");
    let (status, _) = admin_send(
        &gw.client,
        &gw.base,
        reqwest::Method::DELETE,
        "/budgets/nope",
        Value::Null,
    )
    .await;
    assert_eq!(status, 404);
    // A good one, in force at once; then gone.
    let (status, made) = put(
        "runtime-one",
        json!({"callers": ["key:a"], "window": "minute", "max_requests": 1}),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["source"], "runtime");
    let (first, _, _) = send_as(&gw.client, &gw.base, "echo", "a", "one").await;
    let (second, _, refused) = send_as(&gw.client, &gw.base, "echo", "a", "two").await;
    assert_eq!((first, second), (200, 429), "{refused}");
    let (status, _) = admin_send(
        &gw.client,
        &gw.base,
        reqwest::Method::DELETE,
        "/budgets/runtime-one",
        Value::Null,
    )
    .await;
    assert_eq!(status, 204);
    let (third, _, _) = send_as(&gw.client, &gw.base, "echo", "a", "three").await;
    assert_eq!(third, 200);
    // The audit log has both.
    let (_, audit) = admin_json(&gw.client, &gw.base, "/audit?target=budget:runtime-one").await;
    let actions: Vec<&str> = (audit["entries"].as_array().unwrap().iter())
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["budget.delete", "budget.create"]);
    let health = gw.client.get(gw.url("/a2a/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);

    for (bad, want) in [
        ("[usage]\ntime_zone = \"Mars/Olympus\"", "usage.time_zone \"Mars/Olympus\""),
        ("[usage]\nflush_interval_ms = 0", "usage.flush_interval_ms must be at least 1"),
        ("[pricing.\"gpt\"]\ninput_per_million = -2.0", "pricing.\"gpt\".input_per_million"),
        ("[[budgets]]\nid = \"b\"\nwindow = \"day\"", "budget \"b\": max_requests: a budget needs"),
        (
            "[[budgets]]\nid = \"b\"\nwindow = \"day\"\nmax_tasks = 1\n[[budgets]]\nid = \"b\"\nwindow = \"day\"\nmax_tasks = 2",
            "budget \"b\" is defined twice",
        ),
        ("[[budgets]]\nid = \"b c\"\nwindow = \"day\"\nmax_tasks = 1", "budget id \"b c\""),
    ] {
        let errors = load_errors(&[("echo.toml", ECHO)], bad);
        assert!(errors.contains(want), "{bad}:\n{errors}");
    }
}

/// The LiteLLM proxy (mock model) behind an `openai` agent reports tokens; a key's monthly
/// token budget lets the call that crosses it finish and refuses the next, on the other
/// replica too (two replicas on one Redis); the tokens are in the usage read back, priced.
#[tokio::test]
async fn litellm_tokens_count_and_a_token_budget_holds_across_replicas() {
    const KEY: &str = "sk-a2a-gateway-usage-3c1f";
    let proxy = crate::peers::litellm_proxy(KEY).await;
    let url = crate::replicas::redis_url();
    let prefix = crate::replicas::Prefix::new(url);
    let agent = format!(
        "name = \"llm\"\ndescription = \"An assistant behind LiteLLM\"\n[backend]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"mock-gpt\"\napi_key_env = \"A2A_TEST_USAGE_LITELLM_KEY\"\n",
        proxy.url()
    );
    let gateway = format!(
        "[store]\nkind = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{}\"\n[usage]\nenabled = true\nflush_interval_ms = 100\n[pricing.\"mock-gpt\"]\ninput_per_million = 2.0\noutput_per_million = 8.0\n[[budgets]]\nid = \"team-tokens\"\ncallers = [\"key:team\"]\nwindow = \"month\"\nmax_tokens = 20\n{}",
        prefix.prefix,
        keys(&["team"])
    );
    let env = [("A2A_TEST_USAGE_LITELLM_KEY", KEY)];
    let a = Running::start_env(&[("llm.toml", &agent)], &gateway, "info", &env);
    let b = Running::start_env(&[("llm.toml", &agent)], &gateway, "info", &env);

    // Under the limit: allowed; its tokens (LiteLLM's usage) cross it.
    let (status, headers, first) = send_as(&a.client, &a.base, "llm", "team", "hi").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(headers["x-budget-unit"], "tokens");
    let task = &first["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{first}");
    let usage = &task["metadata"]["usage"];
    let tokens =
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap();
    assert!(
        tokens >= 20,
        "the mock's answer crosses the budget: {usage}"
    );
    // The next call, through the other replica: refused.
    let (status, headers, refused) = send_as(&b.client, &b.base, "llm", "team", "again").await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(headers["x-budget-id"], "team-tokens");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("20 tokens per month for key:team"),
        "{message}"
    );
    let first_of_next_month = {
        use chrono::Datelike;
        let today = chrono::Utc::now().date_naive();
        let (y, m) = match today.month() {
            12 => (today.year() + 1, 1),
            m => (today.year(), m + 1),
        };
        format!("{y}-{m:02}-01T00:00:00Z")
    };
    assert!(message.contains(&first_of_next_month), "{message}");

    // Usage through either replica: the tokens, their model and their cost, once both
    // replicas' counts have been flushed (each flushes on its own second).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let report = loop {
        let (_, report) = admin_json(&b.client, &b.base, "/usage?group_by=caller").await;
        if report["total"]["tokens"].as_u64() == Some(tokens) && report["total"]["requests"] == 2 {
            break report;
        }
        assert!(std::time::Instant::now() < deadline, "{report}");
        // Each replica flushes on its own second: A's tokens may be in before B's refusal.
        let (counted, requests) = (&report["total"]["tokens"], &report["total"]["requests"]);
        assert!(
            counted.as_u64().unwrap_or(0) <= tokens && requests.as_u64().unwrap_or(0) <= 2,
            "{report}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let row = &report["rows"][0];
    assert_eq!(row["caller"], "key:team");
    assert_eq!(row["requests"], 2, "{report}");
    let model = &row["models"]["mock-gpt"];
    let (input, output) = (
        model["input_tokens"].as_f64().unwrap(),
        model["output_tokens"].as_f64().unwrap(),
    );
    let price = (input * 2.0 + output * 8.0) / 1e6;
    assert!(
        (row["cost"].as_f64().unwrap() - price).abs() < 1e-9,
        "{report}"
    );
    // Prometheus: by agent and model, not by key.
    let metrics = a.metrics().await;
    assert!(
        metrics.contains("a2a_usage_tokens_total{agent=\"llm\",caller=\"\",direction=\"output\",model=\"mock-gpt\"}"),
        "{metrics}"
    );
}

/// Under a test clock that starts just before a month ends, a monthly budget refuses in
/// January and lets the same caller through once February starts; the usage read back has
/// both days.
#[tokio::test]
async fn the_month_rolls_over_under_a_test_clock() {
    let gateway = format!(
        "[usage]\nenabled = true\nflush_interval_ms = 100\n[[budgets]]\nid = \"monthly\"\ncallers = [\"*\"]\nwindow = \"month\"\nmax_requests = 2\n{}",
        keys(&["a"])
    );
    let started = Instant::now();
    let gw = Running::start_env(
        &[("echo.toml", ECHO)],
        &gateway,
        "info",
        &[("A2A_GATEWAY_CLOCK_START", "2026-01-31T23:59:56Z")],
    );
    for i in 0..2 {
        let (status, _, answer) = send_as(&gw.client, &gw.base, "echo", "a", &format!("{i}")).await;
        assert_eq!(status, 200, "{answer}");
    }
    let (status, headers, refused) = send_as(&gw.client, &gw.base, "echo", "a", "more").await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the calls took too long to be in January"
    );
    assert_eq!(status, 429, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("resets at 2026-02-01T00:00:00Z"),
        "{message}"
    );
    let reset: u64 = headers["x-budget-reset"].to_str().unwrap().parse().unwrap();
    assert!(reset <= 4, "{reset}");
    // Once the clock passes midnight: a new month, a new allowance.
    tokio::time::sleep(Duration::from_secs(reset + 1)).await;
    let (status, headers, answer) = send_as(&gw.client, &gw.base, "echo", "a", "february").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["x-budget-remaining"], "1");
    let (_, report) = admin_json(
        &gw.client,
        &gw.base,
        "/usage?group_by=day&from=2026-01-01&to=2026-02-28",
    )
    .await;
    let days: Vec<(&str, u64)> = (report["rows"].as_array().unwrap().iter())
        .map(|r| (r["day"].as_str().unwrap(), r["requests"].as_u64().unwrap()))
        .collect();
    assert_eq!(days, [("2026-01-31", 3), ("2026-02-01", 1)], "{report}");
}

/// On SQLite: usage and what budgets spent survive a restart; a replica killed outright
/// loses at most the counts since its last flush (an interval, and the time the flush
/// took; the figure printed).
#[tokio::test]
async fn usage_and_budgets_survive_a_restart_and_kill_9_loses_one_flush_at_most() {
    let gateway = format!(
        "[store]\nkind = \"sqlite\"\ndata_dir = \"data\"\n[usage]\nenabled = true\nflush_interval_ms = 1000\n[[budgets]]\nid = \"big\"\ncallers = [\"*\"]\nwindow = \"day\"\nmax_requests = 100000\n{}",
        keys(&["a"])
    );
    let mut gw = Running::start(&[("echo.toml", ECHO)], &gateway, "info");
    for i in 0..20 {
        let (status, _, _) = send_as(&gw.client, &gw.base, "echo", "a", &format!("{i}")).await;
        assert_eq!(status, 200);
    }
    // A graceful stop writes everything.
    gw.signal("TERM");
    let (status, _) = gw.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "a drained exit: {status:?}");
    gw.restart();
    let (_, report) = admin_json(&gw.client, &gw.base, "/usage").await;
    assert_eq!(report["total"]["requests"], 20, "{report}");
    let (_, headers, _) = send_as(&gw.client, &gw.base, "echo", "a", "after").await;
    assert_eq!(
        headers["x-budget-remaining"],
        (100_000 - 21).to_string().as_str()
    );

    // Calls for 2.5 s, then kill -9: what the last flush interval (1 s) counted may be
    // lost, no more.
    let started = Instant::now();
    let mut made = 1; // the call above
    while started.elapsed() < Duration::from_millis(2500) {
        send_as(&gw.client, &gw.base, "echo", "a", "burst").await;
        made += 1;
    }
    let took = started.elapsed();
    gw.kill_hard();
    gw.restart();
    let (_, report) = admin_json(&gw.client, &gw.base, "/usage").await;
    let counted = report["total"]["requests"].as_u64().unwrap() - 20;
    let lost = made - counted;
    let per_second = made as f64 / took.as_secs_f64();
    println!(
        "kill -9 after {made} calls in {:.2} s: {lost} counts lost ({:.0} calls a second, a flush interval of 1 s)",
        took.as_secs_f64(),
        per_second
    );
    assert!(counted <= made, "{report}");
    // The next flush is an interval after the last one finished, and a loaded machine (CI
    // met 1.5 s' worth) takes a while to write it: up to two intervals' counts.
    assert!(
        (lost as f64) <= per_second * 2.0 + 5.0,
        "lost {lost} counts, more than two flush intervals' ({per_second:.0} calls a second)"
    );
    assert!(
        counted > 0,
        "the earlier intervals' counts were kept: {report}"
    );
    // What budgets spent is written with the counts.
    let (_, headers, _) = send_as(&gw.client, &gw.base, "echo", "a", "last").await;
    let remaining: u64 = headers["x-budget-remaining"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let spent = 100_000 - remaining - 20;
    assert!(
        spent > counted / 2 && spent <= made + 1,
        "spent {spent}, counted {counted}, made {made}"
    );
}

/// A budget's warning line and its limit are posted to its webhook by the push machinery,
/// once each, as JSON naming the budget, the caller and when it resets.
#[tokio::test]
async fn budget_alerts_are_posted_to_the_webhook() {
    let hook = crate::push::Receiver::start("127.0.0.1", crate::push::Answer::Ok).await;
    let gateway = format!(
        "[push]\nenabled = true\nallow_http = true\nallow = [\"127.0.0.1\"]\n[[budgets]]\nid = \"watched\"\ncallers = [\"*\"]\nwindow = \"day\"\nmax_requests = 4\nsoft_percent = 50\nwebhook = \"{}\"\n{}",
        hook.url,
        keys(&["a"])
    );
    let gw = spawn_with(&[("echo.toml", ECHO)], &gateway).await;
    for i in 0..5 {
        send_as(&gw.client, &gw.base, "echo", "a", &format!("{i}")).await;
    }
    let got = hook.wait("two alerts", |got| got.len() >= 2).await;
    let levels: Vec<&str> = got
        .iter()
        .map(|g| g.body["level"].as_str().unwrap())
        .collect();
    assert_eq!(levels, ["soft", "spent"], "{got:?}");
    let soft = &got[0].body;
    assert_eq!(soft["budget"], "watched");
    assert_eq!(soft["caller"], "key:a");
    assert_eq!(
        (soft["used"].as_f64(), soft["limit"].as_f64()),
        (Some(2.0), Some(4.0))
    );
    assert_eq!(soft["resets_at"], next_midnight().as_str());
    // Signed as the push machinery signs its notifications.
    let auth = got[0].headers.iter().find(|(k, _)| k == "authorization");
    assert!(
        auth.is_some_and(|(_, v)| v.starts_with("Bearer ")),
        "{got:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hook.got().len(), 2, "each alert once");
}

/// A local program that reports 10 tokens with each chunk it streams.
const TALKER: &str = r#"import json, sys, time
sys.stdin.readline()
for i in range(10):
    usage = {"usage": {"prompt_tokens": 0, "completion_tokens": 10}, "model": "local"}
    print(json.dumps({"artifact": {"text": f"chunk {i} "}, "append": i > 0, "metadata": usage}), flush=True)
    time.sleep(0.2)
print(json.dumps({"result": "done"}), flush=True)
"#;

/// A budget that stops streaming tasks: the task whose reported tokens reach it is
/// canceled mid-stream, saying why, and the caller's next call is refused.
#[tokio::test]
async fn a_budget_stops_a_streaming_task_that_crosses_it() {
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), TALKER).unwrap();
    let agent = format!(
        "name = \"talker\"\ndescription = \"Streams chunks, reporting tokens\"\n[backend]\nkind = \"command\"\ncommand = [\"python3\", {:?}]\nio = \"jsonl\"\n",
        script.path().display().to_string()
    );
    let gateway = format!(
        "[usage]\nenabled = true\nflush_interval_ms = 100\n[[budgets]]\nid = \"short\"\ncallers = [\"*\"]\nwindow = \"day\"\nmax_tokens = 25\nstop_streaming = true\n{}",
        keys(&["a"])
    );
    let gw = spawn_with(&[("talker.toml", &agent)], &gateway).await;
    let events: Vec<Value> = (stream_as(&gw, "talker", "a", "talk").await.into_iter())
        .map(|e| e["result"].clone())
        .collect();
    let chunks = events
        .iter()
        .filter(|e| e.get("artifactUpdate").is_some())
        .count();
    assert_eq!(chunks, 3, "the third chunk's tokens reach 25: {events:#?}");
    let last = &events.last().unwrap()["statusUpdate"]["status"];
    assert_eq!(last["state"], "TASK_STATE_CANCELED", "{events:#?}");
    let why = last["message"]["parts"][0]["text"].as_str().unwrap();
    assert!(
        why.contains("Budget \"short\" is spent") && why.contains("30 used"),
        "{why}"
    );
    let (status, _, refused) = send_as(&gw.client, &gw.base, "talker", "a", "again").await;
    assert_eq!(status, 429, "{refused}");
    let (_, report) = admin_json(&gw.client, &gw.base, "/usage").await;
    assert_eq!(report["total"]["tasks_by_state"]["canceled"], 1, "{report}");
    assert_eq!(
        report["total"]["models"]["local"]["output_tokens"], 30,
        "{report}"
    );

    // The same program behind an upstream A2A server (another gateway): the relayed stream
    // ends with the refusal after the chunk that crossed, and the upstream task is canceled.
    let upstream = spawn_with(&[("talker.toml", &agent)], "").await;
    let relayed = format!(
        "name = \"relayed\"\ndescription = \"The talker, upstream\"\n[backend]\nkind = \"a2a\"\nurl = \"{}/a2a/agents/talker\"\n",
        upstream.base
    );
    let gw = spawn_with(&[("relayed.toml", &relayed)], &gateway).await;
    let events = stream_as(&gw, "relayed", "a", "talk").await;
    let chunks = (events.iter())
        .filter(|e| e["result"].get("artifactUpdate").is_some())
        .count();
    assert_eq!(chunks, 3, "{events:#?}");
    let last = events.last().unwrap();
    assert_eq!(last["error"]["code"], -32073, "{events:#?}");
    let task_id = events[0]["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut state = Value::Null;
    for _ in 0..50 {
        let got = upstream
            .call(
                "/a2a/agents/talker",
                D::V10,
                "GetTask",
                json!({"id": upstream_id(&task_id)}),
            )
            .await;
        state = got.result()["status"]["state"].clone();
        if state == "TASK_STATE_CANCELED" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, "TASK_STATE_CANCELED", "the upstream task {task_id}");
}

/// The upstream's id of a task the gateway names `<agent>.<id>`, or the id itself.
fn upstream_id(id: &str) -> &str {
    id.split_once('.').map_or(id, |(_, rest)| rest)
}

//! Every bad input gets a precise JSON-RPC error, in the caller's dialect, and leaves the
//! gateway healthy.

use serde_json::{json, Value};

use crate::helpers::{spawn, spawn_with, D, ECHO};

struct Case {
    name: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    body: String,
    http: u16,
    code: i64,
    message_starts: &'static str,
    reason: Option<&'static str>,
}

fn case(
    name: &'static str,
    d: D,
    body: impl Into<String>,
    http: u16,
    code: i64,
    message_starts: &'static str,
    reason: Option<&'static str>,
) -> Case {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(v) = d.header() {
        headers.push(("A2A-Version", v));
    }
    Case {
        name,
        path: "/a2a/agents/echo",
        headers,
        body: body.into(),
        http,
        code,
        message_starts,
        reason,
    }
}

fn rpc(method: &str, params: Value) -> String {
    json!({"jsonrpc":"2.0","id":7,"method":method,"params":params}).to_string()
}

fn cases(d: D) -> Vec<Case> {
    let msg = d.message("hi");
    let mut bad_part = msg.clone();
    bad_part["parts"] = json!([{"kind":"text"}]);
    let mut no_parts = msg.clone();
    no_parts["parts"] = json!([]);
    let mut unknown_task = msg.clone();
    unknown_task["taskId"] = json!("no-such-task");
    let (push_method, card_method, card_code) = match d {
        D::V03 => (
            "tasks/pushNotificationConfig/set",
            "agent/getAuthenticatedExtendedCard",
            -32007,
        ),
        D::V10 => (
            "CreateTaskPushNotificationConfig",
            "GetExtendedAgentCard",
            -32004,
        ),
    };
    let card_reason = if d == D::V03 {
        "EXTENDED_AGENT_CARD_NOT_CONFIGURED"
    } else {
        "UNSUPPORTED_OPERATION"
    };
    vec![
        case(
            "not JSON",
            d,
            "{\"jsonrpc\": ",
            200,
            -32700,
            "Parse error",
            Some("PARSE_ERROR"),
        ),
        case("empty body", d, "", 200, -32700, "Parse error", None),
        case(
            "batch",
            d,
            "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"GetTask\"}]",
            200,
            -32600,
            "Invalid request: batch requests are not supported",
            None,
        ),
        case(
            "scalar body",
            d,
            "42",
            200,
            -32600,
            "Invalid request: the body must be a JSON-RPC 2.0 request object",
            None,
        ),
        case(
            "jsonrpc 1.0",
            d,
            json!({"jsonrpc":"1.0","id":1,"method":d.get()}).to_string(),
            200,
            -32600,
            "Invalid request: \"jsonrpc\" must be exactly \"2.0\"",
            Some("INVALID_REQUEST"),
        ),
        // No id: judged like `"id": null` (the official SDKs do the same).
        case(
            "missing id, unknown method",
            d,
            json!({"jsonrpc":"2.0","method":"message/ssend","params":{}}).to_string(),
            200,
            -32601,
            "Method not found: message/ssend",
            Some("METHOD_NOT_FOUND"),
        ),
        case(
            "missing id, bad params",
            d,
            json!({"jsonrpc":"2.0","method":d.send(),"params":{"":"x"}}).to_string(),
            200,
            -32602,
            "Invalid params: missing field `message`",
            Some("INVALID_PARAMS"),
        ),
        case(
            "null id, unknown task",
            d,
            json!({"jsonrpc":"2.0","id":null,"method":d.get(),"params":{"id":"nope"}}).to_string(),
            200,
            -32001,
            "Task not found",
            Some("TASK_NOT_FOUND"),
        ),
        case(
            "object id",
            d,
            json!({"jsonrpc":"2.0","id":{},"method":d.get()}).to_string(),
            200,
            -32600,
            "Invalid request: \"id\" must be a string or a number",
            None,
        ),
        case(
            "numeric method",
            d,
            json!({"jsonrpc":"2.0","id":1,"method":5}).to_string(),
            200,
            -32600,
            "Invalid request: \"method\" must be a string",
            None,
        ),
        case(
            "unknown method",
            d,
            rpc("tasks/explode", json!({})),
            200,
            -32601,
            "Method not found: tasks/explode",
            Some("METHOD_NOT_FOUND"),
        ),
        case(
            "params not an object",
            d,
            rpc(d.get(), json!([1, 2])),
            200,
            -32602,
            "Invalid params: \"params\" must be an object",
            Some("INVALID_PARAMS"),
        ),
        case(
            "missing message",
            d,
            rpc(d.send(), json!({})),
            200,
            -32602,
            "Invalid params: missing field `message`",
            Some("INVALID_PARAMS"),
        ),
        case(
            "message of wrong type",
            d,
            rpc(d.send(), json!({"message": "hi"})),
            200,
            -32602,
            "Invalid params: params.message: invalid type",
            None,
        ),
        case(
            "part with no content",
            d,
            rpc(d.send(), json!({"message": bad_part})),
            200,
            -32602,
            "Invalid params: params.message.parts[0]: part (kind \"text\") has none of",
            None,
        ),
        case(
            "no parts",
            d,
            rpc(d.send(), json!({"message": no_parts})),
            200,
            -32602,
            "Invalid params: params.message.parts: a message needs at least one part",
            None,
        ),
        case(
            "negative historyLength",
            d,
            rpc(d.get(), json!({"id":"x","historyLength":-1})),
            200,
            -32602,
            "Invalid params: params.historyLength: must not be negative",
            None,
        ),
        case(
            "unknown task",
            d,
            rpc(d.get(), json!({"id":"no-such-task"})),
            200,
            -32001,
            "Task not found: no-such-task",
            Some("TASK_NOT_FOUND"),
        ),
        case(
            "unknown task on cancel",
            d,
            rpc(d.cancel(), json!({"id":"no-such-task"})),
            200,
            -32001,
            "Task not found: no-such-task",
            Some("TASK_NOT_FOUND"),
        ),
        case(
            "unknown task on subscribe",
            d,
            rpc(d.subscribe(), json!({"id":"no-such-task"})),
            200,
            -32001,
            "Task not found: no-such-task",
            Some("TASK_NOT_FOUND"),
        ),
        case(
            "send to unknown taskId",
            d,
            rpc(d.send(), json!({"message": unknown_task})),
            200,
            -32001,
            "Task not found: no-such-task",
            Some("TASK_NOT_FOUND"),
        ),
        case(
            "push config",
            d,
            rpc(push_method, json!({"taskId":"x"})),
            200,
            -32003,
            "Push notifications are not supported",
            Some("PUSH_NOTIFICATION_NOT_SUPPORTED"),
        ),
        case(
            "inline push config",
            d,
            rpc(
                d.send(),
                json!({"message": msg, "configuration": {"pushNotificationConfig": {"url": "http://x"}}}),
            ),
            200,
            -32003,
            "Push notifications are not supported",
            None,
        ),
        case(
            "extended card",
            d,
            rpc(card_method, json!({})),
            200,
            card_code,
            "",
            Some(card_reason),
        ),
    ]
}

fn check_error_shape(d: D, body: &Value, reason: Option<&str>, name: &str) {
    assert_eq!(body["jsonrpc"], "2.0", "{name}: {body}");
    assert!(body.get("result").is_none(), "{name}: {body}");
    let data = &body["error"]["data"];
    match d {
        D::V03 => assert!(
            data.is_null() || data.is_object(),
            "{name}: 0.3 data is an object or absent: {body}"
        ),
        D::V10 => {
            let info = &data[0];
            assert_eq!(
                info["@type"], "type.googleapis.com/google.rpc.ErrorInfo",
                "{name}: {body}"
            );
            if let Some(r) = reason {
                assert_eq!(info["reason"], r, "{name}: {body}");
            }
        }
    }
}

#[tokio::test]
async fn every_bad_input_gets_a_precise_error_in_both_dialects() {
    let gw = spawn().await;
    for d in [D::V03, D::V10] {
        for c in cases(d) {
            let r = gw.post_raw(c.path, &c.headers, c.body.clone()).await;
            let label = format!("{} ({d:?})", c.name);
            assert_eq!(r.status, c.http, "{label}: {}", r.body);
            assert_eq!(r.code(), c.code, "{label}: {}", r.body);
            assert!(
                r.message().starts_with(c.message_starts),
                "{label}: message {:?}",
                r.message()
            );
            check_error_shape(d, &r.body, c.reason, &label);
            let sent_id = serde_json::from_str::<Value>(&c.body)
                .ok()
                .and_then(|b| b.get("id").cloned())
                .filter(|id| id.is_string() || id.is_number())
                .unwrap_or(Value::Null);
            assert_eq!(r.body["id"], sent_id, "{label}: the id comes back as sent");
        }
    }
    let health = gw.client.get(gw.url("/a2a/health")).send().await.unwrap();
    assert_eq!(health.status(), 200, "still healthy after every bad input");
}

#[tokio::test]
async fn ids_are_echoed_back_on_errors() {
    let gw = spawn().await;
    let body =
        json!({"jsonrpc":"2.0","id":"abc","method":"GetTask","params":{"id":"zz"}}).to_string();
    let r = gw
        .post_raw("/a2a/agents/echo", &[("A2A-Version", "1.0")], body)
        .await;
    assert_eq!(r.body["id"], "abc");
    let r = gw.post_raw("/a2a/agents/echo", &[], "{oops").await;
    assert_eq!(
        r.body["id"],
        Value::Null,
        "parse errors answer with id null"
    );
}

#[tokio::test]
async fn transport_level_errors_carry_http_statuses() {
    let gw = spawn().await;
    let get = rpc("GetTask", json!({"id":"x"}));

    let r = gw
        .post_raw("/a2a/agents/nope", &[("A2A-Version", "1.0")], get.clone())
        .await;
    assert_eq!((r.status, r.code()), (404, -32040), "{}", r.body);
    assert_eq!(r.message(), "Unknown agent: nope");
    assert_eq!(r.body["id"], 7);
    assert_eq!(
        r.body["error"]["data"][0]["metadata"]["availableAgents"],
        "echo,other"
    );
    let r = gw
        .post_raw("/a2a/agents/nope", &[], rpc("tasks/get", json!({"id":"x"})))
        .await;
    assert_eq!(
        r.body["error"]["data"]["availableAgents"],
        json!(["echo", "other"]),
        "0.3 shape"
    );

    let r = gw
        .post_raw(
            "/a2a/agents/echo",
            &[("content-type", "text/plain")],
            get.clone(),
        )
        .await;
    assert_eq!((r.status, r.code()), (415, -32005), "{}", r.body);
    assert!(
        r.message()
            .starts_with("Content type not supported: \"text/plain\""),
        "{}",
        r.message()
    );

    for ok_type in ["application/json; charset=utf-8", "application/a2a+json"] {
        let r = gw
            .post_raw(
                "/a2a/agents/echo",
                &[("content-type", ok_type), ("A2A-Version", "1.0")],
                get.clone(),
            )
            .await;
        assert_eq!(r.code(), -32001, "{ok_type} is accepted");
    }

    let r = gw
        .post_raw("/a2a/agents/echo", &[("A2A-Version", "2.0")], get.clone())
        .await;
    assert_eq!((r.status, r.code()), (200, -32009), "{}", r.body);
    assert_eq!(
        r.message(),
        "A2A protocol version 2.0 is not supported (supported: 0.3, 1.0)"
    );
    assert_eq!(r.body["id"], 7, "the id is recovered for version errors");
    assert_eq!(
        r.body["error"]["data"][0]["reason"],
        "VERSION_NOT_SUPPORTED"
    );

    let r = gw
        .post_raw("/a2a/agents/echo?A2A-Version=9.9", &[], get.clone())
        .await;
    assert_eq!(r.code(), -32009, "the query-parameter form is honoured");
}

#[tokio::test]
async fn oversized_bodies_are_refused_with_the_configured_limit() {
    let gw = spawn_with(&[("echo.toml", ECHO)], "[limits]\nmax_body_bytes = 2048").await;
    let big = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage",
        "params":{"message":{"role":"ROLE_USER","messageId":"m","parts":[{"text":"x".repeat(4096)}]}}});
    let r = gw
        .post_raw(
            "/a2a/agents/echo",
            &[("A2A-Version", "1.0")],
            big.to_string(),
        )
        .await;
    assert_eq!((r.status, r.code()), (413, -32060), "{}", r.body);
    assert_eq!(r.message(), "Request body exceeds the limit of 2048 bytes");

    // Without Content-Length (chunked), the limit still holds while reading.
    let chunks: Vec<Result<String, std::io::Error>> = (0..8).map(|_| Ok("x".repeat(512))).collect();
    let stream = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let r = gw.post_raw("/a2a/agents/echo", &[], stream).await;
    assert_eq!((r.status, r.code()), (413, -32060), "{}", r.body);

    let ok = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("small")}),
        )
        .await;
    assert_eq!(ok.status, 200, "a normal request still works afterwards");
}

#[tokio::test]
async fn default_endpoint_without_a_default_agent_lists_the_agents() {
    let gw = spawn_with(
        &[("echo.toml", ECHO), ("other.toml", crate::helpers::OTHER)],
        "",
    )
    .await;
    let r = gw.call("/a2a", D::V10, "GetTask", json!({"id":"x"})).await;
    assert_eq!((r.status, r.code()), (404, -32040), "{}", r.body);
    assert_eq!(
        r.body["error"]["data"][0]["metadata"]["availableAgents"],
        "echo,other"
    );
}

#[tokio::test]
async fn wrong_http_methods_and_paths_get_json_errors() {
    let gw = spawn().await;
    // Both JSON-RPC endpoints, which the edge serves itself rather than through the router.
    for path in ["/a2a/agents/echo", "/a2a", "/a2a/"] {
        for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
            let r = gw
                .client
                .request(method.clone(), gw.url(path))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 405, "{method} {path}");
            assert_eq!(r.headers()["allow"], "POST", "{method} {path}");
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], 405, "{method} {path}");
        }
    }
    let r = gw.client.get(gw.url("/nothing/here")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/nothing/here"));
}

#[tokio::test]
async fn a_full_mailbox_answers_busy_at_once() {
    let slow = r#"
name = "slow"
description = "one at a time"
[backend]
kind = "echo"
[limits]
max_concurrency = 1
mailbox = 1
"#;
    let gw = spawn_with(&[("slow.toml", slow)], "").await;
    let send = |text: &'static str| {
        let msg = D::V10.message(text);
        gw.call(
            "/a2a/agents/slow",
            D::V10,
            "SendMessage",
            json!({"message": msg, "configuration": {"returnImmediately": true}}),
        )
    };
    // The first runs (holding the only slot), the second waits in the mailbox...
    let running = send("/delay 2 first");
    let first = running.await;
    assert_eq!(first.status, 200, "{}", first.body);
    let queued = tokio::spawn({
        let client = gw.client.clone();
        let url = gw.url("/a2a/agents/slow");
        async move {
            client.post(url).header("A2A-Version", "1.0")
                .body(json!({"jsonrpc":"2.0","id":2,"method":"SendMessage","params":{"message": D::V10.message("second")}}).to_string())
                .send().await.unwrap().status()
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // ...and the third finds the mailbox full.
    let third = send("third").await;
    assert_eq!(
        (third.status, third.code()),
        (503, -32050),
        "{}",
        third.body
    );
    assert_eq!(third.headers["retry-after"], "1");
    assert_eq!(
        third.message(),
        "Agent slow is busy: its mailbox is full, retry later"
    );
    assert_eq!(
        queued.await.unwrap(),
        200,
        "the queued one is served after the first"
    );
}

/// Ids come back exactly as sent: numbers past 64 bits, fractions and exponents are not
/// rounded through a float, on answers and on errors alike.
#[tokio::test]
async fn ids_come_back_exactly_as_written() {
    let gw = spawn().await;
    for id in [
        "123456789012345678901234567890",
        "-1.25e-3",
        "1.0",
        "18446744073709551615",
        "\"\\u0041b\"",
    ] {
        for (method, params) in [
            ("SendMessage", json!({"message": D::V10.message("x")})),
            ("GetTask", json!({"id": "missing"})),
        ] {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#);
            let resp = gw
                .client
                .post(gw.url("/a2a/agents/echo"))
                .header("A2A-Version", "1.0")
                .body(body)
                .send()
                .await
                .unwrap();
            let text = resp.text().await.unwrap();
            let want_id = if id.starts_with('"') {
                "\"Ab\"".to_string()
            } else {
                id.to_string()
            };
            assert!(
                text.contains(&format!("\"id\":{want_id},")),
                "{method} with id {id}: {text}"
            );
        }
    }
}

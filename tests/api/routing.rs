//! Routing on the shared /a2a endpoint: each request's agent and the reason, in order.

use serde_json::{json, Value};

use crate::helpers::{rpc, sha, spawn_shipped, spawn_with, TestGateway, D, ECHO};

fn agent(name: &str) -> String {
    ECHO.replace("name = \"echo\"", &format!("name = \"{name}\""))
        .replace("id = \"echo\"", &format!("id = \"{name}-skill\""))
}

async fn routed_gateway(default: bool) -> TestGateway {
    let gateway = format!(
        r#"{}
[[auth.api_keys]]
id = "fin-1"
secret_sha256 = "{}"
[[routing.rules]]
agent = "finance"
tags = ["finance"]
[[routing.rules]]
agent = "other"
text = "(?i)^translate"
[[routing.rules]]
agent = "finance"
principal = "key:fin*"
"#,
        if default {
            "default_agent = \"echo\""
        } else {
            ""
        },
        sha("fin-key")
    );
    spawn_with(
        &[
            ("echo.toml", &agent("echo")),
            ("other.toml", &agent("other")),
            ("finance.toml", &agent("finance")),
        ],
        &gateway,
    )
    .await
}

/// Sends to /a2a and returns (agent header, route header, body).
async fn via_shared(
    gw: &TestGateway,
    method: &str,
    params: Value,
    key: Option<&str>,
) -> (String, String, Value) {
    let mut req = gw.client.post(gw.url("/a2a")).header("A2A-Version", "1.0");
    if let Some(k) = key {
        req = req.header("X-API-Key", k);
    }
    let resp = req.body(rpc(method, json!(params))).send().await.unwrap();
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let (a, r) = (h("a2a-gateway-agent"), h("a2a-gateway-route"));
    (a, r, resp.json().await.unwrap())
}

/// (`gateway/agent`, `gateway/route`) from the metadata of a task, message or event, in
/// either dialect's result shape.
fn served_by(result: &Value) -> (&str, &str) {
    let object = ["task", "message", "statusUpdate", "artifactUpdate"]
        .iter()
        .map(|k| &result[k])
        .find(|v| v.is_object())
        .unwrap_or(result);
    let meta = &object["metadata"];
    (
        meta["gateway/agent"].as_str().unwrap_or_default(),
        meta["gateway/route"].as_str().unwrap_or_default(),
    )
}

fn msg(text: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut m = D::V10.message(text);
    edit(&mut m);
    json!({"message": m})
}

/// (label, send params, API key, expected agent, expected reason)
type Case = (
    &'static str,
    Value,
    Option<&'static str>,
    &'static str,
    &'static str,
);

/// Sets up a task waiting for input and a conversation, both served by `other`.
async fn owned_by_other(gw: &TestGateway, context: &str) -> String {
    let r = gw
        .call(
            "/a2a/agents/other",
            D::V10,
            "SendMessage",
            msg("/input your name?", |m| m["contextId"] = json!(context)),
        )
        .await;
    r.result()["task"]["id"].as_str().unwrap().to_string()
}

/// One send per routing step, in order, each expecting its agent and reason; the same
/// table serves `/a2a` and the REST binding's `/a2a/rest/message:send`.
fn send_cases(task_id: &str, context: &str) -> Vec<Case> {
    vec![
        (
            "task affinity",
            msg("Ada", |m| m["taskId"] = json!(task_id)),
            None,
            "other",
            "task",
        ),
        (
            "context affinity",
            msg("again", |m| m["contextId"] = json!(context)),
            None,
            "other",
            "context",
        ),
        (
            "agent in message metadata",
            msg("x", |m| m["metadata"] = json!({"gateway/agent": "other"})),
            None,
            "other",
            "metadata-agent",
        ),
        (
            "skill in request metadata",
            json!({"message": D::V10.message("x"), "metadata": {"gateway/skill": "finance/finance-skill"}}),
            None,
            "finance",
            "metadata-skill",
        ),
        (
            "rule 1: tags",
            msg("x", |m| {
                m["metadata"] = json!({"gateway/tags": ["finance"]})
            }),
            None,
            "finance",
            "rule-1",
        ),
        (
            "rule 2: text",
            msg("Translate this please", |_| {}),
            None,
            "other",
            "rule-2",
        ),
        (
            "rule 3: principal",
            msg("plain", |_| {}),
            Some("fin-key"),
            "finance",
            "rule-3",
        ),
        (
            "rules in order: tags beat text",
            msg("translate", |m| {
                m["metadata"] = json!({"gateway/tags": ["finance"]})
            }),
            None,
            "finance",
            "rule-1",
        ),
        ("default", msg("hello", |_| {}), None, "echo", "default"),
    ]
}

#[tokio::test]
async fn each_request_reaches_the_right_agent_for_the_right_reason() {
    let gw = routed_gateway(true).await;
    let task_id = owned_by_other(&gw, "ctx-affinity").await;
    let (agent, reason, body) =
        via_shared(&gw, "GetTask", json!({"id": task_id.clone()}), None).await;
    assert_eq!((agent.as_str(), reason.as_str()), ("other", "task"));
    assert_eq!(served_by(&body["result"]), ("other", "task"), "{body}");

    for (label, params, key, want_agent, want_reason) in send_cases(&task_id, "ctx-affinity") {
        let (agent, reason, body) = via_shared(&gw, "SendMessage", params, key).await;
        assert!(body.get("result").is_some(), "{label}: {body}");
        assert_eq!(
            (agent.as_str(), reason.as_str()),
            (want_agent, want_reason),
            "{label}"
        );
        assert_eq!(
            served_by(&body["result"]),
            (want_agent, want_reason),
            "{label}: the reply's metadata says it too: {body}"
        );
    }
    // A new conversation started on /a2a stays with the agent that took it.
    let (_, _, body) = via_shared(&gw, "SendMessage", msg("translate me", |_| {}), None).await;
    let ctx = body["result"]["task"]["contextId"].clone();
    assert!(ctx.as_str().unwrap().starts_with("other."), "{ctx}");
    assert_eq!(
        follow_up(&gw, ctx).await,
        ("other".into(), "context".into())
    );

    // So does one started on an agent's own endpoint: the id the gateway made names it.
    let started = gw
        .call(
            "/a2a/agents/finance",
            D::V10,
            "SendMessage",
            msg("hi", |_| {}),
        )
        .await;
    let ctx = started.result()["task"]["contextId"].clone();
    assert_eq!(
        follow_up(&gw, ctx).await,
        ("finance".into(), "context".into())
    );

    // A contextId the client chose is recorded; the record beats what the id looks like.
    let chosen = json!("finance.chosen-by-client");
    gw.call(
        "/a2a/agents/other",
        D::V10,
        "SendMessage",
        msg("hi", |m| m["contextId"] = chosen.clone()),
    )
    .await;
    assert_eq!(
        follow_up(&gw, chosen).await,
        ("other".into(), "context".into())
    );
}

/// Sends a message in conversation `ctx` to /a2a: (agent, reason) of the answer.
async fn follow_up(gw: &TestGateway, ctx: Value) -> (String, String) {
    let (agent, reason, _) = via_shared(
        gw,
        "SendMessage",
        msg("and then", |m| m["contextId"] = ctx),
        None,
    )
    .await;
    (agent, reason)
}

#[tokio::test]
async fn named_endpoints_and_0_3_replies_name_their_agent_too() {
    let gw = routed_gateway(true).await;
    let r = gw
        .call(
            "/a2a/agents/other",
            D::V03,
            "message/send",
            json!({"message": D::V03.message("hi")}),
        )
        .await;
    assert_eq!(r.header("a2a-gateway-agent"), "other");
    assert_eq!(
        r.header("a2a-gateway-route"),
        "",
        "no routing on a named endpoint"
    );
    assert_eq!(served_by(r.result()), ("other", ""));
    assert_eq!(r.result()["kind"], "task");

    // The note is written into each reply, not stored with the task: read back on the
    // agent's own endpoint, a task answered on /a2a has no route.
    let (_, _, body) = via_shared(&gw, "SendMessage", msg("translate me", |_| {}), None).await;
    let (agent, reason) = served_by(&body["result"]);
    assert_eq!(agent, "other", "{body}");
    assert!(!reason.is_empty(), "{body}");
    let id = body["result"]["task"]["id"].clone();
    for (d, method) in [(D::V10, "GetTask"), (D::V03, "tasks/get")] {
        let r = gw
            .call("/a2a/agents/other", d, method, json!({"id": id}))
            .await;
        assert_eq!(served_by(r.result()), ("other", ""), "{d:?}");
    }

    // Every event of a stream says who sent it, on the shared endpoint with the reason.
    let events = gw
        .sse(
            "/a2a",
            D::V10,
            "SendStreamingMessage",
            msg("stream me", |m| {
                m["metadata"] = json!({"gateway/agent": "finance"})
            }),
        )
        .await;
    assert!(events.len() >= 3, "{events:?}");
    for e in &events {
        assert_eq!(
            served_by(&e.data["result"]),
            ("finance", "metadata-agent"),
            "{e:?}"
        );
    }
}

/// The HTTP+JSON binding's shared routes (`/a2a/rest/...`) route as `/a2a` does.
#[tokio::test]
async fn the_rest_binding_shared_routes_route_like_the_shared_endpoint() {
    let gw = routed_gateway(true).await;
    let rest = |path: &str| gw.url(&format!("/a2a/rest{path}"));
    let task_id = owned_by_other(&gw, "rest-ctx").await;
    for (label, body, key, want_agent, want_reason) in send_cases(&task_id, "rest-ctx") {
        let mut req = gw
            .client
            .post(rest("/message:send"))
            .header("content-type", "application/a2a+json");
        if let Some(k) = key {
            req = req.header("X-API-Key", k);
        }
        let resp = req.body(body.to_string()).send().await.unwrap();
        let header = |n: &str| {
            resp.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let (agent, reason) = (header("a2a-gateway-agent"), header("a2a-gateway-route"));
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        assert_eq!(status, 200, "{label}: {body}");
        assert_eq!(
            (agent.as_str(), reason.as_str()),
            (want_agent, want_reason),
            "{label}"
        );
        assert_eq!(
            served_by(&body),
            (want_agent, want_reason),
            "{label}: {body}"
        );
    }

    // Task routes follow the task; the task list belongs to the default agent.
    let resp = gw
        .client
        .get(rest(&format!("/tasks/{task_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["a2a-gateway-route"], "task");
    let task: Value = resp.json().await.unwrap();
    assert_eq!(served_by(&task), ("other", "task"), "{task}");
    let resp = gw.client.get(rest("/tasks")).send().await.unwrap();
    assert_eq!(resp.headers()["a2a-gateway-agent"], "echo");
    assert_eq!(resp.headers()["a2a-gateway-route"], "default");

    // A streamed send is routed too, and each event names its agent.
    let resp = gw
        .client
        .post(rest("/message:stream"))
        .header("content-type", "application/a2a+json")
        .body(msg("Translate, streamed", |_| {}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["a2a-gateway-route"], "rule-2");
    let events = crate::helpers::parse_sse(&resp.text().await.unwrap());
    assert!(events.len() >= 3, "{events:?}");
    for e in &events {
        assert_eq!(served_by(&e.data), ("other", "rule-2"), "{e:?}");
    }
}

/// The README's walk-through of the shipped rules.
#[tokio::test]
async fn the_shipped_rules_route_as_documented() {
    let gw = spawn_shipped().await;
    let cases = [
        (msg("shout hello", |_| {}), "shout", "rule-2", "SHOUT HELLO"),
        (
            msg("Ada", |m| {
                m["metadata"] = json!({"gateway/tags": ["greeting"]})
            }),
            "greet",
            "rule-1",
            "Hello, Ada!",
        ),
        (msg("hello", |_| {}), "echo", "default", "hello"),
    ];
    for (params, want_agent, want_reason, want_text) in cases {
        let (agent, reason, body) = via_shared(&gw, "SendMessage", params, None).await;
        assert_eq!((agent.as_str(), reason.as_str()), (want_agent, want_reason));
        let task = &body["result"]["task"];
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{body}");
        let texts: Vec<&str> = task["artifacts"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|a| a["parts"].as_array().into_iter().flatten())
            .filter_map(|p| p["text"].as_str())
            .collect();
        assert!(
            texts.iter().any(|t| t.trim() == want_text),
            "{want_agent}: {body}"
        );
    }
}

#[tokio::test]
async fn no_match_without_a_default_lists_the_agents() {
    let gw = routed_gateway(false).await;
    let (_, _, body) = via_shared(&gw, "SendMessage", msg("hello", |_| {}), None).await;
    assert_eq!(body["error"]["code"], -32040, "{body}");
    assert_eq!(
        body["error"]["data"][0]["metadata"]["availableAgents"],
        "echo,finance,other"
    );
    let (_, _, body) = via_shared(
        &gw,
        "SendMessage",
        msg("x", |m| m["metadata"] = json!({"gateway/agent": "ghost"})),
        None,
    )
    .await;
    assert_eq!(body["error"]["message"], "Unknown agent: ghost");
}

#[test]
fn bad_rules_are_reported_with_file_and_line() {
    let err = crate::helpers::load_errors(
        &[("echo.toml", ECHO)],
"[[routing.rules]]\nagent = \"ghost\"\ntags = [\"x\"]\n[[routing.rules]]\nagent = \"echo\"\ntext = \"(unclosed\"\n[[routing.rules]]\nagent = \"echo\"\n",
);
    assert!(
        err.contains("gateway.toml:2:9: routing rule 1: agent \"ghost\" is not defined"),
        "{err}"
    );
    assert!(
        err.contains("gateway.toml:5:9: routing rule 2: text is not a valid regular expression"),
        "{err}"
    );
    assert!(
        err.contains(
            "gateway.toml:8:9: routing rule 3: a rule needs at least one of tags, text, principal"
        ),
        "{err}"
    );
}

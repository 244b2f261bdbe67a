//! Policies in CEL (`[[auth.policies]]`, agents' `[[policies]]`) on every binding, and
//! tiers that weigh methods.

use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{json, Value};

use crate::grpc::{message, probe_one};
use crate::helpers::{rpc, sha, spawn_with, spawn_with_grpc, TestGateway, D, ECHO};
use crate::mcp::{raw_post, raw_session};

const HS_SECRET: &str = "a-test-only-hmac-secret-for-policies-0123";

const PAYMENTS: &str = r#"
name = "payments"
description = "pays and refunds"
[[skills]]
id = "pay"
name = "Pay"
description = "pays"
[[skills]]
id = "refund"
name = "Refund"
description = "refunds"
[backend]
kind = "echo"

[[policies]]
id = "finance-only"
effect = "allow"
when = "request.header('X-Team') == 'finance' || 'finance' in caller.claims.groups"

[[policies]]
id = "no-refunds-by-key"
effect = "deny"
when = "a2a.skill == 'refund' && caller.kind == 'api_key'"
"#;

async fn gateway() -> TestGateway {
    std::env::set_var("A2A_GW_TEST_POLICY_SECRET", HS_SECRET);
    let gateway = format!(
        r#"
[auth]
default_access = "authenticated"
[[auth.api_keys]]
id = "reader"
secret_sha256 = "{reader}"
[[auth.api_keys]]
id = "writer"
secret_sha256 = "{writer}"
[[auth.jwt]]
id = "hs"
algorithm = "HS256"
secret_env = "A2A_GW_TEST_POLICY_SECRET"
issuer = "https://issuer.test"
audience = "a2a-gateway"
agents_claim = "agents"

[[auth.policies]]
id = "readers-cannot-cancel"
effect = "deny"
when = "caller.id == 'key:reader' && a2a.method == 'CancelTask'"

[[auth.policies]]
id = "readers-do-not-stream"
effect = "deny"
agents = ["echo"]
when = "caller.id == 'key:reader' && a2a.streaming"

[[auth.policies]]
id = "needs-a-claim"
effect = "deny"
agents = ["claims"]
when = "caller.claims.level < 3"

[mcp]
enabled = true
"#,
        reader = sha("reader-key"),
        writer = sha("writer-key"),
    );
    let claims = ECHO.replace("name = \"echo\"", "name = \"claims\"");
    spawn_with_grpc(
        &[
            ("echo.toml", ECHO),
            ("payments.toml", PAYMENTS),
            ("claims.toml", &claims),
        ],
        &gateway,
    )
    .await
}

fn jwt(claims: Value) -> String {
    let now = chrono::Utc::now().timestamp();
    let mut all = json!({"sub": "u1", "iss": "https://issuer.test", "aud": "a2a-gateway",
                         "exp": now + 600, "agents": ["*"]});
    all.as_object_mut()
        .unwrap()
        .extend(claims.as_object().unwrap().clone());
    encode(
        &Header::default(),
        &all,
        &EncodingKey::from_secret(HS_SECRET.as_bytes()),
    )
    .unwrap()
}

/// A JSON-RPC 1.0 call to `agent` with these headers.
async fn call(
    gw: &TestGateway,
    agent: &str,
    method: &str,
    params: Value,
    headers: &[(&str, &str)],
) -> crate::helpers::Reply {
    let path = format!("/a2a/agents/{agent}");
    gw.call_with(&path, D::V10, method, params, headers).await
}

fn refused_by(reply: &crate::helpers::Reply, rule: &str) {
    assert_eq!(reply.status, 403, "{}", reply.body);
    let error = &reply.body["error"];
    assert_eq!(error["data"][0]["reason"], "PERMISSION_DENIED", "{error}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("\"{rule}\"")), "{message}");
    assert!(
        !message.contains("caller.id"),
        "never the expression: {message}"
    );
}

#[tokio::test]
async fn a_deny_rule_refuses_its_method_on_every_binding_and_names_itself() {
    let gw = gateway().await;
    let reader = [("X-API-Key", "reader-key")];
    // Reading is allowed: send and get.
    let sent = call(
        &gw,
        "echo",
        "SendMessage",
        json!({"message": message("hi")}),
        &reader,
    )
    .await;
    let task = sent.result()["task"]["id"].as_str().unwrap().to_string();
    let got = call(&gw, "echo", "GetTask", json!({"id": task}), &reader).await;
    assert_eq!(got.result()["id"], task.as_str());
    // Cancel is not: JSON-RPC 1.0, 0.3 (the 1.0 name whatever the dialect), HTTP+JSON, gRPC.
    let cancel = call(&gw, "echo", "CancelTask", json!({"id": task}), &reader).await;
    refused_by(&cancel, "readers-cannot-cancel");
    let v03 = gw
        .call_with(
            "/a2a/agents/echo",
            D::V03,
            "tasks/cancel",
            json!({"id": task}),
            &reader,
        )
        .await;
    assert_eq!(v03.status, 403, "{}", v03.body);
    assert!(
        v03.message().contains("readers-cannot-cancel"),
        "{}",
        v03.body
    );
    let rest = gw
        .client
        .post(gw.url(&format!("/a2a/agents/echo/rest/tasks/{task}:cancel")))
        .header("X-API-Key", "reader-key")
        .header("A2A-Version", "1.0")
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), 403);
    let body: Value = rest.json().await.unwrap();
    assert!(body.to_string().contains("readers-cannot-cancel"), "{body}");
    let grpc = probe_one(
        &gw,
        json!({"method": "CancelTask", "request": {"tenant": "echo", "id": task},
               "metadata": {"x-api-key": "reader-key"}}),
    )
    .await;
    assert_eq!(grpc["code"], "PERMISSION_DENIED", "{grpc}");
    assert!(
        grpc["message"]
            .as_str()
            .unwrap()
            .contains("readers-cannot-cancel"),
        "{grpc}"
    );
    // Another caller may cancel.
    let writer = [("X-API-Key", "writer-key")];
    let by_writer = call(&gw, "echo", "CancelTask", json!({"id": task}), &writer).await;
    assert_ne!(by_writer.status, 403, "{}", by_writer.body);

    // Streams: refused to the reader on JSON-RPC, HTTP+JSON and gRPC, and through MCP
    // (whose tool calls stream).
    let stream = call(
        &gw,
        "echo",
        "SendStreamingMessage",
        json!({"message": message("s")}),
        &reader,
    )
    .await;
    refused_by(&stream, "readers-do-not-stream");
    let rest = gw
        .post_raw(
            "/a2a/agents/echo/rest/message:stream",
            &[
                ("content-type", "application/a2a+json"),
                ("A2A-Version", "1.0"),
                ("X-API-Key", "reader-key"),
            ],
            json!({"message": message("s")}).to_string(),
        )
        .await;
    assert_eq!(rest.status, 403, "{}", rest.body);
    // The route names the method, and no rule for echo reads the skill: the send is refused
    // before its body is read (a body that is not JSON gets the refusal, not a parse
    // error). Payments has a rule that reads the skill, which is in the body: read first.
    for (agent, refusal) in [("echo", 403), ("payments", 400)] {
        let rest = gw
            .post_raw(
                &format!("/a2a/agents/{agent}/rest/message:stream"),
                &[
                    ("content-type", "application/a2a+json"),
                    ("A2A-Version", "1.0"),
                    ("X-API-Key", "reader-key"),
                ],
                "not json".to_string(),
            )
            .await;
        assert_eq!(rest.status, refusal, "{agent}: {}", rest.body);
    }
    let grpc = probe_one(
        &gw,
        json!({"method": "SendStreamingMessage", "request": {"tenant": "echo", "message": message("s")},
               "metadata": {"x-api-key": "reader-key"}}),
    )
    .await;
    assert_eq!(grpc["code"], "PERMISSION_DENIED", "{grpc}");
    let session = raw_session(&gw, Some("reader-key")).await;
    let tool = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {"message": "hi"}}});
    let answer = raw_post(&gw, &tool, Some("reader-key"), Some(&session))
        .await
        .unwrap();
    let text = answer.text().await.unwrap();
    assert!(
        text.contains("\"isError\":true") && text.contains("readers-do-not-stream"),
        "{text}"
    );
    // The rule applies to echo only.
    let payments = gw
        .client
        .post(gw.url("/a2a/agents/payments"))
        .header("content-type", "application/json")
        .header("A2A-Version", "1.0")
        .header("X-API-Key", "reader-key")
        .header("X-Team", "finance")
        .body(rpc(
            "SendStreamingMessage",
            json!({"message": message("s")}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(payments.status(), 200);
    assert_eq!(payments.headers()["content-type"], "text/event-stream");

    let metrics = gw.metrics().await;
    let count = |rule: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("a2a_policy_denials_total{{rule=\"{rule}\"}}")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(count("readers-cannot-cancel"), 4, "{metrics}");
    assert_eq!(count("readers-do-not-stream"), 5, "{metrics}");
}

/// A rule on `a2a.operation` holds whatever way the operation comes: JSON-RPC in every
/// dialect and both variants, HTTP+JSON, gRPC, and an MCP tool call; other operations pass.
#[tokio::test]
async fn an_operation_rule_holds_on_every_binding_dialect_and_variant() {
    let gw = spawn_with_grpc(
        &[("echo.toml", ECHO)],
        "[[auth.policies]]\nid = \"no-sends\"\neffect = \"deny\"\nwhen = \"a2a.operation == 'send'\"\n",
    )
    .await;
    let v01 = json!({"id": "t-01", "message": {"role": "user", "parts": [{"type": "text", "text": "hi"}]}});
    let calls = [
        (D::V10, "SendMessage", json!({"message": message("hi")})),
        (
            D::V10,
            "SendStreamingMessage",
            json!({"message": message("hi")}),
        ),
        (
            D::V03,
            "message/send",
            json!({"message": D::V03.message("hi")}),
        ),
        (
            D::V03,
            "message/stream",
            json!({"message": D::V03.message("hi")}),
        ),
        (D::V03, "tasks/send", v01.clone()),
        (D::V03, "tasks/sendSubscribe", v01),
    ];
    for (d, method, params) in calls {
        let reply = gw.call("/a2a/agents/echo", d, method, params.clone()).await;
        assert_eq!(reply.status, 403, "{method}: {}", reply.body);
        assert!(
            reply.message().contains("\"no-sends\""),
            "{method}: {}",
            reply.body
        );
        let routed = gw.call("/a2a", d, method, params).await;
        assert_eq!(routed.status, 403, "{method} on /a2a: {}", routed.body);
    }
    for route in ["message:send", "message:stream"] {
        let rest = gw
            .post_raw(
                &format!("/a2a/agents/echo/rest/{route}"),
                &[
                    ("content-type", "application/a2a+json"),
                    ("A2A-Version", "1.0"),
                ],
                json!({"message": message("hi")}).to_string(),
            )
            .await;
        assert_eq!(rest.status, 403, "{route}: {}", rest.body);
    }
    for method in ["SendMessage", "SendStreamingMessage"] {
        let grpc = probe_one(
            &gw,
            json!({"method": method, "request": {"tenant": "echo", "message": message("hi")}}),
        )
        .await;
        assert_eq!(grpc["code"], "PERMISSION_DENIED", "{method}: {grpc}");
    }
    let session = raw_session(&gw, None).await;
    let tool = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {"message": "hi"}}});
    let text = raw_post(&gw, &tool, None, Some(&session))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("\"isError\":true") && text.contains("no-sends"),
        "{text}"
    );
    // Reading is another operation.
    let listed = gw
        .call("/a2a/agents/echo", D::V10, "ListTasks", json!({}))
        .await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert!(listed.body.get("result").is_some(), "{}", listed.body);
}

#[tokio::test]
async fn allow_rules_skills_claims_and_failing_rules() {
    let gw = gateway().await;
    let send = json!({"message": message("pay")});
    // An agent file's allow rule: a caller must match it.
    let none = call(
        &gw,
        "payments",
        "SendMessage",
        send.clone(),
        &[("X-API-Key", "writer-key")],
    )
    .await;
    refused_by(&none, "(no allow rule matched)");
    let team = [("X-API-Key", "writer-key"), ("X-Team", "finance")];
    let by_header = call(&gw, "payments", "SendMessage", send.clone(), &team).await;
    assert_eq!(by_header.status, 200, "{}", by_header.body);
    let finance = jwt(json!({"groups": ["finance"]}));
    let bearer = format!("Bearer {finance}");
    let by_claim = call(
        &gw,
        "payments",
        "SendMessage",
        send.clone(),
        &[("Authorization", &bearer)],
    )
    .await;
    assert_eq!(by_claim.status, 200, "{}", by_claim.body);
    let sales = format!("Bearer {}", jwt(json!({"groups": ["sales"]})));
    let other = call(
        &gw,
        "payments",
        "SendMessage",
        send.clone(),
        &[("Authorization", &sales)],
    )
    .await;
    refused_by(&other, "(no allow rule matched)");

    // A skill named in metadata: refunds are not for API keys, but are for the JWT holder.
    let mut refund = message("refund");
    refund["metadata"] = json!({"gateway/skill": "payments/refund"});
    let refund = json!({"message": refund});
    let by_key = call(&gw, "payments", "SendMessage", refund.clone(), &team).await;
    refused_by(&by_key, "payments/no-refunds-by-key");
    let by_jwt = call(
        &gw,
        "payments",
        "SendMessage",
        refund,
        &[("Authorization", &bearer)],
    )
    .await;
    assert_eq!(by_jwt.status, 200, "{}", by_jwt.body);

    // A rule that cannot be evaluated (an API key has no claims) denies; one that can
    // decides.
    let echo = json!({"message": message("x")});
    let failing = call(
        &gw,
        "claims",
        "SendMessage",
        echo.clone(),
        &[("X-API-Key", "writer-key")],
    )
    .await;
    refused_by(&failing, "needs-a-claim");
    let low = format!("Bearer {}", jwt(json!({"level": 1})));
    refused_by(
        &call(
            &gw,
            "claims",
            "SendMessage",
            echo.clone(),
            &[("Authorization", &low)],
        )
        .await,
        "needs-a-claim",
    );
    let high = format!("Bearer {}", jwt(json!({"level": 5})));
    let passed = call(
        &gw,
        "claims",
        "SendMessage",
        echo,
        &[("Authorization", &high)],
    )
    .await;
    assert_eq!(passed.status, 200, "{}", passed.body);
    // The gateway is healthy after every refusal.
    let health = gw.client.get(gw.url("/a2a/ready")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn a_tier_weighs_methods() {
    let gateway = format!(
        r#"
[[auth.api_keys]]
id = "weighed"
secret_sha256 = "{key}"
tier = "weighed"
[rate_limits.tiers.weighed]
requests_per_minute = 1
burst = 6
weights = {{ SendMessage = 5, GetTask = 1 }}
"#,
        key = sha("weighed-key"),
    );
    let gw = spawn_with(&[("echo.toml", ECHO)], &gateway).await;
    let key = [("X-API-Key", "weighed-key")];
    let sent = call(
        &gw,
        "echo",
        "SendMessage",
        json!({"message": message("a")}),
        &key,
    )
    .await;
    let remaining = |r: &crate::helpers::Reply| {
        r.headers["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(remaining(&sent), "1", "a send costs 5 of 6");
    let id = sent.result()["task"]["id"].as_str().unwrap().to_string();
    let got = call(&gw, "echo", "GetTask", json!({"id": id}), &key).await;
    assert_eq!(got.status, 200);
    assert_eq!(remaining(&got), "0");
    let over = call(&gw, "echo", "GetTask", json!({"id": id}), &key).await;
    assert_eq!(over.status, 429, "{}", over.body);
    // Over the JSON-RPC envelope too: a raw body, the same limit.
    let raw = gw
        .post_raw(
            "/a2a/agents/echo",
            &[
                ("content-type", "application/json"),
                ("X-API-Key", "weighed-key"),
            ],
            rpc("GetTask", json!({"id": id})),
        )
        .await;
    assert_eq!(raw.status, 429);
}

/// A rule that cannot be evaluated is logged once (not per request); a reload puts a
/// changed rule in force, and a rule that does not compile leaves the one in force.
#[tokio::test]
async fn a_failing_rule_is_logged_once_and_a_reload_swaps_the_rules() {
    let keys = format!(
        "[[auth.api_keys]]\nid = \"writer\"\nsecret_sha256 = \"{}\"\n",
        sha("writer-key")
    );
    let rule = |when: &str| {
        format!(
            "{keys}[[auth.policies]]\nid = \"claims-rule\"\neffect = \"deny\"\nwhen = \"{when}\"\n"
        )
    };
    let gw = crate::running::Running::start(
        &[("echo.toml", ECHO)],
        &rule("caller.claims.level < 3"),
        "info",
    );
    let key = [("X-API-Key", "writer-key")];
    for _ in 0..3 {
        let r = gw
            .post(
                "/a2a/agents/echo",
                "SendMessage",
                json!({"message": message("x")}),
                &key,
            )
            .await;
        assert_eq!(r.status(), 403);
    }
    gw.wait_for_log("the failing rule", |l| {
        l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("could not be evaluated"))
    })
    .await;
    let logged = gw
        .log_lines()
        .iter()
        .filter(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("could not be evaluated"))
        })
        .count();
    assert_eq!(logged, 1, "logged once per rule");

    // A rule that holds for nobody: the writer passes after the reload.
    std::fs::write(&gw.gateway, rule("a2a.method == 'CancelTask'")).unwrap();
    gw.signal("HUP");
    let mut passed = false;
    for _ in 0..100 {
        let r = gw
            .post(
                "/a2a/agents/echo",
                "SendMessage",
                json!({"message": message("x")}),
                &key,
            )
            .await;
        if crate::helpers::succeeded(r).await {
            passed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(passed, "the reloaded rule is in force");
    // A typo: the reload is refused, the rule in force stays.
    std::fs::write(&gw.gateway, rule("a2a.methd == 'SendMessage'")).unwrap();
    gw.signal("HUP");
    gw.wait_for_log("the refused reload", |l| {
        l.to_string().contains("a2a has no field")
    })
    .await;
    let r = gw
        .post(
            "/a2a/agents/echo",
            "SendMessage",
            json!({"message": message("x")}),
            &key,
        )
        .await;
    crate::helpers::answered(r).await;
}

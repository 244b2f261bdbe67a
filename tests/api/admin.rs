//! The admin API (`/admin/v1`): agents and keys managed at runtime, live at once and on
//! every replica, kept across restarts, every change audited; its OpenAPI document checked
//! by a real validator; its door (admin credentials only, rate-limited, never CORS).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::grpc::probe_one;
use crate::helpers::{sha, spawn_with, spawn_with_grpc, TestGateway, D, ECHO};
use crate::mcp::{raw_post, raw_session};
use crate::running::Running;

const ADMIN: &str = "the-admin-secret";
const CALLER: &str = "a-callers-key";

/// `[admin]` with the key `ops` (secret [`ADMIN`]), `extra` admin settings first, and a
/// caller's key (`CALLER`) for the 403s.
fn admin_gateway(extra: &str) -> String {
    format!(
        "[admin]\n{extra}\n[[admin.keys]]\nid = \"ops\"\nsecret_sha256 = \"{}\"\n[[auth.api_keys]]\nid = \"caller\"\nsecret_sha256 = \"{}\"\n",
        sha(ADMIN),
        sha(CALLER)
    )
}

/// One admin call at `base` with `token`: the status and the JSON answer (null for none).
async fn call_at(
    client: &reqwest::Client,
    base: &str,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = client.request(method, format!("{base}/admin/v1{path}"));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn admin(gw: &TestGateway, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    call_at(&gw.client, &gw.base, Some(ADMIN), method, path, body).await
}

async fn admin_running(
    gw: &Running,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    call_at(&gw.client, &gw.base, Some(ADMIN), method, path, body).await
}

/// A send to `agent` with `key` (X-API-Key) on `base`: its status and answer.
async fn send_at(
    client: &reqwest::Client,
    base: &str,
    agent: &str,
    key: Option<&str>,
) -> (u16, Value) {
    let mut req = client
        .post(format!("{base}/a2a/agents/{agent}"))
        .header("A2A-Version", "1.0")
        .body(crate::helpers::rpc(
            "SendMessage",
            json!({"message": D::V10.message("hello")}),
        ));
    if let Some(key) = key {
        req = req.header("X-API-Key", key);
    }
    let resp = req.send().await.unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(Value::Null),
    )
}

fn violations(answer: &Value) -> Vec<String> {
    answer["error"]["details"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["fieldViolations"].as_array().cloned().unwrap_or_default())
        .map(|v| v["field"].as_str().unwrap_or_default().to_string())
        .collect()
}

const HELPER: &str = r#"{"description": "a helper made at runtime", "skills": [{"id": "help", "name": "Help", "description": "helps"}], "backend": {"kind": "echo"}}"#;

/// Agents made at runtime serve at once (their card, the aggregated card, MCP tools), are
/// checked as files are (errors name the field, a file's agent is read-only, a stale
/// version conflicts), can be disabled, enabled and deleted; bad input changes nothing.
#[tokio::test]
async fn runtime_agents_serve_at_once_and_are_checked_like_files() {
    let gw = spawn_with(&[("echo.toml", ECHO)], &admin_gateway("")).await;
    let helper: Value = serde_json::from_str(HELPER).unwrap();
    let (status, listed) = admin(&gw, "GET", "/agents", None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["agents"][0]["origin"], "file", "{listed}");
    assert!(listed["agents"][0]["file"]
        .as_str()
        .unwrap()
        .ends_with("echo.toml"));

    let (status, made) = admin(&gw, "PUT", "/agents/helper", Some(helper.clone())).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(
        (made["origin"].as_str(), made["version"].as_u64()),
        (Some("runtime"), Some(1))
    );
    assert_eq!(made["serving"], true, "live once answered: {made}");
    assert_eq!(send_at(&gw.client, &gw.base, "helper", None).await.0, 200);
    let card = gw.get_json("/a2a/agents/helper/card").await;
    assert_eq!(card["description"], "a helper made at runtime", "{card}");
    let aggregated = gw.get_json("/.well-known/agent-card.json").await;
    assert!(aggregated.to_string().contains("help"), "{aggregated}");
    let session = raw_session(&gw, None).await;
    let tools = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let text = raw_post(&gw, &tools, None, Some(&session))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("\"helper\""), "{text}");

    // Checked as a file is; each error names its field; nothing changes.
    for (body, field) in [
        (
            json!({"description": "d", "backend": {"kind": "teleport"}}),
            "backend.kind",
        ),
        (
            json!({"description": "d", "backend": {"kind": "echo"}, "colour": "red"}),
            "colour",
        ),
        (json!({"backend": {"kind": "echo"}}), "description"),
        (
            json!({"description": "d", "backend": {"kind": "command", "command": ["sh"]}}),
            "backend.kind",
        ),
        (
            json!({"name": "other", "description": "d", "backend": {"kind": "echo"}}),
            "name",
        ),
    ] {
        let (status, answer) = admin(&gw, "PUT", "/agents/helper", Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            violations(&answer).contains(&field.to_string()),
            "{body}: {answer}"
        );
    }
    let (status, answer) = admin(&gw, "PUT", "/agents/Bad%20Name", Some(helper.clone())).await;
    assert_eq!(status, 400, "{answer}");
    // A file's agent is the file's.
    let (status, answer) = admin(&gw, "PUT", "/agents/echo", Some(helper.clone())).await;
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("echo.toml"),
        "{answer}"
    );
    let (status, _) = admin(&gw, "DELETE", "/agents/echo", None).await;
    assert_eq!(status, 409);
    // Replace with If-Match: the current version goes, a stale one is refused.
    let mut changed = helper.clone();
    changed["description"] = json!("changed");
    let stale = gw
        .client
        .put(gw.url("/admin/v1/agents/helper"))
        .bearer_auth(ADMIN)
        .header("If-Match", "\"7\"")
        .json(&changed)
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), 409);
    let (status, replaced) = admin(&gw, "PUT", "/agents/helper", Some(changed)).await;
    assert_eq!(
        (status, replaced["version"].as_u64()),
        (200, Some(2)),
        "{replaced}"
    );
    assert_eq!(
        gw.get_json("/a2a/agents/helper/card").await["description"],
        "changed"
    );
    // Not JSON, too large: refused, nothing changed.
    let untyped = gw
        .client
        .put(gw.url("/admin/v1/agents/helper"))
        .bearer_auth(ADMIN)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(untyped.status(), 415);
    let refusal = untyped.text().await.unwrap();
    assert!(
        refusal.contains(r#"\"text/plain\"; send the body as application/json"#),
        "{refusal}"
    );
    let huge = json!({"description": "x".repeat(2 << 20), "backend": {"kind": "echo"}});
    let (status, _) = admin(&gw, "PUT", "/agents/huge", Some(huge)).await;
    assert_eq!(status, 413);
    let (status, missing) = admin(&gw, "GET", "/agents/huge", None).await;
    assert_eq!(status, 404, "{missing}");

    // Disabled: kept, not served; enabled again; deleted.
    let (status, off) = admin(&gw, "POST", "/agents/helper/disable", None).await;
    assert_eq!(
        (status, off["enabled"].clone(), off["serving"].clone()),
        (200, json!(false), json!(false))
    );
    assert_eq!(send_at(&gw.client, &gw.base, "helper", None).await.0, 404);
    let (status, on) = admin(&gw, "POST", "/agents/helper/enable", None).await;
    assert_eq!((status, on["serving"].clone()), (200, json!(true)));
    assert_eq!(send_at(&gw.client, &gw.base, "helper", None).await.0, 200);
    let (status, _) = admin(&gw, "DELETE", "/agents/helper", None).await;
    assert_eq!(status, 204);
    assert_eq!(send_at(&gw.client, &gw.base, "helper", None).await.0, 404);
    let (status, _) = admin(&gw, "DELETE", "/agents/helper", None).await;
    assert_eq!(status, 404);

    // Every change is in the audit log, newest first, with digests of before and after.
    let (status, audit) = admin(&gw, "GET", "/audit?target=agent:helper", None).await;
    assert_eq!(status, 200, "{audit}");
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "agent.delete",
            "agent.enable",
            "agent.disable",
            "agent.update",
            "agent.create"
        ]
    );
    let update = &audit["entries"][3];
    assert_eq!(update["actor"], "admin-key:ops");
    assert_eq!(update["from"], "127.0.0.1");
    assert!(
        update["before"].is_string()
            && update["after"].is_string()
            && update["before"] != update["after"]
    );
    // Paged with a cursor.
    let (_, first) = admin(&gw, "GET", "/audit?limit=2", None).await;
    let cursor = first["next_cursor"].as_str().unwrap();
    let (_, second) = admin(&gw, "GET", &format!("/audit?limit=2&cursor={cursor}"), None).await;
    assert_eq!(second["entries"][0]["action"], "agent.disable", "{second}");
    let (status, _) = admin(&gw, "GET", "/audit?limit=0", None).await;
    assert_eq!(status, 400);
    assert_eq!(gw.get_json("/a2a/health").await["status"], "ok");
}

/// A runtime key works as a file's key does on every binding (JSON-RPC, HTTP+JSON, gRPC
/// metadata, MCP, as a bearer too), in policies (`caller.id`) and rate-limit tiers; a
/// rotation keeps the old secret for its grace; a revoked key is refused at once, and the
/// refusal audited. Keys that would not work are refused when asked for.
#[tokio::test]
async fn runtime_keys_work_everywhere_and_are_refused_once_revoked() {
    let extra = r#"
[rate_limits.tiers.small]
requests_per_minute = 60
burst = 8
[[auth.policies]]
id = "blocked-key"
effect = "deny"
agents = ["vault"]
when = "caller.id.startsWith('key:k') && a2a.operation == 'cancel'"
"#;
    let vault = ECHO.replace(
        "name = \"echo\"",
        "name = \"vault\"\naccess = \"authenticated\"",
    );
    let gw = spawn_with_grpc(
        &[("echo.toml", ECHO), ("vault.toml", &vault)],
        &format!("{}{extra}", admin_gateway("")),
    )
    .await;
    // Keys that would not work are refused, naming the field.
    for (body, field) in [
        (json!({"agents": ["nowhere"]}), "agents[0]"),
        (json!({"tier": "gold"}), "tier"),
        (json!({"expires_at": "2001-01-01T00:00:00Z"}), "expires_at"),
        (json!({"colour": "red"}), ""),
    ] {
        let (status, answer) = admin(&gw, "POST", "/keys", Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let fields = violations(&answer);
        assert!(
            fields.contains(&field.to_string()) || (field.is_empty() && !fields.is_empty()),
            "{body}: {answer}"
        );
    }
    let (status, issued) = admin(
        &gw,
        "POST",
        "/keys",
        Some(
            json!({"description": "team a", "agents": ["vault"], "metadata": {"owner": "team-a"}}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{issued}");
    let secret = issued["secret"].as_str().unwrap().to_string();
    let id = issued["key"]["id"].as_str().unwrap().to_string();
    assert!(secret.starts_with("a2agw_"), "{secret}");
    // Never its secret again.
    let (_, listed) = admin(&gw, "GET", "/keys", None).await;
    assert!(!listed.to_string().contains(&secret), "{listed}");
    assert_eq!(listed["keys"][0]["state"], "active");
    assert_eq!(listed["keys"][0]["metadata"]["owner"], "team-a");

    // JSON-RPC; the agent requires credentials, and the key covers it.
    assert_eq!(send_at(&gw.client, &gw.base, "vault", None).await.0, 401);
    let (status, sent) = send_at(&gw.client, &gw.base, "vault", Some(&secret)).await;
    assert_eq!(status, 200, "{sent}");
    let task = sent["result"]["task"]["id"].as_str().unwrap().to_string();
    // Policies see it as key:<id>.
    let cancel = gw
        .call_with(
            "/a2a/agents/vault",
            D::V10,
            "CancelTask",
            json!({"id": task}),
            &[("X-API-Key", &secret)],
        )
        .await;
    assert_eq!(cancel.status, 403, "{}", cancel.body);
    // As a bearer, on HTTP+JSON.
    let rest = gw
        .client
        .get(gw.url(&format!("/a2a/agents/vault/rest/tasks/{task}")))
        .bearer_auth(&secret)
        .header("A2A-Version", "1.0")
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), 200);
    // gRPC metadata.
    let grpc = probe_one(
        &gw,
        json!({"method": "GetTask", "request": {"tenant": "vault", "id": task}, "metadata": {"x-api-key": secret}}),
    )
    .await;
    assert_eq!(grpc["code"], "OK", "{grpc}");
    // MCP: the key's tools are its agents.
    let session = raw_session(&gw, Some(&secret)).await;
    let tools = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let text = raw_post(&gw, &tools, Some(&secret), Some(&session))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("\"vault\""), "{text}");
    // A key's tier is its rate limit: a burst of 8.
    let (_, limited) = admin(
        &gw,
        "POST",
        "/keys",
        Some(json!({"agents": ["vault"], "tier": "small"})),
    )
    .await;
    let limited = limited["secret"].as_str().unwrap().to_string();
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(
            send_at(&gw.client, &gw.base, "vault", Some(&limited))
                .await
                .0,
        );
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        8,
        "{statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");

    // Rotation with a grace: both secrets work; the new one only, once revoked: neither.
    let (status, rotated) = admin(
        &gw,
        "POST",
        &format!("/keys/{id}/rotate"),
        Some(json!({"grace_secs": 60})),
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    let new_secret = rotated["secret"].as_str().unwrap().to_string();
    assert!(
        rotated["key"]["previous_secret_until"].is_string(),
        "{rotated}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let whoami = |key: String| {
        let gw = &gw;
        async move {
            gw.call_with(
                "/a2a/agents/vault",
                D::V10,
                "ListTasks",
                json!({}),
                &[("X-API-Key", &key)],
            )
            .await
            .status
        }
    };
    assert_eq!(whoami(secret.clone()).await, 200);
    assert_eq!(whoami(new_secret.clone()).await, 200);
    let (status, revoked) = admin(&gw, "POST", &format!("/keys/{id}/revoke"), None).await;
    assert_eq!(
        (status, revoked["state"].as_str()),
        (200, Some("revoked")),
        "{revoked}"
    );
    assert_eq!(whoami(new_secret.clone()).await, 401);
    assert_eq!(whoami(secret).await, 401);
    let (status, _) = admin(&gw, "POST", &format!("/keys/{id}/revoke"), None).await;
    assert_eq!(status, 409);
    // The refusal is audited, with where it came from.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, audit) = admin(
            &gw,
            "GET",
            &format!("/audit?action=key.refused&target=key:{id}"),
            None,
        )
        .await;
        if let Some(refused) = audit["entries"].as_array().and_then(|e| e.first()) {
            assert_eq!(refused["detail"], "revoked", "{refused}");
            assert_eq!(refused["from"], "127.0.0.1");
            break;
        }
        assert!(Instant::now() < deadline, "no key.refused entry: {audit}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, audit) = admin(&gw, "GET", "/audit?action=key", None).await;
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    for a in ["key.create", "key.rotate", "key.revoke", "key.refused"] {
        assert!(actions.contains(&a), "{actions:?}");
    }
    // last_used_at is known.
    let (_, key) = admin(&gw, "GET", &format!("/keys/{id}"), None).await;
    assert!(key["last_used_at"].is_string(), "{key}");
    let (status, _) = admin(&gw, "GET", "/keys/nope", None).await;
    assert_eq!(status, 404);
}

/// The door: no credentials 401, a caller's 403 (also an admin's secret sent as a key),
/// rate-limited, never CORS; off without admin credentials; a JWT may grant admin through a
/// claim; on its own address when `listen` says so.
#[tokio::test]
async fn the_admin_door_takes_admin_credentials_only() {
    let secret = "a-test-only-hmac-secret-for-admin-0123456";
    std::env::set_var("A2A_GW_TEST_ADMIN_JWT", secret);
    let gateway = format!(
        "{}[[auth.jwt]]\nid = \"corp\"\nalgorithm = \"HS256\"\nsecret_env = \"A2A_GW_TEST_ADMIN_JWT\"\n[cors]\nallowed_origins = [\"*\"]\n",
        admin_gateway("requests_per_minute = 60\njwt_claim = \"roles\"\njwt_value = \"a2a-admin\"")
    );
    let gw = spawn_with(&[("echo.toml", ECHO)], &gateway).await;
    let (status, answer) = call_at(&gw.client, &gw.base, None, "GET", "/keys", None).await;
    assert_eq!(status, 401, "{answer}");
    let (status, _) = call_at(&gw.client, &gw.base, Some("wrong"), "GET", "/keys", None).await;
    assert_eq!(status, 401);
    let as_caller = gw
        .client
        .get(gw.url("/admin/v1/keys"))
        .header("X-API-Key", CALLER)
        .send()
        .await
        .unwrap();
    assert_eq!(as_caller.status(), 403);
    let sent_as_key = gw
        .client
        .get(gw.url("/admin/v1/keys"))
        .header("X-API-Key", ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(
        sent_as_key.status(),
        401,
        "admin secrets go as Bearer, and are no caller's"
    );
    let token = |roles: Value| {
        let claims =
            json!({"sub": "alice", "exp": chrono::Utc::now().timestamp() + 600, "roles": roles});
        jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    };
    let (status, _) = call_at(
        &gw.client,
        &gw.base,
        Some(&token(json!(["a2a-admin"]))),
        "GET",
        "/keys",
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = call_at(
        &gw.client,
        &gw.base,
        Some(&token(json!(["reader"]))),
        "GET",
        "/keys",
        None,
    )
    .await;
    assert_eq!(status, 403);
    // Never CORS: the gateway's other answers carry it.
    let with_origin = |path: &str| {
        gw.client
            .get(gw.url(path))
            .header("Origin", "https://page.example")
            .bearer_auth(ADMIN)
            .send()
    };
    let admin_answer = with_origin("/admin/v1/agents").await.unwrap();
    assert!(admin_answer
        .headers()
        .get("access-control-allow-origin")
        .is_none());
    let card = with_origin("/a2a/agents/echo/card").await.unwrap();
    assert!(card.headers().get("access-control-allow-origin").is_some());
    // Rate-limited: a burst of 6 at 60 a minute.
    let mut limited = None;
    for _ in 0..20 {
        let (status, answer) = admin(&gw, "GET", "/agents", None).await;
        if status == 429 {
            limited = Some(answer);
            break;
        }
    }
    let limited = limited.expect("the admin API is rate-limited");
    assert_eq!(
        limited["error"]["status"], "RESOURCE_EXHAUSTED",
        "{limited}"
    );
    // Unknown routes are named.
    let (status, _) = call_at(&gw.client, &gw.base, Some(ADMIN), "GET", "/nothing", None).await;
    assert!(status == 404 || status == 429, "{status}");

    // Off without admin credentials.
    let off = spawn_with(&[("echo.toml", ECHO)], "").await;
    let (status, _) = call_at(&off.client, &off.base, Some(ADMIN), "GET", "/agents", None).await;
    assert_eq!(status, 404);

    // On an address of its own: not on the main listener.
    let (dir, agents, config) = crate::helpers::write_config(
        &[("echo.toml", ECHO)],
        Some(&format!(
            "{}[server]\nport = 0\nworkers = 1\n",
            admin_gateway("listen = \"127.0.0.1:0\"")
        )),
    );
    let settings = a2a_gateway::config::load(config.as_deref(), &agents).unwrap();
    let app = a2a_gateway::app::Application::build(settings)
        .await
        .unwrap();
    let (main, own) = (app.port(), app.admin_port().expect("its own port"));
    let handle = app.handle();
    tokio::spawn(app.run_until_stopped());
    let client = crate::helpers::client();
    let (status, _) = call_at(
        &client,
        &format!("http://127.0.0.1:{own}"),
        Some(ADMIN),
        "GET",
        "/agents",
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = call_at(
        &client,
        &format!("http://127.0.0.1:{main}"),
        Some(ADMIN),
        "GET",
        "/agents",
        None,
    )
    .await;
    assert_eq!(status, 404);
    handle.stop(false).await;
    drop(dir);
}

/// The OpenAPI document is OpenAPI 3.1 that a real validator (openapi-spec-validator)
/// accepts, and lists every route.
#[tokio::test]
async fn the_openapi_document_validates_and_lists_every_route() {
    let gw = spawn_with(&[("echo.toml", ECHO)], &admin_gateway("")).await;
    let spec = gw.get_json("/admin/v1/openapi.json").await;
    assert_eq!(spec["openapi"], "3.1.0");
    let mut operations: Vec<String> = Vec::new();
    for (path, methods) in spec["paths"].as_object().unwrap() {
        for method in methods.as_object().unwrap().keys() {
            operations.push(format!("{} {path}", method.to_uppercase()));
        }
    }
    operations.sort();
    assert_eq!(
        operations,
        [
            "DELETE /admin/v1/agents/{name}",
            "DELETE /admin/v1/budgets/{id}",
            "GET /admin/v1/agents",
            "GET /admin/v1/agents/{name}",
            "GET /admin/v1/audit",
            "GET /admin/v1/budgets",
            "GET /admin/v1/budgets/{id}",
            "GET /admin/v1/keys",
            "GET /admin/v1/keys/{id}",
            "GET /admin/v1/openapi.json",
            "GET /admin/v1/usage",
            "POST /admin/v1/agents/{name}/disable",
            "POST /admin/v1/agents/{name}/enable",
            "POST /admin/v1/keys",
            "POST /admin/v1/keys/{id}/revoke",
            "POST /admin/v1/keys/{id}/rotate",
            "PUT /admin/v1/agents/{name}",
            "PUT /admin/v1/budgets/{id}",
        ]
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), spec.to_string()).unwrap();
    let python = crate::mcp::mcp_python();
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import json, sys; from openapi_spec_validator import validate; validate(json.load(open(sys.argv[1]))); print('valid')",
        ])
        .arg(file.path())
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("valid"),
        "openapi-spec-validator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// On the shipped SQLite store, runtime agents and keys survive a restart and a kill -9;
/// `agents export` writes them out as agent files `check` accepts; the command line issues
/// and revokes keys.
#[tokio::test]
async fn on_sqlite_runtime_agents_and_keys_survive_a_restart_and_a_kill_9() {
    let gateway = format!(
        "{}[store]\nkind = \"sqlite\"\ndata_dir = \"data\"\n",
        admin_gateway("")
    );
    let mut gw = Running::start(&[("echo.toml", ECHO)], &gateway, "info");
    let helper: Value = serde_json::from_str(HELPER).unwrap();
    assert_eq!(
        admin_running(&gw, "PUT", "/agents/helper", Some(helper))
            .await
            .0,
        201
    );
    // The command line, for scripts.
    let bin = env!("CARGO_BIN_EXE_a2a-gateway");
    let out = std::process::Command::new(bin)
        .args([
            "admin",
            "--url",
            &gw.base,
            "keys",
            "create",
            "--description",
            "from the cli",
            "--agent",
            "helper",
        ])
        .env("A2A_GATEWAY_ADMIN_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let issued: Value = serde_json::from_slice(&out.stdout).unwrap();
    let secret = issued["secret"].as_str().unwrap().to_string();
    assert_eq!(
        send_at(&gw.client, &gw.base, "helper", Some(&secret))
            .await
            .0,
        200
    );
    for restart in ["clean", "kill -9"] {
        match restart {
            "clean" => {
                gw.signal("TERM");
                let (status, _) = gw.wait_exit(Duration::from_secs(10));
                assert!(status.success(), "a drained exit: {status:?}");
                gw.restart();
            }
            _ => {
                gw.kill_hard();
                gw.restart();
            }
        }
        assert_eq!(
            send_at(&gw.client, &gw.base, "helper", Some(&secret))
                .await
                .0,
            200,
            "after a {restart}"
        );
        let (_, audit) = admin_running(&gw, "GET", "/audit", None).await;
        assert!(audit["entries"].as_array().unwrap().len() >= 2, "{audit}");
    }
    // Exported as files that `check` accepts.
    let export = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin)
        .args(["agents", "export"])
        .arg(export.path())
        .args(["--url", &gw.base])
        .env("A2A_GATEWAY_ADMIN_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exported = std::fs::read_to_string(export.path().join("helper.toml")).unwrap();
    assert!(exported.contains("name = \"helper\""), "{exported}");
    let checked = std::process::Command::new(bin)
        .current_dir(export.path())
        .args(["check", "--agents-dir", "."])
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    // Revoked through the command line: refused.
    let id = issued["key"]["id"].as_str().unwrap();
    let out = std::process::Command::new(bin)
        .args(["admin", "--url", &gw.base, "keys", "revoke", id])
        .env("A2A_GATEWAY_ADMIN_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        send_at(&gw.client, &gw.base, "helper", Some(&secret))
            .await
            .0,
        401
    );
    // A bad call says why and fails.
    let out = std::process::Command::new(bin)
        .args(["admin", "--url", &gw.base, "agents", "delete", "echo"])
        .env("A2A_GATEWAY_ADMIN_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("echo.toml"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits (at most `within`) until `f` holds; how long that took.
async fn within<F, Fut>(within: Duration, what: &str, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

on_both_stores!(replicas_share_runtime_agents_and_keys_within_two_seconds);

/// Two replicas on a shared store: an agent made through one serves through the other within
/// 2 s, a key issued through one works on the other, revoked through the other it is refused
/// on the first within 2 s; one name created at once through both: one wins, the other 409.
async fn replicas_share_runtime_agents_and_keys_within_two_seconds(fleet: crate::replicas::Fleet) {
    let gws = fleet.replicas(2, &admin_gateway(""));
    let (a, b) = (&gws[0], &gws[1]);
    let helper: Value = serde_json::from_str(HELPER).unwrap();
    assert_eq!(
        admin_running(a, "PUT", "/agents/helper", Some(helper.clone()))
            .await
            .0,
        201
    );
    let took = within(
        Duration::from_secs(2),
        "the agent on the other replica",
        || async move { send_at(&b.client, &b.base, "helper", None).await.0 == 200 },
    )
    .await;
    println!("figure: an agent made through one replica served by the other after {took:?}");
    let (_, issued) = admin_running(a, "POST", "/keys", Some(json!({"agents": ["helper"]}))).await;
    let secret = issued["secret"].as_str().unwrap().to_string();
    let id = issued["key"]["id"].as_str().unwrap().to_string();
    let secret = secret.as_str();
    within(
        Duration::from_secs(2),
        "the key on the other replica",
        || async move {
            let (status, answer) = b
                .post(
                    "/a2a/agents/helper",
                    "ListTasks",
                    json!({}),
                    &[("X-API-Key", secret)],
                )
                .await
                .json::<Value>()
                .await
                .map(|v| (200, v))
                .unwrap_or((0, Value::Null));
            status == 200 && answer.get("result").is_some()
        },
    )
    .await;
    assert_eq!(
        admin_running(b, "POST", &format!("/keys/{id}/revoke"), None)
            .await
            .0,
        200
    );
    let took = within(
        Duration::from_secs(2),
        "the revocation on the first replica",
        || async move {
            a.post(
                "/a2a/agents/helper",
                "ListTasks",
                json!({}),
                &[("X-API-Key", secret)],
            )
            .await
            .status()
                == 401
        },
    )
    .await;
    println!("figure: a key revoked through one replica refused by the other after {took:?}");
    // The same name created at once through both (If-None-Match: * creates only).
    let racing = |gw: &Running| {
        let req = gw
            .client
            .put(gw.url("/admin/v1/agents/raced"))
            .bearer_auth(ADMIN)
            .header("If-None-Match", "*")
            .json(&helper);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let (x, y) = futures_util::future::join(racing(a), racing(b)).await;
    let mut both = [x, y];
    both.sort();
    assert_eq!(both, [201, 409]);
}

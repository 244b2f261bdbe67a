//! Front-door security: every credential case, per-agent access, task ownership, cards
//! that tell the truth about auth, and CORS.

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use crate::helpers::{repo_root, rpc, sha, spawn_with, TestGateway, D, ECHO};

const HS_SECRET: &str = "a-test-only-hmac-secret-of-at-least-32-bytes";
const ISS: &str = "https://issuer.test";
const AUD: &str = "a2a-gateway";

fn fixture(name: &str) -> String {
    repo_root()
        .join("tests/fixtures/jwt")
        .join(name)
        .display()
        .to_string()
}

async fn secured() -> TestGateway {
    std::env::set_var("A2A_GW_TEST_HS_SECRET", HS_SECRET);
    let gateway = format!(
        r#"
[auth]
default_access = "authenticated"
[[auth.api_keys]]
id = "alice"
secret_sha256 = "{alice}"
agents = ["secure"]
[[auth.api_keys]]
id = "bob"
secret_sha256 = "{bob}"
agents = ["secure"]
[[auth.api_keys]]
id = "elsewhere"
secret_sha256 = "{elsewhere}"
agents = ["open"]
[[auth.api_keys]]
id = "old"
secret_sha256 = "{old}"
revoked = true
[[auth.bearer_tokens]]
id = "ops"
secret_sha256 = "{ops}"
[[auth.jwt]]
id = "hs"
algorithm = "HS256"
secret_env = "A2A_GW_TEST_HS_SECRET"
issuer = "{ISS}"
audience = "{AUD}"
[[auth.jwt]]
id = "rs"
algorithm = "RS256"
public_key_file = "{rs}"
issuer = "{ISS}"
audience = "{AUD}"
[[auth.jwt]]
id = "es"
algorithm = "ES256"
jwks_file = "{es}"
issuer = "{ISS}"
audience = "{AUD}"
[cors]
allowed_origins = ["https://app.example"]
"#,
        alice = sha("alice-key"),
        bob = sha("bob-key"),
        elsewhere = sha("elsewhere-key"),
        old = sha("old-key"),
        ops = sha("ops-token"),
        rs = fixture("rs256-public.pem"),
        es = fixture("es256-jwks.json"),
    );
    let secure = ECHO.replace("name = \"echo\"", "name = \"secure\"");
    let open = format!(
        "access = \"public\"\n{}",
        ECHO.replace("name = \"echo\"", "name = \"open\"")
    );
    spawn_with(&[("secure.toml", &secure), ("open.toml", &open)], &gateway).await
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn claims() -> Value {
    json!({"sub": "u1", "iss": ISS, "aud": AUD, "exp": now() + 600, "nbf": now() - 10, "agents": ["secure"]})
}

fn jwt(alg: Algorithm, claims: &Value) -> String {
    let (key, kid) = match alg {
        Algorithm::HS256 => (EncodingKey::from_secret(HS_SECRET.as_bytes()), None),
        Algorithm::RS256 => (
            EncodingKey::from_rsa_pem(&std::fs::read(fixture("rs256-private.pem")).unwrap())
                .unwrap(),
            None,
        ),
        _ => (
            EncodingKey::from_ec_pem(&std::fs::read(fixture("es256-private.pem")).unwrap())
                .unwrap(),
            Some("es-1".to_string()),
        ),
    };
    let mut header = Header::new(alg);
    header.kid = kid;
    encode(&header, claims, &key).unwrap()
}

fn b64(v: &Value) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

/// (label, header name, header value, expected status)
fn credential_cases() -> Vec<(&'static str, &'static str, String, u16)> {
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims();
        f(&mut c);
        c
    };
    let bearer = |alg: Algorithm, c: &Value| format!("Bearer {}", jwt(alg, c));
    let rs_public = std::fs::read(fixture("rs256-public.pem")).unwrap();
    let hs_with_rs_key = encode(
        &Header::new(Algorithm::HS256),
        &claims(),
        &EncodingKey::from_secret(&rs_public),
    )
    .unwrap();
    let alg_none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims())
    );
    let hs = Algorithm::HS256;
    vec![
        ("missing", "", String::new(), 401),
        (
            "malformed Authorization",
            "Authorization",
            "Basic YWxpY2U6eA==".into(),
            401,
        ),
        ("empty bearer", "Authorization", "Bearer ".into(), 401),
        ("wrong api key", "X-API-Key", "nope".into(), 401),
        ("revoked api key", "X-API-Key", "old-key".into(), 401),
        (
            "api key for another agent",
            "X-API-Key",
            "elsewhere-key".into(),
            403,
        ),
        ("valid api key", "X-API-Key", "alice-key".into(), 200),
        (
            "wrong static bearer",
            "Authorization",
            "Bearer not-a-token".into(),
            401,
        ),
        (
            "valid static bearer",
            "Authorization",
            "Bearer ops-token".into(),
            200,
        ),
        (
            "expired jwt",
            "Authorization",
            bearer(hs, &with(&|c| c["exp"] = json!(now() - 3600))),
            401,
        ),
        (
            "not-yet-valid jwt",
            "Authorization",
            bearer(hs, &with(&|c| c["nbf"] = json!(now() + 3600))),
            401,
        ),
        (
            "wrong issuer",
            "Authorization",
            bearer(hs, &with(&|c| c["iss"] = json!("https://evil.test"))),
            401,
        ),
        (
            "wrong audience",
            "Authorization",
            bearer(hs, &with(&|c| c["aud"] = json!("someone-else"))),
            401,
        ),
        (
            "jwt without iss (issuer configured)",
            "Authorization",
            bearer(
                hs,
                &with(&|c| {
                    c.as_object_mut().unwrap().remove("iss");
                }),
            ),
            401,
        ),
        (
            "jwt without aud (audience configured)",
            "Authorization",
            bearer(
                hs,
                &with(&|c| {
                    c.as_object_mut().unwrap().remove("aud");
                }),
            ),
            401,
        ),
        (
            "jwt without sub",
            "Authorization",
            bearer(
                hs,
                &with(&|c| {
                    c.as_object_mut().unwrap().remove("sub");
                }),
            ),
            401,
        ),
        (
            "jwt with an empty sub",
            "Authorization",
            bearer(hs, &with(&|c| c["sub"] = json!(""))),
            401,
        ),
        (
            "alg none",
            "Authorization",
            format!("Bearer {alg_none}"),
            401,
        ),
        (
            "HS-signed with the RS public key",
            "Authorization",
            format!("Bearer {hs_with_rs_key}"),
            401,
        ),
        (
            "jwt without the agents claim",
            "Authorization",
            bearer(
                hs,
                &with(&|c| {
                    c.as_object_mut().unwrap().remove("agents");
                }),
            ),
            403,
        ),
        (
            "valid HS256 jwt",
            "Authorization",
            bearer(hs, &claims()),
            200,
        ),
        (
            "valid RS256 jwt",
            "Authorization",
            bearer(Algorithm::RS256, &claims()),
            200,
        ),
        (
            "valid ES256 jwt (JWKS)",
            "Authorization",
            bearer(Algorithm::ES256, &claims()),
            200,
        ),
    ]
}

fn request(
    gw: &TestGateway,
    method: reqwest::Method,
    path: &str,
    header: &str,
    value: &str,
) -> reqwest::RequestBuilder {
    let mut req = gw
        .client
        .request(method, gw.url(path))
        .header("A2A-Version", "1.0")
        .header("content-type", "application/json");
    if !header.is_empty() {
        req = req.header(header, value);
    }
    req
}

async fn check_refusal(resp: reqwest::Response, want: u16, label: &str) {
    let status = resp.status().as_u16();
    assert_eq!(status, want, "{label}");
    if want == 401 {
        let challenge = resp
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_string());
        assert!(
            challenge.is_some_and(|c| c.contains("realm=\"a2a-gateway\"")),
            "{label}: a 401 carries a challenge"
        );
    }
    if want != 200 {
        let body: Value = resp
            .json()
            .await
            .unwrap_or_else(|_| panic!("{label}: the refusal is JSON"));
        let text = body.to_string();
        assert!(
            !text.contains("alice") && !text.contains("elsewhere") && !text.contains("revoked"),
            "{label}: vague: {text}"
        );
    }
}

#[tokio::test]
async fn every_credential_case_on_every_route_kind() {
    let gw = secured().await;
    // A task to subscribe to, created with valid credentials.
    let created: Value = request(&gw, reqwest::Method::POST, "/a2a/agents/secure", "X-API-Key", "alice-key")
        .body(rpc("SendMessage", json!({"message": D::V10.message("/delay 30 x"),"configuration":{"returnImmediately":true}})))
        .send().await.unwrap().json().await.unwrap();
    let task_id = created["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();

    for (label, header, value, want) in credential_cases() {
        let send = rpc("SendMessage", json!({"message": D::V10.message("hi")}));
        let resp = request(
            &gw,
            reqwest::Method::POST,
            "/a2a/agents/secure",
            header,
            &value,
        )
        .body(send)
        .send()
        .await
        .unwrap();
        check_refusal(resp, want, &format!("{label} (JSON-RPC)")).await;

        let stream = rpc(
            "SendStreamingMessage",
            json!({"message": D::V10.message("hi")}),
        );
        let resp = request(
            &gw,
            reqwest::Method::POST,
            "/a2a/agents/secure",
            header,
            &value,
        )
        .body(stream)
        .send()
        .await
        .unwrap();
        if want == 200 {
            assert_eq!(
                resp.headers()["content-type"],
                "text/event-stream",
                "{label} (stream)"
            );
        } else {
            check_refusal(resp, want, &format!("{label} (stream)")).await;
        }

        let rest = json!({"message": D::V10.message("hi")}).to_string();
        let resp = request(
            &gw,
            reqwest::Method::POST,
            "/a2a/agents/secure/rest/message:send",
            header,
            &value,
        )
        .body(rest)
        .send()
        .await
        .unwrap();
        check_refusal(resp, want, &format!("{label} (REST)")).await;

        if want != 200 {
            let sub =
                json!({"jsonrpc":"2.0","id":1,"method":"SubscribeToTask","params":{"id": task_id}})
                    .to_string();
            let resp = request(
                &gw,
                reqwest::Method::POST,
                "/a2a/agents/secure",
                header,
                &value,
            )
            .body(sub)
            .send()
            .await
            .unwrap();
            check_refusal(resp, want, &format!("{label} (subscribe)")).await;
            let resp = request(
                &gw,
                reqwest::Method::GET,
                &format!("/a2a/agents/secure/rest/tasks/{task_id}:subscribe"),
                header,
                &value,
            )
            .send()
            .await
            .unwrap();
            check_refusal(resp, want, &format!("{label} (REST subscribe)")).await;
        }
    }
}

#[tokio::test]
async fn public_agents_are_open_but_bad_credentials_still_fail() {
    let gw = secured().await;
    let send = || rpc("SendMessage", json!({"message": D::V10.message("hi")}));
    let anon = request(&gw, reqwest::Method::POST, "/a2a/agents/open", "", "")
        .body(send())
        .send()
        .await
        .unwrap();
    crate::helpers::answered(anon).await;
    let bad = request(
        &gw,
        reqwest::Method::POST,
        "/a2a/agents/open",
        "X-API-Key",
        "wrong",
    )
    .body(send())
    .send()
    .await
    .unwrap();
    assert_eq!(bad.status(), 401, "a broken key is reported, not ignored");
    // An unknown agent tells an anonymous caller nothing when agents are private by default.
    let ghost = request(&gw, reqwest::Method::POST, "/a2a/agents/ghost", "", "")
        .body(send())
        .send()
        .await
        .unwrap();
    assert_eq!(ghost.status(), 401);
    let ghost = request(
        &gw,
        reqwest::Method::POST,
        "/a2a/agents/ghost",
        "X-API-Key",
        "alice-key",
    )
    .body(send())
    .send()
    .await
    .unwrap();
    assert_eq!(ghost.status(), 404);
    // The shared endpoints likewise: a route they cannot find is "authenticate first" for an
    // anonymous caller, while a route to a public agent works without credentials.
    let via = |path: &'static str, agent: &'static str, key: &'static str| {
        let body = json!({"message": D::V10.message("hi"), "metadata": {"gateway/agent": agent}});
        let body = if path == "/a2a" {
            rpc("SendMessage", body)
        } else {
            body.to_string()
        };
        let header = if key.is_empty() { "" } else { "X-API-Key" };
        request(&gw, reqwest::Method::POST, path, header, key).body(body)
    };
    for path in ["/a2a", "/a2a/rest/message:send"] {
        for (agent, key, want) in [
            ("ghost", "", 401),
            ("ghost", "alice-key", 404),
            ("open", "", 200),
        ] {
            let resp = via(path, agent, key).send().await.unwrap();
            assert_eq!(resp.status(), want, "{path} {agent} {key:?}");
        }
    }
    // Cards and health need no credentials.
    for path in [
        "/a2a/health",
        "/.well-known/agent-card.json",
        "/a2a/agents/secure/card",
    ] {
        assert_eq!(
            gw.client.get(gw.url(path)).send().await.unwrap().status(),
            200,
            "{path}"
        );
    }
}

#[tokio::test]
async fn tasks_are_visible_only_to_their_creator() {
    let gw = secured().await;
    let call = |key: &'static str, method: &'static str, params: Value| {
        request(
            &gw,
            reqwest::Method::POST,
            "/a2a/agents/secure",
            "X-API-Key",
            key,
        )
        .body(rpc(method, json!(params)))
        .send()
    };
    let created: Value = call("alice-key", "SendMessage", json!({"message": D::V10.message("/delay 30 mine"), "configuration": {"returnImmediately": true}}))
        .await.unwrap().json().await.unwrap();
    let id = created["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();

    for method in ["GetTask", "CancelTask", "SubscribeToTask"] {
        let r: Value = call("bob-key", method, json!({"id": id}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            r["error"]["code"], -32001,
            "bob {method}: exactly like an unknown task: {r}"
        );
        assert_eq!(r["error"]["message"], format!("Task not found: {id}"));
    }
    let mut follow = D::V10.message("hijack");
    follow["taskId"] = json!(id);
    let r: Value = call("bob-key", "SendMessage", json!({"message": follow}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["error"]["code"], -32001);
    let bobs: Value = call("bob-key", "ListTasks", json!({}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        bobs["result"]["totalSize"], 0,
        "bob lists nothing of alice's"
    );
    let alices: Value = call("alice-key", "ListTasks", json!({}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(alices["result"]["totalSize"], 1);
    let got: Value = call("alice-key", "GetTask", json!({"id": id}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["result"]["id"], id.as_str());
    let canceled: Value = call("alice-key", "CancelTask", json!({"id": id}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED");
}

#[tokio::test]
async fn cards_state_the_configured_security_in_both_generations() {
    let gw = secured().await;
    let card = |v: Option<&'static str>, path: &'static str| {
        let mut req = gw.client.get(gw.url(path));
        if let Some(v) = v {
            req = req.header("A2A-Version", v);
        }
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let v03 = card(None, "/a2a/agents/secure/card").await;
    assert_eq!(
        v03["securitySchemes"]["apiKey"],
        json!({"type":"apiKey","in":"header","name":"X-API-Key"})
    );
    assert_eq!(
        v03["securitySchemes"]["bearer"],
        json!({"type":"http","scheme":"bearer","bearerFormat":"JWT"})
    );
    assert_eq!(v03["security"], json!([{"apiKey": []}, {"bearer": []}]));
    let v10 = card(Some("1.0"), "/a2a/agents/secure/card").await;
    assert_eq!(
        v10["securitySchemes"]["apiKey"],
        json!({"apiKeySecurityScheme":{"location":"header","name":"X-API-Key"}})
    );
    assert_eq!(
        v10["securitySchemes"]["bearer"],
        json!({"httpAuthSecurityScheme":{"scheme":"Bearer","bearerFormat":"JWT"}})
    );
    assert_eq!(
        v10["securityRequirements"][0],
        json!({"schemes": {"apiKey": {"list": []}}})
    );
    let open = card(None, "/a2a/agents/open/card").await;
    assert!(
        open.get("security").is_none(),
        "a public agent requires nothing"
    );

    // Restricted agents are hidden from anonymous callers of the aggregated card.
    let anon = card(None, "/.well-known/agent-card.json").await;
    let ids: Vec<&str> = anon["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["open/echo"]);
    let with_key: Value = gw
        .client
        .get(gw.url("/.well-known/agent-card.json"))
        .header("X-API-Key", "alice-key")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(with_key["skills"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn cors_preflight_skips_auth_and_disallowed_origins_get_nothing() {
    let gw = secured().await;
    let preflight = |origin: &'static str| {
        gw.client
            .request(reqwest::Method::OPTIONS, gw.url("/a2a/agents/secure"))
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .header(
                "Access-Control-Request-Headers",
                "x-api-key, content-type, a2a-version",
            )
            .send()
    };
    let ok = preflight("https://app.example").await.unwrap();
    assert_eq!(ok.status(), 200, "answered without credentials");
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let allowed = ok.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    for h in ["x-api-key", "a2a-version", "content-type"] {
        assert!(allowed.contains(h), "{h} allowed: {allowed}");
    }
    let bad = preflight("https://evil.example").await.unwrap();
    assert!(bad.headers().get("access-control-allow-origin").is_none());

    let actual = gw
        .client
        .post(gw.url("/a2a/agents/secure"))
        .header("Origin", "https://app.example")
        .header("X-API-Key", "alice-key")
        .header("A2A-Version", "1.0")
        .body(rpc("SendMessage", json!({"message": D::V10.message("hi")})))
        .send()
        .await
        .unwrap();
    assert_eq!(
        actual.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let exposed = actual.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        exposed.contains("x-ratelimit-remaining") && exposed.contains("retry-after"),
        "{exposed}"
    );
}

#[test]
fn bad_auth_configuration_is_reported_by_check() {
    let err = crate::helpers::load_errors(
        &[("echo.toml", ECHO)],
"[[auth.api_keys]]\nid = \"k\"\nsecret_env = \"A2A_GW_SURELY_UNSET\"\n[[auth.jwt]]\nid = \"j\"\nalgorithm = \"none\"\n",
);
    assert!(
        err.contains("api key \"k\": environment variable A2A_GW_SURELY_UNSET is not set"),
        "{err}"
    );
    assert!(
        err.contains("jwt \"j\": algorithm must be HS256, RS256 or ES256"),
        "{err}"
    );
}

/// Kills the child process when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn jwks_url_keys_are_fetched_from_a_local_server() {
    let (server, port) =
        crate::helpers::static_files_server(&repo_root().join("tests/fixtures/jwt"));
    let _server = Child(server);
    let gateway = format!(
        "[auth]\ndefault_access = \"authenticated\"\n[[auth.jwt]]\nid = \"remote\"\nalgorithm = \"ES256\"\njwks_url = \"http://127.0.0.1:{port}/es256-jwks.json\"\njwks_refresh_secs = 1\nissuer = \"{ISS}\"\naudience = \"{AUD}\"\n"
    );
    let secure = ECHO.replace("name = \"echo\"", "name = \"secure\"");
    let gw = spawn_with(&[("secure.toml", &secure)], &gateway).await;
    let token = jwt(Algorithm::ES256, &claims());
    let mut status = 0;
    // The server may still be starting; the gateway retries the fetch until it answers.
    for _ in 0..100 {
        let r = request(
            &gw,
            reqwest::Method::POST,
            "/a2a/agents/secure",
            "Authorization",
            &format!("Bearer {token}"),
        )
        .body(rpc("SendMessage", json!({"message": D::V10.message("hi")})))
        .send()
        .await
        .unwrap();
        status = r.status().as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(
        status, 200,
        "a token signed by a key from the JWKS URL is accepted"
    );
    let forged = jwt(Algorithm::RS256, &claims());
    let r = request(
        &gw,
        reqwest::Method::POST,
        "/a2a/agents/secure",
        "Authorization",
        &format!("Bearer {forged}"),
    )
    .body("{}")
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 401);
}

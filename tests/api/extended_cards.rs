//! Extended agent cards on every binding: an agent file's `[extended]`, an upstream's
//! extended card fetched with the agent file's credentials, the aggregated extended card,
//! and the refusals (anonymous, no access, no extended card).

use serde_json::{json, Value};

use crate::helpers::{repo_root, sha, spawn_with_grpc, TestGateway, D};
use crate::interop::python;
use crate::peers::{python_agent_with, upstream_agent};

const SECRET: &str = r#"name = "secret"
description = "public words"
[[skills]]
id = "basic"
name = "Basic"
description = "for everyone"
tags = ["basic"]
[extended]
description = "for members"
[[extended.skills]]
id = "vip"
name = "VIP"
description = "members only"
tags = ["vip"]
[backend]
kind = "echo"
"#;

const PLAIN: &str =
    "name = \"plain\"\ndescription = \"no extended card\"\n[backend]\nkind = \"echo\"\n";

/// alice may call every agent, bob only `plain`; agents need a credential.
fn keys() -> String {
    format!(
        "[auth]\ndefault_access = \"authenticated\"\n[[auth.api_keys]]\nid = \"alice\"\nsecret_sha256 = \"{}\"\nagents = [\"*\"]\n[[auth.api_keys]]\nid = \"bob\"\nsecret_sha256 = \"{}\"\nagents = [\"plain\"]\n",
        sha("alice-key"),
        sha("bob-key")
    )
}

/// A JSON-RPC call with `key` (none: anonymous); the HTTP status and the body.
async fn call(gw: &TestGateway, path: &str, key: Option<&str>, d: D, method: &str) -> (u16, Value) {
    let key: Vec<(&str, &str)> = key.map(|k| ("X-API-Key", k)).into_iter().collect();
    let reply = gw.call_with(path, d, method, json!({}), &key).await;
    (reply.status, reply.body)
}

fn extended_method(d: D) -> &'static str {
    match d {
        D::V10 => "GetExtendedAgentCard",
        D::V03 => "agent/getAuthenticatedExtendedCard",
    }
}

fn skill_ids(card: &Value) -> Vec<String> {
    card["skills"]
        .as_array()
        .unwrap_or_else(|| panic!("no skills: {card}"))
        .iter()
        .map(|s| s["id"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn an_agent_files_extended_card_goes_only_to_authenticated_callers_with_access() {
    let gw = spawn_with_grpc(&[("secret.toml", SECRET), ("plain.toml", PLAIN)], &keys()).await;
    let public = gw.get_json("/a2a/agents/secret/card").await;
    assert_eq!(
        public["capabilities"]["extendedAgentCard"], true,
        "{public}"
    );
    assert_eq!(
        public["supportsAuthenticatedExtendedCard"], true,
        "{public}"
    );
    assert_eq!(skill_ids(&public), ["basic"]);
    let plain = gw.get_json("/a2a/agents/plain/card").await;
    assert!(
        plain["capabilities"].get("extendedAgentCard").is_none(),
        "{plain}"
    );

    for d in [D::V10, D::V03] {
        let (status, answer) = call(
            &gw,
            "/a2a/agents/secret",
            Some("alice-key"),
            d,
            extended_method(d),
        )
        .await;
        let card = &answer["result"];
        assert_eq!(status, 200, "{answer}");
        assert_eq!(card["description"], "for members", "{answer}");
        assert_eq!(skill_ids(card), ["basic", "vip"]);
        assert_eq!(card["capabilities"]["extendedAgentCard"], true);
        let url = card["supportedInterfaces"][0]["url"].as_str().unwrap();
        assert_eq!(url, gw.url("/a2a/agents/secret"), "{card}");

        // Anonymous: asked to authenticate, never shown a card.
        let (status, answer) = call(&gw, "/a2a/agents/secret", None, d, extended_method(d)).await;
        assert_eq!(status, 401, "{answer}");
        assert!(answer.get("result").is_none(), "{answer}");
        // A caller the agent is not open to.
        let (status, answer) = call(
            &gw,
            "/a2a/agents/secret",
            Some("bob-key"),
            d,
            extended_method(d),
        )
        .await;
        assert_eq!(status, 403, "{answer}");
        assert!(answer.get("result").is_none(), "{answer}");
        // An agent without one: 1.0's "unsupported" (its flag is off), 0.3's "not configured".
        let (_, answer) = call(
            &gw,
            "/a2a/agents/plain",
            Some("bob-key"),
            d,
            extended_method(d),
        )
        .await;
        let want = if d == D::V10 { -32004 } else { -32007 };
        assert_eq!(answer["error"]["code"], want, "{answer}");
    }

    // The aggregated extended card: the agents the caller may use, with extended skills.
    let (_, alice) = call(
        &gw,
        "/a2a",
        Some("alice-key"),
        D::V10,
        "GetExtendedAgentCard",
    )
    .await;
    let ids = skill_ids(&alice["result"]);
    assert!(ids.contains(&"secret/vip".to_string()), "{ids:?}");
    let (_, bob) = call(&gw, "/a2a", Some("bob-key"), D::V10, "GetExtendedAgentCard").await;
    let ids = skill_ids(&bob["result"]);
    assert!(!ids.iter().any(|id| id.starts_with("secret/")), "{ids:?}");
    let aggregated = gw.get_json("/.well-known/agent-card.json").await;
    assert_eq!(aggregated["capabilities"]["extendedAgentCard"], true);
    assert!(!skill_ids(&aggregated).contains(&"secret/vip".to_string()));

    // HTTP+JSON.
    let rest = |key: Option<&'static str>| {
        let mut req = gw
            .client
            .get(gw.url("/a2a/agents/secret/rest/extendedAgentCard"))
            .header("A2A-Version", "1.0");
        if let Some(key) = key {
            req = req.header("X-API-Key", key);
        }
        async move {
            let resp = req.send().await.expect("request");
            (
                resp.status().as_u16(),
                resp.json::<Value>().await.expect("JSON"),
            )
        }
    };
    let (status, card) = rest(Some("alice-key")).await;
    assert_eq!(
        (status, skill_ids(&card)),
        (200, vec!["basic".into(), "vip".into()])
    );
    let (status, refused) = rest(None).await;
    assert_eq!(status, 401, "{refused}");
    assert!(refused.get("skills").is_none(), "{refused}");

    // gRPC.
    let out = crate::grpc::probe(
        &gw,
        json!([
            {"method": "GetExtendedAgentCard", "request": {"tenant": "secret"},
             "metadata": {"x-api-key": "alice-key"}},
            {"method": "GetExtendedAgentCard", "request": {"tenant": "secret"}},
            {"method": "GetExtendedAgentCard", "request": {"tenant": "secret"},
             "metadata": {"x-api-key": "bob-key"}},
        ]),
    )
    .await;
    assert_eq!(out[0]["code"], "OK", "{}", out[0]);
    assert_eq!(skill_ids(&out[0]["response"]), ["basic", "vip"]);
    assert_eq!(out[1]["code"], "UNAUTHENTICATED", "{}", out[1]);
    assert_eq!(out[2]["code"], "PERMISSION_DENIED", "{}", out[2]);
}

/// The official SDK's client (`get_extended_agent_card`) over JSON-RPC and gRPC.
async fn sdk_extended_card(gw: &TestGateway, binding: &str, key: Option<&str>) -> Value {
    let script = repo_root().join("tests/interop/sdk_extended_card.py");
    let mut args = vec![
        script.display().to_string(),
        "--card-url".into(),
        gw.url("/a2a/agents/secret/card"),
        "--binding".into(),
        binding.into(),
    ];
    if let Some(key) = key {
        args.extend(["--api-key".into(), key.to_string()]);
    }
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python()).args(&args).output()
    })
    .await
    .expect("client thread")
    .expect("running the SDK client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "sdk_extended_card.py printed no JSON:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[tokio::test]
async fn the_python_sdk_client_gets_the_extended_card_with_a_key_and_not_without() {
    let gw = spawn_with_grpc(&[("secret.toml", SECRET), ("plain.toml", PLAIN)], &keys()).await;
    for binding in ["jsonrpc", "grpc"] {
        let got = sdk_extended_card(&gw, binding, Some("alice-key")).await;
        assert_eq!(got["skills"], json!(["basic", "vip"]), "{binding}: {got}");
        assert_eq!(got["description"], "for members", "{binding}: {got}");
        let refused = sdk_extended_card(&gw, binding, None).await;
        assert!(refused.get("error").is_some(), "{binding}: {refused}");
    }
}

/// An upstream whose card offers an extended card: fetched with the agent file's
/// credentials, rewritten to point at the gateway, served with the file's own additions.
#[tokio::test]
async fn an_upstreams_extended_card_is_fetched_with_the_files_credentials_and_rewritten() {
    let peer = python_agent_with("1.0", &["--extended-key", "upstream-secret"]).await;
    let with_key = "headers = { X-API-Key = \"upstream-secret\" }";
    let up = upstream_agent("up", &peer.url(), with_key);
    let without = upstream_agent("nokey", &peer.url(), "");
    let gw = spawn_with_grpc(&[("up.toml", &up), ("nokey.toml", &without)], &keys()).await;
    let (status, answer) = call(
        &gw,
        "/a2a/agents/up",
        Some("alice-key"),
        D::V10,
        "GetExtendedAgentCard",
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let card = &answer["result"];
    assert_eq!(card["name"], "up", "{card}");
    assert_eq!(card["description"], "Echoes text back; the extended card.");
    assert!(
        skill_ids(card).contains(&"upstream-vip".to_string()),
        "{card}"
    );
    let urls: Vec<&str> = card["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["url"].as_str())
        .collect();
    assert!(
        urls.iter()
            .all(|u| !u.contains(&peer.url().trim_end_matches('/').to_string())),
        "an upstream URL leaked: {urls:?}"
    );
    let public = gw.get_json("/a2a/agents/up/card").await;
    assert_eq!(
        public["capabilities"]["extendedAgentCard"], true,
        "{public}"
    );
    assert!(!skill_ids(&public).contains(&"upstream-vip".to_string()));
    // Without the upstream's credentials there is no extended card to pass on.
    let nokey = gw.get_json("/a2a/agents/nokey/card").await;
    assert!(
        nokey["capabilities"].get("extendedAgentCard").is_none(),
        "{nokey}"
    );
    let (_, answer) = call(
        &gw,
        "/a2a/agents/nokey",
        Some("alice-key"),
        D::V03,
        "agent/getAuthenticatedExtendedCard",
    )
    .await;
    assert_eq!(answer["error"]["code"], -32007, "{answer}");
}

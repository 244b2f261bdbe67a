//! Agent cards: aggregated and per-agent, URL derivation, caching.

use serde_json::{json, Value};

use crate::helpers::{spawn, spawn_with, ECHO, OTHER};

async fn get(
    gw: &crate::helpers::TestGateway,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = gw.client.get(gw.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn aggregated_card_unions_skills_and_points_at_the_shared_endpoint() {
    let gw = spawn().await;
    for path in ["/.well-known/agent-card.json", "/.well-known/agent.json"] {
        let (status, _, card) = get(&gw, path, &[]).await;
        assert_eq!(status, 200);
        assert_eq!(card["name"], "a2a-gateway");
        let url = format!("{}/a2a", gw.base);
        assert_eq!(card["url"], url.as_str());
        assert_eq!(card["protocolVersion"], "0.3.0");
        assert_eq!(card["preferredTransport"], "JSONRPC");
        assert_eq!(
            card["supportedInterfaces"],
            json!([
                {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
                {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
                {"url": format!("{url}/rest"), "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
            ]),
            "JSON-RPC 1.0 preferred, then 0.3, then REST"
        );
        let ids: Vec<&str> = card["skills"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap())
            .collect();
        assert_eq!(
            ids,
            ["echo/echo", "other/echo"],
            "namespaced by agent, no collision"
        );
        assert_eq!(card["capabilities"]["pushNotifications"], false);
        assert_eq!(card["capabilities"]["streaming"], true);
    }
}

#[tokio::test]
async fn agent_card_points_back_through_the_gateway() {
    let gw = spawn().await;
    for path in [
        "/a2a/agents/echo/card",
        "/a2a/agents/echo/.well-known/agent-card.json",
    ] {
        let (status, _, card) = get(&gw, path, &[]).await;
        assert_eq!(status, 200);
        assert_eq!(card["name"], "echo");
        let url = format!("{}/a2a/agents/echo", gw.base);
        assert_eq!(card["url"], url.as_str());
        for iface in card["supportedInterfaces"].as_array().unwrap() {
            let want = match iface["protocolBinding"].as_str() {
                Some("HTTP+JSON") => format!("{url}/rest"),
                _ => url.clone(),
            };
            assert_eq!(iface["url"], want.as_str());
        }
        assert_eq!(
            card["skills"][0]["id"], "echo",
            "an agent's own card keeps its ids"
        );
        assert_eq!(card["defaultInputModes"][0], "text/plain");
    }
    let (status, _, body) = get(&gw, "/a2a/agents/ghost/card", &[]).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["message"], "Unknown agent: ghost");
    assert_eq!(
        body["error"]["details"][0]["reason"], "AGENT_NOT_FOUND",
        "{body}"
    );
}

#[tokio::test]
async fn card_urls_follow_forwarded_headers_unless_a_public_url_is_set() {
    let gw = spawn().await;
    let (_, headers, card) = get(
        &gw,
        "/a2a/agents/echo/card",
        &[
            ("X-Forwarded-Proto", "https"),
            ("X-Forwarded-Host", "agents.example.com"),
        ],
    )
    .await;
    assert_eq!(card["url"], "https://agents.example.com/a2a/agents/echo");
    assert!(headers["vary"]
        .to_str()
        .unwrap()
        .contains("X-Forwarded-Host"));
    let (_, _, card) = get(
        &gw,
        "/a2a/agents/echo/card",
        &[("Host", "gw.internal:9000")],
    )
    .await;
    assert_eq!(card["url"], "http://gw.internal:9000/a2a/agents/echo");

    let pinned = spawn_with(
        &[("echo.toml", ECHO), ("other.toml", OTHER)],
        "public_url = \"https://public.example/base/\"",
    )
    .await;
    let (_, _, card) = get(
        &pinned,
        "/.well-known/agent-card.json",
        &[("X-Forwarded-Host", "evil.example")],
    )
    .await;
    assert_eq!(card["url"], "https://public.example/base/a2a");
}

#[tokio::test]
async fn cards_are_cacheable_and_revalidate_with_304() {
    let gw = spawn().await;
    let (_, headers, _) = get(&gw, "/a2a/agents/echo/card", &[]).await;
    let etag = headers["etag"].to_str().unwrap().to_string();
    assert!(etag.starts_with('"') && etag.ends_with('"'));
    assert_eq!(headers["cache-control"], "public, max-age=300");
    let resp = gw
        .client
        .get(gw.url("/a2a/agents/echo/card"))
        .header("If-None-Match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 304);
    assert_eq!(resp.headers()["etag"].to_str().unwrap(), etag);
    let resp = gw
        .client
        .get(gw.url("/a2a/agents/echo/card"))
        .header("If-None-Match", "\"other\"")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (_, other, _) = get(&gw, "/a2a/agents/other/card", &[]).await;
    assert_ne!(other["etag"], headers["etag"]);
}

#[tokio::test]
async fn agent_list_and_health() {
    let gw = spawn().await;
    let (status, _, list) = get(&gw, "/a2a/agents", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(list["defaultAgent"], "echo");
    assert_eq!(list["agents"][1]["name"], "other");
    assert_eq!(
        list["agents"][1]["cardUrl"],
        format!("{}/a2a/agents/other/card", gw.base)
    );

    let (status, headers, health) = get(&gw, "/a2a/health", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(health["status"], "ok");
    assert_eq!(health["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(health["agents"]["echo"], "healthy");
    assert!(health["timestamp"].as_str().unwrap().ends_with('Z'));
}

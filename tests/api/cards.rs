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

    // Last-Modified, and If-Modified-Since where no If-None-Match is sent.
    let modified = headers["last-modified"].to_str().unwrap().to_string();
    let since = |date: &str, tag: Option<&str>| {
        let mut req = gw
            .client
            .get(gw.url("/a2a/agents/echo/card"))
            .header("If-Modified-Since", date);
        if let Some(tag) = tag {
            req = req.header("If-None-Match", tag);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(since(&modified, None).await, 304);
    assert_eq!(since("Sun, 06 Nov 1994 08:49:37 GMT", None).await, 200);
    assert_eq!(since("not a date", None).await, 200);
    // If-None-Match decides when both are sent.
    assert_eq!(since(&modified, Some("\"other\"")).await, 200);
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

/// The aggregated card is kept per access scope and served compressed to clients that
/// accept it, each coding with its own validator; what one scope sees never reaches another.
#[tokio::test]
async fn the_aggregated_card_is_compressed_and_kept_per_access_scope() {
    let private = "name = \"private\"\ndescription = \"d\"\naccess = \"authenticated\"\n[[skills]]\nid = \"secret-skill\"\nname = \"s\"\ndescription = \"d\"\n[backend]\nkind = \"echo\"\n";
    let gateway = format!(
        "[auth]\n[[auth.api_keys]]\nid = \"k\"\nsecret_sha256 = \"{}\"\n",
        crate::helpers::sha("key")
    );
    let gw = spawn_with(&[("echo.toml", ECHO), ("private.toml", private)], &gateway).await;
    let raw = reqwest::Client::new();
    let fetch = |key: Option<&'static str>, coding: &'static str| {
        let raw = raw.clone();
        let url = gw.url("/.well-known/agent-card.json");
        async move {
            let mut req = raw.get(url).header("Accept-Encoding", coding);
            if let Some(key) = key {
                req = req.header("X-API-Key", key);
            }
            let resp = req.send().await.unwrap();
            let headers = resp.headers().clone();
            (headers, resp.bytes().await.unwrap().to_vec())
        }
    };
    let ids = |card: &Value| card["skills"].to_string();
    for _ in 0..2 {
        let (h, plain) = fetch(None, "identity").await;
        assert!(h.get("content-encoding").is_none());
        let anonymous: Value = serde_json::from_slice(&plain).unwrap();
        assert!(!ids(&anonymous).contains("secret-skill"), "{anonymous}");
        let (hk, keyed) = fetch(Some("key"), "identity").await;
        let keyed: Value = serde_json::from_slice(&keyed).unwrap();
        assert!(ids(&keyed).contains("secret-skill"), "{keyed}");
        assert_ne!(h["etag"], hk["etag"]);
    }
    let (plain_headers, plain) = fetch(None, "identity").await;
    let (gz_headers, gz) = fetch(None, "gzip").await;
    assert_eq!(gz_headers["content-encoding"], "gzip");
    assert!(gz_headers["vary"]
        .to_str()
        .unwrap()
        .contains("Accept-Encoding"));
    let mut unzipped = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut unzipped).unwrap();
    assert_eq!(unzipped, plain);
    let (br_headers, br) = fetch(None, "gzip, br").await;
    assert_eq!(br_headers["content-encoding"], "br");
    let mut unbrotli = Vec::new();
    std::io::Read::read_to_end(&mut brotli::Decompressor::new(&br[..], 4096), &mut unbrotli)
        .unwrap();
    assert_eq!(unbrotli, plain);
    assert_ne!(gz_headers["etag"], plain_headers["etag"]);
    assert_ne!(gz_headers["etag"], br_headers["etag"]);
    // A gzip validator revalidates the gzip form.
    let resp = raw
        .get(gw.url("/.well-known/agent-card.json"))
        .header("Accept-Encoding", "gzip")
        .header("If-None-Match", gz_headers["etag"].to_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 304);
}

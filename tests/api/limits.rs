//! Rate limits: exact headers, 429 with Retry-After, recovery, tiers, per-agent limits,
//! trusted proxies, the per-caller stream cap, and preflights that cost nothing.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{rpc, sha, spawn_with, TestGateway, D, ECHO};

async fn limited(extra: &str) -> TestGateway {
    let gateway = format!(
        r#"
[[auth.api_keys]]
id = "gold"
secret_sha256 = "{gold}"
tier = "gold"
[rate_limits]
trusted_proxies = ["127.0.0.1"]
[rate_limits.tiers.default]
requests_per_minute = 60
burst = 3
max_streams = 1
[rate_limits.tiers.gold]
requests_per_minute = 6000
burst = 100
[cors]
allowed_origins = ["https://app.example"]
{extra}
"#,
        gold = sha("gold-key")
    );
    spawn_with(&[("echo.toml", ECHO)], &gateway).await
}

async fn send(gw: &TestGateway, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = gw
        .client
        .post(gw.url("/a2a/agents/echo"))
        .header("A2A-Version", "1.0");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(rpc("SendMessage", json!({"message": D::V10.message("hi")})))
        .send()
        .await
        .unwrap()
}

fn rate(resp: &reqwest::Response) -> (String, String, String) {
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    (
        h("x-ratelimit-limit"),
        h("x-ratelimit-remaining"),
        h("x-ratelimit-reset"),
    )
}

#[tokio::test]
async fn exhaustion_gives_429_with_exact_headers_and_recovers() {
    let gw = limited("").await;
    let xff = [("X-Forwarded-For", "10.0.0.1")];
    for (i, remaining) in ["2", "1", "0"].into_iter().enumerate() {
        let r = send(&gw, &xff).await;
        assert_eq!(r.status(), 200, "request {i}");
        let (limit, rem, reset) = rate(&r);
        assert_eq!(
            (limit.as_str(), rem.as_str()),
            ("3", remaining),
            "request {i}"
        );
        // One request per second refills: the reset is the seconds until the burst is whole.
        assert_eq!(reset, (i + 1).to_string(), "request {i}");
    }
    let refused = send(&gw, &xff).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(rate(&refused).1, "0");
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(retry, 1);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        body["error"]["code"], -32070,
        "a code of its own, not A2A's: {body}"
    );
    assert_eq!(
        body["error"]["message"],
        "Rate limit exceeded (caller): retry in 1 s"
    );

    // Another address behind the trusted proxy has its own allowance...
    assert_eq!(
        send(&gw, &[("X-Forwarded-For", "10.0.0.2")]).await.status(),
        200
    );
    // ...and the first recovers once the window has refilled a request.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(send(&gw, &xff).await.status(), 200);
}

#[tokio::test]
async fn tiers_follow_the_credential_and_rest_routes_are_counted_too() {
    let gw = limited("").await;
    let gold = send(&gw, &[("X-API-Key", "gold-key")]).await;
    assert_eq!(rate(&gold).0, "100");
    let rest = gw
        .client
        .post(gw.url("/a2a/agents/echo/rest/message:send"))
        .header("X-Forwarded-For", "10.9.9.9")
        .json(&json!({"message": D::V10.message("hi")}))
        .send()
        .await
        .unwrap();
    assert_eq!(rate(&rest), ("3".into(), "2".into(), "1".into()));
    // Cards and health are not limited.
    let card = gw
        .client
        .get(gw.url("/a2a/agents/echo/card"))
        .send()
        .await
        .unwrap();
    assert!(card.headers().get("x-ratelimit-limit").is_none());
}

#[tokio::test]
async fn forwarded_for_is_ignored_from_untrusted_peers() {
    let gw = spawn_with(
        &[("echo.toml", ECHO)],
        "[rate_limits.tiers.default]\nrequests_per_minute = 60\nburst = 1",
    )
    .await;
    assert_eq!(
        send(&gw, &[("X-Forwarded-For", "10.0.0.1")]).await.status(),
        200
    );
    let spoofed = send(&gw, &[("X-Forwarded-For", "10.0.0.2")]).await;
    assert_eq!(
        spoofed.status(),
        429,
        "a made-up address does not buy a new allowance"
    );
}

#[tokio::test]
async fn per_agent_limits_apply_to_all_callers() {
    let gw = limited("[rate_limits.agents.echo]\nrequests_per_minute = 60\nburst = 2").await;
    assert_eq!(send(&gw, &[("X-API-Key", "gold-key")]).await.status(), 200);
    assert_eq!(
        send(&gw, &[("X-Forwarded-For", "10.1.1.1")]).await.status(),
        200
    );
    let third = send(&gw, &[("X-Forwarded-For", "10.1.1.2")]).await;
    assert_eq!(third.status(), 429);
    let body: Value = third.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        "Rate limit exceeded (agent): retry in 1 s"
    );
}

#[tokio::test]
async fn one_caller_cannot_hold_more_streams_than_its_tier_allows() {
    let gw = limited("").await;
    let stream = |who: &'static str| {
        gw.client
            .post(gw.url("/a2a/agents/echo"))
            .header("A2A-Version", "1.0")
            .header("X-Forwarded-For", who)
            .body(rpc(
                "SendStreamingMessage",
                json!({"message": D::V10.message("/delay 30 x")}),
            ))
            .send()
    };
    let held = stream("10.2.2.2").await.unwrap();
    assert_eq!(held.headers()["content-type"], "text/event-stream");
    let second = stream("10.2.2.2").await.unwrap();
    assert_eq!(second.status(), 429);
    let body: Value = second.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32071);
    assert_eq!(
        stream("10.3.3.3").await.unwrap().status(),
        200,
        "other callers are unaffected"
    );
}

#[tokio::test]
async fn preflight_costs_no_allowance() {
    let gw = limited("").await;
    for _ in 0..5 {
        let pre = gw
            .client
            .request(reqwest::Method::OPTIONS, gw.url("/a2a/agents/echo"))
            .header("Origin", "https://app.example")
            .header("Access-Control-Request-Method", "POST")
            .header("X-Forwarded-For", "10.4.4.4")
            .send()
            .await
            .unwrap();
        assert_eq!(pre.status(), 200);
    }
    let r = send(&gw, &[("X-Forwarded-For", "10.4.4.4")]).await;
    assert_eq!(rate(&r).1, "2", "the full allowance is still there");
}

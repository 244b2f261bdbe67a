//! A2A extensions: declared in agent files and kept from upstream cards, asked for with
//! `A2A-Extensions` (0.3: `X-A2A-Extensions`) and carried on to upstreams, activated ones
//! reported back, and a required one not asked for refused on every binding.

use serde_json::{json, Value};

use crate::helpers::{spawn_with_grpc, TestGateway, D};
use crate::peers::{fault_server_with, upstream_agent};

const URI: &str = "https://extensions.example/trace/v1";

fn strict() -> String {
    format!(
        "name = \"strict\"\ndescription = \"needs an extension\"\n[[extensions]]\nuri = \"{URI}\"\ndescription = \"traces\"\nrequired = true\nparams = {{ depth = 2 }}\n[backend]\nkind = \"echo\"\n"
    )
}

/// A send to `path` in dialect `d`, asking for `extensions` in that dialect's header.
async fn send(
    gw: &TestGateway,
    path: &str,
    d: D,
    extensions: Option<&str>,
) -> (reqwest::header::HeaderMap, Value) {
    let name = match d {
        D::V10 => "A2A-Extensions",
        D::V03 => "X-A2A-Extensions",
    };
    let asked: Vec<(&str, &str)> = extensions.map(|e| (name, e)).into_iter().collect();
    let params = json!({"message": d.message("hi")});
    let reply = gw.call_with(path, d, d.send(), params, &asked).await;
    (reply.headers, reply.body)
}

#[tokio::test]
async fn a_required_extension_not_asked_for_is_refused_on_every_binding() {
    let gw = spawn_with_grpc(&[("strict.toml", &strict())], "").await;
    let card = gw.get_json("/a2a/agents/strict/card").await;
    let listed = &card["capabilities"]["extensions"][0];
    assert_eq!(listed["uri"], URI, "{card}");
    assert_eq!(
        (
            listed["required"].clone(),
            listed["params"]["depth"].clone()
        ),
        (json!(true), json!(2))
    );
    for d in [D::V10, D::V03] {
        let (_, refused) = send(&gw, "/a2a/agents/strict", d, None).await;
        assert_eq!(refused["error"]["code"], -32008, "{refused}");
        let (_, other) = send(
            &gw,
            "/a2a/agents/strict",
            d,
            Some("https://other.example/x"),
        )
        .await;
        assert_eq!(other["error"]["code"], -32008, "{other}");
        let (_, ok) = send(
            &gw,
            "/a2a/agents/strict",
            d,
            Some(&format!("https://other.example/x, {URI}")),
        )
        .await;
        assert!(ok.get("result").is_some(), "{ok}");
    }
    let rest = |ext: Option<&'static str>| {
        let mut req = gw
            .client
            .post(gw.url("/a2a/agents/strict/rest/message:send"))
            .header("content-type", "application/a2a+json")
            .header("A2A-Version", "1.0");
        if let Some(ext) = ext {
            req = req.header("A2A-Extensions", ext);
        }
        let body = json!({"message": D::V10.message("over rest")}).to_string();
        async move {
            let resp = req.body(body).send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let (status, refused) = rest(None).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(
        refused["error"]["details"][0]["reason"], "EXTENSION_SUPPORT_REQUIRED",
        "{refused}"
    );
    assert_eq!(rest(Some(URI)).await.0, 200);
    let out = crate::grpc::probe(
        &gw,
        json!([
            {"method": "SendMessage", "request": {"tenant": "strict", "message": D::V10.message("g")}},
            {"method": "SendMessage", "request": {"tenant": "strict", "message": D::V10.message("g")},
             "metadata": {"a2a-extensions": URI}},
        ]),
    )
    .await;
    assert_eq!(out[0]["code"], "FAILED_PRECONDITION", "{}", out[0]);
    assert_eq!(
        out[0]["error_info"]["reason"], "EXTENSION_SUPPORT_REQUIRED",
        "{}",
        out[0]
    );
    assert_eq!(out[1]["code"], "OK", "{}", out[1]);
}

/// An upstream that requires an extension: the gateway's card keeps it, refuses a call
/// that does not ask for it before calling the upstream, carries the ask on in the
/// upstream's dialect, and reports what the upstream activated in the caller's.
#[tokio::test]
async fn extensions_are_carried_to_upstreams_and_activated_ones_come_back() {
    let log = tempfile::tempdir().unwrap();
    let seen = log.path().join("seen.jsonl");
    let args = ["--log-requests", seen.to_str().unwrap(), "--extension", URI];
    let upstream = fault_server_with("extended", 0, &args).await;
    let gw = spawn_with_grpc(
        &[("up.toml", &upstream_agent("up", &upstream.url(), ""))],
        "",
    )
    .await;
    let card = gw.get_json("/a2a/agents/up/card").await;
    assert_eq!(card["capabilities"]["extensions"][0]["uri"], URI, "{card}");
    let posts = || {
        std::fs::read_to_string(&seen)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["method"] == "POST")
            .collect::<Vec<_>>()
    };
    let (_, refused) = send(&gw, "/a2a/agents/up", D::V10, None).await;
    assert_eq!(refused["error"]["code"], -32008, "{refused}");
    assert!(posts().is_empty(), "the upstream was called: {:?}", posts());
    for d in [D::V10, D::V03] {
        let (headers, answer) = send(&gw, "/a2a/agents/up", d, Some(URI)).await;
        assert!(answer.get("result").is_some(), "{answer}");
        let name = if d == D::V10 {
            "a2a-extensions"
        } else {
            "x-a2a-extensions"
        };
        assert_eq!(
            headers.get(name).and_then(|v| v.to_str().ok()),
            Some(URI),
            "{d:?}: {headers:?}"
        );
        let post = posts().pop().expect("the upstream was called");
        // The upstream speaks 1.0: the ask arrives in 1.0's header.
        assert_eq!(post["headers"]["a2a-extensions"], URI, "{post}");
    }
}

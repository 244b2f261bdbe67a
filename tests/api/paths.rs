//! Paths as clients write them: one trailing slash anywhere, unknown endpoints answered in
//! a shape the caller can read (JSON-RPC for a POST, plain JSON otherwise).

use serde_json::{json, Value};

use crate::helpers::{spawn, D};

#[tokio::test]
async fn every_endpoint_answers_the_same_with_one_trailing_slash() {
    let gw = spawn().await;
    for path in ["/a2a/agents/echo/", "/a2a/"] {
        for d in [D::V03, D::V10] {
            let r = gw
                .call(path, d, d.send(), json!({"message": d.message("slash")}))
                .await;
            assert_eq!(r.status, 200, "{path} {d:?}: {}", r.body);
            let task = d.task_of(r.result());
            assert_eq!(task["status"]["state"], d.state("completed"), "{path}");
            assert_eq!(r.header("a2a-gateway-agent"), "echo", "{path}");
        }
    }
    for path in [
        "/.well-known/agent-card.json/",
        "/.well-known/agent.json/",
        "/.well-known/agent-card",
        "/.well-known/agent-card/",
        "/a2a/agents/",
        "/a2a/health/",
        "/a2a/agents/echo/card/",
        "/a2a/agents/echo/.well-known/agent-card.json/",
        "/a2a/agents/echo/.well-known/agent-card",
    ] {
        let resp = gw.client.get(gw.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "GET {path}");
        let plain = gw
            .client
            .get(gw.url(path.trim_end_matches('/')))
            .send()
            .await
            .unwrap();
        let (a, b): (Value, Value) = (resp.json().await.unwrap(), plain.json().await.unwrap());
        if !path.starts_with("/a2a/health") {
            assert_eq!(a, b, "GET {path} is GET {}", path.trim_end_matches('/'));
        }
    }
    // The HTTP+JSON binding: its routes keep their paths; its root trims like the rest.
    let r = gw
        .client
        .post(gw.url("/a2a/agents/echo/rest/message:send/"))
        .json(&json!({"message": D::V10.message("rest")}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let slash = gw
        .client
        .get(gw.url("/a2a/agents/echo/rest/"))
        .send()
        .await
        .unwrap();
    let plain = gw
        .client
        .get(gw.url("/a2a/agents/echo/rest"))
        .send()
        .await
        .unwrap();
    assert_eq!(slash.status(), plain.status());
}

#[tokio::test]
async fn a_post_to_an_unknown_path_is_a_json_rpc_error() {
    let gw = spawn().await;
    let body = |id: Value| json!({"jsonrpc":"2.0","id":id,"method":"GetTask","params":{"id":"x"}});
    // Not an endpoint: 404 with a JSON-RPC body carrying the request's id and dialect.
    for (path, id) in [
        ("/nowhere", json!(5)),
        ("/a2a/agents/echo/extra", json!("abc")),
        ("/a2a/nope", json!(12345678901234_i64)),
    ] {
        let r = gw
            .post_raw(
                path,
                &[("A2A-Version", "1.0")],
                body(id.clone()).to_string(),
            )
            .await;
        assert_eq!(r.status, 404, "{path}: {}", r.body);
        assert_eq!(r.body["jsonrpc"], "2.0", "{path}");
        assert_eq!(r.body["id"], id, "{path}");
        assert_eq!(r.code(), -32044, "{path}");
        assert_eq!(r.body["error"]["data"][0]["reason"], "ENDPOINT_NOT_FOUND");
        assert!(r.message().contains(path), "{path}: {}", r.message());
    }
    // Under an agent that does not exist: the agent list, as on /a2a/agents/<unknown>.
    for path in [
        "/a2a/agents/ghost",
        "/a2a/agents/ghost/",
        "/a2a/agents/ghost/deeper",
    ] {
        let r = gw.post_raw(path, &[], body(json!(1)).to_string()).await;
        assert_eq!(r.status, 404, "{path}: {}", r.body);
        assert_eq!(
            (r.body["id"].clone(), r.code()),
            (json!(1), -32040),
            "{path}"
        );
        let info = &r.body["error"]["data"][0];
        assert_eq!(
            info["metadata"]["availableAgents"], "echo,other",
            "{path}: {}",
            r.body
        );
    }
    // A body that does not parse: still JSON-RPC, with id null.
    let r = gw.post_raw("/nowhere", &[], "{oops").await;
    assert_eq!((r.status, r.body["id"].clone()), (404, Value::Null));
    assert_eq!(r.code(), -32044);
    // A GET keeps a plain JSON 404.
    let resp = gw.client.get(gw.url("/nowhere")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["status"], "NOT_FOUND", "{v}");
    let health = gw.client.get(gw.url("/a2a/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

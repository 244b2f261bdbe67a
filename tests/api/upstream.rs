//! Upstream A2A agents through the gateway: the official SDKs' servers as remotes, both
//! client dialects against both remote dialects, the REST binding, and failures.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::helpers::{inner, kind, parse_sse, rpc, spawn_with, text_of, TestGateway, D, ECHO};
use crate::peers::{
    fault_server, free_port, js_agent, python_agent, sdk03_agent, sdk03_agent_with, upstream_agent,
    Peer,
};

const AGENT: &str = "/a2a/agents/up";

/// A gateway with `echo` (the default) and `up`, proxying to `peer`.
async fn gateway_for(peer: &Peer, extra: &str) -> TestGateway {
    spawn_with(
        &[
            ("echo.toml", ECHO),
            ("up.toml", &upstream_agent("up", &peer.url(), extra)),
        ],
        "default_agent = \"echo\"",
    )
    .await
}

async fn send(gw: &TestGateway, d: D, text: &str, config: Value) -> Value {
    let r = gw
        .call(
            AGENT,
            d,
            d.send(),
            json!({"message": d.message(text), "configuration": config}),
        )
        .await;
    d.task_of(r.result())
}

fn nonblocking(d: D) -> Value {
    match d {
        D::V03 => json!({"blocking": false}),
        D::V10 => json!({"returnImmediately": true}),
    }
}

/// Every operation, in dialect `d`, against the proxied agent; `remote` labels failures.
async fn exercise(gw: &TestGateway, d: D, remote: &str) {
    let label = |case: &str| format!("{case}: client {d:?} -> {remote}");

    // send
    let task = send(gw, d, "hello upstream", json!({})).await;
    assert_eq!(
        task["status"]["state"],
        d.state("completed"),
        "{}",
        label("send")
    );
    assert_eq!(
        text_of(&task["artifacts"]),
        "hello upstream",
        "{}",
        label("send")
    );
    let id = task["id"].as_str().unwrap().to_string();
    assert!(
        id.starts_with("up."),
        "{}: ids are namespaced: {id}",
        label("send")
    );
    assert_eq!(
        task["history"][0]["taskId"],
        id.as_str(),
        "{}",
        label("send")
    );

    // get, on the agent and through the shared endpoint (which must find the owner)
    for path in [AGENT, "/a2a"] {
        let got = gw.call(path, d, d.get(), json!({"id": id})).await;
        assert_eq!(
            got.result()["id"],
            id.as_str(),
            "{} via {path}",
            label("get")
        );
        assert_eq!(
            got.result()["status"]["state"],
            d.state("completed"),
            "{}",
            label("get")
        );
        assert_eq!(
            text_of(&got.result()["artifacts"]),
            "hello upstream",
            "{}",
            label("get")
        );
    }

    // stream
    let text = "one two three four five six";
    let events = gw
        .sse(AGENT, d, d.stream(), json!({"message": d.message(text)}))
        .await;
    let kinds: Vec<String> = events.iter().map(|e| kind(d, &e.data["result"])).collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("task"),
        "{}: {kinds:?}",
        label("stream")
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("status-update"),
        "{}",
        label("stream")
    );
    let joined: String = events
        .iter()
        .filter(|e| kind(d, &e.data["result"]) == "artifact-update")
        .map(|e| {
            inner(d, &e.data["result"])["artifact"]["parts"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(joined, text, "{}", label("stream"));
    let last = inner(d, &events.last().unwrap().data["result"]);
    assert_eq!(
        last["status"]["state"],
        d.state("completed"),
        "{}",
        label("stream")
    );
    assert!(
        last["taskId"].as_str().unwrap().starts_with("up."),
        "{}",
        label("stream")
    );
    if d == D::V03 {
        assert_eq!(last["final"], true, "{}", label("stream"));
    }

    // cancel
    let slow = send(gw, d, "/delay 30 slow", nonblocking(d)).await;
    let slow_id = slow["id"].as_str().unwrap();
    let canceled = gw.call(AGENT, d, d.cancel(), json!({"id": slow_id})).await;
    assert_eq!(
        canceled.result()["status"]["state"],
        d.state("canceled"),
        "{}: {}",
        label("cancel"),
        canceled.body
    );
    let again = gw.call(AGENT, d, d.cancel(), json!({"id": slow_id})).await;
    let code = again.body["error"]["code"].as_i64();
    // Cancel of a canceled task: -32002, or the task again (both SDKs allow either).
    assert!(
        code == Some(-32002) || again.body["result"]["status"]["state"] == d.state("canceled"),
        "{}: {}",
        label("cancel twice"),
        again.body
    );

    // subscribe
    let watched = send(gw, d, "/delay 1 watch these words", nonblocking(d)).await;
    let events = gw
        .sse(AGENT, d, d.subscribe(), json!({"id": watched["id"]}))
        .await;
    let kinds: Vec<String> = events.iter().map(|e| kind(d, &e.data["result"])).collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("task"),
        "{}: {kinds:?}",
        label("subscribe")
    );
    let last = inner(d, &events.last().unwrap().data["result"]);
    assert_eq!(
        last["status"]["state"],
        d.state("completed"),
        "{}",
        label("subscribe")
    );
    wait_for_state_at(gw, d, watched["id"].as_str().unwrap(), "completed").await;

    // input-required, continued by taskId
    let asking = send(gw, d, "/input What is your name?", json!({})).await;
    assert_eq!(
        asking["status"]["state"],
        d.state("input-required"),
        "{}",
        label("input-required")
    );
    assert_eq!(
        asking["status"]["message"]["parts"][0]["text"],
        "What is your name?",
        "{}",
        label("input-required")
    );
    let mut follow = d.message("Ada");
    follow["taskId"] = asking["id"].clone();
    follow["contextId"] = asking["contextId"].clone();
    let done = gw
        .call("/a2a", d, d.send(), json!({"message": follow}))
        .await;
    let done = d.task_of(done.result());
    assert_eq!(
        done["id"],
        asking["id"],
        "{}: the follow-up went through /a2a to the owner",
        label("input-required")
    );
    assert_eq!(
        done["status"]["state"],
        d.state("completed"),
        "{}",
        label("input-required")
    );
    assert_eq!(
        text_of(&done["artifacts"]),
        "Ada",
        "{}",
        label("input-required")
    );

    // auth-required, relayed and continued the same way
    let authorizing = send(gw, d, "/auth Sign in first", json!({})).await;
    assert_eq!(
        authorizing["status"]["state"],
        d.state("auth-required"),
        "{}",
        label("auth-required")
    );
    let id = authorizing["id"].as_str().unwrap();
    wait_for_state_at(gw, d, id, "auth-required").await;
    let mut granted = d.message("granted");
    granted["taskId"] = authorizing["id"].clone();
    let done = gw
        .call("/a2a", d, d.send(), json!({"message": granted}))
        .await;
    let done = d.task_of(done.result());
    assert_eq!(
        (done["id"].clone(), done["status"]["state"].clone()),
        (authorizing["id"].clone(), json!(d.state("completed"))),
        "{}",
        label("auth-required")
    );

    // a plain Message reply
    let r = gw
        .call(
            AGENT,
            d,
            d.send(),
            json!({"message": d.message("/message just words")}),
        )
        .await;
    let msg = match d {
        D::V03 => r.result().clone(),
        D::V10 => r.result()["message"].clone(),
    };
    assert_eq!(
        msg["parts"][0]["text"],
        "just words",
        "{}: {}",
        label("message"),
        r.body
    );

    // errors pass through with their codes
    let r = gw
        .call(AGENT, d, d.get(), json!({"id": "up.no-such-task"}))
        .await;
    assert_eq!(r.code(), -32001, "{}: {}", label("unknown task"), r.body);
    let r = gw
        .call(AGENT, d, d.get(), json!({"id": "not-namespaced"}))
        .await;
    assert_eq!(r.code(), -32001, "{}: {}", label("foreign id"), r.body);
}

async fn wait_for_state_at(gw: &TestGateway, d: D, id: &str, state: &str) {
    for _ in 0..100 {
        let r = gw.call(AGENT, d, d.get(), json!({"id": id})).await;
        if r.result()["status"]["state"] == d.state(state) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} never reached {state}");
}

/// The 1.0 HTTP+JSON binding in front of the proxied agent.
async fn exercise_rest(gw: &TestGateway, remote: &str) {
    let base = gw.url("/a2a/agents/up/rest");
    let c = &gw.client;
    let body = json!({"message": D::V10.message("rest hello")});
    let r = c
        .post(format!("{base}/message:send"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{remote}");
    assert_eq!(r.headers()["content-type"], "application/a2a+json");
    let v: Value = r.json().await.unwrap();
    let id = v["task"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        text_of(&v["task"]["artifacts"]),
        "rest hello",
        "{remote}: {v}"
    );

    let got: Value = c
        .get(format!("{base}/tasks/{id}?historyLength=0"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED", "{remote}");
    assert!(
        got.get("history").is_none(),
        "{remote}: historyLength=0 means none: {got}"
    );

    let stream = c
        .post(format!("{base}/message:stream"))
        .json(&json!({"message": D::V10.message("a b c")}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let events = parse_sse(&stream.text().await.unwrap());
    assert!(
        events[0].data.get("task").is_some(),
        "{remote}: bare StreamResponse, task first: {:?}",
        events[0]
    );
    assert_eq!(
        events.last().unwrap().data["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );

    let slow: Value = c.post(format!("{base}/message:send"))
        .json(&json!({"message": D::V10.message("/delay 30 x"), "configuration": {"returnImmediately": true}}))
        .send().await.unwrap().json().await.unwrap();
    let slow_id = slow["task"]["id"].as_str().unwrap();
    let sub = tokio::spawn(c.get(format!("{base}/tasks/{slow_id}:subscribe")).send());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let canceled: Value = c
        .post(format!("{base}/tasks/{slow_id}:cancel"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        canceled["status"]["state"], "TASK_STATE_CANCELED",
        "{remote}: {canceled}"
    );
    let sub_text = tokio::time::timeout(Duration::from_secs(10), async {
        sub.await.unwrap().unwrap().text().await.unwrap()
    })
    .await
    .expect("the subscription ends with the task");
    let sub_events = parse_sse(&sub_text);
    assert!(
        sub_events[0].data.get("task").is_some(),
        "{remote}: {sub_text}"
    );
    assert_eq!(
        sub_events.last().unwrap().data["statusUpdate"]["status"]["state"],
        "TASK_STATE_CANCELED",
        "{remote}: {sub_text}"
    );

    let missing = c.get(format!("{base}/tasks/up.nope")).send().await.unwrap();
    assert_eq!(missing.status(), 404, "{remote}");
    let err: Value = missing.json().await.unwrap();
    assert_eq!(err["error"]["details"][0]["reason"], "TASK_NOT_FOUND");
}

#[tokio::test]
async fn python_sdk_remote_speaking_1_0() {
    let peer = python_agent("1.0", 0).await;
    let gw = gateway_for(&peer, "").await;
    for d in [D::V03, D::V10] {
        exercise(&gw, d, "python 1.0").await;
    }
    exercise_rest(&gw, "python 1.0").await;
}

#[tokio::test]
async fn python_sdk_remote_speaking_0_3() {
    let peer = python_agent("0.3", 0).await;
    let gw = gateway_for(&peer, "").await;
    for d in [D::V03, D::V10] {
        exercise(&gw, d, "python 0.3").await;
    }
    exercise_rest(&gw, "python 0.3").await;
    // 0.3 has no ListTasks: the gateway answers from its own record of the relayed tasks.
    let r = gw
        .call(AGENT, D::V10, "ListTasks", json!({"pageSize": 3}))
        .await;
    let page = r.result();
    let tasks = page["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3, "{page}");
    assert!(page["totalSize"].as_i64().unwrap() > 3, "{page}");
    assert!(
        tasks
            .iter()
            .all(|t| t["id"].as_str().unwrap().starts_with("up.")),
        "{page}"
    );
}

#[tokio::test]
async fn javascript_sdk_remote_speaking_1_0() {
    let peer = js_agent("1.0").await;
    let gw = gateway_for(&peer, "").await;
    for d in [D::V03, D::V10] {
        exercise(&gw, d, "javascript 1.0").await;
    }
    exercise_rest(&gw, "javascript 1.0").await;
    let r = gw
        .call(AGENT, D::V10, "ListTasks", json!({"pageSize": 2}))
        .await;
    let page = r.result();
    assert!(
        page["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["id"].as_str().unwrap().starts_with("up.")),
        "{page}"
    );
}

#[tokio::test]
async fn javascript_sdk_remote_speaking_0_3() {
    let peer = js_agent("0.3").await;
    let gw = gateway_for(&peer, "").await;
    for d in [D::V03, D::V10] {
        exercise(&gw, d, "javascript 0.3").await;
    }
    exercise_rest(&gw, "javascript 0.3").await;
}

#[tokio::test]
async fn the_remote_card_is_served_through_the_gateway() {
    let peer = python_agent("1.0,0.3", 0).await;
    let gw = spawn_with(
        &[
            ("echo.toml", ECHO),
            ("up.toml", &upstream_agent("up", &peer.url(), "")),
        ],
        "default_agent = \"echo\"",
    )
    .await;
    let card: Value = gw.get_json("/a2a/agents/up/card").await;
    let url = gw.url("/a2a/agents/up");
    assert_eq!(card["name"], "up", "the gateway's name for the agent");
    assert_eq!(card["url"], url.as_str());
    assert_eq!(
        card["description"], "Echoes text back; A2A interop reference agent (a2a-sdk).",
        "from the remote"
    );
    for iface in card["supportedInterfaces"].as_array().unwrap() {
        assert!(
            iface["url"].as_str().unwrap().starts_with(&url),
            "every URL points at the gateway: {iface}"
        );
    }
    assert!(
        !card.to_string().contains(&peer.url()),
        "no remote URL leaks: {card}"
    );
    assert_eq!(card["capabilities"]["pushNotifications"], false);
    let agg: Value = gw.get_json("/.well-known/agent-card.json").await;
    let ids: Vec<&str> = agg["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"up/echo"),
        "the remote's skills join the aggregated card: {ids:?}"
    );

    // Local fields override the remote card.
    let local = "description = \"Our research agent\"\nversion = \"9.9.9\"\n";
    let file = format!("{local}{}", upstream_agent("up", &peer.url(), ""));
    let gw2 = spawn_with(&[("up.toml", &file)], "").await;
    let card: Value = gw2.get_json("/a2a/agents/up/card").await;
    assert_eq!(
        (card["description"].as_str(), card["version"].as_str()),
        (Some("Our research agent"), Some("9.9.9"))
    );
}

#[tokio::test]
async fn a_remote_down_at_startup_is_unhealthy_then_recovers() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let gw = spawn_with(
        &[
            ("echo.toml", ECHO),
            (
                "up.toml",
                &upstream_agent("up", &url, "retry_secs = 1\nconnect_timeout_secs = 1"),
            ),
        ],
        "default_agent = \"echo\"",
    )
    .await;
    let health: Value = gw.get_json("/a2a/health").await;
    assert_eq!(health["agents"]["up"], "unhealthy");
    assert_eq!(health["status"], "degraded");
    let card_skills_of_up = || async {
        let card: Value = gw.get_json("/.well-known/agent-card.json").await;
        card["skills"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["tags"].as_array().unwrap().contains(&json!("agent:up")))
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let skills_before = card_skills_of_up().await;
    let r = gw
        .call(
            AGENT,
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("hi")}),
        )
        .await;
    assert_eq!((r.status, r.code()), (503, -32051), "{}", r.body);
    assert_eq!(
        r.message(),
        "Agent up is unavailable: its agent card could not be fetched yet"
    );
    let echo = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("hi")}),
        )
        .await;
    assert_eq!(echo.status, 200, "other agents are unaffected");

    let _peer = python_agent("1.0", port).await;
    let mut healthy = false;
    for _ in 0..60 {
        let h: Value = gw.get_json("/a2a/health").await;
        if h["agents"]["up"] == "healthy" {
            healthy = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(healthy, "the agent recovers once its remote is up");
    // The aggregated card (rendered once and kept) shows the remote card's skills now.
    let skills_after = card_skills_of_up().await;
    assert_ne!(skills_after, skills_before, "the kept card was rebuilt");
    assert!(!skills_after.is_empty());
    let r = gw
        .call(
            AGENT,
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("back")}),
        )
        .await;
    assert_eq!(text_of(&r.result()["task"]["artifacts"]), "back");
}

#[tokio::test]
async fn a_remote_killed_mid_stream_ends_the_stream_with_a_failed_status() {
    for d in [D::V10, D::V03] {
        let mut peer = python_agent("1.0", 0).await;
        let gw = gateway_for(&peer, "").await;
        let mut req = gw
            .client
            .post(gw.url(AGENT))
            .header("content-type", "application/json");
        if let Some(v) = d.header() {
            req = req.header("A2A-Version", v);
        }
        let body = json!({"jsonrpc":"2.0","id":1,"method": d.stream(),"params":{"message": d.message("/delay 20 never")}});
        let resp = req.body(body.to_string()).send().await.unwrap();
        let mut body = resp.bytes_stream();
        let mut text = String::new();
        // Wait until the remote has said it is working, then kill it.
        while !text.contains(&format!("\"{}\"", d.state("working"))) {
            let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
                .await
                .expect("events arrive")
                .expect("the stream is open")
                .expect("a chunk");
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        peer.kill();
        let text = tokio::time::timeout(Duration::from_secs(10), async move {
            while let Some(chunk) = body.next().await {
                text.push_str(&String::from_utf8_lossy(&chunk.expect("a chunk")));
            }
            text
        })
        .await
        .expect("the stream ends instead of hanging");
        let events = parse_sse(&text);
        let last = inner(d, &events.last().unwrap().data["result"]);
        assert_eq!(last["status"]["state"], d.state("failed"), "{d:?}: {text}");
        assert_eq!(
            last["status"]["message"]["parts"][0]["text"],
            "the upstream connection broke mid-stream",
            "{d:?}"
        );
        if d == D::V03 {
            assert_eq!(last["final"], true, "0.3 clients see the stream end");
        }
    }
}

#[tokio::test]
async fn a_slow_remote_times_out_with_a_clear_error() {
    let peer = fault_server("slow", 10).await;
    let gw = gateway_for(&peer, "timeout_secs = 1").await;
    let started = std::time::Instant::now();
    let r = gw
        .call(
            AGENT,
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("hi")}),
        )
        .await;
    assert_eq!((r.status, r.code()), (504, -32053), "{}", r.body);
    assert_eq!(r.message(), "Agent up did not answer within 1 s");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn garbage_and_errors_from_the_remote_become_precise_answers() {
    for (mode, code, message) in [
        ("garbage", -32006, "Invalid agent response: agent up answered with something that is not a JSON-RPC response"),
        ("invalid", -32006, "Invalid agent response: agent up answered with neither a result nor an error"),
        ("error", -32001, "Task not found: upstream says so"),
        // The relay refuses it for 1.0 callers and leaves it to the conversion, as for 0.3.
        ("malformed", -32006, "Invalid agent response: agent up "),
        // A JSON-RPC call is never replayed somewhere the agent file does not name.
        ("redirect", -32006, "Invalid agent response: agent up answered with something that is not a JSON-RPC response"),
        // Read no further than 16 MiB, however long the answer.
        ("huge", -32006, "Invalid agent response: agent up answered with more than 16 MiB"),
    ] {
        let peer = fault_server(mode, 0).await;
        let gw = gateway_for(&peer, "").await;
        for d in [D::V03, D::V10] {
            let r = gw.call(AGENT, d, d.send(), json!({"message": d.message("hi")})).await;
            assert_eq!(r.code(), code, "{mode} {d:?}: {}", r.body);
            assert!(r.message().starts_with(message), "{mode} {d:?}: {}", r.body);
        }
        // Streaming calls go through another client: redirects and the size cap hold there
        // too (the fault server answers them with plain JSON).
        if mode == "redirect" || mode == "huge" {
            let r = gw
                .call(AGENT, D::V10, "SendStreamingMessage", json!({"message": D::V10.message("hi")}))
                .await;
            assert_eq!(r.code(), -32006, "{mode}: {}", r.body);
            assert!(r.message().starts_with(message), "{mode}: {}", r.body);
        }
        let health = gw.client.get(gw.url("/a2a/health")).send().await.unwrap();
        assert_eq!(health.status(), 200, "{mode}: the gateway stays healthy");
    }
}

/// A caller speaking the remote's dialect gets the remote's answer as it was written, bar
/// the gateway's rewrites; another dialect gets it converted, so only what that dialect
/// defines survives.
#[tokio::test]
async fn same_dialect_answers_are_relayed_with_only_the_gateways_rewrites() {
    let peer = fault_server("extended", 0).await;
    let gw = gateway_for(&peer, "").await;
    for d in [D::V10, D::V03] {
        let r = gw
            .call(
                AGENT,
                d,
                d.send(),
                json!({"message": d.message("hi"), "configuration": {"historyLength": 1}}),
            )
            .await;
        let task = d.task_of(r.result());
        let id = task["id"].as_str().unwrap();
        assert!(id.starts_with("up."), "{d:?}: namespaced: {task}");
        let history = task["history"].as_array().unwrap();
        assert_eq!(history.len(), 1, "{d:?}: trimmed to historyLength: {task}");
        for message in [&history[0], &task["status"]["message"]] {
            assert_eq!(message["taskId"], id, "{d:?}: {task}");
            assert_eq!(message["referenceTaskIds"], json!([id]), "{d:?}: {task}");
        }
        assert_eq!(task["metadata"]["upstream"], "fault", "{d:?}");
        assert_eq!(task["metadata"]["gateway/agent"], "up", "{d:?}");
        match d {
            D::V10 => {
                assert_eq!(task["x-extension"], json!({"kept": true}), "{task}");
                assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
            }
            D::V03 => {
                assert!(task.get("x-extension").is_none(), "{task}");
                assert_eq!(task["kind"], "task");
                assert_eq!(task["status"]["state"], "completed");
            }
        }
    }
}

#[tokio::test]
async fn idle_streams_get_keepalive_comments() {
    let peer = python_agent("1.0", 0).await;
    let gw = gateway_for(&peer, "stream_keepalive_secs = 1").await;
    let resp = gw
        .client
        .post(gw.url(AGENT))
        .header("A2A-Version", "1.0")
        .body(rpc(
            "SendStreamingMessage",
            json!({"message": D::V10.message("/delay 3 quiet")}),
        ))
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    let comments = text.lines().filter(|l| l.starts_with(':')).count();
    assert!(
        comments >= 2,
        "a comment at least every second while idle: {text}"
    );
    assert!(text.contains("TASK_STATE_COMPLETED"));
}

#[tokio::test]
async fn sdk_clients_talk_to_sdk_remotes_through_the_gateway() {
    let py = python_agent("1.0,0.3", 0).await;
    let js = js_agent("1.0,0.3").await;
    let gw = spawn_with(
        &[
            ("echo.toml", ECHO),
            ("py.toml", &upstream_agent("py", &py.url(), "")),
            (
                "js.toml",
                &upstream_agent("js", &js.url(), "protocol = \"0.3\""),
            ),
        ],
        "default_agent = \"echo\"",
    )
    .await;
    for agent in ["py", "js"] {
        for dialect in ["1.0", "0.3"] {
            crate::interop::run_client_at(&gw, agent, "python", dialect).await;
            crate::interop::run_client_at(&gw, agent, "javascript", dialect).await;
        }
    }
}

/// Opens a subscription to `id` on the proxied agent; the handle yields its events.
fn subscribe_in_background(
    gw: &TestGateway,
    d: D,
    id: &str,
) -> tokio::task::JoinHandle<Vec<crate::helpers::Sse>> {
    let body = json!({"jsonrpc":"2.0","id":"sub","method":d.subscribe(),"params":{"id": id}});
    let mut req = gw
        .client
        .post(gw.url(AGENT))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(v) = d.header() {
        req = req.header("A2A-Version", v);
    }
    tokio::spawn(async move {
        let resp = req.send().await.unwrap();
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        parse_sse(&resp.text().await.unwrap())
    })
}

/// Asks `/input`, subscribes, answers from another connection, and returns the
/// subscription's events (which must end with the task).
async fn answered_while_subscribed(gw: &TestGateway, d: D, label: &str) -> Vec<Value> {
    let asking = send(gw, d, "/input your name?", json!({})).await;
    assert_eq!(
        asking["status"]["state"],
        d.state("input-required"),
        "{label}"
    );
    let id = asking["id"].as_str().unwrap().to_string();
    let watcher = subscribe_in_background(gw, d, &id);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !watcher.is_finished(),
        "{label}: the subscription waits for the answer"
    );
    let mut answer = d.message("Grace");
    answer["taskId"] = json!(id);
    answer["contextId"] = asking["contextId"].clone();
    let done = gw
        .call(AGENT, d, d.send(), json!({"message": answer}))
        .await;
    assert_eq!(
        d.task_of(done.result())["status"]["state"],
        d.state("completed")
    );
    let events = tokio::time::timeout(Duration::from_secs(15), watcher)
        .await
        .unwrap_or_else(|_| panic!("{label}: the subscription ends with the task"))
        .unwrap();
    let items: Vec<Value> = events.iter().map(|e| e.data["result"].clone()).collect();
    let kinds: Vec<String> = items.iter().map(|i| kind(d, i)).collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("task"),
        "{label}: {kinds:?}"
    );
    assert_eq!(inner(d, &items[0])["id"], id.as_str(), "{label}");
    let last = inner(d, items.last().unwrap());
    assert_eq!(
        last["status"]["state"],
        d.state("completed"),
        "{label}: {kinds:?}"
    );
    let text: String = items
        .iter()
        .filter(|i| kind(d, i) == "artifact-update")
        .map(|i| text_of(&json!([inner(d, i)["artifact"]])))
        .collect();
    assert_eq!(text, "Grace", "{label}: {kinds:?}");
    items
}

/// Subscriptions through the gateway to the SDKs' servers stay open through
/// input-required and end with the task; a finished task's subscription is a plain
/// JSON-RPC error, although both SDKs answer it with an error inside a stream.
#[tokio::test]
async fn subscriptions_to_sdk_remotes_last_until_the_task_ends() {
    let python = python_agent("1.0", 0).await;
    let js = js_agent("0.3").await;
    for (peer, remote) in [(&python, "python 1.0"), (&js, "javascript 0.3")] {
        let gw = gateway_for(peer, "").await;
        for d in [D::V03, D::V10] {
            let label = format!("client {d:?} -> {remote}");
            let items = answered_while_subscribed(&gw, d, &label).await;
            let states: Vec<Value> = items
                .iter()
                .filter(|i| kind(d, i) == "status-update")
                .map(|i| inner(d, i)["status"]["state"].clone())
                .collect();
            assert_eq!(states.first(), Some(&json!(d.state("working"))), "{label}");

            let finished = send(&gw, d, "all done", json!({})).await;
            let r = gw
                .call(AGENT, d, d.subscribe(), json!({"id": finished["id"]}))
                .await;
            assert_eq!(r.header("content-type"), "application/json", "{label}");
            assert_eq!(r.code(), -32004, "{label}: {}", r.body);
        }
    }
}

/// An older 0.3 server: its resubscribe sends no task and ends at input-required, and it
/// has no ListTasks. A 1.0 caller still gets the task first and sees it to the end, and
/// ListTasks answers from the gateway's record, filters and pages included.
#[tokio::test]
async fn a_1_0_caller_is_bridged_to_an_older_0_3_remote() {
    let peer = fault_server("legacy03", 0).await;
    let gw = gateway_for(&peer, "").await;
    let d = D::V10;
    answered_while_subscribed(&gw, d, "legacy 0.3").await;

    let finished = send(&gw, d, "all done", json!({})).await;
    let r = gw
        .call(AGENT, d, d.subscribe(), json!({"id": finished["id"]}))
        .await;
    assert_eq!((r.status, r.code()), (200, -32004), "{}", r.body);

    let waiting = send(&gw, d, "/input still there?", json!({})).await;
    let list = |params: Value| gw.call(AGENT, d, "ListTasks", params);
    let all = list(json!({})).await;
    let page = all.result();
    assert_eq!(page["totalSize"], 3, "{page}");
    let tasks = page["tasks"].as_array().unwrap();
    assert_eq!(tasks[0]["id"], waiting["id"], "newest first: {page}");
    assert!(
        tasks[0]["history"]
            .as_array()
            .is_some_and(|h| !h.is_empty()),
        "{page}"
    );
    assert!(
        tasks[0].get("artifacts").is_none(),
        "artifacts only when asked: {page}"
    );

    let first = list(json!({"pageSize": 2, "historyLength": 0})).await;
    let first = first.result();
    assert_eq!(first["tasks"].as_array().unwrap().len(), 2, "{first}");
    let token = first["nextPageToken"].as_str().unwrap();
    assert!(!token.is_empty(), "{first}");
    let second = list(json!({"pageSize": 2, "pageToken": token})).await;
    let second = second.result();
    assert_eq!(second["tasks"].as_array().unwrap().len(), 1, "{second}");
    assert_eq!(second["nextPageToken"], "", "{second}");

    let by_state = list(json!({"status": "TASK_STATE_INPUT_REQUIRED"})).await;
    assert_eq!(by_state.result()["totalSize"], 1, "{}", by_state.body);
    let by_context =
        list(json!({"contextId": finished["contextId"], "includeArtifacts": true})).await;
    let by_context = by_context.result();
    assert_eq!(by_context["totalSize"], 1, "{by_context}");
    assert_eq!(text_of(&by_context["tasks"][0]["artifacts"]), "all done");
    let bad = list(json!({"pageToken": "nope"})).await;
    assert_eq!(bad.code(), -32602, "{}", bad.body);

    // It answers a cancel with the task as it is, canceled earlier or not: the first
    // cancel is one, a later one is refused as the gateway's own agents refuse it.
    let canceled = gw
        .call(AGENT, d, d.cancel(), json!({"id": waiting["id"]}))
        .await;
    assert_eq!(
        canceled.result()["status"]["state"],
        "TASK_STATE_CANCELED",
        "{}",
        canceled.body
    );
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    let again = gw
        .call(AGENT, d, d.cancel(), json!({"id": waiting["id"]}))
        .await;
    assert_eq!(again.code(), -32002, "{}", again.body);
}

/// ListTasks on a 0.3 remote lists only the caller's own tasks.
#[tokio::test]
async fn listing_a_0_3_remote_shows_each_caller_its_own_tasks() {
    let peer = fault_server("legacy03", 0).await;
    let keys = format!(
        "[[auth.api_keys]]\nid = \"ann\"\nsecret_sha256 = \"{}\"\n[[auth.api_keys]]\nid = \"ben\"\nsecret_sha256 = \"{}\"\n",
        crate::helpers::sha("ann-key"),
        crate::helpers::sha("ben-key")
    );
    let gw = spawn_with(
        &[("up.toml", &upstream_agent("up", &peer.url(), ""))],
        &keys,
    )
    .await;
    let call = |key: &'static str, method: &'static str, params: Value| {
        let body = json!({"jsonrpc":"2.0","id":1,"method":method,"params":params});
        gw.client
            .post(gw.url(AGENT))
            .header("A2A-Version", "1.0")
            .header("X-API-Key", key)
            .body(body.to_string())
            .send()
    };
    for (key, n) in [("ann-key", 2), ("ben-key", 1)] {
        for i in 0..n {
            let msg = D::V10.message(&format!("task {i}"));
            let r = call(key, "SendMessage", json!({"message": msg}))
                .await
                .unwrap();
            crate::helpers::answered(r).await;
        }
    }
    for (key, n) in [("ann-key", 2), ("ben-key", 1)] {
        let r = call(key, "ListTasks", json!({})).await.unwrap();
        let page: Value = r.json().await.unwrap();
        assert_eq!(page["result"]["totalSize"], n, "{key}: {page}");
    }
}

/// ListTasks on a 0.3 upstream answers from the gateway's record and reads each task
/// again; a task that cannot be read again (the upstream forgot it, or is away) is listed
/// as last seen, never dropped from a page whose totalSize counts it.
#[tokio::test]
async fn a_0_3_upstreams_tasks_are_listed_as_last_seen_when_they_cannot_be_read_again() {
    let peer = fault_server("legacy03", 0).await;
    let gw = gateway_for(&peer, "").await;
    // The agent file gives no description: the list has the card's.
    let card: Value = gw.get_json("/a2a/agents/up/card").await;
    let list: Value = gw.get_json("/a2a/agents").await;
    let up = list["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "up")
        .unwrap();
    assert!(!card["description"].as_str().unwrap().is_empty(), "{card}");
    assert_eq!(up["description"], card["description"], "{list}");
    let task = send(&gw, D::V10, "/input which one?", json!({})).await;
    let id = task["id"].as_str().unwrap().to_string();
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{task}"
    );
    let listed = gw.call(AGENT, D::V10, "ListTasks", json!({})).await;
    assert_eq!(
        listed.result()["tasks"][0]["id"],
        json!(id),
        "{}",
        listed.body
    );
    drop(peer);
    for params in [json!({}), json!({"historyLength": 0})] {
        let listed = gw.call(AGENT, D::V10, "ListTasks", params.clone()).await;
        let page = listed.result();
        assert_eq!(page["totalSize"], 1, "{params}: {page}");
        let tasks = page["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 1, "{params}: {page}");
        assert_eq!(tasks[0]["id"], json!(id));
        assert_eq!(tasks[0]["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    }
    // The official 0.3 server, restarted: it has forgotten the task, and says so.
    let port = free_port();
    let peer = python_agent("0.3", port).await;
    let gw = gateway_for(&peer, "").await;
    let task = send(&gw, D::V10, "hello", json!({})).await;
    let id = task["id"].as_str().unwrap().to_string();
    drop(peer);
    let _again = python_agent("0.3", port).await;
    let listed = gw.call(AGENT, D::V10, "ListTasks", json!({})).await;
    let page = listed.result();
    assert_eq!(page["totalSize"], 1, "{page}");
    assert_eq!(page["tasks"][0]["id"], json!(id), "{page}");
}

/// A streamed answer to an upstream's question never shows the question again: the first
/// state the caller reads is working, from the SDK 1.x in both dialects and from a2a-sdk
/// 0.3.x (which opens such a stream with a status update rather than the task).
#[tokio::test]
async fn a_streamed_answer_through_an_upstream_opens_with_the_task_working() {
    for dialects in ["1.0", "0.3", "a2a-sdk 0.3.x", "a2a-sdk 0.3.x over gRPC"] {
        let peer = match dialects {
            "a2a-sdk 0.3.x" => sdk03_agent().await,
            "a2a-sdk 0.3.x over gRPC" => sdk03_agent_with(&["--grpc"]).await,
            _ => python_agent(dialects, 0).await,
        };
        let gw = gateway_for(&peer, "").await;
        for d in [D::V03, D::V10] {
            let states = crate::streaming::states_of_a_streamed_answer(&gw, AGENT, d).await;
            let label = format!("python {dialects} upstream, {d:?} client: {states:?}");
            assert_eq!(states.first(), Some(&d.state("working")), "{label}");
            assert_eq!(states.last(), Some(&d.state("completed")), "{label}");
            assert!(!states.contains(&d.state("input-required")), "{label}");
        }
    }
}

/// Subscriptions to an upstream task waiting for input: a server that refuses them (the
/// official SDK's 0.3 server answers "task not found" when no producer runs for the task,
/// though tasks/get finds it) is made up for by the gateway, which follows the task itself.
/// Two subscribers, one per client dialect, see the task first, stay open while the task
/// waits, and end with it once another connection answers.
#[tokio::test]
async fn subscriptions_to_a_task_waiting_for_input_hold_whatever_the_upstream_allows() {
    for dialects in ["a2a-sdk 0.3.x", "a2a-sdk 0.3.x over gRPC", "1.0"] {
        let peer = match dialects {
            "1.0" => python_agent(dialects, 0).await,
            "a2a-sdk 0.3.x over gRPC" => sdk03_agent_with(&["--grpc"]).await,
            _ => sdk03_agent().await,
        };
        let gw = gateway_for(&peer, "").await;
        let task = send(&gw, D::V10, "/input your name?", json!({})).await;
        assert_eq!(
            task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{task}"
        );
        let id = task["id"].as_str().unwrap().to_string();
        let watchers: Vec<_> = [D::V10, D::V03]
            .into_iter()
            .map(|d| {
                let body =
                    json!({"jsonrpc": "2.0", "id": 1, "method": d.subscribe(), "params": {"id": id}});
                let mut req = gw
                    .client
                    .post(gw.url(AGENT))
                    .header("content-type", "application/json");
                if let Some(v) = d.header() {
                    req = req.header("A2A-Version", v);
                }
                let req = req.body(body.to_string());
                (
                    d,
                    tokio::spawn(async move {
                        let resp = req.send().await.unwrap();
                        (resp.status(), resp.text().await.unwrap())
                    }),
                )
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (d, w) in &watchers {
            assert!(
                !w.is_finished(),
                "{dialects} upstream, {d:?}: the subscription waits"
            );
        }
        let mut answer = D::V10.message("Ada");
        answer["taskId"] = json!(id);
        let done = gw
            .call(AGENT, D::V10, D::V10.send(), json!({"message": answer}))
            .await;
        assert_eq!(
            D::V10.task_of(done.result())["status"]["state"],
            "TASK_STATE_COMPLETED"
        );
        for (d, w) in watchers {
            let label = format!("{dialects} upstream, {d:?} subscriber");
            let (status, body) = tokio::time::timeout(Duration::from_secs(15), w)
                .await
                .unwrap_or_else(|_| panic!("{label}: the subscription ends with the task"))
                .unwrap();
            assert_eq!(status, 200, "{label}: {body}");
            let items: Vec<Value> = parse_sse(&body)
                .iter()
                .map(|e| e.data["result"].clone())
                .collect();
            assert!(!items.is_empty(), "{label}: {body}");
            assert_eq!(kind(d, &items[0]), "task", "{label}: {body}");
            assert_eq!(inner(d, &items[0])["id"], json!(id), "{label}");
            let last = inner(d, items.last().unwrap());
            assert_eq!(
                last["status"]["state"],
                json!(d.state("completed")),
                "{label}: {body}"
            );
        }
        // A finished task is refused as every subscription to one is.
        let r = gw
            .call(AGENT, D::V10, "SubscribeToTask", json!({"id": id}))
            .await;
        assert_eq!(r.code(), -32004, "{}", r.body);
    }
}

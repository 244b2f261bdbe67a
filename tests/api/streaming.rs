//! SSE: send-and-stream and subscribe, in both dialects.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{inner, kind, rpc, spawn, D};

#[tokio::test]
async fn streaming_send_orders_task_then_events_and_closes_at_the_end() {
    let gw = spawn().await;
    for d in [D::V03, D::V10] {
        let text = "one two three four five six";
        let events = gw
            .sse(
                "/a2a/agents/echo",
                d,
                d.stream(),
                json!({"message": d.message(text)}),
            )
            .await;
        let kinds: Vec<String> = events.iter().map(|e| kind(d, &e.data["result"])).collect();
        assert_eq!(
            kinds,
            [
                "task",
                "status-update",
                "artifact-update",
                "artifact-update",
                "artifact-update",
                "status-update"
            ],
            "{d:?}"
        );
        for e in &events {
            assert_eq!(
                e.data["id"], "s-1",
                "every event is a JSON-RPC response to the call"
            );
            assert!(e.event.is_none());
        }
        let chunks: Vec<Value> = events[2..5]
            .iter()
            .map(|e| inner(d, &e.data["result"]))
            .collect();
        let joined: String = chunks
            .iter()
            .map(|c| c["artifact"]["parts"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(joined, text);
        assert!(
            chunks[0].get("append").is_none()
                && chunks[1]["append"] == true
                && chunks[2]["lastChunk"] == true
        );
        let last = inner(d, &events[5].data["result"]);
        assert_eq!(last["status"]["state"], d.state("completed"));
        if d == D::V03 {
            let working = inner(d, &events[1].data["result"]);
            assert_eq!(
                (working["final"].as_bool(), last["final"].as_bool()),
                (Some(false), Some(true))
            );
        } else {
            assert!(last.get("final").is_none(), "1.0 has no final");
        }
    }
}

#[tokio::test]
async fn streaming_a_message_reply_sends_one_message() {
    let gw = spawn().await;
    let events = gw
        .sse(
            "/a2a/agents/echo",
            D::V10,
            "SendStreamingMessage",
            json!({"message": D::V10.message("/message hi")}),
        )
        .await;
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].data["result"]["message"]["parts"][0]["text"],
        "hi"
    );
}

#[tokio::test]
async fn streams_close_at_input_required_and_auth_required() {
    let gw = spawn().await;
    for (ask, state) in [
        ("/input more?", "input-required"),
        ("/auth who?", "auth-required"),
    ] {
        let events = gw
            .sse(
                "/a2a/agents/echo",
                D::V03,
                "message/stream",
                json!({"message": D::V03.message(ask)}),
            )
            .await;
        let last = &events.last().unwrap().data["result"];
        assert_eq!(last["status"]["state"], state);
        assert_eq!(
            last["final"], true,
            "0.3 clients need final on the closing event"
        );
    }
}

#[tokio::test]
async fn streaming_errors_before_the_stream_are_plain_json() {
    let gw = spawn().await;
    let mut msg = D::V10.message("x");
    msg["taskId"] = json!("missing");
    let r = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendStreamingMessage",
            json!({"message": msg}),
        )
        .await;
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.code(), -32001);
}

#[tokio::test]
async fn two_subscribers_see_the_same_events_and_a_terminal_task_refuses() {
    let gw = spawn().await;
    for d in [D::V03, D::V10] {
        let task = gw
            .send_nonblocking(d, "/delay 0.5 watched words here")
            .await;
        let id = task["id"].clone();
        let sub = || gw.sse("/a2a/agents/echo", d, d.subscribe(), json!({"id": id}));
        let (a, b) = tokio::join!(sub(), sub());
        assert_eq!(a, b, "{d:?}: both subscribers see identical streams");
        let kinds: Vec<String> = a.iter().map(|e| kind(d, &e.data["result"])).collect();
        assert_eq!(
            kinds.first().map(String::as_str),
            Some("task"),
            "the current task comes first"
        );
        assert_eq!(kinds.last().map(String::as_str), Some("status-update"));
        let last = inner(d, &a.last().unwrap().data["result"]);
        assert_eq!(last["status"]["state"], d.state("completed"));

        let again = gw
            .call("/a2a/agents/echo", d, d.subscribe(), json!({"id": id}))
            .await;
        assert_eq!(
            again.code(),
            -32004,
            "subscribing to a finished task: {}",
            again.body
        );
    }
}

#[tokio::test]
async fn subscribing_sees_cancel_and_a_dropped_subscriber_does_not_cancel() {
    let gw = spawn().await;
    let task = gw.send_nonblocking(D::V10, "/delay 30 long").await;
    let id = task["id"].as_str().unwrap().to_string();

    // A subscriber that goes away early...
    let early = gw
        .client
        .post(gw.url("/a2a/agents/echo"))
        .header("A2A-Version", "1.0")
        .body(
            json!({"jsonrpc":"2.0","id":1,"method":"SubscribeToTask","params":{"id": id}})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    drop(early);

    // ...and one that stays to the end.
    let watcher = {
        let gw_client = gw.client.clone();
        let url = gw.url("/a2a/agents/echo");
        let id = id.clone();
        tokio::spawn(async move {
            let resp = gw_client
                .post(url)
                .header("A2A-Version", "1.0")
                .body(
                    json!({"jsonrpc":"2.0","id":1,"method":"SubscribeToTask","params":{"id": id}})
                        .to_string(),
                )
                .send()
                .await
                .unwrap();
            crate::helpers::parse_sse(&resp.text().await.unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let still = gw.get_task(D::V10, &id).await;
    assert_eq!(
        still.result()["status"]["state"],
        "TASK_STATE_WORKING",
        "closing a stream does not cancel"
    );
    gw.call("/a2a/agents/echo", D::V10, "CancelTask", json!({"id": id}))
        .await;
    let events = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("stream ends")
        .unwrap();
    let last = &events.last().unwrap().data["result"]["statusUpdate"];
    assert_eq!(last["status"]["state"], "TASK_STATE_CANCELED");
}

#[tokio::test]
async fn sse_framing_and_headers() {
    let gw = spawn().await;
    let resp = gw
        .client
        .post(gw.url("/a2a/agents/echo"))
        .header("A2A-Version", "1.0")
        .body(rpc(
            "SendStreamingMessage",
            json!({"message": D::V10.message("hi")}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert_eq!(resp.headers()["x-accel-buffering"], "no");
    let text = resp.text().await.unwrap();
    // Each event names its task and place (for Last-Event-ID), then its data.
    assert!(text.starts_with("id: "), "{text}");
    let first = text.split("\n\n").next().unwrap();
    let (id, data) = first.split_once('\n').unwrap();
    assert!(data.starts_with("data: {"), "{text}");
    let task: Value = serde_json::from_str(data.trim_start_matches("data: ")).unwrap();
    let task_id = task["result"]["task"]["id"].as_str().unwrap();
    assert_eq!(id, format!("id: {task_id}:0"));
    assert!(text.ends_with("\n\n"));
}

#[tokio::test]
async fn stream_capacity_refuses_cleanly_and_disconnects_free_their_place() {
    let gw = crate::helpers::spawn_with(
        &[("echo.toml", crate::helpers::ECHO)],
        // A disconnect is noticed at the next write: the keep-alive bounds how late.
        "[limits]\nmax_open_streams = 1\nstream_keepalive_secs = 1",
    )
    .await;
    let open_streams = || async {
        let h: Value = gw.get_json("/a2a/health").await;
        h["openStreams"].as_u64().unwrap()
    };
    let body = |text: &str| {
        json!({"jsonrpc":"2.0","id":1,"method":"SendStreamingMessage","params":{"message": D::V10.message(text)}})
            .to_string()
    };
    let held = gw
        .client
        .post(gw.url("/a2a/agents/echo"))
        .header("A2A-Version", "1.0")
        .body(body("/delay 30 hold"))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    assert_eq!(held.headers()["content-type"], "text/event-stream");
    assert_eq!(open_streams().await, 1);

    let refused = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendStreamingMessage",
            json!({"message": D::V10.message("more")}),
        )
        .await;
    assert_eq!(
        (refused.status, refused.code()),
        (503, -32054),
        "{}",
        refused.body
    );
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(
        refused.message(),
        "The gateway is holding its maximum of 1 open streams; retry later"
    );
    let plain = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("fine")}),
        )
        .await;
    assert_eq!(plain.status, 200, "non-streaming calls are unaffected");

    // The client goes away: the gateway notices and frees the place.
    drop(held);
    let mut freed = false;
    for _ in 0..100 {
        if open_streams().await == 0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "a disconnected client's stream is released");
    let again = gw
        .sse(
            "/a2a/agents/echo",
            D::V10,
            "SendStreamingMessage",
            json!({"message": D::V10.message("ok")}),
        )
        .await;
    assert!(!again.is_empty());
}

/// A subscription to a task waiting for input (or for authorization) stays open while
/// another connection answers it, and sees the task move on and end (spec 1.0 §3.1.6): in both dialects, on JSON-RPC
/// and on the REST binding's `:subscribe`.
#[tokio::test]
async fn a_subscription_stays_open_through_input_required_until_the_task_ends() {
    let gw = spawn().await;
    let cases = [
        (D::V03, false, "/input your name?", "input-required"),
        (D::V10, false, "/input your name?", "input-required"),
        (D::V10, true, "/input your name?", "input-required"),
        (D::V03, false, "/auth sign in", "auth-required"),
        (D::V10, true, "/auth sign in", "auth-required"),
    ];
    for (d, rest, ask, state) in cases {
        let label = format!("{d:?}{} {state}", if rest { " REST" } else { "" });
        let task = gw.send(d, ask).await;
        assert_eq!(task["status"]["state"], d.state(state), "{label}");
        let id = task["id"].as_str().unwrap().to_string();
        let watcher = {
            let (client, id) = (gw.client.clone(), id.clone());
            let (url, body) = if rest {
                (
                    gw.url(&format!("/a2a/agents/echo/rest/tasks/{id}:subscribe")),
                    String::new(),
                )
            } else {
                let body =
                    json!({"jsonrpc":"2.0","id":3,"method":d.subscribe(),"params":{"id": id}});
                (gw.url("/a2a/agents/echo"), body.to_string())
            };
            let mut req = client.post(url).header("content-type", "application/json");
            if let Some(v) = d.header() {
                req = req.header("A2A-Version", v);
            }
            tokio::spawn(async move {
                let resp = req.body(body).send().await.unwrap();
                crate::helpers::parse_sse(&resp.text().await.unwrap())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !watcher.is_finished(),
            "{label}: the subscription waits for the answer"
        );
        let mut answer = d.message("Ada");
        answer["taskId"] = json!(id);
        let r = gw
            .call("/a2a/agents/echo", d, d.send(), json!({"message": answer}))
            .await;
        assert_eq!(
            d.task_of(r.result())["status"]["state"],
            d.state("completed")
        );
        let events = tokio::time::timeout(Duration::from_secs(10), watcher)
            .await
            .unwrap_or_else(|_| panic!("{label}: the subscription ends with the task"))
            .unwrap();
        let items: Vec<Value> = events
            .iter()
            .map(|e| {
                if rest {
                    e.data.clone()
                } else {
                    e.data["result"].clone()
                }
            })
            .collect();
        let kinds: Vec<String> = items.iter().map(|i| kind(d, i)).collect();
        assert_eq!(
            kinds.first().map(String::as_str),
            Some("task"),
            "{label}: {kinds:?}"
        );
        let first = inner(d, &items[0]);
        assert_eq!(first["status"]["state"], d.state(state), "{label}");
        let states: Vec<Value> = items[1..]
            .iter()
            .filter(|i| kind(d, i) == "status-update")
            .map(|i| inner(d, i)["status"]["state"].clone())
            .collect();
        assert_eq!(
            states,
            vec![json!(d.state("working")), json!(d.state("completed"))],
            "{label}: {kinds:?}"
        );
        assert!(
            kinds.iter().any(|k| k == "artifact-update"),
            "{label}: {kinds:?}"
        );
        assert_eq!(
            kinds.last().map(String::as_str),
            Some("status-update"),
            "{label}"
        );
    }
}

/// A streaming send whose task is canceled from another connection ends with the
/// canceled status, in both dialects, rather than just closing.
#[tokio::test]
async fn a_stream_ends_with_the_cancel_that_came_from_elsewhere() {
    let gw = spawn().await;
    for d in [D::V03, D::V10] {
        let body = json!({"jsonrpc":"2.0","id":1,"method":d.stream(),"params":{"message": d.message("/delay 30 never")}});
        let mut req = gw
            .client
            .post(gw.url("/a2a/agents/echo"))
            .body(body.to_string());
        if let Some(v) = d.header() {
            req = req.header("A2A-Version", v);
        }
        let resp = req.send().await.unwrap();
        let mut body = resp.bytes_stream();
        let first = futures_util::StreamExt::next(&mut body)
            .await
            .unwrap()
            .unwrap();
        let first = crate::helpers::parse_sse(&String::from_utf8_lossy(&first));
        let id = inner(d, &first[0].data["result"])["id"].clone();
        let r = gw
            .call("/a2a/agents/echo", d, d.cancel(), json!({"id": id}))
            .await;
        assert_eq!(r.result()["status"]["state"], d.state("canceled"));
        let mut rest = Vec::new();
        let read = async {
            while let Some(chunk) = futures_util::StreamExt::next(&mut body).await {
                rest.extend_from_slice(&chunk.unwrap());
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("the stream ends");
        let events = crate::helpers::parse_sse(&String::from_utf8_lossy(&rest));
        let last = inner(d, &events.last().expect("a final event").data["result"]);
        assert_eq!(last["status"]["state"], d.state("canceled"), "{d:?}");
    }
}

/// The states a streamed answer to an `input-required` task goes through, on `path` in
/// dialect `d`: the question is asked with a blocking send, answered with a streaming one.
pub(crate) async fn states_of_a_streamed_answer(
    gw: &crate::helpers::TestGateway,
    path: &str,
    d: D,
) -> Vec<String> {
    let r = gw
        .call(
            path,
            d,
            d.send(),
            json!({"message": d.message("/input your name?")}),
        )
        .await;
    let task = d.task_of(r.result());
    assert_eq!(task["status"]["state"], d.state("input-required"), "{task}");
    let mut answer = d.message("Ada");
    answer["taskId"] = task["id"].clone();
    answer["contextId"] = task["contextId"].clone();
    let events = gw
        .sse(path, d, d.stream(), json!({"message": answer}))
        .await;
    events
        .iter()
        .map(|e| inner(d, &e.data["result"]))
        .filter_map(|i| i["status"]["state"].as_str().map(str::to_string))
        .collect()
}

/// A streamed answer to a question opens with the task working again, not still asking:
/// a client that reads the first event as the task's state must not ask twice.
#[tokio::test]
async fn a_streamed_answer_opens_with_the_task_working() {
    let gw = spawn().await;
    for d in [D::V03, D::V10] {
        let states = states_of_a_streamed_answer(&gw, "/a2a/agents/echo", d).await;
        assert_eq!(
            states.first(),
            Some(&d.state("working")),
            "{d:?}: {states:?}"
        );
        assert_eq!(
            states.last(),
            Some(&d.state("completed")),
            "{d:?}: {states:?}"
        );
        assert!(
            !states.contains(&d.state("input-required")),
            "{d:?}: {states:?}"
        );
    }
}

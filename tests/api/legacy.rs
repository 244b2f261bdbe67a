//! A2A 0.1 clients, unchanged: the request bodies of the 0.1 tutorial flow and the 0.1
//! Python client (send, get, sendSubscribe, cancel, multi-turn), answered in the 0.1
//! shapes those clients parse, under the task ids they chose.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{parse_sse, sha, spawn, spawn_with, TestGateway, ECHO};

const AGENT: &str = "/a2a/agents/echo";
const TASK: &str = "de38c76d-d54c-436c-8b9f-4c2703648d64";

async fn post(gw: &TestGateway, body: Value) -> Value {
    let r = gw
        .post_raw(
            AGENT,
            &[("content-type", "application/json")],
            body.to_string(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["jsonrpc"], "2.0");
    r.body
}

/// What every 0.1 answer must look like: no 1.0/0.3 discriminators, `type` on every part.
fn assert_0_1_task(task: &Value, id: &str) {
    assert_eq!(task["id"], id, "{task}");
    assert!(task["sessionId"].is_string(), "{task}");
    assert!(
        task.get("kind").is_none() && task.get("contextId").is_none(),
        "{task}"
    );
    let parts = task["artifacts"]
        .as_array()
        .expect("artifacts always present")
        .iter()
        .chain(task["history"].as_array().into_iter().flatten())
        .chain(std::iter::once(&task["status"]["message"]).filter(|m| !m.is_null()))
        .flat_map(|holder| holder["parts"].as_array().unwrap().clone());
    for part in parts {
        assert!(
            ["text", "file", "data"].contains(&part["type"].as_str().unwrap()),
            "{task}"
        );
        assert!(part.get("kind").is_none(), "{task}");
    }
}

#[tokio::test]
async fn the_0_1_tutorial_flow() {
    let gw = spawn().await;
    // tasks/send, exactly as the 0.1 specification's sample writes it.
    let sent = post(
        &gw,
        json!({
          "jsonrpc": "2.0", "id": 1, "method": "tasks/send",
          "params": {
            "id": TASK,
            "message": {"role": "user", "parts": [{"type": "text", "text": "tell me a joke"}]},
            "metadata": {}
          }
        }),
    )
    .await;
    assert_eq!(sent["id"], 1);
    let task = &sent["result"];
    assert_0_1_task(task, TASK);
    assert_eq!(task["status"]["state"], "completed");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "tell me a joke");
    assert_eq!(task["artifacts"][0]["index"], 0);

    // tasks/get with historyLength, and without it (0.1: no history unless asked).
    let got = post(
        &gw,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get",
               "params": {"id": TASK, "historyLength": 10, "metadata": {}}}),
    )
    .await;
    assert_0_1_task(&got["result"], TASK);
    let history = got["result"]["history"].as_array().unwrap();
    assert_eq!(history[0]["role"], "user");
    assert_eq!(
        history[0]["parts"][0],
        json!({"type": "text", "text": "tell me a joke"})
    );
    let bare = post(
        &gw,
        json!({"jsonrpc": "2.0", "id": 10, "method": "tasks/get",
               "params": {"id": TASK, "metadata": {}}}),
    )
    .await;
    assert!(bare["result"].get("history").is_none(), "{bare}");
    assert_eq!(bare["result"]["artifacts"], task["artifacts"]);

    // Multi-turn: the same id continues the task, with its sessionId.
    let turn = "0d3c2f4e-8a51-4f0b-9f6e-2b7d61a1c0aa";
    let asked = post(
        &gw,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/send",
               "params": {"id": turn, "message": {"role": "user", "parts": [
                   {"type": "text", "text": "/input Select a phone type (iPhone/Android)"}]},
                   "metadata": {}}}),
    )
    .await;
    let asked = &asked["result"];
    assert_0_1_task(asked, turn);
    assert_eq!(asked["status"]["state"], "input-required");
    assert_eq!(asked["status"]["message"]["role"], "agent");
    assert_eq!(
        asked["status"]["message"]["parts"][0]["text"],
        "Select a phone type (iPhone/Android)"
    );
    let answered = post(
        &gw,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/send",
               "params": {"id": turn, "sessionId": asked["sessionId"],
                          "message": {"role": "user", "parts": [{"type": "text", "text": "Android"}]},
                          "metadata": {}}}),
    )
    .await;
    let answered = &answered["result"];
    assert_0_1_task(answered, turn);
    assert_eq!(answered["status"]["state"], "completed");
    assert_eq!(answered["sessionId"], asked["sessionId"]);
    assert_eq!(answered["artifacts"][0]["parts"][0]["text"], "Android");

    // The 0.1 Python client's own body: hex ids, explicit nulls, acceptedOutputModes.
    let cli = post(
        &gw,
        json!({"jsonrpc":"2.0","id":"5b3b74b7ea80495daff4047ee48a6c48","method":"tasks/send",
               "params":{"id":"740f1e21465b4ee2af4af7b8c6cacad5","sessionId":"7fbd065264cb4d6c91ed96909589fc35",
                "message":{"role":"user","parts":[{"type":"text","text":"hello","metadata":null}],"metadata":null},
                "acceptedOutputModes":["text"],"pushNotification":null,"historyLength":null,"metadata":null}}),
    )
    .await;
    assert_eq!(cli["id"], "5b3b74b7ea80495daff4047ee48a6c48");
    assert_0_1_task(&cli["result"], "740f1e21465b4ee2af4af7b8c6cacad5");
    assert_eq!(
        cli["result"]["sessionId"],
        "7fbd065264cb4d6c91ed96909589fc35"
    );
}

/// A 0.1 client that sent a long task and waits for it can read and cancel it by the id it
/// chose meanwhile (from another connection), and its send answers with the cancel.
#[tokio::test]
async fn a_blocking_send_is_known_by_its_name_while_it_waits() {
    let gw = spawn().await;
    let name = "slow-7f3a";
    let waiting = {
        let (client, url) = (gw.client.clone(), gw.url(AGENT));
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/send",
            "params": {"id": name, "message": {"role": "user", "parts": [
                {"type": "text", "text": "/delay 60 zzz"}]}}});
        tokio::spawn(async move {
            let r = client.post(url).json(&body).send().await.expect("send");
            r.json::<Value>().await.expect("JSON")
        })
    };
    let get = json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": name}});
    let mut seen = Value::Null;
    for _ in 0..200 {
        seen = post(&gw, get.clone()).await;
        if seen["result"]["status"]["state"] == "working" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_0_1_task(&seen["result"], name);
    assert_eq!(seen["result"]["status"]["state"], "working", "{seen}");

    let canceled = post(
        &gw,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/cancel", "params": {"id": name}}),
    )
    .await;
    assert_0_1_task(&canceled["result"], name);
    assert_eq!(
        canceled["result"]["status"]["state"], "canceled",
        "{canceled}"
    );
    let answered = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the send answers once its task is canceled")
        .expect("the sender");
    assert_0_1_task(&answered["result"], name);
    assert_eq!(
        answered["result"]["status"]["state"], "canceled",
        "{answered}"
    );
}

#[tokio::test]
async fn send_subscribe_and_cancel_in_0_1() {
    let gw = spawn().await;
    // tasks/sendSubscribe as the specification writes it (with the envelope real clients
    // send, and the file content under `bytes`, its actual name).
    let body = json!({
      "jsonrpc": "2.0", "id": 1, "method": "tasks/sendSubscribe",
      "params": {
        "id": TASK,
        "sessionId": "c295ea44-7543-4f78-b524-7a38915ad6e4",
        "message": {"role": "user", "parts": [
          {"type": "text", "text": "write a long paper describing the attached pictures"},
          {"type": "file", "file": {"mimeType": "image/png", "bytes": "aGVsbG8="}}
        ]},
        "metadata": {}
      }
    });
    let resp = gw
        .client
        .post(gw.url(AGENT))
        .header("accept", "text/event-stream")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    // The 0.1 JavaScript client reads single-line `data: ` blocks only.
    for block in text
        .split("\n\n")
        .filter(|b| !b.trim().is_empty() && !b.starts_with(':'))
    {
        assert!(
            block.starts_with("data: ") && !block.contains('\n'),
            "{block:?}"
        );
    }
    let events: Vec<Value> = parse_sse(&text)
        .into_iter()
        .map(|e| e.data["result"].clone())
        .collect();
    for e in &events {
        assert_eq!(e["id"], TASK, "{e}");
        assert!(e.get("kind").is_none() && e.get("taskId").is_none(), "{e}");
        assert!(
            e.get("status").is_some() != e.get("artifact").is_some(),
            "{e}"
        );
        if e.get("status").is_some() {
            assert!(
                e["final"].is_boolean(),
                "status events say whether they are final: {e}"
            );
        }
    }
    let last = events.last().unwrap();
    assert_eq!(
        (last["status"]["state"].clone(), last["final"].clone()),
        (json!("completed"), json!(true))
    );
    let text: String = events
        .iter()
        .filter_map(|e| e["artifact"]["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "write a long paper describing the attached pictures");
    assert!(events.iter().any(|e| e["artifact"]["lastChunk"] == true));

    // tasks/cancel of a running task named by the client.
    let slow = "5f1f0a7e-1b8b-4a55-8c07-1f4e0f1d2c3b";
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/sendSubscribe",
        "params": {"id": slow, "message": {"role": "user", "parts": [{"type": "text", "text": "/delay 30 slow"}]}}});
    let stream = gw.client.post(gw.url(AGENT)).body(body.to_string()).send();
    let watcher = tokio::spawn(async move { stream.await.unwrap().text().await.unwrap() });
    let mut canceled = Value::Null;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let r = post(
            &gw,
            json!({"jsonrpc": "2.0", "id": 4, "method": "tasks/cancel",
                                 "params": {"id": slow, "metadata": {}}}),
        )
        .await;
        if r.get("result").is_some() {
            canceled = r["result"].clone();
            break;
        }
        assert_eq!(
            r["error"]["code"], -32001,
            "only unknown until the stream names it: {r}"
        );
    }
    assert_0_1_task(&canceled, slow);
    assert_eq!(canceled["status"]["state"], "canceled");
    let text = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .unwrap()
        .unwrap();
    let last = parse_sse(&text).pop().unwrap().data;
    assert_eq!(last["result"]["status"]["state"], "canceled", "{last}");
    assert_eq!(last["result"]["final"], true);
}

#[tokio::test]
async fn bad_0_1_requests_get_precise_errors() {
    let gw = spawn().await;
    let msg = json!({"role": "user", "parts": [{"type": "text", "text": "x"}]});
    for (method, params, code) in [
        ("tasks/send", json!({"message": msg}), -32602),
        ("tasks/send", json!({"id": "", "message": msg}), -32602),
        ("tasks/send", json!({"id": "t1"}), -32602),
        (
            "tasks/send",
            json!({"id": "t1", "message": {"role": "user", "parts": [{"type": "text"}]}}),
            -32602,
        ),
        ("tasks/get", json!({"id": "never-sent"}), -32001),
        ("tasks/cancel", json!({"id": "never-sent"}), -32001),
        (
            "tasks/pushNotification/set",
            json!({"id": "t1", "pushNotificationConfig": {"url": "https://x"}}),
            -32003,
        ),
        (
            "tasks/send",
            json!({"id": "t2", "message": msg, "pushNotification": {"url": "https://x"}}),
            -32003,
        ),
    ] {
        let body = json!({"jsonrpc": "2.0", "id": "e", "method": method, "params": params});
        let r = post(&gw, body).await;
        assert_eq!(r["error"]["code"], code, "{method} {params}: {r}");
        assert_eq!(r["id"], "e");
    }
    // A finished task's id cannot be sent to again.
    post(&gw, json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/send", "params": {"id": "done", "message": msg}})).await;
    let again = post(&gw, json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/send", "params": {"id": "done", "message": msg}})).await;
    assert_eq!(again["error"]["code"], -32004, "{again}");
}

/// Task ids chosen by clients are per caller: two callers using one id never meet.
#[tokio::test]
async fn chosen_task_ids_are_per_caller() {
    let keys = format!(
        "[[auth.api_keys]]\nid = \"ann\"\nsecret_sha256 = \"{}\"\n[[auth.api_keys]]\nid = \"ben\"\nsecret_sha256 = \"{}\"\n",
        sha("ann-key"),
        sha("ben-key")
    );
    let gw = spawn_with(&[("echo.toml", ECHO)], &keys).await;
    let call = |key: &'static str, method: &'static str, params: Value| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let req = gw
            .client
            .post(gw.url(AGENT))
            .header("X-API-Key", key)
            .body(body.to_string());
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    for (key, text) in [("ann-key", "from ann"), ("ben-key", "from ben")] {
        let msg = json!({"role": "user", "parts": [{"type": "text", "text": text}]});
        let r = call(key, "tasks/send", json!({"id": "same-id", "message": msg})).await;
        assert_eq!(r["result"]["status"]["state"], "completed", "{r}");
    }
    for (key, text) in [("ann-key", "from ann"), ("ben-key", "from ben")] {
        let r = call(key, "tasks/get", json!({"id": "same-id"})).await;
        assert_eq!(
            r["result"]["artifacts"][0]["parts"][0]["text"], text,
            "{key}: {r}"
        );
    }
}

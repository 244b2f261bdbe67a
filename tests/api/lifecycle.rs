//! The task lifecycle in both dialects: send, get, list, cancel, input-required, eviction,
//! Message replies and the TCK test-agent conventions.

use serde_json::{json, Value};

use crate::helpers::{spawn, spawn_with, text_of, wait_for_state, D, ECHO};

#[tokio::test]
async fn blocking_send_returns_the_completed_task_in_the_callers_dialect() {
    let gw = spawn().await;
    for d in [D::V03, D::V10] {
        let task = gw.send(d, "hello gateway").await;
        assert_eq!(task["status"]["state"], d.state("completed"), "{task}");
        assert_eq!(text_of(&task["artifacts"]), "hello gateway");
        let user = &task["history"][0];
        assert_eq!(user["taskId"], task["id"]);
        assert_eq!(user["contextId"], task["contextId"]);
        match d {
            D::V03 => {
                assert_eq!(user["role"], "user");
                assert_eq!(task["artifacts"][0]["parts"][0]["kind"], "text");
            }
            D::V10 => {
                assert_eq!(user["role"], "ROLE_USER");
                assert!(task["artifacts"][0]["parts"][0].get("kind").is_none());
            }
        }
        let ts = task["status"]["timestamp"].as_str().unwrap();
        assert!(
            ts.ends_with('Z') && ts.len() == 24,
            "UTC millis timestamp: {ts}"
        );
    }
}

#[tokio::test]
async fn default_endpoint_serves_the_default_agent() {
    let gw = spawn().await;
    let r = gw
        .call(
            "/a2a",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("via /a2a")}),
        )
        .await;
    assert_eq!(text_of(&r.result()["task"]["artifacts"]), "via /a2a");
    let id = r.result()["task"]["id"].as_str().unwrap().to_string();
    let got = gw
        .call("/a2a/agents/echo", D::V10, "GetTask", json!({"id": id}))
        .await;
    assert_eq!(
        got.result()["id"],
        id.as_str(),
        "the same task through the agent's own URL"
    );
}

#[tokio::test]
async fn tasks_belong_to_their_agent() {
    let gw = spawn().await;
    let task = gw.send(D::V10, "mine").await;
    let r = gw
        .call(
            "/a2a/agents/other",
            D::V10,
            "GetTask",
            json!({"id": task["id"]}),
        )
        .await;
    assert_eq!(r.code(), -32001, "another agent's task is not found");
}

#[tokio::test]
async fn non_blocking_send_returns_at_once_and_get_sees_completion() {
    let gw = spawn().await;
    for d in [D::V03, D::V10] {
        let task = gw.send_nonblocking(d, "/delay 0.3 later").await;
        let state = task["status"]["state"].as_str().unwrap().to_string();
        assert!(
            [d.state("submitted"), d.state("working")].contains(&state),
            "{task}"
        );
        let id = task["id"].as_str().unwrap();
        let done = wait_for_state(&gw, d, id, "completed").await;
        assert_eq!(text_of(&done["artifacts"]), "later");
    }
}

#[tokio::test]
async fn history_length_trims_per_dialect() {
    let gw = spawn().await;
    let task = gw.send(D::V10, "/input Name?").await;
    let id = task["id"].as_str().unwrap();
    let follow = json!({"role":"ROLE_USER","messageId":"f1","taskId":id,"parts":[{"text":"Ada"}]});
    gw.call(
        "/a2a/agents/echo",
        D::V10,
        "SendMessage",
        json!({"message": follow}),
    )
    .await;
    // history: user "/input Name?", agent "Name?", user "Ada"
    let get = |d: D, n: Option<i64>| {
        let mut params = json!({"id": id});
        if let Some(n) = n {
            params["historyLength"] = json!(n);
        }
        gw.call("/a2a/agents/echo", d, d.get(), params)
    };
    let full = get(D::V10, None).await;
    assert_eq!(full.result()["history"].as_array().unwrap().len(), 3);
    let one = get(D::V10, Some(1)).await;
    assert_eq!(one.result()["history"][0]["messageId"], "f1", "the newest");
    let none = get(D::V10, Some(0)).await;
    assert!(
        none.result().get("history").is_none(),
        "1.0: 0 means no history"
    );
    let legacy = get(D::V03, Some(0)).await;
    assert_eq!(
        legacy.result()["history"].as_array().unwrap().len(),
        3,
        "0.3: 0 means all"
    );
}

/// A question (input-required) and a request to authorize (auth-required) are answered
/// the same way: the next message on the task continues it.
#[tokio::test]
async fn input_and_auth_required_round_trip_in_both_dialects() {
    let gw = spawn().await;
    let asks = [
        (
            "/input What is your name?",
            "input-required",
            "What is your name?",
        ),
        (
            "/auth Sign in at the portal",
            "auth-required",
            "Sign in at the portal",
        ),
    ];
    for (d, (ask, state, said)) in [D::V03, D::V10]
        .into_iter()
        .flat_map(|d| asks.map(|a| (d, a)))
    {
        let task = gw.send(d, ask).await;
        assert_eq!(task["status"]["state"], d.state(state));
        assert_eq!(task["status"]["message"]["parts"][0]["text"], said);
        let stored = gw.get_task(d, task["id"].as_str().unwrap()).await;
        assert_eq!(stored.result()["status"]["state"], d.state(state));
        let mut follow = d.message("Ada");
        follow["taskId"] = task["id"].clone();
        follow["contextId"] = task["contextId"].clone();
        let r = gw
            .call("/a2a/agents/echo", d, d.send(), json!({"message": follow}))
            .await;
        let done = d.task_of(r.result());
        assert_eq!(done["id"], task["id"]);
        assert_eq!(done["status"]["state"], d.state("completed"));
        assert_eq!(text_of(&done["artifacts"]), "Ada");

        // A finished task takes no more messages, and a mismatched context is refused.
        let mut late = d.message("again");
        late["taskId"] = task["id"].clone();
        let r = gw
            .call("/a2a/agents/echo", d, d.send(), json!({"message": late}))
            .await;
        assert_eq!(r.code(), -32004, "{}", r.body);
        assert!(
            r.message().contains("is already completed"),
            "{}",
            r.message()
        );
    }
    let task = gw.send(D::V10, "/input again?").await;
    let mut wrong = D::V10.message("x");
    wrong["taskId"] = task["id"].clone();
    wrong["contextId"] = json!("some-other-context");
    let r = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": wrong}),
        )
        .await;
    assert_eq!(r.code(), -32602, "{}", r.body);
}

#[tokio::test]
async fn cancel_stops_a_working_task_and_is_refused_once_finished() {
    let gw = spawn().await;
    for d in [D::V03, D::V10] {
        let task = gw.send_nonblocking(d, "/delay 30 never").await;
        let id = task["id"].as_str().unwrap();
        let r = gw
            .call("/a2a/agents/echo", d, d.cancel(), json!({"id": id}))
            .await;
        assert_eq!(
            r.result()["status"]["state"],
            d.state("canceled"),
            "{}",
            r.body
        );
        let got = gw.get_task(d, id).await;
        assert_eq!(got.result()["status"]["state"], d.state("canceled"));
        assert!(
            got.result().get("artifacts").is_none(),
            "the canceled work produced nothing"
        );
        let again = gw
            .call("/a2a/agents/echo", d, d.cancel(), json!({"id": id}))
            .await;
        assert_eq!(again.code(), -32002, "{}", again.body);
        assert_eq!(
            again.message(),
            format!("Task {id} cannot be canceled: it is already canceled")
        );
    }
    let done = gw.send(D::V10, "finished").await;
    let r = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "CancelTask",
            json!({"id": done["id"]}),
        )
        .await;
    assert_eq!(r.code(), -32002);
    assert_eq!(r.body["error"]["data"][0]["reason"], "TASK_NOT_CANCELABLE");
}

#[tokio::test]
async fn an_input_required_task_can_be_canceled() {
    let gw = spawn().await;
    let task = gw.send(D::V10, "/input waiting").await;
    let r = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "CancelTask",
            json!({"id": task["id"]}),
        )
        .await;
    assert_eq!(r.result()["status"]["state"], "TASK_STATE_CANCELED");
}

#[tokio::test]
async fn list_tasks_filters_and_pages_newest_first() {
    let gw = spawn().await;
    let ctx = "ctx-list";
    let mut ids = Vec::new();
    for i in 0..5 {
        let mut m = D::V10.message(&format!("t{i}"));
        m["contextId"] = json!(ctx);
        let r = gw
            .call(
                "/a2a/agents/echo",
                D::V10,
                "SendMessage",
                json!({"message": m}),
            )
            .await;
        ids.push(r.result()["task"]["id"].as_str().unwrap().to_string());
    }
    gw.send(D::V10, "/input elsewhere").await;
    let list = |params: Value| gw.call("/a2a/agents/echo", D::V10, "ListTasks", params);

    let first = list(json!({"contextId": ctx, "pageSize": 2})).await;
    let page = first.result();
    assert_eq!(page["totalSize"], 5);
    assert_eq!(page["pageSize"], 2);
    let got: Vec<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, vec![ids[4].as_str(), ids[3].as_str()], "newest first");
    assert!(
        page["tasks"][0].get("artifacts").is_none(),
        "no artifacts unless asked"
    );
    let token = page["nextPageToken"].as_str().unwrap();
    assert!(!token.is_empty());

    let mut seen: Vec<String> = got.iter().map(|s| s.to_string()).collect();
    let mut token = token.to_string();
    while !token.is_empty() {
        let next = list(
            json!({"contextId": ctx, "pageSize": 2, "pageToken": token, "includeArtifacts": true}),
        )
        .await;
        for t in next.result()["tasks"].as_array().unwrap() {
            assert!(t.get("artifacts").is_some(), "includeArtifacts keeps them");
            seen.push(t["id"].as_str().unwrap().to_string());
        }
        token = next.result()["nextPageToken"].as_str().unwrap().to_string();
    }
    let mut want = ids.clone();
    want.reverse();
    assert_eq!(seen, want, "pages cover every task exactly once");

    let waiting = list(json!({"status": "TASK_STATE_INPUT_REQUIRED"})).await;
    assert_eq!(waiting.result()["totalSize"], 1);
    let none = list(json!({"statusTimestampAfter": "2999-01-01T00:00:00Z"})).await;
    assert_eq!(none.result()["totalSize"], 0);
    assert_eq!(
        none.result()["nextPageToken"],
        "",
        "always present, empty on the last page"
    );
    // An unset enum as clients write it, or a spelling no state has, is no filter (as the
    // official servers read it).
    for unset in [
        json!("UNRECOGNIZED"),
        json!("TASK_STATE_BOGUS"),
        json!(0),
        json!(null),
    ] {
        let all = list(json!({"contextId": ctx, "status": unset})).await;
        assert_eq!(all.result()["totalSize"], 5, "{unset}: {}", all.body);
    }
    let no_history = list(json!({"contextId": ctx, "historyLength": 0})).await;
    assert!(no_history.result()["tasks"][0].get("history").is_none());

    for (params, needle) in [
        (
            json!({"pageSize": 101}),
            "params.pageSize: must be between 1 and 100",
        ),
        (json!({"pageToken": "garbage!"}), "params.pageToken"),
        (
            json!({"statusTimestampAfter": "yesterday"}),
            "params.statusTimestampAfter",
        ),
        (json!({"status": {"state": "working"}}), "params.status"),
    ] {
        let r = list(params.clone()).await;
        assert_eq!(r.code(), -32602, "{params}: {}", r.body);
        assert!(r.message().contains(needle), "{params}: {}", r.message());
    }
}

#[tokio::test]
async fn finished_tasks_are_evicted_oldest_first() {
    let gw = spawn_with(&[("echo.toml", ECHO)], "[limits]\nmax_tasks = 3").await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(
            gw.send(D::V10, &format!("n{i}")).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let evicted = gw.get_task(D::V10, &ids[0]).await;
    assert_eq!(evicted.code(), -32001, "the oldest finished task is gone");
    for id in &ids[1..] {
        assert_eq!(gw.get_task(D::V10, id).await.status, 200);
        assert!(
            gw.get_task(D::V10, id).await.body.get("result").is_some(),
            "{id} kept"
        );
    }
}

#[tokio::test]
async fn a_store_full_of_unfinished_tasks_refuses_new_ones() {
    let gw = spawn_with(&[("echo.toml", ECHO)], "[limits]\nmax_tasks = 1").await;
    gw.send(D::V10, "/input hold").await;
    let r = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("more")}),
        )
        .await;
    assert_eq!((r.status, r.code()), (503, -32052), "{}", r.body);
    assert_eq!(
        r.message(),
        "The gateway is holding its maximum of 1 unfinished tasks; retry later"
    );
}

#[tokio::test]
async fn message_replies_have_no_task() {
    let gw = spawn().await;
    for d in [D::V03, D::V10] {
        let r = gw
            .call(
                "/a2a/agents/echo",
                d,
                d.send(),
                json!({"message": d.message("/message plain reply")}),
            )
            .await;
        let msg = match d {
            D::V03 => {
                assert_eq!(r.result()["kind"], "message");
                r.result().clone()
            }
            D::V10 => r.result()["message"].clone(),
        };
        assert_eq!(msg["parts"][0]["text"], "plain reply");
        assert!(
            msg["contextId"].is_string(),
            "a Message reply carries contextId"
        );
        assert!(msg.get("taskId").is_none());
    }
}

#[tokio::test]
async fn echo_walks_fail_and_reject_on_request() {
    let gw = spawn().await;
    let failed = gw.send(D::V10, "/fail broken on purpose").await;
    assert_eq!(failed["status"]["state"], "TASK_STATE_FAILED");
    assert_eq!(
        failed["status"]["message"]["parts"][0]["text"],
        "broken on purpose"
    );
    let rejected = gw.send(D::V03, "/reject").await;
    assert_eq!(rejected["status"]["state"], "rejected");
    let mut m = D::V10.message("anything");
    m["metadata"] = json!({"echo": {"mode": "fail"}});
    let r = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": m}),
        )
        .await;
    assert_eq!(
        r.result()["task"]["status"]["state"],
        "TASK_STATE_FAILED",
        "metadata selects the mode"
    );
}

#[tokio::test]
async fn tck_message_id_conventions() {
    let gw = spawn().await;
    let send = |prefix: &str| {
        let id = format!("{prefix}-{}", uuid::Uuid::new_v4());
        gw.call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message_with_id("tck", &id)}),
        )
    };
    let task = |r: &crate::helpers::Reply| r.result()["task"].clone();

    let t = task(&send("tck-complete-task").await);
    assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(t["status"]["message"]["parts"][0]["text"], "Hello from TCK");

    let t = task(&send("tck-artifact-text").await);
    assert_eq!(text_of(&t["artifacts"]), "Generated text content");

    let t = task(&send("tck-artifact-file").await);
    let part = &t["artifacts"][0]["parts"][0];
    assert!(part["raw"].is_string());
    assert_eq!(
        (part["filename"].as_str(), part["mediaType"].as_str()),
        (Some("output.txt"), Some("text/plain"))
    );

    let t = task(&send("tck-artifact-file-url").await);
    assert_eq!(
        t["artifacts"][0]["parts"][0]["url"],
        "https://example.com/output.txt"
    );

    let t = task(&send("tck-artifact-data").await);
    assert_eq!(
        t["artifacts"][0]["parts"][0]["data"],
        json!({"key":"value","count":42})
    );

    let r = send("tck-message-response").await;
    assert_eq!(
        r.result()["message"]["parts"][0]["text"],
        "Direct message response"
    );

    let t = task(&send("tck-reject-task").await);
    assert_eq!(t["status"]["state"], "TASK_STATE_REJECTED");

    let t = task(&send("tck-stream-002").await);
    assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED");

    // input-required: follow-ups with the same prefix continue it; tck-complete-task ends it.
    let t = task(&send("tck-input-required").await);
    assert_eq!(t["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    let follow = |prefix: &str| {
        let mut m = D::V10.message_with_id("more", &format!("{prefix}-x"));
        m["taskId"] = t["id"].clone();
        gw.call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": m}),
        )
    };
    assert_eq!(
        task(&follow("tck-input-required").await)["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    // The same messageId arriving twice on one task is legitimate.
    assert_eq!(
        task(&follow("tck-input-required").await)["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    let done = task(&follow("tck-complete-task").await);
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(done["id"], t["id"]);
}

#[tokio::test]
async fn lenient_input_snake_case_and_legacy_shapes() {
    let gw = spawn().await;
    let body = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{
        "message":{"role":1,"message_id":"snake","context_id":"ctx-snake","parts":[{"text":"snake"}],"unknown_field":true},
        "configuration":{"history_length":1}}});
    let r = gw
        .post_raw(
            "/a2a/agents/echo",
            &[("A2A-Version", "1.0")],
            body.to_string(),
        )
        .await;
    let task = &r.result()["task"];
    assert_eq!(task["contextId"], "ctx-snake");
    assert_eq!(task["history"].as_array().unwrap().len(), 1);

    // 0.1: tasks/send with sessionId and `type`-tagged parts.
    let body = json!({"jsonrpc":"2.0","id":2,"method":"tasks/send","params":{
        "id":"client-chosen","sessionId":"sess-1",
        "message":{"role":"user","parts":[{"type":"text","text":"old client"}],"messageId":"m01"}}});
    let r = gw.post_raw("/a2a/agents/echo", &[], body.to_string()).await;
    // Answered in 0.1's own shape (see legacy.rs): the client's id, its sessionId.
    assert_eq!(r.result()["id"], "client-chosen");
    assert_eq!(r.result()["sessionId"], "sess-1");
    assert_eq!(text_of(&r.result()["artifacts"]), "old client");
}

/// An agent able to answer at once still waits for earlier work on the same conversation.
#[tokio::test]
async fn a_message_waits_for_earlier_work_on_its_conversation() {
    let gw = spawn().await;
    let in_context = |text: &str| {
        let mut m = D::V10.message(text);
        m["contextId"] = json!("ctx-order");
        m
    };
    let first = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": in_context("/delay 0.5 first"),
                   "configuration": {"returnImmediately": true}}),
        )
        .await;
    let first_id = first.result()["task"]["id"].as_str().unwrap().to_string();
    let second = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": in_context("second")}),
        )
        .await;
    assert_eq!(
        second.result()["task"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{}",
        second.body
    );
    let first = gw.get_task(D::V10, &first_id).await;
    assert_eq!(
        first.result()["status"]["state"],
        "TASK_STATE_COMPLETED",
        "the second message ran only after the first: {}",
        first.body
    );
}

/// Ids, timestamps and generated message ids removed: what is left must not depend on
/// how the task was run.
fn outcome_shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    !["id", "contextId", "taskId", "messageId", "timestamp"].contains(&k.as_str())
                })
                .map(|(k, v)| (k.clone(), outcome_shape(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(outcome_shape).collect()),
        other => other.clone(),
    }
}

/// Echo answers most messages at once, on the caller's thread; when its only slot is
/// taken the same messages wait their turn in the mailbox and run as scheduled
/// executions. Both ways must leave the same task (or Message).
#[tokio::test]
async fn scheduled_and_immediate_answers_leave_the_same_outcome() {
    let one = ECHO.replace("name = \"echo\"", "name = \"one\"")
        + "\n[limits]\nmax_concurrency = 1\nmailbox = 32\n";
    let gw = spawn_with(&[("one.toml", &one)], "").await;
    let texts = [
        ("hello there world", None),
        ("/input your name?", None),
        ("/fail it broke", None),
        ("/reject", None),
        ("/message just this", None),
        ("x", Some("tck-complete-task")),
        ("x", Some("tck-input-required")),
        ("x", Some("tck-artifact-text")),
        ("x", Some("tck-artifact-file")),
        ("x", Some("tck-artifact-file-url")),
        ("x", Some("tck-artifact-data")),
        ("x", Some("tck-message-response")),
        ("x", Some("tck-reject-task")),
        ("x", Some("tck-stream-001")),
        ("x", Some("tck-stream-002")),
    ];
    let send = |text: &str, prefix: Option<&str>| {
        let message = match prefix {
            Some(p) => D::V10.message_with_id(text, &format!("{p}-{}", uuid::Uuid::new_v4())),
            None => D::V10.message(text),
        };
        let gw = &gw;
        async move {
            let r = gw
                .call(
                    "/a2a/agents/one",
                    D::V10,
                    "SendMessage",
                    json!({"message": message}),
                )
                .await;
            assert_eq!(r.status, 200, "{}", r.body);
            outcome_shape(r.result())
        }
    };
    let mut immediate = Vec::new();
    for (text, prefix) in texts {
        immediate.push(send(text, prefix).await);
    }
    let hold = gw
        .call(
            "/a2a/agents/one",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("/delay 0.5 hold"),
                   "configuration": {"returnImmediately": true}}),
        )
        .await;
    assert_eq!(hold.status, 200, "{}", hold.body);
    let scheduled = futures_util::future::join_all(texts.iter().map(|(t, p)| send(t, *p))).await;
    for (i, (now, later)) in immediate.iter().zip(&scheduled).enumerate() {
        assert_eq!(now, later, "{:?}", texts[i]);
    }
}

//! The HTTP+JSON binding in front of the gateway's own echo agent, and its error bodies.

use serde_json::{json, Value};

use crate::helpers::{parse_sse, spawn, D};

#[tokio::test]
async fn rest_binding_covers_the_lifecycle() {
    let gw = spawn().await;
    let c = &gw.client;
    for base in [gw.url("/a2a/agents/echo/rest"), gw.url("/a2a/rest")] {
        let sent: Value = c
            .post(format!("{base}/message:send"))
            .header("content-type", "application/a2a+json")
            .body(json!({"message": D::V10.message("over rest")}).to_string())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let task = &sent["task"];
        assert_eq!(
            task["status"]["state"], "TASK_STATE_COMPLETED",
            "{base}: {sent}"
        );
        let id = task["id"].as_str().unwrap();

        let got: Value = c
            .get(format!("{base}/tasks/{id}?historyLength=1"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(got["history"].as_array().unwrap().len(), 1);

        let list: Value = c
            .get(format!(
                "{base}/tasks?pageSize=1&status=TASK_STATE_COMPLETED&includeArtifacts=true"
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(list["pageSize"], 1, "{list}");
        assert!(list["tasks"][0]["artifacts"].is_array(), "{list}");

        let events = parse_sse(
            &c.post(format!("{base}/message:stream"))
                .json(&json!({"message": D::V10.message("x y z")}))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        );
        assert!(events[0].data.get("task").is_some());
        assert_eq!(
            events.last().unwrap().data["statusUpdate"]["status"]["state"],
            "TASK_STATE_COMPLETED"
        );

        let slow: Value = c.post(format!("{base}/message:send"))
            .json(&json!({"message": D::V10.message("/delay 30 x"), "configuration": {"returnImmediately": true}}))
            .send().await.unwrap().json().await.unwrap();
        let slow_id = slow["task"]["id"].as_str().unwrap().to_string();
        let watcher = tokio::spawn(c.post(format!("{base}/tasks/{slow_id}:subscribe")).send());
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let canceled: Value = c
            .post(format!("{base}/tasks/{slow_id}:cancel"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(canceled["status"]["state"], "TASK_STATE_CANCELED");
        let sub = parse_sse(&watcher.await.unwrap().unwrap().text().await.unwrap());
        assert_eq!(
            sub.last().unwrap().data["statusUpdate"]["status"]["state"],
            "TASK_STATE_CANCELED"
        );
    }
}

#[tokio::test]
async fn rest_errors_use_google_rpc_status_with_http_statuses() {
    let gw = spawn().await;
    let base = gw.url("/a2a/agents/echo/rest");
    let c = &gw.client;
    let cases: Vec<(reqwest::RequestBuilder, u16, &str, &str)> = vec![
        (
            c.get(format!("{base}/tasks/missing")),
            404,
            "TASK_NOT_FOUND",
            "Task not found: missing",
        ),
        (
            c.post(format!("{base}/tasks/missing:cancel")),
            404,
            "TASK_NOT_FOUND",
            "Task not found: missing",
        ),
        (
            c.post(format!("{base}/message:send"))
                .header("content-type", "application/json")
                .body("{nope"),
            400,
            "PARSE_ERROR",
            "Parse error",
        ),
        (
            c.post(format!("{base}/message:send"))
                .json(&json!({"message": {"role": "ROLE_USER"}})),
            400,
            "INVALID_PARAMS",
            "Invalid params: params.message: missing field `messageId`",
        ),
        (
            c.post(format!("{base}/message:send"))
                .header("content-type", "text/plain")
                .body("{}"),
            415,
            "CONTENT_TYPE_NOT_SUPPORTED",
            "Content type not supported",
        ),
        (
            c.get(format!("{base}/tasks?pageSize=500")),
            400,
            "INVALID_PARAMS",
            "Invalid params: params.pageSize",
        ),
        (
            c.get(format!("{base}/tasks/x/pushNotificationConfigs")),
            400,
            "PUSH_NOTIFICATION_NOT_SUPPORTED",
            "Push notifications",
        ),
        (
            c.get(format!("{base}/extendedAgentCard")),
            400,
            "UNSUPPORTED_OPERATION",
            "Unsupported operation",
        ),
        (
            c.get(format!("{base}/tasks/x"))
                .header("A2A-Version", "0.3"),
            400,
            "VERSION_NOT_SUPPORTED",
            "A2A protocol version 0.3 is not supported (supported: 1.0 on the HTTP+JSON binding",
        ),
        (
            c.get(gw.url("/a2a/agents/ghost/rest/tasks/x")),
            404,
            "AGENT_NOT_FOUND",
            "Unknown agent: ghost",
        ),
        (
            c.get(format!("{base}/no/such/route")),
            404,
            "METHOD_NOT_FOUND",
            "Method not found",
        ),
    ];
    for (req, status, reason, message) in cases {
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), status, "{reason}");
        let body: Value = resp.json().await.unwrap();
        let err = &body["error"];
        assert_eq!(err["code"], status, "{body}");
        assert_eq!(
            err["details"][0]["@type"], "type.googleapis.com/google.rpc.ErrorInfo",
            "{body}"
        );
        assert_eq!(err["details"][0]["reason"], reason, "{body}");
        assert!(
            err["message"].as_str().unwrap().starts_with(message),
            "{body}"
        );
        assert!(err["status"].is_string());
    }
}

#[tokio::test]
async fn cards_list_the_rest_interface() {
    let gw = spawn().await;
    let card: Value = gw.get_json("/a2a/agents/echo/card").await;
    let rest = card["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["protocolBinding"] == "HTTP+JSON")
        .cloned();
    assert_eq!(
        rest,
        Some(
            json!({"url": gw.url("/a2a/agents/echo/rest"), "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"})
        )
    );
}

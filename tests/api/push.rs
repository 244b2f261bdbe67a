//! Push notifications over real HTTP: webhook receivers started here (actix servers on
//! 127.0.0.1, which the test gateway's `push.allow` names), every method in every dialect
//! and binding, delivery order, retries, a hanging receiver, the JWT against the served
//! JWKS, the destination policy, and upstream SDK agents with and without push.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};

use crate::helpers::{series, sha, start, write_config, TestGateway, D, ECHO};
use crate::peers::{free_port, python_agent_with, upstream_agent};

/// What a receiver got: one request, whatever it answered.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Value,
    raw: Vec<u8>,
    /// When it arrived.
    pub(crate) at: std::time::Instant,
}

impl Got {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The gateway's id of the notification, the same on every copy of it.
    pub(crate) fn notification_id(&self) -> Option<&str> {
        self.header("X-A2A-Gateway-Notification-Id")
    }
}

#[derive(Clone)]
pub(crate) enum Answer {
    Ok,
    /// 503 to the first n requests, then 200.
    FailFirst(usize),
    /// Never answers.
    Hang,
    Redirect(String),
    /// 503 to final states while the flag is set; 200 to the rest.
    RefuseFinalsWhile(Arc<std::sync::atomic::AtomicBool>),
    /// 503 to everything while the flag is set, then 200.
    RefuseWhile(Arc<std::sync::atomic::AtomicBool>),
}

pub(crate) struct Receiver {
    pub(crate) url: String,
    got: Arc<Mutex<Vec<Got>>>,
    handle: actix_web::dev::ServerHandle,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
    }
}

impl Receiver {
    pub(crate) async fn start(host: &str, answer: Answer) -> Receiver {
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let state = (got.clone(), answer);
        let server = HttpServer::new(move || {
            let state = state.clone();
            App::new().default_service(web::to(move |req: HttpRequest, body: web::Bytes| {
                let (got, answer) = state.clone();
                async move {
                    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let is_final = final_state(&parsed).is_some();
                    let seen = {
                        let mut got = got.lock().unwrap();
                        got.push(Got {
                            headers: req
                                .headers()
                                .iter()
                                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                                .collect(),
                            body: parsed,
                            raw: body.to_vec(),
                            at: std::time::Instant::now(),
                        });
                        got.len()
                    };
                    match answer {
                        Answer::Ok => HttpResponse::Ok().finish(),
                        Answer::FailFirst(n) if seen <= n => {
                            HttpResponse::ServiceUnavailable().finish()
                        }
                        Answer::FailFirst(_) => HttpResponse::Ok().finish(),
                        Answer::Hang => {
                            tokio::time::sleep(Duration::from_secs(600)).await;
                            HttpResponse::Ok().finish()
                        }
                        Answer::Redirect(to) => HttpResponse::Found()
                            .insert_header(("Location", to))
                            .finish(),
                        Answer::RefuseFinalsWhile(refusing)
                            if is_final && refusing.load(std::sync::atomic::Ordering::SeqCst) =>
                        {
                            HttpResponse::ServiceUnavailable().finish()
                        }
                        Answer::RefuseFinalsWhile(_) => HttpResponse::Ok().finish(),
                        Answer::RefuseWhile(refusing)
                            if refusing.load(std::sync::atomic::Ordering::SeqCst) =>
                        {
                            HttpResponse::ServiceUnavailable().finish()
                        }
                        Answer::RefuseWhile(_) => HttpResponse::Ok().finish(),
                    }
                }
            }))
        })
        .workers(1)
        .disable_signals()
        .bind((host, 0))
        .expect("receiver bind");
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Receiver {
            url: format!("http://{host}:{port}/hook"),
            got,
            handle,
        }
    }

    pub(crate) fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// Waits until `done` holds of what arrived (20 s at most).
    pub(crate) async fn wait(&self, what: &str, done: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        for _ in 0..400 {
            let got = self.got();
            if done(&got) {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what}: the receiver got {:#?}", self.got());
    }

    /// Waits for a notification saying the task reached a final state.
    async fn wait_final(&self) -> Vec<Got> {
        self.wait("a final notification", |got| {
            got.iter().any(|g| final_state(&g.body).is_some())
        })
        .await
    }
}

/// The state a notification reports, if it is a final one (any dialect's shape).
fn final_state(body: &Value) -> Option<String> {
    let state = state_of(body)?;
    let s = state.to_ascii_lowercase();
    ["completed", "failed", "canceled", "cancelled", "rejected"]
        .iter()
        .any(|t| s.ends_with(t))
        .then_some(state)
}

pub(crate) fn state_of(body: &Value) -> Option<String> {
    let status = if body.get("statusUpdate").is_some() {
        &body["statusUpdate"]["status"]
    } else if body.get("task").is_some() {
        &body["task"]["status"]
    } else {
        &body["status"]
    };
    status["state"].as_str().map(str::to_string)
}

const SETTINGS: &str = "[push]\nenabled = true\nallow_http = true\nallow = [\"127.0.0.1\"]\ntimeout_secs = 1\ninitial_backoff_ms = 50\nmax_backoff_secs = 1\nretry_for_secs = 20\n";

fn keys() -> String {
    format!(
        "[auth]\ndefault_access = \"authenticated\"\n[[auth.api_keys]]\nid = \"alice\"\nsecret_sha256 = \"{}\"\nagents = [\"*\"]\n[[auth.api_keys]]\nid = \"bob\"\nsecret_sha256 = \"{}\"\nagents = [\"*\"]\n",
        sha("alice-key"),
        sha("bob-key")
    )
}

/// A gateway on a port known before it starts (upstreams are told to call it back there).
async fn gateway(files: &[(&str, &str)], extra: &str) -> TestGateway {
    let port = free_port();
    let text = format!(
        "default_agent = \"echo\"\npublic_url = \"http://127.0.0.1:{port}\"\n{extra}\n[server]\nport = {port}\nworkers = 1\n"
    );
    let (dir, agents, path) = write_config(files, Some(&text));
    let settings = a2a_gateway::config::load(path.as_deref(), &agents)
        .unwrap_or_else(|d| panic!("test config invalid:\n{d}"));
    start(settings, dir).await
}

async fn push_gateway() -> TestGateway {
    gateway(&[("echo.toml", ECHO)], &format!("{SETTINGS}{}", keys())).await
}

/// A JSON-RPC call as `key` (alice or bob), in `version` ("1.0", "0.3" or none for 0.1).
async fn call(
    gw: &TestGateway,
    key: &str,
    version: Option<&str>,
    method: &str,
    params: Value,
) -> Value {
    let mut req = gw
        .client
        .post(gw.url("/a2a/agents/echo"))
        .header("X-API-Key", format!("{key}-key"))
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}));
    if let Some(v) = version {
        req = req.header("A2A-Version", v);
    }
    req.send().await.expect("call").json().await.expect("JSON")
}

/// The count of push notifications with `outcome` so far (0 when none yet).
fn pushed(metrics: &str, outcome: &str) -> f64 {
    let label = format!("outcome=\"{outcome}\"");
    series(metrics, "a2a_push_notifications_total", &[&label]).unwrap_or(0.0)
}

/// A 0.1 task named `name`, kept running (`/delay 30`) as `key`. It is sent with
/// `tasks/sendSubscribe`, which names the task with its first event (a blocking
/// `tasks/send` names it only when it answers, and 0.1 has no non-blocking send); the
/// stream is read to its end in the background while the test works on the running task.
async fn running_legacy_task(gw: &TestGateway, key: &str, name: &str) {
    use futures_util::StreamExt;
    let stream = gw
        .client
        .post(gw.url("/a2a/agents/echo"))
        .header("X-API-Key", format!("{key}-key"))
        .header("Accept", "text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": "tasks/sendSubscribe", "params": {"id": name,
            "message": {"role": "user", "parts": [{"type": "text", "text": "/delay 30 x"}]}}}))
        .send()
        .await
        .expect("tasks/sendSubscribe");
    assert_eq!(stream.status(), 200);
    let mut events = stream.bytes_stream();
    let first = events
        .next()
        .await
        .expect("a first event")
        .expect("its bytes");
    assert!(String::from_utf8_lossy(&first).contains(name), "{first:?}");
    tokio::spawn(async move { while events.next().await.is_some() {} });
    let got = call(gw, key, None, "tasks/get", json!({"id": name})).await;
    assert_eq!(got["result"]["status"]["state"], "working", "{got}");
}

/// A 1.0 call as alice, the owner of the tests' tasks.
async fn as_alice(gw: &TestGateway, method: &str, params: Value) -> Value {
    call(gw, "alice", Some("1.0"), method, params).await
}

fn message(text: &str) -> Value {
    json!({"role": "ROLE_USER", "parts": [{"text": text}], "messageId": uuid::Uuid::new_v4().to_string()})
}

fn message_v03(text: &str) -> Value {
    json!({"kind": "message", "role": "user", "parts": [{"kind": "text", "text": text}], "messageId": uuid::Uuid::new_v4().to_string()})
}

/// A task left working for `secs` (returned at once), as alice.
async fn slow_task(gw: &TestGateway, secs: f64) -> String {
    let r = as_alice(gw, "SendMessage",
        json!({"message": message(&format!("/delay {secs} done")), "configuration": {"returnImmediately": true}}),
    )
    .await;
    r["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string()
}

#[tokio::test]
async fn push_is_off_unless_enabled() {
    let gw = gateway(&[("echo.toml", ECHO)], "").await;
    let card = gw.get_json("/.well-known/agent-card.json").await;
    assert_eq!(card["capabilities"]["pushNotifications"], false);
    let task = gw.send(D::V10, "hi").await;
    let r = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": task["id"], "url": "https://example.com/h"}),
        )
        .await;
    assert_eq!(r.code(), -32003);
    let r = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": message("hi"), "configuration": {"taskPushNotificationConfig": {"url": "https://example.com/h"}}}),
        )
        .await;
    assert_eq!(r.code(), -32003);
    // The JWKS is served all the same: cards are signed with the gateway's key.
    let jwks = gw.get_json("/.well-known/jwks.json").await;
    assert_eq!(jwks["keys"].as_array().map(Vec::len), Some(1), "{jwks}");
}

#[tokio::test]
async fn every_method_in_every_dialect_and_binding() {
    let gw = push_gateway().await;
    let rx = Receiver::start("127.0.0.1", Answer::Ok).await;
    for path in [
        "/.well-known/agent-card.json",
        "/a2a/agents/echo/.well-known/agent-card.json",
    ] {
        let card = gw
            .client
            .get(gw.url(path))
            .header("X-API-Key", "alice-key")
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap();
        assert_eq!(card["capabilities"]["pushNotifications"], true, "{path}");
    }
    let task = slow_task(&gw, 30.0).await;

    // 1.0 JSON-RPC.
    let made = as_alice(
        &gw,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "id": "one", "url": rx.url, "token": "t1"}),
    )
    .await;
    assert_eq!(
        made["result"],
        json!({"taskId": task, "id": "one", "url": rx.url, "token": "t1"}),
        "{made}"
    );
    let got = as_alice(
        &gw,
        "GetTaskPushNotificationConfig",
        json!({"taskId": task, "id": "one"}),
    )
    .await;
    assert_eq!(got["result"]["url"], rx.url);
    // Without an id the gateway names it.
    let unnamed = as_alice(
        &gw,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "url": rx.url}),
    )
    .await;
    let unnamed_id = unnamed["result"]["id"].as_str().expect("an id").to_string();
    assert!(!unnamed_id.is_empty());
    let list = as_alice(
        &gw,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": task}),
    )
    .await;
    assert_eq!(
        list["result"]["configs"].as_array().unwrap().len(),
        2,
        "{list}"
    );
    assert_eq!(list["result"]["nextPageToken"], "");
    let page = as_alice(
        &gw,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": task, "pageSize": 1}),
    )
    .await;
    assert_eq!(page["result"]["configs"].as_array().unwrap().len(), 1);
    assert_eq!(page["result"]["nextPageToken"], "1");
    let deleted = as_alice(
        &gw,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": task, "id": unnamed_id}),
    )
    .await;
    assert_eq!(deleted["result"], Value::Null, "{deleted}");
    // Delete is idempotent; a missing config is named.
    let again = as_alice(
        &gw,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": task, "id": unnamed_id}),
    )
    .await;
    assert_eq!(again["result"], Value::Null, "{again}");
    let missing = as_alice(
        &gw,
        "GetTaskPushNotificationConfig",
        json!({"taskId": task, "id": unnamed_id}),
    )
    .await;
    assert_eq!(missing["error"]["code"], -32602, "{missing}");

    // Configs belong to the task's owner: bob hears what an unknown task gets.
    for method in [
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
    ] {
        let r = call(
            &gw,
            "bob",
            Some("1.0"),
            method,
            json!({"taskId": task, "id": "one", "url": rx.url}),
        )
        .await;
        assert_eq!(r["error"]["code"], -32001, "{method}: {r}");
    }
    let r = as_alice(
        &gw,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": "no-such-task", "url": rx.url}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32001);

    // 0.3 JSON-RPC: nested configs, the task named `id` after set, a bare list.
    let set = call(&gw, "alice", None, "tasks/pushNotificationConfig/set",
        json!({"taskId": task, "pushNotificationConfig": {"id": "two", "url": rx.url, "authentication": {"schemes": ["Basic"], "credentials": "dTpw"}}})).await;
    assert_eq!(
        set["result"],
        json!({"taskId": task, "pushNotificationConfig": {"id": "two", "url": rx.url, "authentication": {"schemes": ["Basic"], "credentials": "dTpw"}}}),
        "{set}"
    );
    let get = call(
        &gw,
        "alice",
        None,
        "tasks/pushNotificationConfig/get",
        json!({"id": task, "pushNotificationConfigId": "two"}),
    )
    .await;
    assert_eq!(
        get["result"]["pushNotificationConfig"]["id"], "two",
        "{get}"
    );
    let list = call(
        &gw,
        "alice",
        None,
        "tasks/pushNotificationConfig/list",
        json!({"id": task}),
    )
    .await;
    let ids: Vec<_> = list["result"]
        .as_array()
        .expect("a bare array")
        .iter()
        .map(|c| c["pushNotificationConfig"]["id"].clone())
        .collect();
    assert_eq!(ids, [json!("one"), json!("two")], "{list}");
    let del = call(
        &gw,
        "alice",
        None,
        "tasks/pushNotificationConfig/delete",
        json!({"id": task, "pushNotificationConfigId": "two"}),
    )
    .await;
    assert_eq!(del["result"], Value::Null, "{del}");

    // HTTP+JSON.
    let rest = |method: reqwest::Method, path: String| {
        gw.client
            .request(method, gw.url(&format!("/a2a/agents/echo/rest{path}")))
            .header("X-API-Key", "alice-key")
            .header("A2A-Version", "1.0")
    };
    let resp = rest(
        reqwest::Method::POST,
        format!("/tasks/{task}/pushNotificationConfigs"),
    )
    .header("content-type", "application/json")
    .body(json!({"id": "three", "url": rx.url}).to_string())
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["id"], "three");
    let one = rest(
        reqwest::Method::GET,
        format!("/tasks/{task}/pushNotificationConfigs/three"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(one.json::<Value>().await.unwrap()["taskId"], task);
    let list = rest(
        reqwest::Method::GET,
        format!("/tasks/{task}/pushNotificationConfigs?pageSize=10"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(
        list.json::<Value>().await.unwrap()["configs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let gone = rest(
        reqwest::Method::DELETE,
        format!("/tasks/{task}/pushNotificationConfigs/three"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(gone.status(), 200);
    assert_eq!(gone.json::<Value>().await.unwrap(), json!({}));
    let missing = rest(
        reqwest::Method::GET,
        format!("/tasks/{task}/pushNotificationConfigs/three"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(missing.status(), 404);
    let bob = gw
        .client
        .get(gw.url(&format!(
            "/a2a/agents/echo/rest/tasks/{task}/pushNotificationConfigs"
        )))
        .header("X-API-Key", "bob-key")
        .send()
        .await
        .unwrap();
    assert_eq!(bob.status(), 404);

    // 0.1: the caller names its task; set and get answer under that name.
    let name = format!("mine-{}", uuid::Uuid::new_v4());
    running_legacy_task(&gw, "alice", &name).await;
    let set = call(
        &gw,
        "alice",
        None,
        "tasks/pushNotification/set",
        json!({"id": name, "pushNotificationConfig": {"url": rx.url, "token": "legacy"}}),
    )
    .await;
    assert_eq!(
        set["result"],
        json!({"id": name, "pushNotificationConfig": {"url": rx.url, "token": "legacy"}}),
        "{set}"
    );
    let get = call(
        &gw,
        "alice",
        None,
        "tasks/pushNotification/get",
        json!({"id": name}),
    )
    .await;
    assert_eq!(
        get["result"]["pushNotificationConfig"]["token"], "legacy",
        "{get}"
    );
    // A 0.1 send with its config beside the message: notified under the client's name.
    let legacy = Receiver::start("127.0.0.1", Answer::Ok).await;
    let name = format!("mine-{}", uuid::Uuid::new_v4());
    let sent = call(&gw, "alice", None, "tasks/send",
        json!({"id": name, "message": {"role": "user", "parts": [{"type": "text", "text": "/delay 0.2 x"}]}, "pushNotification": {"url": legacy.url}})).await;
    assert!(sent.get("result").is_some(), "{sent}");
    let got = legacy.wait_final().await;
    let last = &got.last().unwrap().body;
    assert_eq!(last["id"], name.as_str(), "{last}");
    assert_eq!(last["status"]["state"], "completed", "{last}");
    assert!(
        last.get("kind").is_none(),
        "0.1 shapes have no kind: {last}"
    );

    // The gateway is still healthy after all of it.
    let health = gw.client.get(gw.url("/a2a/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn updates_arrive_in_order_in_the_dialect_of_each_config() {
    let gw = push_gateway().await;
    let v10 = Receiver::start("127.0.0.1", Answer::Ok).await;
    let v03 = Receiver::start("127.0.0.1", Answer::Ok).await;
    // 1.0: inline in the send; 0.3: set on the task just after.
    let r = as_alice(&gw, "SendMessage", json!({
        "message": message("/delay 0.5 one two three"),
        "configuration": {"returnImmediately": true, "taskPushNotificationConfig": {"url": v10.url, "token": "tok-10"}},
    })).await;
    let task = r["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let set = call(
        &gw,
        "alice",
        None,
        "tasks/pushNotificationConfig/set",
        json!({"taskId": task, "pushNotificationConfig": {"url": v03.url, "token": "tok-03"}}),
    )
    .await;
    assert!(set.get("result").is_some(), "{set}");

    let got = v10.wait_final().await;
    // StreamResponses: the task first, then its events, the final state last.
    assert!(got[0].body.get("task").is_some(), "{:?}", got[0].body);
    let kinds: Vec<&str> = got
        .iter()
        .map(|g| g.body.as_object().unwrap().keys().next().unwrap().as_str())
        .collect();
    let last = got.last().unwrap();
    assert_eq!(
        state_of(&last.body).as_deref(),
        Some("TASK_STATE_COMPLETED"),
        "{kinds:?}"
    );
    let artifact = kinds
        .iter()
        .position(|k| *k == "artifactUpdate")
        .expect("an artifact update");
    assert!(
        artifact < kinds.len() - 1,
        "the artifact comes before the final status: {kinds:?}"
    );
    for g in &got {
        assert_eq!(g.header("X-A2A-Notification-Token"), Some("tok-10"));
        assert_eq!(g.header("content-type"), Some("application/a2a+json"));
    }
    assert_eq!(
        got.iter()
            .filter(|g| final_state(&g.body).is_some())
            .count(),
        1
    );

    let got = v03.wait_final().await;
    let last = &got.last().unwrap().body;
    // 0.3 receivers get the whole task, with `kind`, as its SDKs send it.
    assert_eq!(last["kind"], "task");
    assert_eq!(last["id"], task);
    assert_eq!(last["status"]["state"], "completed");
    assert_eq!(crate::helpers::text_of(&last["artifacts"]), "one two three");
    assert!(got
        .iter()
        .all(|g| g.header("X-A2A-Notification-Token") == Some("tok-03")));
    // States only move forward.
    let order = ["submitted", "working", "completed"];
    let seen: Vec<usize> = got
        .iter()
        .filter_map(|g| order.iter().position(|s| g.body["status"]["state"] == *s))
        .collect();
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
}

/// A task that stops to wait for authorization notifies its configs, as one waiting for
/// input does, and again when the follow-up finishes it.
#[tokio::test]
async fn a_task_waiting_for_authorization_is_notified_and_so_is_its_end() {
    let gw = push_gateway().await;
    let hook = Receiver::start("127.0.0.1", Answer::Ok).await;
    let r = as_alice(
        &gw,
        "SendMessage",
        json!({"message": message("/auth sign in"),
               "configuration": {"taskPushNotificationConfig": {"url": hook.url, "token": "t"}}}),
    )
    .await;
    let task = r["result"]["task"].clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_AUTH_REQUIRED", "{r}");
    hook.wait("the auth-required notification", |got| {
        got.iter()
            .any(|g| state_of(&g.body).as_deref() == Some("TASK_STATE_AUTH_REQUIRED"))
    })
    .await;
    let mut answer = message("granted");
    answer["taskId"] = task["id"].clone();
    let done = as_alice(&gw, "SendMessage", json!({"message": answer})).await;
    let state = &done["result"]["task"]["status"]["state"];
    assert_eq!(state, "TASK_STATE_COMPLETED", "{done}");
    let got = hook.wait_final().await;
    let last = state_of(&got.last().unwrap().body);
    assert_eq!(last.as_deref(), Some("TASK_STATE_COMPLETED"), "{got:?}");
}

#[tokio::test]
async fn a_failing_receiver_is_retried_and_a_hanging_one_slows_nothing() {
    let gw = push_gateway().await;
    let flaky = Receiver::start("127.0.0.1", Answer::FailFirst(2)).await;
    let hanging = Receiver::start("127.0.0.1", Answer::Hang).await;
    let fine = Receiver::start("127.0.0.1", Answer::Ok).await;
    let task = slow_task(&gw, 0.3).await;
    for (id, url) in [
        ("flaky", &flaky.url),
        ("hanging", &hanging.url),
        ("fine", &fine.url),
    ] {
        let r = as_alice(
            &gw,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": task, "id": id, "url": url}),
        )
        .await;
        assert!(r.get("result").is_some(), "{r}");
    }
    // The task finishes on time, and the healthy receiver has everything, whatever the
    // hanging one does.
    let fine_got = fine.wait_final().await;
    let done = wait_for_state_as(&gw, "alice", &task, "TASK_STATE_COMPLETED").await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED");
    assert!(fine_got.len() >= 2);

    // The flaky one: two 503s, then the first notification again, and then the rest in
    // the order the fine one got them.
    let flaky_got = flaky.wait_final().await;
    assert!(
        flaky_got.len() >= fine_got.len() + 2,
        "{} vs {}",
        flaky_got.len(),
        fine_got.len()
    );
    assert_eq!(flaky_got[0].raw, flaky_got[1].raw);
    assert_eq!(flaky_got[1].raw, flaky_got[2].raw);
    // Each notification has an id of its own, the same on each retry of it.
    let ids: Vec<&str> = (flaky_got.iter())
        .map(|g| g.notification_id().unwrap_or(""))
        .collect();
    assert!(ids.iter().all(|id| id.len() == 32), "{ids:?}");
    assert_eq!((ids[0], ids[1]), (ids[2], ids[2]), "{ids:?}");
    let distinct: std::collections::HashSet<&&str> = ids[2..].iter().collect();
    assert_eq!(distinct.len(), ids.len() - 2, "{ids:?}");
    let states = |got: &[Got]| got.iter().map(|g| state_of(&g.body)).collect::<Vec<_>>();
    // (The flaky config was made first: it also got the task as it was then.)
    let (flaky_states, fine_states) = (states(&flaky_got[2..]), states(&fine_got));
    assert!(
        flaky_states.ends_with(&fine_states),
        "{flaky_states:?} vs {fine_states:?}"
    );

    // The hanging one was tried (and is being retried), one notification at a time.
    assert!(!hanging.got().is_empty());
    // The flaky one's two failures were retried, and what reached the fine and the flaky
    // receivers counts as delivered.
    let metrics = gw.metrics().await;
    assert!(pushed(&metrics, "retried") >= 2.0, "{metrics}");
    assert!(
        pushed(&metrics, "delivered") >= (fine_got.len() + flaky_got.len() - 2) as f64,
        "{metrics}"
    );
}

#[tokio::test]
async fn a_gateway_signed_jwt_verifies_against_the_served_jwks() {
    let gw = push_gateway().await;
    let rx = Receiver::start("127.0.0.1", Answer::Ok).await;
    let basic = Receiver::start("127.0.0.1", Answer::Ok).await;
    let task = slow_task(&gw, 0.2).await;
    let r = as_alice(
        &gw,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "id": "jwt", "url": rx.url, "authentication": {"scheme": "Bearer"}}),
    )
    .await;
    assert!(r.get("result").is_some(), "{r}");
    let r = as_alice(&gw, "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "id": "basic", "url": basic.url, "authentication": {"scheme": "Basic", "credentials": "dTpw"}})).await;
    assert!(r.get("result").is_some(), "{r}");
    let got = rx.wait_final().await;
    let jwks: jsonwebtoken::jwk::JwkSet = gw
        .client
        .get(gw.url("/.well-known/jwks.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(jwks.keys.len(), 1);
    for g in &got {
        let auth = g.header("authorization").expect("an Authorization header");
        let token = auth.strip_prefix("Bearer ").expect("a bearer token");
        let header = jsonwebtoken::decode_header(token).unwrap();
        let jwk = jwks
            .find(header.kid.as_deref().unwrap())
            .expect("the key the JWT names");
        let key = jsonwebtoken::DecodingKey::from_jwk(jwk).unwrap();
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
        v.set_audience(&[rx.url.as_str()]);
        let claims = jsonwebtoken::decode::<Value>(token, &key, &v)
            .expect("verifies")
            .claims;
        assert_eq!(claims["taskId"], task);
        assert_eq!(claims["request_body_sha256"], sha_bytes(&g.raw));
        // Not for another receiver.
        v.set_audience(&[basic.url.as_str()]);
        assert!(jsonwebtoken::decode::<Value>(token, &key, &v).is_err());
    }
    let got = basic.wait_final().await;
    assert!(got
        .iter()
        .all(|g| g.header("authorization") == Some("Basic dTpw")));
    // A scheme other than Bearer needs credentials.
    let r = as_alice(
        &gw,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "url": rx.url, "authentication": {"scheme": "Basic"}}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

fn sha_bytes(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn destinations_outside_the_policy_are_refused_and_nothing_is_sent() {
    // No allow-list here: nothing but public addresses.
    let gw = gateway(
        &[("echo.toml", ECHO)],
        "[push]\nenabled = true\nallow_http = true\n",
    )
    .await;
    let rx = Receiver::start("127.0.0.1", Answer::Ok).await;
    let port = rx
        .url
        .split(':')
        .nth(2)
        .unwrap()
        .trim_end_matches("/hook")
        .to_string();
    let task = gw.send_nonblocking(D::V10, "/delay 5 x").await;
    let task = task["id"].as_str().unwrap().to_string();
    for (url, why) in [
        (rx.url.clone(), "loopback"),
        (format!("http://localhost:{port}/hook"), "resolves to"),
        (format!("http://2130706433:{port}/hook"), "loopback"),
        (format!("http://0x7f.0.0.1:{port}/hook"), "loopback"),
        (format!("http://0:{port}/hook"), "unspecified"),
        (format!("http://[::1]:{port}/hook"), "loopback"),
        (format!("http://[::ffff:127.0.0.1]:{port}/hook"), "loopback"),
        (
            "http://169.254.169.254/latest/meta-data/".into(),
            "metadata",
        ),
        ("http://[fd00:ec2::254]/".into(), "metadata"),
        ("http://10.0.0.1/".into(), "private"),
        ("http://167772161/".into(), "private"),
        ("http://[fe80::1]/".into(), "link-local"),
        ("http://224.0.0.1/".into(), "multicast"),
        ("http://user:pw@example.com/".into(), "credentials"),
        ("file:///etc/passwd".into(), "scheme"),
    ] {
        for (method, params) in [
            (
                "CreateTaskPushNotificationConfig",
                json!({"taskId": task, "url": url}),
            ),
            (
                "SendMessage",
                json!({"message": message("hi"), "configuration": {"taskPushNotificationConfig": {"url": url}}}),
            ),
        ] {
            let r = gw.call("/a2a/agents/echo", D::V10, method, params).await;
            assert_eq!(r.code(), -32602, "{url} via {method}: {}", r.body);
            assert!(r.message().contains(why), "{url}: {}", r.message());
        }
    }
    // A refused inline config started no task.
    let list = gw
        .call("/a2a/agents/echo", D::V10, "ListTasks", json!({}))
        .await;
    assert_eq!(list.result()["tasks"].as_array().unwrap().len(), 1);
    // https only, unless allowed.
    let strict = gateway(&[("echo.toml", ECHO)], "[push]\nenabled = true\n").await;
    let t = strict.send(D::V10, "hi").await;
    let r = strict
        .call(
            "/a2a/agents/echo",
            D::V10,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": t["id"], "url": "http://example.com/hook"}),
        )
        .await;
    assert_eq!(r.code(), -32602);
    assert!(r.message().contains("https"), "{}", r.message());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.got().is_empty(), "nothing may be sent: {:?}", rx.got());
}

/// A receiver registered before it exists (its name does not resolve yet) is accepted, in a
/// config and inline; deliveries to it fail and are retried like any unreachable receiver.
#[tokio::test]
async fn a_receiver_whose_name_does_not_resolve_yet_is_accepted_and_retried() {
    let gw = push_gateway().await;
    let url = "https://receiver-not-deployed-yet.invalid/webhook";
    let task = slow_task(&gw, 0.3).await;
    let r = as_alice(
        &gw,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "id": "later", "url": url}),
    )
    .await;
    assert_eq!(r["result"]["url"], url, "{r}");
    let r = as_alice(
        &gw,
        "SendMessage",
        json!({"message": message("hi"), "configuration": {"taskPushNotificationConfig": {"url": url}}}),
    )
    .await;
    assert!(r["result"]["task"]["id"].is_string(), "{r}");
    let listed = as_alice(
        &gw,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": task}),
    )
    .await;
    assert_eq!(listed["result"]["configs"][0]["url"], url, "{listed}");
    // Deliveries are tried, fail to resolve, and are retried; the gateway stays healthy.
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = gw.metrics().await;
        if pushed(&metrics, "retried") >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(pushed(&metrics, "retried") >= 1.0, "{metrics}");
    let done = wait_for_state_as(&gw, "alice", &task, "TASK_STATE_COMPLETED").await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED");
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let gw = push_gateway().await;
    // 127.0.0.2 is loopback too, and not in the allow-list.
    let target = Receiver::start("127.0.0.2", Answer::Ok).await;
    let redirecting = Receiver::start("127.0.0.1", Answer::Redirect(target.url.clone())).await;
    let task = slow_task(&gw, 0.1).await;
    let r = as_alice(
        &gw,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "url": redirecting.url}),
    )
    .await;
    assert!(r.get("result").is_some(), "{r}");
    redirecting.wait_final().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(target.got().is_empty(), "the redirect was followed");
    // A redirect is an answer, not a failure to retry: each notification went once.
    let got = redirecting.got();
    let distinct: std::collections::HashSet<_> = got.iter().map(|g| g.raw.clone()).collect();
    assert_eq!(distinct.len(), got.len());
}

/// Push through upstream SDK agents: one that pushes (the gateway registers its own
/// webhook there and relays), one that does not (the gateway follows the task).
#[tokio::test]
async fn push_through_upstream_sdk_agents_with_and_without_push() {
    let pushing = python_agent_with("1.0,0.3", &["--push"]).await;
    let plain = python_agent_with("1.0,0.3", &[]).await;
    let gw = gateway(
        &[
            ("echo.toml", ECHO),
            (
                "pushing.toml",
                &upstream_agent("pushing", &pushing.url(), ""),
            ),
            ("plain.toml", &upstream_agent("plain", &plain.url(), "")),
        ],
        SETTINGS,
    )
    .await;
    wait_healthy(&gw, &["pushing", "plain"]).await;
    for (agent, upstream) in [("pushing", &pushing), ("plain", &plain)] {
        let rx = Receiver::start("127.0.0.1", Answer::Ok).await;
        for version in ["1.0", "0.3"] {
            let (method, msg, config) = match version {
                "1.0" => (
                    "SendMessage",
                    message("/delay 0.5 relayed"),
                    json!({"returnImmediately": true, "taskPushNotificationConfig": {"url": rx.url, "token": "client-token"}}),
                ),
                _ => (
                    "message/send",
                    message_v03("/delay 0.5 relayed"),
                    json!({"blocking": false, "pushNotificationConfig": {"url": rx.url, "token": "client-token"}}),
                ),
            };
            let r = gw
                .client
                .post(gw.url(&format!("/a2a/agents/{agent}")))
                .header("A2A-Version", version)
                .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": msg, "configuration": config}}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap();
            let task = match version {
                "1.0" => r["result"]["task"]["id"].clone(),
                _ => r["result"]["id"].clone(),
            };
            let task = task
                .as_str()
                .unwrap_or_else(|| panic!("{agent} {version}: {r}"))
                .to_string();
            let got = rx
                .wait(&format!("{agent} over {version}"), |got| {
                    got.iter().any(|g| {
                        final_state(&g.body).is_some()
                            && (g.body["id"] == task.as_str()
                                || g.body["statusUpdate"]["taskId"] == task.as_str()
                                || g.body["task"]["id"] == task.as_str())
                    })
                })
                .await;
            assert!(got
                .iter()
                .all(|g| g.header("X-A2A-Notification-Token") == Some("client-token")));
            // What the upstream was told: the gateway's own webhook, never the client's.
            let remote_id = task.split_once('.').unwrap().1;
            let configs = upstream_configs(upstream, remote_id).await;
            match agent {
                "pushing" => {
                    let urls: Vec<_> = configs
                        .iter()
                        .map(|c| c["url"].as_str().unwrap_or("").to_string())
                        .collect();
                    assert_eq!(urls.len(), 1, "{configs:?}");
                    assert!(urls[0].starts_with(&gw.url("/a2a/push/")), "{urls:?}");
                }
                _ => assert!(configs.is_empty(), "{configs:?}"),
            }
            rx.got.lock().unwrap().clear();
        }
    }
    // A forged notification to the gateway's webhook is refused.
    let r = gw
        .client
        .post(gw.url("/a2a/push/not-a-secret"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// The push configs the upstream holds for its task (empty when it has no push).
async fn upstream_configs(upstream: &crate::peers::Peer, id: &str) -> Vec<Value> {
    let r: Value = crate::helpers::client()
        .post(upstream.url())
        .header("A2A-Version", "1.0")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ListTaskPushNotificationConfigs", "params": {"taskId": id}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    r["result"]["configs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn wait_healthy(gw: &TestGateway, agents: &[&str]) {
    for _ in 0..100 {
        let h = gw.get_json("/a2a/health").await;
        if agents.iter().all(|a| h["agents"][a] == "healthy") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{agents:?} never became healthy");
}

/// Polls GetTask as `key` until the task is in `state`.
async fn wait_for_state_as(gw: &TestGateway, key: &str, task: &str, state: &str) -> Value {
    for _ in 0..200 {
        let r = call(gw, key, Some("1.0"), "GetTask", json!({"id": task})).await;
        if r["result"]["status"]["state"] == state {
            return r["result"].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("task {task} never reached {state}");
}

/// Configs are kept in the durable store; a task a crash failed tells its configs so.
#[tokio::test]
async fn configs_survive_a_restart_and_a_task_lost_to_it_is_notified() {
    let rx = Receiver::start("127.0.0.1", Answer::Ok).await;
    let mut gw = crate::running::Running::start(
        &[("echo.toml", ECHO)],
        "default_agent = \"echo\"\n[store]\nkind = \"sqlite\"\ndata_dir = \"data\"\n[push]\nenabled = true\nallow_http = true\nallow = [\"127.0.0.1\"]\n",
        "info",
    );
    let task = gw
        .send_task(
            "/delay 30 x",
            json!({"returnImmediately": true, "taskPushNotificationConfig": {"id": "kept", "url": rx.url}}),
        )
        .await;
    let id = task["id"].as_str().unwrap().to_string();
    rx.wait("the task as it started", |got| !got.is_empty())
        .await;
    // Past the commit interval: on disk.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.kill_hard();
    gw.restart();
    let kept = gw
        .call(
            "/a2a",
            "GetTaskPushNotificationConfig",
            json!({"taskId": id, "id": "kept"}),
        )
        .await;
    assert_eq!(kept["result"]["url"], rx.url, "{kept}");
    let got = rx.wait_final().await;
    let last = &got.last().unwrap().body;
    assert_eq!(
        state_of(last).as_deref(),
        Some("TASK_STATE_FAILED"),
        "{last}"
    );
    assert_eq!(last["task"]["id"], id);
}

#[test]
fn bad_push_settings_are_load_errors() {
    let errors = crate::helpers::load_errors(
        &[("echo.toml", ECHO)],
        "[push]\nenabled = true\nallow = [\"10.0.0.0/33\", \"not a host!\", \"2130706433\"]\ntimeout_secs = 0\nmax_attempts = 0\nmax_queued_per_config = 1\nrelay_url = \"ftp://x\"\n",
    );
    for want in [
        "push.allow: \"10.0.0.0/33\"",
        "push.allow: \"not a host!\"",
        "push.allow: \"2130706433\"",
        "push.timeout_secs must be between 1 and 300",
        "push.max_attempts must be between 1 and 100",
        "push.max_queued_per_config must be between 2 and 100000",
        "push.relay_url must be an absolute http(s) URL",
    ] {
        assert!(errors.contains(want), "{want} not in:\n{errors}");
    }
    let errors = crate::helpers::load_errors(&[("echo.toml", ECHO)], "[push]\nenable = true\n");
    assert!(errors.contains("enable"), "{errors}");
}

/// With replicas on Redis, a config made through one replica for a task another runs is
/// read, listed and deleted through any, and the task's updates reach it.
#[tokio::test]
async fn replicas_share_configs_and_notify_tasks_another_replica_runs() {
    use crate::replicas::{redis_url, replicas_with, Prefix};
    let url = redis_url();
    let prefix = Prefix::new(url);
    let rx = Receiver::start("127.0.0.1", Answer::Ok).await;
    let gws = replicas_with(
        url,
        &prefix.prefix,
        2,
        "[push]\nenabled = true\nallow_http = true\nallow = [\"127.0.0.1\"]\n",
    );
    let (a, b) = (&gws[0], &gws[1]);
    let task = a
        .send_task("/delay 1 later", json!({"returnImmediately": true}))
        .await;
    let id = task["id"].as_str().unwrap().to_string();
    let made = b
        .call(
            "/a2a",
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "id": "on-b", "url": rx.url}),
        )
        .await;
    assert_eq!(made["result"]["id"], "on-b", "{made}");
    let listed = a
        .call(
            "/a2a",
            "ListTaskPushNotificationConfigs",
            json!({"taskId": id}),
        )
        .await;
    assert_eq!(listed["result"]["configs"][0]["id"], "on-b", "{listed}");
    let got = rx.wait_final().await;
    assert_eq!(
        state_of(&got.last().unwrap().body).as_deref(),
        Some("TASK_STATE_COMPLETED")
    );
    let deleted = a
        .call(
            "/a2a",
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": id, "id": "on-b"}),
        )
        .await;
    assert_eq!(deleted["result"], Value::Null, "{deleted}");
    let listed = b
        .call(
            "/a2a",
            "ListTaskPushNotificationConfigs",
            json!({"taskId": id}),
        )
        .await;
    assert_eq!(listed["result"]["configs"], json!([]), "{listed}");
}

/// `max_per_destination` caps the deliveries in flight to one host and port, whatever
/// the number of configs pointing there.
#[tokio::test]
async fn deliveries_in_flight_to_one_destination_are_capped() {
    let gw = gateway(
        &[("echo.toml", ECHO)],
        "[push]\nenabled = true\nallow_http = true\nallow = [\"127.0.0.1\"]\ntimeout_secs = 60\nmax_per_destination = 2\n",
    )
    .await;
    let hanging = Receiver::start("127.0.0.1", Answer::Hang).await;
    let task = gw.send_nonblocking(D::V10, "/delay 30 x").await;
    for i in 0..4 {
        let r = gw
            .call(
                "/a2a/agents/echo",
                D::V10,
                "CreateTaskPushNotificationConfig",
                json!({"taskId": task["id"], "id": format!("c{i}"), "url": format!("{}?{i}", hanging.url)}),
            )
            .await;
        assert!(r.body.get("result").is_some(), "{}", r.body);
    }
    // Only the first config's notification is queued yet (the task has not moved), so
    // move it: each config now has an update waiting.
    let cancel = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "CancelTask",
            json!({"id": task["id"]}),
        )
        .await;
    assert!(cancel.body.get("result").is_some(), "{}", cancel.body);
    hanging
        .wait("two deliveries in flight", |got| got.len() >= 2)
        .await;
    // The others wait for a slot: none arrives while the two hang.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(hanging.got().len(), 2, "{:?}", hanging.got());
}

/// 0.1 has one config per task and 0.3's SDKs name an unnamed config after its task:
/// setting again replaces it. A task's cap holds for configs given with follow-ups too.
#[tokio::test]
async fn unnamed_configs_replace_and_the_cap_holds_for_follow_ups() {
    let gw = push_gateway().await;
    let (a, b) = (
        Receiver::start("127.0.0.1", Answer::Ok).await,
        Receiver::start("127.0.0.1", Answer::Ok).await,
    );
    let name = format!("mine-{}", uuid::Uuid::new_v4());
    running_legacy_task(&gw, "alice", &name).await;
    for url in [&a.url, &b.url] {
        let set = call(
            &gw,
            "alice",
            None,
            "tasks/pushNotification/set",
            json!({"id": name, "pushNotificationConfig": {"url": url}}),
        )
        .await;
        assert!(set.get("result").is_some(), "{set}");
    }
    let got = call(
        &gw,
        "alice",
        None,
        "tasks/pushNotification/get",
        json!({"id": name}),
    )
    .await;
    assert_eq!(
        got["result"]["pushNotificationConfig"]["url"],
        b.url.as_str(),
        "{got}"
    );

    let task = slow_task(&gw, 30.0).await;
    for url in [&a.url, &b.url] {
        let set = call(
            &gw,
            "alice",
            None,
            "tasks/pushNotificationConfig/set",
            json!({"taskId": task, "pushNotificationConfig": {"url": url}}),
        )
        .await;
        assert_eq!(
            set["result"]["pushNotificationConfig"]["id"],
            task.as_str(),
            "{set}"
        );
    }
    let list = call(
        &gw,
        "alice",
        None,
        "tasks/pushNotificationConfig/list",
        json!({"id": task}),
    )
    .await;
    assert_eq!(list["result"].as_array().map(Vec::len), Some(1), "{list}");

    // Nine more fill the task's ten; a follow-up carrying an eleventh is refused before
    // it is sent.
    let asking = as_alice(
        &gw,
        "SendMessage",
        json!({"message": message("/input name?"), "configuration": {"returnImmediately": true}}),
    )
    .await;
    let asking = asking["result"]["task"]["id"].as_str().unwrap().to_string();
    for i in 0..10 {
        let r = as_alice(
            &gw,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": asking, "id": format!("c{i}"), "url": a.url}),
        )
        .await;
        assert!(r.get("result").is_some(), "{r}");
    }
    let mut answer = message("Ada");
    answer["taskId"] = json!(asking);
    let r = as_alice(
        &gw,
        "SendMessage",
        json!({"message": answer, "configuration": {"taskPushNotificationConfig": {"url": a.url}}}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum of 10"),
        "{r}"
    );
    let state = as_alice(&gw, "GetTask", json!({"id": asking})).await;
    assert_eq!(
        state["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "nothing was sent: {state}"
    );
}

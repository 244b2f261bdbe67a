//! A real load balancer in front of real replicas: the shipped `deploy/compose/nginx.conf`,
//! run by Debian's nginx, in front of three replicas of the real binary sharing one Redis
//! (as `deploy/compose.replicas.yaml` runs them). The test adapts the file for loopback by
//! substitution only: the `server gateway-N:8080` lines name the replicas' ports, `listen`
//! a free port, and logs and temporary files go to a directory of the test's own; the
//! location block is the shipped one, byte for byte.
//!
//! Covered through nginx: blocking and streamed sends (unbuffered: the first event arrives
//! while the task still runs), subscribe, cancel and push configs landing on other replicas
//! than the task's, a replica killed with SIGKILL under load (nothing answered is lost, only
//! calls the dead replica held fail, no message runs twice), and a rate allowance per
//! client address (the replicas trust nginx's network for X-Forwarded-For).
//!
//! nginx comes from `tests/deploy/nginx-env.sh` (installed with apt-get when missing and
//! running as root; otherwise the test fails saying so). Redis as in `replicas.rs`.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::helpers::{parse_sse, repo_root, rpc, D};
use crate::replicas::{redis_url, replicas_with, Prefix};
use crate::running::Running;

/// Runs `tests/deploy/nginx-env.sh` once: nginx's path.
fn nginx_bin() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        crate::helpers::provided_by(
            "tests/deploy/nginx-env.sh",
            "provide nginx for the load balancer tests",
        )
    })
}

/// The `location / { ... }` block of an nginx configuration.
fn location_block(conf: &str) -> &str {
    let start = conf.find("location / {").expect("a location / block");
    let end = conf[start..]
        .find("\n        }")
        .expect("the end of the location block");
    &conf[start..start + end]
}

/// The shipped nginx.conf for loopback: its upstream servers are `upstreams`
/// (`127.0.0.1:PORT`, as many as the file names), it listens on `port`, and it logs each
/// request's `X-Test-Id`, status and the replicas it tried to `dir/access.log`.
fn loopback_conf(shipped: &str, upstreams: &[String], port: u16, dir: &Path) -> String {
    let mut conf = shipped.to_string();
    for (i, upstream) in upstreams.iter().enumerate() {
        let from = format!("server gateway-{}:8080", i + 1);
        assert_eq!(
            conf.matches(&from).count(),
            1,
            "deploy/compose/nginx.conf: one `{from}` line expected"
        );
        conf = conf.replacen(&from, &format!("server {upstream}"), 1);
    }
    assert!(
        !conf.contains("server gateway-"),
        "deploy/compose/nginx.conf names more replicas than the test runs ({})",
        upstreams.len()
    );
    assert_eq!(
        conf.matches("listen 8080;").count(),
        1,
        "one `listen 8080;`"
    );
    conf = conf.replacen("listen 8080;", &format!("listen 127.0.0.1:{port};"), 1);
    let d = dir.display();
    let harness = format!(
        "http {{\n    # (test harness: the log and temporary files in the test's directory)\n    \
         log_format balancer '$http_x_test_id|$status|$upstream_addr|$upstream_status';\n    \
         access_log {d}/access.log balancer;\n    \
         client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n    \
         fastcgi_temp_path {d}/fastcgi;\n    uwsgi_temp_path {d}/uwsgi;\n    \
         scgi_temp_path {d}/scgi;\n"
    );
    assert_eq!(conf.matches("http {\n").count(), 1, "one `http {{` block");
    conf = conf.replacen("http {\n", &harness, 1);
    assert_eq!(
        location_block(&conf),
        location_block(shipped),
        "the location block must be the shipped one"
    );
    conf
}

/// One request as nginx logged it.
#[derive(Debug, Clone)]
struct Logged {
    status: String,
    /// Every replica nginx tried, in order (`127.0.0.1:PORT`).
    upstreams: Vec<String>,
}

/// nginx running the shipped configuration in front of replicas; stopped when dropped.
pub(crate) struct Nginx {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Nginx {
    pub(crate) fn start(replicas: &[Running]) -> Nginx {
        let nginx = nginx_bin();
        let shipped = std::fs::read_to_string(repo_root().join("deploy/compose/nginx.conf"))
            .expect("deploy/compose/nginx.conf");
        let dir = tempfile::tempdir().expect("temp dir");
        // nginx creates its temporary directories for its worker user.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let upstreams: Vec<String> = replicas.iter().map(replica_addr).collect();
        let port = crate::peers::free_port();
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(
            &conf_path,
            loopback_conf(&shipped, &upstreams, port, dir.path()),
        )
        .unwrap();
        let error_log = dir.path().join("error.log");
        let d = dir.path().display();
        // One process (no workers to outlive it), in the foreground.
        let globals = format!("daemon off; master_process off; pid {d}/nginx.pid;");
        let mut child = Command::new(nginx)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(&error_log)
            .args(["-g", &globals])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {nginx}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > deadline {
                panic!(
                    "nginx did not start (exit {exited:?}); its error log:\n{}",
                    std::fs::read_to_string(&error_log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Nginx { child, port, dir }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Every logged request with an `X-Test-Id`, by that id.
    fn log(&self) -> HashMap<String, Logged> {
        let text = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        // Only whole lines: a line nginx is still writing would name a replica by half its
        // address.
        let whole = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
        whole
            .lines()
            .filter_map(|line| {
                let mut parts = line.split('|');
                let tag = parts.next()?.to_string();
                let status = parts.next()?.to_string();
                // "127.0.0.1:1, 127.0.0.1:2" when nginx tried the next one.
                let upstreams = parts
                    .next()?
                    .split(',')
                    .map(|a| a.trim().to_string())
                    .filter(|a| a != "-")
                    .collect();
                (tag != "-").then_some((tag, Logged { status, upstreams }))
            })
            .collect()
    }

    /// [`Self::log`] once it holds every one of `tags` (nginx logs a request once it has
    /// answered it, so a client may read the answer first).
    async fn log_of(&self, tags: &[&str]) -> HashMap<String, Logged> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if tags.iter().all(|t| log.contains_key(*t)) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "nginx logged none of {:?}; its log: {log:?}; its error log:\n{}",
                tags.iter()
                    .filter(|t| !log.contains_key(**t))
                    .collect::<Vec<_>>(),
                self.error_log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The replicas that served the requests tagged `tags`, in order (the last one nginx
    /// tried for each).
    async fn served_by(&self, tags: &[&str]) -> Vec<String> {
        let log = self.log_of(tags).await;
        tags.iter()
            .map(|t| log[*t].upstreams.last().cloned().unwrap_or_default())
            .collect()
    }

    fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

/// `127.0.0.1:PORT` of a replica, as nginx's upstream names it.
fn replica_addr(gw: &Running) -> String {
    gw.base.trim_start_matches("http://").to_string()
}

/// A 1.0 JSON-RPC call through nginx, tagged for its access log.
async fn call(
    client: &reqwest::Client,
    nginx: &Nginx,
    tag: &str,
    method: &str,
    params: Value,
) -> reqwest::Response {
    client
        .post(nginx.url("/a2a"))
        .header("A2A-Version", "1.0")
        .header("Content-Type", "application/json")
        .header("X-Test-Id", tag)
        .body(rpc(method, params))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} ({tag}) through nginx: {e}"))
}

/// [`call`]'s JSON-RPC result (an error fails the test).
async fn result(
    client: &reqwest::Client,
    nginx: &Nginx,
    tag: &str,
    method: &str,
    params: Value,
) -> Value {
    let resp = call(client, nginx, tag, method, params).await;
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let body: Value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("{method} ({tag}): HTTP {status}, not JSON: {text}"));
    assert!(
        body.get("error").is_none() && status == 200,
        "{method} ({tag}): HTTP {status} {body}"
    );
    body["result"].clone()
}

fn state(task: &Value) -> &str {
    task["status"]["state"].as_str().unwrap_or("")
}

/// The state an SSE event of a 1.0 stream reports.
fn event_state(event: &Value) -> &str {
    let r = &event["result"];
    r["statusUpdate"]["status"]["state"]
        .as_str()
        .or(r["task"]["status"]["state"].as_str())
        .unwrap_or("")
}

/// Webhook receiver on 127.0.0.1: every body it got.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Value>>>,
    handle: actix_web::dev::ServerHandle,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
    }
}

impl Receiver {
    fn start() -> Receiver {
        let got: Arc<Mutex<Vec<Value>>> = Arc::default();
        let sink = got.clone();
        let server = HttpServer::new(move || {
            let sink = sink.clone();
            App::new().default_service(web::to(move |body: web::Bytes| {
                let sink = sink.clone();
                async move {
                    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    sink.lock().unwrap().push(body);
                    HttpResponse::Ok().finish()
                }
            }))
        })
        .workers(1)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .expect("receiver bind");
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Receiver {
            url: format!("http://127.0.0.1:{port}/hook"),
            got,
            handle,
        }
    }

    /// Waits (20 s at most) for a notification that the task reached a final state.
    async fn wait_final(&self) -> Vec<Value> {
        for _ in 0..400 {
            let got = self.got.lock().unwrap().clone();
            if got.iter().any(|b| {
                let s = b["statusUpdate"]["status"]["state"]
                    .as_str()
                    .or(b["task"]["status"]["state"].as_str());
                matches!(
                    s,
                    Some("TASK_STATE_COMPLETED" | "TASK_STATE_FAILED" | "TASK_STATE_CANCELED")
                )
            }) {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no final notification: {:?}", self.got.lock().unwrap());
    }
}

const PUSH: &str = "[push]\nenabled = true\nallow_http = true\nallow = [\"127.0.0.1\"]\n";

#[tokio::test]
async fn sends_streams_subscriptions_cancels_and_push_configs_cross_replicas_through_nginx() {
    let url = redis_url();
    let prefix = Prefix::new(url);
    let gws = replicas_with(url, &prefix.prefix, 3, PUSH);
    let nginx = Nginx::start(&gws);
    let client = crate::helpers::client();

    // A blocking send, read back through nginx from the next replica.
    let sent = result(
        &client,
        &nginx,
        "send",
        "SendMessage",
        json!({"message": D::V10.message("hello")}),
    )
    .await;
    let task = &sent["task"];
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{sent}");
    let id = task["id"].as_str().unwrap().to_string();
    let got = result(&client, &nginx, "get", "GetTask", json!({"id": id})).await;
    assert_eq!(got["id"], id.as_str(), "{got}");
    assert_eq!(state(&got), "TASK_STATE_COMPLETED");
    let by = nginx.served_by(&["send", "get"]).await;
    assert_ne!(
        by[0], by[1],
        "nginx sent the read to the replica that made the task"
    );

    // A streamed send: the first event arrives while the task still runs (nothing buffers
    // it), read from another replica as working, and the stream ends with the task. (Its
    // task and the next one run long enough for a loaded machine to ask in time.)
    let resp = call(
        &client,
        &nginx,
        "stream",
        "SendStreamingMessage",
        json!({"message": D::V10.message("/delay 4 streamed")}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    // Until a whole event with data: a keep-alive comment may come first.
    let whole = |text: &str| {
        let text = text.replace("\r\n", "\n");
        parse_sse(&text[..text.rfind("\n\n").map_or(0, |at| at + 2)])
    };
    while whole(&text).is_empty() {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("no first event within 10 s")
            .expect("the stream ended before its first event")
            .expect("chunk");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let first = whole(&text).remove(0).data;
    let streamed = first["result"]["task"]["id"]
        .as_str()
        .or(first["result"]["statusUpdate"]["taskId"].as_str())
        .unwrap_or_else(|| panic!("no task id in the first event {first}"))
        .to_string();
    let meanwhile = result(
        &client,
        &nginx,
        "stream-get",
        "GetTask",
        json!({"id": streamed}),
    )
    .await;
    assert!(
        matches!(
            state(&meanwhile),
            "TASK_STATE_SUBMITTED" | "TASK_STATE_WORKING"
        ),
        "the first event arrived only once the task had ended: {meanwhile}"
    );
    let read_rest = async {
        while let Some(chunk) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
        }
    };
    tokio::time::timeout(Duration::from_secs(15), read_rest)
        .await
        .expect("the stream did not end");
    let events = parse_sse(&text);
    assert_eq!(
        event_state(&events.last().unwrap().data),
        "TASK_STATE_COMPLETED",
        "{events:?}"
    );

    // Subscribed to through another replica than the one running it.
    let running = result(
        &client,
        &nginx,
        "watched",
        "SendMessage",
        json!({"message": D::V10.message("/delay 4 watched"),
               "configuration": {"returnImmediately": true}}),
    )
    .await;
    let wid = running["task"]["id"].as_str().unwrap().to_string();
    let resp = call(
        &client,
        &nginx,
        "subscribe",
        "SubscribeToTask",
        json!({"id": wid}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let events = parse_sse(&resp.text().await.unwrap());
    assert_eq!(
        event_state(&events.last().expect("events").data),
        "TASK_STATE_COMPLETED",
        "{events:?}"
    );
    let by = nginx.served_by(&["watched", "subscribe"]).await;
    assert_ne!(
        by[0], by[1],
        "the subscription reached the task's own replica"
    );

    // Canceled through another replica than the one running it.
    let long = result(
        &client,
        &nginx,
        "long",
        "SendMessage",
        json!({"message": D::V10.message("/delay 30 long"),
               "configuration": {"returnImmediately": true}}),
    )
    .await;
    let lid = long["task"]["id"].as_str().unwrap().to_string();
    let canceled = result(&client, &nginx, "cancel", "CancelTask", json!({"id": lid})).await;
    assert_eq!(state(&canceled), "TASK_STATE_CANCELED", "{canceled}");
    let got = result(&client, &nginx, "cancel-get", "GetTask", json!({"id": lid})).await;
    assert_eq!(state(&got), "TASK_STATE_CANCELED", "{got}");
    let by = nginx.served_by(&["long", "cancel"]).await;
    assert_ne!(by[0], by[1], "the cancel reached the task's own replica");

    // Push configs: made, read, listed and deleted through different replicas; the
    // notifications come whichever replica runs the task.
    let rx = Receiver::start();
    let pushed = result(
        &client,
        &nginx,
        "push-send",
        "SendMessage",
        json!({"message": D::V10.message("/delay 1 pushed"),
               "configuration": {"returnImmediately": true}}),
    )
    .await;
    let pid = pushed["task"]["id"].as_str().unwrap().to_string();
    let made = result(
        &client,
        &nginx,
        "push-create",
        "CreateTaskPushNotificationConfig",
        json!({"taskId": pid, "id": "hook", "url": rx.url}),
    )
    .await;
    assert_eq!(made["id"], "hook", "{made}");
    let read = result(
        &client,
        &nginx,
        "push-get",
        "GetTaskPushNotificationConfig",
        json!({"taskId": pid, "id": "hook"}),
    )
    .await;
    assert_eq!(read["url"], rx.url.as_str(), "{read}");
    let listed = result(
        &client,
        &nginx,
        "push-list",
        "ListTaskPushNotificationConfigs",
        json!({"taskId": pid}),
    )
    .await;
    assert_eq!(listed["configs"][0]["id"], "hook", "{listed}");
    let got = rx.wait_final().await;
    let last = got.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"]
            .as_str()
            .or(last["task"]["status"]["state"].as_str()),
        Some("TASK_STATE_COMPLETED"),
        "{got:?}"
    );
    let deleted = result(
        &client,
        &nginx,
        "push-delete",
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": pid, "id": "hook"}),
    )
    .await;
    assert_eq!(deleted, Value::Null);
    let listed = result(
        &client,
        &nginx,
        "push-list-again",
        "ListTaskPushNotificationConfigs",
        json!({"taskId": pid}),
    )
    .await;
    assert_eq!(listed["configs"], json!([]), "{listed}");
    let by = nginx
        .served_by(&["push-send", "push-create", "push-get", "push-list"])
        .await;
    assert_eq!(
        by.iter().collect::<HashSet<_>>().len(),
        3,
        "the push calls went to every replica: {by:?}"
    );
    let everyone: HashSet<String> = nginx
        .log_of(&["push-list-again"])
        .await
        .values()
        .flat_map(|l| l.upstreams.clone())
        .collect();
    let replicas: HashSet<String> = gws.iter().map(replica_addr).collect();
    assert!(
        replicas.is_subset(&everyone),
        "every replica served: replicas {replicas:?}, nginx's upstreams {everyone:?}"
    );
}

/// What one send through nginx came to.
#[derive(Debug, Clone)]
struct Outcome {
    message_id: String,
    answered: Instant,
    /// The task's id and state, or what went wrong.
    result: Result<(String, String), String>,
}

/// A blocking `SendMessage` through nginx, tagged with its messageId.
async fn send_through(client: &reqwest::Client, url: &str, text: &str) -> Outcome {
    let message_id = uuid::Uuid::new_v4().to_string();
    let message = D::V10.message_with_id(text, &message_id);
    let sent = client
        .post(url)
        .header("A2A-Version", "1.0")
        .header("Content-Type", "application/json")
        .header("X-Test-Id", &message_id)
        .body(rpc("SendMessage", json!({"message": message})))
        .send()
        .await;
    let result = async {
        let resp = sent.map_err(|e| format!("transport: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp.text().await.map_err(|e| format!("body: {e}"))?;
        if status != 200 {
            return Err(format!(
                "HTTP {status}: {}",
                body.chars().take(200).collect::<String>()
            ));
        }
        let v: Value = serde_json::from_str(&body).map_err(|_| format!("not JSON: {body}"))?;
        if let Some(e) = v.get("error") {
            return Err(format!("JSON-RPC error {e}"));
        }
        let task = &v["result"]["task"];
        Ok((
            task["id"].as_str().unwrap_or_default().to_string(),
            state(task).to_string(),
        ))
    }
    .await;
    Outcome {
        message_id,
        answered: Instant::now(),
        result,
    }
}

/// Every task ListTasks lists through nginx, on one page: (id, messageId of its first
/// message, state).
async fn list_all(client: &reqwest::Client, nginx: &Nginx) -> Vec<(String, String, String)> {
    let listed = result(client, nginx, "list", "ListTasks", json!({"pageSize": 100})).await;
    let tasks = listed["tasks"].as_array().expect("tasks");
    assert_eq!(
        (
            listed["nextPageToken"].as_str(),
            listed["totalSize"].as_u64()
        ),
        (Some(""), Some(tasks.len() as u64)),
        "every task on one page: {}",
        listed["totalSize"]
    );
    tasks
        .iter()
        .map(|t| {
            (
                t["id"].as_str().unwrap_or_default().to_string(),
                t["history"][0]["messageId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                state(t).to_string(),
            )
        })
        .collect()
}

/// SIGKILL of one replica while clients send through nginx: every answered task is still
/// read through nginx, only calls the dead replica held fail (nginx passes a call on only
/// when its connection failed before it went out), and no message runs twice.
#[tokio::test]
async fn a_replica_killed_under_load_loses_no_answer_and_runs_no_send_twice() {
    let url = redis_url();
    let prefix = Prefix::new(url);
    let mut gws = replicas_with(url, &prefix.prefix, 3, "");
    let nginx = Nginx::start(&gws);
    let send_url = nginx.url("/a2a");
    let client = || {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    };

    // One long send held by each replica (round robin: three in a row reach all three),
    // so whichever replica dies holds one.
    let mut holders = Vec::new();
    for k in 0..3 {
        let (c, url) = (client(), send_url.clone());
        holders.push(tokio::spawn(async move {
            send_through(&c, &url, &format!("/delay 3 held {k}")).await
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Load: six clients, two of them sending tasks that take a second. At most 4 x 18 +
    // 2 x 4 + 3 = 83 sends: ListTasks then holds every task on one page.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for i in 0..6 {
        let (c, url, stop) = (client(), send_url.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            let (slow, most) = (i < 2, if i < 2 { 4 } else { 18 });
            for n in 0..most {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let text = if slow {
                    format!("/delay 1 client {i} send {n}")
                } else {
                    format!("client {i} send {n}")
                };
                outcomes.push(send_through(&c, &url, &text).await);
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            outcomes
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let victim = replica_addr(&gws[1]);
    let killed_at = Instant::now();
    gws[1].kill_hard();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut outcomes = Vec::new();
    for c in clients {
        outcomes.extend(c.await.unwrap());
    }
    let mut held = Vec::new();
    for h in holders {
        held.push(h.await.unwrap());
    }
    outcomes.extend(held.iter().cloned());

    // The three long sends went to three different replicas (the first each was sent to):
    // the dead one held one of them.
    let held_ids: Vec<&str> = held.iter().map(|o| o.message_id.as_str()).collect();
    let log = nginx.log_of(&held_ids).await;
    let held_by: Vec<&str> = held_ids
        .iter()
        .map(|t| log[*t].upstreams.first().map_or("", String::as_str))
        .collect();
    assert_eq!(
        held_by.iter().collect::<HashSet<_>>().len(),
        3,
        "the three long sends went to {held_by:?}"
    );
    let answered: Vec<&Outcome> = outcomes.iter().filter(|o| o.result.is_ok()).collect();
    let before = answered.iter().filter(|o| o.answered < killed_at).count();
    assert!(
        before > 0 && answered.len() > before,
        "sends answered before the kill: {before}, after: {}",
        answered.len() - before
    );

    // Every answered task is read back through nginx, as it was answered.
    let reader = client();
    let reads = futures_util::stream::iter(answered.iter().map(|o| {
        let (reader, nginx) = (&reader, &nginx);
        async move {
            let (id, answered_state) = o.result.clone().unwrap();
            assert_eq!(answered_state, "TASK_STATE_COMPLETED", "{o:?}");
            let tag = format!("read-{id}");
            let got = result(reader, nginx, &tag, "GetTask", json!({"id": id})).await;
            assert_eq!(got["id"], id.as_str(), "{got}");
            assert_eq!(state(&got), "TASK_STATE_COMPLETED", "{got}");
        }
    }))
    .buffer_unordered(8)
    .collect::<Vec<()>>();
    reads.await;

    // No message made two tasks: each send is one task at most, an answered one exactly its.
    // First wait until the tasks the dead replica was running have been failed by the
    // others (its lease expired): then nothing changes while the tasks are counted.
    let deadline = Instant::now() + Duration::from_secs(20);
    while list_all(&reader, &nginx)
        .await
        .iter()
        .any(|(_, _, s)| !matches!(s.as_str(), "TASK_STATE_COMPLETED" | "TASK_STATE_FAILED"))
    {
        assert!(
            Instant::now() < deadline,
            "the dead replica's tasks are still running"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tasks = list_all(&reader, &nginx).await;
    let mut per_message: HashMap<&str, Vec<&str>> = HashMap::new();
    for (id, message_id, _) in &tasks {
        per_message.entry(message_id).or_default().push(id);
    }
    let twice: Vec<_> = per_message
        .iter()
        .filter(|(_, ids)| ids.len() > 1)
        .collect();
    assert!(
        twice.is_empty(),
        "messages that made several tasks (a send run again on another replica): {twice:?}"
    );
    for o in &answered {
        let (id, _) = o.result.as_ref().unwrap();
        assert_eq!(
            per_message.get(o.message_id.as_str()),
            Some(&vec![id.as_str()]),
            "the task of {o:?}"
        );
    }
    assert!(tasks.len() <= outcomes.len(), "more tasks than sends");

    // Errors only on sends the dead replica held: nginx sent them there, and nowhere else.
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.result.is_err())
        .map(|o| o.message_id.as_str())
        .collect();
    let log = nginx.log_of(&failed).await;
    for o in outcomes.iter().filter(|o| o.result.is_err()) {
        let logged = &log[&o.message_id];
        assert_eq!(
            (logged.status.as_str(), logged.upstreams.as_slice()),
            ("502", std::slice::from_ref(&victim)),
            "a send failed ({:?}) that the dead replica {victim} did not hold alone",
            o.result
        );
    }
    // The long send the dead replica held at the kill failed; the others were answered.
    // Held: sent there last (a loaded nginx may pass on one it had not sent out before the
    // kill), and not answered before the kill (a starved test can kill it 3 s late).
    let held_by: Vec<&str> = held_ids
        .iter()
        .map(|t| log[*t].upstreams.last().map_or("", String::as_str))
        .collect();
    for (o, by) in held.iter().zip(&held_by) {
        let done_before = o.result.is_ok() && o.answered < killed_at;
        assert_eq!(
            o.result.is_err(),
            *by == victim && !done_before,
            "a long send held by {by} (the dead replica: {victim}; nginx sent it to {:?}): {o:?}",
            log[o.message_id.as_str()].upstreams
        );
    }
    println!(
        "{} sends, {} answered ({before} before the kill), {} failed on the dead replica, {} tasks",
        outcomes.len(),
        answered.len(),
        failed.len(),
        tasks.len()
    );
}

/// A send through nginx from `client`: X-RateLimit-Remaining, or "429".
async fn remaining(client: &reqwest::Client, nginx: &Nginx) -> String {
    let resp = client
        .post(nginx.url("/a2a"))
        .header("A2A-Version", "1.0")
        .body(rpc(
            "SendMessage",
            json!({"message": D::V10.message("counted")}),
        ))
        .send()
        .await
        .unwrap();
    if resp.status() == 429 {
        return "429".into();
    }
    assert_eq!(resp.status(), 200);
    resp.headers()["x-ratelimit-remaining"]
        .to_str()
        .unwrap()
        .to_string()
}

/// Through nginx, callers at two addresses have an allowance each once the replicas trust
/// nginx's network (a CIDR) for X-Forwarded-For; without it they share nginx's one.
#[tokio::test]
async fn callers_at_two_addresses_get_an_allowance_each_through_nginx() {
    let url = redis_url();
    let tier = "[rate_limits.tiers.default]\nrequests_per_minute = 60\nburst = 3\n";
    let (first, second) = (
        crate::helpers::client_from("127.0.0.1"),
        crate::helpers::client_from("127.0.0.2"),
    );

    let prefix = Prefix::new(url);
    let trusting =
        format!("[rate_limits]\ntrusted_proxies = [\"127.0.0.1/32\", \"fd00::/8\"]\n{tier}");
    let gws = replicas_with(url, &prefix.prefix, 3, &trusting);
    let nginx = Nginx::start(&gws);
    let mut seen = Vec::new();
    for client in [
        &first, &first, &first, &first, &second, &second, &second, &second,
    ] {
        seen.push(remaining(client, &nginx).await);
    }
    assert_eq!(
        seen,
        ["2", "1", "0", "429", "2", "1", "0", "429"],
        "127.0.0.1, then 127.0.0.2, each with an allowance of 3 across the replicas"
    );
    drop((nginx, gws));

    // The same without trusted_proxies: every caller is nginx, with one allowance.
    let prefix = Prefix::new(url);
    let gws = replicas_with(url, &prefix.prefix, 3, tier);
    let nginx = Nginx::start(&gws);
    let mut seen = Vec::new();
    for client in [&first, &first, &second, &second] {
        seen.push(remaining(client, &nginx).await);
    }
    assert_eq!(seen, ["2", "1", "0", "429"], "one allowance for both");
}

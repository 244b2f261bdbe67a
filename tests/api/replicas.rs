//! Three replicas of the real binary sharing one Redis, or one PostgreSQL schema, act as one gateway: a task made
//! through one is read, listed, canceled, continued and watched through the others; a
//! replica killed mid-stream has its tasks failed by the survivors; a Redis that goes away
//! makes requests answer 503 and readiness fail, and comes back by itself.
//!
//! Redis: the one `REDIS_URL` names (default redis://127.0.0.1:6379), under a key prefix
//! of this run's own (only those keys are ever deleted, never a FLUSH); if none answers,
//! a `redis-server` from PATH on a free port.

use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::{D, ECHO};
use crate::running::Running;

/// A Redis server the tests may use, and whether this run started it.
struct TestRedis {
    url: String,
    _server: Option<RedisServer>,
}

static REDIS: OnceLock<TestRedis> = OnceLock::new();

fn answers(url: &str) -> bool {
    redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_ok()
}

pub fn redis_url() -> &'static str {
    &REDIS
        .get_or_init(|| {
            let url =
                std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
            if answers(&url) {
                return TestRedis { url, _server: None };
            }
            let server = RedisServer::start(free_port());
            TestRedis {
                url: server.url(),
                _server: Some(server),
            }
        })
        .url
}

/// A `redis-server` of the test's own, on `port`, keeping nothing on disk (unless told).
pub(crate) struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    pub(crate) fn start(port: u16) -> RedisServer {
        RedisServer::start_with(port, &["--appendonly", "no"])
    }

    /// With `args` after the port's (`--appendonly yes --dir …` to keep what it is told).
    pub(crate) fn start_with(port: u16, args: &[&str]) -> RedisServer {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--save", ""])
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "no Redis answers at REDIS_URL (default redis://127.0.0.1:6379) and redis-server cannot be started ({e}): install it (apt-get install redis-server) or set REDIS_URL"
                )
            });
        let server = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !answers(&server.url()) {
            assert!(
                Instant::now() < deadline,
                "redis-server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends the server `signal` (`STOP`, `CONT`).
    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} redis-server");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Deletes this test's keys (and only those) when dropped.
pub struct Prefix {
    url: String,
    pub prefix: String,
}

impl Prefix {
    pub fn new(url: &str) -> Prefix {
        Prefix {
            url: url.to_string(),
            prefix: format!("a2a-test-{}:", uuid::Uuid::new_v4()),
        }
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        let Ok(mut c) = redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection())
        else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut c)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut c);
        }
    }
}

pub(crate) fn config(url: &str, prefix: &str) -> String {
    format!(
        "default_agent = \"echo\"\n[store]\nkind = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\nlease_secs = 2\n"
    )
}

fn replicas(url: &str, prefix: &str, n: usize) -> Vec<Running> {
    replicas_with(url, prefix, n, "")
}

pub fn replicas_with(url: &str, prefix: &str, n: usize, extra: &str) -> Vec<Running> {
    let gateway = format!("{}\n{extra}\n", config(url, prefix));
    (0..n)
        .map(|_| Running::start(&[("echo.toml", ECHO)], &gateway, "info"))
        .collect()
}

/// Where a test's replicas share their state: a key prefix of its own in Redis, or a schema
/// of its own in PostgreSQL (`shared = true`); deleted when the test ends.
pub enum Fleet {
    Redis(Prefix),
    Postgres(crate::postgres::Schema),
}

impl Fleet {
    pub fn redis() -> Fleet {
        Fleet::Redis(Prefix::new(redis_url()))
    }

    pub fn postgres() -> Fleet {
        Fleet::Postgres(crate::postgres::Schema::new())
    }

    /// The gateway file's lines: the echo agent by default, and the store.
    pub fn config(&self) -> String {
        match self {
            Fleet::Redis(prefix) => config(redis_url(), &prefix.prefix),
            Fleet::Postgres(schema) => format!(
                "default_agent = \"echo\"\n{}shared = true\nlease_secs = 2\n",
                crate::postgres::store_lines(schema)
            ),
        }
    }

    /// The replica holding the push following of `task`, if any (the store's own record).
    pub fn push_holder(&self, task: &str) -> Option<String> {
        match self {
            Fleet::Redis(prefix) => {
                let mut c = redis::Client::open(redis_url())
                    .and_then(|c| c.get_connection())
                    .expect("redis");
                redis::cmd("HGET")
                    .arg(format!("{}push:holder", prefix.prefix))
                    .arg(task)
                    .query(&mut c)
                    .expect("HGET")
            }
            Fleet::Postgres(schema) => {
                let sql = format!(
                    "SELECT holder FROM \"{}\".push_holds WHERE task = $1",
                    schema.0
                );
                let task = task.to_string();
                crate::postgres::sql(move |c| c.query_opt(&sql, &[&task]).unwrap())
                    .map(|row| row.get(0))
            }
        }
    }

    /// Makes `replica` the holder of `task`'s push following in the store, as an adoption
    /// whose answer was lost leaves it: held there, followed by nobody there.
    pub fn set_push_holder(&self, task: &str, replica: &str) {
        match self {
            Fleet::Redis(prefix) => {
                let mut c = redis::Client::open(redis_url())
                    .and_then(|c| c.get_connection())
                    .expect("redis");
                let p = &prefix.prefix;
                redis::pipe()
                    .cmd("HSET")
                    .arg(format!("{p}push:holder"))
                    .arg(task)
                    .arg(replica)
                    .cmd("SADD")
                    .arg(format!("{p}push:following:{replica}"))
                    .arg(task)
                    .query::<()>(&mut c)
                    .expect("HSET, SADD");
            }
            Fleet::Postgres(schema) => {
                let sql = format!(
                    "UPDATE \"{}\".push_holds SET holder = $2 WHERE task = $1",
                    schema.0
                );
                let (task, replica) = (task.to_string(), replica.to_string());
                let n = crate::postgres::sql(move |c| c.execute(&sql, &[&task, &replica]).unwrap());
                assert_eq!(n, 1, "the task has a hold");
            }
        }
    }

    /// A replica of another build of the gateway (`binary`) serving the echo agent.
    pub fn replica_of(&self, binary: &std::path::Path) -> Running {
        Running::start_binary(binary, &[("echo.toml", ECHO)], &self.config(), "info")
    }

    /// `n` replicas serving the echo agent, with `extra` lines in their gateway file.
    pub fn replicas(&self, n: usize, extra: &str) -> Vec<Running> {
        let gateway = format!("{}\n{extra}\n", self.config());
        (0..n)
            .map(|_| Running::start(&[("echo.toml", ECHO)], &gateway, "info"))
            .collect()
    }
}

on_both_stores!(
    a_task_made_through_one_replica_is_read_listed_watched_and_canceled_through_the_others,
    a_follow_up_through_another_replica_reaches_the_one_waiting_for_it,
    a_replica_killed_mid_stream_has_its_tasks_failed_by_the_survivors,
    rate_limits_are_one_allowance_across_replicas,
    a_callers_open_streams_are_capped_across_replicas,
    a_task_its_replica_evicted_from_memory_is_still_read_from_the_store,
    upstream_task_owners_and_0_3_task_lists_are_shared_between_replicas,
);

pub(crate) fn state(task: &Value) -> &str {
    task["status"]["state"].as_str().unwrap_or("")
}

/// The SSE events of a stream, read until it ends.
pub(crate) async fn events(gw: &Running, method: &str, params: Value) -> Vec<Value> {
    let accept = [("Accept", "text/event-stream")];
    let text = gw
        .post("/a2a", method, params, &accept)
        .await
        .text()
        .await
        .unwrap();
    crate::helpers::parse_sse(&text)
        .into_iter()
        .map(|e| e.data)
        .collect()
}

async fn a_task_made_through_one_replica_is_read_listed_watched_and_canceled_through_the_others(
    fleet: Fleet,
) {
    let gws = fleet.replicas(3, "");
    let (a, b, c) = (&gws[0], &gws[1], &gws[2]);

    // Made on A, read on B and C at once (A answered only once the task was shared).
    let done = a.send_task("hello", json!({})).await;
    let id = done["id"].as_str().unwrap();
    for other in [b, c] {
        let got = other.call("/a2a", "GetTask", json!({"id": id})).await;
        assert_eq!(got["result"]["id"], id, "{got}");
        assert_eq!(state(&got["result"]), "TASK_STATE_COMPLETED");
    }
    // Listed through C with tasks made on B.
    let on_b = b.send_task("from b", json!({})).await;
    let list = c.call("/a2a", "ListTasks", json!({})).await;
    let ids: Vec<&str> = list["result"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [on_b["id"].as_str().unwrap(), id], "{list}");

    watched_across(a, b, "A → B").await;
    // Canceled through C; B reads it canceled.
    let lid = canceled_across(a, c, "A → C").await;
    let got = b.call("/a2a", "GetTask", json!({"id": lid})).await;
    assert_eq!(state(&got["result"]), "TASK_STATE_CANCELED", "{got}");
    // And canceling it again, anywhere, says it is finished.
    let again = b.call("/a2a", "CancelTask", json!({"id": lid})).await;
    assert_eq!(again["error"]["code"], -32002, "{again}");
}

/// A task left running on `a`, watched through `b` until it completes on `a` (`way` names
/// the two in a failure's message).
pub(crate) async fn watched_across(a: &Running, b: &Running, way: &str) {
    let running = a
        .send_task("/delay 1 later", json!({"returnImmediately": true}))
        .await;
    let watched = events(b, "SubscribeToTask", json!({"id": running["id"]})).await;
    let last = &watched.last().unwrap()["result"];
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{way}: {watched:?}"
    );
}

/// A task left running on `a`, canceled through `b`, read canceled on `a`: its id.
pub(crate) async fn canceled_across(a: &Running, b: &Running, way: &str) -> String {
    let long = a
        .send_task("/delay 30", json!({"returnImmediately": true}))
        .await;
    let id = long["id"].as_str().unwrap().to_string();
    let canceled = b.call("/a2a", "CancelTask", json!({"id": id})).await;
    assert_eq!(
        state(&canceled["result"]),
        "TASK_STATE_CANCELED",
        "{way}: {canceled}"
    );
    let got = a.call("/a2a", "GetTask", json!({"id": id})).await;
    assert_eq!(state(&got["result"]), "TASK_STATE_CANCELED", "{way}: {got}");
    id
}

/// A question asked on `a`, answered through `b`: the whole conversation is in the task,
/// readable through `a`.
pub(crate) async fn answered_across(a: &Running, b: &Running, way: &str) {
    let asked = a.send_task("/input your name?", json!({})).await;
    assert_eq!(state(&asked), "TASK_STATE_INPUT_REQUIRED", "{way}: {asked}");
    let mut answer = D::V10.message("Ada");
    answer["taskId"] = asked["id"].clone();
    answer["contextId"] = asked["contextId"].clone();
    let reply = b
        .call("/a2a", "SendMessage", json!({"message": answer}))
        .await;
    let task = &reply["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{way}: {reply}");
    assert_eq!(task["id"], asked["id"]);
    let got = a.call("/a2a", "GetTask", json!({"id": asked["id"]})).await;
    let history = got["result"]["history"].as_array().unwrap();
    assert!(
        history.iter().any(|m| m["parts"][0]["text"] == "Ada"),
        "{way}: {got}"
    );
}

async fn a_follow_up_through_another_replica_reaches_the_one_waiting_for_it(fleet: Fleet) {
    let gws = fleet.replicas(2, "");
    let (a, b) = (&gws[0], &gws[1]);
    answered_across(a, b, "A → B").await;

    // A streaming follow-up through B, of another question asked on A.
    let asked = a.send_task("/input again?", json!({})).await;
    let mut answer = D::V10.message("Grace");
    answer["taskId"] = asked["id"].clone();
    let streamed = events(b, "SendStreamingMessage", json!({"message": answer})).await;
    let last = &streamed.last().unwrap()["result"];
    let final_state = last["statusUpdate"]["status"]["state"]
        .as_str()
        .or(last["task"]["status"]["state"].as_str());
    assert_eq!(final_state, Some("TASK_STATE_COMPLETED"), "{streamed:?}");
}

async fn a_replica_killed_mid_stream_has_its_tasks_failed_by_the_survivors(fleet: Fleet) {
    let mut gws = fleet.replicas(2, "");
    let running = gws[0]
        .send_task("/delay 30", json!({"returnImmediately": true}))
        .await;
    let id = running["id"].as_str().unwrap().to_string();
    let watcher = {
        let b_url = gws[1].url("/a2a");
        let id = id.clone();
        tokio::spawn(async move {
            let resp = crate::helpers::client()
                .post(b_url)
                .header("A2A-Version", "1.0")
                .body(crate::helpers::rpc("SubscribeToTask", json!({"id": id})))
                .send()
                .await
                .unwrap();
            resp.text().await.unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    gws[0].kill_hard();
    let text = tokio::time::timeout(Duration::from_secs(15), watcher)
        .await
        .expect("the stream ends once the lease expires")
        .unwrap();
    let took = killed.elapsed();
    let last = crate::helpers::parse_sse(&text).pop().expect("events");
    let last = last.data;
    let status = &last["result"]["statusUpdate"]["status"];
    assert_eq!(status["state"], "TASK_STATE_FAILED", "{text}");
    assert!(
        status["message"]["parts"][0]["text"]
            .as_str()
            .unwrap()
            .contains("did not survive"),
        "{status}"
    );
    assert!(
        took < Duration::from_secs(8),
        "lease 2 s, failed after {took:?}"
    );
    let got = gws[1].call("/a2a", "GetTask", json!({"id": id})).await;
    assert_eq!(state(&got["result"]), "TASK_STATE_FAILED", "{got}");
}

/// A replica's running set (what survivors fail if it dies) holds its unfinished tasks: a
/// task answered at once is never in it, a running one is until it ends.
#[tokio::test]
async fn a_replicas_running_set_holds_its_unfinished_tasks_only() {
    let url = redis_url();
    let prefix = Prefix::new(url);
    let gw = &replicas(url, &prefix.prefix, 1)[0];
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    let mut running_set = || -> Vec<String> {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}running:*", prefix.prefix))
            .query(&mut c)
            .unwrap();
        let mut ids = Vec::new();
        for key in keys {
            let members: Vec<String> = redis::cmd("SMEMBERS").arg(key).query(&mut c).unwrap();
            ids.extend(members);
        }
        ids
    };
    let slow = gw
        .send_task("/delay 2", json!({"returnImmediately": true}))
        .await;
    let slow = slow["id"].as_str().unwrap().to_string();
    let quick = gw.send_task("at once", json!({})).await;
    assert_eq!(state(&quick), "TASK_STATE_COMPLETED");
    // Redis answers wait for their write: both are written by now.
    assert_eq!(running_set(), vec![slow.clone()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running_set().is_empty() {
        assert!(
            Instant::now() < deadline,
            "still running: {:?}",
            running_set()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = gw.call("/a2a", "GetTask", json!({"id": slow})).await;
    assert_eq!(state(&got["result"]), "TASK_STATE_COMPLETED", "{got}");
}

#[tokio::test]
async fn without_redis_calls_answer_503_and_readiness_fails_until_it_returns() {
    let port = free_port();
    let server = RedisServer::start(port);
    let url = server.url();
    let gw = Running::start(
        &[("echo.toml", ECHO)],
        &config(&url, "a2a-test-down:"),
        "info",
    );
    gw.send_task("while up", json!({})).await;
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = gw.client.get(gw.url("/a2a/ready")).send().await.unwrap();
        if ready.status() == 503 {
            let body: Value = ready.json().await.unwrap();
            assert_eq!(body["status"], "store_unavailable", "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "ready stayed 200 without Redis");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let resp = gw
        .post(
            "/a2a",
            "SendMessage",
            json!({"message": D::V10.message("while down")}),
            &[],
        )
        .await;
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().get("retry-after").is_some());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32052, "{body}");
    let health = gw.client.get(gw.url("/a2a/health")).send().await.unwrap();
    assert_eq!(health.status(), 200, "alive, if not ready");

    // Back on the same port: ready again and serving, without a restart.
    let _server = RedisServer::start(port);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ready = gw.client.get(gw.url("/a2a/ready")).send().await.unwrap();
        if ready.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ready again after Redis returned"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let task = gw.send_task("after", json!({})).await;
    assert_eq!(state(&task), "TASK_STATE_COMPLETED");
}

async fn rate_limits_are_one_allowance_across_replicas(fleet: Fleet) {
    let limits = "[rate_limits.agents.echo]\nrequests_per_minute = 60\nburst = 3";
    let gws = fleet.replicas(3, limits);
    let mut remaining = Vec::new();
    for gw in &gws {
        let resp = gw
            .post(
                "/a2a",
                "SendMessage",
                json!({"message": D::V10.message("x")}),
                &[],
            )
            .await;
        assert_eq!(resp.status(), 200);
        remaining.push(
            resp.headers()["x-ratelimit-remaining"]
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(
        remaining,
        ["2", "1", "0"],
        "one allowance, counted down across replicas"
    );
    for gw in &gws {
        let resp = gw
            .post(
                "/a2a",
                "SendMessage",
                json!({"message": D::V10.message("x")}),
                &[],
            )
            .await;
        assert_eq!(
            resp.status(),
            429,
            "every replica refuses once the allowance is spent"
        );
        assert!(resp.headers().get("retry-after").is_some());
    }
}

/// The official Python SDK client, each call of a conversation to another replica.
async fn sdk_client_across_replicas(dialect: &str) {
    let url = redis_url();
    let prefix = Prefix::new(url);
    let gws = replicas(url, &prefix.prefix, 3);
    let mut args = vec![crate::helpers::repo_root()
        .join("tests/interop/sdk_replicas.py")
        .display()
        .to_string()];
    for gw in &gws {
        args.push("--card-url".into());
        args.push(gw.url("/a2a/agents/echo/card"));
    }
    args.extend(["--dialect".into(), dialect.to_string()]);
    let python = crate::interop::python();
    let out = tokio::task::spawn_blocking(move || Command::new(python).args(&args).output())
        .await
        .unwrap()
        .expect("running the SDK client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("3 passed, 0 failed"),
        "Python SDK client across replicas over {dialect}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn python_sdk_client_across_replicas_over_1_0() {
    sdk_client_across_replicas("1.0").await;
}

#[tokio::test]
async fn python_sdk_client_across_replicas_over_0_3() {
    sdk_client_across_replicas("0.3").await;
}

async fn a_callers_open_streams_are_capped_across_replicas(fleet: Fleet) {
    let tier =
        "[rate_limits.tiers.default]\nrequests_per_minute = 6000\nburst = 100\nmax_streams = 1";
    let gws = fleet.replicas(2, tier);
    let (a, b) = (&gws[0], &gws[1]);
    let slow = a
        .send_task("/delay 30", json!({"returnImmediately": true}))
        .await;
    let watch = json!({"id": slow["id"]});
    let held = a.post("/a2a", "SubscribeToTask", watch.clone(), &[]).await;
    assert_eq!(held.status(), 200);
    let refused = b.post("/a2a", "SubscribeToTask", watch.clone(), &[]).await;
    assert_eq!(
        refused.status(),
        429,
        "the caller's one stream is open on the other replica"
    );
    // The first stream ends (its client leaves): the caller may open one anywhere again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let again = b.post("/a2a", "SubscribeToTask", watch.clone(), &[]).await;
        if again.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the closed stream still counts");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn a_task_its_replica_evicted_from_memory_is_still_read_from_the_store(fleet: Fleet) {
    let gws = fleet.replicas(1, "[limits]\nmax_tasks = 2");
    let first = gws[0].send_task("first", json!({})).await;
    for text in ["second", "third", "fourth"] {
        gws[0].send_task(text, json!({})).await;
    }
    let got = gws[0]
        .call("/a2a", "GetTask", json!({"id": first["id"]}))
        .await;
    assert_eq!(got["result"]["id"], first["id"], "{got}");
    let list = gws[0].call("/a2a", "ListTasks", json!({})).await;
    assert_eq!(list["result"]["totalSize"], 4, "{list}");
}

/// Who created an upstream agent's task through one replica is known to the others: its
/// creator reads it anywhere, another caller nowhere; and ListTasks of the 0.3 upstream
/// (answered from the gateway's record of what it relayed) lists what every replica relayed.
async fn upstream_task_owners_and_0_3_task_lists_are_shared_between_replicas(fleet: Fleet) {
    let peer = crate::peers::fault_server("legacy03", 0).await;
    let up = crate::peers::upstream_agent("up", &peer.url(), "");
    let gateway = format!(
        "{}\n[auth]\ndefault_access = \"authenticated\"\n[[auth.api_keys]]\nid = \"alice\"\nsecret_sha256 = \"{}\"\nagents = [\"*\"]\n[[auth.api_keys]]\nid = \"bob\"\nsecret_sha256 = \"{}\"\nagents = [\"*\"]\n",
        fleet.config(),
        crate::helpers::sha("alice-key"),
        crate::helpers::sha("bob-key")
    );
    let gws: Vec<Running> = (0..2)
        .map(|_| Running::start(&[("echo.toml", ECHO), ("up.toml", &up)], &gateway, "info"))
        .collect();
    let sent = gws[0]
        .call_as(
            "/a2a/agents/up",
            "alice-key",
            "SendMessage",
            json!({"message": D::V10.message("hi")}),
        )
        .await;
    let id = sent["result"]["task"]["id"].clone();
    assert!(id.is_string(), "{sent}");
    let alices = gws[1]
        .call_as("/a2a/agents/up", "alice-key", "GetTask", json!({"id": id}))
        .await;
    assert_eq!(alices["result"]["id"], id, "{alices}");
    let bobs = gws[1]
        .call_as("/a2a/agents/up", "bob-key", "GetTask", json!({"id": id}))
        .await;
    assert_eq!(bobs["error"]["code"], -32001, "{bobs}");

    let more = gws[1]
        .call_as(
            "/a2a/agents/up",
            "alice-key",
            "SendMessage",
            json!({"message": D::V10.message("again")}),
        )
        .await;
    let other = more["result"]["task"]["id"].clone();
    assert!(other.is_string(), "{more}");
    for gw in &gws {
        let listed = gw
            .call_as("/a2a/agents/up", "alice-key", "ListTasks", json!({}))
            .await;
        let mut ids: Vec<Value> = listed["result"]["tasks"]
            .as_array()
            .unwrap_or_else(|| panic!("{listed}"))
            .iter()
            .map(|t| t["id"].clone())
            .collect();
        ids.sort_by_key(|v| v.to_string());
        let mut want = vec![id.clone(), other.clone()];
        want.sort_by_key(|v| v.to_string());
        assert_eq!(ids, want, "{listed}");
        assert_eq!(listed["result"]["totalSize"], 2, "{listed}");
        let bobs = gw
            .call_as("/a2a/agents/up", "bob-key", "ListTasks", json!({}))
            .await;
        assert_eq!(bobs["result"]["tasks"], json!([]), "{bobs}");
    }
}

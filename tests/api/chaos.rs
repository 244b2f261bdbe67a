//! Chaos, bounded: the shipped nginx configuration in front of three replicas sharing a
//! store, under mixed load (blocking sends, sends left running, streams; most with a push
//! config), while one replica is killed (-9), the store restarts, and another replica
//! stalls past its lease (SIGSTOP, then SIGCONT). Then:
//! - no answered task is lost: each is read back through nginx, finished;
//! - each push config gets its task's final state exactly once, and no update twice, but
//!   for a final state delivered just before its follower was killed or stopped and sent
//!   again by its successor (nothing can tell the successor it arrived: counted, allowed);
//! - each stream ends with its task's final state, picked up with `Last-Event-ID` through
//!   whichever replica nginx picks when the one it was on went away.
//!
//! Run on each shared store, a server of the test's own restarted on its port mid-run:
//! Redis (appendonly, fsync always: the durable setting), killed; PostgreSQL (a cluster
//! made with `initdb` in a temporary directory, run as the `postgres` user), stopped in
//! immediate mode (as a crash: no checkpoint, recovered from its WAL at the next start).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::balancer::Nginx;
use crate::helpers::{rpc, D};
use crate::push::{state_of, Answer, Got, Receiver};
use crate::replicas::{config, RedisServer};
use crate::running::Running;

/// A delivery is given 10 s: one in flight from the replica stopped for 5 s must not time
/// out when it wakes (its answer came meanwhile), nor one to the receiver in this loaded
/// test process; a timed-out delivery is sent again, as it may not have arrived.
const PUSH: &str = "[push]\nenabled = true\nallow_http = true\nallow = [\"127.0.0.1\"]\n\
    timeout_secs = 10\ninitial_backoff_ms = 100\nmax_backoff_secs = 1\nretry_for_secs = 120\n";

const WORKERS: usize = 6;

/// The replicas' log: what push did with each task too, for a failure's message.
const LOG: &str = "info,a2a_gateway::push=debug,a2a_gateway::service::push=debug";

fn is_final(state: &str) -> bool {
    matches!(
        state,
        "TASK_STATE_COMPLETED"
            | "TASK_STATE_FAILED"
            | "TASK_STATE_CANCELED"
            | "TASK_STATE_REJECTED"
    )
}

/// The task a notification or stream event is about.
fn task_of(body: &Value) -> Option<&str> {
    body["task"]["id"]
        .as_str()
        .or(body["statusUpdate"]["taskId"].as_str())
        .or(body["artifactUpdate"]["taskId"].as_str())
}

/// What the load saw.
#[derive(Default)]
struct Seen {
    /// Tasks whose send was answered with a task.
    answered: Vec<String>,
    /// Those of them made with a push config.
    pushed: Vec<String>,
    /// Streams that started a task: its id, and how the stream ended ("" if it did not).
    streams: Vec<(String, String)>,
    /// Streams picked up again with `Last-Event-ID`.
    resumed: usize,
    /// Calls that got no answer, or an error (while a replica or the store was away).
    unanswered: usize,
}

struct Load {
    base: String,
    hook: String,
    stop: AtomicBool,
    seen: Mutex<Seen>,
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

impl Load {
    async fn call(&self, client: &reqwest::Client, method: &str, params: Value) -> Option<Value> {
        let resp = client
            .post(format!("{}/a2a", self.base))
            .header("A2A-Version", "1.0")
            .header("Content-Type", "application/json")
            .body(rpc(method, params))
            .send()
            .await
            .ok()?;
        resp.json::<Value>().await.ok()
    }

    /// A send with a push config (`wait`: blocking, else left running); the task it made.
    async fn send(&self, client: &reqwest::Client, text: &str, wait: bool) {
        let config =
            json!({"returnImmediately": !wait, "taskPushNotificationConfig": {"url": self.hook}});
        let params = json!({"message": D::V10.message(text), "configuration": config});
        let answer = self.call(client, "SendMessage", params).await;
        let id = answer
            .as_ref()
            .and_then(|a| a["result"]["task"]["id"].as_str());
        let mut seen = self.seen.lock().unwrap();
        match id {
            Some(id) => {
                seen.answered.push(id.to_string());
                seen.pushed.push(id.to_string());
            }
            None => seen.unanswered += 1,
        }
    }

    /// A streamed send, read to its task's final state: picked up with `Last-Event-ID`
    /// through nginx when the stream breaks first (within 40 s).
    async fn stream(&self, client: &reqwest::Client, text: &str) {
        self.stream_from(client, text, None).await
    }

    /// [`Load::stream`], started on `first` (a replica's base), counting in `started` once
    /// its task is under way.
    async fn stream_from(
        &self,
        client: &reqwest::Client,
        text: &str,
        first: Option<(&str, &AtomicUsize)>,
    ) {
        let deadline = Instant::now() + Duration::from_secs(40);
        let mut task: Option<String> = None;
        let mut last_id: Option<String> = None;
        let mut end = String::new();
        let mut attempts = 0;
        while end.is_empty() && Instant::now() < deadline {
            let request = match &task {
                None if attempts > 0 => break,
                None => client
                    .post(format!("{}/a2a", first.map_or(&*self.base, |f| f.0)))
                    .body(rpc(
                        "SendStreamingMessage",
                        json!({"message": D::V10.message(text)}),
                    )),
                Some(id) => {
                    self.seen.lock().unwrap().resumed += 1;
                    let mut r = client
                        .post(format!("{}/a2a", self.base))
                        .body(rpc("SubscribeToTask", json!({"id": id})));
                    if let Some(last) = &last_id {
                        r = r.header("Last-Event-ID", last);
                    }
                    r
                }
            };
            attempts += 1;
            let request = request
                .header("A2A-Version", "1.0")
                .header("Content-Type", "application/json")
                .header("Accept", "text/event-stream")
                .timeout(Duration::from_secs(30));
            if let Ok(resp) = request.send().await {
                let mut body = resp.bytes_stream();
                let mut text = String::new();
                while let Some(Ok(chunk)) = body.next().await {
                    text.push_str(&String::from_utf8_lossy(&chunk).replace("\r\n", "\n"));
                    while let Some(at) = text.find("\n\n") {
                        let block: String = text.drain(..at + 2).collect();
                        let (id, data) = sse_block(&block);
                        let Some(data) = data else { continue };
                        let result = &data["result"];
                        if task.is_none() {
                            task = task_of(result).map(str::to_string);
                            if let (Some(_), Some((_, started))) = (&task, first) {
                                started.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        if id.is_some() {
                            last_id = id;
                        }
                        if let Some(state) = state_of(result).filter(|s| is_final(s)) {
                            end = state;
                        }
                    }
                }
            }
            if end.is_empty() {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        let mut seen = self.seen.lock().unwrap();
        match task {
            Some(id) => {
                seen.answered.push(id.clone());
                seen.streams.push((id, end));
            }
            None => seen.unanswered += 1,
        }
    }

    async fn work(self: Arc<Self>, worker: usize) {
        let client = client();
        let mut i = 0;
        while !self.stop.load(Ordering::Relaxed) {
            match i % 3 {
                0 => {
                    self.send(&client, &format!("/delay 0.3 b{worker}-{i}"), true)
                        .await
                }
                1 => {
                    self.send(&client, &format!("/delay 1.5 r{worker}-{i}"), false)
                        .await
                }
                _ => {
                    self.stream(&client, &format!("/delay 1 s{worker}-{i}"))
                        .await
                }
            }
            i += 1;
        }
    }
}

/// One SSE block: its `id:` and its data as JSON.
fn sse_block(block: &str) -> (Option<String>, Option<Value>) {
    let mut id = None;
    let mut data = String::new();
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().to_string());
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push_str(d.trim_start());
        }
    }
    (id, serde_json::from_str(&data).ok())
}

/// The task as read through nginx once it finished (20 s at most): its state, or why not.
async fn final_state(base: &str, id: &str) -> String {
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let resp = client
            .post(format!("{base}/a2a"))
            .header("A2A-Version", "1.0")
            .header("Content-Type", "application/json")
            .body(rpc("GetTask", json!({"id": id})))
            .send()
            .await;
        let got = match resp {
            Ok(r) => r.json::<Value>().await.unwrap_or(Value::Null),
            Err(e) => json!({"error": {"message": e.to_string()}}),
        };
        let state = got["result"]["status"]["state"].as_str().unwrap_or("");
        if is_final(state) {
            return state.to_string();
        }
        if Instant::now() > deadline {
            return format!("not finished: {got}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The final notifications per task (with when each arrived and its notification id).
type Finals = HashMap<String, Vec<(String, Instant, String)>>;

/// What came: the final notifications per task; the bodies of other updates delivered
/// more than once other than across a disruption in `spans` (see [`repeated_across`]);
/// and how many were so across one.
fn deliveries(got: &[Got], spans: &[(Instant, Instant)]) -> (Finals, Vec<String>, usize) {
    let mut finals: Finals = HashMap::new();
    let mut bodies: Finals = HashMap::new();
    for g in got {
        let id = g.notification_id().unwrap_or("");
        match (task_of(&g.body), state_of(&g.body)) {
            (Some(task), Some(state)) if is_final(&state) => {
                let copy = (state, g.at, id.to_string());
                finals.entry(task.to_string()).or_default().push(copy);
            }
            _ => {
                let body = g.body.to_string();
                let copy = (body.clone(), g.at, id.to_string());
                bodies.entry(body).or_default().push(copy);
            }
        }
    }
    let (across, repeated): (Vec<_>, Vec<_>) = (bodies.into_iter())
        .filter(|(_, copies)| copies.len() > 1)
        .partition(|(_, copies)| repeated_across(copies, spans));
    (
        finals,
        repeated.into_iter().map(|(b, _)| b).collect(),
        across.len(),
    )
}

/// Whether a final state (or another update) notified twice was so because its follower's
/// replica was killed or stopped around delivering it: the one window no follower can close, as nothing tells
/// a successor whether the delivery happened, nor stops a frozen process between its last
/// check and its send (push is at least once there). Each disruption is a span (`from`,
/// `to`): a kill's is an instant, a stall's lasts until the replica woke. The first copy
/// came from 2 s before the span to its end (delivered but not yet noted when the follower
/// went; or sent by the successor while the follower, frozen after its check, had not
/// sent), the second after the span began, the same state with the same notification id
/// (so that a receiver keeping ids handles it once).
fn repeated_across(copies: &[(String, Instant, String)], spans: &[(Instant, Instant)]) -> bool {
    match copies {
        [(state, first, id), (same, second, again)] => {
            state == same
                && id == again
                && !id.is_empty()
                && spans.iter().any(|(from, to)| {
                    let since = from.checked_sub(Duration::from_secs(2)).unwrap_or(*from);
                    since <= *first && first <= to && from < second
                })
        }
        _ => false,
    }
}

/// A store server of the test's own that can go away and come back on its port.
trait StoreServer {
    fn name(&self) -> &'static str;
    /// Three replicas on it.
    fn replicas(&self) -> Vec<Running>;
    fn stop(&mut self);
    fn start(&mut self);
    /// What the store holds of `tasks`' push following, for a failure's message.
    fn holds(&self, tasks: &[&String]) -> String;
}

/// Redis keeping every write on disk before it answers.
struct DurableRedis {
    data: tempfile::TempDir,
    port: u16,
    server: Option<RedisServer>,
    prefix: String,
}

impl DurableRedis {
    fn new() -> DurableRedis {
        let mut redis = DurableRedis {
            data: tempfile::tempdir().unwrap(),
            port: crate::peers::free_port(),
            server: None,
            prefix: format!("a2a-chaos-{}:", uuid::Uuid::new_v4()),
        };
        redis.start();
        redis
    }
}

impl StoreServer for DurableRedis {
    fn name(&self) -> &'static str {
        "redis"
    }
    fn replicas(&self) -> Vec<Running> {
        let url = format!("redis://127.0.0.1:{}", self.port);
        let gateway = format!("{}\n{PUSH}\n", config(&url, &self.prefix));
        (0..3)
            .map(|_| Running::start(&[("echo.toml", crate::helpers::ECHO)], &gateway, LOG))
            .collect()
    }
    fn stop(&mut self) {
        self.server.take();
    }
    fn start(&mut self) {
        let dir = self.data.path().to_str().unwrap();
        let durable = [
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            dir,
        ];
        self.server = Some(RedisServer::start_with(self.port, &durable));
    }
    fn holds(&self, tasks: &[&String]) -> String {
        let url = format!("redis://127.0.0.1:{}", self.port);
        let Ok(mut c) = redis::Client::open(url).and_then(|c| c.get_connection()) else {
            return "(Redis does not answer)".into();
        };
        let p = &self.prefix;
        let mut out = String::new();
        for task in tasks {
            let holder: Option<String> = redis::cmd("HGET")
                .arg(format!("{p}push:holder"))
                .arg(task.as_str())
                .query(&mut c)
                .unwrap_or_default();
            let orphan: bool = redis::cmd("SISMEMBER")
                .arg(format!("{p}push:orphans"))
                .arg(task.as_str())
                .query(&mut c)
                .unwrap_or_default();
            out.push_str(&format!("{task}: holder {holder:?}, orphan {orphan}\n"));
        }
        out
    }
}

/// A PostgreSQL cluster of the test's own (its server binaries from `pg_config`, run as
/// the `postgres` user, which PostgreSQL requires when the tests run as root).
struct OwnPostgres {
    data: tempfile::TempDir,
    port: u16,
    bin: std::path::PathBuf,
    user: Option<(u32, u32)>,
    server: Option<std::process::Child>,
}

impl OwnPostgres {
    fn new() -> OwnPostgres {
        use std::os::unix::process::CommandExt;
        let bin = std::process::Command::new("pg_config")
            .arg("--bindir")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| {
                panic!("pg_config is not on PATH: the chaos test needs PostgreSQL's server binaries (apt-get install postgresql)")
            });
        let data = tempfile::tempdir().unwrap();
        // As root, the server runs as `postgres`, which must own its directory.
        let id = |args: &[&str]| -> Option<u32> {
            let out = std::process::Command::new("id").args(args).output().ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse().ok()
        };
        let user = (id(&["-u"]) == Some(0)).then(|| {
            let as_postgres = id(&["-u", "postgres"]).zip(id(&["-g", "postgres"]));
            as_postgres
                .expect("the tests run as root: they need a postgres user to run PostgreSQL as")
        });
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(data.path(), Some(uid), Some(gid)).unwrap();
        }
        let bin = std::path::PathBuf::from(bin);
        let mut initdb = std::process::Command::new(bin.join("initdb"));
        initdb
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-D"])
            .arg(data.path().join("db"))
            .stdout(std::process::Stdio::null());
        if let Some((uid, gid)) = user {
            initdb.uid(uid).gid(gid);
        }
        let made = initdb.output().expect("running initdb");
        assert!(
            made.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&made.stderr)
        );
        let mut pg = OwnPostgres {
            data,
            port: crate::peers::free_port(),
            bin,
            user,
            server: None,
        };
        pg.start();
        pg
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl StoreServer for OwnPostgres {
    fn name(&self) -> &'static str {
        "postgres"
    }
    fn replicas(&self) -> Vec<Running> {
        let gateway = format!(
            "default_agent = \"echo\"\n[store]\nkind = \"postgres\"\nurl = \"{}\"\nschema = \"chaos\"\nshared = true\nlease_secs = 2\n{PUSH}",
            self.url()
        );
        (0..3)
            .map(|_| Running::start(&[("echo.toml", crate::helpers::ECHO)], &gateway, LOG))
            .collect()
    }
    fn stop(&mut self) {
        let Some(mut server) = self.server.take() else {
            return;
        };
        // Immediate shutdown: the server ends at once, as in a crash.
        let _ = std::process::Command::new("kill")
            .args(["-QUIT", &server.id().to_string()])
            .status();
        let _ = server.wait();
    }
    fn start(&mut self) {
        use std::os::unix::process::CommandExt;
        let mut postgres = std::process::Command::new(self.bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(self.data.path().join("db"))
            .args([
                "-p",
                &self.port.to_string(),
                "-c",
                "listen_addresses=127.0.0.1",
            ])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.data.path().display()
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        if let Some((uid, gid)) = self.user {
            postgres.uid(uid).gid(gid);
        }
        self.server = Some(postgres.spawn().expect("starting postgres"));
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = self.url();
        while !crate::postgres::answers(&url) {
            assert!(
                Instant::now() < deadline,
                "postgres did not start on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    fn holds(&self, tasks: &[&String]) -> String {
        self.holds_of(tasks)
    }
}

impl OwnPostgres {
    fn holds_of(&self, tasks: &[&String]) -> String {
        let url = self.url();
        let tasks: Vec<String> = tasks.iter().map(|t| t.to_string()).collect();
        let rows = std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).ok()?;
            let sql =
                "SELECT task, holder, orphan, seen FROM chaos.push_holds WHERE task = ANY($1)";
            c.query(sql, &[&tasks]).ok()
        })
        .join()
        .ok()
        .flatten();
        let Some(rows) = rows else {
            return "(PostgreSQL does not answer)".into();
        };
        let mut out = format!("{} of the tasks have a row\n", rows.len());
        for r in rows {
            let (task, holder, orphan, seen): (String, String, bool, i64) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            out.push_str(&format!(
                "{task}: holder {holder}, orphan {orphan}, seen {seen}\n"
            ));
        }
        out
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        self.stop();
    }
}

#[tokio::test]
async fn replicas_behind_nginx_survive_a_kill_a_store_restart_and_a_stall_on_redis() {
    survive(&mut DurableRedis::new()).await;
}

#[tokio::test]
async fn replicas_behind_nginx_survive_a_kill_a_store_restart_and_a_stall_on_postgres() {
    survive(&mut OwnPostgres::new()).await;
}

/// Each replica's log lines that name one of `tasks`, for a failure's message.
fn logged_about(gws: &[Running], tasks: &[&String]) -> String {
    let mut out = String::new();
    for (n, gw) in gws.iter().enumerate() {
        let log = std::fs::read_to_string(&gw.log).unwrap_or_default();
        for line in log
            .lines()
            .filter(|l| tasks.iter().any(|t| l.contains(t.as_str())))
        {
            out.push_str(&format!("replica {n}: {line}\n"));
        }
    }
    out
}

async fn survive(store: &mut impl StoreServer) {
    let mut gws = store.replicas();
    let nginx = Nginx::start(&gws);
    let rx = Receiver::start("127.0.0.1", Answer::Ok).await;
    let load = Arc::new(Load {
        base: nginx.url(""),
        hook: rx.url.clone(),
        stop: AtomicBool::new(false),
        seen: Mutex::default(),
    });
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| tokio::spawn(load.clone().work(w)))
        .collect();

    tokio::time::sleep(Duration::from_secs(3)).await;
    // Streams under way on the replica that dies (started there, not through nginx, so
    // that some surely are), picked up through nginx.
    let started = Arc::new(AtomicUsize::new(0));
    let doomed: Vec<_> = (0..2)
        .map(|n| {
            let (load, started, first) = (load.clone(), started.clone(), gws[0].base.clone());
            tokio::spawn(async move {
                let text = format!("/delay 4 d{n}");
                load.stream_from(&client(), &text, Some((&first, &started)))
                    .await
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while started.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed_at = Instant::now();
    gws[0].kill_hard();
    tokio::time::sleep(Duration::from_secs(4)).await;
    store.stop();
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.start();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let stopped_at = Instant::now();
    gws[1].signal("STOP");
    tokio::time::sleep(Duration::from_secs(5)).await;
    gws[1].signal("CONT");
    let woke_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.stop.store(true, Ordering::Relaxed);
    for w in workers.into_iter().chain(doomed) {
        tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("a worker finishes within a minute")
            .unwrap();
    }

    let seen = std::mem::take(&mut *load.seen.lock().unwrap());
    let mut lost = Vec::new();
    let mut states = HashMap::new();
    for id in &seen.answered {
        let state = final_state(&load.base, id).await;
        if !is_final(&state) {
            lost.push((id.clone(), state.clone()));
        }
        states.insert(id.clone(), state);
    }
    // Every pushed task's final state has arrived (30 s at most), once; then a moment for
    // any copy.
    let spans = [(killed_at, killed_at), (stopped_at, woke_at)];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (finals, ..) = deliveries(&rx.got(), &spans);
        let missing = seen
            .pushed
            .iter()
            .filter(|id| !finals.contains_key(*id))
            .count();
        if missing == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (finals, repeated, updates_across) = deliveries(&rx.got(), &spans);
    let missed: Vec<&String> = seen
        .pushed
        .iter()
        .filter(|id| !finals.contains_key(*id))
        .collect();
    let (across, twice): (Vec<_>, Vec<_>) = (finals.iter())
        .filter(|(_, s)| s.len() > 1)
        .partition(|(_, s)| repeated_across(s, &spans));
    let unended: Vec<&(String, String)> = seen
        .streams
        .iter()
        .filter(|(_, end)| end.is_empty())
        .collect();
    let failed = states
        .values()
        .filter(|s| *s == "TASK_STATE_FAILED")
        .count();
    println!(
        "figure: chaos on {}: {} tasks answered ({} with push, {} streamed, {} streams picked up again), {} calls unanswered while a replica or the store was away, {} tasks failed with their replica; {} notifications, {} final states and {} other updates sent twice as their follower died or froze around delivering them",
        store.name(),
        seen.answered.len(),
        seen.pushed.len(),
        seen.streams.len(),
        seen.resumed,
        seen.unanswered,
        failed,
        rx.got().len(),
        across.len(),
        updates_across
    );
    assert!(
        lost.is_empty(),
        "answered tasks lost or unfinished: {lost:#?}"
    );
    assert!(
        missed.is_empty(),
        "no final notification for {} tasks: {missed:?}; what the store holds of their push following:\n{}what the replicas logged of them:\n{}",
        missed.len(),
        store.holds(&missed),
        logged_about(&gws, &missed)
    );
    let twice_ids: Vec<&String> = twice.iter().map(|(id, _)| *id).collect();
    assert!(
        twice.is_empty(),
        "final state notified twice: {twice:?}; what the replicas logged of them:\n{}",
        logged_about(&gws, &twice_ids)
    );
    let repeated_ids: Vec<String> = (repeated.iter())
        .filter_map(|body| Some(task_of(&serde_json::from_str(body).ok()?)?.to_string()))
        .collect();
    assert!(
        repeated.is_empty(),
        "updates delivered twice: {repeated:#?}; what the replicas logged of them:\n{}",
        logged_about(&gws, &repeated_ids.iter().collect::<Vec<_>>())
    );
    assert!(
        unended.is_empty(),
        "streams that did not end with their task: {unended:?}"
    );
    assert!(
        seen.answered.len() > 30,
        "the load ran: {}",
        seen.answered.len()
    );
    assert!(seen.resumed > 0, "a stream was picked up again");
}

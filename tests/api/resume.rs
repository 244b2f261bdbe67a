//! Resumable streams: every event of a task's stream carries `id: <task>:<version>`; a
//! client that lost its connection comes back with `Last-Event-ID` and gets what it missed,
//! in order and once, then the live events, then the end.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};

use crate::balancer::Nginx;
use crate::helpers::{parse_sse, rpc, spawn_with, TestGateway, D};
use crate::replicas::{free_port, redis_url, Prefix, RedisServer};
use crate::running::Running;

/// A program that writes six lines, a fifth of a second apart: six artifact chunks.
fn ticker() -> String {
    let script = "import time\nfor i in range(6):\n    print('tick %d' % i, flush=True)\n    time.sleep(0.2)\n";
    format!(
        "name = \"ticker\"\ndescription = \"ticks\"\n[backend]\nkind = \"command\"\ncommand = [\"python3\", \"-c\", {script:?}]\n"
    )
}

async fn gateway() -> TestGateway {
    spawn_with(&[("ticker.toml", &ticker())], "").await
}

/// An SSE event as read off the wire: its id, and its data.
#[derive(Debug, Clone)]
struct Event {
    id: Option<String>,
    data: Value,
}

/// What an event says, without what differs between two runs (ids, timestamps).
fn gist(e: &Event) -> String {
    let r = &e.data["result"];
    if let Some(task) = r.get("task") {
        return format!("task {}", task["status"]["state"]);
    }
    if let Some(s) = r.get("statusUpdate") {
        return format!("status {}", s["status"]["state"]);
    }
    if let Some(a) = r.get("artifactUpdate") {
        return format!("artifact {}", a["artifact"]["parts"]);
    }
    format!("other {r}")
}

/// The id of the task a stream's first event (its snapshot) shows.
fn task_id(first: &Value) -> String {
    let id = first["result"]["task"]["id"].as_str();
    id.unwrap_or_else(|| panic!("not a task snapshot: {first}"))
        .to_string()
}

/// A stream read by hand off a raw connection (so that the test decides how it ends).
struct Raw {
    reader: BufReader<TcpStream>,
    /// Decoded body not yet read as events.
    buf: String,
    ended: bool,
}

/// Opens a stream to the ticker on `base`, with `last_event_id` if given; read past the head.
fn open(base: &str, method: &str, params: Value, last_event_id: Option<&str>) -> Raw {
    open_at(base, "/a2a/agents/ticker", method, params, last_event_id)
}

/// [`open`], to the agent at `path`.
fn open_at(
    base: &str,
    path: &str,
    method: &str,
    params: Value,
    last_event_id: Option<&str>,
) -> Raw {
    let addr = base.trim_start_matches("http://").to_string();
    let mut socket = TcpStream::connect(&addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let body = rpc(method, params);
    let resume = last_event_id.map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
    write!(
        socket,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nAccept: text/event-stream\r\n{resume}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(socket);
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "the connection closed before the head");
        if line == "\r\n" {
            break;
        }
    }
    Raw {
        reader,
        buf: String::new(),
        ended: false,
    }
}

impl Raw {
    /// The next event; none once the stream ended.
    fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(at) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..at + 2).collect();
                let (mut id, mut data) = (None, String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if !data.is_empty() {
                    let data = serde_json::from_str(&data).unwrap();
                    return Some(Event { id, data });
                }
                continue;
            }
            if self.ended {
                return None;
            }
            // One chunk of the chunked body (a proxy may cut events anywhere).
            let mut size = String::new();
            if self.reader.read_line(&mut size).unwrap_or(0) == 0 {
                self.ended = true;
                continue;
            }
            let size = usize::from_str_radix(size.trim(), 16)
                .unwrap_or_else(|_| panic!("a chunk size: {size:?}"));
            let mut chunk = vec![0; size + 2];
            if size == 0 || self.reader.read_exact(&mut chunk).is_err() {
                self.ended = true;
                continue;
            }
            self.buf.push_str(&String::from_utf8_lossy(&chunk[..size]));
        }
    }

    /// Up to `n` events (all of them, to the end: `usize::MAX`).
    fn events(&mut self, n: usize) -> Vec<Event> {
        std::iter::from_fn(|| self.next_event()).take(n).collect()
    }
}

/// Drops a connection abruptly: a reset instead of a close.
fn reset(raw: Raw) {
    let socket = raw.reader.into_inner();
    socket2::SockRef::from(&socket)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(socket);
}

/// A 1.0 JSON-RPC call to the ticker with `headers` (a credential, `Last-Event-ID`), read
/// whole: its status and body.
async fn call_ticker(
    gw: &TestGateway,
    method: &str,
    params: Value,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut req = gw
        .client
        .post(gw.url("/a2a/agents/ticker"))
        .header("content-type", "application/json")
        .header("A2A-Version", "1.0");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = req.body(rpc(method, params)).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// The JSON-RPC error of an answer: its code and message.
fn error_of(text: &str) -> (i64, String) {
    let body: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("not JSON: {text}"));
    let message = body["error"]["message"].as_str().unwrap_or_default();
    (
        body["error"]["code"].as_i64().unwrap_or(0),
        message.to_string(),
    )
}

fn send_params() -> Value {
    json!({"message": D::V10.message("go")})
}

async fn whole_stream(gw: &TestGateway) -> Vec<String> {
    let events = gw
        .sse(
            "/a2a/agents/ticker",
            D::V10,
            "SendStreamingMessage",
            send_params(),
        )
        .await;
    events
        .iter()
        .map(|e| {
            gist(&Event {
                id: None,
                data: e.data.clone(),
            })
        })
        .collect()
}

#[tokio::test]
async fn a_dropped_stream_resumes_where_it_left_off() {
    let gw = gateway().await;
    let whole = whole_stream(&gw).await;
    assert_eq!(
        whole.len(),
        9,
        "snapshot, working, six chunks, completed: {whole:?}"
    );
    for (how, method) in [
        ("fin", "SubscribeToTask"),
        ("rst", "SubscribeToTask"),
        ("fin", "SendStreamingMessage"),
    ] {
        let base = gw.base.clone();
        let (first, rest) = tokio::task::spawn_blocking({
            move || {
                let mut stream = open(&base, "SendStreamingMessage", send_params(), None);
                let first = stream.events(4);
                match how {
                    "rst" => reset(stream),
                    _ => drop(stream),
                }
                // Events go on while the client is away.
                std::thread::sleep(Duration::from_millis(500));
                let last = first.last().unwrap();
                let id = last.id.clone().expect("every task event has an id");
                let task = task_id(&first[0].data);
                assert!(id.starts_with(&format!("{task}:")), "{id}");
                let params = match method {
                    "SubscribeToTask" => json!({"id": task}),
                    _ => send_params(),
                };
                let rest = open(&base, method, params, Some(&id)).events(usize::MAX);
                (first, rest)
            }
        })
        .await
        .unwrap();
        let joined: Vec<String> = first.iter().chain(&rest).map(gist).collect();
        assert_eq!(joined, whole, "{how} then {method}: {first:?} + {rest:?}");
        // Ids go up by one, with no gap at the seam.
        let versions: Vec<u64> = first
            .iter()
            .chain(&rest)
            .map(|e| {
                e.id.as_deref()
                    .unwrap()
                    .rsplit(':')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert!(
            versions.windows(2).all(|w| w[1] == w[0] + 1),
            "{versions:?}"
        );
    }
}

#[tokio::test]
async fn an_id_of_another_task_or_caller_is_refused_like_an_unknown_task() {
    let gw = gateway().await;
    let events = gw
        .sse(
            "/a2a/agents/ticker",
            D::V10,
            "SendStreamingMessage",
            send_params(),
        )
        .await;
    let task = task_id(&events[0].data);
    let other = uuid::Uuid::new_v4().to_string();
    let gw = &gw;
    let subscribe = json!({"id": task});
    // Another task's id than the one subscribed to.
    let id = format!("{other}:2");
    let (_, text) = call_ticker(
        gw,
        "SubscribeToTask",
        subscribe.clone(),
        &[("Last-Event-ID", &id)],
    )
    .await;
    assert_eq!(error_of(&text).0, -32001, "{text}");
    // An unknown task, on a repeated send.
    let id = format!("{other}:1");
    let (_, text) = call_ticker(
        gw,
        "SendStreamingMessage",
        send_params(),
        &[("Last-Event-ID", &id)],
    )
    .await;
    let (code, message) = error_of(&text);
    assert_eq!(code, -32001, "{text}");
    assert!(message.contains(&other), "{text}");
    // Not an id this gateway makes.
    let nonsense = [("Last-Event-ID", "nonsense")];
    let (_, text) = call_ticker(gw, "SubscribeToTask", subscribe.clone(), &nonsense).await;
    let (code, message) = error_of(&text);
    assert_eq!(code, -32602, "{text}");
    assert!(message.contains("Last-Event-ID"), "{text}");
    // A finished task, resumed past its end: nothing more, and the stream ends.
    let id = format!("{task}:8");
    let (status, text) = call_ticker(
        gw,
        "SubscribeToTask",
        subscribe.clone(),
        &[("Last-Event-ID", &id)],
    )
    .await;
    assert_eq!(status, 200);
    assert!(parse_sse(&text).is_empty(), "{text}");
    // From earlier: the missed events, then the end.
    let id = format!("{task}:6");
    let (_, text) = call_ticker(gw, "SubscribeToTask", subscribe, &[("Last-Event-ID", &id)]).await;
    let replayed = parse_sse(&text);
    assert_eq!(replayed.len(), 2, "{replayed:?}");
    assert_eq!(
        replayed[1].data["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    // The gateway is none the worse.
    assert_eq!(whole_stream(gw).await.len(), 9);
}

/// A streamed send to the ticker on `base`, read for three events (`after_first` run once
/// the first came), then dropped abruptly: the events, and the task's id.
fn three_events_then_reset(base: &str, after_first: impl FnOnce()) -> (Vec<Event>, String) {
    let mut stream = open(base, "SendStreamingMessage", send_params(), None);
    let mut first = stream.events(1);
    after_first();
    first.extend(stream.events(2));
    reset(stream);
    let task = task_id(&first[0].data);
    (first, task)
}

/// Versions of a stream's events read before a seam and after it, in order.
fn versions_across(first: &[Event], rest: &[Event]) -> Vec<u64> {
    versions(first).into_iter().chain(versions(rest)).collect()
}

/// Versions of events as their ids say.
fn versions(events: &[Event]) -> Vec<u64> {
    (events.iter())
        .map(|e| {
            e.id.as_deref()
                .expect("an id")
                .rsplit(':')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

/// Through the shipped nginx in front of three replicas sharing Redis: a stream dropped and
/// picked up through whichever replica nginx picks; then one whose replica is killed while
/// the client is away, picked up through a survivor: what it missed up to the kill, then
/// the task's failure once the replica's lease runs out.
#[tokio::test]
async fn a_stream_resumes_through_another_replica_behind_nginx_even_when_its_replica_died() {
    let url = redis_url();
    let prefix = Prefix::new(url);
    let gateway = format!(
        "[store]\nkind = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{}\"\nlease_secs = 2\n",
        prefix.prefix
    );
    let ticker = ticker();
    let mut gws: Vec<Running> = (0..3)
        .map(|_| Running::start(&[("ticker.toml", &ticker)], &gateway, "info"))
        .collect();
    let nginx = Nginx::start(&gws);
    let through = nginx.url("");
    let first_replica = gws[0].base.clone();
    let (whole, joined, seams) = tokio::task::spawn_blocking(move || {
        let whole = open(&through, "SendStreamingMessage", send_params(), None).events(usize::MAX);
        let mut joined = Vec::new();
        let mut seams = Vec::new();
        for _ in 0..3 {
            let mut stream = open(&through, "SendStreamingMessage", send_params(), None);
            let first = stream.events(4);
            drop(stream);
            std::thread::sleep(Duration::from_millis(400));
            let task = task_id(&first[0].data);
            let id = first.last().unwrap().id.clone().unwrap();
            let rest = open(&through, "SubscribeToTask", json!({"id": task}), Some(&id))
                .events(usize::MAX);
            seams.push((versions(&first), versions(&rest)));
            joined.push(first.iter().chain(&rest).map(gist).collect::<Vec<_>>());
        }
        (whole, joined, seams)
    })
    .await
    .unwrap();
    let whole: Vec<String> = whole.iter().map(gist).collect();
    assert_eq!(whole.len(), 9, "{whole:?}");
    for (joined, seam) in joined.iter().zip(&seams) {
        assert_eq!(joined, &whole, "{seam:?}");
    }

    // The replica running the task dies while its client is away.
    let (first, stream_task) =
        tokio::task::spawn_blocking(move || three_events_then_reset(&first_replica, || ()))
            .await
            .unwrap();
    gws[0].kill_hard();
    let through = nginx.url("");
    let id = first.last().unwrap().id.clone().unwrap();
    let task = stream_task.clone();
    let asked = std::time::Instant::now();
    let rest = tokio::task::spawn_blocking(move || {
        open(&through, "SubscribeToTask", json!({"id": task}), Some(&id)).events(usize::MAX)
    })
    .await
    .unwrap();
    let survivors_said = || {
        let lines = gws.iter().flat_map(|gw| {
            let log = std::fs::read_to_string(&gw.log).unwrap_or_default();
            let about: Vec<String> = log
                .lines()
                .filter(|l| l.contains(&stream_task) || l.contains("lease") || l.contains("store"))
                .map(str::to_string)
                .collect();
            about
        });
        lines.collect::<Vec<_>>().join("\n")
    };
    assert!(
        !rest.is_empty(),
        "nothing after the seam ({:?} after asking); the replicas' log of the task and the store:\n{}",
        asked.elapsed(),
        survivors_said()
    );
    // One after the other, then the failure, numbered past what the dead replica may
    // have sent without writing.
    let all = versions_across(&first, &rest);
    let (failure, before) = all.split_last().unwrap();
    assert!(before.windows(2).all(|w| w[1] == w[0] + 1), "{all:?}");
    assert!(failure > before.last().unwrap(), "{all:?}");
    let last =
        &rest.last().expect("events after the seam").data["result"]["statusUpdate"]["status"];
    assert_eq!(last["state"], "TASK_STATE_FAILED", "{rest:?}");
    assert!(
        last["message"]["parts"][0]["text"]
            .as_str()
            .unwrap()
            .contains("did not survive"),
        "{last}"
    );
    // What came before the failure is what an uninterrupted stream had at those places.
    let before: Vec<String> = first
        .iter()
        .chain(&rest[..rest.len() - 1])
        .map(gist)
        .collect();
    assert_eq!(before, whole[..before.len()], "{before:?}");
}

/// A replica sends its stream's events before it writes them: when it dies with some
/// unwritten (its store stalled), a client that saw them picks the stream up through
/// another replica after the last one it read, and gets the task's failure.
#[tokio::test]
async fn a_stream_ahead_of_the_store_resumes_through_another_replica_when_its_replica_died() {
    let redis = RedisServer::start(free_port());
    let gateway = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\nlease_secs = 5\n",
        redis.url()
    );
    let ticker = ticker();
    let mut gws: Vec<Running> = (0..2)
        .map(|_| Running::start(&[("ticker.toml", &ticker)], &gateway, "info"))
        .collect();
    let (running, survivor) = (gws[0].base.clone(), gws[1].base.clone());
    let redis = std::sync::Arc::new(redis);
    let stalled = redis.clone();
    // The task is stored before its first event goes; what follows is not, now.
    let (first, task) = tokio::task::spawn_blocking(move || {
        three_events_then_reset(&running, || stalled.signal("STOP"))
    })
    .await
    .unwrap();
    gws[0].kill_hard();
    redis.signal("CONT");
    // Asked once the survivor has the store again, and before the dead replica's lease
    // runs out: the task as stored is behind what the client read.
    let ready = gws[1].url("/a2a/ready");
    let client = crate::helpers::client();
    while !(client.get(&ready).send().await).is_ok_and(|r| r.status() == 200) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let id = first.last().unwrap().id.clone().unwrap();
    let rest = tokio::task::spawn_blocking(move || {
        open(&survivor, "SubscribeToTask", json!({"id": task}), Some(&id)).events(usize::MAX)
    })
    .await
    .unwrap();
    let all = versions_across(&first, &rest);
    assert_eq!(rest.len(), 1, "the failure alone: {rest:?}");
    assert!(all[3] > all[2], "numbered past what was read: {all:?}");
    let last = &rest[0].data["result"]["statusUpdate"]["status"];
    assert_eq!(last["state"], "TASK_STATE_FAILED", "{rest:?}");
}

#[tokio::test]
async fn another_callers_event_id_is_an_unknown_task() {
    let keys = format!(
        "[[auth.api_keys]]\nid = \"alice\"\nsecret_sha256 = \"{}\"\n[[auth.api_keys]]\nid = \"bob\"\nsecret_sha256 = \"{}\"\n",
        crate::helpers::sha("alice-key"),
        crate::helpers::sha("bob-key")
    );
    let gw = spawn_with(&[("ticker.toml", &ticker())], &keys).await;
    let alice = [("X-API-Key", "alice-key")];
    let (_, streamed) = call_ticker(&gw, "SendStreamingMessage", send_params(), &alice).await;
    let events = parse_sse(&streamed);
    let task = task_id(&events[0].data);
    let id = format!("{task}:3");
    for (key, expect) in [("bob-key", -32001), ("alice-key", 0)] {
        let headers = [("X-API-Key", key), ("Last-Event-ID", id.as_str())];
        let (_, text) = call_ticker(&gw, "SubscribeToTask", json!({"id": task}), &headers).await;
        match expect {
            0 => assert_eq!(parse_sse(&text).len(), 5, "versions 4 to 8: {text}"),
            code => {
                let (got, message) = error_of(&text);
                assert_eq!(got, code, "{text}");
                assert!(message.contains(&task), "{text}");
            }
        }
    }
}

/// With the SQLite store a streamed task's events outlive the process: a client whose
/// gateway restarted picks its stream up there. A task that finished while the client was
/// away replays to its end; one the crash cut short replays to where it got, then ends
/// with its failure (its work did not survive).
#[tokio::test]
async fn a_stream_resumes_after_the_gateway_restarts_with_the_sqlite_store() {
    let gateway = "[store]\nkind = \"sqlite\"\ndata_dir = \"data\"\ncommit_interval_ms = 5\n";
    let mut gw = Running::start(&[("ticker.toml", &ticker())], gateway, "info");
    let base = gw.base.clone();
    let (whole, first) = tokio::task::spawn_blocking(move || {
        let whole = open(&base, "SendStreamingMessage", send_params(), None).events(usize::MAX);
        let mut stream = open(&base, "SendStreamingMessage", send_params(), None);
        let first = stream.events(4);
        drop(stream);
        // The task finishes while the client is away; then a graceful restart.
        std::thread::sleep(Duration::from_millis(1500));
        (whole, first)
    })
    .await
    .unwrap();
    gw.signal("TERM");
    let (status, _) = gw.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "a drained exit: {status:?}");
    gw.restart();
    let base = gw.base.clone();
    let id = first.last().unwrap().id.clone().unwrap();
    let task = task_id(&first[0].data);
    let (rest, cut, cut_rest) = tokio::task::spawn_blocking(move || {
        let rest =
            open(&base, "SubscribeToTask", json!({"id": task}), Some(&id)).events(usize::MAX);
        let mut stream = open(&base, "SendStreamingMessage", send_params(), None);
        let cut = stream.events(4);
        (rest, cut, stream)
    })
    .await
    .unwrap();
    let whole: Vec<String> = whole.iter().map(gist).collect();
    let joined: Vec<String> = first.iter().chain(&rest).map(gist).collect();
    assert_eq!(joined, whole);
    // A crash (SIGKILL) while the client is away, 4 events in; then a restart.
    reset(cut_rest);
    gw.kill_hard();
    gw.restart();
    let base = gw.base.clone();
    let id = cut.last().unwrap().id.clone().unwrap();
    let task = task_id(&cut[0].data);
    let rest = tokio::task::spawn_blocking(move || {
        open(&base, "SubscribeToTask", json!({"id": task}), Some(&id)).events(usize::MAX)
    })
    .await
    .unwrap();
    // What was written before the crash, then the failure, numbered past what the crash
    // may have sent without writing.
    let all: Vec<u64> = versions(&cut).into_iter().chain(versions(&rest)).collect();
    assert!(all.windows(2).all(|w| w[1] > w[0]), "{all:?}");
    let last = &rest.last().expect("the failure").data["result"]["statusUpdate"]["status"];
    assert_eq!(last["state"], "TASK_STATE_FAILED", "{rest:?}");
    assert!(
        last["message"]["parts"][0]["text"]
            .as_str()
            .unwrap()
            .contains("did not survive"),
        "{last}"
    );
}

/// An upstream agent whose events carry ids (another a2a-gateway) and whose connection
/// breaks mid-stream: the gateway resumes the upstream's stream after its last event
/// (`Last-Event-ID` on a subscription) and the caller sees one unbroken stream.
#[tokio::test]
async fn a_broken_upstream_stream_is_resumed_with_the_upstreams_last_event_id() {
    let back = gateway().await;
    let (proxy, heads) =
        crate::helpers::cutting_proxy(back.base.trim_start_matches("http://").to_string(), 4).await;
    let far = crate::peers::upstream_agent("far", &format!("{proxy}/a2a/agents/ticker"), "");
    let front = spawn_with(&[("far.toml", &far)], "").await;
    let events = front
        .sse(
            "/a2a/agents/far",
            D::V10,
            "SendStreamingMessage",
            send_params(),
        )
        .await;
    let whole: Vec<String> = events
        .iter()
        .map(|e| {
            gist(&Event {
                id: None,
                data: e.data.clone(),
            })
        })
        .collect();
    let direct = whole_stream(&back).await;
    assert_eq!(whole, direct, "one unbroken stream");
    let heads = heads.lock().unwrap().clone();
    let resumed = heads
        .iter()
        .find(|h| h.to_ascii_lowercase().contains("last-event-id:"))
        .unwrap_or_else(|| panic!("no request resumed the stream: {heads:?}"));
    assert!(
        resumed.contains("SubscribeToTask") || resumed.contains("tasks/resubscribe"),
        "{resumed}"
    );
}

/// An upstream agent's stream, dropped by the caller: the gateway went on reading it, and the
/// caller resumes from the gateway's own log, then the live events.
#[tokio::test]
async fn an_upstream_agents_stream_resumes_from_the_gateways_own_log() {
    let back = gateway().await;
    let far = crate::peers::upstream_agent("far", &back.url("/a2a/agents/ticker"), "");
    let front = spawn_with(&[("far.toml", &far)], "").await;
    let base = front.base.clone();
    let (whole, first, rest) = tokio::task::spawn_blocking(move || {
        let path = "/a2a/agents/far";
        let whole =
            open_at(&base, path, "SendStreamingMessage", send_params(), None).events(usize::MAX);
        let mut stream = open_at(&base, path, "SendStreamingMessage", send_params(), None);
        let first = stream.events(4);
        drop(stream);
        std::thread::sleep(Duration::from_millis(500));
        let task = task_id(&first[0].data);
        let id = first
            .last()
            .unwrap()
            .id
            .clone()
            .expect("upstream events carry ids too");
        assert!(id.starts_with(&format!("{task}:")), "{id}");
        let rest = open_at(
            &base,
            path,
            "SubscribeToTask",
            json!({"id": task}),
            Some(&id),
        )
        .events(usize::MAX);
        (whole, first, rest)
    })
    .await
    .unwrap();
    let whole: Vec<String> = whole.iter().map(gist).collect();
    assert_eq!(whole.len(), 9, "{whole:?}");
    let joined: Vec<String> = first.iter().chain(&rest).map(gist).collect();
    assert_eq!(joined, whole, "{rest:?}");
    let all = versions_across(&first, &rest);
    assert!(all.windows(2).all(|w| w[1] == w[0] + 1), "{all:?}");
}

/// An upstream task's stream resumed through another replica, which did not relay it and
/// holds no log of it: the task's snapshot first, numbered past what the client read, then
/// its live events to the end. An id of that replica's, brought back to the first, is not
/// taken for one of the first's events: the first answers with the snapshot too. Once the
/// task is over, a resume that no log reaches gets the task as it ended.
#[tokio::test]
async fn an_upstream_stream_resumes_through_another_replica_from_the_tasks_snapshot() {
    // The upstream runs as a process of its own too: served inside this test's runtime,
    // beside the replicas killed at its end, it held the runtime's shutdown two minutes.
    let back = Running::start(&[("ticker.toml", &ticker())], "", "info");
    let far = crate::peers::upstream_agent("far", &back.url("/a2a/agents/ticker"), "");
    let url = redis_url();
    let prefix = Prefix::new(url);
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{}\"\n",
        prefix.prefix
    );
    let one = Running::start(&[("far.toml", &far)], &store, "info");
    let two = Running::start(&[("far.toml", &far)], &store, "info");
    for replica in [&one, &two] {
        // Until each has read the upstream's card (-32051 before).
        let mut tries = 0;
        while replica
            .call("/a2a/agents/far", "ListTasks", json!({}))
            .await["error"]["code"]
            == -32051
        {
            tries += 1;
            assert!(tries < 100, "the upstream's card was never read");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let (one_base, two_base) = (one.base.clone(), two.base.clone());
    let (first, there, again, ended) = tokio::task::spawn_blocking(move || {
        let path = "/a2a/agents/far";
        let mut stream = open_at(&one_base, path, "SendStreamingMessage", send_params(), None);
        let first = stream.events(3);
        drop(stream);
        let task = task_id(&first[0].data);
        let id = first.last().unwrap().id.clone().unwrap();
        let params = json!({"id": task});
        let mut resumed = open_at(
            &two_base,
            path,
            "SubscribeToTask",
            params.clone(),
            Some(&id),
        );
        let there = resumed.events(2);
        drop(resumed);
        let id = there.last().unwrap().id.clone().unwrap();
        let again = open_at(
            &one_base,
            path,
            "SubscribeToTask",
            params.clone(),
            Some(&id),
        )
        .events(usize::MAX);
        // The task is over: an id the replica cannot place gets the task as it ended.
        let id = first.last().unwrap().id.clone().unwrap();
        let mut ended = open_at(&two_base, path, "SubscribeToTask", params, Some(&id));
        (first, there, again, ended.events(usize::MAX))
    })
    .await
    .unwrap();
    let ended: Vec<String> = ended.iter().map(gist).collect();
    assert_eq!(ended, ["task \"TASK_STATE_COMPLETED\""]);
    let snapshot = |e: &Event| e.data["result"].get("task").is_some();
    assert!(snapshot(&there[0]), "{there:?}");
    let (read, resumed) = (versions(&first), versions(&there));
    assert!(
        resumed[0] > *read.last().unwrap(),
        "{read:?} then {resumed:?}"
    );
    assert!(
        snapshot(&again[0]),
        "not a replay of the first's own events: {again:?}"
    );
    let last = again.last().map(|e| {
        let r = &e.data["result"];
        (r.get("task").or(r.get("statusUpdate")).unwrap())["status"]["state"].clone()
    });
    assert_eq!(last, Some(json!("TASK_STATE_COMPLETED")), "{again:?}");
}

/// A subscription to an upstream task is read by the gateway too: dropped and resumed, the
/// caller gets every event after its last, once, to the task's end.
#[tokio::test]
async fn an_upstream_subscription_resumes_from_the_gateways_own_log() {
    let back = gateway().await;
    let far = crate::peers::upstream_agent("far", &back.url("/a2a/agents/ticker"), "");
    let front = spawn_with(&[("far.toml", &far)], "").await;
    let started = front
        .call_with(
            "/a2a/agents/far",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("go"), "configuration": {"returnImmediately": true}}),
            &[],
        )
        .await;
    let task = started.result()["task"]["id"].as_str().unwrap().to_string();
    let base = front.base.clone();
    let (first, rest) = tokio::task::spawn_blocking(move || {
        let path = "/a2a/agents/far";
        let mut stream = open_at(&base, path, "SubscribeToTask", json!({"id": task}), None);
        let first = stream.events(3);
        drop(stream);
        std::thread::sleep(Duration::from_millis(500));
        let id = first
            .last()
            .unwrap()
            .id
            .clone()
            .expect("a subscription's events carry ids");
        let rest = open_at(
            &base,
            path,
            "SubscribeToTask",
            json!({"id": task}),
            Some(&id),
        )
        .events(usize::MAX);
        (first, rest)
    })
    .await
    .unwrap();
    let all = versions_across(&first, &rest);
    assert!(all.windows(2).all(|w| w[1] == w[0] + 1), "{all:?}");
    let last = &rest.last().expect("events after the seam").data["result"]["statusUpdate"];
    assert_eq!(last["status"]["state"], "TASK_STATE_COMPLETED", "{rest:?}");
    let ticks = first
        .iter()
        .chain(&rest)
        .filter(|e| e.data["result"].get("artifactUpdate").is_some())
        .count();
    assert!(ticks >= 1, "{first:?} {rest:?}");
}

/// A subscription to an upstream task beside its streamed send joins what the gateway reads
/// already: the task as it is, then the same events under the same ids, to the task's end.
#[tokio::test]
async fn a_subscription_beside_an_upstream_stream_joins_it_with_the_same_ids() {
    let back = gateway().await;
    let far = crate::peers::upstream_agent("far", &back.url("/a2a/agents/ticker"), "");
    let front = spawn_with(&[("far.toml", &far)], "").await;
    let base = front.base.clone();
    let (sent, joined) = tokio::task::spawn_blocking(move || {
        let path = "/a2a/agents/far";
        let mut send = open_at(&base, path, "SendStreamingMessage", send_params(), None);
        let mut sent = send.events(4);
        let task = task_id(&sent[0].data);
        let joined =
            open_at(&base, path, "SubscribeToTask", json!({"id": task}), None).events(usize::MAX);
        sent.extend(send.events(usize::MAX));
        (sent, joined)
    })
    .await
    .unwrap();
    assert_eq!(sent.len(), 9, "{sent:?}");
    let snapshot = &joined[0];
    let task = &snapshot.data["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_WORKING", "{joined:?}");
    let at = versions(std::slice::from_ref(snapshot))[0];
    assert!(at >= 2, "the task as the recorder saw it: {snapshot:?}");
    // After the snapshot, exactly the send's events from that place on, ids and all.
    let after: Vec<(Option<String>, String)> = sent
        .iter()
        .filter(|e| versions(std::slice::from_ref(e))[0] > at)
        .map(|e| (e.id.clone(), gist(e)))
        .collect();
    let rest: Vec<(Option<String>, String)> = joined[1..]
        .iter()
        .map(|e| (e.id.clone(), gist(e)))
        .collect();
    assert_eq!(rest, after, "{joined:?}");
    assert_eq!(rest.last().unwrap().1, "status \"TASK_STATE_COMPLETED\"");
    // Its artifacts so far are in the snapshot: the ticks joined make up the whole.
    let in_snapshot: usize = (task["artifacts"].as_array().into_iter().flatten())
        .map(|a| a["parts"].as_array().map_or(0, Vec::len))
        .sum();
    let ticks = in_snapshot
        + rest
            .iter()
            .filter(|(_, g)| g.starts_with("artifact"))
            .count();
    assert_eq!(ticks, 6, "{joined:?}");
}

/// A subscription that joined a streamed send goes on past where the send's stream stops
/// (the task asks for input): a subscription upstream takes over, its events numbered on,
/// to the task's end.
#[tokio::test]
async fn a_joined_subscription_outlives_the_send_stream_it_joined() {
    let peer = crate::peers::python_agent("1.0", 0).await;
    let far = crate::peers::upstream_agent("far", &peer.url(), "");
    let front = spawn_with(&[("far.toml", &far)], "").await;
    let base = front.base.clone();
    let params = json!({"message": D::V10.message("/delay 1 /input Name?")});
    let (task, mut subscription, mut seen) = tokio::task::spawn_blocking(move || {
        let path = "/a2a/agents/far";
        let mut send = open_at(&base, path, "SendStreamingMessage", params, None);
        let task = task_id(&send.events(1)[0].data);
        let mut subscription = open_at(&base, path, "SubscribeToTask", json!({"id": task}), None);
        let sent = send.events(usize::MAX);
        let last = sent.last().map(gist);
        let asks = Some("status \"TASK_STATE_INPUT_REQUIRED\"".to_string());
        assert_eq!(last, asks, "{sent:?}");
        // The subscription reads on to the question, at least.
        let mut seen = Vec::new();
        while !seen.iter().any(|e| Some(gist(e)) == asks) {
            let next = subscription.events(1);
            assert!(!next.is_empty(), "ended before the question: {seen:?}");
            seen.extend(next);
        }
        (task, subscription, seen)
    })
    .await
    .unwrap();
    let mut answer = D::V10.message("Ada");
    answer["taskId"] = json!(task);
    let answered = front
        .call_with(
            "/a2a/agents/far",
            D::V10,
            "SendMessage",
            json!({"message": answer}),
            &[],
        )
        .await;
    let state = &answered.result()["task"]["status"]["state"];
    assert_eq!(state, "TASK_STATE_COMPLETED", "{}", answered.body);
    let events = tokio::task::spawn_blocking(move || {
        seen.extend(subscription.events(usize::MAX));
        seen
    })
    .await
    .unwrap();
    // Every event has an id (versions() reads each), each past the one before; the
    // subscription upstream opens with the task waiting for the answer.
    let all = versions(&events);
    assert!(all.windows(2).all(|w| w[1] > w[0]), "{all:?} {events:?}");
    let takeover = Some("task \"TASK_STATE_INPUT_REQUIRED\"".to_string());
    assert!(
        events.iter().any(|e| Some(gist(e)) == takeover),
        "{events:?}"
    );
    let last = events.last().map(gist);
    let done = Some("status \"TASK_STATE_COMPLETED\"".to_string());
    assert_eq!(last, done, "{events:?}");
}

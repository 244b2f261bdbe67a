//! Resumable streams: every event of a task's stream carries `id: <task>:<version>`; a
//! client that lost its connection comes back with `Last-Event-ID` and gets what it missed,
//! in order and once, then the live events, then the end.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{parse_sse, rpc, spawn_with, TestGateway, D};

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

/// Opens a stream by hand on a raw connection (so that the test decides how it ends):
/// the request, with `last_event_id` if given; returns the socket, read past the head.
fn open(
    base: &str,
    method: &str,
    params: Value,
    last_event_id: Option<&str>,
) -> BufReader<TcpStream> {
    let addr = base.trim_start_matches("http://").to_string();
    let mut socket = TcpStream::connect(&addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let body = rpc(method, params);
    let resume = last_event_id.map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
    write!(
        socket,
        "POST /a2a/agents/ticker HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nAccept: text/event-stream\r\n{resume}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(socket);
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    reader
}

/// Reads events until `n` are read (or the stream ends: `n` = usize::MAX).
fn read_events(reader: &mut BufReader<TcpStream>, n: usize) -> Vec<Event> {
    let mut events = Vec::new();
    let (mut id, mut data) = (None, String::new());
    let mut line = String::new();
    while events.len() < n {
        line.clear();
        // Chunked encoding: size lines and data lines interleave; only SSE fields count.
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = line.trim_end_matches(['\r', '\n']);
        if let Some(v) = text.strip_prefix("id:") {
            id = Some(v.trim().to_string());
        } else if let Some(v) = text.strip_prefix("data:") {
            data.push_str(v.trim_start());
        } else if text.is_empty() && !data.is_empty() {
            events.push(Event {
                id: id.take(),
                data: serde_json::from_str(&data).unwrap(),
            });
            data.clear();
        } else if text == "0" {
            // The last chunk: the stream ended.
            break;
        }
    }
    events
}

/// Drops a connection abruptly: a reset instead of a close.
fn reset(reader: BufReader<TcpStream>) {
    let socket = reader.into_inner();
    socket2::SockRef::from(&socket)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(socket);
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
                let first = read_events(&mut stream, 4);
                match how {
                    "rst" => reset(stream),
                    _ => drop(stream),
                }
                // Events go on while the client is away.
                std::thread::sleep(Duration::from_millis(500));
                let last = first.last().unwrap();
                let id = last.id.clone().expect("every task event has an id");
                let task = first[0].data["result"]["task"]["id"]
                    .as_str()
                    .unwrap()
                    .to_string();
                assert!(id.starts_with(&format!("{task}:")), "{id}");
                let params = match method {
                    "SubscribeToTask" => json!({"id": task}),
                    _ => send_params(),
                };
                let mut again = open(&base, method, params, Some(&id));
                let rest = read_events(&mut again, usize::MAX);
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
    let task = events[0].data["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let other = uuid::Uuid::new_v4().to_string();
    let gw = &gw;
    let call = |params: Value, id: String| async move {
        gw.post_raw(
            "/a2a/agents/ticker",
            &[
                ("content-type", "application/json"),
                ("A2A-Version", "1.0"),
                ("Last-Event-ID", &id),
            ],
            rpc("SubscribeToTask", params),
        )
        .await
    };
    // Another task's id than the one subscribed to.
    let r = call(json!({"id": task}), format!("{other}:2")).await;
    assert_eq!(r.code(), -32001, "{}", r.body);
    // An unknown task, on a repeated send.
    let r = gw
        .post_raw(
            "/a2a/agents/ticker",
            &[
                ("content-type", "application/json"),
                ("A2A-Version", "1.0"),
                ("Last-Event-ID", &format!("{other}:1")),
            ],
            rpc("SendStreamingMessage", send_params()),
        )
        .await;
    assert_eq!(r.code(), -32001, "{}", r.body);
    assert!(r.message().contains(&other), "{}", r.body);
    // Not an id this gateway makes.
    let r = call(json!({"id": task}), "nonsense".into()).await;
    assert_eq!(r.code(), -32602, "{}", r.body);
    assert!(r.message().contains("Last-Event-ID"), "{}", r.body);
    // A finished task, resumed past its end: nothing more, and the stream ends.
    let resp = gw
        .client
        .post(gw.url("/a2a/agents/ticker"))
        .header("content-type", "application/json")
        .header("A2A-Version", "1.0")
        .header("Last-Event-ID", format!("{task}:8"))
        .body(rpc("SubscribeToTask", json!({"id": task})))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(parse_sse(&text).is_empty(), "{text}");
    // From earlier: the missed events, then the end.
    let resp = gw
        .client
        .post(gw.url("/a2a/agents/ticker"))
        .header("content-type", "application/json")
        .header("A2A-Version", "1.0")
        .header("Last-Event-ID", format!("{task}:6"))
        .body(rpc("SubscribeToTask", json!({"id": task})))
        .send()
        .await
        .unwrap();
    let replayed = parse_sse(&resp.text().await.unwrap());
    assert_eq!(replayed.len(), 2, "{replayed:?}");
    assert_eq!(
        replayed[1].data["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    // The gateway is none the worse.
    assert_eq!(whole_stream(gw).await.len(), 9);
}

//! Hostile clients and peers, over raw sockets where a polite HTTP client would not misbehave:
//! silent and slow connections, connection floods from one address, bodies that never end,
//! bodies that would fill memory, credentials that contradict each other, programs that flood
//! or outlive their task, upstreams that never answer. Each case would hang or exhaust the
//! gateway without its fix; each ends with the gateway still answering.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::helpers::{sha, spawn_with, TestGateway, D, ECHO};
use crate::peers::{fault_server, upstream_agent};

fn addr(gw: &TestGateway) -> SocketAddr {
    gw.base.trim_start_matches("http://").parse().unwrap()
}

/// A connection to the gateway from the loopback address `from` (127.0.0.x).
async fn connect_from(gw: &TestGateway, from: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(addr(gw)).await.unwrap()
}

/// Reads until the peer closes (or `limit` passes); returns what came and whether it closed.
async fn read_to_close(stream: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// Reads `stream` to its close, which must come within 5 s of `started` with a 408 and its
/// JSON-RPC body as the last answer (a body given up at its deadline); returns all that came.
async fn read_to_408(stream: &mut TcpStream, started: Instant) -> String {
    let (answer, closed) = read_to_close(stream, Duration::from_secs(6)).await;
    let last = answer.rfind("HTTP/1.1 ").map_or("", |at| &answer[at..]);
    assert!(last.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(last.contains("-32061"), "a JSON-RPC body: {answer:?}");
    assert!(closed, "the connection is closed");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    answer
}

async fn healthy(gw: &TestGateway) {
    let health: Value = gw.get_json("/a2a/health").await;
    assert_eq!(health["status"], "ok", "{health}");
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_header_timeout() {
    let gw = spawn_with(&[("echo.toml", ECHO)], "[limits]\nheader_timeout_secs = 1").await;
    let started = Instant::now();
    let mut silent = connect_from(&gw, "127.0.0.1").await;
    let (_, closed) = read_to_close(&mut silent, Duration::from_secs(5)).await;
    assert!(closed, "a connection that sends nothing is closed");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    healthy(&gw).await;
}

/// Past the per-address cap, that address is refused at once; other addresses are served
/// up to the global cap; health keeps answering from elsewhere.
#[tokio::test]
async fn connection_floods_are_refused_at_once_per_address_and_overall() {
    let gw = spawn_with(
        &[("echo.toml", ECHO)],
        "[limits]\nmax_connections = 6\nmax_connections_per_ip = 3\nheader_timeout_secs = 20",
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from(&gw, "127.0.0.2").await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = connect_from(&gw, "127.0.0.2").await;
    let (answer, closed) = read_to_close(&mut extra, Duration::from_secs(2)).await;
    assert!(closed, "refused at once, not after a timeout");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    assert!(answer.contains("too many connections"), "{answer:?}");
    // Another address still gets in, and the gateway says what it allows.
    let health = raw_health(&gw, "127.0.0.3").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health:?}");
    assert!(health.contains("\"maxConnections\":6"), "{health:?}");
    for from in ["127.0.0.3", "127.0.0.3", "127.0.0.4"] {
        held.push(connect_from(&gw, from).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Six held: the seventh, from anywhere, is refused.
    let mut seventh = connect_from(&gw, "127.0.0.5").await;
    let (answer, closed) = read_to_close(&mut seventh, Duration::from_secs(2)).await;
    assert!(closed && answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let health = raw_health(&gw, "127.0.0.5").await;
    assert!(
        health.starts_with("HTTP/1.1 200"),
        "places come back: {health:?}"
    );
}

/// `GET /a2a/health` on a connection of its own from `from`, closed after the answer.
async fn raw_health(gw: &TestGateway, from: &str) -> String {
    let mut c = connect_from(gw, from).await;
    c.write_all(b"GET /a2a/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    read_to_close(&mut c, Duration::from_secs(2)).await.0
}

/// A body that stops arriving is answered 408 and its connection closed; a body announced
/// to a private agent without credentials is refused before any of it is read.
#[tokio::test]
async fn bodies_that_never_end_get_408_and_anonymous_ones_401_first() {
    let gateway = format!(
        "[limits]\nbody_timeout_secs = 1\nbody_min_bytes_per_sec = 1048576\n\
         [auth]\n[[auth.api_keys]]\nid = \"k\"\nsecret_sha256 = \"{}\"\n",
        sha("key")
    );
    let private =
        "name = \"private\"\ndescription = \"d\"\naccess = \"authenticated\"\n[backend]\nkind = \"echo\"\n";
    let gw = spawn_with(&[("echo.toml", ECHO), ("private.toml", private)], &gateway).await;
    let head = |path: &str, len: usize| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        )
    };
    // Half a body, then silence.
    let mut slow = connect_from(&gw, "127.0.0.1").await;
    slow.write_all(head("/a2a/agents/echo", 100_000).as_bytes())
        .await
        .unwrap();
    slow.write_all(&[b' '; 50_000]).await.unwrap();
    let started = Instant::now();
    let answer = read_to_408(&mut slow, started).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");

    // No credentials for a private agent: 401 while the body is still unsent.
    let mut anonymous = connect_from(&gw, "127.0.0.1").await;
    anonymous
        .write_all(head("/a2a/agents/private", 1_000_000).as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(2), anonymous.read(&mut buf))
        .await
        .expect("answered before the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer:?}");
    healthy(&gw).await;
}

/// A 1.0 `SendMessage` body with `text`.
fn send_body(text: &str) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
           "params": {"message": D::V10.message(text)}})
    .to_string()
}

/// The head of a POST of a `len`-byte body to the echo agent, with `extra` header lines.
fn echo_post_head(len: usize, extra: &str) -> String {
    format!(
        "POST /a2a/agents/echo HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         a2a-version: 1.0\r\ncontent-length: {len}\r\n{extra}\r\n"
    )
}

/// A body that comes after its head, in pieces a while apart, is waited for and answered;
/// the next call on the connection, head and body in one write, is answered too. (Most
/// bodies come with their head and are read in the same turn; one that does not must still
/// be read, and answered, when it comes.)
#[tokio::test]
async fn a_body_that_comes_after_its_head_in_pieces_is_answered() {
    let gw = spawn_with(&[("echo.toml", ECHO)], "").await;
    let mut c = connect_from(&gw, "127.0.0.1").await;
    let first = send_body("in pieces");
    c.write_all(echo_post_head(first.len(), "").as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (a, b) = first.split_at(first.len() / 2);
    c.write_all(a.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    c.write_all(b.as_bytes()).await.unwrap();
    let second = send_body("at once");
    let mut whole = echo_post_head(second.len(), "connection: close\r\n").into_bytes();
    whole.extend_from_slice(second.as_bytes());
    // The first answer is read before the second call goes out: one call at a time.
    let mut answered = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&answered).contains("in pieces") {
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("the first call answered")
            .unwrap();
        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&answered));
        answered.extend_from_slice(&buf[..n]);
    }
    let answered = String::from_utf8_lossy(&answered).into_owned();
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered:?}");
    assert!(answered.contains("TASK_STATE_COMPLETED"), "{answered:?}");
    c.write_all(&whole).await.unwrap();
    let (answer, closed) = read_to_close(&mut c, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(answer.contains("at once"), "{answer:?}");
    assert!(closed, "connection: close was kept");
    healthy(&gw).await;
}

/// A pipelined call whose body never comes (the head sent behind a whole first call, then
/// silence) is answered 408 like any body that stops arriving: the first call is answered,
/// and the second is not left waiting on a connection nothing else will wake.
#[tokio::test]
async fn a_pipelined_call_whose_body_never_comes_gets_408() {
    let gw = spawn_with(
        &[("echo.toml", ECHO)],
        "[limits]\nbody_timeout_secs = 1\nbody_min_bytes_per_sec = 1048576\n",
    )
    .await;
    let body = send_body("first");
    let mut c = connect_from(&gw, "127.0.0.1").await;
    let pipelined = format!(
        "{}{body}{}",
        echo_post_head(body.len(), ""),
        echo_post_head(100, "")
    );
    c.write_all(pipelined.as_bytes()).await.unwrap();
    let started = Instant::now();
    let answer = read_to_408(&mut c, started).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    healthy(&gw).await;
}

/// Bodies still arriving may hold only so many bytes gateway-wide: past that, new ones are
/// refused at once with 503, and the bytes come back when the slow body is given up.
#[tokio::test]
async fn buffered_bodies_have_a_gateway_wide_budget() {
    let gw = spawn_with(
        &[("echo.toml", ECHO)],
        "[limits]\nmax_buffered_body_bytes = 100000\nmax_buffered_body_bytes_per_caller = 100000\nmax_buffered_body_bytes_anonymous = 100000\nbody_timeout_secs = 30",
    )
    .await;
    let head = |len: usize| {
        format!("POST /a2a/agents/echo HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n")
    };
    let mut hog = connect_from(&gw, "127.0.0.1").await;
    hog.write_all(head(80_000).as_bytes()).await.unwrap();
    hog.write_all(&[b' '; 1000]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let health: Value = gw.get_json("/a2a/health").await;
    assert_eq!(health["bufferedBodyBytes"], 80_000, "{health}");
    let r = gw
        .post_raw(
            "/a2a/agents/echo",
            &[("content-type", "application/json")],
            json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message": D::V10.message(&"x".repeat(30_000))}})
                .to_string(),
        )
        .await;
    assert_eq!((r.status, r.code()), (503, -32062), "{}", r.body);
    assert_eq!(r.header("retry-after"), "1");
    drop(hog);
    bodies_given_back(&gw).await;
}

/// Once held bodies are given up, their bytes are back and a new body is served.
async fn bodies_given_back(gw: &TestGateway) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let health: Value = gw.get_json("/a2a/health").await;
    assert_eq!(health["bufferedBodyBytes"], 0, "given back: {health}");
    let again = gw.send(D::V10, "small").await;
    assert_eq!(again["status"]["state"], "TASK_STATE_COMPLETED");
}

/// One caller holding bodies open takes only its share of the budget: its next body is
/// refused with 429, while a caller from another address is served, and the share comes
/// back when its bodies are given up.
#[tokio::test]
async fn a_caller_holding_bodies_open_takes_only_its_share() {
    let gw = spawn_with(
        &[("echo.toml", ECHO)],
        "[limits]\nmax_buffered_body_bytes = 800000\nbody_timeout_secs = 30",
    )
    .await;
    // An eighth of the budget each: 100,000 bytes.
    let head = |len: usize| {
        format!("POST /a2a/agents/echo HTTP/1.1\r\nhost: x\r\na2a-version: 1.0\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n{{")
    };
    let mut hogs = Vec::new();
    for _ in 0..2 {
        let mut hog = connect_from(&gw, "127.0.0.1").await;
        hog.write_all(head(45_000).as_bytes()).await.unwrap();
        hogs.push(hog);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = connect_from(&gw, "127.0.0.1").await;
    third.write_all(head(45_000).as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut answer))
        .await
        .expect("answered at once")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("-32062"), "{answer}");
    assert!(answer.contains("BODIES_OVER_SHARE"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    let health: Value = gw.get_json("/a2a/health").await;
    assert_eq!(health["bufferedBodyBytes"], 90_000, "{health}");
    // Another address is another caller: its slow body is taken.
    let mut other = connect_from(&gw, "127.0.0.2").await;
    let body = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message": D::V10.message("from elsewhere")}}).to_string();
    let request = format!(
        "POST /a2a/agents/echo HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\na2a-version: 1.0\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    other.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    other.write_all(body.as_bytes()).await.unwrap();
    let mut served = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), other.read(&mut served))
        .await
        .unwrap()
        .unwrap();
    let served = String::from_utf8_lossy(&served[..n]);
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    assert!(served.contains("TASK_STATE_COMPLETED"), "{served}");
    drop(hogs);
    bodies_given_back(&gw).await;
}

/// The task store is bounded in bytes as well as in tasks: large finished tasks are
/// evicted oldest first, unfinished ones past a caller's share refuse that caller's new
/// tasks (429) and nobody else's, and when only unfinished tasks are left the store refuses
/// new ones (503). Its bytes are in /metrics.
#[tokio::test]
async fn the_task_store_is_bounded_in_bytes() {
    let gateway = format!(
        "[limits]\nmax_stored_bytes = 3000000\nmax_unfinished_bytes_per_caller = 2000000\n\
         [auth]\n[[auth.api_keys]]\nid = \"k\"\nsecret_sha256 = \"{}\"\n",
        sha("key")
    );
    let gw = spawn_with(&[("echo.toml", ECHO)], &gateway).await;
    let big = "x".repeat(250_000);
    let stored = |metrics: &str, of: &str| -> u64 {
        let line = format!("a2a_stored_task_bytes{{of=\"{of}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .unwrap_or_else(|| panic!("{of} in {metrics}"))
            .trim()
            .parse()
            .unwrap()
    };
    // Each echoed task holds the text twice (the message and the artifact): ~500 kB.
    let mut ids = Vec::new();
    for _ in 0..12 {
        let task = gw.send(D::V10, &big).await;
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
        ids.push(task["id"].as_str().unwrap().to_string());
    }
    let metrics = gw.metrics().await;
    let total = stored(&metrics, "total");
    assert!(total <= 3_000_000, "{total}");
    assert!(total >= 2_000_000, "{total}");
    assert_eq!(stored(&metrics, "limit"), 3_000_000);
    assert!(stored(&metrics, "largest_task") >= 500_000, "{metrics}");
    assert_eq!(
        gw.get_task(D::V10, &ids[0]).await.code(),
        -32001,
        "the oldest went"
    );
    assert!(gw.get_task(D::V10, &ids[11]).await.result()["id"].is_string());
    // Unfinished tasks (waiting for input) count against their caller's share.
    let ask = |key: Option<&'static str>| {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message": D::V10.message(&format!("/input {}", &big[..100_000]))}});
        let mut headers = vec![("A2A-Version", "1.0")];
        headers.extend(key.map(|k| ("X-API-Key", k)));
        let gw = &gw;
        async move {
            let r = gw
                .post_raw("/a2a/agents/echo", &headers, body.to_string())
                .await;
            (r.status, r.body)
        }
    };
    let mut held = 0;
    let refused = loop {
        let (status, body) = ask(None).await;
        if status != 200 {
            break (status, body);
        }
        held += 1;
        assert!(held < 10, "never refused");
    };
    assert!(held >= 2, "{held}: {}", refused.1);
    assert_eq!(
        (refused.0, refused.1["error"]["code"].clone()),
        (429, json!(-32052)),
        "{}",
        refused.1
    );
    assert!(
        refused.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("of unfinished tasks"),
        "{}",
        refused.1
    );
    // Another caller is served, until only unfinished tasks fill the store.
    let (status, body) = ask(Some("key")).await;
    assert_eq!(status, 200, "another caller is served: {body}");
    let full = loop {
        let (status, body) = ask(Some("key")).await;
        if status != 200 {
            break (status, body);
        }
    };
    assert_eq!(
        (full.0, full.1["error"]["code"].clone()),
        (503, json!(-32052)),
        "{}",
        full.1
    );
    assert_eq!(
        full.1["error"]["data"][0]["reason"], "TASK_STORE_FULL",
        "{}",
        full.1
    );
    let metrics = gw.metrics().await;
    assert!(
        stored(&metrics, "total") <= 3_000_000 + 600_000,
        "{metrics}"
    );
    healthy(&gw).await;
}

#[tokio::test]
async fn conflicting_credentials_are_refused() {
    let gateway = format!(
        "[auth]\n[[auth.api_keys]]\nid = \"a\"\nsecret_sha256 = \"{}\"\n[[auth.bearer_tokens]]\nid = \"b\"\nsecret_sha256 = \"{}\"\n",
        sha("key-a"),
        sha("token-b")
    );
    let gw = spawn_with(&[("echo.toml", ECHO)], &gateway).await;
    let body = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message": D::V10.message("x")}}).to_string();
    let send = |headers: Vec<(&'static str, &'static str)>| {
        let mut all = vec![("A2A-Version", "1.0")];
        all.extend(headers);
        let (gw, body) = (&gw, body.clone());
        async move { gw.post_raw("/a2a/agents/echo", &all, body).await }
    };
    let ok = send(vec![("X-API-Key", "key-a")]).await;
    assert_eq!(ok.status, 200);
    for headers in [
        vec![("X-API-Key", "key-a"), ("Authorization", "Bearer token-b")],
        vec![("X-API-Key", "key-a"), ("Authorization", "Bearer wrong")],
        vec![("X-API-Key", "key-a"), ("X-API-Key", "key-a")],
        vec![
            ("Authorization", "Bearer token-b"),
            ("Authorization", "Bearer token-b"),
        ],
    ] {
        let r = send(headers.clone()).await;
        assert_eq!(
            (r.status, r.code()),
            (401, -32041),
            "{headers:?}: {}",
            r.body
        );
    }
}

fn command_agent(name: &str, command: &[&str], extra: &str) -> String {
    let argv: Vec<String> = command.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "name = \"{name}\"\ndescription = \"d\"\n[backend]\nkind = \"command\"\ncommand = [{}]\n{extra}\n",
        argv.join(", ")
    )
}

/// Programs that write while they read get their whole input (no pipe deadlock); inputs
/// and outputs past the agent's caps fail the task clearly; what a program leaves running
/// does not hold its task.
#[tokio::test]
async fn command_programs_cannot_deadlock_flood_or_linger() {
    let gw = spawn_with(
        &[
            (
                "cat.toml",
                &command_agent("cat", &["cat"], "timeout_secs = 20"),
            ),
            (
                "small.toml",
                &command_agent("small", &["cat"], "max_input_bytes = 1000"),
            ),
            (
                "flood.toml",
                &command_agent("flood", &["yes", "flood"], "max_output_bytes = 100000"),
            ),
            (
                "linger.toml",
                &command_agent(
                    "linger",
                    &["sh", "-c", "sleep 30 & echo done"],
                    "timeout_secs = 20\nkill_grace_ms = 200",
                ),
            ),
        ],
        "[limits]\nmax_body_bytes = 2000000",
    )
    .await;
    let send = |agent: &'static str, text: String| {
        let gw = &gw;
        async move {
            let r = gw
                .call(
                    &format!("/a2a/agents/{agent}"),
                    D::V10,
                    "SendMessage",
                    json!({"message": D::V10.message(&text)}),
                )
                .await;
            r.result()["task"].clone()
        }
    };
    let big = "0123456789abcdef\n".repeat(30_000); // 510 KB, well past a pipe's buffer
    let task = send("cat", big.clone()).await;
    assert_eq!(
        task["status"]["state"], "TASK_STATE_COMPLETED",
        "{}",
        task["status"]
    );
    let echoed: String = task["artifacts"][0]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["text"].as_str().unwrap())
        .collect();
    assert_eq!(echoed.len(), big.len() + 1, "all of it came back");

    let task = send("small", "x".repeat(2000)).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED");
    let said = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(said.contains("larger than this agent takes"), "{said}");

    let task = send("flood", "go".into()).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED");
    let said = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(said.contains("wrote more than 100000 bytes"), "{said}");

    let started = Instant::now();
    let task = send("linger", "x".into()).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a background child does not hold the task: {:?}",
        started.elapsed()
    );
}

/// An upstream that never sends its response head: the caller's stream starts anyway (so
/// keep-alives flow) and ends with a timeout error within timeout_secs.
#[tokio::test]
async fn a_silent_upstream_stream_times_out() {
    let peer = fault_server("slow", 60).await;
    let up = upstream_agent("up", &peer.url(), "protocol = \"1.0\"\ntimeout_secs = 2");
    let gw = spawn_with(&[("up.toml", &up)], "").await;
    let started = Instant::now();
    let events = gw
        .sse(
            "/a2a/agents/up",
            D::V10,
            "SendStreamingMessage",
            json!({"message": D::V10.message("anyone?")}),
        )
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    let last = &events.last().expect("an event").data;
    assert_eq!(last["error"]["code"], -32053, "{last}");
}

/// One caller filling the store with tasks waiting for input is refused once it holds its
/// quota, while another caller is still served; tasks left unanswered past
/// `interrupted_ttl_secs` are canceled, which gives the caller its places back.
#[tokio::test]
async fn one_caller_cannot_fill_the_task_store() {
    let gateway = format!(
        "[limits]\nmax_unfinished_tasks_per_caller = 3\ninterrupted_ttl_secs = 1\n\
         [auth]\n[[auth.api_keys]]\nid = \"k\"\nsecret_sha256 = \"{}\"\n",
        sha("key")
    );
    let gw = spawn_with(&[("echo.toml", ECHO)], &gateway).await;
    let ask = |key: Option<&'static str>| {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message": D::V10.message("/input still there?")}});
        let mut headers = vec![("A2A-Version", "1.0")];
        headers.extend(key.map(|k| ("X-API-Key", k)));
        let gw = &gw;
        async move {
            let r = gw
                .post_raw("/a2a/agents/echo", &headers, body.to_string())
                .await;
            (r.status, r.body)
        }
    };
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, body) = ask(None).await;
        assert_eq!(status, 200, "{body}");
        ids.push(body["result"]["task"]["id"].as_str().unwrap().to_string());
    }
    let (status, body) = ask(None).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (429, json!(-32052)),
        "{body}"
    );
    let (status, body) = ask(Some("key")).await;
    assert_eq!(status, 200, "another caller is served: {body}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let r = gw.get_task(D::V10, &ids[0]).await;
    let status = &r.result()["status"];
    assert_eq!(status["state"], "TASK_STATE_CANCELED", "{status}");
    assert!(
        status["message"]["parts"][0]["text"]
            .as_str()
            .unwrap()
            .contains("no answer came within 1 s"),
        "{status}"
    );
    let (status, body) = ask(None).await;
    assert_eq!(status, 200, "places come back: {body}");
}

/// Knowing another caller's contextId steers nothing of theirs: affinity and the order of
/// a conversation's messages are per caller. And the echo agent's `/delay` has a ceiling.
#[tokio::test]
async fn a_caller_cannot_steer_or_stall_another_callers_conversation() {
    let gateway = format!(
        "default_agent = \"echo\"\n[auth]\n[[auth.api_keys]]\nid = \"p1\"\nsecret_sha256 = \"{}\"\n[[auth.api_keys]]\nid = \"p2\"\nsecret_sha256 = \"{}\"\n",
        sha("key-1"),
        sha("key-2")
    );
    let capped = ECHO
        .replace("name = \"echo\"", "name = \"capped\"")
        .replace("kind = \"echo\"", "kind = \"echo\"\nmax_delay_secs = 1");
    let gw = spawn_with(
        &[
            ("echo.toml", ECHO),
            ("other.toml", crate::helpers::OTHER),
            ("capped.toml", &capped),
        ],
        &gateway,
    )
    .await;
    let send =
        |path: &'static str, key: &'static str, text: &str, metadata: Value, blocking: bool| {
            let mut message = D::V10.message(text);
            message["contextId"] = json!("shared-ctx");
            message["metadata"] = metadata;
            let body = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{
            "message": message, "configuration": {"returnImmediately": !blocking}}});
            let gw = &gw;
            async move {
                let headers = [("A2A-Version", "1.0"), ("X-API-Key", key)];
                let r = gw.post_raw(path, &headers, body.to_string()).await;
                (r.header("a2a-gateway-agent").to_string(), r.body)
            }
        };
    // P2 claims the conversation for `other`, and parks a long task in it on `echo`.
    let (agent, _) = send(
        "/a2a",
        "key-2",
        "mine now",
        json!({"gateway/agent": "other"}),
        true,
    )
    .await;
    assert_eq!(agent, "other");
    send(
        "/a2a/agents/echo",
        "key-2",
        "/delay 30 stall",
        json!({}),
        false,
    )
    .await;
    // P1's message on the same contextId goes where P1's would, at once.
    let started = Instant::now();
    let (agent, body) = send("/a2a", "key-1", "hello", json!({}), true).await;
    assert_eq!(agent, "echo", "not steered by P2: {body}");
    assert_eq!(
        body["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "not stalled: {:?}",
        started.elapsed()
    );
    // A day's delay is capped by the agent's max_delay_secs.
    let started = Instant::now();
    let (_, body) = send(
        "/a2a/agents/capped",
        "key-1",
        "/delay 86400 late",
        json!({}),
        true,
    )
    .await;
    assert_eq!(
        body["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// An upstream's card cannot send the agent file's secret headers elsewhere: calls stay on
/// the file's origin unless the file says `follow_card_url`, and then go without the
/// headers; a card that redirects to another origin is not followed.
#[tokio::test]
async fn a_hostile_upstream_card_cannot_collect_the_files_secrets() {
    let log = tempfile::tempdir().unwrap();
    let seen = log.path().join("collector.jsonl");
    let collector =
        crate::peers::fault_server_with("error", 0, &["--log-requests", seen.to_str().unwrap()])
            .await;
    let elsewhere = collector.url();
    let hostile =
        crate::peers::fault_server_with("extended", 0, &["--card-interface", &elsewhere]).await;
    let redirecting = crate::peers::fault_server_with(
        "extended",
        0,
        &[
            "--card-redirect",
            &format!("{elsewhere}.well-known/agent-card.json"),
        ],
    )
    .await;
    // A redirect on the card's own origin is followed (with the file's headers).
    let moved = crate::peers::fault_server_with(
        "extended",
        0,
        &["--card-redirect", "/.well-known/agent-card.json?moved=1"],
    )
    .await;
    let secret = "headers = { X-Secret = \"s3cret\" }";
    let gw = spawn_with(
        &[
            (
                "pinned.toml",
                &upstream_agent("pinned", &hostile.url(), secret),
            ),
            (
                "follows.toml",
                &upstream_agent(
                    "follows",
                    &hostile.url(),
                    &format!("{secret}\nfollow_card_url = true"),
                ),
            ),
            (
                "redirected.toml",
                &upstream_agent("redirected", &redirecting.url(), secret),
            ),
            ("moved.toml", &upstream_agent("moved", &moved.url(), secret)),
        ],
        "",
    )
    .await;
    let send = |agent: &str| {
        let path = format!("/a2a/agents/{agent}");
        let gw = &gw;
        async move {
            gw.call(
                &path,
                D::V10,
                "SendMessage",
                json!({"message": D::V10.message("hi")}),
            )
            .await
        }
    };
    // Pinned: answered by the file's own origin (the extended upstream), not the card's.
    let r = send("pinned").await;
    assert_eq!(
        r.result()["task"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{}",
        r.body
    );
    // Following the card: the collector answers (-32001), and sees no secret.
    let r = send("follows").await;
    assert_eq!(r.code(), -32001, "{}", r.body);
    // A card behind a cross-origin redirect is not fetched: the agent stays unavailable.
    let r = send("redirected").await;
    assert_eq!(r.code(), -32051, "{}", r.body);
    let r = send("moved").await;
    assert_eq!(
        r.result()["task"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{}",
        r.body
    );
    let requests = std::fs::read_to_string(&seen).unwrap_or_default();
    let requests: Vec<Value> = requests
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        requests.len(),
        1,
        "only the followed call reached it: {requests:?}"
    );
    for r in &requests {
        assert!(
            r["headers"].get("x-secret").is_none(),
            "a secret crossed origins: {r}"
        );
    }
}

/// On the shared endpoints, a task of a private agent and a task that does not exist are
/// answered alike to a caller who may not see it: its existence leaks nothing.
#[tokio::test]
async fn task_calls_on_the_shared_endpoints_do_not_reveal_private_tasks() {
    let gateway = format!(
        "default_agent = \"open\"\n[auth]\n[[auth.api_keys]]\nid = \"k\"\nsecret_sha256 = \"{}\"\n",
        sha("key")
    );
    let secure = "name = \"secure\"\ndescription = \"d\"\naccess = \"authenticated\"\n[backend]\nkind = \"echo\"\n";
    let open = "name = \"open\"\ndescription = \"d\"\n[backend]\nkind = \"echo\"\n";
    let gw = spawn_with(&[("secure.toml", secure), ("open.toml", open)], &gateway).await;
    let body = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message": D::V10.message("private")}});
    let headers = [("A2A-Version", "1.0"), ("X-API-Key", "key")];
    let created = gw
        .post_raw("/a2a/agents/secure", &headers, body.to_string())
        .await
        .body;
    let id = created["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    for (label, task) in [
        ("private", id.as_str()),
        ("unknown", "00000000-0000-4000-8000-000000000000"),
    ] {
        let r = gw
            .call("/a2a", D::V10, "GetTask", json!({"id": task}))
            .await;
        assert_eq!((r.status, r.code()), (200, -32001), "{label}: {}", r.body);
        let rest = gw
            .client
            .get(gw.url(&format!("/a2a/rest/tasks/{task}")))
            .send()
            .await
            .unwrap();
        assert_eq!(rest.status(), 404, "{label}");
        let v: Value = rest.json().await.unwrap();
        assert_eq!(
            v["error"]["details"][0]["reason"], "TASK_NOT_FOUND",
            "{label}: {v}"
        );
    }
}

/// Small holes: file bytes that are not base64, credentials with the "null" origin, CORS
/// headers for origins that are not allowed.
#[tokio::test]
async fn bad_base64_null_origins_and_foreign_origins_are_refused() {
    let gw = spawn_with(
        &[("echo.toml", ECHO)],
        "[cors]\nallowed_origins = [\"https://app.example\"]",
    )
    .await;
    for (d, part) in [
        (
            D::V10,
            json!({"raw": "not base64!!", "mediaType": "text/plain"}),
        ),
        (
            D::V03,
            json!({"kind": "file", "file": {"bytes": "%%%", "mimeType": "text/plain"}}),
        ),
    ] {
        let mut message = d.message("x");
        message["parts"] = json!([part]);
        let r = gw
            .call("/a2a/agents/echo", d, d.send(), json!({"message": message}))
            .await;
        assert_eq!(r.code(), -32602, "{d:?}: {}", r.body);
        assert!(r.message().contains("not valid base64"), "{}", r.message());
    }
    let mut fine = D::V10.message("x");
    fine["parts"] = json!([{"raw": "aGVsbG8", "mediaType": "text/plain"}]);
    let r = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": fine}),
        )
        .await;
    assert!(
        r.body.get("result").is_some(),
        "unpadded base64 is fine: {}",
        r.body
    );

    let foreign = gw
        .client
        .post(gw.url("/a2a/agents/echo"))
        .header("Origin", "https://evil.example")
        .header("A2A-Version", "1.0")
        .body(json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message": D::V10.message("x")}}).to_string())
        .send()
        .await
        .unwrap();
    let cors: Vec<_> = foreign
        .headers()
        .keys()
        .filter(|k| k.as_str().starts_with("access-control-"))
        .collect();
    assert!(
        cors.is_empty(),
        "no CORS headers for a foreign origin: {cors:?}"
    );

    let err = crate::helpers::load_errors(
        &[("echo.toml", ECHO)],
        "[cors]\nallowed_origins = [\"null\"]\nallow_credentials = true\n",
    );
    assert!(
        err.contains("cannot be combined with the origin \"null\""),
        "{err}"
    );
}

/// (open connections, open streams) as health reports them, less health's own connection.
async fn open_now(gw: &TestGateway) -> (u64, u64) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let h: Value = client
        .get(gw.url("/a2a/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (
        h["openConnections"].as_u64().unwrap() - 1,
        h["openStreams"].as_u64().unwrap(),
    )
}

/// Waits until health reports `want`; returns how long that took.
async fn settle(gw: &TestGateway, want: (u64, u64)) -> Duration {
    let started = Instant::now();
    loop {
        let now = open_now(gw).await;
        if now == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "still {now:?}, waiting for {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client that closes a stream (a FIN, not only an RST) is noticed within a keep-alive
/// period or two, and its connection and stream place are given back.
#[tokio::test]
async fn a_client_that_closes_a_stream_gives_back_its_connection() {
    let gw = spawn_with(
        &[("echo.toml", ECHO)],
        "[limits]\nstream_keepalive_secs = 1",
    )
    .await;
    let baseline = open_now(&gw).await.0;
    let body = |method: &str, text: &str| {
        json!({"jsonrpc":"2.0","id":1,"method":method,"params":{"message": D::V10.message(text)}})
            .to_string()
    };
    let request = |body: String| {
        format!(
            "POST /a2a/agents/echo HTTP/1.1\r\nhost: x\r\na2a-version: 1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    // A stream, closed with a FIN after its first event.
    let mut stream = connect_from(&gw, "127.0.0.1").await;
    stream
        .write_all(request(body("SendStreamingMessage", "/delay 30 long")).as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let _ = stream.read(&mut buf).await.unwrap();
    settle(&gw, (baseline + 1, 1)).await;
    stream.shutdown().await.unwrap();
    drop(stream);
    let took = settle(&gw, (baseline, 0)).await;
    assert!(took < Duration::from_secs(4), "noticed in {took:?}");
}

/// A blocking send whose client left (a FIN after the request) gives back its socket at
/// once, not when the task ends; the task itself goes on.
#[tokio::test]
async fn a_blocking_send_whose_client_left_releases_its_socket() {
    let gw = spawn_with(&[("echo.toml", ECHO)], "").await;
    let baseline = open_now(&gw).await.0;
    let body = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage",
        "params":{"message": D::V10.message("/delay 30 long")}})
    .to_string();
    let request = format!(
        "POST /a2a/agents/echo HTTP/1.1\r\nhost: x\r\na2a-version: 1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut client = connect_from(&gw, "127.0.0.1").await;
    client.write_all(request.as_bytes()).await.unwrap();
    settle(&gw, (baseline + 1, 0)).await;
    client.shutdown().await.unwrap();
    let (answer, closed) = read_to_close(&mut client, Duration::from_secs(5)).await;
    assert!(closed, "the gateway closes its side: {answer:?}");
    let took = settle(&gw, (baseline, 0)).await;
    assert!(took < Duration::from_secs(4), "released in {took:?}");
    // The task was not canceled by the client leaving.
    let list = gw
        .call("/a2a/agents/echo", D::V10, "ListTasks", json!({}))
        .await;
    let tasks = list.result()["tasks"].as_array().unwrap().clone();
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!(tasks[0]["status"]["state"], "TASK_STATE_WORKING");
}

/// What actix-http rejects before any handler runs (a request it cannot parse, a head too
/// large, a head too slow) is answered with a JSON body like every other error, and the
/// gateway stays healthy.
#[tokio::test]
async fn http_level_rejections_have_json_bodies() {
    let gw = spawn_with(&[("echo.toml", ECHO)], "[limits]\nheader_timeout_secs = 1").await;
    let long_url = format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(40_000));
    let too_long_url = format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000));
    let many_headers = format!(
        "GET /a2a/health HTTP/1.1\r\nhost: x\r\n{}\r\n",
        (0..200)
            .map(|i| format!("x-h{i}: 1\r\n"))
            .collect::<String>()
    );
    let huge_head = format!(
        "GET /a2a/health HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "b".repeat(400 * 1024)
    );
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "bad request line",
            b"GET /a b c HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
            "400",
        ),
        (
            "control byte in the URI",
            b"GET /\x01 HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
            "400",
        ),
        (
            "bad header",
            b"GET / HTTP/1.1\r\nho st: x\r\n\r\n".to_vec(),
            "400",
        ),
        (
            "URL past what a URI holds",
            too_long_url.into_bytes(),
            "400",
        ),
        ("too many headers", many_headers.into_bytes(), "431"),
        // Sent whole: the answer must survive the rest of the head arriving after it.
        ("head over 128 KiB", huge_head.into_bytes(), "431"),
        (
            "head never finished",
            b"GET /a2a/health HTTP/1.1\r\nhost: x\r\n".to_vec(),
            "408",
        ),
    ];
    for (what, request, status) in cases {
        let mut c = connect_from(&gw, "127.0.0.1").await;
        c.write_all(&request).await.unwrap();
        let (answer, closed) = read_to_close(&mut c, Duration::from_secs(5)).await;
        assert!(closed, "{what}: closed");
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{what}: {answer:?}"
        );
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains("content-type: application/json"),
            "{what}: {head}"
        );
        let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(body["error"]["code"].to_string(), status, "{what}: {body}");
        assert!(!body["error"]["message"].as_str().unwrap().is_empty());
    }
    // A head under 128 KiB, the documented limit, is served.
    let mut c = connect_from(&gw, "127.0.0.1").await;
    let big = format!(
        "GET /a2a/health HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "b".repeat(120 * 1024)
    );
    c.write_all(big.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = c.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // A long URL that fits is routed, and its 404 does not send the URL back whole.
    let mut c = connect_from(&gw, "127.0.0.1").await;
    c.write_all(long_url.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = c.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    let length: usize = answer
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(length < 1000, "{length}");
    // Nor do the JSON-RPC answers to a POST on a long unknown path or agent name.
    for path in [
        format!("/{}", "a".repeat(40_000)),
        format!("/a2a/agents/{}", "a".repeat(40_000)),
        format!("/a2a/agents/{}/x", "a".repeat(40_000)),
    ] {
        let r = gw
            .post_raw(
                &path,
                &[("content-type", "application/json")],
                r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}"#,
            )
            .await;
        assert_eq!(r.status, 404, "{}", &path[..30]);
        assert!(r.body.to_string().len() < 2000, "{}", r.body);
    }
    healthy(&gw).await;
}

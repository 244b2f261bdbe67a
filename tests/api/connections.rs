//! The connections unary calls to an upstream go over: kept and reused while idle, one per
//! call in flight, replaced when the upstream closes them, and HTTP/2 where the agent file
//! asks for it or TLS negotiates it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{spawn_with, TestGateway, D, ECHO};
use crate::peers::upstream_agent;
use crate::running::Running;

/// An HTTP/1.1 upstream that answers every JSON-RPC call with a completed task, counting
/// the connections it accepts; with `hold_ms` set it answers that late (so that calls sent
/// together are in flight together), with `close_after` set it closes each connection
/// right after its answer, without saying so (as an upstream whose idle timeout is short
/// does).
struct Upstream {
    url: String,
    accepted: Arc<AtomicUsize>,
    knobs: Arc<Knobs>,
}

#[derive(Default)]
struct Knobs {
    hold_ms: AtomicU64,
    close_after: AtomicBool,
}

impl Upstream {
    async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let knobs = Arc::new(Knobs::default());
        let (count, close, base) = (accepted.clone(), knobs.clone(), url.clone());
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(socket, base.clone(), close.clone()));
            }
        });
        Upstream {
            url,
            accepted,
            knobs,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// An A2A 1.0 card whose one interface is `url`.
fn card(url: &str) -> Value {
    json!({"name": "counted", "description": "Counts its connections.", "version": "1.0.0",
        "supportedInterfaces": [{"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {"streaming": false}, "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"], "skills": []})
}

async fn serve(mut socket: TcpStream, url: String, knobs: Arc<Knobs>) {
    let mut buf = Vec::new();
    loop {
        let Some(head_end) = read_until_head(&mut socket, &mut buf).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..head_end + length).skip(head_end).collect();
        let answer = if head.starts_with("get ") {
            card(&url)
        } else {
            let call: Value = serde_json::from_slice(&body).unwrap_or_default();
            json!({"jsonrpc": "2.0", "id": call["id"], "result": {"task": {
                "id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_COMPLETED"}}}})
        }
        .to_string();
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        let hold = knobs.hold_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(hold)).await;
        if socket.write_all(response.as_bytes()).await.is_err() {
            return;
        }
        if knobs.close_after.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// Reads until `buf` holds a whole request head; where it ends, or `None` at the end.
async fn read_until_head(socket: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(at + 4);
        }
        let mut chunk = [0u8; 4096];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn completed(gw: &TestGateway, path: &str, text: String) {
    let r = gw
        .call(
            path,
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message(&text)}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.result()["task"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{}",
        r.body
    );
}

#[tokio::test]
async fn unary_calls_reuse_idle_connections_and_replace_closed_ones() {
    let up = Upstream::start().await;
    let gw = spawn_with(&[("up.toml", &upstream_agent("up", &up.url, ""))], "").await;
    completed(&gw, "/a2a/agents/up", "first".to_string()).await;
    let after_first = up.accepted();

    for i in 0..10 {
        completed(&gw, "/a2a/agents/up", format!("again {i}")).await;
    }
    assert_eq!(
        up.accepted(),
        after_first,
        "one after another: one connection"
    );

    // Eight at once (each held by the upstream for a while, so that all eight are in flight
    // together) need eight connections; the next eight find them idle.
    up.knobs.hold_ms.store(500, Ordering::SeqCst);
    let eight = || {
        futures_util::future::join_all(
            (0..8).map(|i| completed(&gw, "/a2a/agents/up", format!("parallel {i}"))),
        )
    };
    eight().await;
    let after_eight = up.accepted();
    assert!(after_eight <= after_first + 8, "{after_eight}");
    eight().await;
    assert_eq!(up.accepted(), after_eight, "the eight were kept and reused");
    up.knobs.hold_ms.store(0, Ordering::SeqCst);

    // The upstream now closes each connection after its answer: every call still gets its
    // answer, first on the kept connections (each closed after it), then on new ones.
    up.knobs.close_after.store(true, Ordering::SeqCst);
    for i in 0..after_eight + 4 {
        completed(&gw, "/a2a/agents/up", format!("closing {i}")).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        up.accepted() > after_eight,
        "closed connections were replaced"
    );
    let health = gw.client.get(gw.url("/a2a/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

/// HTTP/2 to an upstream: in cleartext where the agent file says `http2 = true`, and where
/// TLS negotiates it (the upstream gateway offers h2 by ALPN). Calls share the connection.
#[tokio::test]
async fn unary_calls_go_over_http2_in_cleartext_and_when_tls_negotiates_it() {
    let plain = Running::start(&[("echo.toml", ECHO)], "", "warn");
    let keys = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let (cert, key) = (keys.path().join("cert.pem"), keys.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    let tls = format!("[server.tls]\ncert_file = {cert:?}\nkey_file = {key:?}\n");
    let secure = Running::start(&[("echo.toml", ECHO)], &tls, "warn");
    assert!(secure.base.starts_with("https://"), "{}", secure.base);

    let h2c = upstream_agent(
        "h2c",
        &format!("{}/a2a/agents/echo", plain.base),
        "http2 = true",
    );
    let alpn = upstream_agent(
        "alpn",
        &format!("{}/a2a/agents/echo", secure.base),
        &format!("ca_file = {cert:?}"),
    );
    let gw = spawn_with(&[("h2c.toml", &h2c), ("alpn.toml", &alpn)], "").await;
    for path in ["/a2a/agents/h2c", "/a2a/agents/alpn"] {
        for i in 0..3 {
            completed(&gw, path, format!("over h2 {i}")).await;
        }
        let many = (0..6).map(|i| completed(&gw, path, format!("together {i}")));
        futures_util::future::join_all(many).await;
    }
    let health = gw.get_json("/a2a/health").await;
    assert_eq!(health["agents"]["h2c"], "healthy", "{health}");
    assert_eq!(health["agents"]["alpn"], "healthy", "{health}");
}

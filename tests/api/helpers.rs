//! Spawning gateways for tests and talking to them.

use std::path::{Path, PathBuf};

use a2a_gateway::app::Application;
use a2a_gateway::config;
use actix_web::dev::ServerHandle;
use futures_util::StreamExt;
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

pub const ECHO: &str = r#"
name = "echo"
description = "echo agent"
[[skills]]
id = "echo"
name = "Echo"
description = "echoes"
tags = ["demo"]
[backend]
kind = "echo"
"#;

pub const OTHER: &str = r#"
name = "other"
description = "a second agent"
[[skills]]
id = "echo"
name = "Echo too"
description = "also echoes"
tags = ["demo"]
[backend]
kind = "echo"
"#;

pub struct TestGateway {
    pub base: String,
    /// The gRPC binding's target (`127.0.0.1:port`), when it is on.
    pub grpc: Option<String>,
    pub client: reqwest::Client,
    handle: ServerHandle,
    _dir: tempfile::TempDir,
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        // Stop without waiting; the runtime may already be going away.
        drop(handle.stop(false));
    }
}

/// Writes `files` (name, contents) into a fresh agents.d and `gateway` (if any) beside it.
pub fn write_config(
    files: &[(&str, &str)],
    gateway: Option<&str>,
) -> (tempfile::TempDir, PathBuf, Option<PathBuf>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let agents = dir.path().join("agents.d");
    std::fs::create_dir(&agents).expect("agents.d");
    for (name, text) in files {
        std::fs::write(agents.join(name), text).expect("agent file");
    }
    let gateway_path = gateway.map(|g| {
        let p = dir.path().join("gateway.toml");
        std::fs::write(&p, g).expect("gateway.toml");
        p
    });
    (dir, agents, gateway_path)
}

/// The rendered load errors of a configuration that must not load (`file:line:col: ...`).
pub fn load_errors(files: &[(&str, &str)], gateway: &str) -> String {
    let (_dir, agents, gateway) = write_config(files, Some(gateway));
    match a2a_gateway::setup::load(gateway.as_deref(), &agents) {
        Ok(_) => panic!("the configuration loaded, but it should not"),
        Err(d) => d.to_string(),
    }
}

pub async fn spawn_with(files: &[(&str, &str)], gateway: &str) -> TestGateway {
    spawn_serving(files, gateway, "").await
}

/// [`spawn_with`], with the gRPC binding on a free port too.
pub async fn spawn_with_grpc(files: &[(&str, &str)], gateway: &str) -> TestGateway {
    spawn_serving(files, gateway, "grpc_port = 0\n").await
}

async fn spawn_serving(files: &[(&str, &str)], gateway: &str, server: &str) -> TestGateway {
    let gateway = format!("{gateway}\n[server]\nport = 0\nworkers = 1\n{server}");
    let (dir, agents, gateway_path) = write_config(files, Some(&gateway));
    let settings = config::load(gateway_path.as_deref(), &agents)
        .unwrap_or_else(|d| panic!("test config invalid:\n{d}"));
    start(settings, dir).await
}

/// The repository's own `gateway.toml` and `agents.d/`, as `serve` runs them, on a free port.
pub async fn spawn_shipped() -> TestGateway {
    let root = repo_root();
    let mut settings = config::load(Some(&root.join("gateway.toml")), &root.join("agents.d"))
        .unwrap_or_else(|d| panic!("shipped configuration invalid:\n{d}"));
    settings.gateway.server.port = 0;
    settings.gateway.server.workers = 1;
    let dir = tempfile::tempdir().expect("temp dir");
    // The shipped store, in a directory of this test's own.
    settings.gateway.store.data_dir = dir.path().join("data");
    start(settings, dir).await
}

/// Runs a gateway in this test's runtime; `dir` (its configuration) lives as long as it.
pub async fn start(settings: config::Settings, dir: tempfile::TempDir) -> TestGateway {
    crate::previous_release::start_building();
    let app = Application::build(settings).await.expect("bind");
    let base = format!("http://127.0.0.1:{}", app.port());
    let grpc = app.grpc_port().map(|p| format!("127.0.0.1:{p}"));
    let handle = app.handle();
    tokio::spawn(app.run_until_stopped());
    TestGateway {
        base,
        grpc,
        client: client(),
        handle,
        _dir: dir,
    }
}

/// The tests' HTTP client: its requests say their bodies are JSON, as real clients' do (the
/// gateway refuses a body with no Content-Type); a test that sends another type says so.
pub fn client() -> reqwest::Client {
    json_client(reqwest::Client::builder())
}

/// [`client`], connecting from the loopback address `from` (127.0.0.x): another client
/// address to the gateway.
pub fn client_from(from: &str) -> reqwest::Client {
    let local = from.parse::<std::net::IpAddr>().expect("an address");
    json_client(reqwest::Client::builder().local_address(local))
}

fn json_client(builder: reqwest::ClientBuilder) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::CONTENT_TYPE,
        reqwest::header::HeaderValue::from_static("application/json"),
    );
    builder.default_headers(headers).build().expect("a client")
}

/// The usual pair: `echo` (the default) and `other`.
pub async fn spawn() -> TestGateway {
    spawn_with(
        &[("echo.toml", ECHO), ("other.toml", OTHER)],
        "default_agent = \"echo\"",
    )
    .await
}

/// Which dialect a request speaks, and so which header it sends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum D {
    V03,
    V10,
}

impl D {
    pub fn header(self) -> Option<&'static str> {
        match self {
            D::V03 => None,
            D::V10 => Some("1.0"),
        }
    }
    pub fn send(self) -> &'static str {
        match self {
            D::V03 => "message/send",
            D::V10 => "SendMessage",
        }
    }
    pub fn stream(self) -> &'static str {
        match self {
            D::V03 => "message/stream",
            D::V10 => "SendStreamingMessage",
        }
    }
    pub fn get(self) -> &'static str {
        match self {
            D::V03 => "tasks/get",
            D::V10 => "GetTask",
        }
    }
    pub fn cancel(self) -> &'static str {
        match self {
            D::V03 => "tasks/cancel",
            D::V10 => "CancelTask",
        }
    }
    pub fn subscribe(self) -> &'static str {
        match self {
            D::V03 => "tasks/resubscribe",
            D::V10 => "SubscribeToTask",
        }
    }
    /// A user message in this dialect's shape.
    pub fn message(self, text: &str) -> Value {
        self.message_with_id(text, &uuid::Uuid::new_v4().to_string())
    }
    pub fn message_with_id(self, text: &str, id: &str) -> Value {
        match self {
            D::V03 => json!({"kind":"message","role":"user","messageId":id,
                             "parts":[{"kind":"text","text":text}]}),
            D::V10 => json!({"role":"ROLE_USER","messageId":id,"parts":[{"text":text}]}),
        }
    }
    /// The task inside a send result (0.3 bare, 1.0 wrapped).
    pub fn task_of(self, result: &Value) -> Value {
        match self {
            D::V03 => {
                assert_eq!(
                    result["kind"], "task",
                    "0.3 result is a bare task: {result}"
                );
                result.clone()
            }
            D::V10 => {
                assert!(result.get("kind").is_none(), "1.0 has no kind: {result}");
                result["task"].clone()
            }
        }
    }
    pub fn state(self, s: &str) -> String {
        match self {
            D::V03 => s.to_string(),
            D::V10 => format!("TASK_STATE_{}", s.to_uppercase().replace('-', "_")),
        }
    }
}

pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    /// A response read whole; its body must be JSON.
    pub async fn read(resp: reqwest::Response) -> Reply {
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let body =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text:?}"));
        Reply {
            status,
            headers,
            body,
        }
    }

    pub fn result(&self) -> &Value {
        assert!(
            self.body.get("error").is_none(),
            "unexpected error: {}",
            self.body
        );
        &self.body["result"]
    }
    pub fn code(&self) -> i64 {
        self.body["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("no error code in {}", self.body))
    }
    pub fn message(&self) -> &str {
        self.body["error"]["message"].as_str().unwrap_or_default()
    }
    /// A response header's value, "" when absent.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

impl TestGateway {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The `/metrics` page.
    pub async fn metrics(&self) -> String {
        let resp = self.client.get(self.url("/metrics")).send().await;
        resp.expect("request").text().await.expect("metrics text")
    }

    /// GET `path` and parse the JSON body.
    pub async fn get_json(&self, path: &str) -> Value {
        let resp = self
            .client
            .get(self.url(path))
            .send()
            .await
            .expect("request");
        resp.json().await.expect("a JSON body")
    }

    pub async fn post_raw(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> Reply {
        let mut req = self.client.post(self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Reply::read(req.body(body).send().await.expect("request")).await
    }

    pub async fn call(&self, path: &str, d: D, method: &str, params: Value) -> Reply {
        self.call_with(path, d, method, params, &[]).await
    }

    /// [`Self::call`], with `extra` headers (credentials, extensions).
    pub async fn call_with(
        &self,
        path: &str,
        d: D,
        method: &str,
        params: Value,
        extra: &[(&str, &str)],
    ) -> Reply {
        let body = json!({"jsonrpc":"2.0","id":"req-1","method":method,"params":params});
        let mut headers = vec![("content-type", "application/json")];
        if let Some(v) = d.header() {
            headers.push(("A2A-Version", v));
        }
        headers.extend_from_slice(extra);
        self.post_raw(path, &headers, body.to_string()).await
    }

    pub async fn send(&self, d: D, text: &str) -> Value {
        let r = self
            .call(
                "/a2a/agents/echo",
                d,
                d.send(),
                json!({"message": d.message(text)}),
            )
            .await;
        d.task_of(r.result())
    }

    pub async fn send_nonblocking(&self, d: D, text: &str) -> Value {
        let config = match d {
            D::V03 => json!({"blocking": false}),
            D::V10 => json!({"returnImmediately": true}),
        };
        let r = self
            .call(
                "/a2a/agents/echo",
                d,
                d.send(),
                json!({"message": d.message(text), "configuration": config}),
            )
            .await;
        d.task_of(r.result())
    }

    pub async fn get_task(&self, d: D, id: &str) -> Reply {
        self.call("/a2a/agents/echo", d, d.get(), json!({"id": id}))
            .await
    }

    /// Opens an SSE call and collects every event until the server closes the stream.
    pub async fn sse(&self, path: &str, d: D, method: &str, params: Value) -> Vec<Sse> {
        let body = json!({"jsonrpc":"2.0","id":"s-1","method":method,"params":params});
        let mut req = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .header("accept", "text/event-stream");
        if let Some(v) = d.header() {
            req = req.header("A2A-Version", v);
        }
        let resp = req.body(body.to_string()).send().await.expect("request");
        let ctype = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap_or("").to_string());
        assert_eq!(ctype.as_deref(), Some("text/event-stream"), "not a stream");
        let mut body = resp.bytes_stream();
        let mut buf = Vec::new();
        let read_all = async {
            while let Some(chunk) = body.next().await {
                buf.extend_from_slice(&chunk.expect("chunk"));
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(20), read_all)
            .await
            .expect("stream did not end");
        parse_sse(&String::from_utf8_lossy(&buf))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sse {
    pub event: Option<String>,
    pub data: Value,
}

/// Minimal SSE parser: `event:` and `data:` lines, blank-line separated, comments skipped.
pub fn parse_sse(text: &str) -> Vec<Sse> {
    let mut out = Vec::new();
    for block in text.replace("\r\n", "\n").split("\n\n") {
        let mut event = None;
        let mut data = String::new();
        for line in block.lines() {
            if let Some(e) = line.strip_prefix("event:") {
                event = Some(e.trim().to_string());
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push_str(d.trim_start());
            }
        }
        if !data.is_empty() {
            out.push(Sse {
                event,
                data: serde_json::from_str(&data).expect("event JSON"),
            });
        }
    }
    out
}

/// `python3 -m http.server` serving `dir` on a port it picks, and that port: a port picked
/// first and handed to it could be taken by another test before it binds it.
pub(crate) fn static_files_server(dir: &Path) -> (std::process::Child, u16) {
    let mut server = std::process::Command::new("python3")
        .args(["-u", "-m", "http.server", "--bind", "127.0.0.1", "0"])
        .arg("--directory")
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 -m http.server");
    let mut said = String::new();
    let stdout = server.stdout.take().expect("its stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut said)
        .expect("python3 -m http.server says where it serves");
    // "Serving HTTP on 127.0.0.1 port 40123 (http://127.0.0.1:40123/) ..."
    let port: u16 = (said.split_whitespace())
        .skip_while(|w| *w != "port")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {said:?}"));
    (server, port)
}

pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Polls GetTask until the task reaches `state` (in the dialect's spelling).
pub async fn wait_for_state(gw: &TestGateway, d: D, id: &str, state: &str) -> Value {
    let want = d.state(state);
    for _ in 0..100 {
        let r = gw.get_task(d, id).await;
        if r.result()["status"]["state"] == want.as_str() {
            return r.result().clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("task {id} never reached {want}");
}

/// The kind of a stream result: 0.3 `kind`, 1.0 the wrapper's member name.
pub fn kind(d: D, result: &Value) -> String {
    match d {
        D::V03 => result["kind"].as_str().unwrap_or("?").to_string(),
        D::V10 => {
            let obj = result.as_object().expect("object");
            assert_eq!(
                obj.len(),
                1,
                "a StreamResponse has exactly one member: {result}"
            );
            match obj.keys().next().map(String::as_str) {
                Some("task") => "task",
                Some("message") => "message",
                Some("statusUpdate") => "status-update",
                Some("artifactUpdate") => "artifact-update",
                other => panic!("unexpected member {other:?}"),
            }
            .to_string()
        }
    }
}

pub fn inner(d: D, result: &Value) -> Value {
    match d {
        D::V03 => result.clone(),
        D::V10 => result.as_object().unwrap().values().next().unwrap().clone(),
    }
}

/// The text of every artifact's text parts, joined.
pub fn text_of(artifacts: &Value) -> String {
    artifacts
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["parts"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect()
}

/// Hex SHA-256, as `secret_sha256` takes it.
pub fn sha(s: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A JSON-RPC request body with id 1.
pub fn rpc(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
}

/// Runs a set-up script of the repository (`scripts/console-env.sh`, say), which installs
/// what a test needs where it is missing and prints a path as its last line; fails the test
/// loudly, naming `what`, when it cannot.
pub fn provided_by(script: &str, what: &str) -> String {
    let out = std::process::Command::new("bash")
        .arg(repo_root().join(script))
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} could not {what}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// A TCP proxy that cuts the first event stream it relays after `events` events (a reset),
/// and records every request head it sees. It asks for uncompressed answers.
pub async fn cutting_proxy(
    target: String,
    events: usize,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let cut_once = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let target = target.clone();
            let (seen, cut_once) = (seen.clone(), cut_once.clone());
            tokio::spawn(async move {
                let upstream = tokio::net::TcpStream::connect(&target).await.unwrap();
                let (mut cr, mut cw) = client.into_split();
                let (mut ur, mut uw) = upstream.into_split();
                let up = tokio::spawn(async move {
                    let mut buf = vec![0; 16384];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let text = String::from_utf8_lossy(&buf[..n]).to_string();
                        if text.starts_with("POST") || text.starts_with("GET") {
                            // Plain bodies (a browser asks for compressed ones), so that
                            // events can be counted: the header renamed, its length kept.
                            let lower = text.to_ascii_lowercase();
                            if let Some(at) = lower.find("\r\naccept-encoding:") {
                                buf[at + 2..at + 17].copy_from_slice(b"x-no-encodings-");
                            }
                            seen.lock().unwrap().push(text);
                        }
                        if uw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                let mut buf = vec![0; 16384];
                // Everything this connection answered, as bytes (its answers before the
                // stream included).
                let mut stream: Vec<u8> = Vec::new();
                while let Ok(n) = ur.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let before = stream.len();
                    stream.extend_from_slice(&buf[..n]);
                    // The end of the stream's `events`-th event, counted from its head on.
                    let ends: Vec<usize> =
                        find_last(&stream, b"\r\ncontent-type: text/event-stream")
                            .map(|head| {
                                (head..stream.len().saturating_sub(1))
                                    .filter(|&i| &stream[i..i + 2] == b"\n\n")
                                    .map(|i| i + 2)
                                    .collect()
                            })
                            .unwrap_or_default();
                    let cut_at = ends.get(events.max(1) - 1).copied();
                    if let Some(at) = cut_at {
                        if !cut_once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                            // Up to the end of that event, then a reset.
                            if at > before {
                                let _ = cw.write_all(&buf[..at - before]).await;
                                let _ = cw.flush().await;
                            }
                            // A reset makes the receiver drop what it has not read yet:
                            // the client gets a moment to read those events first.
                            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                            socket2::SockRef::from(cw.as_ref())
                                .set_linger(Some(std::time::Duration::ZERO))
                                .unwrap();
                            up.abort();
                            drop(cw);
                            return;
                        }
                    }
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                up.abort();
            });
        }
    });
    (format!("http://{addr}"), heads)
}

fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// The value of the series `name{labels}` in a Prometheus text exposition, where `labels`
/// are `key="value"` pairs the series must all carry.
pub(crate) fn series(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .find(|l| labels.iter().all(|lab| l.contains(lab)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A JSON-RPC answer that succeeded: HTTP 200 and a `result` (a JSON-RPC error also comes
/// with 200, so the status alone proves nothing). The result, or a panic with the answer.
pub async fn answered(resp: reqwest::Response) -> Value {
    let reply = Reply::read(resp).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(
        reply.body.get("result").is_some(),
        "no result: {}",
        reply.body
    );
    reply.result().clone()
}

/// Whether a JSON-RPC answer succeeded (see [`answered`]), without failing the test.
pub async fn succeeded(resp: reqwest::Response) -> bool {
    resp.status() == 200
        && resp
            .json::<Value>()
            .await
            .is_ok_and(|v| v.get("result").is_some())
}

/// A local port that refuses connections for as long as this lives: bound but never
/// listening, so no other test's server can take it (a port bound and released can be
/// handed to the next server that binds port 0, which then answers in its place).
pub struct RefusingPort {
    _socket: socket2::Socket,
    pub port: u16,
}

impl RefusingPort {
    pub fn new() -> RefusingPort {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("address");
        socket.bind(&any.into()).expect("bind");
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port())
            .expect("bound port");
        RefusingPort {
            _socket: socket,
            port,
        }
    }
}

//! deploy/: the Dockerfile, compose file, Kubernetes manifests and systemd unit agree with
//! the binary. Its defaults (port, from `a2a-gateway schema gateway`) and its endpoints
//! (health, ready, metrics, checked live) are handed to scripts/deploy-check.sh, which
//! validates everything offline (kubernetes-validate, strict) and runs `a2a-gateway check`
//! on every configuration deploy/ ships. Copies of deploy/ broken on purpose (more than one
//! gateway on a store they do not share, nginx retrying sends) must be refused. Where a
//! container engine is present, the image is also built and must turn healthy.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::repo_root;

const HEALTH: &str = "/a2a/health";
const READY: &str = "/a2a/ready";
const METRICS: &str = "/metrics";

fn bin_path() -> &'static str {
    env!("CARGO_BIN_EXE_a2a-gateway")
}

fn bin() -> Command {
    Command::new(bin_path())
}

/// The properties of `server` in the gateway schema, through `$ref`/`allOf` wrappers.
fn server_properties(schema: &Value) -> Option<&serde_json::Map<String, Value>> {
    let mut node = &schema["properties"]["server"];
    for _ in 0..8 {
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            return Some(props);
        }
        let reference = node.get("$ref").and_then(Value::as_str).or_else(|| {
            node.get("allOf").and_then(Value::as_array).and_then(|all| {
                all.iter()
                    .find_map(|x| x.get("$ref").and_then(Value::as_str))
            })
        })?;
        let path = reference.strip_prefix("#/")?;
        node = path.split('/').fold(schema, |n, part| &n[part]);
    }
    None
}

/// `[default: server.port, else 8080]` in `serve --help`: the fallback when the schema
/// states no default.
fn port_from_help() -> Option<u16> {
    let out = bin().args(["serve", "--help"]).output().ok()?;
    let help = String::from_utf8_lossy(&out.stdout);
    let marker = "server.port, else ";
    let rest = &help[help.find(marker)? + marker.len()..];
    rest.chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// The binary's own defaults: (server.port, server.shutdown_grace_secs if the schema has it).
fn binary_defaults() -> (u16, Option<u64>) {
    let out = bin()
        .args(["schema", "gateway"])
        .output()
        .expect("run schema gateway");
    assert!(
        out.status.success(),
        "a2a-gateway schema gateway failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let schema: Value = serde_json::from_slice(&out.stdout).expect("the schema is JSON");
    let props = server_properties(&schema);
    let port = props
        .and_then(|p| p.get("port"))
        .and_then(|p| p.get("default"))
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .or_else(port_from_help)
        .expect("no default server.port in `schema gateway` nor in `serve --help`");
    let grace = props
        .and_then(|p| p.get("shutdown_grace_secs"))
        .and_then(|p| p.get("default"))
        .and_then(Value::as_u64);
    (port, grace)
}

/// A running `a2a-gateway serve`, killed when dropped (a failed assertion included).
struct Served {
    child: Child,
    base: String,
    port: u16,
    stderr: Arc<Mutex<String>>,
    _data: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    /// The repository's gateway.toml and agents.d/, as the container image ships them, on a
    /// free port of 127.0.0.1.
    fn shipped(root: &Path) -> Served {
        // The image's store goes to a volume; here, to a directory of this test's own.
        let data = tempfile::tempdir().expect("data dir");
        let mut child = bin()
            .current_dir(root)
            .arg("serve")
            .arg("--config")
            .arg(root.join("gateway.toml"))
            .arg("--agents-dir")
            .arg(root.join("agents.d"))
            .args(["--host", "127.0.0.1", "--port", "0", "--workers", "1"])
            .env("A2A_GATEWAY_LOG", "warn")
            .env("A2A_GATEWAY_DATA_DIR", data.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a2a-gateway serve");
        // Drain both pipes so the gateway never blocks on them; keep stderr for messages.
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = child.stderr.take().expect("stderr");
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        std::thread::spawn(move || lines.for_each(drop));
        let mut served = Served {
            child,
            base: String::new(),
            port: 0,
            stderr,
            _data: data,
        };
        let Some(base) = first.split("listening on ").nth(1) else {
            std::thread::sleep(Duration::from_millis(200));
            panic!(
                "the gateway did not start (banner {first:?}, exit {:?}):\n{}",
                served.child.try_wait().ok().flatten(),
                served.stderr.lock().unwrap()
            );
        };
        served.base = base.trim().to_string();
        served.port = served
            .base
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in the banner's URL {}", served.base));
        served
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn logs(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

/// GET `url` until it answers `want` or `timeout` passes; the last (status, body).
async fn get_until(url: &str, want: u16, timeout: Duration) -> (u16, String) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + timeout;
    let mut last = (0, String::from("(no answer)"));
    while Instant::now() < deadline {
        if let Ok(resp) = client.get(url).send().await {
            let status = resp.status().as_u16();
            last = (status, resp.text().await.unwrap_or_default());
            if status == want {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// Runs scripts/deploy-check.sh; panics with its whole output unless it passes.
fn deploy_check(args: &[String]) {
    let root = repo_root();
    let out = Command::new("bash")
        .arg(root.join("scripts/deploy-check.sh"))
        .args(args)
        .current_dir(root)
        .output()
        .expect("run bash scripts/deploy-check.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("deploy-check: all checks passed"),
        "scripts/deploy-check.sh {} failed ({}):\n{stdout}\n{stderr}",
        args.join(" "),
        out.status
    );
    // What was (and was not) checked, visible with --nocapture.
    println!("{stdout}");
}

#[tokio::test]
async fn deploy_manifests_agree_with_the_binary() {
    let root = repo_root();
    let (port, grace) = binary_defaults();

    // The endpoints every probe, health check and scrape config names, on the real binary.
    let gw = Served::shipped(root);
    for path in [HEALTH, READY, METRICS] {
        let (status, body) = get_until(&gw.url(path), 200, Duration::from_secs(15)).await;
        assert_eq!(
            status,
            200,
            "GET {path} on the shipped configuration: {body}\n{}",
            gw.logs()
        );
        assert!(!body.is_empty(), "GET {path}: empty body");
    }

    let mut args = vec![
        port.to_string(),
        HEALTH.to_string(),
        READY.to_string(),
        METRICS.to_string(),
        // Runs `a2a-gateway check` on every configuration deploy/ ships, and compares
        // flags and A2A_GATEWAY_* variables with `serve --help`.
        "--gateway-bin".to_string(),
        bin_path().to_string(),
        // The Dockerfile's HEALTHCHECK command must pass against this gateway.
        "--live-port".to_string(),
        gw.port.to_string(),
    ];
    if let Some(grace) = grace {
        args.extend(["--shutdown-grace-secs".to_string(), grace.to_string()]);
    }
    let check = tokio::task::spawn_blocking(move || deploy_check(&args));
    let result = check.await;
    drop(gw);
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// A container removed when dropped.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", self.0.as_str()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn docker(args: &[&str]) -> (bool, String) {
    let out = Command::new("docker")
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("docker {}: {e}", args.join(" ")));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text.trim().to_string())
}

#[tokio::test]
async fn container_image_builds_and_turns_healthy() {
    let engine = Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !engine {
        eprintln!(
            "\n*** container engine not available: image build and health check NOT run \
             (deploy/Dockerfile is still checked offline by deploy_manifests_agree_with_the_binary) ***\n"
        );
        return;
    }
    let image = "a2a-gateway:test";
    let (ok, out) = tokio::task::spawn_blocking(move || {
        docker(&["build", "-f", "deploy/Dockerfile", "-t", image, "."])
    })
    .await
    .expect("docker build thread");
    assert!(ok, "docker build -f deploy/Dockerfile failed:\n{out}");

    let name = format!("a2a-gateway-test-{}", std::process::id());
    let (ok, out) = docker(&[
        "run",
        "-d",
        "--name",
        name.as_str(),
        "-p",
        "127.0.0.1::8080",
        image,
    ]);
    assert!(ok, "docker run failed:\n{out}");
    let container = Container(name);
    let name = container.0.as_str();

    // Healthy = the image's HEALTHCHECK (GET /a2a/ready inside the container) passed.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut status = String::new();
    while Instant::now() < deadline {
        let (_, s) = docker(&["inspect", "--format", "{{.State.Health.Status}}", name]);
        status = s;
        if status == "healthy" || status == "unhealthy" {
            break;
        }
        let (_, running) = docker(&["inspect", "--format", "{{.State.Running}}", name]);
        if running != "true" {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if status != "healthy" {
        let (_, logs) = docker(&["logs", name]);
        let (_, health) = docker(&["inspect", "--format", "{{json .State.Health}}", name]);
        panic!("the container is {status:?}, not healthy, after up to 120 s\nhealth: {health}\nlogs:\n{logs}");
    }

    // Reachable from the host through the published port.
    let (ok, mapping) = docker(&["port", name, "8080/tcp"]);
    assert!(ok, "docker port: {mapping}");
    let host_port: u16 = mapping
        .lines()
        .next()
        .and_then(|l| l.rsplit(':').next())
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("cannot read the published port from {mapping:?}"));
    for path in [READY, HEALTH, METRICS] {
        let url = format!("http://127.0.0.1:{host_port}{path}");
        let (code, body) = get_until(&url, 200, Duration::from_secs(10)).await;
        assert_eq!(code, 200, "GET {url} from the host: {body}");
    }

    // `docker stop` sends the image's STOPSIGNAL (SIGTERM) to the gateway, PID 1: it drains
    // and exits 0 well before the engine's SIGKILL.
    let started = Instant::now();
    let (ok, out) = docker(&["stop", "-t", "30", name]);
    assert!(ok, "docker stop: {out}");
    let (_, code) = docker(&["inspect", "--format", "{{.State.ExitCode}}", name]);
    assert_eq!(
        code,
        "0",
        "the gateway's exit status after SIGTERM (took {:?})",
        started.elapsed()
    );
}

/// A copy of the repository to break: `deploy/` copied, every other top-level entry a
/// symbolic link to the real one (the check reads gateway.toml, agents.d/, src/, ... too).
fn repository_copy() -> tempfile::TempDir {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
    let root = repo_root();
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(root).unwrap() {
        let name = entry.unwrap().file_name();
        if name == "deploy" || name == ".git" || name == "target" {
            continue;
        }
        std::os::unix::fs::symlink(root.join(&name), dir.path().join(&name)).unwrap();
    }
    copy_dir(&root.join("deploy"), &dir.path().join("deploy"));
    dir
}

/// Replaces `from` by `to` in `file` of the copy; `from` must be there.
fn edit(copy: &Path, file: &str, from: &str, to: &str) {
    let path = copy.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{file} holds no {from:?}");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

/// scripts/deploy-check.sh on a copy: whether it passed, and its whole output.
fn deploy_check_on(copy: &Path) -> (bool, String) {
    let root = repo_root();
    let out = Command::new("bash")
        .arg(root.join("scripts/deploy-check.sh"))
        .args([
            "8080",
            HEALTH,
            READY,
            METRICS,
            "--gateway-bin",
            bin_path(),
            "--root",
        ])
        .arg(copy)
        .current_dir(copy)
        .output()
        .expect("run bash scripts/deploy-check.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.success() && text.contains("deploy-check: all checks passed"),
        text,
    )
}

type Breakage = fn(&Path);

/// The check refuses manifests and compose files that let more than one gateway run on a
/// store they do not share, and an nginx that would run a send twice. Each case breaks a
/// copy of deploy/ one way; the copy as it is passes.
#[test]
fn the_deploy_check_refuses_replicas_that_do_not_share_their_store() {
    let unshared = "each replica would keep tasks of its own, and a caller whose next call \
                    reaches another replica gets \"task not found\"";
    let cases: Vec<(&str, Breakage, String)> = vec![
        ("the copy as it is", |_| {}, String::new()),
        (
            "an HPA over the SQLite StatefulSet",
            |copy| {
                let hpa = std::fs::read_to_string(copy.join("deploy/kubernetes/fleet/hpa.yaml"))
                    .unwrap()
                    .replace("kind: Deployment", "kind: StatefulSet");
                std::fs::write(copy.join("deploy/kubernetes/single/hpa.yaml"), hpa).unwrap();
                edit(
                    copy,
                    "deploy/kubernetes/single/kustomization.yaml",
                    "  - statefulset.yaml\n",
                    "  - statefulset.yaml\n  - hpa.yaml\n",
                );
            },
            format!(
                "deploy/kubernetes/single: up to 10 gateway replicas (StatefulSet/a2a-gateway \
                 replicas: 1; HorizontalPodAutoscaler/a2a-gateway maxReplicas: 10) with [store] \
                 kind = \"sqlite\": {unshared}"
            ),
        ),
        (
            "two replicas of the SQLite StatefulSet",
            |copy| {
                edit(
                    copy,
                    "deploy/kubernetes/single/statefulset.yaml",
                    "\n  replicas: 1\n",
                    "\n  replicas: 2\n",
                )
            },
            format!(
                "deploy/kubernetes/single: up to 2 gateway replicas (StatefulSet/a2a-gateway \
                 replicas: 2) with [store] kind = \"sqlite\": {unshared}"
            ),
        ),
        (
            "the replicated variant on SQLite",
            |copy| {
                edit(
                    copy,
                    "deploy/kubernetes/replicated/config.yaml",
                    "    kind = \"redis\"\n",
                    "    kind = \"sqlite\"\n",
                )
            },
            format!(
                "deploy/kubernetes/replicated: up to 10 gateway replicas (Deployment/a2a-gateway \
                 replicas: 2; HorizontalPodAutoscaler/a2a-gateway maxReplicas: 10) with [store] \
                 kind = \"sqlite\": {unshared}"
            ),
        ),
        (
            "the PostgreSQL variant not shared",
            |copy| {
                edit(
                    copy,
                    "deploy/kubernetes/replicated-postgres/config.yaml",
                    "    shared = true ",
                    "    shared = false ",
                )
            },
            format!(
                "deploy/kubernetes/replicated-postgres: up to 10 gateway replicas \
                 (Deployment/a2a-gateway replicas: 2; HorizontalPodAutoscaler/a2a-gateway \
                 maxReplicas: 10) with [store] kind = \"postgres\": {unshared}"
            ),
        ),
        (
            "the compose replicas on memory",
            |copy| {
                edit(
                    copy,
                    "deploy/compose/replicas.toml",
                    "\nkind = \"redis\"\n",
                    "\nkind = \"memory\"\n",
                )
            },
            format!(
                "deploy/compose.replicas.yaml (service gateway-1, gateway-2, gateway-3: \
                 deploy/compose/replicas.toml): up to 3 gateway replicas (service gateway-1; \
                 service gateway-2; service gateway-3) with [store] kind = \"memory\": {unshared}"
            ),
        ),
        (
            "two replicas of compose.yaml's gateway",
            |copy| {
                edit(
                    copy,
                    "deploy/compose.yaml",
                    "\n  gateway:\n",
                    "\n  gateway:\n    deploy:\n      replicas: 2\n",
                )
            },
            format!(
                "deploy/compose.yaml (service gateway: deploy/compose/gateway.toml): up to 2 \
                 gateway replicas (service gateway deploy.replicas: 2) with [store] kind = \
                 \"memory\": {unshared}"
            ),
        ),
        (
            "nginx passing sent POSTs on",
            |copy| {
                edit(
                    copy,
                    "deploy/compose/nginx.conf",
                    "proxy_next_upstream error http_503;",
                    "proxy_next_upstream error http_503 non_idempotent;",
                )
            },
            "deploy/compose/nginx.conf: proxy_next_upstream error http_503 non_idempotent;: \
             non_idempotent passes a POST that reached a replica on to the next one"
                .to_string(),
        ),
    ];
    let results: Vec<(bool, String)> = std::thread::scope(|scope| {
        let runs: Vec<_> = cases
            .iter()
            .map(|(_, breakage, _)| {
                scope.spawn(move || {
                    let copy = repository_copy();
                    breakage(copy.path());
                    deploy_check_on(copy.path())
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for ((what, _, want), (passed, output)) in cases.iter().zip(&results) {
        if want.is_empty() {
            assert!(passed, "{what}: the check fails:\n{output}");
            continue;
        }
        assert!(!passed, "{what}: the check passes:\n{output}");
        assert!(
            output.contains(want.as_str()),
            "{what}: the check fails, but not saying\n  {want}\n{output}"
        );
    }
}

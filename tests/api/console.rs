//! The browser console: served from the binary, and driven in a real browser (Debian's
//! Chromium, headless, through playwright-core) against the shipped agents, from the
//! gateway's own origin, from another origin CORS allows, and from one it does not; file
//! parts that must not become links, raw bytes as downloads, and no error counted for
//! opening it. Screenshots go to `target/console-screenshots/`.

use std::path::PathBuf;
use std::process::{Child, Command};

use crate::helpers::{repo_root, sha, spawn_with, ECHO};
use crate::running::Running;

/// Runs `scripts/console-env.sh` once: node packages and the browser. Its path.
fn browser() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        crate::helpers::provided_by("scripts/console-env.sh", "set up the browser tests")
    })
}

/// A static file server (Python's) for `dir` on a free port: another origin.
struct StaticServer {
    child: Child,
    origin: String,
    _dir: tempfile::TempDir,
}

impl StaticServer {
    fn start() -> StaticServer {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            repo_root().join("console/dist/console.html"),
            dir.path().join("console.html"),
        )
        .unwrap();
        let (child, port) = crate::helpers::static_files_server(dir.path());
        let origin = format!("http://127.0.0.1:{port}");
        StaticServer {
            child,
            origin,
            _dir: dir,
        }
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A run of console/test/browser.mjs against a gateway, with the key "console-key".
struct Browser {
    gateway: String,
    other_origin: String,
    disallowed_origin: String,
    /// Under the repository.
    screenshots: &'static str,
    extra: Vec<String>,
    env: Vec<(&'static str, String)>,
}

impl Browser {
    /// Runs the scenarios in `chromium`; fails the test unless all `count` pass.
    async fn passes(self, chromium: String, count: usize) {
        let shots: PathBuf = repo_root().join(self.screenshots);
        let mut args = vec![
            repo_root()
                .join("console/test/browser.mjs")
                .display()
                .to_string(),
            "--gateway".into(),
            self.gateway,
            "--api-key".into(),
            "console-key".into(),
            "--other-origin".into(),
            self.other_origin,
            "--disallowed-origin".into(),
            self.disallowed_origin,
            "--screenshots".into(),
            shots.display().to_string(),
            "--chromium".into(),
            chromium,
        ];
        args.extend(self.extra);
        let env = self.env;
        let out = tokio::task::spawn_blocking(move || {
            Command::new("node").args(&args).envs(env).output()
        })
        .await
        .unwrap()
        .expect("node");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&format!("{count} passed, 0 failed")),
            "the console in Chromium:\n{stdout}\n{}\n(screenshots in {})",
            String::from_utf8_lossy(&out.stderr),
            shots.display()
        );
    }
}

#[tokio::test]
async fn the_console_works_in_a_real_browser() {
    let chromium = browser().to_string();
    let allowed = StaticServer::start();
    let refused = StaticServer::start();
    let gateway = format!(
        "default_agent = \"echo\"\n[usage]\nenabled = true\nflush_interval_ms = 100\n[auth]\ndefault_access = \"authenticated\"\n[[auth.api_keys]]\nid = \"console\"\nsecret_sha256 = \"{}\"\nagents = [\"*\"]\n[cors]\nallowed_origins = [\"{}\"]\n[[admin.keys]]\nid = \"console-admin\"\nsecret_sha256 = \"{}\"\n",
        sha("console-key"),
        allowed.origin,
        sha("console-admin-secret")
    );
    let gw = Running::start_with_agents(&repo_root().join("agents.d"), &gateway, "info");
    // The gateway again behind a proxy that cuts the first stream after two events.
    let target = gw.base.trim_start_matches("http://").to_string();
    let (through, heads) = crate::helpers::cutting_proxy(target, 2).await;
    let run = Browser {
        gateway: gw.base.clone(),
        other_origin: allowed.origin.clone(),
        disallowed_origin: refused.origin.clone(),
        screenshots: "target/console-screenshots",
        extra: vec![
            "--through".into(),
            through,
            "--admin-secret".into(),
            "console-admin-secret".into(),
        ],
        env: Vec::new(),
    };
    run.passes(chromium, 14).await;
    // The console picked its stream up with the id of the last event it had read.
    let heads = heads.lock().unwrap().clone();
    assert!(
        heads
            .iter()
            .any(|h| h.to_ascii_lowercase().contains("last-event-id:")),
        "the console did not resume with Last-Event-ID: {heads:?}"
    );
    // The console learns which agents a credential may call without reading made-up tasks:
    // no "task not found" was counted, for any agent.
    let metrics = gw.metrics().await;
    assert!(
        !metrics.contains("TASK_NOT_FOUND"),
        "the console's calls counted a TASK_NOT_FOUND:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("TASK_NOT_FOUND"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A page on an origin the gateway does not allow cannot run tasks on the shipped (public)
/// agents: Chromium's no-cors fetches of untyped bodies and HTML form posts are refused for
/// their Content-Type (415) before anything runs.
#[tokio::test]
async fn a_page_on_another_origin_cannot_run_tasks_on_public_agents() {
    let chromium = browser().to_string();
    let elsewhere = StaticServer::start();
    let shipped = std::fs::read_to_string(repo_root().join("gateway.toml")).unwrap();
    let gw = Running::start_with_agents(&repo_root().join("agents.d"), &shipped, "info");
    let run = Browser {
        gateway: gw.base.clone(),
        other_origin: elsewhere.origin.clone(),
        disallowed_origin: elsewhere.origin.clone(),
        screenshots: "target/console-screenshots",
        extra: vec!["--only".into(), "a-page-elsewhere-cannot-run-tasks".into()],
        env: Vec::new(),
    };
    run.passes(chromium, 1).await;
    // The HTTP+JSON sends are counted as refused for their type (the JSON-RPC ones are
    // refused before their method is read, so they count in no method's series).
    let metrics = gw.metrics().await;
    let refused: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("a2a_requests_total{") && l.contains("CONTENT_TYPE_NOT_SUPPORTED")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(refused, 4.0, "{metrics}");
}

/// The console served over https (`[server.tls]`, a certificate the test makes, trusted
/// by its key alone): the page, its calls and streams, a question answered, and a call
/// from another origin through CORS, in Chromium.
#[tokio::test]
async fn the_console_works_over_https() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let chromium = browser().to_string();
    let allowed = StaticServer::start();
    let keys = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let (cert, key) = (keys.path().join("cert.pem"), keys.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    let spki = sha2::Sha256::digest(made.key_pair.public_key_der());
    let gateway = format!(
        "default_agent = \"echo\"\n[auth]\ndefault_access = \"authenticated\"\n[[auth.api_keys]]\nid = \"console\"\nsecret_sha256 = \"{}\"\n[cors]\nallowed_origins = [\"{}\"]\n[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n",
        sha("console-key"),
        allowed.origin,
        cert,
        key
    );
    let gw = Running::start_with_agents(&repo_root().join("agents.d"), &gateway, "info");
    assert!(gw.base.starts_with("https://"), "{}", gw.base);
    let scenarios = [
        "list-agents",
        "echo-streams-three-chunks",
        "greet-asks-and-is-answered",
        "other-origin-through-cors",
    ];
    let run = Browser {
        gateway: gw.base.clone(),
        other_origin: allowed.origin.clone(),
        disallowed_origin: allowed.origin.clone(),
        screenshots: "target/console-screenshots/https",
        extra: vec![
            "--only".into(),
            scenarios.join(","),
            "--trust-spki".into(),
            base64::engine::general_purpose::STANDARD.encode(spki),
        ],
        env: vec![("NODE_EXTRA_CA_CERTS", cert.display().to_string())],
    };
    run.passes(chromium, scenarios.len()).await;
}

/// The committed page is what its sources build (`node console/build.mjs`).
#[test]
fn the_committed_console_is_built_from_its_sources() {
    browser();
    let out = Command::new("node")
        .arg(repo_root().join("console/build.mjs"))
        .arg("--check")
        .output()
        .expect("node");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_console_is_served_where_configured_or_not_at_all() {
    let gw = spawn_with(&[("echo.toml", ECHO)], "[console]\npath = \"/ui/console\"").await;
    let page = gw.client.get(gw.url("/ui/console")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    let text = page.text().await.unwrap();
    assert!(text.contains("a2a-gateway console"));
    assert!(
        !text.contains("http://") && !text.contains("https://"),
        "nothing fetched from elsewhere"
    );
    assert_eq!(
        gw.client
            .get(gw.url("/console"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );

    let off = spawn_with(&[("echo.toml", ECHO)], "[console]\nenabled = false").await;
    assert_eq!(
        off.client
            .get(off.url("/console"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

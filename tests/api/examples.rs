//! Every file under examples/ run as a newcomer would run it, so that none can rot: the
//! shell tour against the shipped agents, the Python SDK client over JSON-RPC and gRPC, the
//! JavaScript SDK client, `buf curl` through gRPC reflection, the MCP client configurations,
//! and a development certificate from `a2a-gateway cert dev` trusted the way it says.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::helpers::{repo_root, spawn_shipped, spawn_with_grpc, ECHO};

fn example(path: &str) -> PathBuf {
    repo_root().join("examples").join(path)
}

/// Runs `command`, expecting it to succeed; its standard output.
fn succeeds(command: &mut Command, what: &str) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what} failed: {}", said(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn said(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `command` off the test's runtime (the gateway it calls runs on it).
async fn run(mut command: Command, what: &'static str) -> String {
    tokio::task::spawn_blocking(move || succeeds(&mut command, what))
        .await
        .unwrap()
}

#[tokio::test]
async fn the_shell_tour_runs_against_the_shipped_agents() {
    let gw = spawn_shipped().await;
    let mut tour = Command::new("bash");
    tour.arg(example("tour.sh")).env("GATEWAY", &gw.base);
    let out = run(tour, "examples/tour.sh").await;
    assert!(
        out.contains("\"status\":\"ok\"") || out.contains("ok"),
        "{out}"
    );
    assert!(out.contains("\"hello\""), "the echo call: {out}");
    assert!(out.contains("one two three"), "the 0.3 stream: {out}");
    assert!(out.contains("over REST"), "the HTTP+JSON call: {out}");
    assert!(
        out.to_ascii_lowercase()
            .contains("a2a-gateway-agent: shout"),
        "the routed call: {out}"
    );
    assert!(out.contains("SHOUT HELLO"), "the routed call: {out}");
    assert!(out.contains("a2a_requests_total{"), "the metrics: {out}");
}

/// The example pins the SDK version the interop tests install, so that one venv runs both.
fn pinned(file: &Path, package: &str) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    text.lines()
        .find(|l| l.starts_with(package) || l.contains(&format!("\"{package}\"")))
        .unwrap_or_else(|| panic!("{} does not pin {package}", file.display()))
        .rsplit(['=', ':'])
        .next()
        .unwrap()
        .trim()
        .trim_matches(['"', ','])
        .to_string()
}

#[tokio::test]
async fn the_python_sdk_example_calls_over_json_rpc_and_grpc() {
    let interop = repo_root().join("tests/interop");
    assert_eq!(
        pinned(&example("python/requirements.txt"), "a2a-sdk"),
        pinned(&interop.join("requirements.txt"), "a2a-sdk")
    );
    let gw = spawn_with_grpc(&[("echo.toml", ECHO)], "").await;
    let python = crate::interop::python();
    for (flags, expect) in [
        (&[][..], "TASK_STATE_COMPLETED 'hello"),
        (&["--stream", "--text", "one two"][..], "artifact: 'one"),
        (
            &["--grpc", "--text", "over gRPC"][..],
            "TASK_STATE_COMPLETED 'over gRPC",
        ),
    ] {
        let mut client = Command::new(&python);
        client
            .arg(example("python/client.py"))
            .args(["--gateway", &gw.base])
            .args(flags);
        let out = run(client, "examples/python/client.py").await;
        assert!(out.contains(expect), "{flags:?}: {out}");
    }
}

#[tokio::test]
async fn the_javascript_sdk_example_calls_an_agent() {
    let interop = repo_root().join("tests/interop/js");
    assert_eq!(
        pinned(&example("js/package.json"), "@a2a-js/sdk"),
        pinned(&interop.join("package.json"), "@a2a-js/sdk")
    );
    let node = crate::interop::node();
    // The interop tests' packages are the example's (the same pinned SDK): linked in where
    // `npm install` would put them.
    let modules = example("js/node_modules");
    if std::fs::symlink_metadata(&modules).is_err() {
        std::os::unix::fs::symlink(interop.join("node_modules"), &modules).unwrap();
    }
    let gw = spawn_shipped().await;
    let mut client = Command::new(node);
    client
        .arg(example("js/client.mjs"))
        .args(["echo", "hello from js"])
        .env("GATEWAY", &gw.base);
    let out = run(client, "examples/js/client.mjs").await;
    assert!(
        out.contains("TASK_STATE_COMPLETED \"hello from js"),
        "{out}"
    );
}

#[tokio::test]
async fn buf_curl_lists_and_calls_through_grpc_reflection() {
    let buf = crate::helpers::provided_by("scripts/buf.sh", "install buf");
    let gw = spawn_with_grpc(&[("echo.toml", ECHO)], "").await;
    let target = gw.grpc.clone().unwrap();
    let mut script = Command::new("bash");
    script
        .arg(example("grpc/buf-curl.sh"))
        .args([&target, "echo", "hello buf"])
        .env("BUF", &buf);
    let out = run(script, "examples/grpc/buf-curl.sh").await;
    assert!(
        out.contains("lf.a2a.v1.A2AService/SendMessage")
            && out.contains("lf.a2a.v1.A2AService/GetTask"),
        "the methods, by reflection: {out}"
    );
    let answer: Value = serde_json::from_str(&out[out.find('{').unwrap()..])
        .unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        answer["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{out}"
    );
    assert!(answer.to_string().contains("hello buf"), "{out}");
}

#[tokio::test]
async fn the_mcp_client_configurations_launch_and_call_the_gateway() {
    let gw = spawn_shipped().await;
    let bin = env!("CARGO_BIN_EXE_a2a-gateway");
    for (file, servers) in [
        ("mcp/claude_desktop_config.json", &["a2a-gateway"][..]),
        (
            "mcp/vscode-mcp.json",
            &["a2a-gateway", "a2a-gateway-stdio"][..],
        ),
    ] {
        let mut client = Command::new(crate::mcp::mcp_python());
        client
            .arg(repo_root().join("tests/interop/mcp_client.py"))
            .args([gw.base.as_str(), "config"])
            .arg(example(file))
            .arg(bin);
        let out = run(client, "mcp_client.py config").await;
        let seen: Value = serde_json::from_str(out.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}: {out}"));
        for server in servers {
            let tools = seen[server]["tools"]
                .as_array()
                .unwrap_or_else(|| panic!("{file}: {out}"));
            assert!(tools.iter().any(|t| t == "echo"), "{file} {server}: {out}");
            let echoed = seen[server]["echoed"].as_str().unwrap_or_default();
            assert!(
                echoed.contains(&format!("via {server}")),
                "{file} {server}: {out}"
            );
        }
    }
}

/// `cert dev`, then exactly the steps it prints: the `[server.tls]` lines in gateway.toml,
/// and the CA trusted by curl, the Python SDK (SSL_CERT_FILE) and the stdio bridge
/// (--ca-file). Without the trust step each one says the certificate is not trusted; plain
/// HTTP to the port gets a 400 that says it speaks HTTPS.
#[tokio::test]
async fn a_dev_certificate_serves_https_that_clients_trust_with_the_printed_step() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_a2a-gateway");
    let printed = succeeds(
        Command::new(bin)
            .args(["cert", "dev"])
            .current_dir(dir.path()),
        "cert dev",
    );
    let certs = std::fs::canonicalize(dir.path().join("dev-certs")).unwrap();
    let ca = certs.join("ca.pem");
    for file in ["ca.pem", "ca.key", "server.pem", "server.key"] {
        assert!(certs.join(file).exists(), "{file}: {printed}");
    }
    let tls: String = printed
        .lines()
        .skip_while(|l| *l != "[server.tls]")
        .take(3)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        tls.contains("cert_file = ") && tls.contains("key_file = "),
        "{printed}"
    );
    for step in [
        "curl --cacert",
        "SSL_CERT_FILE=",
        "NODE_EXTRA_CA_CERTS=",
        "--ca-file",
    ] {
        assert!(printed.contains(step), "{step}: {printed}");
    }
    // Again: the CA is kept (trusted once), the server certificate made anew.
    let ca_before = std::fs::read(&ca).unwrap();
    let again = succeeds(
        Command::new(bin)
            .args(["cert", "dev"])
            .current_dir(dir.path()),
        "cert dev again",
    );
    assert!(again.contains("the CA already there"), "{again}");
    assert_eq!(std::fs::read(&ca).unwrap(), ca_before);

    let served = crate::running::Running::start(
        &[("echo.toml", ECHO)],
        &format!("default_agent = \"echo\"\n{tls}\n"),
        "warn",
    );
    let base = served.base.clone();
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");

    let health = format!("{base}/a2a/health");
    let curl = |trust: bool| {
        let mut c = Command::new("curl");
        c.args(["-sS", "-o", "/dev/null", "-w", "%{http_code}"]);
        if trust {
            c.arg("--cacert").arg(&ca);
        }
        c.arg(&health).output().unwrap()
    };
    let trusted = curl(true);
    assert_eq!(
        String::from_utf8_lossy(&trusted.stdout),
        "200",
        "{}",
        said(&trusted)
    );
    let untrusted = curl(false);
    assert!(!untrusted.status.success(), "{}", said(&untrusted));
    assert!(
        String::from_utf8_lossy(&untrusted.stderr).contains("certificate"),
        "{}",
        said(&untrusted)
    );
    // Plain HTTP to the TLS port: a 400 saying why, not bytes read as HTTP/0.9.
    let plain = base.replace("https://", "http://");
    let out = Command::new("curl")
        .args(["-sS", "-i", &format!("{plain}/a2a/health")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("HTTP/1.1 400"), "{}", said(&out));
    assert!(text.contains("This port speaks HTTPS"), "{}", said(&out));

    // The Python SDK (httpx) with only SSL_CERT_FILE set.
    let python = crate::interop::python();
    let mut client = Command::new(&python);
    client
        .arg(example("python/client.py"))
        .args(["--gateway", &base])
        .env("SSL_CERT_FILE", &ca);
    let out = run(client, "the Python SDK over HTTPS").await;
    assert!(out.contains("TASK_STATE_COMPLETED 'hello"), "{out}");

    // The stdio bridge with --ca-file and the base URL, launched by the MCP SDK's client.
    let config = dir.path().join("mcp.json");
    let bridge = |ca_file: Option<&Path>| {
        let mut args = vec!["mcp".to_string(), "--url".into(), base.clone()];
        if let Some(ca) = ca_file {
            args.extend(["--ca-file".into(), ca.display().to_string()]);
        }
        serde_json::json!({"mcpServers": {"tls": {"command": "a2a-gateway", "args": args}}})
    };
    std::fs::write(&config, bridge(Some(&ca)).to_string()).unwrap();
    let mut client = Command::new(crate::mcp::mcp_python());
    client
        .arg(repo_root().join("tests/interop/mcp_client.py"))
        .args(["https://unused", "config"])
        .arg(&config)
        .arg(bin);
    let out = run(client, "the stdio bridge over HTTPS").await;
    assert!(out.contains("via tls"), "{out}");
    // Without it: the bridge says the certificate is not trusted and how to trust it.
    let out = Command::new(bin)
        .args(["mcp", "--url", &base])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", said(&out));
    assert!(
        err.contains("TLS verification failed") && err.contains("--ca-file"),
        "{}",
        said(&out)
    );
    drop(served);
}

//! TLS at the front door (`[server.tls]`): HTTPS with HTTP/2 offered by ALPN, https URLs
//! in the banner and the cards, a renewed certificate taken on SIGHUP while an open
//! connection goes on, a broken one kept out, and what is not TLS refused.

use std::io::Read as _;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::helpers::{D, ECHO};
use crate::running::Running;

/// A self-signed certificate for 127.0.0.1 and localhost, written as PEM into `dir`;
/// the certificate's PEM.
fn certificate(dir: &Path) -> String {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("a certificate");
    let pem = made.cert.pem();
    std::fs::write(dir.join("cert.pem"), &pem).unwrap();
    std::fs::write(dir.join("key.pem"), made.key_pair.serialize_pem()).unwrap();
    pem
}

/// A client that trusts only `pem`.
fn trusting(pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap())
        .tls_built_in_root_certs(false)
        .build()
        .unwrap()
}

#[tokio::test]
async fn https_serves_http2_and_takes_a_renewed_certificate_without_dropping_connections() {
    let keys = tempfile::tempdir().unwrap();
    let first = certificate(keys.path());
    let tls = format!(
        "default_agent = \"echo\"\n[limits]\nheader_timeout_secs = 1\n[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n",
        keys.path().join("cert.pem").display().to_string(),
        keys.path().join("key.pem").display().to_string()
    );
    let gw = Running::start(&[("echo.toml", ECHO)], &tls, "info");
    assert!(gw.base.starts_with("https://"), "{}", gw.base);
    let old = trusting(&first);
    let health = old.get(gw.url("/a2a/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.version(), reqwest::Version::HTTP_2, "ALPN offers h2");
    let card: serde_json::Value = old
        .get(gw.url("/a2a/agents/echo/card"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = card["supportedInterfaces"][0]["url"].as_str().unwrap();
    assert!(url.starts_with("https://"), "{card}");
    let send = |client: &reqwest::Client| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                          "params": {"message": D::V10.message("over tls")}});
        client
            .post(gw.url("/a2a"))
            .header("A2A-Version", "1.0")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let sent: serde_json::Value = send(&old).await.unwrap().json().await.unwrap();
    assert_eq!(
        sent["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{sent}"
    );

    // The official SDK's client over https (trusting the certificate through
    // SSL_CERT_FILE, as httpx reads it): every check of the interop suite.
    let script = crate::helpers::repo_root().join("tests/interop/sdk_client.py");
    let card_url = gw.url("/a2a/agents/echo/card");
    let cert = keys.path().join("cert.pem");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(crate::interop::python())
            .arg(script)
            .args([
                "--card-url",
                &card_url,
                "--dialect",
                "1.0",
                "--expect-name",
                "echo",
            ])
            .env("SSL_CERT_FILE", cert)
            .output()
    })
    .await
    .unwrap()
    .expect("the SDK client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(" passed, 0 failed"),
        "the SDK client over https:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Plain HTTP to the TLS port: a 400 saying so (as nginx answers), nothing served, and
    // the gateway stays healthy.
    let plain = gw.url("/a2a/health").replacen("https://", "http://", 1);
    let refused = reqwest::get(&plain).await.expect("a plain answer");
    assert_eq!(refused.status(), 400);
    assert_eq!(refused.headers()["connection"], "close");
    let said = refused.text().await.unwrap();
    assert!(said.contains("This port speaks HTTPS"), "{said}");
    // A handshake that never comes is given up at the header deadline.
    let addr = gw.base.trim_start_matches("https://").to_string();
    let silent = tokio::task::spawn_blocking(move || {
        let mut socket = std::net::TcpStream::connect(addr).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let started = std::time::Instant::now();
        let read = socket.read(&mut [0u8; 16]);
        (read.map_err(|e| e.kind()), started.elapsed())
    })
    .await
    .unwrap();
    assert_eq!(silent.0, Ok(0), "the silent connection is closed");
    assert!(silent.1 < Duration::from_secs(5), "{:?}", silent.1);

    // A renewed certificate: new connections get it on SIGHUP, the open one goes on.
    let renewed = certificate(keys.path());
    gw.signal("HUP");
    let new = trusting(&renewed);
    let mut served = false;
    for _ in 0..50 {
        if new.get(gw.url("/a2a/health")).send().await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the renewed certificate is not served");
    let again = send(&old).await.expect("the open connection goes on");
    assert_eq!(again.status(), 200);
    let fresh_old = trusting(&first);
    assert!(
        fresh_old.get(gw.url("/a2a/health")).send().await.is_err(),
        "a new connection still got the old certificate"
    );

    // A broken file keeps the certificate in use, and says why.
    std::fs::write(keys.path().join("cert.pem"), "not a certificate").unwrap();
    gw.signal("HUP");
    gw.wait_for_log("the refused certificate", |l| {
        l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("TLS certificate not reloaded"))
    })
    .await;
    let still = trusting(&renewed).get(gw.url("/a2a/health")).send().await;
    assert_eq!(still.expect("still served").status(), 200);
}

/// A certificate that does not load stops the start, naming the setting.
#[test]
fn a_broken_certificate_stops_the_start() {
    let keys = tempfile::tempdir().unwrap();
    certificate(keys.path());
    std::fs::write(keys.path().join("key.pem"), "not a key").unwrap();
    let tls = format!(
        "[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n",
        keys.path().join("cert.pem").display().to_string(),
        keys.path().join("key.pem").display().to_string()
    );
    let gw = std::panic::catch_unwind(|| Running::start(&[("echo.toml", ECHO)], &tls, "info"));
    let message = match gw {
        Ok(_) => panic!("a gateway with a broken key started"),
        Err(panic) => panic.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(message.contains("server.tls.key_file"), "{message}");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate it signed, as PEM
/// files in `dir`: ca.pem, server.pem/server.key, client.pem/client.key (made by openssl).
fn test_pki(dir: &Path) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-days",
            "1",
            "-subj",
            "/CN=test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    ]
    .concat());
    for (name, san) in [("server", "IP:127.0.0.1"), ("client", "DNS:gateway.test")] {
        let (key, csr, ext, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.ext"),
            format!("{name}.pem"),
        );
        let subject = format!("/CN={name}");
        run(&[
            &["req"][..],
            &ec,
            &["-subj", &subject, "-keyout", &key, "-out", &csr],
        ]
        .concat());
        std::fs::write(dir.join(&ext), format!("subjectAltName={san}\n")).unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ]);
    }
}

/// An upstream over HTTPS that wants a client certificate: reached with the agent file's
/// CA and client certificate; without the certificate it is unhealthy, and a missing
/// file is a load error.
#[tokio::test]
async fn an_upstream_is_reached_with_the_files_ca_and_client_certificate() {
    let pki = tempfile::tempdir().unwrap();
    test_pki(pki.path());
    let file = |name: &str| pki.path().join(name).display().to_string();
    let args = [
        "--tls-cert",
        &file("server.pem"),
        "--tls-key",
        &file("server.key"),
        "--client-ca",
        &file("ca.pem"),
    ];
    let peer = crate::peers::python_agent_with("1.0", &args).await;
    let url = format!("https://127.0.0.1:{}", peer.port);
    let with_cert = format!(
        "ca_file = {:?}\nclient_cert_file = {:?}\nclient_key_file = {:?}\n",
        file("ca.pem"),
        file("client.pem"),
        file("client.key")
    );
    let without = format!("ca_file = {:?}\n", file("ca.pem"));
    let gw = crate::helpers::spawn_with(
        &[
            (
                "up.toml",
                &crate::peers::upstream_agent("up", &url, &with_cert),
            ),
            (
                "nocert.toml",
                &crate::peers::upstream_agent("nocert", &url, &without),
            ),
        ],
        "",
    )
    .await;
    let health = gw.get_json("/a2a/health").await;
    assert_eq!(health["agents"]["up"], "healthy", "{health}");
    assert_eq!(health["agents"]["nocert"], "unhealthy", "{health}");
    let sent = gw
        .call(
            "/a2a/agents/up",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("over mtls")}),
        )
        .await;
    let task = &sent.result()["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let streamed = gw
        .sse(
            "/a2a/agents/up",
            D::V10,
            "SendStreamingMessage",
            json!({"message": D::V10.message("a b c")}),
        )
        .await;
    let last = &streamed.last().expect("events").data;
    assert_eq!(
        last["result"]["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "the stream ends completed: {streamed:?}"
    );
    let said = format!("{streamed:?}");
    assert!(said.contains("a b c"), "the echo streamed back: {said}");

    let agents = tempfile::tempdir().unwrap();
    let broken = format!(
        "client_cert_file = {:?}\nclient_key_file = \"missing.key\"\n",
        file("client.pem")
    );
    std::fs::write(
        agents.path().join("up.toml"),
        crate::peers::upstream_agent("up", &url, &broken),
    )
    .unwrap();
    let error = a2a_gateway::config::load(None, agents.path())
        .expect_err("a load error")
        .to_string();
    assert!(error.contains("backend.client_key_file"), "{error}");
}

/// With `[server.tls]` the gRPC port speaks TLS too, with the same certificate: the SDK's
/// message classes over a secure grpcio channel reach the echo agent; an insecure one
/// does not.
#[tokio::test]
async fn the_grpc_port_speaks_tls_with_the_same_certificate() {
    let keys = tempfile::tempdir().unwrap();
    certificate(keys.path());
    let tls = format!(
        "[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n",
        keys.path().join("cert.pem").display().to_string(),
        keys.path().join("key.pem").display().to_string()
    );
    let gw = crate::helpers::spawn_with_grpc(&[("echo.toml", ECHO)], &tls).await;
    let call = json!([{"method": "SendMessage",
        "request": {"tenant": "echo", "message": D::V10.message("over grpc tls")}}]);
    let ca = keys.path().join("cert.pem");
    let out = crate::grpc::probe_over(&gw, call.clone(), &[&ca]).await;
    assert_eq!(out[0]["code"], "OK", "{}", out[0]);
    let state = &out[0]["response"]["task"]["status"]["state"];
    assert_eq!(state, "TASK_STATE_COMPLETED", "{}", out[0]);
    let plain = crate::grpc::probe(&gw, call).await;
    assert_eq!(plain[0]["code"], "UNAVAILABLE", "{}", plain[0]);
}

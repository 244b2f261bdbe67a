//! Client certificates at the front door (`[server.tls] client_ca_file`): a certificate the
//! CA issued is a credential on every binding, read by its common name or a SAN, scoped by
//! `[[auth.client_certificates]]`; an expired one, one from another CA, or (when required)
//! none at all is refused in the handshake, and the gateway stays healthy.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use serde_json::{json, Value};

use crate::helpers::{sha, spawn_with_grpc, TestGateway, D, ECHO};

/// A certificate authority made for one test.
struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    fn new(name: &str) -> Authority {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).unwrap();
        Authority { cert, key }
    }

    /// A certificate it signs: for a server at `sans`, or a client named `cn`.
    fn issue(&self, cn: &str, sans: Vec<SanType>, client: bool, expired: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// The files a test's gateway and clients read.
struct Pki {
    dir: tempfile::TempDir,
    ca: String,
}

impl Pki {
    /// A CA, the gateway's certificate for 127.0.0.1 signed by it, and `clients` (name,
    /// CN, SANs, expired) signed by it too; plus `stranger`, signed by another CA.
    fn new(clients: &[(&str, &str, Vec<SanType>, bool)]) -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::new("test client CA");
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.pem", &ca.cert.pem());
        let ip = SanType::IpAddress("127.0.0.1".parse().unwrap());
        let (cert, key) = ca.issue("gateway", vec![ip], false, false);
        write("server.pem", &cert);
        write("server.key", &key);
        for (name, cn, sans, expired) in clients {
            let (cert, key) = ca.issue(cn, sans.clone(), true, *expired);
            write(&format!("{name}.pem"), &cert);
            write(&format!("{name}.key"), &key);
        }
        let (cert, key) = Authority::new("another CA").issue("billing", vec![], true, false);
        write("stranger.pem", &cert);
        write("stranger.key", &key);
        Pki {
            ca: ca.cert.pem(),
            dir,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `[server.tls]` with this CA asking for client certificates.
    fn server_tls(&self, more: &str) -> String {
        format!(
            "[server.tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}\n{more}",
            self.path("server.pem"),
            self.path("server.key"),
            self.path("ca.pem")
        )
    }

    /// A client that trusts the CA, presenting the certificate `name` when given.
    fn client(&self, name: Option<&str>) -> reqwest::Client {
        let mut builder = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca.as_bytes()).unwrap())
            .tls_built_in_root_certs(false);
        if let Some(name) = name {
            let mut pem = std::fs::read(self.path(&format!("{name}.pem"))).unwrap();
            pem.extend(std::fs::read(self.path(&format!("{name}.key"))).unwrap());
            builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        builder.build().unwrap()
    }
}

fn https(gw: &TestGateway, path: &str) -> String {
    format!("{}{path}", gw.base.replacen("http://", "https://", 1))
}

/// A 1.0 `SendMessage` to `agent` with `client`: the status and the body.
async fn send(
    gw: &TestGateway,
    client: &reqwest::Client,
    agent: &str,
    key: Option<&str>,
) -> reqwest::Result<(u16, Value)> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                      "params": {"message": D::V10.message("over mtls")}});
    let mut request = client
        .post(https(gw, &format!("/a2a/agents/{agent}")))
        .header("A2A-Version", "1.0")
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(key) = key {
        request = request.header("X-API-Key", key);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await?))
}

fn lobby() -> String {
    format!(
        "access = \"public\"\n{}",
        ECHO.replace("name = \"echo\"", "name = \"lobby\"")
    )
}

#[tokio::test]
async fn a_client_certificate_is_a_credential_on_every_binding() {
    let pki = Pki::new(&[
        ("billing", "billing", vec![], false),
        ("visitor", "visitor", vec![], false),
        ("laptop", "old-laptop", vec![], false),
        ("expired", "billing", vec![], true),
    ]);
    let gateway = format!(
        "[auth]\ndefault_access = \"authenticated\"\n\
         [[auth.api_keys]]\nid = \"ops\"\nsecret_sha256 = \"{}\"\nagents = [\"lobby\"]\n\
         [[auth.client_certificates]]\nidentity = \"billing\"\nagents = [\"echo\"]\n\
         [[auth.client_certificates]]\nidentity = \"old-laptop\"\nrevoked = true\n{}",
        sha("ops-key"),
        pki.server_tls("client_auth = \"optional\"\n")
    );
    let gw = spawn_with_grpc(&[("echo.toml", ECHO), ("lobby.toml", &lobby())], &gateway).await;

    // Without a certificate (optional): anonymous, so the public agent only.
    let anonymous = pki.client(None);
    let (status, _) = send(&gw, &anonymous, "lobby", None).await.unwrap();
    assert_eq!(status, 200);
    let (status, body) = send(&gw, &anonymous, "echo", None).await.unwrap();
    assert_eq!(status, 401, "{body}");

    // The CA's certificate for "billing": a caller that may use echo, with tasks of its own.
    let billing = pki.client(Some("billing"));
    let (status, body) = send(&gw, &billing, "echo", None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{body}"
    );
    let list = |client: reqwest::Client, key: Option<&'static str>| {
        let url = https(&gw, "/a2a/agents/echo/rest/tasks");
        async move {
            let mut request = client.get(url).header("A2A-Version", "1.0");
            if let Some(key) = key {
                request = request.header("X-API-Key", key);
            }
            let response = request.send().await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    let (status, mine) = list(billing.clone(), None).await;
    assert_eq!(status, 200, "{mine}");
    assert_eq!(mine["tasks"].as_array().map(Vec::len), Some(1), "{mine}");

    // A credential in a header speaks for its request over the connection's certificate:
    // the "ops" key may use the lobby only.
    let (status, body) = send(&gw, &billing, "echo", Some("ops-key")).await.unwrap();
    assert_eq!(status, 403, "{body}");
    let (status, body) = send(&gw, &billing, "lobby", Some("ops-key")).await.unwrap();
    assert_eq!(status, 200, "{body}");

    // A verified certificate not listed may use public agents only; a revoked one nothing.
    let visitor = pki.client(Some("visitor"));
    let (status, body) = send(&gw, &visitor, "echo", None).await.unwrap();
    assert_eq!(status, 403, "{body}");
    let (status, body) = send(&gw, &visitor, "lobby", None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let laptop = pki.client(Some("laptop"));
    let (status, body) = send(&gw, &laptop, "lobby", None).await.unwrap();
    assert_eq!(status, 401, "{body}");

    // Refused in the handshake: an expired certificate of the right CA, and one of another.
    for refused in ["expired", "stranger"] {
        let client = pki.client(Some(refused));
        assert!(
            send(&gw, &client, "lobby", None).await.is_err(),
            "the {refused} certificate was accepted"
        );
    }
    let health = anonymous.get(https(&gw, "/a2a/health")).send().await;
    assert_eq!(health.expect("still serving").status(), 200);

    // Cards offer the scheme, in each dialect's words.
    let card: Value = (billing.get(https(&gw, "/a2a/agents/echo/card")))
        .header("A2A-Version", "1.0")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        card["securitySchemes"]["mtls"],
        json!({"mtlsSecurityScheme": {}}),
        "{card}"
    );
    let card03: Value = (billing.get(https(&gw, "/a2a/agents/echo/card")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        card03["securitySchemes"]["mtls"],
        json!({"type": "mutualTLS"}),
        "{card03}"
    );

    // gRPC, on the same terms.
    let call = json!([{"method": "SendMessage",
        "request": {"tenant": "echo", "message": D::V10.message("over grpc mtls")}}]);
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("billing.pem"),
        pki.path("billing.key"),
    );
    let out = crate::grpc::probe_over(&gw, call.clone(), &[&ca, &cert, &key]).await;
    assert_eq!(out[0]["code"], "OK", "{}", out[0]);
    let out = crate::grpc::probe_over(&gw, call, &[&ca]).await;
    assert_eq!(out[0]["code"], "UNAUTHENTICATED", "{}", out[0]);

    // curl, as an operator would check it.
    let out = curl(&pki, &https(&gw, "/a2a/agents/echo"), "billing");
    assert!(out.contains("TASK_STATE_COMPLETED"), "{out}");
}

/// `curl --cert` a 1.0 `SendMessage`; what it printed.
fn curl(pki: &Pki, url: &str, name: &str) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                      "params": {"message": D::V10.message("from curl")}});
    let out = std::process::Command::new("curl")
        .args(["-sS", "--cacert"])
        .arg(pki.path("ca.pem"))
        .arg("--cert")
        .arg(pki.path(&format!("{name}.pem")))
        .arg("--key")
        .arg(pki.path(&format!("{name}.key")))
        .args([
            "-H",
            "A2A-Version: 1.0",
            "-H",
            "content-type: application/json",
        ])
        .args(["--data", &body.to_string(), url])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn required_client_certificates_refuse_a_handshake_without_one_and_read_a_uri_san() {
    let spiffe = |id: &str| SanType::URI(id.try_into().unwrap());
    let pki = Pki::new(&[
        (
            "billing",
            "anything",
            vec![spiffe("spiffe://test/billing")],
            false,
        ),
        ("nameless", "no-uri", vec![], false),
    ]);
    let gateway = format!(
        "[auth]\ndefault_access = \"authenticated\"\n\
         [[auth.client_certificates]]\nidentity = \"spiffe://test/billing\"\n{}",
        pki.server_tls("client_auth = \"required\"\nclient_identity = \"uri\"\n")
    );
    let gw = spawn_with_grpc(&[("echo.toml", ECHO)], &gateway).await;
    let none = pki.client(None);
    assert!(
        none.get(https(&gw, "/a2a/health")).send().await.is_err(),
        "a handshake without a certificate went through"
    );
    let billing = pki.client(Some("billing"));
    let (status, body) = send(&gw, &billing, "echo", None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    // A certificate of the CA without the name the gateway reads: refused, not anonymous.
    let nameless = pki.client(Some("nameless"));
    let health = nameless
        .get(https(&gw, "/a2a/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let (status, body) = send(&gw, &nameless, "echo", None).await.unwrap();
    assert_eq!(status, 401, "{body}");
}

/// Client certificates where no TLS port asks for them, and a CA file that is not one,
/// are configuration errors that name the setting.
#[tokio::test]
async fn client_certificate_settings_that_cannot_work_are_refused() {
    let agents = tempfile::tempdir().unwrap();
    std::fs::write(agents.path().join("echo.toml"), ECHO).unwrap();
    let config = tempfile::tempdir().unwrap();
    let gateway = config.path().join("gateway.toml");
    std::fs::write(
        &gateway,
        "[[auth.client_certificates]]\nidentity = \"billing\"\n",
    )
    .unwrap();
    let error = a2a_gateway::config::load(Some(&gateway), agents.path())
        .expect_err("a load error")
        .to_string();
    assert!(error.contains("client_ca_file"), "{error}");

    let pki = Pki::new(&[]);
    std::fs::write(pki.path("ca.pem"), "not a certificate").unwrap();
    std::fs::write(&gateway, pki.server_tls("") + "[server]\nport = 0\n").unwrap();
    let settings =
        a2a_gateway::config::load(Some(&gateway), agents.path()).unwrap_or_else(|d| panic!("{d}"));
    let error = match a2a_gateway::app::Application::build(settings).await {
        Ok(_) => panic!("a gateway with a broken client CA started"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("server.tls.client_ca_file"), "{error}");
}

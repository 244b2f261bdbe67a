//! Signed cards: every card the gateway serves carries a detached JWS over its canonical
//! form, checked by an independent JOSE library (jwcrypto over rfc8785) and by the
//! official SDK's verifier against the JWKS the gateway publishes; a tampered card fails.

use std::process::Command;

use serde_json::Value;

use crate::helpers::{repo_root, sha, spawn_with, TestGateway, ECHO};
use crate::interop::python;

const SECRET: &str = "name = \"secret\"\ndescription = \"public words\"\n[extended]\ndescription = \"for members\"\n[backend]\nkind = \"echo\"\n";

fn keys() -> String {
    format!(
        "[auth]\n[[auth.api_keys]]\nid = \"alice\"\nsecret_sha256 = \"{}\"\nagents = [\"*\"]\n",
        sha("alice-key")
    )
}

/// tests/interop/verify_card.py's verdicts on the card at `path`.
async fn verify(gw: &TestGateway, path: &str, extra: &[&str]) -> Value {
    let script = repo_root().join("tests/interop/verify_card.py");
    let mut args = vec![
        script.display().to_string(),
        "--card-url".into(),
        gw.url(path),
        "--jwks-url".into(),
        gw.url("/.well-known/jwks.json"),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = tokio::task::spawn_blocking(move || Command::new(python()).args(&args).output())
        .await
        .expect("verifier thread")
        .expect("running verify_card.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "verify_card.py on {path}:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A P-256 key in PKCS#8 PEM at `path`, made by openssl.
fn p256_key(path: &std::path::Path) {
    let made = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
        ])
        .arg(path)
        .status()
        .expect("openssl");
    assert!(made.success());
}

fn assert_verifies(got: &Value, what: &str, sdk: bool) {
    assert_eq!(got["jwcrypto"], true, "{what}: {got}");
    assert_eq!(got["jwcrypto_tampered"], false, "{what}: {got}");
    if sdk {
        assert_eq!(got["sdk"], true, "{what}: {got}");
        assert_eq!(got["sdk_tampered"], false, "{what}: {got}");
    }
}

#[tokio::test]
async fn every_card_is_signed_and_verifies_against_the_published_jwks() {
    let gw = spawn_with(&[("echo.toml", ECHO), ("secret.toml", SECRET)], &keys()).await;
    let jwks = gw.get_json("/.well-known/jwks.json").await;
    let kid = jwks["keys"][0]["kid"]
        .as_str()
        .expect("a key id")
        .to_string();
    for path in [
        "/a2a/agents/echo/card",
        "/.well-known/agent-card.json",
        "/a2a/agents/secret/card",
    ] {
        // 1.0 callers get the 1.0 card (its proto's JSON), which the SDK can check too;
        // others the hybrid card, checked on its JSON.
        let v10 = verify(&gw, path, &["--a2a-version", "1.0"]).await;
        assert_verifies(&v10, &format!("{path} (1.0)"), true);
        assert_eq!(v10["kid"], kid.as_str());
        let hybrid = verify(&gw, path, &[]).await;
        assert_verifies(&hybrid, &format!("{path} (hybrid)"), false);
    }
    let extended = verify(
        &gw,
        "/a2a/agents/secret",
        &[
            "--a2a-version",
            "1.0",
            "--api-key",
            "alice-key",
            "--method",
            "GetExtendedAgentCard",
        ],
    )
    .await;
    assert_verifies(&extended, "the extended card", true);
    let card = gw.get_json("/a2a/agents/echo/card").await;
    assert_eq!(
        card["signatures"].as_array().map(Vec::len),
        Some(1),
        "{card}"
    );
}

/// `[cards] signing_key_file`: gateways given one key sign with it (replicas behind one
/// address then verify against any one's JWKS); a file that is not a P-256 key stops the
/// start with an error naming the setting.
#[tokio::test]
async fn a_key_file_is_the_key_every_replica_signs_with() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("cards.pem");
    p256_key(&key);
    let config = format!(
        "[cards]\nsigning_key_file = {:?}\n",
        key.display().to_string()
    );
    let one = spawn_with(&[("echo.toml", ECHO)], &config).await;
    let two = spawn_with(&[("echo.toml", ECHO)], &config).await;
    let kid = |jwks: Value| {
        jwks["keys"][0]["kid"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let first = kid(one.get_json("/.well-known/jwks.json").await);
    assert!(!first.is_empty());
    assert_eq!(first, kid(two.get_json("/.well-known/jwks.json").await));
    let card = verify(&two, "/a2a/agents/echo/card", &["--a2a-version", "1.0"]).await;
    assert_eq!(card["kid"], first.as_str());

    std::fs::write(&key, "not a key").unwrap();
    let agents = dir.path().join("agents.d");
    std::fs::create_dir(&agents).unwrap();
    std::fs::write(agents.join("echo.toml"), ECHO).unwrap();
    let gateway = dir.path().join("gateway.toml");
    std::fs::write(&gateway, format!("{config}[server]\nport = 0\n")).unwrap();
    let settings = a2a_gateway::config::load(Some(&gateway), &agents).expect("the files load");
    let refused = a2a_gateway::app::Application::build(settings).await;
    let error = refused
        .err()
        .expect("a start with a broken key fails")
        .to_string();
    assert!(error.contains("cards.signing_key_file"), "{error}");
}

/// An upstream that signs its card (the official SDK's signer): served while the signature
/// verifies against the keys its file names; a card changed after signing is refused and
/// its agent is unhealthy, never served.
#[tokio::test]
async fn an_upstream_card_is_served_only_while_its_signature_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("upstream.pem");
    p256_key(&key);
    let (key, jwks) = (
        key.display().to_string(),
        dir.path().join("upstream.jwks.json"),
    );
    let jwks = jwks.display().to_string();
    let signed = ["--sign-key", key.as_str(), "--jwks-out", jwks.as_str()];
    let honest = crate::peers::python_agent_with("1.0,0.3", &signed).await;
    let tampered =
        crate::peers::python_agent_with("1.0", &[&signed[..], &["--tamper"]].concat()).await;
    let checked = format!("verify_card_signature = true\ncard_jwks_file = {jwks:?}\n");
    let gw = spawn_with(
        &[
            (
                "honest.toml",
                &crate::peers::upstream_agent("honest", &honest.url(), &checked),
            ),
            (
                "tampered.toml",
                &crate::peers::upstream_agent("tampered", &tampered.url(), &checked),
            ),
        ],
        "",
    )
    .await;
    let health = gw.get_json("/a2a/health").await;
    assert_eq!(health["agents"]["honest"], "healthy", "{health}");
    assert_eq!(health["agents"]["tampered"], "unhealthy", "{health}");
    let sent = gw
        .call(
            "/a2a/agents/honest",
            crate::helpers::D::V10,
            "SendMessage",
            serde_json::json!({"message": crate::helpers::D::V10.message("hi")}),
        )
        .await;
    assert!(sent.body.get("result").is_some(), "{}", sent.body);
    let refused = gw
        .call(
            "/a2a/agents/tampered",
            crate::helpers::D::V10,
            "SendMessage",
            serde_json::json!({"message": crate::helpers::D::V10.message("hi")}),
        )
        .await;
    assert!(refused.body.get("error").is_some(), "{}", refused.body);
    let card = gw.get_json("/a2a/agents/tampered/card").await;
    assert!(
        !card.to_string().contains("changed after signing"),
        "{card}"
    );
    // The honest card, rewritten, is the gateway's to sign now.
    let served = verify(&gw, "/a2a/agents/honest/card", &["--a2a-version", "1.0"]).await;
    assert_verifies(&served, "the rewritten upstream card", true);
}

/// What an agent file must give to have its upstream's card checked, each mistake a load
/// error naming it.
#[test]
fn checking_an_upstream_card_needs_one_place_for_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents.d");
    std::fs::create_dir(&agents).unwrap();
    let cases = [
        (
            "verify_card_signature = true\n",
            "needs one of backend.card_jwks_url and backend.card_jwks_file",
        ),
        (
            "verify_card_signature = true\ncard_jwks_file = \"missing.json\"\n",
            "missing.json: not a JWKS",
        ),
        (
            "card_jwks_url = \"https://keys.example/jwks.json\"\n",
            "read only with verify_card_signature = true",
        ),
        (
            "verify_card_signature = true\ncard_jwks_url = \"ftp://x\"\n",
            "must be an http(s) URL",
        ),
    ];
    for (extra, want) in cases {
        let file = crate::peers::upstream_agent("up", "http://127.0.0.1:9", extra);
        std::fs::write(agents.join("up.toml"), file).unwrap();
        let error = a2a_gateway::config::load(None, &agents)
            .err()
            .unwrap_or_else(|| panic!("{extra} loads"))
            .to_string();
        assert!(error.contains(want), "{extra}: {error}");
    }
}

//! The PostgreSQL store on the real binary: tasks survive a kill -9 and a connection the
//! server dropped, and a schema from a newer gateway, a schema in use and a server that
//! does not answer are refused by name; TLS as libpq's `sslmode` asks for it. Each test has a schema of its own in the local
//! PostgreSQL (`POSTGRES_URL`), dropped when it ends.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{ECHO, OTHER};
use crate::running::Running;

/// The server the tests use: `POSTGRES_URL`, or the local one (trust auth, database `test`).
fn url() -> String {
    std::env::var("POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Runs `f` with a connection of its own (the blocking client cannot run inside a test's
/// runtime).
pub(crate) fn sql<T: Send + 'static>(
    f: impl FnOnce(&mut postgres::Client) -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&url(), postgres::NoTls).unwrap_or_else(|e| {
            panic!(
                "PostgreSQL does not answer at {} ({e}): the tests need it (start it, or set POSTGRES_URL)",
                url()
            )
        });
        f(&mut client)
    })
    .join()
    .unwrap()
}

/// Whether a PostgreSQL server answers at `url` now.
pub(crate) fn answers(url: &str) -> bool {
    let url = url.to_string();
    std::thread::spawn(move || postgres::Client::connect(&url, postgres::NoTls).is_ok())
        .join()
        .unwrap_or(false)
}

/// A schema of the test's own, dropped (with what the gateway put in it) when the test ends.
pub(crate) struct Schema(pub(crate) String);

impl Schema {
    pub(crate) fn new() -> Schema {
        Schema(format!("a2a_test_{}", uuid::Uuid::new_v4().simple()))
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let drop = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.0);
        sql(move |c| c.batch_execute(&drop).unwrap());
    }
}

/// `[store]` on `schema` in the tests' PostgreSQL.
pub(crate) fn store_lines(schema: &Schema) -> String {
    format!(
        "[store]\nkind = \"postgres\"\nurl = \"{}\"\nschema = \"{}\"\n",
        url(),
        schema.0
    )
}

fn start(schema: &Schema, extra: &str) -> Running {
    let gateway = format!("default_agent = \"echo\"\n{}{extra}", store_lines(schema));
    Running::start(
        &[("echo.toml", ECHO), ("other.toml", OTHER)],
        &gateway,
        "info",
    )
}

async fn get(gw: &Running, id: &str) -> Value {
    gw.call("/a2a", "GetTask", json!({"id": id})).await
}

fn state(answer: &Value) -> &str {
    answer["result"]["status"]["state"].as_str().unwrap_or("")
}

/// Ends the connections of the gateway on `schema` (its sessions are named after it), as
/// a server restart or an operator would.
fn drop_the_gateways_connections(schema: &Schema) -> i64 {
    let name = format!("a2a-gateway/{}", schema.0);
    sql(move |c| {
        c.query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = $1",
            &[&name],
        )
        .unwrap()
        .get(0)
    })
}

#[tokio::test]
async fn tasks_survive_a_dropped_connection_and_a_kill_9() {
    let schema = Schema::new();
    // Answers wait for their commit: what was answered is in PostgreSQL.
    let mut gw = start(&schema, "durability = \"sync\"\n");
    let opened = gw
        .wait_for_log("store opened", |l| l["fields"]["message"] == "store opened")
        .await;
    let store = opened["fields"]["store"].as_str().unwrap_or_default();
    assert!(store.contains(&format!("schema {}", schema.0)), "{opened}");
    let before = gw.send_task("before", json!({})).await;
    assert_eq!(
        before["status"]["state"], "TASK_STATE_COMPLETED",
        "{before}"
    );

    assert!(
        drop_the_gateways_connections(&schema) >= 1,
        "the gateway holds a connection"
    );
    // The next commit finds the connection gone and makes another: no answer fails.
    let after = gw.send_task("after", json!({})).await;
    assert_eq!(after["status"]["state"], "TASK_STATE_COMPLETED", "{after}");
    let running = gw
        .send_task("/delay 30", json!({"returnImmediately": true}))
        .await;
    assert_eq!(
        running["status"]["state"], "TASK_STATE_WORKING",
        "{running}"
    );
    let health = gw.client.get(gw.url("/a2a/ready")).send().await.unwrap();
    assert_eq!(health.status(), 200, "ready after the connection came back");

    gw.kill_hard();
    gw.restart();
    let opened = gw
        .wait_for_log("store opened with tasks", |l| {
            l["fields"]["message"] == "store opened" && l["fields"]["tasks"] != 0
        })
        .await;
    assert_eq!(opened["fields"]["tasks"], 3, "{opened}");
    assert_eq!(opened["fields"]["failed_for_lost_work"], 1, "{opened}");
    for done in [&before, &after] {
        let again = get(&gw, done["id"].as_str().unwrap()).await;
        assert_eq!(state(&again), "TASK_STATE_COMPLETED", "{again}");
        assert_eq!(again["result"]["artifacts"], done["artifacts"], "{again}");
    }
    let failed = get(&gw, running["id"].as_str().unwrap()).await;
    assert_eq!(state(&failed), "TASK_STATE_FAILED", "{failed}");
    // What the store holds is what the gateway said: three tasks, in this schema only.
    let rows: i64 = {
        let count = format!("SELECT count(*) FROM \"{}\".tasks", schema.0);
        sql(move |c| c.query_one(&count, &[]).unwrap().get(0))
    };
    assert_eq!(rows, 3);
}

#[tokio::test]
async fn a_newer_schema_a_schema_in_use_and_a_silent_server_are_refused_by_name() {
    let schema = Schema::new();
    let mut gw = start(&schema, "");
    let second = gw.serve_again();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("is in use by another gateway"), "{err}");

    gw.kill_hard();
    let bump = format!("UPDATE \"{}\".schema_version SET version = 42", schema.0);
    sql(move |c| c.execute(&bump, &[]).unwrap());
    let newer = gw.serve_again();
    assert!(!newer.status.success());
    let err = String::from_utf8_lossy(&newer.stderr);
    assert!(
        err.contains("written by a newer a2a-gateway (schema version 42"),
        "{err}"
    );

    // Nothing listens on this port: the gateway says where it looked, without the password.
    let port = crate::helpers::RefusingPort::new();
    let silent = format!(
        "default_agent = \"echo\"\n[store]\nkind = \"postgres\"\nurl = \"postgres://gw:s3cret@127.0.0.1:{}/db\"\n",
        port.port
    );
    std::fs::write(&gw.gateway, silent).unwrap();
    let started = std::time::Instant::now();
    let silent = gw.serve_again();
    assert!(!silent.status.success());
    let err = String::from_utf8_lossy(&silent.stderr);
    assert!(
        err.contains("cannot reach PostgreSQL at postgres://gw:***@127.0.0.1"),
        "{err}"
    );
    assert!(err.contains("refused"), "the cause is said: {err}");
    assert!(!err.contains("s3cret"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));

    // A URL that is not PostgreSQL's is a configuration error.
    std::fs::write(
        &gw.gateway,
        "default_agent = \"echo\"\n[store]\nkind = \"postgres\"\nschema = \"Bad-Name\"\n",
    )
    .unwrap();
    let wrong = gw.serve_again();
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        err.contains("needs a postgres://user@host:port/database URL"),
        "{err}"
    );
    assert!(err.contains("store.schema must be"), "{err}");
}

/// Replicas share a schema only when each says so: a gateway of the other mode is refused
/// by name either way, and `shared` is checked as configuration.
#[tokio::test]
async fn shared_and_unshared_gateways_refuse_each_others_schema_by_name() {
    let schema = Schema::new();
    let shared = start(&schema, "shared = true\n");
    let unshared = format!("default_agent = \"echo\"\n{}", store_lines(&schema));
    std::fs::write(&shared.gateway, &unshared).unwrap();
    let refused = shared.serve_again();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("is in use by another gateway") && err.contains("store.shared = true"),
        "{err}"
    );
    drop(shared);

    let mut alone = start(&schema, "");
    std::fs::write(&alone.gateway, format!("{unshared}shared = true\n")).unwrap();
    let refused = alone.serve_again();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("is in use by a gateway that does not share it"),
        "{err}"
    );
    alone.kill_hard();

    // `shared` is PostgreSQL's, and a shared store's lease is at least 2 s.
    for (store, want) in [
        (
            "kind = \"redis\"\nshared = true\n",
            "store.shared applies to kind = \"postgres\"",
        ),
        (
            "kind = \"postgres\"\nshared = true\nlease_secs = 1\n",
            "store.lease_secs must be at least 2",
        ),
    ] {
        std::fs::write(
            &alone.gateway,
            format!("default_agent = \"echo\"\n[store]\n{store}"),
        )
        .unwrap();
        let wrong = alone.serve_again();
        assert!(!wrong.status.success());
        let err = String::from_utf8_lossy(&wrong.stderr);
        assert!(err.contains(want), "{store}: {err}");
    }
}

/// The gateway's session on `schema` is encrypted (pg_stat_ssl).
fn session_encrypted(schema: &Schema) -> bool {
    let query = format!(
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = 'a2a-gateway/{}'",
        schema.0
    );
    sql(move |c| c.query_one(&query, &[]).map(|r| r.get::<_, bool>(0)))
        .expect("the gateway's session")
}

/// TLS to PostgreSQL as libpq's `sslmode` asks for it, against the local server's own
/// certificate (Debian's snakeoil, made for `localhost`): `require` encrypts; `verify-full`
/// checks the chain and the name (`localhost` passes, `127.0.0.1` is refused); `verify-ca`
/// checks the chain only (a root the certificate does not chain to is refused).
#[tokio::test]
async fn tls_is_used_and_checked_as_sslmode_asks() {
    let snakeoil = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
    let (ssl, cert): (String, String) = sql(|c| {
        let ssl = c.query_one("SHOW ssl", &[]).unwrap().get(0);
        let cert = c.query_one("SHOW ssl_cert_file", &[]).unwrap().get(0);
        (ssl, cert)
    });
    assert!(
        ssl == "on" && cert == snakeoil && std::path::Path::new(snakeoil).exists(),
        "this test needs the local PostgreSQL serving TLS with Debian's snakeoil certificate (ssl = on, ssl_cert_file = {snakeoil}); it has ssl = {ssl}, ssl_cert_file = {cert}"
    );
    let on = |host: &str, query: &str| {
        let mut u = url::Url::parse(&url()).unwrap();
        u.set_host(Some(host)).unwrap();
        u.set_query(Some(query));
        u.to_string()
    };
    let started = |url: String| {
        let schema = Schema::new();
        let gateway = format!(
            "default_agent = \"echo\"\n[store]\nkind = \"postgres\"\nurl = \"{url}\"\nschema = \"{}\"\n",
            schema.0
        );
        let gw = Running::start(&[("echo.toml", ECHO)], &gateway, "info");
        (gw, schema)
    };
    for query in [
        "sslmode=require".to_string(),
        format!("sslmode=verify-ca&sslrootcert={snakeoil}"),
    ] {
        let (gw, schema) = started(on("127.0.0.1", &query));
        assert!(session_encrypted(&schema), "{query}");
        let task = gw.send_task("over TLS", json!({})).await;
        assert_eq!(
            task["status"]["state"], "TASK_STATE_COMPLETED",
            "{query}: {task}"
        );
    }
    let (_gw, schema) = started(on(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={snakeoil}"),
    ));
    assert!(session_encrypted(&schema), "verify-full on localhost");

    // Refused, saying why: the certificate names localhost, not 127.0.0.1; another root.
    let other_root = tempfile::NamedTempFile::new().unwrap();
    let other = rcgen::generate_simple_self_signed(vec!["elsewhere".into()]).unwrap();
    std::fs::write(other_root.path(), other.cert.pem()).unwrap();
    let schema = Schema::new();
    let mut gw = start(&schema, "");
    gw.kill_hard();
    for (query, why) in [
        (
            format!("sslmode=verify-full&sslrootcert={snakeoil}"),
            "certificate not valid for name \"127.0.0.1\"",
        ),
        (
            format!(
                "sslmode=verify-ca&sslrootcert={}",
                other_root.path().display()
            ),
            "UnknownIssuer",
        ),
        (
            "sslmode=verify-ca&sslrootcert=/nonexistent.pem".into(),
            "sslrootcert /nonexistent.pem",
        ),
        (
            "sslmode=sometimes".into(),
            "sslmode=sometimes is none of disable, allow, prefer",
        ),
    ] {
        std::fs::write(
            &gw.gateway,
            format!(
                "default_agent = \"echo\"\n[store]\nkind = \"postgres\"\nurl = \"{}\"\nschema = \"{}\"\n",
                on("127.0.0.1", &query),
                schema.0
            ),
        )
        .unwrap();
        let refused = gw.serve_again();
        assert!(!refused.status.success(), "{query}");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(err.contains(why), "{query}: {err}");
    }
}

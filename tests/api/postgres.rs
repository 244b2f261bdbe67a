//! The PostgreSQL store on the real binary: tasks survive a kill -9 and a connection the
//! server dropped, and a schema from a newer gateway, a schema in use and a server that
//! does not answer are refused by name. Each test has a schema of its own in the local
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

    // TLS is refused before anything is tried, saying so.
    std::fs::write(
        &gw.gateway,
        format!(
            "default_agent = \"echo\"\n[store]\nkind = \"postgres\"\nurl = \"{}?sslmode=require\"\n",
            url()
        ),
    )
    .unwrap();
    let tls = gw.serve_again();
    assert!(!tls.status.success());
    let err = String::from_utf8_lossy(&tls.stderr);
    assert!(
        err.contains("sslmode=require: TLS to PostgreSQL is not supported yet"),
        "{err}"
    );

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

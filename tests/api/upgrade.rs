//! Rolling upgrades: what earlier releases stored, this build reads. Each directory under
//! `tests/fixtures/store/` was written by the release it is named after
//! (`scripts/store_fixture.py`): a SQLite file, a PostgreSQL schema's dump, and reads with
//! the answers that release gave. This build opens each store (migrating it forward) and
//! must give the same answers. And during the upgrade, replicas of the previous release
//! (`tests/fixtures/previous-release.toml`) and of this build share one store's tasks.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::helpers::repo_root;
use crate::replicas::{answered_across, canceled_across, state, watched_across, Fleet};
use crate::running::Running;

fn fixtures() -> Vec<PathBuf> {
    let dir = repo_root().join("tests/fixtures/store");
    let mut all: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    all.sort();
    assert!(!all.is_empty(), "no fixtures in {}", dir.display());
    all
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Replays `calls.<kind>.json` against `gw`: every answer as the release gave it.
async fn replay(gw: &Running, fixture: &Path, kind: &str) {
    let calls: Vec<Value> =
        serde_json::from_str(&read(&fixture.join(format!("calls.{kind}.json")))).unwrap();
    assert!(!calls.is_empty());
    for call in calls {
        let path = call["path"].as_str().unwrap();
        let mut req = match &call["body"] {
            Value::Null => gw.client.get(gw.url(path)),
            body => gw.client.post(gw.url(path)).json(body),
        };
        for (k, v) in call["headers"].as_object().unwrap() {
            req = req.header(k.as_str(), v.as_str().unwrap());
        }
        let answer: Value = req.send().await.unwrap().json().await.unwrap();
        assert_eq!(
            answer,
            call["answer"],
            "{} ({kind}): {path} {} answers differently from the release that wrote it",
            fixture.display(),
            call["body"]
        );
    }
}

fn echo() -> String {
    read(&repo_root().join("agents.d/echo.toml"))
}

#[tokio::test]
async fn every_earlier_releases_sqlite_file_reads_the_same() {
    for fixture in fixtures() {
        let gateway = format!(
            "{}\n[store]\nkind = \"sqlite\"\ndata_dir = \"data\"\n",
            read(&fixture.join("gateway.toml"))
        );
        let echo = echo();
        let mut gw = Running::start(&[("echo.toml", &echo)], &gateway, "info");
        gw.kill_hard();
        let data = gw.dir.path().join("data");
        for leftover in ["gateway.db-wal", "gateway.db-shm"] {
            let _ = std::fs::remove_file(data.join(leftover));
        }
        std::fs::copy(fixture.join("gateway.db"), data.join("gateway.db")).unwrap();
        gw.restart();
        replay(&gw, &fixture, "sqlite").await;
    }
}

#[tokio::test]
async fn every_earlier_releases_postgres_schema_reads_the_same() {
    for fixture in fixtures() {
        let schema = crate::postgres::Schema::new();
        let dump = read(&fixture.join("postgres.sql")).replace("__SCHEMA__", &schema.0);
        crate::postgres::sql(move |c| c.batch_execute(&dump).unwrap());
        let gateway = format!(
            "{}\n{}",
            read(&fixture.join("gateway.toml")),
            crate::postgres::store_lines(&schema)
        );
        let echo = echo();
        let gw = Running::start(&[("echo.toml", &echo)], &gateway, "info");
        replay(&gw, &fixture, "postgres").await;
        drop(gw);
    }
}

on_both_stores!(the_previous_release_and_this_build_share_tasks_side_by_side);

/// Halfway through a rolling upgrade: each of a task's steps taken on a replica of one
/// version and the next on the other, both ways round.
async fn the_previous_release_and_this_build_share_tasks_side_by_side(fleet: Fleet) {
    let previous = tokio::task::spawn_blocking(crate::previous_release::binary)
        .await
        .unwrap();
    let old = fleet.replica_of(&previous);
    let new = fleet.replicas(1, "").remove(0);
    for (a, b, way) in [
        (&old, &new, "previous → this"),
        (&new, &old, "this → previous"),
    ] {
        // Made on A, read and listed on B.
        let done = a.send_task("hello", json!({})).await;
        let id = done["id"].as_str().unwrap();
        let got = b.call("/a2a", "GetTask", json!({"id": id})).await;
        assert_eq!(
            state(&got["result"]),
            "TASK_STATE_COMPLETED",
            "{way}: {got}"
        );
        let list = b.call("/a2a", "ListTasks", json!({})).await;
        let listed = list["result"]["tasks"].as_array().unwrap();
        assert!(listed.iter().any(|t| t["id"] == id), "{way}: {list}");

        watched_across(a, b, way).await;
        canceled_across(a, b, way).await;
        answered_across(a, b, way).await;
    }
}

//! Rolling upgrades: what earlier releases stored, this build reads. Each directory under
//! `tests/fixtures/store/` was written by the release it is named after
//! (`scripts/store_fixture.py`): a SQLite file, a PostgreSQL schema's dump, and reads with
//! the answers that release gave. This build opens each store (migrating it forward) and
//! must give the same answers. And during the upgrade, replicas of the previous release
//! (`tests/fixtures/previous-release.toml`) and of this build share one store's tasks.

use std::path::{Path, PathBuf};
use std::process::Command;

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
    let previous = tokio::task::spawn_blocking(previous_release).await.unwrap();
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

/// Starts building the previous release beside the suite when the whole suite runs: the
/// build takes about a minute and the upgrade tests sort last, so built on demand the suite
/// ended waiting for it alone. Called whenever a test starts a gateway; the first call
/// starts the build. Not with a filter or `--ignored` (the upgrade tests may not run, and
/// the process could end mid-build) nor under nextest (a process per test: each would
/// start its own): there the upgrade tests build it when they run.
pub(crate) fn start_building_the_previous_release() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        if std::env::var_os("NEXTEST").is_none() && runs_the_whole_suite() {
            std::thread::spawn(previous_release);
        }
    });
}

/// Whether this test process was given no filter: no test name, no `--skip`, `--exact` or
/// `--ignored` (libtest's own arguments with a value are passed over).
fn runs_the_whole_suite() -> bool {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--skip" | "--exact" | "--ignored" => return false,
            "--test-threads" | "--format" | "--color" | "--logfile" | "-Z" | "--shuffle-seed" => {
                args.next();
            }
            a if !a.starts_with('-') => return false,
            _ => {}
        }
    }
    true
}

/// The gateway binary of the previous release, built once from this repository's history
/// into `<target>/releases/<commit>/`.
fn previous_release() -> PathBuf {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let pointer = repo_root().join("tests/fixtures/previous-release.toml");
    let release: toml::Table = read(&pointer)
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", pointer.display()));
    let commit = release["commit"].as_str().expect("the release's commit");
    // <target>/debug/deps/api-…: the test build's own target directory.
    let exe = std::env::current_exe().unwrap();
    let debug = exe.ancestors().nth(2).unwrap().to_path_buf();
    let root = debug.parent().unwrap().join("releases").join(commit);
    let binary = root.join("target/debug/a2a-gateway");
    let _one_build = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    if !binary.exists() {
        // Built aside and moved in whole: a test process of its own (nextest) building it
        // too finds it done or builds its own.
        let aside = root.with_extension(std::process::id().to_string());
        build_release(commit, &debug, &aside);
        if std::fs::rename(&aside, &root).is_err() {
            let _ = std::fs::remove_dir_all(&aside);
        }
    }
    binary
}

/// Builds the gateway at `commit` in `root`, with the dependencies this test build
/// compiled (`debug`): with the same Cargo.lock, only the gateway itself is compiled.
fn build_release(commit: &str, debug: &Path, root: &Path) {
    let git = |args: &[&std::ffi::OsStr]| {
        let mut git = Command::new("git");
        git.arg("-C").arg(repo_root()).args(args);
        run(&mut git)
    };
    let mut known = Command::new("git");
    known.arg("-C").arg(repo_root());
    known.args(["cat-file", "-e", &format!("{commit}^{{commit}}")]);
    assert!(
        known.status().is_ok_and(|s| s.success()),
        "the previous release's commit {commit} is not in this clone's history (a shallow \
         clone: `git fetch --unshallow`)"
    );
    let _ = std::fs::remove_dir_all(root);
    let src = root.join("src");
    let seeded = root.join("target/debug");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&seeded).unwrap();
    let archive = root.join("src.tar");
    git(&[
        "archive".as_ref(),
        "--output".as_ref(),
        archive.as_os_str(),
        commit.as_ref(),
    ]);
    // -m: the files are newer than anything built, whatever the commit's date.
    run(Command::new("tar")
        .arg("-xmf")
        .arg(&archive)
        .arg("-C")
        .arg(&src));
    // Compiled dependencies are linked, not copied; cargo's records of them are copied
    // (cargo rewrites those in place) with their times (a build script's record newer than
    // what it built makes cargo compile all that depends on it again). The gateway's own
    // are left out: its source differs.
    run(Command::new("cp")
        .arg("-al")
        .args([debug.join("deps"), debug.join("build")])
        .arg(&seeded));
    run(Command::new("cp")
        .arg("-a")
        .arg(debug.join(".fingerprint"))
        .arg(&seeded));
    for dir in [".fingerprint", "build", "deps"] {
        for entry in std::fs::read_dir(seeded.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy();
            if name.starts_with("a2a-gateway-") || name.contains("a2a_gateway") {
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
    }
    // An example brings the dev-dependencies in, so that every dependency's features are
    // those of this test build's; at the lowest priority, as the suite runs meanwhile.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut nice = Command::new("nice");
    // Not what `cargo test` set for this process (LD_LIBRARY_PATH, OUT_DIR, CARGO_*):
    // build scripts that read them would run again, and all that depends on them compile.
    nice.env_clear().envs(std::env::vars_os().filter(|(k, _)| {
        let k = k.to_string_lossy();
        !(k.starts_with("CARGO") || k == "OUT_DIR" || k == "LD_LIBRARY_PATH")
    }));
    run(nice
        .args(["-n", "19"])
        .arg(cargo)
        .args(["build", "--locked", "--bin", "a2a-gateway"])
        .args(["--example", "bare_jsonrpc", "--manifest-path"])
        .arg(src.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", root.join("target"))
        // Built once: incremental state would be half a gigabyte kept for nothing.
        .env("CARGO_INCREMENTAL", "0"));
}

/// Runs `command`, failing the test with its output when it fails.
fn run(command: &mut Command) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

//! The durable store on the real binary: tasks and records survive a clean restart and a
//! SIGKILL, a crash loses at most the commit interval, running tasks fail when their work
//! is gone, retention deletes, and a file from a newer gateway is refused.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::{D, ECHO, OTHER};
use crate::running::Running;

fn sqlite(extra: &str) -> String {
    format!("default_agent = \"echo\"\n[store]\nkind = \"sqlite\"\ndata_dir = \"data\"\n{extra}")
}

fn start(extra: &str) -> Running {
    Running::start(
        &[("echo.toml", ECHO), ("other.toml", OTHER)],
        &sqlite(extra),
        "info",
    )
}

async fn get(gw: &Running, id: &str) -> Value {
    gw.call("/a2a", "GetTask", json!({"id": id})).await
}

fn state(answer: &Value) -> &str {
    answer["result"]["status"]["state"].as_str().unwrap_or("")
}

#[tokio::test]
async fn tasks_survive_a_crash_and_the_running_ones_fail_saying_why() {
    let mut gw = start("");
    let done = gw.send_task("hello", json!({})).await;
    let running = gw
        .send_task("/delay 30", json!({"returnImmediately": true}))
        .await;
    assert_eq!(running["status"]["state"], "TASK_STATE_WORKING");
    // Past the commit interval (20 ms): both are on disk.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.kill_hard();
    gw.restart();
    let opened = gw
        .wait_for_log("store opened with tasks", |l| {
            l["fields"]["message"] == "store opened" && l["fields"]["tasks"] != 0
        })
        .await;
    assert_eq!(opened["fields"]["tasks"], 2, "{opened}");
    assert_eq!(opened["fields"]["failed_for_lost_work"], 1);

    let mut again = get(&gw, done["id"].as_str().unwrap()).await["result"].take();
    // The route stamp says how each answer was routed: by task id now.
    let (mut done, again_route) = (done, again["metadata"]["gateway/route"].take());
    done["metadata"]["gateway/route"].take();
    assert_eq!(again_route, "task");
    assert_eq!(again, done, "the finished task reads back as it was");
    let failed = get(&gw, running["id"].as_str().unwrap()).await;
    assert_eq!(state(&failed), "TASK_STATE_FAILED", "{failed}");
    let note = failed["result"]["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        note.contains("gateway stopped while this task was running"),
        "{note}"
    );
    // ListTasks pages through what was stored, newest first.
    let page = gw.call("/a2a", "ListTasks", json!({"pageSize": 1})).await;
    assert_eq!(page["result"]["totalSize"], 2, "{page}");
    let first = page["result"]["tasks"][0]["id"].clone();
    let token = page["result"]["nextPageToken"].clone();
    let second = gw
        .call(
            "/a2a",
            "ListTasks",
            json!({"pageSize": 1, "pageToken": token}),
        )
        .await;
    let ids = [first, second["result"]["tasks"][0]["id"].clone()];
    assert_eq!(ids, [running["id"].clone(), done["id"].clone()]);
}

/// The store keeps a task answered at once as its answer wrote it rather than writing it
/// again: it must read back the same. (On the agent's own path the answer and the later
/// read carry the same stamp, so the whole task compares.)
#[tokio::test]
async fn a_task_answered_on_its_agents_path_reads_back_as_it_was_answered() {
    let mut gw = start("");
    let mut message = D::V10.message("kept as answered \"quoted\" \u{e9}");
    message["metadata"] = json!({"client": {"n": 1}});
    let answer = gw
        .call(
            "/a2a/agents/echo",
            "SendMessage",
            json!({"message": message}),
        )
        .await;
    let task = answer["result"]["task"].clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{answer}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.kill_hard();
    gw.restart();
    let again = gw
        .call("/a2a/agents/echo", "GetTask", json!({"id": task["id"]}))
        .await;
    assert_eq!(again["result"], task, "{again}");
}

#[tokio::test]
async fn a_crash_loses_at_most_the_commit_interval() {
    // A long interval makes the window measurable; the bound is the same at 20 ms.
    let interval = Duration::from_millis(400);
    let mut gw = start("commit_interval_ms = 400\n");
    let mut answered = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        let task = gw.send_task("x", json!({})).await;
        answered.push((task["id"].as_str().unwrap().to_string(), Instant::now()));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let killed = Instant::now();
    gw.kill_hard();
    gw.restart();
    let mut lost_old = Vec::new();
    let mut lost = 0;
    for (id, at) in &answered {
        let found = get(&gw, id).await["result"]["id"] == json!(id);
        if !found {
            lost += 1;
            // A commit takes a few ms more than the interval: 100 ms of slack.
            if killed.duration_since(*at) > interval + Duration::from_millis(100) {
                lost_old.push(id.clone());
            }
        }
    }
    assert!(
        lost_old.is_empty(),
        "tasks answered more than the commit interval before the crash were lost: {lost_old:?}"
    );
    assert!(
        lost * 2 < answered.len(),
        "most tasks survive ({lost} of {} lost)",
        answered.len()
    );
}

#[tokio::test]
async fn a_clean_shutdown_loses_nothing_and_conversations_keep_their_agent() {
    let mut gw = start("");
    let mut ids = Vec::new();
    for i in 0..20 {
        let task = gw.send_task(&format!("m{i}"), json!({})).await;
        ids.push(task["id"].as_str().unwrap().to_string());
    }
    // A conversation the caller started with "other" by metadata.
    let mut first = D::V10.message("hi");
    first["contextId"] = json!("conversation-1");
    first["metadata"] = json!({"gateway/agent": "other"});
    let answer = gw
        .call("/a2a", "SendMessage", json!({"message": first}))
        .await;
    assert_eq!(
        answer["result"]["task"]["metadata"]["gateway/agent"],
        "other"
    );
    gw.signal("TERM");
    let (status, _) = gw.wait_exit(Duration::from_secs(30));
    assert!(status.success());
    gw.restart();
    for id in &ids {
        assert_eq!(get(&gw, id).await["result"]["id"], json!(id));
    }
    // Context affinity is a stored record: the follow-up finds "other" without metadata.
    let mut next = D::V10.message("again");
    next["contextId"] = json!("conversation-1");
    let answer = gw
        .call("/a2a", "SendMessage", json!({"message": next}))
        .await;
    assert_eq!(
        answer["result"]["task"]["metadata"]["gateway/agent"], "other",
        "{answer}"
    );
}

#[tokio::test]
async fn finished_tasks_past_retention_are_deleted_for_good() {
    let mut gw = start("retention_secs = 2\n");
    let task = gw.send_task("short-lived", json!({})).await;
    let id = task["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&gw, &id).await.get("error").is_none() {
        assert!(Instant::now() < deadline, "not deleted within 10 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The deletion is written with the next group commit (every 20 ms, later on a loaded
    // machine), as any update is: a kill -9 within that window may keep the task.
    tokio::time::sleep(Duration::from_millis(500)).await;
    gw.kill_hard();
    gw.restart();
    assert_eq!(get(&gw, &id).await["error"]["code"], -32001);
}

#[test]
fn a_file_from_a_newer_gateway_and_a_file_in_use_are_refused_by_name() {
    let mut gw = start("");
    // A second gateway on the same data_dir.
    let second = gw.serve_again();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("in use by another process"), "{err}");

    gw.kill_hard();
    let db = gw.dir.path().join("data/gateway.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "user_version", 42).unwrap();
    drop(conn);
    let newer = gw.serve_again();
    assert!(!newer.status.success());
    let err = String::from_utf8_lossy(&newer.stderr);
    assert!(
        err.contains("written by a newer a2a-gateway (schema version 42"),
        "{err}"
    );
}

/// What the gateway records of tasks it relayed to a 0.3 upstream (which has no
/// ListTasks), and who created them, survive a restart: ListTasks still answers, and
/// another caller still cannot read them.
#[tokio::test]
async fn a_0_3_upstreams_task_records_and_owners_survive_a_restart() {
    let peer = crate::peers::fault_server("legacy03", 0).await;
    let up = crate::peers::upstream_agent("up", &peer.url(), "");
    let gateway = format!(
        "{}\n[auth]\ndefault_access = \"authenticated\"\n[[auth.api_keys]]\nid = \"alice\"\nsecret_sha256 = \"{}\"\nagents = [\"*\"]\n[[auth.api_keys]]\nid = \"bob\"\nsecret_sha256 = \"{}\"\nagents = [\"*\"]\n",
        sqlite(""),
        crate::helpers::sha("alice-key"),
        crate::helpers::sha("bob-key")
    );
    let mut gw = Running::start(&[("echo.toml", ECHO), ("up.toml", &up)], &gateway, "info");
    let mut ids = Vec::new();
    for text in ["one", "two"] {
        let sent = gw
            .call_as(
                "/a2a/agents/up",
                "alice-key",
                "SendMessage",
                json!({"message": D::V10.message(text)}),
            )
            .await;
        ids.push(sent["result"]["task"]["id"].as_str().unwrap().to_string());
    }
    gw.signal("TERM");
    let (status, _) = gw.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "a drained exit: {status:?}");
    gw.restart();
    let listed = gw
        .call_as("/a2a/agents/up", "alice-key", "ListTasks", json!({}))
        .await;
    let listed_ids: Vec<&str> = listed["result"]["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed_ids, [ids[1].as_str(), ids[0].as_str()], "{listed}");
    let bobs = gw
        .call_as("/a2a/agents/up", "bob-key", "ListTasks", json!({}))
        .await;
    assert_eq!(bobs["result"]["totalSize"], 0, "{bobs}");
    let stolen = gw
        .call_as(
            "/a2a/agents/up",
            "bob-key",
            "GetTask",
            json!({"id": ids[0]}),
        )
        .await;
    assert_eq!(
        stolen["error"]["code"], -32001,
        "the owner record survived: {stolen}"
    );
    let own = gw
        .call_as(
            "/a2a/agents/up",
            "alice-key",
            "GetTask",
            json!({"id": ids[0]}),
        )
        .await;
    assert_eq!(own["result"]["id"], json!(ids[0]), "{own}");
}

/// A small tmpfs of its own (the tests run as root); unmounted when dropped. A machine
/// where it cannot be mounted fails the test, saying why.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "this test fills a small tmpfs and needs to mount one (as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { dir }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Fills what is left with one file; returns it.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let filler = self.path().join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let small = vec![0u8; 512];
        while f.write_all(&small).is_ok() {}
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A store that cannot write says so: on a full disk new tasks are refused with 503
/// -32052 and Retry-After, readiness says `store_unavailable`, the metric and one log line
/// tell the operator, tasks already stored stay readable; once there is room again the
/// gateway takes tasks by itself, and after a crash every task it answered while it
/// could write is there.
#[tokio::test]
async fn a_full_disk_refuses_new_tasks_until_the_store_can_write_again() {
    let disk = SmallDisk::mount("8m");
    let mut gw = Running::start(
        &[("echo.toml", ECHO)],
        &format!(
            "default_agent = \"echo\"\n[store]\nkind = \"sqlite\"\ndata_dir = \"{}\"\n",
            disk.path().join("data").display()
        ),
        "info",
    );
    let mut kept = Vec::new();
    for _ in 0..5 {
        kept.push(gw.send_task("before", json!({})).await["id"].clone());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let filler = disk.fill();

    // Large tasks until the store notices it cannot write.
    let big = "x".repeat(200_000);
    let mut refused = None;
    for _ in 0..200 {
        let r = gw
            .post(
                "/a2a",
                "SendMessage",
                json!({"message": D::V10.message(&big)}),
                &[],
            )
            .await;
        if r.status() != 200 {
            refused = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = refused.expect("a full disk refuses new tasks");
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32052, "{body}");
    assert_eq!(body["error"]["data"][0]["reason"], "TASK_STORE_UNAVAILABLE");
    let ready = gw.client.get(gw.url("/a2a/ready")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["status"], "store_unavailable", "{ready}");
    let metrics = gw.metrics().await;
    assert!(metrics.contains("a2a_task_store_writable 0"), "{metrics}");
    assert!(
        metrics.contains("a2a_task_store_outages_total 1"),
        "{metrics}"
    );
    // Reads are served meanwhile.
    let read = get(&gw, kept[0].as_str().unwrap()).await;
    assert_eq!(state(&read), "TASK_STATE_COMPLETED", "{read}");
    // Still refused a moment later; one log line for the whole outage.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = gw
        .post(
            "/a2a",
            "SendMessage",
            json!({"message": D::V10.message("small")}),
            &[],
        )
        .await;
    assert_eq!(again.status(), 503);
    let outage_lines = |gw: &Running| {
        gw.log_lines()
            .iter()
            .filter(|l| {
                l["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("store: commits fail"))
            })
            .count()
    };
    assert_eq!(outage_lines(&gw), 1, "one line per outage");

    // Room again: the gateway recovers by itself.
    std::fs::remove_file(filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ready = gw.client.get(gw.url("/a2a/ready")).send().await.unwrap();
        if ready.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never writable again: {}",
            std::fs::read_to_string(&gw.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gw.wait_for_log("saying so", |l| {
        l["fields"]["message"] == "store: commits succeed again; taking new tasks"
    })
    .await;
    for _ in 0..5 {
        kept.push(gw.send_task("after", json!({})).await["id"].clone());
    }
    let metrics = gw.metrics().await;
    assert!(metrics.contains("a2a_task_store_writable 1"), "{metrics}");
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A crash: every task answered while the store could write is there.
    gw.kill_hard();
    gw.restart();
    for id in &kept {
        let read = get(&gw, id.as_str().unwrap()).await;
        assert_eq!(state(&read), "TASK_STATE_COMPLETED", "{id}: {read}");
    }
    assert_eq!(outage_lines(&gw), 1);
}

/// Sends from `clients` concurrent callers to `gw`'s echo agent until `stop` is set (or
/// the gateway goes away); the ids of the tasks answered (HTTP 200 with a task), each
/// with its send's text size `size`.
async fn load(
    gw: &Running,
    clients: usize,
    size: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<(String, Instant)>>> {
    let text = "x".repeat(size);
    (0..clients)
        .map(|_| {
            let client = gw.client.clone();
            let url = gw.url("/a2a/agents/echo");
            let stop = stop.clone();
            let text = text.clone();
            tokio::spawn(async move {
                let mut answered = Vec::new();
                let body =
                    crate::helpers::rpc("SendMessage", json!({"message": D::V10.message(&text)}));
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let sent = client
                        .post(&url)
                        .header("A2A-Version", "1.0")
                        .body(body.clone())
                        .send()
                        .await;
                    let Ok(resp) = sent else { break };
                    if resp.status() != 200 {
                        let _ = resp.bytes().await;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                    let Ok(answer) = resp.json::<Value>().await else {
                        break;
                    };
                    if let Some(id) = answer["result"]["task"]["id"].as_str() {
                        answered.push((id.to_string(), Instant::now()));
                    }
                }
                answered
            })
        })
        .collect()
}

/// After the restart: how many of `answered` the store lost, and how long before `killed`
/// the oldest of them was answered.
async fn lost_of(
    gw: &Running,
    answered: &[(String, Instant)],
    killed: Instant,
) -> (usize, Duration) {
    let mut lost = 0;
    let mut window = Duration::ZERO;
    for (id, at) in answered {
        if get(gw, id).await["result"]["id"] != json!(id) {
            lost += 1;
            window = window.max(killed.saturating_duration_since(*at));
        }
    }
    (lost, window)
}

/// `kill -9` under load: with `durability = "sync"` no answered task is lost (an answer
/// leaves once the commit holding it is done); batched commits lose what was answered in
/// their last interval. Both in one run, for the figures.
#[tokio::test]
async fn kill_9_under_load_loses_no_answered_task_with_synced_commits() {
    let mut figures = Vec::new();
    for durability in ["batched", "sync"] {
        let mut gw = start(&format!("durability = \"{durability}\"\n"));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients = load(&gw, 8, 200, stop.clone()).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let killed = Instant::now();
        gw.kill_hard();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut answered = Vec::new();
        for c in clients {
            answered.extend(c.await.unwrap());
        }
        gw.restart();
        let (lost, window) = lost_of(&gw, &answered, killed).await;
        figures.push(format!(
            "{durability}: {lost} of {} answered tasks lost (answered at most {} ms before the kill)",
            answered.len(),
            window.as_millis()
        ));
        assert!(
            answered.len() > 100,
            "{durability}: only {} answered",
            answered.len()
        );
        if durability == "sync" {
            assert_eq!(lost, 0, "{figures:?}");
        }
    }
    println!("figure: kill -9 under load: {}", figures.join("; "));
}

/// With `durability = "sync"` a full disk loses no answered task either: a send whose
/// commit fails is refused (503), not answered, and a `kill -9` before there is room again
/// loses nothing that was answered.
#[tokio::test]
async fn a_full_disk_and_a_kill_9_lose_no_answered_task_with_synced_commits() {
    let disk = SmallDisk::mount("64m");
    let data = disk.path().join("data");
    let mut gw = Running::start(
        &[("echo.toml", ECHO)],
        &format!(
            "default_agent = \"echo\"\n[store]\nkind = \"sqlite\"\ndurability = \"sync\"\ndata_dir = \"{}\"\n",
            data.display()
        ),
        "info",
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = load(&gw, 8, 2_000, stop.clone()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let filler = disk.fill();
    // Sends go on against the full disk, then the process dies before room comes back.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let refused = gw.metrics().await;
    let killed = Instant::now();
    gw.kill_hard();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut answered = Vec::new();
    for c in clients {
        answered.extend(c.await.unwrap());
    }
    assert!(
        refused.contains("a2a_task_store_writable 0"),
        "the disk never filled: {answered:?}"
    );
    std::fs::remove_file(filler).unwrap();
    gw.restart();
    let (lost, _) = lost_of(&gw, &answered, killed).await;
    println!(
        "figure: full disk then kill -9 (sync): {lost} of {} answered tasks lost",
        answered.len()
    );
    assert!(!answered.is_empty());
    assert_eq!(lost, 0);
}

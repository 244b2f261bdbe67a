//! The command backend: local programs as agents, over both dialects and streaming.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{repo_root, spawn_with, text_of, write_config, TestGateway, D};

fn agent(name: &str, io: &str, command: &[&str], extra: &str) -> String {
    let argv: Vec<String> = command.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "name = \"{name}\"\ndescription = \"test\"\n[backend]\nkind = \"command\"\nio = \"{io}\"\ncommand = [{}]\n{extra}\n",
        argv.join(", ")
    )
}

fn script(name: &str) -> String {
    repo_root()
        .join("agents.d/scripts")
        .join(name)
        .display()
        .to_string()
}

async fn gateway(files: &[(&str, &str)]) -> TestGateway {
    spawn_with(files, "").await
}

async fn send(gw: &TestGateway, path: &str, d: D, text: &str) -> Value {
    let r = gw
        .call(path, d, d.send(), json!({"message": d.message(text)}))
        .await;
    d.task_of(r.result())
}

#[tokio::test]
async fn text_programs_complete_and_stream_their_lines_in_order() {
    let shout = agent("shout", "text", &["python3", &script("shout.py")], "");
    let gw = gateway(&[("shout.toml", &shout)]).await;
    for d in [D::V03, D::V10] {
        let task = send(&gw, "/a2a/agents/shout", d, "one two\nthree").await;
        assert_eq!(task["status"]["state"], d.state("completed"), "{task}");
        assert_eq!(text_of(&task["artifacts"]), "ONE TWO\nTHREE\n(3 words)\n");
    }
    let events = gw
        .sse(
            "/a2a/agents/shout",
            D::V10,
            "SendStreamingMessage",
            json!({"message": D::V10.message("a\nb\nc")}),
        )
        .await;
    let chunks: Vec<(String, bool, bool)> = events
        .iter()
        .filter_map(|e| e.data["result"].get("artifactUpdate").cloned())
        .map(|a| {
            (
                a["artifact"]["parts"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                a["append"] == true,
                a["lastChunk"] == true,
            )
        })
        .collect();
    assert_eq!(
        chunks,
        [
            ("A\n", false, false),
            ("B\n", true, false),
            ("C\n", true, false),
            ("(3 words)\n", true, true)
        ]
        .map(|(t, a, l)| (t.to_string(), a, l))
    );
    let last = &events.last().unwrap().data["result"]["statusUpdate"];
    assert_eq!(last["status"]["state"], "TASK_STATE_COMPLETED");
}

#[tokio::test]
async fn a_failing_program_fails_its_task_with_the_tail_of_stderr() {
    let code =
        "import sys; sys.stdin.read(); sys.stderr.write('x' * 5000 + 'boom happened'); sys.exit(3)";
    let gw = gateway(&[(
        "bad.toml",
        &agent("bad", "text", &["python3", "-c", code], ""),
    )])
    .await;
    let task = send(&gw, "/a2a/agents/bad", D::V10, "hi").await;
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED");
    let msg = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        msg.starts_with("the agent's program failed with exit status 3: "),
        "{msg}"
    );
    assert!(msg.ends_with("boom happened"), "{msg}");
    assert!(msg.len() < 2200, "only the tail: {} bytes", msg.len());
}

#[tokio::test]
async fn jsonl_programs_walk_input_required_in_both_dialects() {
    let greet = agent("greet", "jsonl", &["python3", &script("greet.py")], "");
    let gw = gateway(&[("greet.toml", &greet)]).await;
    for d in [D::V03, D::V10] {
        let asking = send(&gw, "/a2a/agents/greet", d, "hello").await;
        assert_eq!(
            asking["status"]["state"],
            d.state("input-required"),
            "{asking}"
        );
        assert_eq!(
            asking["status"]["message"]["parts"][0]["text"],
            "What is your name?"
        );
        let mut follow = d.message("Ada");
        follow["taskId"] = asking["id"].clone();
        let r = gw
            .call("/a2a/agents/greet", d, d.send(), json!({"message": follow}))
            .await;
        let done = d.task_of(r.result());
        assert_eq!(done["status"]["state"], d.state("completed"), "{done}");
        let result = done["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["artifactId"] == "result")
            .unwrap();
        assert_eq!(result["parts"][0]["text"], "Hello, Ada!");
    }
}

fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test]
async fn cancel_and_timeout_really_stop_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let code = format!(
        "import os, time; open({:?}, 'w').write(str(os.getpid())); print('started', flush=True); time.sleep(60)",
        pidfile.display().to_string()
    );
    let slow = agent(
        "slow",
        "text",
        &["python3", "-c", &code],
        "kill_grace_ms = 500",
    );
    let slower = agent(
        "slower",
        "text",
        &["python3", "-c", "import time; time.sleep(60)"],
        "timeout_secs = 1\nkill_grace_ms = 200",
    );
    let gw = gateway(&[("slow.toml", &slow), ("slower.toml", &slower)]).await;

    let r = gw
        .call(
            "/a2a/agents/slow",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("x"), "configuration": {"returnImmediately": true}}),
        )
        .await;
    let id = r.result()["task"]["id"].as_str().unwrap().to_string();
    let mut pid = None;
    for _ in 0..100 {
        if let Ok(p) = std::fs::read_to_string(&pidfile) {
            pid = p.trim().parse::<i32>().ok();
            if pid.is_some() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = pid.expect("the program started");
    assert!(alive(pid));
    let canceled = gw
        .call("/a2a/agents/slow", D::V10, "CancelTask", json!({"id": id}))
        .await;
    assert_eq!(canceled.result()["status"]["state"], "TASK_STATE_CANCELED");
    let mut gone = false;
    for _ in 0..60 {
        if !alive(pid) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the process is really gone after cancel");

    let task = send(&gw, "/a2a/agents/slower", D::V10, "x").await;
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED");
    assert_eq!(
        task["status"]["message"]["parts"][0]["text"],
        "the agent's program did not finish within 1 s"
    );
}

#[tokio::test]
async fn no_more_processes_than_the_limit_run_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let code = format!(
        "import time; f = open({l:?}, 'a'); f.write('start\\n'); f.flush(); time.sleep(0.4); f.write('end\\n'); f.flush()",
        l = log.display().to_string()
    );
    let one = agent(
        "one",
        "text",
        &["python3", "-c", &code],
        "max_concurrent = 1",
    );
    let gw = gateway(&[("one.toml", &one)]).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let r = gw.call("/a2a/agents/one", D::V10, "SendMessage", json!({"message": D::V10.message("x"), "configuration": {"returnImmediately": true}})).await;
        ids.push(r.result()["task"]["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        wait_for_state_at(&gw, id).await;
    }
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        log, "start\nend\nstart\nend\nstart\nend\n",
        "runs never overlap"
    );
}

async fn wait_for_state_at(gw: &TestGateway, id: &str) {
    for _ in 0..100 {
        let r = gw
            .call("/a2a/agents/one", D::V10, "GetTask", json!({"id": id}))
            .await;
        if r.result()["status"]["state"] == "TASK_STATE_COMPLETED" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} did not complete");
}

#[test]
fn a_bad_command_path_is_reported_at_load_time() {
    let (_dir, agents, gateway) = write_config(
        &[
            ("x.toml", &agent("x", "text", &["./no/such/program.sh"], "")),
            (
                "y.toml",
                &agent("y", "text", &["no-such-program-on-path"], ""),
            ),
        ],
        Some(""),
    );
    let err = a2a_gateway::config::load(gateway.as_deref(), &agents)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("x.toml:6:13: backend.command: program \"./no/such/program.sh\" not found"),
        "{err}"
    );
    assert!(
        err.contains("program \"no-such-program-on-path\" not found on PATH"),
        "{err}"
    );
}

//! The command backend: local programs as agents, over both dialects and streaming.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{
    inner, kind, repo_root, spawn_shipped, spawn_with, text_of, write_config, Reply, TestGateway, D,
};

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
    // Megabytes of it: only the tail is kept (and reported), however much comes.
    let code = "import sys; sys.stdin.read(); sys.stderr.write('x' * 5000000 + 'boom happened'); sys.exit(3)";
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
    let tail = msg
        .strip_prefix("the agent's program failed with exit status 3: ")
        .unwrap_or_else(|| panic!("{msg}"));
    assert!(tail.ends_with("xxboom happened"), "{tail}");
    assert!(tail.len() <= 2048, "only the tail: {} bytes", tail.len());
    assert!(tail.len() > 2000, "the whole tail: {} bytes", tail.len());
}

/// The caller learns what failed, not where the gateway keeps its files: paths in the
/// program's stderr are cut to their file names (the log has them whole).
#[tokio::test]
async fn a_failing_programs_stderr_reaches_the_caller_without_server_paths() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("scripts/missing.py");
    let code = format!(
        "import sys; sys.stdin.read(); open({:?})",
        missing.display().to_string()
    );
    let gw = gateway(&[(
        "bad.toml",
        &agent("bad", "text", &["python3", "-c", &code], ""),
    )])
    .await;
    let task = send(&gw, "/a2a/agents/bad", D::V10, "hi").await;
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED");
    let msg = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        msg.contains("No such file or directory: '…/missing.py'"),
        "{msg}"
    );
    let server_dir = dir.path().display().to_string();
    assert!(!msg.contains(&server_dir), "{msg}");
}

/// `check` looks for the script a command names as an argument, not only the program.
#[test]
fn a_missing_script_argument_is_reported_at_load_time() {
    let err = crate::helpers::load_errors(
        &[(
            "x.toml",
            &agent(
                "x",
                "text",
                &["python3", "scripts/nope.py", "--flag", "a/b"],
                "",
            ),
        )],
        "",
    );
    assert!(
        err.contains("x.toml:6:")
            && err.contains("backend.command: argument \"scripts/nope.py\" names no file"),
        "{err}"
    );
    assert!(!err.contains("\"a/b\""), "not a file name: {err}");
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
    wait_for_state_of(gw, "/a2a/agents/one", D::V10, id, "completed").await;
}

/// Polls GetTask on `path` until the task reaches `state`; returns the task.
async fn wait_for_state_of(gw: &TestGateway, path: &str, d: D, id: &str, state: &str) -> Value {
    let want = d.state(state);
    for _ in 0..200 {
        let r = gw.call(path, d, d.get(), json!({"id": id})).await;
        if r.result()["status"]["state"] == want.as_str() {
            return r.result().clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} never reached {want}");
}

#[test]
fn a_bad_command_path_is_reported_at_load_time() {
    let err = crate::helpers::load_errors(
        &[
            ("x.toml", &agent("x", "text", &["./no/such/program.sh"], "")),
            (
                "y.toml",
                &agent("y", "text", &["no-such-program-on-path"], ""),
            ),
        ],
        "",
    );
    assert!(
        err.contains("x.toml:6:13: backend.command: program \"./no/such/program.sh\" not found"),
        "{err}"
    );
    assert!(
        err.contains("program \"no-such-program-on-path\" not found on PATH"),
        "{err}"
    );
}

/// Asks a question naming its pid, then answers the next line naming its pid again.
const ASKS_AND_WAITS: &str = r#"import json, os, sys
def text(line): return "".join(p.get("text", "") for p in json.loads(line).get("parts", []))
sys.stdin.readline()
print(json.dumps({"inputRequired": "pid %d: name?" % os.getpid()}), flush=True)
line = sys.stdin.readline()
print(json.dumps({"result": "%s from pid %d" % (text(line), os.getpid())}), flush=True)
"#;

/// The old way: asks, naming its pid, and exits; started anew, it answers.
const ASKS_AND_EXITS: &str = r#"import json, os, sys
t = "".join(p.get("text", "") for p in json.loads(sys.stdin.readline()).get("parts", []))
if t == "hello":
    print(json.dumps({"inputRequired": "pid %d: name?" % os.getpid()}), flush=True)
else:
    print(json.dumps({"result": "%s from pid %d" % (t, os.getpid())}), flush=True)
"#;

/// The pid in an input-required task's question ("pid 123: name?").
fn asking_pid(task: &Value) -> i32 {
    let question = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default();
    question
        .strip_prefix("pid ")
        .and_then(|rest| rest.split(':').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in the question: {task}"))
}

/// Sends `text` as the follow-up message of `task`.
async fn answer(gw: &TestGateway, path: &str, d: D, task: &Value, text: &str) -> Reply {
    gw.call(
        path,
        d,
        d.send(),
        json!({"message": follow_up(d, task, text)}),
    )
    .await
}

fn follow_up(d: D, task: &Value, text: &str) -> Value {
    let mut message = d.message(text);
    message["taskId"] = task["id"].clone();
    message
}

fn result_text(task: &Value) -> String {
    task["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["artifactId"] == "result")
        .and_then(|a| a["parts"][0]["text"].as_str())
        .unwrap_or_else(|| panic!("no result artifact: {task}"))
        .to_string()
}

async fn wait_until_gone(pid: i32, why: &str) {
    for _ in 0..100 {
        if !alive(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("process {pid} is still alive {why}");
}

#[tokio::test]
async fn the_answer_to_input_required_goes_to_the_waiting_process() {
    let (gw, path) = jsonl_agent(ASKS_AND_WAITS, "").await;
    for d in [D::V03, D::V10] {
        let asking = send(&gw, path, d, "hello").await;
        assert_eq!(
            asking["status"]["state"],
            d.state("input-required"),
            "{asking}"
        );
        let pid = asking_pid(&asking);
        assert!(alive(pid), "the process waits for the answer");
        let r = answer(&gw, path, d, &asking, "Ada").await;
        let done = d.task_of(r.result());
        assert_eq!(done["status"]["state"], d.state("completed"), "{done}");
        assert_eq!(result_text(&done), format!("Ada from pid {pid}"));
        wait_until_gone(pid, "after its task completed").await;
    }
}

#[tokio::test]
async fn a_streamed_answer_streams_the_waiting_process_events() {
    let (gw, path) = jsonl_agent(ASKS_AND_WAITS, "").await;
    for d in [D::V03, D::V10] {
        let asking = send(&gw, path, d, "hello").await;
        let pid = asking_pid(&asking);
        let events = gw
            .sse(
                path,
                d,
                d.stream(),
                json!({"message": follow_up(d, &asking, "Grace")}),
            )
            .await;
        let results: Vec<&Value> = events.iter().map(|e| &e.data["result"]).collect();
        let answer = results
            .iter()
            .filter(|r| kind(d, r) == "artifact-update")
            .map(|r| inner(d, r)["artifact"]["parts"][0]["text"].clone())
            .collect::<Vec<_>>();
        assert_eq!(
            answer,
            [json!(format!("Grace from pid {pid}"))],
            "{results:?}"
        );
        let last = results.last().expect("events");
        assert_eq!(kind(d, last), "status-update", "{last}");
        assert_eq!(inner(d, last)["status"]["state"], d.state("completed"));
    }
}

#[tokio::test]
async fn canceling_a_task_that_waits_for_input_stops_its_process() {
    let (gw, path) = jsonl_agent(ASKS_AND_WAITS, "kill_grace_ms = 500").await;
    for d in [D::V03, D::V10] {
        let asking = send(&gw, path, d, "hello").await;
        let pid = asking_pid(&asking);
        assert!(alive(pid), "the process waits for the answer");
        let canceled = gw
            .call(path, d, d.cancel(), json!({"id": asking["id"]}))
            .await;
        assert_eq!(canceled.result()["status"]["state"], d.state("canceled"));
        wait_until_gone(pid, "after its task was canceled").await;
    }
}

/// Answers "ask" with a question naming its pid and waits for the answer; anything else
/// it answers at once. Either way the result names its pid.
const WAITS_IF_ASKED: &str = r#"import json, os, sys
def text(line): return "".join(p.get("text", "") for p in json.loads(line).get("parts", []))
t = text(sys.stdin.readline())
if t == "ask":
    print(json.dumps({"inputRequired": "pid %d: and?" % os.getpid()}), flush=True)
    t = text(sys.stdin.readline())
print(json.dumps({"result": "%s from pid %d" % (t, os.getpid())}), flush=True)
"#;

/// Far below the agents' `timeout_secs` (30) in these tests: what waits on a parked process
/// instead of running would only move after that.
const PROMPTLY: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_waiting_process_is_stopped_by_closing_its_stdin_first() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let code = r#"import json, os, sys
sys.stdin.readline()
print(json.dumps({"inputRequired": "pid %d: and?" % os.getpid()}), flush=True)
line = sys.stdin.readline()
open(os.environ["LOG"], "a").write("line\n" if line else "eof\n")
"#;
    // A grace long enough that a SIGTERM sent at once could not pass for an exit at EOF.
    let (gw, path) = jsonl_agent(
        code,
        &format!(
            "kill_grace_ms = 3000\nenv = {{ LOG = {:?} }}",
            log.display().to_string()
        ),
    )
    .await;
    let asking = send(&gw, path, D::V10, "hello").await;
    let pid = asking_pid(&asking);
    let canceled = gw
        .call(path, D::V10, "CancelTask", json!({"id": asking["id"]}))
        .await;
    assert_eq!(canceled.result()["status"]["state"], "TASK_STATE_CANCELED");
    wait_until_gone(pid, "after its task was canceled").await;
    assert_eq!(
        std::fs::read_to_string(&log).unwrap_or_default(),
        "eof\n",
        "the program saw the end of its input and exited by itself"
    );
}

/// The shipped greet agent (max_concurrent 4): hellos left unanswered, more of them than
/// it has running slots, keep nobody else from being greeted.
#[tokio::test]
async fn unanswered_hellos_do_not_lock_up_the_shipped_greet_agent() {
    let gw = spawn_shipped().await;
    let path = "/a2a/agents/greet";
    let d = D::V10;
    let mut asking = Vec::new();
    for _ in 0..6 {
        let task = tokio::time::timeout(PROMPTLY, send(&gw, path, d, "hello"))
            .await
            .expect("a hello is answered promptly");
        assert_eq!(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
        asking.push(task);
    }
    let ada = tokio::time::timeout(PROMPTLY, send(&gw, path, d, "Ada"))
        .await
        .expect("a new greeting is served while six wait for names");
    assert_eq!(ada["status"]["state"], "TASK_STATE_COMPLETED", "{ada}");
    assert_eq!(result_text(&ada), "Hello, Ada!");
    let grace = tokio::time::timeout(PROMPTLY, answer(&gw, path, d, &asking[0], "Grace"))
        .await
        .expect("an answer is taken promptly");
    assert_eq!(result_text(&d.task_of(grace.result())), "Hello, Grace!");
    for task in &asking[1..] {
        let canceled = gw
            .call(path, d, d.cancel(), json!({"id": task["id"]}))
            .await;
        assert_eq!(canceled.result()["status"]["state"], "TASK_STATE_CANCELED");
    }
}

/// A gateway with one agent: one running slot, a program that asks when told "ask", and
/// `extra` configuration; with its path and the dialect the tests speak.
async fn one_slot_asker(extra: &str) -> (TestGateway, &'static str, D) {
    let (gw, path) = jsonl_agent(WAITS_IF_ASKED, &format!("max_concurrent = 1\n{extra}")).await;
    (gw, path, D::V10)
}

/// A gateway whose only agent runs the Python `script` in jsonl mode with `extra`
/// configuration; with the agent's path.
async fn jsonl_agent(script: &str, extra: &str) -> (TestGateway, &'static str) {
    let ask = agent("ask", "jsonl", &["python3", "-c", script], extra);
    (gateway(&[("ask.toml", &ask)]).await, "/a2a/agents/ask")
}

#[tokio::test]
async fn a_process_waiting_for_input_gives_up_its_slot_and_the_longest_waiting_makes_room() {
    let (gw, path, d) =
        one_slot_asker("max_waiting = 1\ntimeout_secs = 30\nkill_grace_ms = 500").await;
    let first = send(&gw, path, d, "ask").await;
    assert_eq!(first["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    let first_pid = asking_pid(&first);

    let other = tokio::time::timeout(PROMPTLY, send(&gw, path, d, "other"))
        .await
        .expect("a new task runs while the only slot's last process waits for input");
    assert_eq!(other["status"]["state"], "TASK_STATE_COMPLETED", "{other}");
    assert!(result_text(&other).starts_with("other from pid "));
    assert!(alive(first_pid), "the first process still waits");

    let second = tokio::time::timeout(PROMPTLY, send(&gw, path, d, "ask"))
        .await
        .expect("a second task asks");
    assert_eq!(second["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    let second_pid = asking_pid(&second);

    // max_waiting = 1: the first process, waiting longest, made room.
    let first_id = first["id"].as_str().unwrap();
    let failed = wait_for_state_of(&gw, path, d, first_id, "failed").await;
    assert_eq!(
        failed["status"]["message"]["parts"][0]["text"],
        "stopped waiting for input: too many tasks of this agent are waiting (max_waiting = 1)"
    );
    wait_until_gone(first_pid, "after it was stopped to make room").await;
    assert!(alive(second_pid), "the newest waiting process stays");

    let late = answer(&gw, path, d, &first, "late").await;
    assert!(late.body.get("error").is_some(), "{}", late.body);

    let answered = tokio::time::timeout(PROMPTLY, answer(&gw, path, d, &second, "answer"))
        .await
        .expect("the answer is taken promptly");
    let answered = d.task_of(answered.result());
    assert_eq!(answered["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(
        result_text(&answered),
        format!("answer from pid {second_pid}"),
        "the waiting process took the answer"
    );
}

/// With one slot, a new message in the context of a task that waits for input took the
/// context's turn and then waited for the slot that the waiting process held, while the
/// answer queued behind it in the context: nothing moved until the timeout.
#[tokio::test]
async fn a_new_message_in_the_context_of_a_waiting_task_does_not_wait_for_it() {
    let (gw, path, d) = one_slot_asker("timeout_secs = 30").await;
    let began = std::time::Instant::now();
    let asking = send(&gw, path, d, "ask").await;
    assert_eq!(asking["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    let pid = asking_pid(&asking);

    let at_once = json!({"returnImmediately": true});
    let mut new = d.message("new");
    new["contextId"] = asking["contextId"].clone();
    let r = tokio::time::timeout(
        PROMPTLY,
        gw.call(
            path,
            d,
            d.send(),
            json!({"message": new, "configuration": at_once}),
        ),
    )
    .await
    .expect("the new message starts promptly");
    let new_id = r.result()["task"]["id"].as_str().unwrap().to_string();
    let r = tokio::time::timeout(
        PROMPTLY,
        gw.call(
            path,
            d,
            d.send(),
            json!({"message": follow_up(d, &asking, "answer"), "configuration": at_once}),
        ),
    )
    .await
    .expect("the answer is accepted promptly");
    assert!(r.body.get("error").is_none(), "{}", r.body);

    let new = wait_for_state_of(&gw, path, d, &new_id, "completed").await;
    assert!(result_text(&new).starts_with("new from pid "), "{new}");
    let asking_id = asking["id"].as_str().unwrap();
    let answered = wait_for_state_of(&gw, path, d, asking_id, "completed").await;
    assert_eq!(result_text(&answered), format!("answer from pid {pid}"));
    assert!(
        began.elapsed() < PROMPTLY,
        "all done in {:?}",
        began.elapsed()
    );
}

/// A program that reads the answer and exits without a word has done its work: it is not
/// started again with the answer (which would do it twice).
#[tokio::test]
async fn a_resumed_program_that_reads_the_answer_and_exits_silently_is_not_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let code = r#"import json, os, sys
def text(line): return "".join(p.get("text", "") for p in json.loads(line).get("parts", []))
log = open(os.environ["LOG"], "a")
log.write("start %s\n" % text(sys.stdin.readline())); log.flush()
print(json.dumps({"inputRequired": "and?"}), flush=True)
log.write("got %s\n" % text(sys.stdin.readline())); log.flush()
"#;
    let (gw, path) = jsonl_agent(
        code,
        &format!("env = {{ LOG = {:?} }}", log.display().to_string()),
    )
    .await;
    let d = D::V10;
    // Answered at once each time, while the process may still be settling after asking.
    for round in 1..=3 {
        let asking = send(&gw, path, d, "hello").await;
        assert_eq!(asking["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
        let r = answer(&gw, path, d, &asking, "Ada").await;
        let done = d.task_of(r.result());
        assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "start hello\ngot Ada\n".repeat(round),
            "one start per task"
        );
    }
}

#[test]
fn max_waiting_must_be_at_least_one() {
    let err = crate::helpers::load_errors(
        &[(
            "w.toml",
            &agent("w", "jsonl", &["python3"], "max_waiting = 0"),
        )],
        "",
    );
    assert!(
        err.contains("w.toml:7:1: backend.max_waiting must be at least 1"),
        "{err}"
    );
}

#[tokio::test]
async fn a_process_waiting_past_its_timeout_is_stopped_and_its_task_failed() {
    // Three seconds: Python must start and ask within them on a loaded machine too.
    let (gw, path) = jsonl_agent(ASKS_AND_WAITS, "timeout_secs = 3\nkill_grace_ms = 200").await;
    let asking = send(&gw, path, D::V10, "hello").await;
    assert_eq!(asking["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    let pid = asking_pid(&asking);
    let id = asking["id"].as_str().unwrap();
    let failed = wait_for_state_of(&gw, path, D::V10, id, "failed").await;
    assert_eq!(
        failed["status"]["message"]["parts"][0]["text"],
        "the agent's program did not finish within 3 s (it was waiting for input)"
    );
    wait_until_gone(pid, "after its time ran out").await;
}

#[tokio::test]
async fn a_program_that_asks_and_exits_is_started_anew_for_the_answer() {
    let (gw, path) = jsonl_agent(ASKS_AND_EXITS, "").await;
    // Answered at once, the exit races the answer; every round must still be served.
    for round in 0..4 {
        let asking = send(&gw, path, D::V10, "hello").await;
        let pid = asking_pid(&asking);
        if round % 2 == 1 {
            wait_until_gone(pid, "after asking").await;
        }
        let r = answer(&gw, path, D::V10, &asking, "Ada").await;
        let done = D::V10.task_of(r.result());
        assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
        let answer = result_text(&done);
        assert!(answer.starts_with("Ada from pid "), "{answer}");
        assert_ne!(
            answer,
            format!("Ada from pid {pid}"),
            "a new process answered"
        );
    }
}

/// A gateway that stops, gracefully or not, takes its programs with it: the one running a
/// task and the one waiting for input.
#[tokio::test]
async fn programs_do_not_outlive_the_gateway() {
    for signal in ["TERM", "KILL"] {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let code = format!(
            "import os, time; open({:?}, 'w').write(str(os.getpid())); time.sleep(60)",
            pidfile.display().to_string()
        );
        let (_config, agents, _) = write_config(
            &[
                (
                    "busy.toml",
                    &agent("busy", "text", &["python3", "-c", &code], ""),
                ),
                (
                    "ask.toml",
                    &agent("ask", "jsonl", &["python3", "-c", ASKS_AND_WAITS], ""),
                ),
            ],
            None,
        );
        let mut gateway = std::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
            .args(["serve", "--port", "0", "--agents-dir"])
            .arg(&agents)
            .current_dir(dir.path())
            .env("A2A_GATEWAY_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(gateway.stdout.take().unwrap());
        let banner = {
            use std::io::BufRead;
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            line
        };
        let base = banner
            .split("listening on ")
            .nth(1)
            .unwrap_or_else(|| panic!("no banner: {banner:?}"))
            .trim()
            .to_string();
        let client = crate::helpers::client();
        let call = |path: &str, params: Value| {
            client
                .post(format!("{base}{path}"))
                .header("A2A-Version", "1.0")
                .header("content-type", "application/json")
                .body(crate::helpers::rpc("SendMessage", params))
                .send()
        };
        let busy = call(
            "/a2a/agents/busy",
            json!({"message": D::V10.message("x"), "configuration": {"returnImmediately": true}}),
        )
        .await
        .unwrap();
        assert_eq!(busy.status(), 200);
        let asking: Value = call(
            "/a2a/agents/ask",
            json!({"message": D::V10.message("hello")}),
        )
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        let waiting = asking_pid(&asking["result"]["task"]);
        let mut running = None;
        for _ in 0..100 {
            running = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok());
            if running.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let running = running.expect("the busy program started");
        assert!(alive(running) && alive(waiting));

        let killed = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(gateway.id().to_string())
            .status()
            .unwrap();
        assert!(killed.success());
        let mut exited = None;
        for _ in 0..200 {
            exited = gateway.try_wait().unwrap();
            if exited.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if exited.is_none() {
            let _ = gateway.kill();
            let _ = gateway.wait();
            panic!("the gateway did not stop within 10 s of SIG{signal}");
        }
        drop(stdout);
        wait_until_gone(running, &format!("after SIG{signal} to the gateway")).await;
        wait_until_gone(waiting, &format!("after SIG{signal} to the gateway")).await;
    }
}

/// Program paths, `cwd` and the working directory are the agent file's, wherever the
/// gateway was started; a program that is not executable is refused at load time.
#[tokio::test]
async fn command_paths_are_relative_to_the_agent_file() {
    let (dir, agents, gateway_toml) = write_config(&[], Some("[server]\nworkers = 1\n"));
    let scripts = agents.join("bin");
    std::fs::create_dir(&scripts).unwrap();
    let prog = scripts.join("where.sh");
    std::fs::write(&prog, "#!/bin/sh\ncat >/dev/null\npwd\n").unwrap();
    let plain = scripts.join("plain.sh");
    std::fs::write(&plain, "#!/bin/sh\necho hi\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        agents.join("here.toml"),
        agent("here", "text", &["./bin/where.sh"], ""),
    )
    .unwrap();
    std::fs::write(
        agents.join("there.toml"),
        agent("there", "text", &["./where.sh"], "cwd = \"bin\""),
    )
    .unwrap();
    // The test's working directory is the repository, not the configuration's.
    let settings = a2a_gateway::config::load(gateway_toml.as_deref(), &agents).expect("loads");
    let gw = crate::helpers::start(settings, dir).await;
    for (name, cwd) in [("here", agents.clone()), ("there", scripts.clone())] {
        let path = format!("/a2a/agents/{name}");
        let r = gw
            .call(
                &path,
                D::V10,
                "SendMessage",
                json!({"message": D::V10.message("x")}),
            )
            .await
            .body;
        let task = &r["result"]["task"];
        assert_eq!(
            task["status"]["state"], "TASK_STATE_COMPLETED",
            "{name}: {r}"
        );
        let pwd = text_of(&task["artifacts"]);
        assert_eq!(
            std::fs::canonicalize(pwd.trim()).unwrap(),
            std::fs::canonicalize(&cwd).unwrap(),
            "{name} runs in {}",
            cwd.display()
        );
    }
    std::fs::write(
        agents.join("plain.toml"),
        agent("plain", "text", &["bin/plain.sh"], ""),
    )
    .unwrap();
    let err = a2a_gateway::setup::load(gateway_toml.as_deref(), &agents)
        .err()
        .expect("does not load")
        .to_string();
    assert!(err.contains("plain.toml:6:13: backend.command:"), "{err}");
    assert!(err.contains("plain.sh is not an executable file"), "{err}");
}

/// A program that cannot be started (removed after the gateway loaded it) is answered
/// "unavailable, retry" with no server path and no OS error; the details go to the log.
#[tokio::test]
async fn a_program_that_cannot_start_fails_without_leaking_details() {
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("gone.sh");
    std::fs::write(&prog, "#!/bin/sh\necho hi\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let gone = agent("gone", "text", &[prog.to_str().unwrap()], "");
    let gw = gateway(&[("gone.toml", &gone)]).await;
    std::fs::remove_file(&prog).unwrap();
    for d in [D::V03, D::V10] {
        let r = gw
            .call(
                "/a2a/agents/gone",
                d,
                d.send(),
                json!({"message": d.message("x")}),
            )
            .await;
        assert_eq!((r.status, r.code()), (503, -32051), "{}", r.body);
        assert_eq!(
            r.message(),
            "Agent gone is unavailable: its program could not start",
            "no path, no OS error: {}",
            r.body
        );
        assert_eq!(r.header("retry-after"), "1");
    }
    let health = gw.client.get(gw.url("/a2a/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

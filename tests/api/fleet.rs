//! Replicas on a shared store act as one fleet. For push: one replica follows each task,
//! however many replicas made its configs, so every update reaches each config once; a
//! replica that dies (kill -9) or stalls past its lease (SIGSTOP) hands the following to a
//! survivor, which picks up after the last update notified. A caller's quota of
//! unfinished tasks is one across the replicas.
//!
//! Each on Redis and on PostgreSQL, as in `replicas`: a key prefix or schema of the test's
//! own, deleted at the end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::D;
use crate::push::{state_of, Answer, Got, Receiver};
use crate::replicas::Fleet;

const PUSH: &str = "[push]\nenabled = true\nallow_http = true\nallow = [\"127.0.0.1\"]\n";

fn is_final(state: &str) -> bool {
    matches!(
        state,
        "TASK_STATE_COMPLETED" | "TASK_STATE_FAILED" | "TASK_STATE_CANCELED"
    )
}

/// The notifications a receiver got, checked for repeats: the same body twice is the
/// same update delivered twice (every update carries its own timestamp or artifact).
fn no_repeats(got: &[Got]) {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for g in got {
        *seen.entry(g.body.to_string()).or_default() += 1;
    }
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "delivered more than once: {repeated:#?}"
    );
}

/// The final states among what a receiver got, in order.
fn finals(got: &[Got]) -> Vec<String> {
    got.iter()
        .filter_map(|g| state_of(&g.body))
        .filter(|s| is_final(s))
        .collect()
}

/// What a receiver that keeps notification ids handles of what it got: the first copy of
/// each notification. Copies under one id (a successor sending again what a follower that
/// died had not noted delivered) must carry the same body.
fn handled(got: Vec<Got>) -> Vec<Got> {
    let mut bodies: HashMap<String, Value> = HashMap::new();
    let mut first = Vec::new();
    for g in got {
        let id = g.notification_id().unwrap_or("");
        assert!(!id.is_empty(), "every notification has an id: {g:?}");
        match bodies.get(id) {
            Some(body) => assert_eq!(body, &g.body, "one notification id, two bodies"),
            None => {
                bodies.insert(id.to_string(), g.body.clone());
                first.push(g);
            }
        }
    }
    first
}

/// Waits for a final notification, then a moment for any that would repeat it; what a
/// receiver keeping notification ids handles of what came.
async fn settled(rx: &Receiver) -> Vec<Got> {
    rx.wait("a final notification", |got| !finals(got).is_empty())
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    handled(rx.got())
}

on_both_stores!(
    configs_made_through_two_replicas_each_get_every_update_once,
    a_survivor_follows_on_from_a_killed_replica_without_missing_or_repeating,
    a_replica_stalled_past_its_lease_stops_notifying_once_it_wakes,
    a_final_state_its_follower_had_not_delivered_when_it_died_comes_from_the_survivor,
    a_callers_unfinished_tasks_are_one_quota_across_replicas,
    a_task_held_by_a_replica_that_does_not_follow_it_is_followed_there,
    an_update_its_follower_had_not_delivered_when_it_died_comes_again_under_its_id,
);

async fn configs_made_through_two_replicas_each_get_every_update_once(fleet: Fleet) {
    let gws = fleet.replicas(2, PUSH);
    let (a, b) = (&gws[0], &gws[1]);
    let (on_a, on_b) = (
        Receiver::start("127.0.0.1", Answer::Ok).await,
        Receiver::start("127.0.0.1", Answer::Ok).await,
    );
    let asked = a.send_task("/input your name?", json!({})).await;
    let id = asked["id"].as_str().unwrap().to_string();
    for (gw, name, rx) in [(a, "on-a", &on_a), (b, "on-b", &on_b)] {
        let made = gw
            .call(
                "/a2a",
                "CreateTaskPushNotificationConfig",
                json!({"taskId": id, "id": name, "url": rx.url}),
            )
            .await;
        assert_eq!(made["result"]["id"], name, "{made}");
    }
    assert!(fleet.push_holder(&id).is_some(), "one replica follows it");
    // Answered through B; the task runs on A.
    let mut answer = D::V10.message("Ada");
    answer["taskId"] = asked["id"].clone();
    answer["contextId"] = asked["contextId"].clone();
    let reply = b
        .call("/a2a", "SendMessage", json!({"message": answer}))
        .await;
    assert_eq!(
        reply["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{reply}"
    );
    for rx in [&on_a, &on_b] {
        let got = settled(rx).await;
        no_repeats(&got);
        assert_eq!(finals(&got), ["TASK_STATE_COMPLETED"], "{got:#?}");
    }
    // The same updates, from when each config was made: A's also had the task as it was.
    let bodies = |rx: &Receiver| -> Vec<Value> { rx.got().into_iter().map(|g| g.body).collect() };
    let (all, later) = (bodies(&on_a), bodies(&on_b));
    assert!(
        all.ends_with(&later) && later.len() >= 3,
        "{all:#?}\n{later:#?}"
    );
    assert_eq!(
        fleet.push_holder(&id),
        None,
        "the hold is given up at the end"
    );
}

/// A task `text` starts running on replica B, its config made through A (which follows
/// it), once A has notified its first update: its id.
async fn followed_by_a(gws: &[crate::running::Running], rx: &Receiver, text: &str) -> String {
    let task = gws[1]
        .send_task(text, json!({"returnImmediately": true}))
        .await;
    let id = task["id"].as_str().unwrap().to_string();
    let made = gws[0]
        .call(
            "/a2a",
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "id": "hook", "url": rx.url}),
        )
        .await;
    assert_eq!(made["result"]["id"], "hook", "{made}");
    rx.wait("the first notification, from A", |got| !got.is_empty())
        .await;
    id
}

async fn a_survivor_follows_on_from_a_killed_replica_without_missing_or_repeating(fleet: Fleet) {
    let mut gws = fleet.replicas(2, PUSH);
    let rx = Receiver::start("127.0.0.1", Answer::Ok).await;
    let id = followed_by_a(&gws, &rx, "/delay 4 done").await;
    let followed_by = fleet.push_holder(&id).expect("a holder");
    gws[0].kill_hard();
    let got = settled(&rx).await;
    no_repeats(&got);
    assert_eq!(finals(&got), ["TASK_STATE_COMPLETED"], "{got:#?}");
    let last = &got.last().unwrap().body;
    assert_eq!(state_of(last).as_deref(), Some("TASK_STATE_COMPLETED"));
    assert_eq!(
        fleet.push_holder(&id),
        None,
        "given up by {followed_by}'s successor"
    );
    // The artifact came through too: nothing between A's last update and the end is lost.
    assert!(
        got.iter()
            .any(|g| g.body.get("artifactUpdate").is_some()
                || g.body["task"]["artifacts"].is_array()),
        "{got:#?}"
    );
}

async fn a_replica_stalled_past_its_lease_stops_notifying_once_it_wakes(fleet: Fleet) {
    let gws = fleet.replicas(2, PUSH);
    let rx = Receiver::start("127.0.0.1", Answer::Ok).await;
    followed_by_a(&gws, &rx, "/delay 6 done").await;
    // Stalled past its lease (2 s) and the survivors' two looks: B adopts the task.
    gws[0].signal("STOP");
    tokio::time::sleep(Duration::from_secs(5)).await;
    gws[0].signal("CONT");
    settled(&rx).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got = handled(rx.got());
    no_repeats(&got);
    assert_eq!(finals(&got), ["TASK_STATE_COMPLETED"], "{got:#?}");
    // A woke with the task's end coming in, and let it go.
    let stood_down = gws[0].log_lines().iter().any(|l| {
        l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("another replica follows the task now"))
    });
    assert!(stood_down, "A's log says it stood down");
}

/// The receiver refuses every notification while A (the follower) retries the task's first
/// update, and A dies: as the update was never noted delivered, the survivor sends it
/// again, under the same notification id; then the task's end comes once.
async fn an_update_its_follower_had_not_delivered_when_it_died_comes_again_under_its_id(
    fleet: Fleet,
) {
    let mut gws = fleet.replicas(2, PUSH);
    let refusing = Arc::new(AtomicBool::new(true));
    let rx = Receiver::start("127.0.0.1", Answer::RefuseWhile(refusing.clone())).await;
    // Working for 10 s: unchanged while A dies and B adopts it.
    let id = followed_by_a(&gws, &rx, "/delay 10 done").await;
    let first = rx.got()[0].clone();
    gws[0].kill_hard();
    refusing.store(false, Ordering::SeqCst);
    let after = rx.got().len();
    let got = rx
        .wait("the update again, from the survivor", |got| {
            got.len() > after
        })
        .await;
    let again = &got[after];
    assert_eq!(again.body, first.body, "{got:#?}");
    assert_eq!(again.notification_id(), first.notification_id(), "{got:#?}");
    let got = settled(&rx).await;
    no_repeats(&got);
    assert_eq!(finals(&got), ["TASK_STATE_COMPLETED"], "{got:#?}");
    assert_eq!(fleet.push_holder(&id), None, "given up at the end");
}

/// The receiver refuses the task's final state while A (its follower) retries it, and A
/// dies: the survivor, adopting the task, sends the final state again, and it arrives.
async fn a_final_state_its_follower_had_not_delivered_when_it_died_comes_from_the_survivor(
    fleet: Fleet,
) {
    let mut gws = fleet.replicas(2, PUSH);
    let refusing = Arc::new(AtomicBool::new(true));
    let rx = Receiver::start("127.0.0.1", Answer::RefuseFinalsWhile(refusing.clone())).await;
    let id = followed_by_a(&gws, &rx, "/delay 1 done").await;
    let refused = rx
        .wait("the final state, refused", |got| !finals(got).is_empty())
        .await
        .len();
    gws[0].kill_hard();
    refusing.store(false, Ordering::SeqCst);
    let got = rx
        .wait("the final state, from the survivor", |got| {
            !finals(&got[refused..]).is_empty()
        })
        .await;
    assert_eq!(
        finals(&got[refused..]),
        ["TASK_STATE_COMPLETED"],
        "{got:#?}"
    );
    // Sent again by another replica, it is the same notification: the same id.
    let ids = |from: &[Got]| -> Vec<String> {
        (from.iter())
            .filter(|g| state_of(&g.body).is_some_and(|s| is_final(&s)))
            .map(|g| g.notification_id().unwrap_or("").to_string())
            .collect()
    };
    let (first, again) = (ids(&got[..refused]), ids(&got[refused..]));
    assert!(!first.is_empty() && !first[0].is_empty(), "{got:#?}");
    assert_eq!(again, [first[0].clone()], "{got:#?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fleet.push_holder(&id).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the survivor gives the hold up once it delivered the final state"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An adoption whose claim was made but whose answer was lost (the store's answer, or the
/// connection, gone) leaves a task held by a replica that does not follow it: that replica
/// finds it (it looks every few rounds of adoption) and follows it from the last update
/// notified, and the replica that followed it stands down.
async fn a_task_held_by_a_replica_that_does_not_follow_it_is_followed_there(fleet: Fleet) {
    let gws = fleet.replicas(2, PUSH);
    let rx = Receiver::start("127.0.0.1", Answer::Ok).await;
    // A's name in the store: the holder of a task it follows.
    let on_a = followed_by_a(&gws, &rx, "/delay 1 done").await;
    let a = fleet
        .push_holder(&on_a)
        .expect("A holds the task it follows");
    let before = settled(&rx).await.len();

    let config = json!({"returnImmediately": true, "taskPushNotificationConfig": {"url": rx.url}});
    let task = gws[1].send_task("/delay 8 later", config).await;
    let id = task["id"].as_str().unwrap();
    rx.wait("the first notification of the task, from B", |got| {
        got[before..]
            .iter()
            .any(|g| g.body.to_string().contains(id))
    })
    .await;
    assert_ne!(fleet.push_holder(id).as_deref(), Some(a.as_str()));
    fleet.set_push_holder(id, &a);

    let of_task = || -> Vec<Got> {
        (rx.got().into_iter().skip(before))
            .filter(|g| g.body.to_string().contains(id))
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while finals(&of_task()).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got = handled(of_task());
    no_repeats(&got);
    assert_eq!(finals(&got), ["TASK_STATE_COMPLETED"], "{got:#?}");
    let found = gws[0].log_lines().into_iter().any(|l| {
        l["fields"]["task"] == id
            && l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("nobody followed"))
    });
    assert!(found, "A found the task held and unfollowed");
}

/// Asks a question: a task left waiting for input (unfinished).
async fn ask(gw: &crate::running::Running) -> Value {
    let message = D::V10.message("/input your name?");
    gw.call("/a2a", "SendMessage", json!({"message": message}))
        .await
}

/// A caller's quota of unfinished tasks is one across replicas: what it holds through one
/// counts through the others (replicas tell each other every 200 ms).
async fn a_callers_unfinished_tasks_are_one_quota_across_replicas(fleet: Fleet) {
    let gws = fleet.replicas(2, "[limits]\nmax_unfinished_tasks_per_caller = 2\n");
    let (a, b) = (&gws[0], &gws[1]);
    let first = ask(a).await;
    let first_id = first["result"]["task"]["id"].clone();
    assert!(first_id.is_string(), "{first}");
    let second = ask(a).await;
    assert!(second["result"]["task"]["id"].is_string(), "{second}");
    // Replicas tell each other every 200 ms: B has heard by then, on a loaded machine too.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let refused = ask(b).await;
    assert_eq!(refused["error"]["code"], -32052, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("2 unfinished tasks")),
        "{refused}"
    );
    // One finishes through A: B starts one again.
    let canceled = a.call("/a2a", "CancelTask", json!({"id": first_id})).await;
    assert_eq!(
        canceled["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{canceled}"
    );
    // (As soon as B heard: a refusal makes nothing, so B is asked until it takes one.)
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let taken = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let answer = ask(b).await;
        if answer["error"]["code"] != -32052 || std::time::Instant::now() > deadline {
            break answer;
        }
    };
    assert!(taken["result"]["task"]["id"].is_string(), "{taken}");
    // And now A is at the quota too.
    // Replicas tell each other every 200 ms: B has heard by then, on a loaded machine too.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let refused = ask(a).await;
    assert_eq!(refused["error"]["code"], -32052, "{refused}");
}

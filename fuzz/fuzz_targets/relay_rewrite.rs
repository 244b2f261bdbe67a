//! The relay's rewriting of a same-dialect answer: whatever it accepts it rewrites into
//! valid JSON whose task id is namespaced, without panicking.
#![no_main]

use a2a_gateway::protocol::relay::Relayed;
use a2a_gateway::protocol::Dialect;
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(raw) = serde_json::from_str::<&RawValue>(text) else {
        return;
    };
    for dialect in [Dialect::V03, Dialect::V10] {
        let Ok(mut relayed) = Relayed::read(dialect, raw) else {
            continue;
        };
        if relayed.rewrite(&|id| format!("up.{id}"), Some(2)).is_err() {
            continue;
        }
        let mut out = Vec::new();
        let mut ser = serde_json::Serializer::new(&mut out);
        relayed.serialize_as(dialect, &mut ser).expect("renders");
        // Valid JSON (upstream numbers pass through as written, even past f64's range).
        serde_json::from_slice::<&RawValue>(&out).expect("valid JSON");
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out) else {
            continue;
        };
        if let Some(id) = relayed.task_id.as_deref() {
            assert!(id.starts_with("up."), "{id}");
            let task = if dialect == Dialect::V10 {
                &v["task"]
            } else {
                &v
            };
            assert_eq!(task["id"].as_str(), Some(id));
        }
    }
});

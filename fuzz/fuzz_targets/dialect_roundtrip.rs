//! Conversion between the dialects: whatever parses as a task or a message renders in 0.3
//! and in 1.0, and each rendering reads back to the same rendering (a fixed point), so a
//! value crossing the gateway twice is not changed by the second crossing.
#![no_main]

use a2a_gateway::protocol::model::{Message, Task};
use a2a_gateway::protocol::v03::V03;
use libfuzzer_sys::fuzz_target;

fn fixed_point<T>(value: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned,
    for<'a> V03<'a, T>: serde::Serialize,
{
    let v10 = serde_json::to_vec(value).expect("1.0 renders");
    let back: T = serde_json::from_slice(&v10).expect("1.0 reads back");
    assert_eq!(
        serde_json::to_vec(&back).unwrap(),
        v10,
        "1.0 is a fixed point"
    );
    let v03 = serde_json::to_vec(&V03(value)).expect("0.3 renders");
    let back: T = serde_json::from_slice(&v03).expect("0.3 reads back");
    assert_eq!(
        serde_json::to_vec(&V03(&back)).unwrap(),
        v03,
        "0.3 is a fixed point"
    );
    let again = serde_json::to_vec(&back).unwrap();
    let back2: T = serde_json::from_slice(&again).unwrap();
    assert_eq!(
        serde_json::to_vec(&V03(&back2)).unwrap(),
        v03,
        "0.3 -> 1.0 -> 0.3 keeps it"
    );
}

fuzz_target!(|data: &[u8]| {
    if let Ok(task) = serde_json::from_slice::<Task>(data) {
        fixed_point(&task);
    }
    if let Ok(message) = serde_json::from_slice::<Message>(data) {
        fixed_point(&message);
    }
});

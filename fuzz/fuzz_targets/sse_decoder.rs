//! The SSE decoder for upstream streams: any bytes, cut anywhere, decode to the same events
//! as in one piece, and no event exceeds the cap.
#![no_main]

use std::collections::VecDeque;

use a2a_gateway::fuzzing::SseDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let mut whole = VecDeque::new();
    let whole_ok = SseDecoder::default().feed(body, &mut whole).is_ok();
    let at = usize::from(cut).min(body.len());
    let mut parts = VecDeque::new();
    let mut decoder = SseDecoder::default();
    let parts_ok = decoder.feed(&body[..at], &mut parts).is_ok()
        && decoder.feed(&body[at..], &mut parts).is_ok();
    if whole_ok && parts_ok {
        assert_eq!(whole, parts, "cutting the bytes changes nothing");
    }
    for event in &whole {
        assert!(event.data.len() <= a2a_gateway::fuzzing::MAX_EVENT_BYTES);
    }
});

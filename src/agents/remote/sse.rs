//! A small SSE decoder for upstream streams: LF, CR and CRLF line ends, comments, multi-line
//! `data:`, `event:` names, `id:` (the last event id, kept from event to event as the SSE
//! standard says, for resuming the stream); events are capped in size.

use std::collections::VecDeque;

/// The most an upstream event may hold (the JavaScript SDK's own limit).
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
    /// The stream's last event id when the event was dispatched (its own, or an earlier
    /// one's), if the server sent any.
    pub id: Option<String>,
}

#[derive(Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    event: Option<String>,
    data: String,
    has_data: bool,
    last_id: Option<String>,
}

impl SseDecoder {
    /// Feeds bytes; complete events are appended to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut VecDeque<SseEvent>) -> Result<(), String> {
        self.buf.extend_from_slice(chunk);
        let mut start = 0;
        loop {
            let rest = &self.buf[start..];
            let Some(pos) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') else {
                break;
            };
            // A CR at the very end may be the first half of a CRLF: wait for more.
            if rest[pos] == b'\r' && pos + 1 == rest.len() {
                break;
            }
            let skip = if rest[pos] == b'\r' && rest[pos + 1] == b'\n' {
                2
            } else {
                1
            };
            let line = String::from_utf8_lossy(&rest[..pos]).into_owned();
            start += pos + skip;
            self.line(&line, out);
        }
        self.buf.drain(..start);
        if self.buf.len() + self.data.len() > MAX_EVENT_BYTES {
            return Err(format!(
                "an upstream event exceeded {MAX_EVENT_BYTES} bytes"
            ));
        }
        Ok(())
    }

    fn line(&mut self, line: &str, out: &mut VecDeque<SseEvent>) {
        if line.is_empty() {
            if self.has_data {
                out.push_back(SseEvent {
                    event: self.event.take(),
                    data: std::mem::take(&mut self.data),
                    id: self.last_id.clone(),
                });
            }
            self.event = None;
            self.has_data = false;
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_string()),
            // An id with a NUL is ignored (the standard); an empty one resets it.
            "id" if !value.contains('\0') => {
                self.last_id = (!value.is_empty()).then(|| value.to_string());
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut d = SseDecoder::default();
        let mut out = VecDeque::new();
        for c in chunks {
            d.feed(c, &mut out).unwrap();
        }
        out.into_iter().collect()
    }

    #[test]
    fn handles_every_line_ending_comments_and_split_chunks() {
        let ev = |event: Option<&str>, data: &str| SseEvent {
            event: event.map(str::to_string),
            data: data.into(),
            id: None,
        };
        assert_eq!(
            decode(&[
                b": ping - 2026\r\n\r\ndata: {\"a\":1}\r",
                b"\n\r\n",
                b"event: error\ndata: x\ndata: y\n\n"
            ]),
            vec![ev(None, "{\"a\":1}"), ev(Some("error"), "x\ny")]
        );
        assert_eq!(
            decode(&[b"data:1\r\rdata: 2\n\n"]),
            vec![ev(None, "1"), ev(None, "2")]
        );
    }

    #[test]
    fn the_last_event_id_carries_over_until_changed() {
        let ids: Vec<Option<String>> =
            decode(&[b"id: t:1\ndata: a\n\ndata: b\n\nid: t:2\ndata: c\n\nid\ndata: d\n\n"])
                .into_iter()
                .map(|e| e.id)
                .collect();
        let id = |s: &str| Some(s.to_string());
        assert_eq!(ids, vec![id("t:1"), id("t:1"), id("t:2"), None]);
    }
}

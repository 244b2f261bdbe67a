//! W3C trace context: a caller's `traceparent` is passed on to upstream agents as a child
//! of the gateway's hop (same trace id, a new parent id), so one trace crosses the gateway.
//! A malformed header is ignored, as the recommendation says.

/// A valid `traceparent` (version 00): the trace id and flags the gateway carries on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceParent {
    trace_id: [u8; 32],
    parent_id: [u8; 16],
    flags: [u8; 2],
}

fn lower_hex(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

impl TraceParent {
    /// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, ids not all zeros.
    pub(crate) fn parse(header: &[u8]) -> Option<TraceParent> {
        let h = header.trim_ascii();
        if h.len() < 55 || (h.len() > 55 && h[55] != b'-') {
            return None;
        }
        let (version, trace, parent, flags) = (&h[0..2], &h[3..35], &h[36..52], &h[53..55]);
        let dashes = h[2] == b'-' && h[35] == b'-' && h[52] == b'-';
        // Version ff is invalid; a later version may add fields after the flags.
        let version_ok =
            lower_hex(version) && version != b"ff" && (version != b"00" || h.len() == 55);
        let zero = |s: &[u8]| s.iter().all(|&b| b == b'0');
        if !dashes
            || !version_ok
            || ![trace, parent, flags].iter().all(|s| lower_hex(s))
            || zero(trace)
            || zero(parent)
        {
            return None;
        }
        let mut out = TraceParent {
            trace_id: [0; 32],
            parent_id: [0; 16],
            flags: [0; 2],
        };
        out.trace_id.copy_from_slice(trace);
        out.parent_id.copy_from_slice(parent);
        out.flags.copy_from_slice(flags);
        Some(out)
    }

    /// A caller's trace context from its headers' bytes, on any binding: the parent, and
    /// its `tracestate` when short and printable (passed on as it came).
    pub(crate) fn with_state(
        parent: &[u8],
        state: Option<&[u8]>,
    ) -> Option<(TraceParent, Option<String>)> {
        let parent = TraceParent::parse(parent)?;
        let state = state
            .filter(|v| v.len() <= 512)
            .and_then(|v| std::str::from_utf8(v).ok())
            .filter(|v| v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)))
            .map(str::to_string);
        Some((parent, state))
    }

    pub(crate) fn trace_id(&self) -> &str {
        // Checked to be ASCII hex when parsed.
        std::str::from_utf8(&self.trace_id).unwrap_or_default()
    }

    /// The caller's span id, in hex.
    pub(crate) fn parent_id(&self) -> &str {
        std::str::from_utf8(&self.parent_id).unwrap_or_default()
    }

    /// The flags, in hex (`01`: sampled).
    pub(crate) fn flags(&self) -> &str {
        std::str::from_utf8(&self.flags).unwrap_or("00")
    }

    /// The header for the next hop: the same trace, the gateway's own span as parent.
    pub(crate) fn child(&self) -> String {
        let span = uuid::Uuid::new_v4();
        let mut span_id = [0u8; 8];
        span_id.copy_from_slice(&span.as_bytes()[..8]);
        if span_id == [0; 8] {
            span_id[7] = 1;
        }
        let hex: String = span_id.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "00-{}-{hex}-{}",
            self.trace_id(),
            std::str::from_utf8(&self.flags).unwrap_or("00")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_header_is_carried_on_as_a_child() {
        let tp = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let child = tp.child();
        assert!(
            child.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{child}"
        );
        assert!(child.ends_with("-01"));
        assert_ne!(&child[36..52], "00f067aa0ba902b7", "a new parent id");
        let again = TraceParent::parse(child.as_bytes()).unwrap();
        assert_eq!(
            (again.trace_id(), again.flags()),
            (tp.trace_id(), tp.flags())
        );
        assert_eq!(tp.parent_id(), "00f067aa0ba902b7");
    }

    #[test]
    fn malformed_headers_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad}");
        }
        // A later version may append fields.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-beef";
        assert!(TraceParent::parse(later.as_bytes()).is_some());
    }
}

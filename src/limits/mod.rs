//! Gateway-wide limits that protect the process itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::GatewayError;

/// Descriptors kept back for listeners, logs, upstream calls and accepting connections
/// that will only be told "no".
const RESERVED_DESCRIPTORS: u64 = 512;

/// Counts open SSE streams and refuses new ones beyond the limit, so that running out of
/// file descriptors shows up as a clean 503 rather than a stalled accept loop.
pub struct StreamGauge {
    open: Arc<AtomicUsize>,
    limit: usize,
}

/// One open stream; dropping it (the stream ended or its client left) frees the place.
pub struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl StreamGauge {
    pub fn new(limit: usize) -> StreamGauge {
        StreamGauge {
            open: Arc::new(AtomicUsize::new(0)),
            limit: limit.max(1),
        }
    }

    pub fn try_open(&self) -> Result<StreamSlot, GatewayError> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.limit {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(GatewayError::StreamCapacity(self.limit));
        }
        Ok(StreamSlot(self.open.clone()))
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// What the open-file limit allows: a relayed stream holds two descriptors (client and
/// upstream).
pub fn default_stream_limit() -> usize {
    let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap_or((1024, 1024));
    (soft.saturating_sub(RESERVED_DESCRIPTORS) / 2).max(16) as usize
}

/// Raises the soft open-file limit to the hard one, as servers do; returns the new limit.
pub fn raise_open_file_limit() -> Option<u64> {
    rlimit::increase_nofile_limit(u64::MAX).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_beyond_the_limit_and_frees_on_drop() {
        let gauge = StreamGauge::new(2);
        let a = gauge.try_open().unwrap();
        let _b = gauge.try_open().unwrap();
        assert!(matches!(
            gauge.try_open(),
            Err(GatewayError::StreamCapacity(2))
        ));
        drop(a);
        assert_eq!(gauge.open(), 1);
        assert!(gauge.try_open().is_ok());
    }
}

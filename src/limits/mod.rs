//! Limits that protect the gateway and share it fairly: open streams (gateway-wide and per
//! caller) and request rates.

pub(crate) mod connections;
mod rate;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub(crate) use rate::{RateInfo, RateLimits};

use crate::error::GatewayError;
use crate::store::Shared;
use crate::tasks::FastMap;

/// Descriptors kept back for listeners, logs, upstream calls and accepting connections
/// that will only be told "no".
const RESERVED_DESCRIPTORS: u64 = 512;

/// Counts open SSE streams and refuses new ones beyond the limit, so that running out of
/// file descriptors shows up as a clean 503 rather than a stalled accept loop.
pub(crate) struct StreamGauge {
    open: Arc<AtomicUsize>,
    limit: usize,
    per_caller: Arc<FastMap<String, usize>>,
}

/// One open stream; dropping it (the stream ended or its client left) frees the place.
pub(crate) struct StreamSlot {
    open: Arc<AtomicUsize>,
    caller: Option<(Arc<FastMap<String, usize>>, String)>,
    /// Counted in a store other replicas share: the caller's streams over every replica.
    shared: Option<(Arc<Shared>, String)>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
        if let Some((shared, caller)) = self.shared.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { shared.stream_closed(&caller).await });
            }
        }
        if let Some((map, key)) = self.caller.take() {
            if let dashmap::Entry::Occupied(mut e) = map.entry(key) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }
}

impl StreamGauge {
    pub(crate) fn new(limit: usize) -> StreamGauge {
        StreamGauge {
            open: Arc::new(AtomicUsize::new(0)),
            limit: limit.max(1),
            per_caller: Arc::new(FastMap::default()),
        }
    }

    pub(crate) fn try_open(&self) -> Result<StreamSlot, GatewayError> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.limit {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(GatewayError::StreamCapacity(self.limit));
        }
        Ok(StreamSlot {
            open: self.open.clone(),
            caller: None,
            shared: None,
        })
    }

    /// A slot counted against the gateway and against `caller`, who may hold `max` at once.
    pub(crate) fn try_open_for(
        &self,
        caller: &str,
        max: Option<usize>,
    ) -> Result<StreamSlot, GatewayError> {
        let mut slot = self.try_open()?;
        let Some(max) = max else {
            return Ok(slot);
        };
        let mut count = self.per_caller.entry(caller.to_string()).or_insert(0);
        if *count >= max {
            return Err(GatewayError::TooManyStreams(max));
        }
        *count += 1;
        drop(count);
        slot.caller = Some((self.per_caller.clone(), caller.to_string()));
        Ok(slot)
    }

    /// [`Self::try_open_for`] with the caller's streams counted over every replica that
    /// shares `shared`.
    pub(crate) async fn try_open_shared(
        &self,
        shared: &Arc<Shared>,
        caller: &str,
        max: Option<usize>,
    ) -> Result<StreamSlot, GatewayError> {
        let mut slot = self.try_open()?;
        let Some(max) = max else {
            return Ok(slot);
        };
        match shared.stream_opened(caller, max).await {
            Ok(true) => {
                slot.shared = Some((shared.clone(), caller.to_string()));
                Ok(slot)
            }
            Ok(false) => Err(GatewayError::TooManyStreams(max)),
            Err(e) => Err(GatewayError::StoreUnavailable(e)),
        }
    }

    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }
}

/// What the open-file limit allows: a relayed stream holds two descriptors (client and
/// upstream).
pub(crate) fn default_stream_limit() -> usize {
    let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap_or((1024, 1024));
    (soft.saturating_sub(RESERVED_DESCRIPTORS) / 2).max(16) as usize
}

/// Connections open at once by default: three quarters of the descriptors the open-file
/// limit leaves, the rest being for upstream calls, streams and command pipes.
pub(crate) fn default_connection_limit() -> usize {
    let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap_or((1024, 1024));
    (soft.saturating_sub(RESERVED_DESCRIPTORS) * 3 / 4).clamp(64, 1_000_000) as usize
}

/// Bytes of tasks kept in memory by default: a quarter of the memory the gateway may use
/// (its cgroup's limit where one is set, as in a container, else the machine's), at least
/// 64 MiB.
pub(crate) fn default_stored_bytes() -> u64 {
    (memory_available().unwrap_or(4 << 30) / 4).max(64 << 20)
}

/// The smallest of the cgroup (v2, then v1) memory limit and the machine's memory.
pub(crate) fn memory_available() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let cgroup = read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .and_then(|v| v.trim().parse::<u64>().ok());
    let machine = read("/proc/meminfo").and_then(|info| {
        let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    });
    match (cgroup, machine) {
        (Some(c), Some(m)) => Some(c.min(m)),
        (c, m) => c.or(m),
    }
}

/// Raises the soft open-file limit to the hard one, as servers do; returns the new limit.
pub(crate) fn raise_open_file_limit() -> Option<u64> {
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

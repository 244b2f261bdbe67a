//! Whether a shared store answers, for readiness and the log.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the shared store answered the last time anyone asked; `/a2a/ready` says 503
/// while not.
pub(crate) struct Health {
    down: AtomicBool,
    /// The store's name, for the log.
    pub(crate) store: &'static str,
}

impl Health {
    pub(crate) fn new(store: &'static str) -> Health {
        Health {
            down: AtomicBool::new(false),
            store,
        }
    }

    pub(crate) fn up(&self) -> bool {
        !self.down.load(Ordering::Relaxed)
    }

    /// Notes an outcome, logging when the store stops or starts answering.
    pub(crate) fn saw<T, E: std::fmt::Display>(&self, r: &Result<T, E>) {
        let down = r.is_err();
        if self.down.swap(down, Ordering::Relaxed) != down {
            match r {
                Err(e) => tracing::error!(error = %e, "store: {} is unreachable", self.store),
                Ok(_) => tracing::info!("store: {} answers again", self.store),
            }
        }
    }
}

//! The MCP endpoint's sessions (handshake era): who opened each, what each caller holds,
//! and the caps. A session is its opener's: another caller, or an anonymous client on
//! another address, finds no such session. Opening one takes a place under the caller's
//! cap and the gateway's, and a part of the caller's memory share (see
//! [`crate::http::BodyLimits::hold_share`]); a session idle past its timeout is closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::GatewayError;

/// What an open session is counted as in its caller's memory share: a session of rmcp's
/// with its worker and channels, measured at about 85 KiB (10,000 idle sessions took the
/// gateway from 31 to 863 MB), rounded up.
pub(super) const SESSION_BYTES: usize = 96 * 1024;

/// Sessions open at once by default: what a 64th of the memory the gateway may use holds
/// at [`SESSION_BYTES`] each, from 256 to 10,000.
pub(super) fn default_max_sessions() -> usize {
    let memory = crate::limits::memory_available().unwrap_or(4 << 30);
    let fits = memory / 64 / SESSION_BYTES as u64;
    (fits as usize).clamp(256, 10_000)
}

struct Open {
    /// The caller's key (see [`crate::http::Live::caller_key`]): a credential, or an
    /// anonymous client's address group.
    owner: Arc<str>,
    last_used: Instant,
    /// Answers on their way out (a server stream open counts): not idle meanwhile.
    busy: usize,
    /// The caller's memory share slot that holds [`SESSION_BYTES`] for it.
    share_slot: usize,
}

#[derive(Default)]
struct Inner {
    open: HashMap<String, Open>,
    /// Sessions open or being opened, per caller key.
    by_owner: HashMap<Arc<str>, usize>,
    /// Sessions being opened (an `initialize` in flight).
    opening: usize,
}

/// The sessions of one endpoint.
pub(super) struct Sessions {
    inner: Mutex<Inner>,
    /// Open sessions, for `a2a_mcp_sessions` (shared with the metrics).
    gauge: Arc<AtomicUsize>,
}

/// A place taken for a session being opened; given back unless [`Sessions::opened`]
/// turns it into a session.
pub(super) struct Opening<'a> {
    sessions: &'a Sessions,
    owner: Arc<str>,
    share_slot: usize,
    give_back: Option<Box<dyn FnOnce(usize) + 'a>>,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if let Some(give_back) = self.give_back.take() {
            self.sessions.lock().release(&self.owner, true);
            give_back(self.share_slot);
        }
    }
}

impl Inner {
    /// One session (or one being opened, `opening`) of `owner`'s less.
    fn release(&mut self, owner: &Arc<str>, opening: bool) {
        if opening {
            self.opening = self.opening.saturating_sub(1);
        }
        if let Some(n) = self.by_owner.get_mut(owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_owner.remove(owner);
            }
        }
    }
}

impl Sessions {
    pub(super) fn new(gauge: Arc<AtomicUsize>) -> Sessions {
        Sessions {
            inner: Mutex::default(),
            gauge,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Each step leaves the maps consistent: a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether session `id` is `owner`'s; marks it used.
    pub(super) fn owned_by(&self, id: &str, owner: &str) -> bool {
        let mut inner = self.lock();
        match inner.open.get_mut(id) {
            Some(open) if *open.owner == *owner => {
                open.last_used = Instant::now();
                true
            }
            _ => false,
        }
    }

    /// An answer in session `id` is on its way out.
    pub(super) fn enter(&self, id: &str) {
        if let Some(open) = self.lock().open.get_mut(id) {
            open.busy += 1;
        }
    }

    /// An answer in session `id` has gone (or its client has): the session was used now.
    pub(super) fn done(&self, id: &str) {
        if let Some(open) = self.lock().open.get_mut(id) {
            open.busy = open.busy.saturating_sub(1);
            open.last_used = Instant::now();
        }
    }

    /// Takes a place for a session `owner` opens, under its cap and the gateway's, and
    /// its memory share through `hold` (the slot held, or the refusal); `give_back` gives
    /// that share back when the place is let go.
    pub(super) fn open<'a>(
        &'a self,
        owner: Arc<str>,
        caps: (usize, usize),
        idle: Duration,
        hold: impl FnOnce() -> Result<usize, GatewayError>,
        give_back: impl FnOnce(usize) + 'a,
    ) -> Result<Opening<'a>, GatewayError> {
        let (per_caller, max) = caps;
        let mut inner = self.lock();
        let held = inner.by_owner.get(&owner).copied().unwrap_or(0);
        if held >= per_caller {
            return Err(GatewayError::TooManySessions(per_caller, idle.as_secs()));
        }
        if inner.open.len() + inner.opening >= max {
            return Err(GatewayError::SessionCapacity(max));
        }
        let share_slot = hold()?;
        inner.opening += 1;
        *inner.by_owner.entry(owner.clone()).or_default() += 1;
        Ok(Opening {
            sessions: self,
            owner,
            share_slot,
            give_back: Some(Box::new(give_back)),
        })
    }

    /// The session a place was taken for is open, as `id`.
    pub(super) fn opened(&self, mut opening: Opening<'_>, id: &str) {
        // Its place and share go to the session now.
        opening.give_back = None;
        let mut inner = self.lock();
        inner.opening = inner.opening.saturating_sub(1);
        let open = Open {
            owner: opening.owner.clone(),
            last_used: Instant::now(),
            busy: 0,
            share_slot: opening.share_slot,
        };
        if let Some(replaced) = inner.open.insert(id.to_owned(), open) {
            // An id rmcp gave twice: the first session's place goes.
            inner.release(&replaced.owner, false);
        }
        self.gauge.store(inner.open.len(), Ordering::Relaxed);
    }

    /// Forgets session `id`; the share slot it held, to give back.
    pub(super) fn close(&self, id: &str) -> Option<usize> {
        let mut inner = self.lock();
        let open = inner.open.remove(id)?;
        inner.release(&open.owner, false);
        self.gauge.store(inner.open.len(), Ordering::Relaxed);
        Some(open.share_slot)
    }

    /// The sessions unused for `idle` or more, with no answer on its way.
    pub(super) fn idle(&self, idle: Duration) -> Vec<String> {
        let inner = self.lock();
        let now = Instant::now();
        (inner.open.iter())
            .filter(|(_, open)| open.busy == 0 && now.duration_since(open.last_used) >= idle)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Every open session's id.
    pub(super) fn ids(&self) -> Vec<String> {
        self.lock().open.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_caller_and_overall_and_places_come_back() {
        let sessions = Sessions::new(Arc::default());
        let idle = Duration::from_secs(60);
        let given = std::cell::Cell::new(0);
        let open = |owner: &str| {
            sessions.open(
                owner.into(),
                (2, 3),
                idle,
                || Ok(7),
                |slot| given.set(given.get() + slot),
            )
        };
        let a1 = open("a").unwrap();
        sessions.opened(a1, "s1");
        let a2 = open("a").unwrap();
        assert!(matches!(
            open("a"),
            Err(GatewayError::TooManySessions(2, 60))
        ));
        // A place not turned into a session comes back, with its share.
        drop(a2);
        assert_eq!(given.get(), 7);
        sessions.opened(open("a").unwrap(), "s2");
        sessions.opened(open("b").unwrap(), "s3");
        assert!(matches!(open("c"), Err(GatewayError::SessionCapacity(3))));
        assert!(sessions.owned_by("s1", "a"));
        assert!(!sessions.owned_by("s1", "b"));
        assert_eq!(sessions.close("s1"), Some(7));
        assert!(!sessions.owned_by("s1", "a"));
        sessions.opened(open("c").unwrap(), "s4");
        assert_eq!(sessions.gauge.load(Ordering::Relaxed), 3);
        // A refused share leaves no place taken.
        let refused = sessions.open(
            "d".into(),
            (2, 9),
            idle,
            || Err(GatewayError::BodiesOverShare("x".into())),
            |_| {},
        );
        assert!(refused.is_err());
        assert!(!sessions.lock().by_owner.contains_key("d"));
        assert_eq!(sessions.idle(Duration::ZERO).len(), 3);
        sessions.enter("s2");
        assert_eq!(
            sessions.idle(Duration::ZERO).len(),
            2,
            "a busy session is not idle"
        );
        sessions.done("s2");
        assert_eq!(sessions.idle(Duration::ZERO).len(), 3);
    }
}

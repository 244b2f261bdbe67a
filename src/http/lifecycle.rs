//! Where the gateway is in its life, for readiness and for drain: starting (the
//! configuration is loaded but the listeners are not up yet), ready, or draining (a
//! SIGTERM came; new calls are refused and open streams are told to go elsewhere).

use std::sync::atomic::{AtomicU8, Ordering};

use actix_web::{web, HttpResponse};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::AppState;

const STARTING: u8 = 0;
const READY: u8 = 1;
const DRAINING: u8 = 2;

pub(crate) struct Lifecycle {
    phase: AtomicU8,
    drain: CancellationToken,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            phase: AtomicU8::new(STARTING),
            drain: CancellationToken::new(),
        }
    }
}

impl Lifecycle {
    /// The listeners are up.
    pub(crate) fn ready(&self) {
        let _ = self
            .phase
            .compare_exchange(STARTING, READY, Ordering::AcqRel, Ordering::Acquire);
    }

    /// From now on new calls are refused and open streams end.
    pub(crate) fn drain(&self) {
        self.phase.store(DRAINING, Ordering::Release);
        self.drain.cancel();
    }

    pub(crate) fn draining(&self) -> bool {
        self.phase.load(Ordering::Acquire) == DRAINING
    }

    /// Fires when the drain starts.
    pub(crate) fn drain_token(&self) -> CancellationToken {
        self.drain.clone()
    }
}

/// `GET /a2a/ready`: 200 once the configuration is loaded and the listeners are up, 503
/// before and while draining; the body says which.
pub(super) async fn ready(state: web::Data<AppState>) -> HttpResponse {
    let trouble = state.store.trouble();
    let (mut resp, status, reason) = match state.lifecycle.phase.load(Ordering::Acquire) {
        READY if trouble.is_some() => (
            HttpResponse::ServiceUnavailable(),
            "store_unavailable",
            trouble.unwrap_or_default(),
        ),
        READY => (HttpResponse::Ok(), "ready", "serving"),
        DRAINING => (
            HttpResponse::ServiceUnavailable(),
            "draining",
            "shutting down: finishing calls in flight, taking no new ones",
        ),
        _ => (
            HttpResponse::ServiceUnavailable(),
            "starting",
            "the listeners are not up yet",
        ),
    };
    resp.insert_header(("Cache-Control", "no-store"))
        .json(json!({ "status": status, "reason": reason }))
}

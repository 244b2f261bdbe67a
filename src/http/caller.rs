//! The caller of a request, as an extractor: credentials are read from the headers, before
//! any body, in one place for every handler. A refusal is kept for the handler to answer in
//! its binding's shape (a JSON-RPC error, a `google.rpc.Status`, or an anonymous card).

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest};

use super::admission::Head;
use super::{AppState, LiveRef};
use crate::auth::Principal;
use crate::error::GatewayError;

pub(crate) struct Caller {
    pub(crate) principal: Result<Principal, GatewayError>,
    /// The configuration the request is served under, taken once.
    pub(crate) live: LiveRef,
}

impl Caller {
    /// The caller of `req` and the application state, looked up once for both. The state is
    /// lent by the request, not cloned: a clone per request writes a count both workers
    /// share; a caller that keeps it past the request (MCP's sessions) clones it then.
    pub(crate) fn with_state(req: &HttpRequest) -> Option<(&web::Data<AppState>, Caller)> {
        let state = req.app_data::<web::Data<AppState>>()?;
        Some((state, Caller::of(req, state)))
    }

    /// The caller of a call with this head (HTTP headers, gRPC metadata).
    pub(crate) fn of(head: &impl Head, state: &AppState) -> Caller {
        let live = super::live::current(&state.live);
        let mut principal = live.authenticate(head, &state.keys);
        match &mut principal {
            Ok(p) if p.anonymous => p.address = live.client_address(head),
            Ok(p) => crate::telemetry::note(|c| c.principal = Some(p.id.clone())),
            Err(_) => {}
        }
        Caller { principal, live }
    }
}

impl FromRequest for Caller {
    type Error = actix_web::Error;
    type Future = Ready<Result<Caller, actix_web::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let caller = req
            .app_data::<web::Data<AppState>>()
            .map(|s| Caller::of(req, s));
        ready(caller.ok_or_else(|| {
            actix_web::error::ErrorInternalServerError("the application state is missing")
        }))
    }
}

//! The caller of a request, as an extractor: credentials are read from the headers, before
//! any body, in one place for every handler. A refusal is kept for the handler to answer in
//! its binding's shape (a JSON-RPC error, a `google.rpc.Status`, or an anonymous card).

use std::convert::Infallible;
use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest};

use super::AppState;
use crate::auth::Principal;
use crate::error::GatewayError;

pub(crate) struct Caller(pub(crate) Result<Principal, GatewayError>);

impl FromRequest for Caller {
    type Error = Infallible;
    type Future = Ready<Result<Caller, Infallible>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let caller = match req.app_data::<web::Data<AppState>>() {
            Some(state) => state.authenticate(req),
            None => Err(GatewayError::Internal(
                "the application state is missing".into(),
            )),
        };
        ready(Ok(Caller(caller)))
    }
}

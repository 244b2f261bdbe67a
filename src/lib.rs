//! a2a-gateway: one front door for many Agent2Agent (A2A) agents.
//!
//! The layers and where a new backend, store or binding goes: `src/README.md`.
// Denied rather than forbidden for one audited exception: the child-process hook in
// `agents::command::spawn`.
#![deny(unsafe_code)]
// `pub` is the crate's surface (the modules declared `pub` below); inside, `pub(crate)`.
#![warn(unreachable_pub)]

pub(crate) mod admin;
pub(crate) mod agents;
pub mod app;
pub(crate) mod auth;
pub(crate) mod card;
pub mod cli;
pub mod config;
pub(crate) mod devcert;
pub mod error;
pub(crate) mod grpc;
pub(crate) mod http;
pub(crate) mod limits;
pub(crate) mod mcp;
pub(crate) mod policy;
pub mod protocol;
pub(crate) mod push;
pub(crate) mod reload;
pub(crate) mod routing;
pub(crate) mod rpc;
pub(crate) mod service;
pub mod setup;
pub(crate) mod signing;
pub(crate) mod store;
pub(crate) mod tasks;
pub(crate) mod telemetry;
pub(crate) mod usage;

/// Entry points for the fuzz targets under `fuzz/`, which need a few internals; built only
/// with the `fuzzing` feature, so the public surface stays what it is.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    pub use crate::agents::remote::sse::{SseDecoder, SseEvent, MAX_EVENT_BYTES};
}

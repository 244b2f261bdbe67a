//! Integration tests: the real server on an ephemeral port, spoken to over real HTTP.
//! One test binary, because each extra binary costs a link step.

/// A test body run once on each shared store: `<name>::redis` and `<name>::postgres`.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn redis() {
                super::$name(crate::replicas::Fleet::redis()).await
            }
            #[tokio::test]
            async fn postgres() {
                super::$name(crate::replicas::Fleet::postgres()).await
            }
        }
    )*};
}

mod admin;
mod auth;
mod balancer;
mod card_signatures;
mod cards;
mod chaos;
mod cli;
mod command;
mod config;
mod connections;
mod console;
mod deploy;
mod errors;
mod examples;
mod extended_cards;
mod extensions;
mod fleet;
mod grpc;
mod helpers;
mod hostile;
mod interop;
mod layout;
mod legacy;
mod lifecycle;
mod limits;
mod mcp;
mod mtls;
mod observability;
mod openai;
mod operations;
mod paths;
mod peers;
mod policies;
mod postgres;
mod previous_release;
mod push;
mod replicas;
mod rest;
mod resume;
mod routing;
mod running;
mod shares;
mod store;
mod streaming;
mod thirdparty;
mod tls;
mod traces;
mod upgrade;
mod upstream;
mod usage;

//! Integration tests: the real server on an ephemeral port, spoken to over real HTTP.
//! One test binary, because each extra binary costs a link step.

mod auth;
mod balancer;
mod card_signatures;
mod cards;
mod cli;
mod command;
mod config;
mod console;
mod deploy;
mod errors;
mod extended_cards;
mod extensions;
mod grpc;
mod helpers;
mod hostile;
mod interop;
mod layout;
mod legacy;
mod lifecycle;
mod limits;
mod mtls;
mod openai;
mod operations;
mod paths;
mod peers;
mod push;
mod replicas;
mod rest;
mod routing;
mod running;
mod store;
mod streaming;
mod thirdparty;
mod tls;
mod upstream;

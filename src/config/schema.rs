//! JSON schemas of `gateway.toml` and of an agent file, generated from the very types that
//! read them (so they cannot drift), for editors that complete and check TOML against a
//! schema (Taplo / Even Better TOML: a `#:schema <path>` first line). `a2a-gateway schema`
//! prints them; the copies under `docs/schema/` are checked against these by the tests.

use serde_json::Value;

use super::agents_d::AgentFile;
use super::GatewayConfig;

/// Which file a schema describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemaOf {
    /// `gateway.toml`
    Gateway,
    /// one file of `agents.d/`
    Agent,
}

pub fn schema(of: SchemaOf) -> Value {
    let schema = match of {
        SchemaOf::Gateway => schemars::schema_for!(GatewayConfig),
        SchemaOf::Agent => schemars::schema_for!(AgentFile),
    };
    schema.to_value()
}

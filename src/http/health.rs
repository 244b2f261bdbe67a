use actix_web::{web, HttpResponse};
use serde_json::{json, Map, Value};

use super::AppState;
use crate::agents::AgentHealth;
use crate::protocol::model::format_timestamp;

/// 200 whenever the gateway serves; `status` says whether every agent is healthy.
pub(super) async fn health(state: web::Data<AppState>) -> HttpResponse {
    let mut agents = Map::new();
    let mut all_healthy = true;
    for agent in state.live().registry.iter() {
        let h = agent.health();
        all_healthy &= h == AgentHealth::Healthy;
        agents.insert(agent.def.name.clone(), json!(h));
    }
    HttpResponse::Ok()
        .insert_header(("Cache-Control", "no-store"))
        .json(json!({
            "status": if all_healthy { "ok" } else { "degraded" },
            "timestamp": format_timestamp(&chrono::Utc::now()),
            "version": env!("CARGO_PKG_VERSION"),
            "tasks": state.service.tasks().len(),
            "openStreams": state.streams.open(),
            "maxOpenStreams": state.streams.limit(),
            "openConnections": state.connections.open(),
            "maxConnections": state.connections.limit(),
            "bufferedBodyBytes": state.bodies.buffered(),
            "agents": Value::Object(agents),
        }))
}

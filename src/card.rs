//! Agent cards: each agent's own card and the gateway's aggregated one, with every URL
//! pointing back through the gateway.
//!
//! Cards are "hybrid": 1.0 `supportedInterfaces` plus the 0.3 top-level `url`,
//! `protocolVersion` and `preferredTransport`, so clients of either generation read them.

use serde_json::{json, Map, Value};

use crate::agents::Registry;
use crate::config::{AgentDef, GatewayConfig, Skill};

/// The 0.3 revision the hybrid card's top-level fields follow.
const V03_PROTOCOL_VERSION: &str = "0.3.0";

/// JSON-RPC interfaces at `url`, preferred (1.0) first.
fn interfaces(url: &str) -> Value {
    json!([
        {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
    ])
}

fn capabilities() -> Value {
    json!({"streaming": true, "pushNotifications": false})
}

fn skill_json(skill: &Skill, id: String) -> Value {
    let mut s = Map::new();
    s.insert("id".into(), json!(id));
    s.insert("name".into(), json!(skill.name));
    s.insert("description".into(), json!(skill.description));
    s.insert("tags".into(), json!(skill.tags));
    if !skill.examples.is_empty() {
        s.insert("examples".into(), json!(skill.examples));
    }
    if !skill.input_modes.is_empty() {
        s.insert("inputModes".into(), json!(skill.input_modes));
    }
    if !skill.output_modes.is_empty() {
        s.insert("outputModes".into(), json!(skill.output_modes));
    }
    Value::Object(s)
}

pub fn agent_path(name: &str) -> String {
    format!("/a2a/agents/{name}")
}

/// The card of one agent; `base` is the gateway's public base URL without trailing slash.
pub fn agent_card(def: &AgentDef, base: &str) -> Value {
    let url = format!("{base}{}", agent_path(&def.name));
    let mut card = json!({
        "name": def.name,
        "description": def.description,
        "version": def.version,
        "supportedInterfaces": interfaces(&url),
        "protocolVersion": V03_PROTOCOL_VERSION,
        "url": url,
        "preferredTransport": "JSONRPC",
        "capabilities": capabilities(),
        "defaultInputModes": def.default_input_modes,
        "defaultOutputModes": def.default_output_modes,
        "skills": def.skills.iter().map(|s| skill_json(s, s.id.clone())).collect::<Vec<_>>(),
    });
    if let Some(obj) = card.as_object_mut() {
        if let Some(p) = &def.provider {
            obj.insert("provider".into(), json!(p));
        }
        if let Some(d) = &def.documentation_url {
            obj.insert("documentationUrl".into(), json!(d));
        }
        if let Some(i) = &def.icon_url {
            obj.insert("iconUrl".into(), json!(i));
        }
    }
    card
}

/// The id a skill has in the aggregated card: namespaced by its agent, since two agents may
/// both call a skill "search".
pub fn namespaced_skill_id(agent: &str, skill: &str) -> String {
    format!("{agent}/{skill}")
}

/// The gateway's own card: its identity, the union of all agents' skills, interfaces at `/a2a`.
pub fn gateway_card(config: &GatewayConfig, registry: &Registry, base: &str) -> Value {
    let url = format!("{base}/a2a");
    let mut skills = Vec::new();
    let mut input_modes: Vec<&String> = Vec::new();
    let mut output_modes: Vec<&String> = Vec::new();
    for agent in registry.iter() {
        let def = &agent.def;
        for skill in &def.skills {
            let mut s = skill_json(skill, namespaced_skill_id(&def.name, &skill.id));
            if let Some(tags) = s.get_mut("tags").and_then(Value::as_array_mut) {
                tags.push(json!(format!("agent:{}", def.name)));
            }
            skills.push(s);
        }
        for m in &def.default_input_modes {
            if !input_modes.contains(&m) {
                input_modes.push(m);
            }
        }
        for m in &def.default_output_modes {
            if !output_modes.contains(&m) {
                output_modes.push(m);
            }
        }
    }
    let mut card = json!({
        "name": config.name,
        "description": config.description,
        "version": config.version,
        "supportedInterfaces": interfaces(&url),
        "protocolVersion": V03_PROTOCOL_VERSION,
        "url": url,
        "preferredTransport": "JSONRPC",
        "capabilities": capabilities(),
        "defaultInputModes": input_modes,
        "defaultOutputModes": output_modes,
        "skills": skills,
    });
    if let Some(obj) = card.as_object_mut() {
        if let Some(p) = &config.provider {
            obj.insert("provider".into(), json!(p));
        }
        if let Some(d) = &config.documentation_url {
            obj.insert("documentationUrl".into(), json!(d));
        }
    }
    card
}

/// A strong validator for a rendered card. Deterministic across restarts and replicas
/// (unlike a randomly keyed hasher), so caches stay warm through a rolling deploy.
pub fn etag(body: &[u8]) -> String {
    // FNV-1a, 64 bit: tiny, fast, and collisions only cost a cache miss.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in body {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{hash:016x}\"")
}

//! Agent cards: each agent's own card and the gateway's aggregated one, with every URL
//! pointing back through the gateway.
//!
//! Cards are "hybrid": 1.0 `supportedInterfaces` plus the 0.3 top-level `url`,
//! `protocolVersion` and `preferredTransport`, so clients of either generation read them.

use serde_json::{json, Map, Value};

use crate::agents::Agent;
use crate::auth::SchemeKind;
use crate::config::{AgentDef, GatewayConfig, Skill};

/// The 0.3 revision the hybrid card's top-level fields follow.
const V03_PROTOCOL_VERSION: &str = "0.3.0";

/// What the gateway offers at `url`: JSON-RPC in both dialects (1.0 preferred), the 1.0
/// HTTP+JSON binding under `url/rest`, and when it is on the 1.0 gRPC binding, where an
/// agent's card names the agent as its `tenant` (which its clients put in every request).
fn interfaces(url: &str, offers: Offers, tenant: Option<&str>) -> Value {
    let mut all = vec![
        json!({"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}),
        json!({"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"}),
        json!({"url": format!("{url}/rest"), "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"}),
    ];
    if let Some(target) = offers.grpc {
        let mut grpc = json!({"url": target, "protocolBinding": "GRPC", "protocolVersion": "1.0"});
        if let Some(tenant) = tenant {
            grpc["tenant"] = json!(tenant);
        }
        all.push(grpc);
    }
    Value::Array(all)
}

/// `push`: whether the gateway delivers push notifications (for every agent it serves:
/// it notifies from what it sees of each task, whatever the agent behind can do).
fn capabilities(push: bool) -> Value {
    json!({"streaming": true, "pushNotifications": push})
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

pub(crate) fn agent_path(name: &str) -> String {
    format!("/a2a/agents/{name}")
}

const DEFAULT_VERSION: &str = "1.0.0";
const DEFAULT_MODE: &str = "text/plain";

fn modes(m: &Option<Vec<String>>) -> Vec<String> {
    m.clone().unwrap_or_else(|| vec![DEFAULT_MODE.to_string()])
}

/// How a card states its security: the schemes the gateway accepts, whether calling
/// requires them, and which generation's shapes to write (0.3 OpenAPI style, or 1.0 oneof
/// wrappers; the one field cannot hold both, so cards follow the caller's `A2A-Version`).
pub(crate) struct Security<'a> {
    pub(crate) schemes: &'a [SchemeKind],
    pub(crate) required: bool,
    pub v10: bool,
}

/// What a card says the gateway offers besides security.
#[derive(Clone, Copy)]
pub(crate) struct Offers<'a> {
    /// Push notifications are on.
    pub(crate) push: bool,
    /// Where the gRPC binding listens (`host:port`, a gRPC target), when it is on.
    pub(crate) grpc: Option<&'a str>,
}

fn scheme_json(kind: SchemeKind, v10: bool) -> Value {
    match (kind, v10) {
        (SchemeKind::ApiKey, false) => {
            json!({"type": "apiKey", "in": "header", "name": crate::auth::API_KEY_HEADER})
        }
        (SchemeKind::ApiKey, true) => json!({"apiKeySecurityScheme":
            {"location": "header", "name": crate::auth::API_KEY_HEADER}}),
        (SchemeKind::Bearer { jwt }, false) => {
            let mut s = json!({"type": "http", "scheme": "bearer"});
            if jwt {
                s["bearerFormat"] = json!("JWT");
            }
            s
        }
        (SchemeKind::Bearer { jwt }, true) => {
            let mut s = json!({"scheme": "Bearer"});
            if jwt {
                s["bearerFormat"] = json!("JWT");
            }
            json!({ "httpAuthSecurityScheme": s })
        }
        (SchemeKind::MutualTls, false) => json!({"type": "mutualTLS"}),
        (SchemeKind::MutualTls, true) => json!({"mtlsSecurityScheme": {}}),
    }
}

fn apply_security(obj: &mut Map<String, Value>, sec: &Security) {
    if sec.schemes.is_empty() {
        return;
    }
    let schemes: Map<String, Value> = sec
        .schemes
        .iter()
        .map(|k| (k.name().to_string(), scheme_json(*k, sec.v10)))
        .collect();
    obj.insert("securitySchemes".into(), Value::Object(schemes));
    if !sec.required {
        return;
    }
    // Alternatives: any one scheme will do.
    let requirements: Vec<Value> = sec
        .schemes
        .iter()
        .map(|k| {
            if sec.v10 {
                json!({"schemes": { k.name(): {"list": []} }})
            } else {
                json!({ k.name(): [] })
            }
        })
        .collect();
    let key = if sec.v10 {
        "securityRequirements"
    } else {
        "security"
    };
    obj.insert(key.into(), Value::Array(requirements));
}

/// The card of one agent; `base` is the gateway's public base URL without trailing slash.
pub(crate) fn agent_card(agent: &Agent, base: &str, sec: &Security, offers: Offers<'_>) -> Value {
    let url = format!("{base}{}", agent_path(&agent.def.name));
    let mut card = match agent.remote().and_then(|r| r.card()) {
        Some(remote) => upstream_card(&agent.def, &remote, &url, offers),
        None => local_card(&agent.def, &url, offers),
    };
    if let Some(obj) = card.as_object_mut() {
        apply_security(obj, sec);
        // Only a caller that can authenticate can get it: no scheme, no extended card.
        if has_extended(agent) && !sec.schemes.is_empty() {
            offer_extended(obj);
        }
    }
    card
}

/// Whether `agent` has an extended card: its file's `[extended]`, or its upstream's.
pub(crate) fn has_extended(agent: &Agent) -> bool {
    agent.def.extended.is_some() || agent.remote().is_some_and(|r| r.extended_card().is_some())
}

/// The answer to a caller asking for an extended card an agent does not have: 1.0 says the
/// operation is unsupported (the card's flag is off); 0.3 has only "not configured".
pub(crate) fn no_extended_card(dialect: crate::protocol::Dialect) -> crate::error::GatewayError {
    use crate::error::GatewayError;
    match dialect {
        crate::protocol::Dialect::V10 => GatewayError::UnsupportedOperation(
            "this agent does not offer an extended agent card".into(),
        ),
        _ => GatewayError::ExtendedCardNotConfigured,
    }
}

/// Says so in both generations' spellings.
fn offer_extended(obj: &mut Map<String, Value>) {
    if let Some(caps) = obj.get_mut("capabilities").and_then(Value::as_object_mut) {
        caps.insert("extendedAgentCard".into(), json!(true));
    }
    obj.insert("supportsAuthenticatedExtendedCard".into(), json!(true));
}

/// The extended card of `agent`, if it has one: its upstream's extended card rewritten as
/// the public one is (or the public card), with the file's `[extended]` applied: its
/// description in place of the public one, its skills after the public ones.
pub(crate) fn extended_agent_card(
    agent: &Agent,
    base: &str,
    sec: &Security,
    offers: Offers<'_>,
) -> Option<Value> {
    if !has_extended(agent) {
        return None;
    }
    let url = format!("{base}{}", agent_path(&agent.def.name));
    let remote = agent.remote();
    let mut card = match remote.and_then(|r| r.extended_card().or_else(|| r.card())) {
        Some(remote) => upstream_card(&agent.def, &remote, &url, offers),
        None => local_card(&agent.def, &url, offers),
    };
    let obj = card.as_object_mut()?;
    if let Some(extended) = &agent.def.extended {
        if let Some(description) = &extended.description {
            obj.insert("description".into(), json!(description));
        }
        let skills = obj.entry("skills").or_insert_with(|| json!([]));
        if let Some(skills) = skills.as_array_mut() {
            skills.extend(extended.skills.iter().map(|s| skill_json(s, s.id.clone())));
        }
    }
    apply_security(obj, sec);
    offer_extended(obj);
    Some(card)
}

fn local_card(def: &AgentDef, url: &str, offers: Offers<'_>) -> Value {
    let mut card = json!({
        "name": def.name,
        "description": def.description,
        "version": def.version.as_deref().unwrap_or(DEFAULT_VERSION),
        "capabilities": capabilities(offers.push),
        "defaultInputModes": modes(&def.default_input_modes),
        "defaultOutputModes": modes(&def.default_output_modes),
        "skills": def.skills.iter().map(|s| skill_json(s, s.id.clone())).collect::<Vec<_>>(),
    });
    if let Some(obj) = card.as_object_mut() {
        point_at_gateway(obj, url, offers, &def.name);
        apply_local_fields(obj, def);
    }
    card
}

/// An upstream agent's card as the gateway serves it: the remote card, overridden by what
/// the agent file says, with every URL pointing at the gateway. The remote's security
/// schemes go (the gateway decides who gets in), and so do signatures, which the rewrite
/// would break anyway.
fn upstream_card(def: &AgentDef, remote: &Value, url: &str, offers: Offers<'_>) -> Value {
    let mut card = remote.clone();
    let Some(obj) = card.as_object_mut() else {
        return local_card(def, url, offers);
    };
    obj.insert("name".into(), json!(def.name));
    if !def.description.is_empty() {
        obj.insert("description".into(), json!(def.description));
    }
    for key in [
        "signatures",
        "securitySchemes",
        "security",
        "securityRequirements",
        "supportsAuthenticatedExtendedCard",
        "additionalInterfaces",
    ] {
        obj.remove(key);
    }
    if let Some(skills) = obj.get_mut("skills").and_then(Value::as_array_mut) {
        for skill in skills.iter_mut().filter_map(Value::as_object_mut) {
            skill.remove("security");
            skill.remove("securityRequirements");
        }
    }
    let caps = obj.entry("capabilities").or_insert_with(|| json!({}));
    if let Some(caps) = caps.as_object_mut() {
        caps.insert("pushNotifications".into(), json!(offers.push));
        caps.remove("extendedAgentCard");
        caps.remove("stateTransitionHistory");
    }
    point_at_gateway(obj, url, offers, &def.name);
    apply_local_fields(obj, def);
    if !def.skills.is_empty() {
        obj.insert(
            "skills".into(),
            json!(def
                .skills
                .iter()
                .map(|s| skill_json(s, s.id.clone()))
                .collect::<Vec<_>>()),
        );
    }
    card
}

/// The interface fields of `agent`'s card, both generations' spellings, at `url`.
fn point_at_gateway(obj: &mut Map<String, Value>, url: &str, offers: Offers<'_>, agent: &str) {
    obj.insert(
        "supportedInterfaces".into(),
        interfaces(url, offers, Some(agent)),
    );
    obj.insert("protocolVersion".into(), json!(V03_PROTOCOL_VERSION));
    obj.insert("url".into(), json!(url));
    obj.insert("preferredTransport".into(), json!("JSONRPC"));
}

/// The file's extensions in `capabilities.extensions`, after the card's own (a file's entry
/// replaces the card's for the same URI).
fn apply_extensions(obj: &mut Map<String, Value>, def: &AgentDef) {
    if def.extensions.is_empty() {
        return;
    }
    let caps = obj.entry("capabilities").or_insert_with(|| json!({}));
    let Some(caps) = caps.as_object_mut() else {
        return;
    };
    let listed = caps.entry("extensions").or_insert_with(|| json!([]));
    if !listed.is_array() {
        *listed = json!([]);
    }
    let Some(listed) = listed.as_array_mut() else {
        return;
    };
    for extension in &def.extensions {
        listed.retain(|e| e["uri"] != extension.uri.as_str());
        let mut entry = Map::new();
        entry.insert("uri".into(), json!(extension.uri));
        if let Some(description) = &extension.description {
            entry.insert("description".into(), json!(description));
        }
        if extension.required {
            entry.insert("required".into(), json!(true));
        }
        if let Some(params) = &extension.params {
            entry.insert("params".into(), Value::Object(params.clone()));
        }
        listed.push(Value::Object(entry));
    }
}

fn apply_local_fields(obj: &mut Map<String, Value>, def: &AgentDef) {
    apply_extensions(obj, def);
    if let Some(v) = &def.version {
        obj.insert("version".into(), json!(v));
    }
    if let Some(m) = &def.default_input_modes {
        obj.insert("defaultInputModes".into(), json!(m));
    }
    if let Some(m) = &def.default_output_modes {
        obj.insert("defaultOutputModes".into(), json!(m));
    }
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

/// An agent's skills as its own card lists them (from the file, else from the remote card).
fn agent_skills(agent: &Agent) -> Vec<Value> {
    if !agent.def.skills.is_empty() {
        return agent
            .def
            .skills
            .iter()
            .map(|s| skill_json(s, s.id.clone()))
            .collect();
    }
    agent
        .remote()
        .and_then(|r| r.card())
        .and_then(|c| c["skills"].as_array().cloned())
        .unwrap_or_default()
}

/// An agent's skills as its extended card lists them.
fn extended_skills(agent: &Agent) -> Vec<Value> {
    let remote = agent.remote().and_then(|r| r.extended_card());
    let mut skills = match remote {
        Some(card) if agent.def.skills.is_empty() => {
            card["skills"].as_array().cloned().unwrap_or_default()
        }
        _ => agent_skills(agent),
    };
    if let Some(extended) = &agent.def.extended {
        skills.extend(extended.skills.iter().map(|s| skill_json(s, s.id.clone())));
    }
    skills
}

fn agent_modes(agent: &Agent, key: &str, local: &Option<Vec<String>>) -> Vec<String> {
    if let Some(m) = local {
        return m.clone();
    }
    agent
        .remote()
        .and_then(|r| r.card())
        .and_then(|c| serde_json::from_value(c[key].clone()).ok())
        .unwrap_or_else(|| vec![DEFAULT_MODE.to_string()])
}

/// The id a skill has in the aggregated card: namespaced by its agent, since two agents may
/// both call a skill "search".
pub(crate) fn namespaced_skill_id(agent: &str, skill: &str) -> String {
    format!("{agent}/{skill}")
}

/// The gateway's own card: its identity, the union of the skills of `agents` (those the
/// caller may call), interfaces at `/a2a`. Its `extended` form (for an authenticated
/// caller) lists each agent's extended skills.
pub(crate) fn gateway_card<'a>(
    config: &GatewayConfig,
    agents: impl Iterator<Item = &'a std::sync::Arc<Agent>>,
    base: &str,
    sec: &Security,
    offers: Offers<'_>,
    extended: bool,
) -> Value {
    let url = format!("{base}/a2a");
    let mut skills = Vec::new();
    let mut input_modes: Vec<String> = Vec::new();
    let mut output_modes: Vec<String> = Vec::new();
    for agent in agents {
        let name = &agent.def.name;
        let listed = match extended {
            true => extended_skills(agent),
            false => agent_skills(agent),
        };
        for mut skill in listed {
            let Some(obj) = skill.as_object_mut() else {
                continue;
            };
            let id = obj.get("id").and_then(Value::as_str).unwrap_or_default();
            let id = namespaced_skill_id(name, id);
            obj.insert("id".into(), json!(id));
            if let Some(tags) = obj.get_mut("tags").and_then(Value::as_array_mut) {
                tags.push(json!(format!("agent:{name}")));
            }
            skills.push(skill);
        }
        for m in agent_modes(agent, "defaultInputModes", &agent.def.default_input_modes) {
            if !input_modes.contains(&m) {
                input_modes.push(m);
            }
        }
        for m in agent_modes(agent, "defaultOutputModes", &agent.def.default_output_modes) {
            if !output_modes.contains(&m) {
                output_modes.push(m);
            }
        }
    }
    let mut card = json!({
        "name": config.name,
        "description": config.description,
        "version": config.version,
        "supportedInterfaces": interfaces(&url, offers, None),
        "protocolVersion": V03_PROTOCOL_VERSION,
        "url": url,
        "preferredTransport": "JSONRPC",
        "capabilities": capabilities(offers.push),
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
        apply_security(obj, sec);
        if !sec.schemes.is_empty() {
            offer_extended(obj);
        }
    }
    card
}

/// The card as it goes out: for a 1.0 caller without the 0.3 fields of the hybrid card
/// (a 1.0 card is its proto's ProtoJSON, which verifiers parse before checking a
/// signature), then signed by `signer`.
pub(crate) fn finish(mut card: Value, v10: bool, signer: &crate::signing::Signer) -> Value {
    if let Some(obj) = card.as_object_mut() {
        if v10 {
            for key in crate::protocol::V03_CARD_MEMBERS {
                obj.remove(key);
            }
        }
        obj.remove("signatures");
    }
    let signature = crate::signing::canonical_card(&card)
        .map_err(|e| e.to_string())
        .and_then(|payload| signer.detached(payload.as_bytes()));
    match signature {
        Ok((protected, signature)) => {
            card["signatures"] = json!([{"protected": protected, "signature": signature}]);
        }
        Err(e) => tracing::error!(error = %e, "a card could not be signed; served unsigned"),
    }
    card
}

/// A strong validator for a rendered card. Deterministic across restarts and replicas
/// (unlike a randomly keyed hasher), so caches stay warm through a rolling deploy.
pub(crate) fn etag(body: &[u8]) -> String {
    // FNV-1a, 64 bit: tiny, fast, and collisions only cost a cache miss.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in body {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{hash:016x}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signed_form_is_jcs_without_signatures_or_empty_members() {
        let card = json!({
            "name": "é", "skills": [], "description": "", "b": {"c": [], "d": null},
            "capabilities": {"streaming": false}, "version": 1.5e30,
            "signatures": [{"protected": "x", "signature": "y"}],
        });
        assert_eq!(
            crate::signing::canonical_card(&card).unwrap(),
            r#"{"capabilities":{"streaming":false},"name":"é","version":1.5e+30}"#
        );
    }

    #[test]
    fn a_finished_card_verifies_and_a_1_0_one_has_no_0_3_members() {
        let signer = crate::signing::Signer::load(None, "g", "k").unwrap();
        let card = json!({"name": "a", "url": "http://x", "protocolVersion": "0.3.0"});
        let signed = finish(card, true, &signer);
        assert!(signed.get("url").is_none() && signed.get("protocolVersion").is_none());
        let sig = &signed["signatures"][0];
        let (protected, signature) = (
            sig["protected"].as_str().unwrap(),
            sig["signature"].as_str().unwrap(),
        );
        let payload = crate::signing::canonical_card(&signed).unwrap();
        let input = format!(
            "{protected}.{}",
            base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, payload)
        );
        let set: jsonwebtoken::jwk::JwkSet = serde_json::from_value(signer.jwks()).unwrap();
        let key = jsonwebtoken::DecodingKey::from_jwk(&set.keys[0]).unwrap();
        let ok = jsonwebtoken::crypto::verify(
            signature,
            input.as_bytes(),
            &key,
            jsonwebtoken::Algorithm::ES256,
        );
        assert!(ok.unwrap());
    }
}

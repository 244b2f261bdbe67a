//! The admin API from the command line (`a2a-gateway admin …`, `a2a-gateway agents export`):
//! each command is one call, its answer printed as JSON, a refusal's message on stderr.

use std::path::Path;

use serde_json::{json, Value};

/// Where the admin API is and who calls it.
pub(crate) struct Target {
    /// The gateway's base URL (`http://127.0.0.1:8080`), or the admin listener's.
    pub(crate) url: String,
    pub(crate) token: String,
}

/// One admin call.
pub(crate) enum Call {
    ListAgents,
    PutAgent {
        name: String,
        file: std::path::PathBuf,
    },
    DeleteAgent(String),
    ListKeys,
    CreateKey {
        description: String,
        agents: Vec<String>,
        tier: Option<String>,
        expires_at: Option<String>,
    },
    RotateKey {
        id: String,
        grace_secs: u64,
    },
    RevokeKey(String),
}

/// Runs `call`; the answer's JSON, or what went wrong.
pub(crate) async fn run(target: &Target, call: Call) -> Result<Value, String> {
    let base = format!("{}{}", target.url.trim_end_matches('/'), super::PREFIX);
    let client = reqwest::Client::new();
    let (method, path, body) = match call {
        Call::ListAgents => (reqwest::Method::GET, "/agents".to_string(), None),
        Call::PutAgent { name, file } => {
            let definition = definition_in(&file)?;
            (
                reqwest::Method::PUT,
                format!("/agents/{name}"),
                Some(definition),
            )
        }
        Call::DeleteAgent(name) => (reqwest::Method::DELETE, format!("/agents/{name}"), None),
        Call::ListKeys => (reqwest::Method::GET, "/keys".into(), None),
        Call::CreateKey {
            description,
            agents,
            tier,
            expires_at,
        } => {
            let mut body = json!({"description": description});
            if !agents.is_empty() {
                body["agents"] = json!(agents);
            }
            if let Some(tier) = tier {
                body["tier"] = json!(tier);
            }
            if let Some(at) = expires_at {
                body["expires_at"] = json!(at);
            }
            (reqwest::Method::POST, "/keys".into(), Some(body))
        }
        Call::RotateKey { id, grace_secs } => (
            reqwest::Method::POST,
            format!("/keys/{id}/rotate"),
            Some(json!({"grace_secs": grace_secs})),
        ),
        Call::RevokeKey(id) => (reqwest::Method::POST, format!("/keys/{id}/revoke"), None),
    };
    let mut request = client
        .request(method, format!("{base}{path}"))
        .bearer_auth(&target.token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("{base}: {}", crate::error::error_chain(&e)))?;
    let status = response.status();
    let text = response.text().await.map_err(|e| e.to_string())?;
    let answer: Value = match text.is_empty() {
        true => json!({"status": status.as_u16()}),
        false => serde_json::from_str(&text).map_err(|_| format!("HTTP {status}: {text}"))?,
    };
    match status.is_success() {
        true => Ok(answer),
        false => Err(format!(
            "HTTP {status}: {}",
            answer["error"]["message"].as_str().unwrap_or(&text)
        )),
    }
}

/// An agent definition from a file: an agent file (TOML), or its keys as JSON.
fn definition_in(file: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    match file.extension().and_then(|e| e.to_str()) {
        Some("json") => serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display())),
        _ => toml::from_str::<toml::Value>(&text)
            .map_err(|e| format!("{}: {e}", file.display()))
            .and_then(|v| serde_json::to_value(v).map_err(|e| e.to_string())),
    }
}

/// `agents export DIR`: every runtime agent written out as an agent file, `DIR/<name>.toml`
/// (a disabled one too, with a comment saying so), to move into Git. The files written.
pub(crate) async fn export(target: &Target, dir: &Path) -> Result<Vec<String>, String> {
    let listed = run(target, Call::ListAgents).await?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    for agent in listed["agents"].as_array().into_iter().flatten() {
        if agent["origin"] != "runtime" {
            continue;
        }
        let name = agent["name"].as_str().unwrap_or_default();
        let mut definition = agent["definition"].clone();
        if let Value::Object(map) = &mut definition {
            map.insert("name".into(), json!(name));
        }
        let body = toml::to_string(&definition).map_err(|e| format!("{name}: {e}"))?;
        let mut text = format!(
            "# Exported from the admin API (made by {}, last changed by {} at {}).\n",
            agent["created_by"].as_str().unwrap_or("?"),
            agent["updated_by"].as_str().unwrap_or("?"),
            agent["updated_at"].as_str().unwrap_or("?"),
        );
        if agent["enabled"] == false {
            text.push_str("# Disabled in the admin API when exported.\n");
        }
        text.push_str(&body);
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path.display().to_string());
    }
    Ok(written)
}

//! Agents made at runtime through the admin API: what the store keeps of one, and the
//! checks it takes beyond an agent file's.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::agents_d::{agent_from_json, FieldError};
use super::AgentDef;

/// A runtime agent as the store keeps it: its definition (an agent file's keys, as JSON),
/// whether it serves, and who made and last changed it when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentRecord {
    /// The agent file's keys (see `a2a-gateway schema agent`), as JSON.
    pub definition: serde_json::Value,
    /// A disabled agent is kept but not served.
    pub enabled: bool,
    pub created_at: String,
    pub created_by: String,
    pub updated_at: String,
    pub updated_by: String,
}

impl AgentRecord {
    /// The agent it defines, named `name`, checked as an agent file is (`dir`: where its
    /// relative paths start) and, unless the host is open to them, against naming the
    /// gateway host's programs, files and environment.
    pub fn agent(
        &self,
        name: &str,
        dir: &Path,
        allow_host_access: bool,
    ) -> Result<AgentDef, Vec<FieldError>> {
        definition_to_agent(name, &self.definition, dir, allow_host_access)
    }
}

/// [`AgentRecord::agent`] for a definition alone.
pub fn definition_to_agent(
    name: &str,
    definition: &serde_json::Value,
    dir: &Path,
    allow_host_access: bool,
) -> Result<AgentDef, Vec<FieldError>> {
    if !allow_host_access {
        let mut found = Vec::new();
        host_references(definition, String::new(), &mut found);
        if !found.is_empty() {
            return Err(found);
        }
    }
    let mut agent = agent_from_json(name, definition, dir)?;
    agent.runtime = true;
    Ok(agent)
}

/// What in a definition would reach the gateway's host: a program to run, a file to read,
/// an environment variable to send on.
fn host_references(value: &serde_json::Value, at: String, out: &mut Vec<FieldError>) {
    const WHY: &str = "runtime agents may not name the gateway host's programs, files or environment ([admin] allow_host_access = true lets them)";
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                let path = if at.is_empty() {
                    key.clone()
                } else {
                    format!("{at}.{key}")
                };
                let names_host = key.ends_with("_file")
                    || key.ends_with("_env")
                    || key == "cwd"
                    || (key == "kind" && v.as_str() == Some("command"));
                if names_host {
                    out.push(FieldError {
                        field: path.clone(),
                        message: format!("{key} = {v}: {WHY}"),
                    });
                    continue;
                }
                host_references(v, path, out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                host_references(v, format!("{at}[{i}]"), out);
            }
        }
        serde_json::Value::String(s) if s.contains("${") => out.push(FieldError {
            field: at,
            message: format!("{s:?} reads an environment variable: {WHY}"),
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dir() -> std::path::PathBuf {
        std::env::temp_dir()
    }

    #[test]
    fn a_definition_is_checked_as_a_file_and_errors_name_their_field() {
        let ok = definition_to_agent(
            "echo2",
            &json!({"description": "d", "backend": {"kind": "echo"}}),
            &dir(),
            false,
        )
        .unwrap();
        assert!(ok.runtime && ok.name == "echo2");
        let fields = |def: serde_json::Value| -> Vec<(String, String)> {
            definition_to_agent("x", &def, &dir(), false)
                .unwrap_err()
                .into_iter()
                .map(|e| (e.field, e.message))
                .collect()
        };
        let e = fields(json!({"description": "d", "backend": {"kind": "echo"}, "colour": 1}));
        assert_eq!(e[0].0, "colour", "{e:?}");
        let e = fields(json!({"description": "d", "backend": {"kind": "teleport"}}));
        assert_eq!(e[0].0, "backend.kind", "{e:?}");
        assert!(e[0].1.contains("unknown variant"), "{e:?}");
        let e = fields(json!({"description": "d", "backend": {"kind": "echo"},
            "skills": [{"id": "a", "name": "A", "description": "x"}, {"id": "a", "name": "B", "description": "y"}]}));
        assert!(e[0].0.starts_with("skills[1]"), "{e:?}");
        let e = fields(json!({"name": "y", "description": "d", "backend": {"kind": "echo"}}));
        assert_eq!(e[0].0, "name", "{e:?}");
        let e = fields(json!({"description": null, "backend": {"kind": "echo"}}));
        assert_eq!(e[0].0, "description", "{e:?}");
        // The host stays closed unless opened.
        let e =
            fields(json!({"description": "d", "backend": {"kind": "command", "command": ["sh"]}}));
        assert_eq!(e[0].0, "backend.kind", "{e:?}");
        let e = fields(
            json!({"backend": {"kind": "a2a", "url": "http://x", "headers": {"A": "${HOME}"}}}),
        );
        assert_eq!(e[0].0, "backend.headers.A", "{e:?}");
        let e = fields(
            json!({"description": "d", "backend": {"kind": "openai", "base_url": "http://x", "model": "m", "api_key_env": "HOME"}}),
        );
        assert_eq!(e[0].0, "backend.api_key_env", "{e:?}");
    }
}

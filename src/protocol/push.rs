//! Push notification configs in every dialect: 1.0's flat `TaskPushNotificationConfig`,
//! 0.3's `{taskId, pushNotificationConfig}` and 0.1's `{id, pushNotificationConfig}`,
//! read leniently into one [`PushConfig`] and written back in the caller's shape.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::Dialect;
use crate::error::GatewayError;

/// The four operations on a task's configs (0.1 has the first two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOp {
    Set,
    Get,
    List,
    Delete,
}

/// A config as the gateway keeps it, whichever dialect made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushConfig {
    pub id: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// 1.0 names one scheme, 0.3 a list; the first is the one used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schemes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
    /// The dialect of the call that made it, which its notifications are written in.
    pub dialect: Dialect,
    /// What a 0.1 caller, who names its tasks, calls the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The fields of a config, wherever a dialect puts them.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Fields {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    authentication: Option<AuthFields>,
}

#[derive(Debug, Default, Deserialize)]
struct AuthFields {
    #[serde(default)]
    scheme: Option<String>,
    #[serde(default)]
    schemes: Vec<String>,
    #[serde(default)]
    credentials: Option<String>,
}

/// Everything a push call's params may hold, in any dialect.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Params {
    #[serde(default, alias = "task_id")]
    task_id: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default, alias = "push_notification_config_id")]
    push_notification_config_id: Option<String>,
    #[serde(default, alias = "push_notification_config")]
    push_notification_config: Option<Value>,
    #[serde(default, alias = "page_size")]
    page_size: Option<i64>,
    #[serde(default, alias = "page_token")]
    page_token: Option<String>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

/// A push call, read: which task, which config, and for a set the config.
#[derive(Debug)]
pub struct PushCall {
    pub task_id: String,
    pub config_id: Option<String>,
    pub config: Option<PushConfig>,
    pub page_size: usize,
    pub page_token: usize,
}

const MAX_CONFIG_FIELD: usize = 4096;

/// Reads a push call's params in `dialect`.
pub fn read_call(
    op: PushOp,
    dialect: Dialect,
    raw: Option<&RawValue>,
) -> Result<PushCall, GatewayError> {
    let p: Params = super::params::decode(raw)?;
    let missing = |name: &str| GatewayError::InvalidParams(format!("params.{name}: required"));
    // 1.0 names the task `taskId` and the config `id`; 0.3 and 0.1 name the task `id`
    // (0.3's set: `taskId`) and the config `pushNotificationConfigId`.
    let (task_id, config_id) = match dialect {
        Dialect::V10 => (p.task_id.clone(), p.id.clone()),
        Dialect::V03 | Dialect::V01 => (
            p.task_id.clone().or(p.id.clone()),
            p.push_notification_config_id.clone(),
        ),
    };
    let task_id = task_id.filter(|t| !t.is_empty()).ok_or_else(|| {
        missing(if dialect == Dialect::V10 {
            "taskId"
        } else {
            "id"
        })
    })?;
    let page_size = match p.page_size {
        None | Some(0) => 100,
        Some(n) if (1..=100).contains(&n) => n as usize,
        Some(n) => {
            return Err(GatewayError::InvalidParams(format!(
                "params.pageSize: must be between 1 and 100, got {n}"
            )))
        }
    };
    let page_token = match p.page_token.as_deref() {
        None | Some("") => 0,
        Some(t) => t.parse().map_err(|_| {
            GatewayError::InvalidParams("params.pageToken: not a token this gateway issued".into())
        })?,
    };
    let config = match op {
        PushOp::Set => {
            let fields = match (&p.push_notification_config, dialect) {
                (Some(nested), _) => fields_of(nested, "params.pushNotificationConfig")?,
                (None, Dialect::V10) => fields_of(&Value::Object(flat(&p)), "params")?,
                (None, _) => return Err(missing("pushNotificationConfig")),
            };
            // 1.0's `id` at the top is the config's own.
            let id = fields.id.clone().or(match dialect {
                Dialect::V10 => p.id.clone(),
                _ => None,
            });
            let mut config = config_of(Fields { id, ..fields }, dialect, "params")?;
            if config.id.is_empty() {
                config.id.clone_from(&task_id);
            }
            Some(config)
        }
        _ => None,
    };
    Ok(PushCall {
        task_id,
        config_id: config_id.filter(|c| !c.is_empty()),
        config,
        page_size,
        page_token,
    })
}

/// 1.0's flat params, as the config fields they hold.
fn flat(p: &Params) -> Map<String, Value> {
    let mut m = p.rest.clone();
    if let Some(id) = &p.id {
        m.insert("id".into(), json!(id));
    }
    m
}

fn fields_of(value: &Value, at: &str) -> Result<Fields, GatewayError> {
    serde_json::from_value(value.clone())
        .map_err(|e| GatewayError::InvalidParams(format!("{at}: {e}")))
}

/// A config given inline in a send (`configuration.pushNotificationConfig` or
/// `taskPushNotificationConfig`), in the send's dialect.
pub fn read_inline(value: &Value, dialect: Dialect) -> Result<PushConfig, GatewayError> {
    let at = "params.configuration.pushNotificationConfig";
    let fields = match value.get("pushNotificationConfig") {
        Some(nested) => fields_of(nested, at)?,
        None => fields_of(value, at)?,
    };
    config_of(fields, dialect, at)
}

fn config_of(f: Fields, dialect: Dialect, at: &str) -> Result<PushConfig, GatewayError> {
    let bad = |field: &str, why: &str| GatewayError::InvalidParams(format!("{at}.{field}: {why}"));
    let url = f
        .url
        .filter(|u| !u.trim().is_empty())
        .ok_or_else(|| bad("url", "required"))?;
    if url.len() > MAX_CONFIG_FIELD {
        return Err(bad("url", "too long"));
    }
    // The token and credentials go into header values.
    let header_safe = |v: &str| {
        v.len() <= MAX_CONFIG_FIELD && v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    };
    if let Some(t) = &f.token {
        if !header_safe(t) {
            return Err(bad("token", "must be printable ASCII, at most 4096 bytes"));
        }
    }
    let id = match f.id {
        Some(id) if id.is_empty() || id.len() > 256 => {
            return Err(bad("id", "must be 1 to 256 characters"))
        }
        Some(id) => id,
        None if dialect == Dialect::V10 => uuid::Uuid::new_v4().to_string(),
        // 0.1 has one config per task, and 0.3's SDKs name an unnamed one after its task:
        // setting another replaces it. Empty here: the caller fills in the task's id.
        None => String::new(),
    };
    let (schemes, credentials) = match f.authentication {
        None => (Vec::new(), None),
        Some(a) => {
            let schemes: Vec<String> = a.scheme.into_iter().chain(a.schemes).collect();
            let token_char = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            if schemes.is_empty() {
                return Err(bad("authentication", "names no scheme"));
            }
            if let Some(s) = schemes
                .iter()
                .find(|s| s.is_empty() || !s.bytes().all(token_char))
            {
                return Err(bad(
                    "authentication.scheme",
                    &format!("\"{s}\" is not an HTTP authentication scheme"),
                ));
            }
            if let Some(c) = &a.credentials {
                if !header_safe(c) {
                    return Err(bad(
                        "authentication.credentials",
                        "must be printable ASCII, at most 4096 bytes",
                    ));
                }
            }
            (schemes, a.credentials)
        }
    };
    Ok(PushConfig {
        id,
        url,
        token: f.token,
        schemes,
        credentials,
        dialect,
        name: None,
    })
}

impl PushConfig {
    /// The config in `dialect`'s shape, for the task the caller calls `task_id`.
    pub fn render(&self, dialect: Dialect, task_id: &str) -> Value {
        let mut inner = Map::new();
        match dialect {
            Dialect::V10 => {
                inner.insert("taskId".into(), json!(task_id));
                inner.insert("id".into(), json!(self.id));
            }
            Dialect::V03 => {
                inner.insert("id".into(), json!(self.id));
            }
            Dialect::V01 => {}
        }
        inner.insert("url".into(), json!(self.url));
        if let Some(t) = &self.token {
            inner.insert("token".into(), json!(t));
        }
        if let Some(first) = self.schemes.first() {
            let mut auth = Map::new();
            match dialect {
                Dialect::V10 => auth.insert("scheme".into(), json!(first)),
                Dialect::V03 | Dialect::V01 => auth.insert("schemes".into(), json!(self.schemes)),
            };
            if let Some(c) = &self.credentials {
                auth.insert("credentials".into(), json!(c));
            }
            inner.insert("authentication".into(), Value::Object(auth));
        }
        match dialect {
            Dialect::V10 => Value::Object(inner),
            Dialect::V03 => json!({"taskId": task_id, "pushNotificationConfig": inner}),
            Dialect::V01 => json!({"id": task_id, "pushNotificationConfig": inner}),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: Value) -> Box<RawValue> {
        RawValue::from_string(v.to_string()).unwrap()
    }

    #[test]
    fn each_dialect_names_the_task_and_config_its_own_way() {
        let c = read_call(
            PushOp::Set,
            Dialect::V10,
            Some(&raw(json!({"taskId": "t", "id": "c", "url": "https://h/", "authentication": {"scheme": "Bearer"}}))),
        )
        .unwrap();
        assert_eq!(
            (c.task_id.as_str(), c.config.as_ref().unwrap().id.as_str()),
            ("t", "c")
        );
        assert_eq!(c.config.unwrap().schemes, ["Bearer"]);
        let c = read_call(
            PushOp::Set,
            Dialect::V03,
            Some(&raw(json!({"taskId": "t", "pushNotificationConfig": {"url": "https://h/", "token": "x"}}))),
        )
        .unwrap();
        assert_eq!(c.task_id, "t");
        assert_eq!(c.config.unwrap().token.as_deref(), Some("x"));
        let c = read_call(
            PushOp::Get,
            Dialect::V03,
            Some(&raw(json!({"id": "t", "pushNotificationConfigId": "c"}))),
        )
        .unwrap();
        assert_eq!(
            (c.task_id.as_str(), c.config_id.as_deref()),
            ("t", Some("c"))
        );
        let c = read_call(
            PushOp::Get,
            Dialect::V10,
            Some(&raw(json!({"taskId": "t", "id": "c"}))),
        )
        .unwrap();
        assert_eq!(
            (c.task_id.as_str(), c.config_id.as_deref()),
            ("t", Some("c"))
        );
    }

    #[test]
    fn bad_configs_are_named() {
        for (params, what) in [
            (json!({"taskId": "t"}), "params.url"),
            (
                json!({"taskId": "t", "url": "https://h/", "token": "a\nb"}),
                "token",
            ),
            (
                json!({"taskId": "t", "url": "https://h/", "authentication": {}}),
                "authentication",
            ),
            (
                json!({"taskId": "t", "url": "https://h/", "authentication": {"scheme": "Bad Scheme"}}),
                "scheme",
            ),
            (json!({"url": "https://h/"}), "taskId"),
        ] {
            let e = read_call(PushOp::Set, Dialect::V10, Some(&raw(params))).unwrap_err();
            assert!(e.to_string().contains(what), "{e}");
        }
        let e = read_call(
            PushOp::List,
            Dialect::V10,
            Some(&raw(json!({"taskId": "t", "pageSize": 500}))),
        )
        .unwrap_err();
        assert!(e.to_string().contains("pageSize"), "{e}");
    }

    #[test]
    fn configs_render_in_each_shape() {
        let c = PushConfig {
            id: "c".into(),
            url: "https://h/".into(),
            token: Some("tok".into()),
            schemes: vec!["Bearer".into()],
            credentials: None,
            dialect: Dialect::V10,
            name: None,
        };
        assert_eq!(
            c.render(Dialect::V10, "t"),
            json!({"taskId": "t", "id": "c", "url": "https://h/", "token": "tok", "authentication": {"scheme": "Bearer"}})
        );
        assert_eq!(
            c.render(Dialect::V03, "t"),
            json!({"taskId": "t", "pushNotificationConfig": {"id": "c", "url": "https://h/", "token": "tok", "authentication": {"schemes": ["Bearer"]}}})
        );
        assert_eq!(
            c.render(Dialect::V01, "mine"),
            json!({"id": "mine", "pushNotificationConfig": {"url": "https://h/", "token": "tok", "authentication": {"schemes": ["Bearer"]}}})
        );
    }
}

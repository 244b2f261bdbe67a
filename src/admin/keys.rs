//! `/admin/v1/keys`: keys for callers issued, listed, rotated and revoked at runtime. A
//! runtime key works as a file's API key does everywhere (JSON-RPC, HTTP+JSON, gRPC
//! metadata, MCP; policies see `caller.id` `key:<id>`; its tier is a rate-limit tier), as
//! `X-API-Key` or as `Authorization: Bearer`. Its secret is shown once, at issue or
//! rotation; only its digest is kept.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{answer, json_body, Door};
use crate::auth::{KeyRecord, PreviousSecret};
use crate::error::GatewayError;
use crate::store::control::{digest_of, Entry, Expect, Kind, Written};

/// A key to issue.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct KeyCreate {
    /// What it is for (shown in lists and the console).
    #[serde(default)]
    pub(crate) description: String,
    /// The agents it may call (each must exist); `["*"]` (the default): all.
    #[serde(default = "all")]
    pub(crate) agents: Vec<String>,
    /// Its rate-limit tier (`[rate_limits.tiers]`); unset: `default`.
    #[serde(default)]
    pub(crate) tier: Option<String>,
    /// When it stops working (RFC 3339, in the future); unset: never.
    #[serde(default)]
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// Anything the team wants to keep with it (an owner, a ticket).
    #[serde(default)]
    pub(crate) metadata: serde_json::Map<String, serde_json::Value>,
}

fn all() -> Vec<String> {
    vec!["*".into()]
}

/// A rotation: how long the old secret keeps working.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct KeyRotate {
    /// Seconds the old secret keeps working beside the new one (0, the default: none; at
    /// most 30 days).
    #[serde(default)]
    pub(crate) grace_secs: u64,
}

/// The longest grace a rotation may give the old secret.
const MAX_GRACE_SECS: u64 = 30 * 24 * 3600;

/// Where a key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum KeyState {
    Active,
    Expired,
    Revoked,
}

/// A runtime key, never its secret.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(crate) struct KeyView {
    pub(crate) id: String,
    /// What callers using it are in policies and the logs: `key:<id>`.
    pub(crate) caller_id: String,
    pub(crate) description: String,
    pub(crate) agents: Vec<String>,
    pub(crate) tier: String,
    pub(crate) state: KeyState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) expires_at: Option<DateTime<Utc>>,
    pub(crate) metadata: serde_json::Map<String, serde_json::Value>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) created_by: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rotated_at: Option<DateTime<Utc>>,
    /// Until when the secret it had before its last rotation still works.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) previous_secret_until: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) revoked_at: Option<DateTime<Utc>>,
    /// When a call last used it, on any replica (written every 10 s or so).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_used_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(crate) struct KeyList {
    pub(crate) keys: Vec<KeyView>,
}

/// A key with its secret: the one answer that carries it.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(crate) struct KeyIssued {
    pub(crate) key: KeyView,
    /// The secret, as `X-API-Key: <secret>` or `Authorization: Bearer <secret>`: shown
    /// this once, kept nowhere.
    pub(crate) secret: String,
}

fn view(record: &KeyRecord, last_used_ms: Option<i64>) -> KeyView {
    let now = Utc::now();
    let state = match (record.revoked_at, record.expires_at) {
        (Some(_), _) => KeyState::Revoked,
        (None, Some(at)) if at <= now => KeyState::Expired,
        _ => KeyState::Active,
    };
    KeyView {
        id: record.id.clone(),
        caller_id: format!("key:{}", record.id),
        description: record.description.clone(),
        agents: record.agents.clone(),
        tier: (record.tier.clone()).unwrap_or_else(|| crate::auth::DEFAULT_TIER.into()),
        state,
        expires_at: record.expires_at,
        metadata: record.metadata.clone(),
        created_at: record.created_at,
        created_by: record.created_by.clone(),
        rotated_at: record.rotated_at,
        previous_secret_until: (record.previous.as_ref())
            .map(|p| p.until)
            .filter(|u| *u > now),
        revoked_at: record.revoked_at,
        last_used_at: last_used_ms.and_then(DateTime::from_timestamp_millis),
    }
}

fn record_of(entry: &Entry) -> Result<KeyRecord, GatewayError> {
    serde_json::from_str(&entry.value)
        .map_err(|e| GatewayError::Internal(format!("a stored key: {e}")))
}

fn id_of(req: &HttpRequest) -> String {
    req.match_info().get("id").unwrap_or_default().to_string()
}

impl Door {
    /// When each key was last used: the store's (every replica's, as last written) or
    /// this replica's own, whichever is later.
    async fn last_used(&self) -> std::collections::HashMap<String, i64> {
        let control = &self.state.store.control;
        let mut used = control.used_all().await.unwrap_or_default();
        for (id, at) in self.state.keys.ring.load().used_since(0) {
            let kept = used.entry(id).or_insert(at);
            *kept = (*kept).max(at);
        }
        used
    }

    async fn key(&self, id: &str) -> Result<Entry, GatewayError> {
        let control = &self.state.store.control;
        control
            .get(Kind::Key, id)
            .await
            .map_err(GatewayError::StoreUnavailable)?
            .ok_or_else(|| GatewayError::AdminNotFound(format!("no runtime key \"{id}\"")))
    }

    /// Writes `record` over `before`, audits it as `action`, waits until it is in force.
    async fn write_key(
        &self,
        record: &KeyRecord,
        before: Option<&Entry>,
        action: &str,
    ) -> Result<(), GatewayError> {
        let value =
            serde_json::to_string(record).map_err(|e| GatewayError::Internal(e.to_string()))?;
        let expect = before.map_or(Expect::Absent, |e| Expect::Version(e.version));
        let control = &self.state.store.control;
        let written = control
            .put(Kind::Key, &record.id, Some(value.clone()), expect)
            .await
            .map_err(GatewayError::StoreUnavailable)?;
        if let Written::Conflict(_) = written {
            return Err(GatewayError::AdminConflict(format!(
                "key \"{}\" changed meanwhile: read it again and retry",
                record.id
            )));
        }
        let mut entry = self.audit(action, format!("key:{}", record.id));
        entry.before = before.map(|e| digest_of(&e.value));
        entry.after = Some(digest_of(&value));
        self.changed(entry).await
    }

    /// The problems of a key to issue: agents that do not exist, a tier not defined, an
    /// expiry in the past.
    async fn check_key(&self, create: &KeyCreate) -> Result<(), GatewayError> {
        let mut problems = Vec::new();
        let control = &self.state.store.control;
        let runtime = (control.list(Kind::Agent).await).map_err(GatewayError::StoreUnavailable)?;
        for (i, agent) in create.agents.iter().enumerate() {
            let known = agent == "*"
                || self.live.registry.get(agent).is_some()
                || runtime.iter().any(|e| e.name == *agent);
            if !known {
                problems.push((
                    format!("agents[{i}]"),
                    format!("no agent \"{agent}\" (an agent of a file, a runtime one, or \"*\")"),
                ));
            }
        }
        if create.agents.is_empty() {
            problems.push(("agents".into(), "name at least one agent, or \"*\"".into()));
        }
        if let Some(tier) = &create.tier {
            let tiers = &self.live.config.rate_limits.tiers;
            if tier != crate::auth::DEFAULT_TIER && !tiers.contains_key(tier) {
                let mut defined: Vec<&str> = tiers.keys().map(String::as_str).collect();
                defined.push(crate::auth::DEFAULT_TIER);
                problems.push((
                    "tier".into(),
                    format!(
                        "no tier \"{tier}\" in [rate_limits.tiers] (defined: {})",
                        defined.join(", ")
                    ),
                ));
            }
        }
        if create.expires_at.is_some_and(|at| at <= Utc::now()) {
            problems.push(("expires_at".into(), "must be in the future".into()));
        }
        match problems.is_empty() {
            true => Ok(()),
            false => Err(GatewayError::AdminInvalid(problems)),
        }
    }
}

pub(super) async fn create(req: HttpRequest, body: web::Payload) -> HttpResponse {
    let r = req.clone();
    answer(&req, |door| async move {
        let create: KeyCreate = json_body(&r, &door.state, body).await?;
        door.check_key(&create).await?;
        let (secret, digest) = crate::auth::new_secret();
        let id = format!("k{}", &uuid::Uuid::new_v4().simple().to_string()[..15]);
        let record = KeyRecord {
            id,
            description: create.description,
            agents: create.agents,
            tier: create.tier,
            expires_at: create.expires_at,
            metadata: create.metadata,
            created_at: Utc::now(),
            created_by: door.actor.to_string(),
            digest,
            previous: None,
            rotated_at: None,
            revoked_at: None,
        };
        door.write_key(&record, None, "key.create").await?;
        let key = view(&record, None);
        Ok((StatusCode::CREATED, KeyIssued { key, secret }))
    })
    .await
}

pub(super) async fn list(req: HttpRequest) -> HttpResponse {
    answer(&req, |door| async move {
        let control = &door.state.store.control;
        let entries = (control.list(Kind::Key).await).map_err(GatewayError::StoreUnavailable)?;
        let used = door.last_used().await;
        let mut keys = Vec::new();
        for e in &entries {
            let record = record_of(e)?;
            keys.push(view(&record, used.get(&record.id).copied()));
        }
        keys.sort_by_key(|k| std::cmp::Reverse(k.created_at));
        Ok((StatusCode::OK, KeyList { keys }))
    })
    .await
}

pub(super) async fn get(req: HttpRequest) -> HttpResponse {
    let id = id_of(&req);
    answer(&req, |door| async move {
        let record = record_of(&door.key(&id).await?)?;
        let used = door.last_used().await;
        Ok((StatusCode::OK, view(&record, used.get(&id).copied())))
    })
    .await
}

pub(super) async fn rotate(req: HttpRequest, body: web::Payload) -> HttpResponse {
    let id = id_of(&req);
    let r = req.clone();
    answer(&req, |door| async move {
        let rotate: KeyRotate = json_body(&r, &door.state, body).await?;
        if rotate.grace_secs > MAX_GRACE_SECS {
            return Err(GatewayError::AdminInvalid(vec![(
                "grace_secs".into(),
                format!("at most {MAX_GRACE_SECS} (30 days)"),
            )]));
        }
        let entry = door.key(&id).await?;
        let mut record = record_of(&entry)?;
        if record.revoked_at.is_some() {
            return Err(GatewayError::AdminConflict(format!(
                "key \"{id}\" is revoked: issue a new one"
            )));
        }
        let (secret, digest) = crate::auth::new_secret();
        let now = Utc::now();
        record.previous = (rotate.grace_secs > 0).then(|| PreviousSecret {
            digest: std::mem::take(&mut record.digest),
            until: now + chrono::TimeDelta::seconds(rotate.grace_secs as i64),
        });
        record.digest = digest;
        record.rotated_at = Some(now);
        door.write_key(&record, Some(&entry), "key.rotate").await?;
        let used = door.last_used().await;
        let key = view(&record, used.get(&id).copied());
        Ok((StatusCode::OK, KeyIssued { key, secret }))
    })
    .await
}

pub(super) async fn revoke(req: HttpRequest) -> HttpResponse {
    let id = id_of(&req);
    answer(&req, |door| async move {
        let entry = door.key(&id).await?;
        let mut record = record_of(&entry)?;
        if record.revoked_at.is_some() {
            return Err(GatewayError::AdminConflict(format!(
                "key \"{id}\" is revoked already"
            )));
        }
        record.revoked_at = Some(Utc::now());
        record.previous = None;
        door.write_key(&record, Some(&entry), "key.revoke").await?;
        let used = door.last_used().await;
        Ok((StatusCode::OK, view(&record, used.get(&id).copied())))
    })
    .await
}

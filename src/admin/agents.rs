//! `/admin/v1/agents`: every agent, and the runtime ones created, replaced, deleted,
//! enabled and disabled.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;

use super::{answer, json_body, now, Door};
use crate::config::AgentRecord;
use crate::error::GatewayError;
use crate::store::control::{digest_of, Entry, Expect, Kind, Written};

/// Where an agent comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Origin {
    /// A file of `agents.d/`: changed in the file, read-only here.
    File,
    /// Made through this API and kept in the store.
    Runtime,
}

/// One agent.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(crate) struct AgentView {
    pub(crate) name: String,
    pub(crate) origin: Origin,
    /// The file that defines it (file agents).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) file: Option<String>,
    /// Whether it is to be served (file agents always are).
    pub(crate) enabled: bool,
    /// Whether this replica serves it now.
    pub(crate) serving: bool,
    /// The runtime entry's version: what `If-Match` names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<u64>,
    /// A runtime agent's definition: the agent file's keys, as JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) definition: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) created_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) created_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) updated_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) updated_by: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(crate) struct AgentList {
    pub(crate) agents: Vec<AgentView>,
}

impl Door {
    /// Whether this replica serves a runtime agent of this name now.
    fn serving(&self, name: &str) -> bool {
        self.state
            .live()
            .registry
            .get(name)
            .is_some_and(|a| a.def.runtime)
    }

    /// The file that defines agent `name`, if one does.
    fn file_of(&self, name: &str) -> Option<String> {
        let agent = self.live.registry.get(name)?;
        (!agent.def.runtime).then(|| agent.def.source.display().to_string())
    }

    fn runtime_view(&self, entry: &Entry) -> Result<AgentView, GatewayError> {
        let record: AgentRecord = serde_json::from_str(&entry.value)
            .map_err(|e| GatewayError::Internal(format!("a stored agent: {e}")))?;
        Ok(AgentView {
            name: entry.name.clone(),
            origin: Origin::Runtime,
            file: None,
            enabled: record.enabled,
            serving: self.serving(&entry.name),
            version: Some(entry.version),
            definition: Some(record.definition),
            created_at: Some(record.created_at),
            created_by: Some(record.created_by),
            updated_at: Some(record.updated_at),
            updated_by: Some(record.updated_by),
        })
    }

    fn file_view(&self, name: &str, file: String) -> AgentView {
        AgentView {
            name: name.to_string(),
            origin: Origin::File,
            file: Some(file),
            enabled: true,
            serving: true,
            version: None,
            definition: None,
            created_at: None,
            created_by: None,
            updated_at: None,
            updated_by: None,
        }
    }

    async fn stored(&self, name: &str) -> Result<Option<Entry>, GatewayError> {
        let control = &self.state.store.control;
        control
            .get(Kind::Agent, name)
            .await
            .map_err(GatewayError::StoreUnavailable)
    }

    /// A runtime agent that must exist (404), and be no file's (409).
    async fn runtime(&self, name: &str) -> Result<Entry, GatewayError> {
        if let Some(file) = self.file_of(name) {
            return Err(read_only(name, &file));
        }
        self.stored(name)
            .await?
            .ok_or_else(|| GatewayError::AdminNotFound(format!("no runtime agent \"{name}\"")))
    }

    /// Writes `record` for agent `name` over `expect`, audits the change and waits for it
    /// to be in force; the agent as it now is.
    async fn write(
        &self,
        name: &str,
        before: Option<&Entry>,
        record: &AgentRecord,
        action: &str,
    ) -> Result<AgentView, GatewayError> {
        let value =
            serde_json::to_string(record).map_err(|e| GatewayError::Internal(e.to_string()))?;
        let expect = before.map_or(Expect::Absent, |e| Expect::Version(e.version));
        let control = &self.state.store.control;
        let written = control
            .put(Kind::Agent, name, Some(value.clone()), expect)
            .await
            .map_err(GatewayError::StoreUnavailable)?;
        let version = match written {
            Written::Done(v) => v,
            Written::Conflict(found) if before.is_none() => return Err(taken(name, found)),
            Written::Conflict(found) => return Err(conflict(name, found)),
        };
        let mut entry = self.audit(action, format!("agent:{name}"));
        entry.before = before.map(|e| digest_of(&e.value));
        entry.after = Some(digest_of(&value));
        self.changed(entry).await?;
        self.runtime_view(&Entry {
            name: name.to_string(),
            version,
            value,
        })
    }
}

fn read_only(name: &str, file: &str) -> GatewayError {
    GatewayError::AdminConflict(format!(
        "agent \"{name}\" is defined by the file {file}: change it there (agents of files are read-only here)"
    ))
}

/// A name created meanwhile (through another replica, say).
fn taken(name: &str, found: Option<u64>) -> GatewayError {
    let at = found.map_or(String::new(), |v| format!(" (at version {v})"));
    GatewayError::AdminConflict(format!("agent \"{name}\" exists already{at}"))
}

fn conflict(name: &str, found: Option<u64>) -> GatewayError {
    GatewayError::AdminConflict(match found {
        Some(v) => format!("agent \"{name}\" changed meanwhile (it is at version {v} now): read it again, and send If-Match with that version"),
        None => format!("agent \"{name}\" was deleted meanwhile"),
    })
}

fn name_of(req: &HttpRequest) -> String {
    req.match_info().get("name").unwrap_or_default().to_string()
}

pub(super) async fn list(req: HttpRequest) -> HttpResponse {
    answer(&req, |door| async move {
        let control = &door.state.store.control;
        let entries = (control.list(Kind::Agent).await).map_err(GatewayError::StoreUnavailable)?;
        let mut agents: Vec<AgentView> = (door.live.registry.iter())
            .filter(|a| !a.def.runtime)
            .map(|a| door.file_view(&a.name, a.def.source.display().to_string()))
            .collect();
        for e in &entries {
            agents.push(door.runtime_view(e)?);
        }
        agents.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((StatusCode::OK, AgentList { agents }))
    })
    .await
}

pub(super) async fn get(req: HttpRequest) -> HttpResponse {
    let name = name_of(&req);
    answer(&req, |door| async move {
        if let Some(file) = door.file_of(&name) {
            return Ok((StatusCode::OK, door.file_view(&name, file)));
        }
        let entry = door.runtime(&name).await?;
        Ok((StatusCode::OK, door.runtime_view(&entry)?))
    })
    .await
}

/// `If-Match`'s version, if given (`"3"` or `3`).
fn if_match(req: &HttpRequest) -> Result<Option<u64>, GatewayError> {
    let Some(value) = req.headers().get(actix_web::http::header::IF_MATCH) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default().trim().trim_matches('"');
    text.parse().map(Some).map_err(|_| {
        GatewayError::AdminInvalid(vec![(
            "If-Match".into(),
            format!("{text:?} is not a version (the agent's `version`, a number)"),
        )])
    })
}

pub(super) async fn put(req: HttpRequest, body: web::Payload) -> HttpResponse {
    let name = name_of(&req);
    let r = req.clone();
    answer(&req, |door| async move {
        if let Some(file) = door.file_of(&name) {
            return Err(read_only(&name, &file));
        }
        let wanted = if_match(&r)?;
        let definition: serde_json::Value = json_body(&r, &door.state, body).await?;
        let dir = (door.state.gateway_file.parent()).unwrap_or(std::path::Path::new("."));
        let open_host = door.live.config.admin.allow_host_access;
        crate::config::definition_to_agent(&name, &definition, dir, open_host).map_err(|errs| {
            GatewayError::AdminInvalid(errs.into_iter().map(|e| (e.field, e.message)).collect())
        })?;
        let before = door.stored(&name).await?;
        // `If-None-Match: *`: create only.
        let create_only = r
            .headers()
            .get(actix_web::http::header::IF_NONE_MATCH)
            .is_some_and(|v| v.as_bytes() == b"*");
        if let (true, Some(e)) = (create_only, &before) {
            return Err(taken(&name, Some(e.version)));
        }
        if let Some(want) = wanted {
            match &before {
                Some(e) if e.version == want => {}
                Some(e) => return Err(conflict(&name, Some(e.version))),
                None => return Err(conflict(&name, None)),
            }
        }
        let previous = match &before {
            Some(e) => Some(
                serde_json::from_str::<AgentRecord>(&e.value)
                    .map_err(|e| GatewayError::Internal(format!("a stored agent: {e}")))?,
            ),
            None => None,
        };
        let at = now();
        let record = AgentRecord {
            definition,
            enabled: previous.as_ref().is_none_or(|p| p.enabled),
            created_at: previous
                .as_ref()
                .map_or_else(|| at.clone(), |p| p.created_at.clone()),
            created_by: (previous.as_ref())
                .map_or_else(|| door.actor.to_string(), |p| p.created_by.clone()),
            updated_at: at,
            updated_by: door.actor.to_string(),
        };
        let (action, status) = match before {
            Some(_) => ("agent.update", StatusCode::OK),
            None => ("agent.create", StatusCode::CREATED),
        };
        let view = door.write(&name, before.as_ref(), &record, action).await?;
        Ok((status, view))
    })
    .await
}

pub(super) async fn delete(req: HttpRequest) -> HttpResponse {
    let name = name_of(&req);
    answer(&req, |door| async move {
        let entry = door.runtime(&name).await?;
        let control = &door.state.store.control;
        let written = control
            .put(Kind::Agent, &name, None, Expect::Version(entry.version))
            .await
            .map_err(GatewayError::StoreUnavailable)?;
        if let Written::Conflict(found) = written {
            return Err(conflict(&name, found));
        }
        let mut audit = door.audit("agent.delete", format!("agent:{name}"));
        audit.before = Some(digest_of(&entry.value));
        door.changed(audit).await?;
        Ok((StatusCode::NO_CONTENT, ()))
    })
    .await
}

pub(super) async fn enable(req: HttpRequest) -> HttpResponse {
    switch(req, true).await
}

pub(super) async fn disable(req: HttpRequest) -> HttpResponse {
    switch(req, false).await
}

async fn switch(req: HttpRequest, enabled: bool) -> HttpResponse {
    let name = name_of(&req);
    answer(&req, |door| async move {
        let entry = door.runtime(&name).await?;
        let mut record: AgentRecord = serde_json::from_str(&entry.value)
            .map_err(|e| GatewayError::Internal(format!("a stored agent: {e}")))?;
        if record.enabled == enabled {
            return Ok((StatusCode::OK, door.runtime_view(&entry)?));
        }
        record.enabled = enabled;
        record.updated_at = now();
        record.updated_by = door.actor.to_string();
        let action = if enabled {
            "agent.enable"
        } else {
            "agent.disable"
        };
        let view = door.write(&name, Some(&entry), &record, action).await?;
        Ok((StatusCode::OK, view))
    })
    .await
}

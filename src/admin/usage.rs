//! `/admin/v1/usage` (who used what, JSON or CSV) and `/admin/v1/budgets` (the budgets of
//! the files, and those made here, with what their windows hold now).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;

use super::{answer, error_response, json_body, Door};
use crate::config::BudgetConfig;
use crate::error::GatewayError;
use crate::store::control::{digest_of, Entry, Expect, Kind, Written};
use crate::usage::budgets::{Budget, Source};

pub(super) async fn report(req: HttpRequest) -> HttpResponse {
    let door = match Door::of(&req) {
        Ok(door) => door,
        Err(e) => return error_response(&e),
    };
    let query = match crate::http::usage_query(&req) {
        Ok(q) => q,
        Err(e) => return error_response(&e),
    };
    let report = door.state.usage.report(&query).await;
    crate::http::render_usage(&req, &query, report)
}

/// What one key of a budget holds in the current window.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(crate) struct BudgetStanding {
    /// Whose calls (`*`: all together).
    pub(crate) caller: String,
    pub(crate) agent: String,
    pub(crate) requests: i64,
    pub(crate) tasks: i64,
    pub(crate) tokens: i64,
    pub(crate) cost: f64,
}

/// A budget, where it comes from, its window now and what that holds.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(crate) struct BudgetView {
    #[serde(flatten)]
    pub(crate) budget: BudgetConfig,
    pub(crate) source: Source,
    /// The stored entry's version (runtime budgets), for If-Match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<u64>,
    pub(crate) window_starts_at: String,
    pub(crate) resets_at: String,
    pub(crate) standing: Vec<BudgetStanding>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(crate) struct BudgetList {
    pub(crate) budgets: Vec<BudgetView>,
}

fn id_of(req: &HttpRequest) -> String {
    req.match_info().get("id").unwrap_or_default().to_string()
}

impl Door {
    async fn budget_view(&self, budget: &Budget, version: Option<u64>) -> BudgetView {
        let usage = &self.state.usage;
        let (_, starts, resets) =
            crate::usage::budgets::window_now(budget.config.window, usage.zone());
        let rows = usage.standing_of(budget).await.unwrap_or_else(|e| {
            tracing::warn!(budget = %budget.id(), error = %e, "a budget's standing could not be read");
            Vec::new()
        });
        let mut standing: std::collections::BTreeMap<(String, String), BudgetStanding> =
            Default::default();
        for row in rows {
            // `b|<id>|<window>|<agent>|<caller>`
            let mut parts = row.key.splitn(5, '|').skip(3);
            let (Some(agent), Some(caller)) = (parts.next(), parts.next()) else {
                continue;
            };
            let entry = standing
                .entry((caller.to_string(), agent.to_string()))
                .or_insert_with(|| BudgetStanding {
                    caller: caller.into(),
                    agent: agent.into(),
                    requests: 0,
                    tasks: 0,
                    tokens: 0,
                    cost: 0.0,
                });
            match row.field.as_str() {
                "requests" => entry.requests += row.amount,
                "tasks" => entry.tasks += row.amount,
                "tokens" => entry.tokens += row.amount,
                "cost" => entry.cost += row.amount as f64 / crate::usage::NANOS,
                _ => {}
            }
        }
        BudgetView {
            budget: budget.config.clone(),
            source: budget.source,
            version,
            window_starts_at: crate::usage::rfc3339(starts),
            resets_at: crate::usage::rfc3339(resets),
            standing: standing.into_values().collect(),
        }
    }

    async fn stored_budget(&self, id: &str) -> Result<Option<Entry>, GatewayError> {
        let control = &self.state.store.control;
        control
            .get(Kind::Budget, id)
            .await
            .map_err(GatewayError::StoreUnavailable)
    }

    fn file_budget(&self, id: &str) -> bool {
        self.live.config.budgets.iter().any(|b| b.id == id)
    }
}

pub(super) async fn list(req: HttpRequest) -> HttpResponse {
    answer(&req, |door| async move {
        let control = &door.state.store.control;
        let entries = (control.list(Kind::Budget).await).map_err(GatewayError::StoreUnavailable)?;
        let in_force = door.state.usage.in_force();
        let mut budgets = Vec::new();
        for budget in &in_force.budgets {
            let version = (entries.iter())
                .find(|e| e.name == budget.id() && budget.source == Source::Runtime)
                .map(|e| e.version);
            budgets.push(door.budget_view(budget, version).await);
        }
        Ok((StatusCode::OK, BudgetList { budgets }))
    })
    .await
}

pub(super) async fn get(req: HttpRequest) -> HttpResponse {
    let id = id_of(&req);
    answer(&req, |door| async move {
        let in_force = door.state.usage.in_force();
        let budget = (in_force.budgets.iter())
            .find(|b| b.id() == id)
            .ok_or_else(|| GatewayError::AdminNotFound(format!("no budget \"{id}\"")))?;
        let version = match budget.source {
            Source::Runtime => door.stored_budget(&id).await?.map(|e| e.version),
            Source::File => None,
        };
        Ok((StatusCode::OK, door.budget_view(budget, version).await))
    })
    .await
}

pub(super) async fn put(req: HttpRequest, body: web::Payload) -> HttpResponse {
    let id = id_of(&req);
    let r = req.clone();
    answer(&req, |door| async move {
        if door.file_budget(&id) {
            return Err(GatewayError::AdminConflict(format!(
                "budget \"{id}\" is defined by the gateway file: change it there"
            )));
        }
        let mut budget: BudgetConfig = json_body(&r, &door.state, body).await?;
        if !budget.id.is_empty() && budget.id != id {
            return Err(GatewayError::AdminInvalid(vec![(
                "id".into(),
                format!(
                    "\"{}\" is not the path's \"{id}\" (leave it out)",
                    budget.id
                ),
            )]));
        }
        budget.id = id.clone();
        let push_on = door.live.config.push.enabled;
        let problems = crate::config::budget_problems(&budget, push_on);
        if !problems.is_empty() {
            return Err(GatewayError::AdminInvalid(problems));
        }
        let before = door.stored_budget(&id).await?;
        let expect = before
            .as_ref()
            .map_or(Expect::Absent, |e| Expect::Version(e.version));
        let value =
            serde_json::to_string(&budget).map_err(|e| GatewayError::Internal(e.to_string()))?;
        let control = &door.state.store.control;
        let written = control
            .put(Kind::Budget, &id, Some(value.clone()), expect)
            .await
            .map_err(GatewayError::StoreUnavailable)?;
        let version = match written {
            Written::Done(v) => v,
            Written::Conflict(_) => {
                return Err(GatewayError::AdminConflict(format!(
                    "budget \"{id}\" changed meanwhile: read it again and retry"
                )))
            }
        };
        let (action, status) = match before {
            Some(_) => ("budget.update", StatusCode::OK),
            None => ("budget.create", StatusCode::CREATED),
        };
        let mut audit = door.audit(action, format!("budget:{id}"));
        audit.before = before.as_ref().map(|e| digest_of(&e.value));
        audit.after = Some(digest_of(&value));
        door.changed(audit).await?;
        let view = door
            .budget_view(&Budget::new(budget, Source::Runtime), Some(version))
            .await;
        Ok((status, view))
    })
    .await
}

pub(super) async fn delete(req: HttpRequest) -> HttpResponse {
    let id = id_of(&req);
    answer(&req, |door| async move {
        if door.file_budget(&id) {
            return Err(GatewayError::AdminConflict(format!(
                "budget \"{id}\" is defined by the gateway file: remove it there"
            )));
        }
        let entry = door
            .stored_budget(&id)
            .await?
            .ok_or_else(|| GatewayError::AdminNotFound(format!("no runtime budget \"{id}\"")))?;
        let control = &door.state.store.control;
        let written = control
            .put(Kind::Budget, &id, None, Expect::Version(entry.version))
            .await
            .map_err(GatewayError::StoreUnavailable)?;
        if let Written::Conflict(_) = written {
            return Err(GatewayError::AdminConflict(format!(
                "budget \"{id}\" changed meanwhile: read it again and retry"
            )));
        }
        let mut audit = door.audit("budget.delete", format!("budget:{id}"));
        audit.before = Some(digest_of(&entry.value));
        door.changed(audit).await?;
        Ok((StatusCode::NO_CONTENT, ()))
    })
    .await
}

//! `/admin/v1/audit`: every admin change and every refusal of a runtime key, newest first,
//! filtered, in pages that a cursor continues.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::answer;
use crate::error::GatewayError;
use crate::store::control::AuditEntry;

/// What to read of the log.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditQuery {
    /// Only entries by this actor (`admin-key:ops`, `key:k1…`).
    #[serde(default)]
    pub(crate) actor: Option<String>,
    /// Only this action (`agent.create`, `key.refused`, …), or those starting with it
    /// followed by a dot (`key`).
    #[serde(default)]
    pub(crate) action: Option<String>,
    /// Only entries about this target (`agent:<name>`, `key:<id>`).
    #[serde(default)]
    pub(crate) target: Option<String>,
    /// Only entries at or after this time (RFC 3339).
    #[serde(default)]
    pub(crate) since: Option<String>,
    /// Only entries before this time (RFC 3339).
    #[serde(default)]
    pub(crate) until: Option<String>,
    /// Entries per page: 1 to 1000 (default 100).
    #[serde(default)]
    pub(crate) limit: Option<usize>,
    /// Where the previous page ended (its `next_cursor`).
    #[serde(default)]
    pub(crate) cursor: Option<String>,
}

/// A page of the log.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(crate) struct AuditPage {
    pub(crate) entries: Vec<AuditEntry>,
    /// The cursor of the next page; none after the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) next_cursor: Option<String>,
}

/// Entries read from the store at a time while filtering.
const SCAN: usize = 500;

fn time(
    field: &str,
    value: &Option<String>,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, GatewayError> {
    value
        .as_deref()
        .map(|v| {
            chrono::DateTime::parse_from_rfc3339(v)
                .map(|t| t.to_utc())
                .map_err(|e| {
                    GatewayError::AdminInvalid(vec![(
                        field.into(),
                        format!("{v:?} is not an RFC 3339 time: {e}"),
                    )])
                })
        })
        .transpose()
}

pub(super) async fn list(req: HttpRequest) -> HttpResponse {
    let r = req.clone();
    answer(&req, |door| async move {
        let query: AuditQuery = serde_urlencoded::from_str(r.query_string())
            .map_err(|e| GatewayError::AdminInvalid(vec![("query".into(), e.to_string())]))?;
        let limit = query.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(GatewayError::AdminInvalid(vec![(
                "limit".into(),
                format!("{limit} is not from 1 to 1000"),
            )]));
        }
        let since = time("since", &query.since)?;
        let until = time("until", &query.until)?;
        let mut before = match &query.cursor {
            Some(c) => Some(c.parse::<u64>().map_err(|_| {
                GatewayError::AdminInvalid(vec![(
                    "cursor".into(),
                    format!("{c:?} is not a cursor this log gave"),
                )])
            })?),
            None => None,
        };
        let keeps = |e: &AuditEntry| {
            let at = chrono::DateTime::parse_from_rfc3339(&e.at)
                .ok()
                .map(|t| t.to_utc());
            query.actor.as_ref().is_none_or(|a| *a == e.actor)
                && query.target.as_ref().is_none_or(|t| *t == e.target)
                && query.action.as_ref().is_none_or(|a| {
                    e.action == *a
                        || e.action
                            .strip_prefix(a.as_str())
                            .is_some_and(|r| r.starts_with('.'))
                })
                && since.is_none_or(|s| at.is_some_and(|at| at >= s))
                && until.is_none_or(|u| at.is_some_and(|at| at < u))
        };
        let control = &door.state.store.control;
        let mut entries = Vec::new();
        let mut more = false;
        'scan: loop {
            let rows = control
                .audit(before, SCAN)
                .await
                .map_err(GatewayError::StoreUnavailable)?;
            let last_page = rows.len() < SCAN;
            for row in rows {
                before = Some(row.seq);
                let Ok(mut entry) = serde_json::from_str::<AuditEntry>(&row.entry) else {
                    continue;
                };
                entry.seq = Some(row.seq);
                if !keeps(&entry) {
                    continue;
                }
                if entries.len() == limit {
                    more = true;
                    break 'scan;
                }
                entries.push(entry);
            }
            if last_page {
                break;
            }
        }
        let next_cursor = match more {
            true => entries.last().and_then(|e| e.seq).map(|s| s.to_string()),
            false => None,
        };
        Ok((
            StatusCode::OK,
            AuditPage {
                entries,
                next_cursor,
            },
        ))
    })
    .await
}

//! `GET /a2a/usage`: a caller's own usage (the admin API's `GET /admin/v1/usage` is
//! everyone's), and the rendering both share: JSON, or CSV when asked for.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse};

use super::{error_response, AppState, Caller};
use crate::error::GatewayError;
use crate::usage::report::{csv, UsageQuery, UsageReport};

/// The query of a usage read, a bad one a 400 naming what is wrong.
pub(crate) fn query_of(req: &HttpRequest) -> Result<UsageQuery, GatewayError> {
    serde_urlencoded::from_str(req.query_string())
        .map_err(|e| GatewayError::AdminInvalid(vec![("query".into(), e.to_string())]))
}

/// A report as JSON, or as CSV for `format=csv` or `Accept: text/csv`.
pub(crate) fn render(
    req: &HttpRequest,
    query: &UsageQuery,
    report: Result<UsageReport, GatewayError>,
) -> HttpResponse {
    let report = match report {
        Ok(report) => report,
        Err(e) => return error_response(&e),
    };
    let accepts_csv = (req.headers().get(header::ACCEPT))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/csv"));
    let wants_csv = match query.format.as_deref() {
        Some("csv") => true,
        Some("json") => false,
        Some(other) => {
            return error_response(&GatewayError::AdminInvalid(vec![(
                "format".into(),
                format!("\"{other}\" is not json or csv"),
            )]))
        }
        None => accepts_csv,
    };
    let mut answer = HttpResponse::Ok();
    answer.insert_header((header::CACHE_CONTROL, "no-store"));
    match wants_csv {
        true => answer
            .content_type("text/csv; charset=utf-8")
            .insert_header((
                header::CONTENT_DISPOSITION,
                format!(
                    "attachment; filename=\"usage-{}-{}.csv\"",
                    report.from, report.to
                ),
            ))
            .body(csv(&report)),
        false => answer.json(report),
    }
}

/// `GET /a2a/usage`: what the caller used (its own figures only; anonymous callers, who
/// share one identity, have none to read).
pub(super) async fn own(req: HttpRequest) -> HttpResponse {
    let Some((state, caller)) = Caller::with_state(&req) else {
        return error_response(&GatewayError::Internal("no state".into()));
    };
    let principal = match caller.principal {
        Ok(p) if !p.anonymous => p,
        Ok(_) => {
            return error_response(&caller.live.auth_error(crate::auth::AuthError::Missing));
        }
        Err(e) => return error_response(&e),
    };
    if let Err(e) = state.admit_caller(&req, &caller.live, &principal).await {
        return error_response(&e);
    }
    let mut query = match query_of(&req) {
        Ok(q) => q,
        Err(e) => return error_response(&e),
    };
    if query.caller.as_deref().is_some_and(|c| c != &*principal.id) {
        return error_response(&GatewayError::Forbidden);
    }
    query.caller = Some(principal.id.to_string());
    let state: &AppState = state;
    let report = state.usage.report(&query).await;
    render(&req, &query, report)
}

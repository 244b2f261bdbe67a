//! CORS for browser clients, from `[cors]` of the configuration in force, so a reload
//! changes it at once. (actix-cors fixes its settings when the app is built, once per
//! worker; a reload could not reach them.) An origin that is not allowed gets no CORS
//! header at all; its preflight is refused.

use actix_web::dev::ServiceRequest;
use actix_web::http::header::{self, HeaderMap, HeaderValue};
use actix_web::http::Method;
use actix_web::HttpResponse;

use crate::config::CorsConfig;

// DELETE: an HTTP+JSON push config's, and an MCP session's end.
const ALLOWED_METHODS: &str = "GET, POST, DELETE, OPTIONS";
const ALLOWED_HEADERS: &str =
    "authorization, x-api-key, a2a-version, content-type, a2a-extensions, x-a2a-extensions, last-event-id, traceparent, tracestate, mcp-session-id, mcp-protocol-version";
const EXPOSED_HEADERS: &str = "x-ratelimit-limit, x-ratelimit-remaining, x-ratelimit-reset, retry-after, www-authenticate, a2a-gateway-agent, a2a-gateway-route, a2a-extensions, mcp-session-id";

/// What `Access-Control-Allow-Origin` says for `origin`, if it is allowed.
fn allow_origin(cfg: &CorsConfig, origin: &HeaderValue) -> Option<HeaderValue> {
    let origin_str = origin.to_str().ok()?;
    if cfg.allowed_origins.iter().any(|o| o == origin_str) {
        return Some(origin.clone());
    }
    if cfg.allowed_origins.iter().any(|o| o == "*") {
        // With credentials the origin itself must be named; without, the wildcard is.
        return Some(if cfg.allow_credentials {
            origin.clone()
        } else {
            HeaderValue::from_static("*")
        });
    }
    None
}

fn insert_common(headers: &mut HeaderMap, credentials: bool, allowed: HeaderValue) {
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
    if credentials {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
}

/// What CORS makes of a request, decided before it is handled.
pub(super) enum Cors {
    /// No CORS configured: the answer is left as it is.
    Off,
    /// CORS is on: the answer varies by origin, and carries these headers when allowed.
    On {
        allowed: Option<HeaderValue>,
        credentials: bool,
    },
    /// A preflight, answered here.
    Preflight(HttpResponse),
}

impl Cors {
    /// Decides from the request's head and `[cors]` of the configuration in force.
    pub(super) fn check(cfg: &CorsConfig, req: &ServiceRequest) -> Cors {
        if cfg.allowed_origins.is_empty() {
            return Cors::Off;
        }
        let Some(origin) = req.headers().get(header::ORIGIN) else {
            return Cors::On {
                allowed: None,
                credentials: false,
            };
        };
        let allowed = allow_origin(cfg, origin);
        let preflight = req.method() == Method::OPTIONS
            && req
                .headers()
                .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
        if !preflight {
            return Cors::On {
                allowed,
                credentials: cfg.allow_credentials,
            };
        }
        Cors::Preflight(match allowed {
            Some(allowed) => {
                let mut resp = HttpResponse::Ok().finish();
                let h = resp.headers_mut();
                insert_common(h, cfg.allow_credentials, allowed);
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_METHODS,
                    HeaderValue::from_static(ALLOWED_METHODS),
                );
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_HEADERS,
                    HeaderValue::from_static(ALLOWED_HEADERS),
                );
                h.insert(header::ACCESS_CONTROL_MAX_AGE, cfg.max_age_secs.into());
                resp
            }
            None => HttpResponse::Forbidden().json(crate::error::status_body(
                403,
                "this origin may not call the gateway (see [cors] allowed_origins)",
                None,
            )),
        })
    }

    /// Adds the answer's CORS headers. A shared cache must keep answers apart by origin
    /// whenever CORS is on, allowed or not.
    pub(super) fn decorate(self, headers: &mut HeaderMap) {
        match self {
            Cors::On {
                allowed: Some(allowed),
                credentials,
            } => {
                insert_common(headers, credentials, allowed);
                headers.insert(
                    header::ACCESS_CONTROL_EXPOSE_HEADERS,
                    HeaderValue::from_static(EXPOSED_HEADERS),
                );
            }
            Cors::On { allowed: None, .. } => {
                headers.append(header::VARY, HeaderValue::from_static("Origin"));
            }
            Cors::Off | Cors::Preflight(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(origins: &[&str], credentials: bool) -> CorsConfig {
        CorsConfig {
            allowed_origins: origins.iter().map(|o| o.to_string()).collect(),
            allow_credentials: credentials,
            max_age_secs: 600,
        }
    }

    #[test]
    fn origins_are_matched_exactly_and_the_wildcard_names_none_with_credentials() {
        let app = HeaderValue::from_static("https://app.example");
        assert_eq!(
            allow_origin(&cfg(&["https://app.example"], false), &app),
            Some(app.clone())
        );
        assert_eq!(
            allow_origin(&cfg(&["https://app.example.evil"], false), &app),
            None
        );
        assert_eq!(allow_origin(&cfg(&[], false), &app), None);
        assert_eq!(
            allow_origin(&cfg(&["*"], false), &app),
            Some(HeaderValue::from_static("*"))
        );
        assert_eq!(allow_origin(&cfg(&["*"], true), &app), Some(app));
    }
}

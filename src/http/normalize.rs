//! One trailing slash is dropped from every path before routing, so `POST /a2a/agents/echo/`
//! (what httpx, axios and other clients send when a card URL is their base URL and they
//! post to `/`) reaches the same route as `POST /a2a/agents/echo`, on every route at once.
//!
//! Written here rather than with actix's `NormalizePath` because that one runs a regex
//! over every path (to merge `//`), which the hot path would pay on every request; this one
//! looks at the last byte. The edge service (`observe.rs`) applies it before routing.

use actix_web::http::uri::{PathAndQuery, Uri};

/// The URI with one trailing slash less, or None when the path has none to lose (`/` keeps
/// its slash).
pub(super) fn without_trailing_slash(uri: &Uri) -> Option<Uri> {
    let path = uri.path();
    if path.len() < 2 || !path.ends_with('/') {
        return None;
    }
    let trimmed = &path[..path.len() - 1];
    let path_and_query = match uri.query() {
        Some(q) => format!("{trimmed}?{q}"),
        None => trimmed.to_string(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::try_from(path_and_query).ok()?);
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trim(uri: &str) -> Option<String> {
        without_trailing_slash(&uri.parse().unwrap()).map(|u| u.to_string())
    }

    #[test]
    fn one_trailing_slash_goes_and_the_query_stays() {
        assert_eq!(
            trim("/a2a/agents/echo/").as_deref(),
            Some("/a2a/agents/echo")
        );
        assert_eq!(trim("/a2a/").as_deref(), Some("/a2a"));
        assert_eq!(
            trim("/a2a/?A2A-Version=1.0").as_deref(),
            Some("/a2a?A2A-Version=1.0")
        );
        assert_eq!(trim("/a2a//").as_deref(), Some("/a2a/"), "only one");
        assert_eq!(trim("/"), None);
        assert_eq!(trim("/a2a"), None);
        assert_eq!(trim("/a2a?x=/"), None);
    }
}

//! One trailing slash is dropped from every path before routing, so `POST /a2a/agents/echo/`
//! (what httpx, axios and other clients send when a card URL is their base URL and they
//! post to `/`) reaches the same route as `POST /a2a/agents/echo`, on every route at once.
//!
//! Written here rather than with actix's `NormalizePath` because that one runs a regex
//! over every path (to merge `//`), which the hot path would pay on every request; this one
//! looks at the last byte and passes everything else through without boxing a future.

use std::future::{ready, Ready};

use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::uri::{PathAndQuery, Uri};

pub(crate) struct TrimTrailingSlash;

impl<S, B> Transform<S, ServiceRequest> for TrimTrailingSlash
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    type Response = ServiceResponse<B>;
    type Error = actix_web::Error;
    type Transform = TrimTrailingSlashService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(TrimTrailingSlashService { service }))
    }
}

pub(crate) struct TrimTrailingSlashService<S> {
    service: S,
}

impl<S, B> Service<ServiceRequest> for TrimTrailingSlashService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    type Response = ServiceResponse<B>;
    type Error = actix_web::Error;
    type Future = S::Future;

    forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        if let Some(uri) = without_trailing_slash(req.uri()) {
            req.match_info_mut().get_mut().update(&uri);
            req.head_mut().uri = uri;
        }
        self.service.call(req)
    }
}

/// The URI with one trailing slash less, or None when the path has none to lose (`/` keeps
/// its slash).
fn without_trailing_slash(uri: &Uri) -> Option<Uri> {
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

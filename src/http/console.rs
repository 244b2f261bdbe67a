//! The browser console: one self-contained page (`console/dist/console.html`, built from
//! `console/src` and committed; see `console/README.md`), embedded in the binary so it
//! works without any network. It calls the gateway like any browser app, from its origin.

use actix_web::http::header;
use actix_web::HttpResponse;

const PAGE: &str = include_str!("../../console/dist/console.html");

pub(super) async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        // The page talks to its own origin unless told (?gateway=) to talk to another.
        .insert_header(("Referrer-Policy", "no-referrer"))
        .body(PAGE)
}

//! The admin API's OpenAPI 3.1 document, made from the route list and the types its
//! handlers read and answer with (their JSON schemas, by schemars): nothing in it is
//! written by hand but the words.

use std::any::TypeId;

use actix_web::{HttpRequest, HttpResponse};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::PREFIX;

/// One route as the document describes it (see `routes!`).
pub(super) struct Route {
    pub(super) method: &'static str,
    pub(super) path: &'static str,
    pub(super) operation: &'static str,
    pub(super) summary: &'static str,
    pub(super) body: fn(&mut SchemaGenerator) -> Option<Schema>,
    pub(super) status: u16,
    pub(super) answer: fn(&mut SchemaGenerator) -> Option<Schema>,
    pub(super) query: fn() -> Vec<Value>,
}

/// `T`'s schema (a reference into the components), none for `()`.
pub(super) fn schema_of<T: JsonSchema + 'static>(g: &mut SchemaGenerator) -> Option<Schema> {
    (TypeId::of::<T>() != TypeId::of::<()>()).then(|| g.subschema_for::<T>())
}

/// `T`'s fields as query parameters, none for `()`.
pub(super) fn query_of<T: JsonSchema + 'static>() -> Vec<Value> {
    if TypeId::of::<T>() == TypeId::of::<()>() {
        return Vec::new();
    }
    let schema = settings().into_generator().into_root_schema_for::<T>();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    (properties.into_iter())
        .map(|(name, mut property)| {
            let description = property
                .as_object_mut()
                .and_then(|p| p.remove("description"))
                .unwrap_or(Value::Null);
            let mut parameter =
                json!({"name": name, "in": "query", "required": false, "schema": property});
            if !description.is_null() {
                parameter["description"] = description;
            }
            parameter
        })
        .collect()
}

fn settings() -> SchemaSettings {
    SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.meta_schema = None;
    })
}

/// An error's body (a `google.rpc.Status`), as every refusal of the admin API has it.
#[derive(Serialize, JsonSchema)]
#[allow(dead_code)]
struct ErrorBody {
    error: ErrorStatus,
}

#[derive(Serialize, JsonSchema)]
#[allow(dead_code)]
struct ErrorStatus {
    /// The HTTP status.
    code: u16,
    /// Its gRPC name (`INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, …).
    status: String,
    message: String,
    /// A `google.rpc.ErrorInfo` (the reason) and, for a body that does not check, a
    /// `google.rpc.BadRequest` whose `fieldViolations` name each field.
    details: Vec<serde_json::Map<String, Value>>,
}

/// The document.
pub(crate) fn document() -> Value {
    let mut g = settings().into_generator();
    let error = g.subschema_for::<ErrorBody>();
    let mut paths: Map<String, Value> = Map::new();
    for route in super::documented() {
        let path = format!("{PREFIX}{}", route.path);
        let mut parameters: Vec<Value> = (route.path.split('/'))
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        parameters.extend((route.query)());
        let mut responses = Map::new();
        let ok = match (route.answer)(&mut g) {
            Some(schema) => {
                json!({"description": "done", "content": {"application/json": {"schema": schema}}})
            }
            None => json!({"description": "done"}),
        };
        responses.insert(route.status.to_string(), ok);
        if route.operation != "getOpenApi" {
            for (status, what) in [
                ("400", "the request does not check (the fields are named)"),
                ("401", "no admin credential, or one not accepted"),
                ("403", "a credential that is not an admin's"),
                ("404", "what the path names is not there"),
                (
                    "409",
                    "a conflict: the name is a file's, or the entry changed meanwhile",
                ),
                ("429", "the admin API's rate limit (Retry-After)"),
                ("503", "the store does not answer"),
            ] {
                responses.insert(
                    status.into(),
                    json!({"description": what, "content": {"application/json": {"schema": error}}}),
                );
            }
        }
        let mut operation = json!({
            "operationId": route.operation,
            "summary": route.summary,
            "parameters": parameters,
            "responses": responses,
        });
        if let Some(body) = (route.body)(&mut g) {
            operation["requestBody"] =
                json!({"required": true, "content": {"application/json": {"schema": body}}});
        }
        if route.operation == "getOpenApi" {
            operation["security"] = json!([]);
        }
        let entry = paths.entry(path).or_insert_with(|| json!({}));
        entry[route.method] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "a2a-gateway admin API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Agents and keys managed at runtime, shared by every replica through the store, and the audit log of every change. See docs/admin.md.",
        },
        "paths": paths,
        "components": {
            "schemas": g.take_definitions(true),
            "securitySchemes": {
                "adminBearer": {"type": "http", "scheme": "bearer", "description": "An [admin] key's secret, or a JWT that grants admin"},
            },
        },
        "security": [{"adminBearer": []}],
    })
}

/// `GET /admin/v1/openapi.json`: the document (no credentials needed: it holds none).
pub(super) async fn serve(_req: HttpRequest) -> HttpResponse {
    static RENDERED: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let body = RENDERED.get_or_init(|| serde_json::to_vec_pretty(&document()).unwrap_or_default());
    HttpResponse::Ok()
        .content_type("application/json")
        .body(body.clone())
}

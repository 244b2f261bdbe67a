//! Benchmark baseline: the cheapest possible actix-web JSON-RPC endpoint. It reads the body
//! and returns a fixed SendMessage result of the same shape and size as the echo agent's,
//! so the gateway's throughput can be reported as a ratio against it in the same run.
//!
//! `POST /jsonrpc` is the same with the least a real JSON-RPC server must do: parse the
//! request envelope and answer with its `id`. Both baselines are reported.
//!
//! It also serves a minimal 1.0 agent card, so the gateway can use it as a fast upstream.
//!
//! `cargo run --release --example bare_jsonrpc -- 127.0.0.1:9001 [workers]`

use actix_web::{web, App, HttpResponse, HttpServer};

const RESULT: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"0bdcadd3-4bd1-40ad-9c00-0429134e5dbc","contextId":"461117a0-1503-431d-b982-5c588135eb66","status":{"state":"TASK_STATE_COMPLETED","timestamp":"2026-11-21T22:13:35.763Z"},"artifacts":[{"artifactId":"echo","name":"echo","parts":[{"text":"hello"}]}],"history":[{"messageId":"m1","contextId":"461117a0-1503-431d-b982-5c588135eb66","taskId":"0bdcadd3-4bd1-40ad-9c00-0429134e5dbc","role":"ROLE_USER","parts":[{"text":"hello"}]}]}}}"#;

const RESULT_OBJECT: &str = r#"{"task":{"id":"0bdcadd3-4bd1-40ad-9c00-0429134e5dbc","contextId":"461117a0-1503-431d-b982-5c588135eb66","status":{"state":"TASK_STATE_COMPLETED","timestamp":"2026-11-21T22:13:35.763Z"},"artifacts":[{"artifactId":"echo","name":"echo","parts":[{"text":"hello"}]}],"history":[{"messageId":"m1","contextId":"461117a0-1503-431d-b982-5c588135eb66","taskId":"0bdcadd3-4bd1-40ad-9c00-0429134e5dbc","role":"ROLE_USER","parts":[{"text":"hello"}]}]}}"#;

#[derive(serde::Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    id: &'a serde_json::value::RawValue,
    #[allow(dead_code)]
    method: &'a str,
    #[allow(dead_code)]
    #[serde(borrow)]
    params: Option<&'a serde_json::value::RawValue>,
}

async fn parsing_handler(body: web::Bytes) -> HttpResponse {
    let Ok(req) = serde_json::from_slice::<Request>(&body) else {
        return HttpResponse::BadRequest().finish();
    };
    // The result is fixed bytes: written around the caller's id, never parsed again.
    let id = req.id.get();
    let mut answer = Vec::with_capacity(RESULT_OBJECT.len() + id.len() + 40);
    answer.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    answer.extend_from_slice(id.as_bytes());
    answer.extend_from_slice(br#","result":"#);
    answer.extend_from_slice(RESULT_OBJECT.as_bytes());
    answer.push(b'}');
    HttpResponse::Ok()
        .content_type("application/json")
        .body(answer)
}

async fn handler(_body: web::Bytes) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(RESULT)
}

fn card(addr: &str) -> String {
    format!(
        r#"{{"name":"bare","description":"fixed answers","version":"1.0.0",
"supportedInterfaces":[{{"url":"http://{addr}/","protocolBinding":"JSONRPC","protocolVersion":"1.0"}}],
"capabilities":{{"streaming":false}},"defaultInputModes":["text/plain"],
"defaultOutputModes":["text/plain"],"skills":[]}}"#
    )
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:9001".into());
    let workers: usize = args.next().and_then(|w| w.parse().ok()).unwrap_or(2);
    let card = card(&addr);
    HttpServer::new(move || {
        let card = card.clone();
        App::new()
            .route(
                "/.well-known/agent-card.json",
                web::get().to(move || {
                    let card = card.clone();
                    async move {
                        HttpResponse::Ok()
                            .content_type("application/json")
                            .body(card)
                    }
                }),
            )
            .route("/jsonrpc", web::post().to(parsing_handler))
            .default_service(web::post().to(handler))
    })
    .workers(workers)
    .bind(addr)?
    .run()
    .await
}

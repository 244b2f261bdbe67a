//! Benchmark baseline: the cheapest possible actix-web JSON-RPC endpoint. It reads the body
//! and returns a fixed SendMessage result of the same shape and size as the echo agent's,
//! so the gateway's throughput can be reported as a ratio against it in the same run.
//!
//! It also serves a minimal 1.0 agent card, so the gateway can use it as a fast upstream.
//!
//! `cargo run --release --example bare_jsonrpc -- 127.0.0.1:9001 [workers]`

use actix_web::{web, App, HttpResponse, HttpServer};

const RESULT: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"0bdcadd3-4bd1-40ad-9c00-0429134e5dbc","contextId":"461117a0-1503-431d-b982-5c588135eb66","status":{"state":"TASK_STATE_COMPLETED","timestamp":"2026-11-21T22:13:35.763Z"},"artifacts":[{"artifactId":"echo","name":"echo","parts":[{"text":"hello"}]}],"history":[{"messageId":"m1","contextId":"461117a0-1503-431d-b982-5c588135eb66","taskId":"0bdcadd3-4bd1-40ad-9c00-0429134e5dbc","role":"ROLE_USER","parts":[{"text":"hello"}]}]}}}"#;

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
            .default_service(web::post().to(handler))
    })
    .workers(workers)
    .bind(addr)?
    .run()
    .await
}

//! Benchmark baseline: the plainest one-hop reverse proxy — actix-web in front of a pooled
//! reqwest client, copying the request body to one upstream URL and the answer back.
//!
//! `cargo run --release --example plain_forwarder -- 127.0.0.1:9002 http://127.0.0.1:9001/ [workers]`

use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

struct Forwarder {
    client: reqwest::Client,
    upstream: String,
}

async fn forward(req: HttpRequest, body: web::Bytes, fwd: web::Data<Forwarder>) -> HttpResponse {
    let mut out = fwd.client.post(&fwd.upstream).body(body);
    for name in ["content-type", "a2a-version"] {
        if let Some(v) = req.headers().get(name) {
            out = out.header(name, v.as_bytes());
        }
    }
    match out.send().await {
        Ok(resp) => {
            let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::OK);
            match resp.bytes().await {
                Ok(bytes) => HttpResponse::build(status)
                    .content_type("application/json")
                    .body(bytes),
                Err(_) => HttpResponse::BadGateway().finish(),
            }
        }
        Err(_) => HttpResponse::BadGateway().finish(),
    }
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:9002".into());
    let upstream = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:9001/".into());
    let workers: usize = args.next().and_then(|w| w.parse().ok()).unwrap_or(2);
    let fwd = web::Data::new(Forwarder {
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(4096)
            .tcp_nodelay(true)
            .build()
            .map_err(std::io::Error::other)?,
        upstream,
    });
    HttpServer::new(move || {
        App::new()
            .app_data(fwd.clone())
            .default_service(web::post().to(forward))
    })
    .workers(workers)
    .bind(addr)?
    .run()
    .await
}

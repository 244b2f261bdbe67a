//! A small load generator for what wrk cannot do here:
//!
//! - `rate URL BODY_FILE RPS SECS [HEADER:VALUE...]`: requests at a fixed rate (latency is
//!   measured from each request's scheduled time, so a slow server cannot hide its queue);
//!   prints achieved rate, errors and p50/p90/p99/max (and with `LATENCY_FILE=PATH`, writes
//!   the whole distribution there: a percentile and its latency in ms a line).
//! - `streams URL BODY_FILE COUNT HOLD_SECS [HEADER:VALUE...]`: opens COUNT SSE streams,
//!   waits for the first event on each, prints `READY <n>`, holds them HOLD_SECS, exits.
//! - `closed URL BODY_FILE CONNECTIONS SECS [HEADER:VALUE...]`: CONNECTIONS clients, each
//!   on its own keep-alive connection, POSTing BODY_FILE back to back; prints req/s.
//! - `grpc TARGET JSON_FILE CONNECTIONS SECS`: the same over gRPC: JSON_FILE, a 1.0
//!   `SendMessageRequest` in ProtoJSON, sent as `SendMessage` to TARGET (`host:port`), each
//!   client on its own HTTP/2 connection. `closed` and `grpc` are one client written twice,
//!   so that their figures compare the gateway's bindings, not two load tools.
//! - `grpc-calls TARGET JSON_FILE CALLS`: CALLS of that `SendMessage` one after another on one
//!   connection, once TARGET answers (waiting up to two minutes for it); fails on the first
//!   call that does not answer OK. `scripts/callgrind.sh` counts instructions with it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

fn usage() -> ! {
    eprintln!("usage: loadgen rate URL BODY_FILE RPS SECS [H:V..] | streams URL BODY_FILE COUNT HOLD_SECS [H:V..] | closed URL BODY_FILE CONNECTIONS SECS [H:V..] | grpc TARGET JSON_FILE CONNECTIONS SECS | grpc-calls TARGET JSON_FILE CALLS");
    std::process::exit(2)
}

fn headers(rest: &[String]) -> reqwest::header::HeaderMap {
    let mut map = reqwest::header::HeaderMap::new();
    map.insert(
        "content-type",
        "application/json".parse().unwrap_or_else(|_| usage()),
    );
    for h in rest {
        let Some((k, v)) = h.split_once(':') else {
            usage()
        };
        let (Ok(k), Ok(v)) = (
            reqwest::header::HeaderName::from_bytes(k.trim().as_bytes()),
            v.trim().parse(),
        ) else {
            usage()
        };
        map.insert(k, v);
    }
    map
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() == 4 && args[0] == "grpc-calls" {
        let json = std::fs::read(&args[2]).unwrap_or_else(|_| usage());
        let calls: usize = args[3].parse().unwrap_or_else(|_| usage());
        return grpc_calls(&args[1], json, calls).await;
    }
    if args.len() < 5 {
        usage();
    }
    let body = std::fs::read(&args[2]).unwrap_or_else(|_| usage());
    let n: u64 = args[3].parse().unwrap_or_else(|_| usage());
    let secs: u64 = args[4].parse().unwrap_or_else(|_| usage());
    let client = reqwest::Client::builder()
        .default_headers(headers(&args[5..]))
        .pool_max_idle_per_host(20_000)
        .build()
        .unwrap_or_else(|_| usage());
    match args[0].as_str() {
        "rate" => rate(client, args[1].clone(), body, n, secs).await,
        "streams" => streams(client, args[1].clone(), body, n as usize, secs).await,
        "closed" => closed(&args, body, n as usize, secs).await,
        "grpc" => grpc(args[1].clone(), body, n as usize, secs).await,
        _ => usage(),
    }
}

/// Runs `clients` loops of `call` until `secs` pass; prints the rate of calls that worked.
async fn closed_loop<F, Fut>(clients: usize, secs: u64, call: F)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let ok = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let (call, ok, errors) = (call.clone(), ok.clone(), errors.clone());
            tokio::spawn(async move {
                while Instant::now() < end {
                    match call(i).await {
                        true => ok.fetch_add(1, Ordering::Relaxed),
                        false => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let done = ok.load(Ordering::Relaxed);
    println!(
        "closed {:.0} req/s ok {done} errors {}",
        done as f64 / start.elapsed().as_secs_f64(),
        errors.load(Ordering::Relaxed)
    );
}

async fn closed(args: &[String], body: Vec<u8>, clients: usize, secs: u64) {
    let url = args[1].clone();
    // A client each: one connection each, as wrk's.
    let each: Vec<reqwest::Client> = (0..clients)
        .map(|_| {
            reqwest::Client::builder()
                .default_headers(headers(&args[5..]))
                .http1_only()
                .pool_max_idle_per_host(1)
                .build()
                .unwrap_or_else(|_| usage())
        })
        .collect();
    let each = Arc::new(each);
    let body = bytes::Bytes::from(body);
    closed_loop(clients, secs, move |i| {
        let (client, url, body) = (each[i].clone(), url.clone(), body.clone());
        async move {
            match client.post(&url).body(body).send().await {
                Ok(resp) => resp.status().is_success() && resp.bytes().await.is_ok(),
                Err(_) => false,
            }
        }
    })
    .await;
}

/// A gRPC client of its own HTTP/2 connection to `target`, the `SendMessage` path, and
/// `json` (a 1.0 `SendMessageRequest` in ProtoJSON) as its message.
type GrpcClient = tonic::client::Grpc<
    hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        tonic::body::Body,
    >,
>;

fn grpc_parts(target: &str, json: Vec<u8>) -> (http::Uri, http::uri::PathAndQuery, bytes::Bytes) {
    use a2a_gateway::protocol::grpc::{json_to_bytes, rpc_of};
    use a2a_gateway::protocol::jsonrpc::Method;
    use a2a_gateway::protocol::Dialect;
    let Some(rpc) = rpc_of(Method::SendMessage, Dialect::V10) else {
        usage()
    };
    let json = String::from_utf8(json).unwrap_or_else(|_| usage());
    let message = json_to_bytes(&json, &rpc.input).unwrap_or_else(|e| {
        eprintln!("{e}");
        usage()
    });
    let origin = format!("http://{target}")
        .parse()
        .unwrap_or_else(|_| usage());
    let path = rpc.path.parse().unwrap_or_else(|_| usage());
    (origin, path, message)
}

fn grpc_client(origin: &http::Uri) -> GrpcClient {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build::<_, tonic::body::Body>(connector);
    tonic::client::Grpc::with_origin(client, origin.clone())
}

async fn grpc_call(
    client: &mut GrpcClient,
    path: http::uri::PathAndQuery,
    message: bytes::Bytes,
) -> Result<bytes::Bytes, tonic::Status> {
    use a2a_gateway::protocol::grpc::RawCodec;
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "a2a-version",
        tonic::metadata::MetadataValue::from_static("1.0"),
    );
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    Ok(client.unary(request, path, RawCodec).await?.into_inner())
}

async fn grpc(target: String, json: Vec<u8>, clients: usize, secs: u64) {
    let (origin, path, message) = grpc_parts(&target, json);
    let each: Vec<_> = (0..clients).map(|_| grpc_client(&origin)).collect();
    let each = Arc::new(each);
    closed_loop(clients, secs, move |i| {
        let (mut client, message, path) = (each[i].clone(), message.clone(), path.clone());
        async move { grpc_call(&mut client, path, message).await.is_ok() }
    })
    .await;
}

async fn grpc_calls(target: &str, json: Vec<u8>, calls: usize) {
    let (origin, path, message) = grpc_parts(target, json);
    let mut client = grpc_client(&origin);
    let waiting = Instant::now();
    // The first call is retried while the server starts (slowly, under valgrind).
    loop {
        match grpc_call(&mut client, path.clone(), message.clone()).await {
            Ok(answer) if !answer.is_empty() => break,
            Ok(_) => fail("the first call answered an empty message"),
            Err(status) if waiting.elapsed() > Duration::from_secs(120) => {
                fail(&format!("no answer from {target}: {status}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        client = grpc_client(&origin);
    }
    for _ in 1..calls {
        match grpc_call(&mut client, path.clone(), message.clone()).await {
            Ok(answer) if !answer.is_empty() => {}
            Ok(_) => fail("a call answered an empty message"),
            Err(status) => fail(&format!("a call failed: {status}")),
        }
    }
}

fn fail(why: &str) -> ! {
    eprintln!("loadgen: {why}");
    std::process::exit(1)
}

async fn rate(client: reqwest::Client, url: String, body: Vec<u8>, rps: u64, secs: u64) {
    let latencies = Arc::new(Mutex::new(Vec::with_capacity((rps * secs) as usize)));
    let errors = Arc::new(AtomicUsize::new(0));
    let period = Duration::from_nanos(1_000_000_000 / rps.max(1));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity((rps * secs) as usize);
    for i in 0..rps * secs {
        let scheduled = start + period * i as u32;
        tokio::time::sleep_until(scheduled.into()).await;
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        let (latencies, errors) = (latencies.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let ok = match client.post(&url).body(body).send().await {
                Ok(resp) => resp.status().is_success() && resp.bytes().await.is_ok(),
                Err(_) => false,
            };
            if ok {
                let us = scheduled.elapsed().as_micros() as u64;
                latencies.lock().unwrap_or_else(|e| e.into_inner()).push(us);
            } else {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut l = latencies.lock().unwrap_or_else(|e| e.into_inner()).clone();
    l.sort_unstable();
    let pct = |p: f64| {
        l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    // The whole distribution, for pictures: a percentile (0.0 to 100.0 in steps of 0.1) and
    // its latency in ms a line.
    if let Ok(path) = std::env::var("LATENCY_FILE") {
        let lines: String = (0..=1000)
            .map(|i| {
                format!(
                    "{:.1} {:.3}\n",
                    i as f64 / 10.0,
                    pct(i as f64 / 1000.0) as f64 / 1000.0
                )
            })
            .collect();
        if let Err(e) = std::fs::write(&path, lines) {
            eprintln!("loadgen: cannot write {path}: {e}");
        }
    }
    println!(
        "rate {:.0} req/s ok {} errors {} p50 {:.2}ms p90 {:.2}ms p99 {:.2}ms max {:.2}ms",
        l.len() as f64 / elapsed,
        l.len(),
        errors.load(Ordering::Relaxed),
        pct(0.50) as f64 / 1000.0,
        pct(0.90) as f64 / 1000.0,
        pct(0.99) as f64 / 1000.0,
        l.last().copied().unwrap_or(0) as f64 / 1000.0,
    );
}

async fn streams(client: reqwest::Client, url: String, body: Vec<u8>, count: usize, hold: u64) {
    let ready = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    // Connections are opened a few hundred at a time, not all in one burst.
    let opening = Arc::new(tokio::sync::Semaphore::new(256));
    for _ in 0..count {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        let (ready, failed, opening) = (ready.clone(), failed.clone(), opening.clone());
        tokio::spawn(async move {
            let permit = opening.acquire_owned().await;
            let resp = client
                .post(&url)
                .header("accept", "text/event-stream")
                .body(body)
                .send()
                .await;
            let Ok(resp) = resp else {
                failed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let mut events = resp.bytes_stream();
            let mut seen = String::new();
            while let Some(Ok(chunk)) = events.next().await {
                seen.push_str(&String::from_utf8_lossy(&chunk));
                if seen.contains("data:") {
                    ready.fetch_add(1, Ordering::Relaxed);
                    drop(permit);
                    // Hold the stream open, reading whatever comes.
                    while events.next().await.is_some() {}
                    return;
                }
            }
            failed.fetch_add(1, Ordering::Relaxed);
        });
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while ready.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) < count
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "READY {} failed {}",
        ready.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
    tokio::time::sleep(Duration::from_secs(hold)).await;
    std::process::exit(0);
}

//! The connections a remote agent's unary calls go over: hyper's own client connections
//! (`hyper::client::conn`), made by the agent's connector (its guarded resolver and TLS),
//! kept per origin while idle.
//!
//! Why not hyper-util's pooled `Client`, which did this before: it cost a relayed call about
//! 8k of its ~105k instructions (callgrind; 97.6k without it). It hashes its key with
//! SipHash on every checkout and return, races a connect future against every checkout, and
//! spawns a task per HTTP/1 call to give the connection back once it is ready again. An
//! agent's calls go to one origin, mostly, and the gateway reads every answer to its end
//! before it lets the connection go, so the pool here is a short list of origins, each a
//! stack of idle HTTP/1 connections (the most recently used taken first, those left idle for
//! a minute or so closed) or one shared HTTP/2 connection. hyper-util's newer composable
//! pool (`client::pool`) has no idle expiry either and asks for a tower stack per origin.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, HOST};
use http::response::Parts;
use http::uri::{Authority, Scheme};
use http::{Request, Uri};
use http_body_util::Full;
use hyper::client::conn::{http1, http2};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower_service::Service;

use super::failure::{read_capped, Failure};
use super::resolve::GuardedResolver;

type Connector = HttpsConnector<HttpConnector<GuardedResolver>>;
type Body = Full<Bytes>;

/// How often connections left idle are closed: those idle since the sweep before the last
/// (so after 45 to 90 s; hyper-util's client kept them 90 s).
const SWEEP_EVERY: Duration = Duration::from_secs(45);
/// Idle HTTP/1 connections kept per origin; past it, a returned connection is closed.
const MAX_IDLE: usize = 4096;

pub(super) struct Pool {
    connector: Connector,
    http2_only: bool,
    origins: Arc<Mutex<Origins>>,
    /// Whether the task that closes connections left idle has been started (on the first
    /// connection: a pool that never connects needs none).
    sweeping: AtomicBool,
}

#[derive(Default)]
struct Origins {
    list: Vec<Origin>,
    /// How many sweeps have run: an idle connection is stamped with it, not with a clock.
    sweeps: u64,
}

struct Origin {
    scheme: Option<Scheme>,
    authority: Option<Authority>,
    /// The Host header HTTP/1 calls carry (none for an authority with credentials in it).
    host: Option<HeaderValue>,
    /// Idle HTTP/1 connections, the most recently returned last, with the sweep count when
    /// they were returned.
    idle: Vec<(http1::SendRequest<Body>, u64)>,
    /// The origin's HTTP/2 connection, which every call shares.
    shared: Option<http2::SendRequest<Body>>,
}

impl Origin {
    fn of(uri: &Uri) -> Origin {
        Origin {
            scheme: uri.scheme().cloned(),
            authority: uri.authority().cloned(),
            host: uri
                .authority()
                .filter(|a| !a.as_str().contains('@'))
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
            idle: Vec::new(),
            shared: None,
        }
    }

    fn is(&self, uri: &Uri) -> bool {
        self.scheme.as_ref() == uri.scheme() && self.authority.as_ref() == uri.authority()
    }
}

/// A connection checked out for one call.
enum Checked {
    Http1 {
        sender: http1::SendRequest<Body>,
        /// Whether an earlier call used it: a call it refuses before sending may be retried.
        reused: bool,
        host: Option<HeaderValue>,
    },
    Http2(http2::SendRequest<Body>),
}

impl Pool {
    pub(super) fn new(connector: Connector, http2_only: bool) -> Pool {
        Pool {
            connector,
            http2_only,
            origins: Arc::default(),
            sweeping: AtomicBool::new(false),
        }
    }

    fn origins(&self) -> MutexGuard<'_, Origins> {
        locked(&self.origins)
    }

    /// Sends `req` to `uri` and reads the whole answer (up to
    /// [`MAX_ANSWER_BYTES`](super::failure::MAX_ANSWER_BYTES)); an
    /// HTTP/1 connection read to its end is kept for the next call.
    pub(super) async fn exchange(
        &self,
        uri: &Uri,
        mut req: Request<Body>,
    ) -> Result<(Parts, Bytes), Failure> {
        loop {
            match self.checkout(uri).await? {
                Checked::Http2(mut sender) => {
                    *req.uri_mut() = uri.clone();
                    let resp = sender
                        .send_request(req)
                        .await
                        .map_err(|e| Failure::classify(&e, false))?;
                    let (head, body) = resp.into_parts();
                    return Ok((head, read_capped(body).await?));
                }
                Checked::Http1 {
                    mut sender,
                    reused,
                    host,
                } => {
                    // HTTP/1 sends the path alone; the Host header names the origin.
                    if let Some(path) = uri.path_and_query() {
                        *req.uri_mut() = Uri::from(path.clone());
                    }
                    if let Some(host) = host {
                        req.headers_mut().entry(HOST).or_insert(host);
                    }
                    match sender.try_send_request(req).await {
                        Ok(resp) => {
                            let (head, body) = resp.into_parts();
                            let body = read_capped(body).await?;
                            self.put(uri, sender);
                            return Ok((head, body));
                        }
                        Err(mut e) => match e.take_message() {
                            // A kept connection closed before the call went out on it (the
                            // remote ended it while idle): the call goes on another.
                            Some(again) if reused => req = again,
                            _ => return Err(Failure::classify(e.error(), false)),
                        },
                    }
                }
            }
        }
    }

    /// Gives back an HTTP/1 connection whose answer was read to its end.
    fn put(&self, uri: &Uri, sender: http1::SendRequest<Body>) {
        if sender.is_closed() {
            return;
        }
        let mut origins = self.origins();
        let sweeps = origins.sweeps;
        if let Some(origin) = origins.list.iter_mut().find(|o| o.is(uri)) {
            if origin.idle.len() < MAX_IDLE {
                origin.idle.push((sender, sweeps));
            }
        }
    }

    /// Closes, every [`SWEEP_EVERY`], the connections idle since the sweep before and those
    /// their remote closed, until the pool is dropped (its agent removed or replaced by a
    /// reload).
    fn sweep_idle(&self) {
        if self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let origins: Weak<Mutex<Origins>> = Arc::downgrade(&self.origins);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                let Some(origins) = origins.upgrade() else {
                    return;
                };
                let mut origins = locked(&origins);
                origins.sweeps += 1;
                let sweeps = origins.sweeps;
                for origin in origins.list.iter_mut() {
                    origin
                        .idle
                        .retain(|(sender, since)| !sender.is_closed() && sweeps - since < 2);
                    if origin.shared.as_ref().is_some_and(|h2| h2.is_closed()) {
                        origin.shared = None;
                    }
                }
            }
        });
    }

    async fn checkout(&self, uri: &Uri) -> Result<Checked, Failure> {
        loop {
            let (found, host) = {
                let mut origins = self.origins();
                let at = match origins.list.iter().position(|o| o.is(uri)) {
                    Some(at) => at,
                    None => {
                        origins.list.push(Origin::of(uri));
                        origins.list.len() - 1
                    }
                };
                let origin = &mut origins.list[at];
                if let Some(h2) = origin.shared.as_ref().filter(|h2| !h2.is_closed()) {
                    return Ok(Checked::Http2(h2.clone()));
                }
                (origin.idle.pop(), origin.host.clone())
            };
            match found {
                Some((mut sender, _)) => {
                    // Ready at once unless the connection is still finishing the last
                    // answer; an error means the remote closed it.
                    if sender.ready().await.is_ok() {
                        return Ok(Checked::Http1 {
                            sender,
                            reused: true,
                            host,
                        });
                    }
                }
                // Boxed: connecting is rare, and its handshakes inline would make every
                // call's future (copied as it moves) as large as a TLS connection.
                None => return Box::pin(self.connect(uri, host)).await,
            }
        }
    }

    async fn connect(&self, uri: &Uri, host: Option<HeaderValue>) -> Result<Checked, Failure> {
        self.sweep_idle();
        let io = self
            .connector
            .clone()
            .call(uri.clone())
            .await
            .map_err(|e| Failure::classify(&*e, true))?;
        if self.http2_only || io.connected().is_negotiated_h2() {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake(io)
                .await
                .map_err(|e| Failure::classify(&e, true))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "an upstream HTTP/2 connection ended");
                }
            });
            if let Some(origin) = self.origins().list.iter_mut().find(|o| o.is(uri)) {
                origin.shared = Some(sender.clone());
            }
            return Ok(Checked::Http2(sender));
        }
        let (sender, conn) = http1::handshake(io)
            .await
            .map_err(|e| Failure::classify(&e, true))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "an upstream HTTP/1 connection ended");
            }
        });
        Ok(Checked::Http1 {
            sender,
            reused: false,
            host,
        })
    }
}

fn locked(origins: &Mutex<Origins>) -> MutexGuard<'_, Origins> {
    // A panic while the list was held leaves it whole (every change is one push or pop).
    origins.lock().unwrap_or_else(|e| e.into_inner())
}

//! Connections, before any HTTP: at most `max` open at once and `per_ip` from one address,
//! the excess refused at once (a 503 and close) so the descriptors left keep health checks
//! and every other caller answering; and a connection that sends nothing within the header
//! timeout is closed. (actix's own header timeout starts only once a first byte has come,
//! when it tells HTTP/1 from h2c: a silent connection would otherwise stay open forever.)

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::dev::{Service, ServiceFactory};
use tokio::net::TcpStream;

/// The shared counts; one per listener, shared by every worker.
pub(crate) struct ConnectionLimits {
    max: usize,
    per_ip: usize,
    first_byte: Duration,
    open: AtomicUsize,
    by_ip: Mutex<HashMap<IpAddr, usize>>,
    /// Refused at `max`, and at `per_ip`.
    refused: [AtomicU64; 2],
}

/// A connection's place in the counts, given back when it closes.
pub(crate) struct Admitted {
    limits: Arc<ConnectionLimits>,
    ip: Option<IpAddr>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.limits.open.fetch_sub(1, Ordering::AcqRel);
        if let Some(ip) = self.ip {
            let mut by_ip = self.limits.lock();
            if let Some(n) = by_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    by_ip.remove(&ip);
                }
            }
        }
    }
}

impl ConnectionLimits {
    pub(crate) fn new(max: usize, per_ip: usize, first_byte: Duration) -> Arc<ConnectionLimits> {
        Arc::new(ConnectionLimits {
            max: max.max(1),
            per_ip: per_ip.max(1),
            first_byte,
            open: AtomicUsize::new(0),
            by_ip: Mutex::default(),
            refused: Default::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.by_ip.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a new connection from `ip`, or None when either cap is reached.
    pub(crate) fn admit(self: &Arc<Self>, ip: Option<IpAddr>) -> Option<Admitted> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.refused[0].fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if let Some(ip) = ip {
            let mut by_ip = self.lock();
            let n = by_ip.entry(ip).or_default();
            if *n >= self.per_ip {
                drop(by_ip);
                self.open.fetch_sub(1, Ordering::AcqRel);
                self.refused[1].fetch_add(1, Ordering::Relaxed);
                return None;
            }
            *n += 1;
        }
        Some(Admitted {
            limits: self.clone(),
            ip,
        })
    }

    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Connections refused so far, by the cap that refused them.
    pub(crate) fn refused(&self) -> [(&'static str, u64); 2] {
        let [max, per_ip] = &self.refused;
        [
            ("max_connections", max.load(Ordering::Relaxed)),
            ("per_ip", per_ip.load(Ordering::Relaxed)),
        ]
    }

    pub(crate) fn limit(&self) -> usize {
        self.max
    }
}

/// What a refused connection is told before it is closed: HTTP/1 clients read a 503.
static REFUSAL: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let body =
        crate::error::status_body(503, "too many connections; retry later", None).to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
});

/// Wraps the HTTP service factory of a listener with the connection limits.
pub(crate) struct Gate<F> {
    pub(crate) inner: F,
    pub(crate) limits: Arc<ConnectionLimits>,
}

type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

impl<F> ServiceFactory<TcpStream> for Gate<F>
where
    F: ServiceFactory<TcpStream, Config = (), Response = ()>,
    F::Service: 'static,
    F::Future: 'static,
{
    type Response = ();
    type Error = F::Error;
    type Config = ();
    type Service = GateService<F::Service>;
    type InitError = F::InitError;
    type Future = LocalFuture<Result<Self::Service, Self::InitError>>;

    fn new_service(&self, cfg: ()) -> Self::Future {
        let inner = self.inner.new_service(cfg);
        let limits = self.limits.clone();
        Box::pin(async move {
            Ok(GateService {
                inner: Rc::new(inner.await?),
                limits,
            })
        })
    }
}

pub(crate) struct GateService<S> {
    inner: Rc<S>,
    limits: Arc<ConnectionLimits>,
}

impl<S> Service<TcpStream> for GateService<S>
where
    S: Service<TcpStream, Response = ()> + 'static,
{
    type Response = ();
    type Error = S::Error;
    type Future = LocalFuture<Result<(), S::Error>>;

    actix_web::dev::forward_ready!(inner);

    fn call(&self, io: TcpStream) -> Self::Future {
        let ip = io.peer_addr().ok().map(|a| a.ip());
        let admitted = self.limits.admit(ip);
        let inner = self.inner.clone();
        let first_byte = self.limits.first_byte;
        Box::pin(async move {
            let Some(_place) = admitted else {
                // Best effort, and briefly: a refusal must cost next to nothing.
                let mut io = io;
                let refuse = tokio::io::AsyncWriteExt::write_all(&mut io, &REFUSAL);
                let _ = tokio::time::timeout(Duration::from_millis(100), refuse).await;
                return Ok(());
            };
            let mut byte = [0u8; 1];
            match tokio::time::timeout(first_byte, io.peek(&mut byte)).await {
                Ok(Ok(n)) if n > 0 => inner.call(io).await,
                // Silent past the header timeout, closed, or broken: nothing to serve.
                _ => Ok(()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_the_total_and_each_address_and_frees_on_drop() {
        let limits = ConnectionLimits::new(3, 2, Duration::from_secs(1));
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let a1 = limits.admit(Some(a)).unwrap();
        let _a2 = limits.admit(Some(a)).unwrap();
        assert!(limits.admit(Some(a)).is_none(), "per address");
        let _b1 = limits.admit(Some(b)).unwrap();
        assert!(limits.admit(Some(b)).is_none(), "in all");
        assert_eq!(limits.open(), 3);
        drop(a1);
        assert_eq!(limits.open(), 2);
        assert!(limits.admit(Some(b)).is_some());
        let refusal = String::from_utf8(REFUSAL.clone()).unwrap();
        let (head, body) = refusal.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["status"], "UNAVAILABLE");
    }
}

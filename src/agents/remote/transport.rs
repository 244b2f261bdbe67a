//! Unary calls to a remote agent (send, get, cancel, list) and card fetches, straight over
//! hyper's client connections (kept in [`Pool`]).
//!
//! reqwest, which still carries streams (for its body stream), runs every request through its
//! redirect layer, and that layer parses the URL again from a string (IDNA included) and
//! clones the client stack on each call: about 7% of the gateway's CPU on the proxy's hot
//! path. A JSON-RPC POST to an agent has no business following redirects anyway.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;

use super::failure::Failure;
use super::pool::Pool;
use super::resolve::GuardedResolver;
use crate::config::A2aConfig;
use crate::protocol::Dialect;

pub(super) struct Transport {
    pool: Pool,
    /// The agent file's `headers`; the gateway's own headers win over them.
    headers: HeaderMap,
    timeout: Duration,
}

impl Transport {
    pub(super) fn new(
        config: &A2aConfig,
        headers: HeaderMap,
        resolver: GuardedResolver,
    ) -> Result<Transport, String> {
        let mut http = HttpConnector::new_with_resolver(resolver);
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(config.connect_timeout_secs)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(config)?)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        Ok(Transport {
            pool: Pool::new(https, config.http2),
            headers,
            timeout: Duration::from_secs(config.timeout_secs),
        })
    }

    /// POSTs a JSON body and returns the whole response body, whatever its status: a
    /// JSON-RPC error arrives with any status, and the caller reads it from the body.
    /// `timeout_secs` covers the whole exchange, reading the answer included.
    pub(super) async fn post_json(
        &self,
        uri: &Uri,
        version: Option<(HeaderName, HeaderValue)>,
        extensions: Option<(HeaderName, HeaderValue)>,
        secrets: bool,
        body: Vec<u8>,
    ) -> Result<Bytes, Failure> {
        let mut req = Request::new(Full::new(Bytes::from(body)));
        *req.method_mut() = Method::POST;
        let h = req.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let asked = extensions.is_some();
        for (name, value) in version.into_iter().chain(extensions) {
            h.insert(name, value);
        }
        for (name, value) in trace_headers(uri) {
            h.insert(name, value);
        }
        // The agent file's headers go only to the origin the file names.
        for (name, value) in self.headers.iter().filter(|_| secrets) {
            h.entry(name).or_insert_with(|| value.clone());
        }
        let exchange = async {
            let (head, body) = self.pool.exchange(uri, req).await?;
            if asked {
                note_activated(&head.headers);
            }
            Ok(body)
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| Failure::Timeout)?
    }
}

/// How many redirects a card fetch follows (on the card URL's own origin only).
const MAX_CARD_REDIRECTS: usize = 5;

impl Transport {
    /// GETs the card at `url` with the agent file's headers (a card URL is on the file's
    /// origin), following redirects on that origin only: the headers must not reach
    /// another host. `timeout_secs` covers every hop.
    pub(super) async fn get_card(&self, url: &str) -> Result<Bytes, String> {
        let first = url::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
        let exchange = async {
            let mut at = first.clone();
            for _ in 0..=MAX_CARD_REDIRECTS {
                let uri: Uri = at.as_str().parse().map_err(|e| format!("{at}: {e}"))?;
                let mut req = Request::new(Full::new(Bytes::new()));
                let h = req.headers_mut();
                h.insert("a2a-version", HeaderValue::from_static("1.0"));
                for (name, value) in self.headers.iter() {
                    h.entry(name).or_insert_with(|| value.clone());
                }
                let (head, body) = self
                    .pool
                    .exchange(&uri, req)
                    .await
                    .map_err(|f| f.detail())?;
                let status = head.status;
                if status.is_redirection() {
                    let next = head
                        .headers
                        .get(http::header::LOCATION)
                        .and_then(|l| l.to_str().ok())
                        .and_then(|l| at.join(l).ok())
                        .ok_or_else(|| format!("HTTP {status} without a usable Location"))?;
                    if next.origin() != first.origin() {
                        return Err("the card redirects to another origin".to_string());
                    }
                    at = next;
                    continue;
                }
                if !status.is_success() {
                    return Err(format!("HTTP {status}"));
                }
                return Ok(body);
            }
            Err("too many redirects".to_string())
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| "timed out".to_string())?
    }
}

/// TLS towards the upstream: the system's roots, plus the agent file's `ca_file`, and its
/// client certificate when it gives one. One configuration for every client of the agent
/// (calls, streams, card fetches, gRPC).
pub(super) fn tls_config(config: &A2aConfig) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    // The system's roots as reqwest loads them: unreadable ones are skipped, and a machine
    // with none still reaches plain-HTTP agents.
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(error = %e, "skipping a system root certificate");
    }
    roots.add_parsable_certificates(native.certs);
    let pem_certs = |path: &std::path::Path, setting: &str| {
        CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("backend.{setting} {}: {e}", path.display()))
    };
    if let Some(ca) = &config.ca_file {
        for cert in pem_certs(ca, "ca_file")? {
            roots
                .add(cert)
                .map_err(|e| format!("backend.ca_file {}: {e}", ca.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("setting up TLS: {e}"))?
        .with_root_certificates(roots);
    match (&config.client_cert_file, &config.client_key_file) {
        (Some(cert), Some(key)) => {
            let chain = pem_certs(cert, "client_cert_file")?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("backend.client_key_file {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("backend.client_cert_file: {e}"))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// The extensions the caller asked for, in the header an upstream of `dialect` reads
/// (`A2A-Extensions` in 1.0, `X-A2A-Extensions` in 0.3); none when it asked for none.
pub(super) fn extension_header(dialect: Dialect) -> Option<(HeaderName, HeaderValue)> {
    let asked = crate::telemetry::noted(|c| c.extensions_asked.clone()).flatten()?;
    let name = HeaderName::from_static(crate::protocol::extensions_header(dialect));
    Some((name, HeaderValue::from_str(&asked).ok()?))
}

/// Notes the extensions an upstream's answer says it activated, for the caller's answer.
pub(super) fn note_activated(headers: &HeaderMap) {
    let value = crate::protocol::extensions_in(|name| headers.get(name).map(|v| v.as_bytes()));
    if let Some(value) = value {
        crate::telemetry::note(|c| c.extensions_activated = Some(value.to_string()));
    }
}

/// The trace context for a call to the upstream at `peer` (W3C `traceparent` and its
/// `tracestate`): the call's client span when spans are exported, else a child of the
/// caller's; none when there is neither.
pub(super) fn trace_headers(peer: &Uri) -> impl Iterator<Item = (HeaderName, HeaderValue)> {
    let (parent, state) = match crate::telemetry::upstream_call(peer) {
        Some((parent, state)) => (Some(parent), state),
        None => (None, None),
    };
    let header = |name: &'static str, value: Option<String>| {
        value
            .and_then(|v| HeaderValue::from_str(&v).ok())
            .map(|v| (HeaderName::from_static(name), v))
    };
    header("traceparent", parent)
        .into_iter()
        .chain(header("tracestate", state))
}

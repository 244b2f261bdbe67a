//! TLS at the front door: the gateway's certificate (`[server.tls]`), with HTTP/2 offered
//! by ALPN, swapped in place when its files change or on SIGHUP so that a renewed
//! certificate takes effect for new connections while open ones go on; a file that does
//! not load keeps the certificate in use.
//!
//! With `client_ca_file`, client certificates issued by that CA are verified in the
//! handshake (expiry included) and become credentials: the connection carries the
//! identity `client_identity` reads off the leaf, and `auth` decides what it may do.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix_http::Protocol;
use actix_service::{fn_service, ServiceFactory, ServiceFactoryExt as _};
use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::rejections::JsonRejections;
use crate::config::{ClientAuth, ClientIdentity, TlsSettings};

/// What the HTTP service is handed for a TLS connection.
pub(crate) type TlsConnection = JsonRejections<TlsStream<TcpStream>>;

/// Marks a connection that came over TLS (its requests' URLs say https).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OverTls;

/// The identity of the verified client certificate a connection presented.
#[derive(Clone, Debug)]
pub(crate) struct ClientCertificate(pub(crate) Arc<str>);

/// The certificate in use, and the files it is read from again; and the verifier of
/// client certificates, when they are asked for.
#[derive(Debug)]
pub(crate) struct Certificate {
    current: ArcSwap<CertifiedKey>,
    cert_file: PathBuf,
    key_file: PathBuf,
    clients: Option<(Arc<dyn ClientCertVerifier>, ClientIdentity)>,
}

impl Certificate {
    /// The certificate chain and key in the PEM files `[server.tls]` names (relative to
    /// `base`), and its client CA; an error names the file.
    pub(crate) fn load(tls: &TlsSettings, base: &Path) -> Result<Certificate, String> {
        let (cert_file, key_file) = (base.join(&tls.cert_file), base.join(&tls.key_file));
        let clients = match &tls.client_ca_file {
            Some(ca) => Some((
                client_verifier(&base.join(ca), tls.client_auth)?,
                tls.client_identity,
            )),
            None => None,
        };
        Ok(Certificate {
            current: ArcSwap::from_pointee(read(&cert_file, &key_file)?),
            cert_file,
            key_file,
            clients,
        })
    }

    /// The identity of the client certificate a TLS session was verified with; empty when
    /// the certificate lacks the name `client_identity` reads (refused as a credential).
    pub(crate) fn client_of(&self, session: &rustls::ServerConnection) -> Option<Arc<str>> {
        let (_, kind) = self.clients.as_ref()?;
        let leaf = session.peer_certificates()?.first()?;
        Some(Arc::from(identity(leaf, *kind).unwrap_or_default()))
    }

    /// Reads the files again: the new certificate serves new connections; a file that does
    /// not load leaves the one in use, and says why.
    pub(crate) fn reload(&self) -> Result<(), String> {
        let fresh = read(&self.cert_file, &self.key_file)?;
        if fresh.cert != self.current.load().cert {
            self.current.store(Arc::new(fresh));
            tracing::info!(cert = %self.cert_file.display(), "TLS certificate reloaded");
        }
        Ok(())
    }

    /// The server side of TLS with this certificate: TLS 1.2 and 1.3, HTTP/2 and HTTP/1.1
    /// offered by ALPN, client certificates verified when they are asked for.
    pub(crate) fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, String> {
        self.config_for(&[b"h2", b"http/1.1"])
    }

    /// The same for the gRPC port, which speaks HTTP/2 only.
    pub(crate) fn grpc_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, String> {
        self.config_for(&[b"h2"])
    }

    fn config_for(self: &Arc<Self>, alpn: &[&[u8]]) -> Result<Arc<rustls::ServerConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &self.clients {
            Some((verifier, _)) => builder.with_client_cert_verifier(verifier.clone()),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(self.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Verifies client certificates against the CAs in `ca_file` (chain, expiry, client-auth
/// usage); `optional` lets a client without one through as anonymous.
fn client_verifier(
    ca_file: &Path,
    auth: ClientAuth,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let error =
        |e: &dyn std::fmt::Display| format!("server.tls.client_ca_file {}: {e}", ca_file.display());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).map_err(|e| error(&e))? {
        roots
            .add(cert.map_err(|e| error(&e))?)
            .map_err(|e| error(&e))?;
    }
    if roots.is_empty() {
        return Err(error(&"no certificate in it"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let builder = match auth {
        ClientAuth::Optional => builder.allow_unauthenticated(),
        ClientAuth::Required => builder,
    };
    builder.build().map_err(|e| error(&e))
}

/// The name `kind` reads off a certificate: its subject's common name, or its first
/// subject alternative name of a type.
fn identity(leaf: &CertificateDer<'_>, kind: ClientIdentity) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    if kind == ClientIdentity::CommonName {
        let cn = cert.subject().iter_common_name().next()?;
        return cn.as_str().ok().map(str::to_owned);
    }
    let san = cert.subject_alternative_name().ok()??;
    san.value
        .general_names
        .iter()
        .find_map(|name| match (kind, name) {
            (ClientIdentity::Dns, GeneralName::DNSName(n))
            | (ClientIdentity::Uri, GeneralName::URI(n))
            | (ClientIdentity::Email, GeneralName::RFC822Name(n)) => Some(n.to_string()),
            _ => None,
        })
}

fn read(cert_file: &Path, key_file: &Path) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect())
        .map_err(|e| format!("server.tls.cert_file {}: {e}", cert_file.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "server.tls.cert_file {}: no certificate in it",
            cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("server.tls.key_file {}: {e}", key_file.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    let signer = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("server.tls.key_file {}: {e}", key_file.display()))?;
    let key = CertifiedKey::new(chain, signer);
    key.keys_match().map_err(|e| {
        format!(
            "server.tls: the key in {} is not the certificate's ({e})",
            key_file.display()
        )
    })?;
    Ok(key)
}

/// Answers a plain HTTP request (its first byte is a method's letter; a TLS handshake
/// starts with 0x16) with a 400 naming the scheme to use, then closes. The request is read
/// first, so that closing does not reset the connection before the client reads the answer.
async fn plain_http_refused(mut io: TcpStream, until: tokio::time::Instant) -> io::Error {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut head = vec![0u8; 8192];
    let mut read = 0;
    let _ = tokio::time::timeout_at(until, async {
        while read < head.len() {
            match io.read(&mut head[read..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
            if head[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    let body =
        "This port speaks HTTPS: the plain HTTP request was sent to a TLS port. Use https://.\n";
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout_at(until, async {
        io.write_all(answer.as_bytes()).await?;
        io.shutdown().await?;
        // What is left of the request (a body) is read, not reset, until the client closes.
        while io.read(&mut head).await? > 0 {}
        Ok::<_, io::Error>(())
    })
    .await;
    io::Error::new(
        io::ErrorKind::InvalidData,
        "plain HTTP sent to the TLS port",
    )
}

/// TLS in front of the HTTP service: the handshake must finish within `handshake` (the
/// header deadline: a client that never finishes holds nothing longer than one that never
/// sends its headers), then ALPN says which HTTP it speaks. Plain HTTP sent to this port is
/// answered with a plain 400 that says so (as nginx does), rather than bytes a client
/// reads as HTTP/0.9; anything else that is not TLS fails its handshake and is closed.
pub(crate) fn tls_with_json_rejections<F>(
    http: F,
    config: Arc<rustls::ServerConfig>,
    handshake: Duration,
) -> impl ServiceFactory<TcpStream, Config = (), Response = (), Error = F::Error, InitError = ()>
where
    F: ServiceFactory<
        (
            JsonRejections<TlsStream<TcpStream>>,
            Protocol,
            Option<SocketAddr>,
        ),
        Config = (),
        Response = (),
        InitError = (),
    >,
    F::Error: From<io::Error>,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    fn_service(move |io: TcpStream| {
        let acceptor = acceptor.clone();
        async move {
            let peer = io.peer_addr().ok();
            super::rejections::no_delay(&io);
            // One deadline for the first byte and the handshake together.
            let until = tokio::time::Instant::now() + handshake;
            let mut first = [0u8; 1];
            let peeked = tokio::time::timeout_at(until, io.peek(&mut first)).await;
            if matches!(peeked, Ok(Ok(1))) && first[0].is_ascii_uppercase() {
                return Err(plain_http_refused(io, until).await.into());
            }
            let tls = tokio::time::timeout_at(until, acceptor.accept(io))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))?
                .inspect_err(|e| tracing::debug!(error = %e, ?peer, "TLS handshake failed"))?;
            let protocol = match tls.get_ref().1.alpn_protocol() {
                Some(b"h2") => Protocol::Http2,
                _ => Protocol::Http1,
            };
            Ok::<_, F::Error>((JsonRejections::new(tls), protocol, peer))
        }
    })
    .and_then(http)
}

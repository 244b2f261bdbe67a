//! TLS to PostgreSQL, as libpq's `sslmode` asks for it in the URL: `require` encrypts
//! without checking the server's certificate (unless `sslrootcert` names roots: then as
//! `verify-ca`), `verify-ca` checks that it chains to the roots, `verify-full` also that it
//! names the host connected to. The roots are the `sslrootcert` file's (PEM), else the
//! system's. `disable`, `allow` and `prefer` (the default) connect without TLS.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::POSTGRES_SSL_MODES as MODES;

/// The URL as the driver takes it (libpq's TLS settings it does not read taken out,
/// `sslmode=require` left for it to insist on TLS), and the TLS connector the URL asks for.
pub(super) fn prepare(url: &str) -> Result<(String, Option<MakeRustlsConnect>), String> {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return Ok((url.to_string(), None));
    };
    let pairs: Vec<(String, String)> = (parsed.query_pairs())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let setting = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let (mode, root_file) = (setting("sslmode"), setting("sslrootcert"));
    let tls = match mode.as_deref() {
        None => false,
        Some(mode) => MODES
            .iter()
            .find(|(m, _)| *m == mode)
            .map(|(_, tls)| *tls)
            .ok_or_else(|| format!("store.url: sslmode={mode} is none of {}", mode_names()))?,
    };
    if !tls {
        if root_file.is_some() {
            parsed = without(parsed, &pairs, &["sslrootcert"], None);
        }
        return Ok((parsed.to_string(), None));
    }
    let mode = mode.unwrap_or_default();
    let roots = match &root_file {
        Some(path) => Some(roots_from(path)?),
        None if mode == "require" => None,
        None => Some(system_roots()),
    };
    let config = client_config(&mode, roots)?;
    let url = without(
        parsed,
        &pairs,
        &["sslmode", "sslrootcert"],
        Some(("sslmode", "require")),
    );
    Ok((url.to_string(), Some(MakeRustlsConnect::new(config))))
}

fn mode_names() -> String {
    MODES.iter().map(|(m, _)| *m).collect::<Vec<_>>().join(", ")
}

/// `url` with the settings `drop` taken out of its query, and `add` put in.
fn without(
    mut url: url::Url,
    pairs: &[(String, String)],
    drop: &[&str],
    add: Option<(&str, &str)>,
) -> url::Url {
    let kept: Vec<(&str, &str)> = (pairs.iter())
        .filter(|(k, _)| !drop.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(add)
        .collect();
    if kept.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(kept);
    }
    url
}

fn roots_from(path: &str) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::pem::PemObject;
    let failed = |e: &dyn std::fmt::Display| format!("store.url: sslrootcert {path}: {e}");
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| failed(&e))?;
    if certs.is_empty() {
        return Err(failed(&"no PEM certificate in it"));
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| failed(&e))?;
    }
    Ok(roots)
}

fn system_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    roots
}

fn client_config(
    mode: &str,
    roots: Option<rustls::RootCertStore>,
) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("store: setting up TLS to PostgreSQL: {e}"))?;
    let verifier = |roots: rustls::RootCertStore| {
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| format!("store.url: sslrootcert: {e}"))
    };
    let config = match (mode, roots) {
        ("verify-full", Some(roots)) => builder
            .with_webpki_verifier(verifier(roots)?)
            .with_no_client_auth(),
        (_, Some(roots)) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyName(verifier(roots)?)))
            .with_no_client_auth(),
        (_, None) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
            .with_no_client_auth(),
    };
    Ok(config)
}

/// `verify-ca`: the certificate must chain to the roots, whatever host it names.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        // The chain is checked before the name: a name error means the chain held.
        match (self.0).verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` without roots (libpq's meaning): encrypted, the certificate not checked; the
/// handshake's signatures still are.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_gets_the_url_without_libpqs_tls_settings() {
        let (url, tls) =
            prepare("postgres://u@h:5432/db?sslmode=require&application_name=x").unwrap();
        assert!(tls.is_some());
        assert_eq!(
            url,
            "postgres://u@h:5432/db?application_name=x&sslmode=require"
        );
        let (url, tls) = prepare("postgres://u@h/db?sslmode=disable").unwrap();
        assert!(tls.is_none());
        assert_eq!(url, "postgres://u@h/db?sslmode=disable");
        let (url, tls) = prepare("postgres://u@h/db").unwrap();
        assert!(tls.is_none());
        assert_eq!(url, "postgres://u@h/db");
        let err = prepare("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent.pem")
            .err()
            .unwrap();
        assert!(err.contains("sslrootcert /nonexistent.pem"), "{err}");
        let err = prepare("postgres://u@h/db?sslmode=sometimes")
            .err()
            .unwrap();
        assert!(
            err.contains("sslmode=sometimes is none of disable, allow"),
            "{err}"
        );
    }
}

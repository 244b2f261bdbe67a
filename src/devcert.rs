//! `a2a-gateway cert dev [DIR]`: a local certificate authority and a server certificate it
//! signed, for serving HTTPS on a development machine. The server certificate names
//! localhost, 127.0.0.1 and ::1 as subject alternative names (what clients check; a
//! CN-only certificate fails on `https://127.0.0.1:8080`). The CA is made once and kept:
//! running it again issues a new server certificate under the CA already trusted.

use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{Datelike, Duration, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A certificate's time at the start of `at`'s day (month and day of a valid date are in
/// range).
macro_rules! day {
    ($at:expr) => {{
        let at = $at;
        rcgen::date_time_ymd(at.year(), at.month() as u8, at.day() as u8)
    }};
}

const CA_NAME: &str = "a2a-gateway development CA";

/// The names every development certificate carries, before those asked for.
pub(crate) const LOCAL_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// What was written, as absolute paths.
pub(crate) struct Issued {
    pub(crate) ca_cert: PathBuf,
    pub(crate) ca_made: bool,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    pub(crate) names: Vec<String>,
    pub(crate) expires: String,
}

/// Writes `ca.pem` and `ca.key` (unless both are there), then `server.pem` and `server.key`
/// for [`LOCAL_NAMES`] and `extra` names (host names or IP addresses) into `dir`.
pub(crate) fn issue(dir: &Path, extra: &[String]) -> Result<Issued, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let dir = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (ca_cert, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let now = Utc::now();
    let (ca, ca_made) = match (ca_cert.exists(), ca_key.exists()) {
        (true, true) => {
            let pem = read(&ca_key)?;
            let key = KeyPair::from_pem(&pem)
                .map_err(|e| format!("{}: not a private key: {e}", ca_key.display()))?;
            // The same name and key as the CA file already trusted: what it signs chains
            // to that file (clients match an issuer by name and key, not by this copy).
            (authority(key, now)?, false)
        }
        (false, false) => {
            let key = KeyPair::generate().map_err(|e| e.to_string())?;
            let made = authority(key, now)?;
            write(&ca_cert, &made.0.pem(), false)?;
            write(&ca_key, &made.1.serialize_pem(), true)?;
            (made, true)
        }
        (true, false) => {
            return Err(format!(
                "{} is there without {}: remove it to make a new CA",
                ca_cert.display(),
                ca_key.display()
            ))
        }
        (false, true) => {
            return Err(format!(
                "{} is there without {}: remove it to make a new CA",
                ca_key.display(),
                ca_cert.display()
            ))
        }
    };
    let mut names: Vec<String> = LOCAL_NAMES.iter().map(|n| n.to_string()).collect();
    for name in extra {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    let mut params = CertificateParams::new(names.clone())
        .map_err(|e| format!("a name cannot go in a certificate: {e}"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    // 397 days: what browsers accept of a server certificate.
    let expires = now + Duration::days(397);
    (params.not_before, params.not_after) = (day!(now - Duration::days(1)), day!(expires));
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let cert = params
        .signed_by(&key, &ca.0, &ca.1)
        .map_err(|e| format!("signing the server certificate: {e}"))?;
    let (cert_file, key_file) = (dir.join("server.pem"), dir.join("server.key"));
    write(&cert_file, &cert.pem(), false)?;
    write(&key_file, &key.serialize_pem(), true)?;
    Ok(Issued {
        ca_cert,
        ca_made,
        cert: cert_file,
        key: key_file,
        names,
        expires: expires.format("%Y-%m-%d").to_string(),
    })
}

fn authority(
    key: KeyPair,
    now: chrono::DateTime<Utc>,
) -> Result<(rcgen::Certificate, KeyPair), String> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params.distinguished_name.push(DnType::CommonName, CA_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (params.not_before, params.not_after) = (
        day!(now - Duration::days(1)),
        day!(now + Duration::days(3650)),
    );
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("signing the CA: {e}"))?;
    Ok((cert, key))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `text` to `path` through a temporary file; a private key readable by its owner only.
fn write(path: &Path, text: &str, private: bool) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let temporary = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&temporary).map_err(fail)?;
    file.write_all(text.as_bytes()).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    std::fs::rename(&temporary, path).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_made_once_and_the_server_names_are_the_local_ones_and_those_asked() {
        let dir = tempfile::tempdir().unwrap();
        let first = issue(dir.path(), &["gw.test".into(), "localhost".into()]).unwrap();
        assert!(first.ca_made);
        assert_eq!(first.names, ["localhost", "127.0.0.1", "::1", "gw.test"]);
        let ca = std::fs::read(&first.ca_cert).unwrap();
        let second = issue(dir.path(), &[]).unwrap();
        assert!(!second.ca_made);
        assert_eq!(std::fs::read(&second.ca_cert).unwrap(), ca);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&second.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the key is its owner's only");
    }

    #[test]
    fn half_a_ca_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), "x").unwrap();
        let e = issue(dir.path(), &[]).err().unwrap();
        assert!(e.contains("ca.key") && e.contains("remove it"), "{e}");
        std::fs::remove_file(dir.path().join("ca.pem")).unwrap();
        std::fs::write(dir.path().join("ca.key"), "not a key").unwrap();
        std::fs::write(dir.path().join("ca.pem"), "x").unwrap();
        let e = issue(dir.path(), &[]).err().unwrap();
        assert!(e.contains("not a private key"), "{e}");
    }
}

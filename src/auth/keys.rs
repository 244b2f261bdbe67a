//! Keys issued at runtime through the admin API. Each is kept as a [`KeyRecord`] in the
//! store (its secret only as a SHA-256 digest) and found by the digest of what a request
//! presents, in a map: a runtime key costs one lookup after the file keys' compare, whatever
//! how many there are. A rotated key's previous secret works until the grace it was given.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{parse_hex32, tier_of, Principal, Scope};

/// What a runtime key's secret starts with: recognizable in a log or a leaked file (and by
/// secret scanners), before 32 random bytes (base64url).
pub(crate) const SECRET_PREFIX: &str = "a2agw_";

/// A runtime key as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct KeyRecord {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) description: String,
    /// Agents it may call; `["*"]`: all.
    pub(crate) agents: Vec<String>,
    #[serde(default)]
    pub(crate) tier: Option<String>,
    #[serde(default)]
    pub(crate) expires_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub(crate) metadata: serde_json::Map<String, serde_json::Value>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) created_by: String,
    /// The hex SHA-256 of its secret.
    pub(crate) digest: String,
    /// The secret it had before its last rotation, working until `until`.
    #[serde(default)]
    pub(crate) previous: Option<PreviousSecret>,
    #[serde(default)]
    pub(crate) rotated_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub(crate) revoked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PreviousSecret {
    pub(crate) digest: String,
    pub(crate) until: DateTime<Utc>,
}

/// A new secret: the prefix and 32 random bytes; with its hex digest, which is all that is
/// kept of it.
pub(crate) fn new_secret() -> (String, String) {
    use base64::Engine as _;
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 32];
    // The system's random source; it does not fail on the systems the gateway runs on.
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        bytes = rand_fallback();
    }
    let secret = format!(
        "{SECRET_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let digest = hex(&super::digest(secret.as_bytes()));
    (secret, digest)
}

/// Random bytes from two v4 UUIDs (their generator's own randomness).
fn rand_fallback() -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    out[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    out
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// One runtime key in force.
pub(crate) struct RuntimeKey {
    pub(crate) id: String,
    principal: Principal,
    expires_ms: Option<i64>,
    revoked: bool,
    /// When it was last used here (ms since the epoch; 0: not since this replica started).
    last_used: AtomicI64,
}

struct Found {
    key: Arc<RuntimeKey>,
    /// A previous secret's: valid until then (ms).
    until_ms: Option<i64>,
}

/// The runtime keys in force, by the digests of their secrets.
#[derive(Default)]
pub(crate) struct KeyRing {
    by_digest: HashMap<[u8; 32], Found>,
    keys: Vec<Arc<RuntimeKey>>,
}

/// A runtime key's refusal, for the audit log.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub(crate) id: String,
    pub(crate) reason: String,
    pub(crate) from: Option<std::net::IpAddr>,
    pub(crate) at: DateTime<Utc>,
}

/// Refusals waiting for the audit log; past this many, more are dropped (and counted in
/// the log line that says so), not queued without bound.
const REFUSALS_QUEUED: usize = 1024;

/// The runtime keys in force, and where their refusals go.
pub(crate) struct RuntimeKeys {
    pub(crate) ring: arc_swap::ArcSwap<KeyRing>,
    refusals: tokio::sync::mpsc::Sender<Refusal>,
    dropped: std::sync::atomic::AtomicU64,
}

impl RuntimeKeys {
    /// None in force yet; the refusals are read from the receiver.
    pub(crate) fn new() -> (RuntimeKeys, tokio::sync::mpsc::Receiver<Refusal>) {
        let (tx, rx) = tokio::sync::mpsc::channel(REFUSALS_QUEUED);
        let keys = RuntimeKeys {
            ring: Default::default(),
            refusals: tx,
            dropped: Default::default(),
        };
        (keys, rx)
    }

    /// A runtime key was refused (`reason`) to a client at `from`.
    pub(crate) fn refused(&self, id: &str, reason: &str, from: Option<std::net::IpAddr>) {
        let refusal = Refusal {
            id: id.to_string(),
            reason: reason.to_string(),
            from,
            at: Utc::now(),
        };
        if self.refusals.try_send(refusal).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(dropped = n, "runtime key refusals come faster than the audit log takes them; some are not audited");
            }
        }
    }
}

/// Refreshes a key's last use no more often than this (a shared write per request would
/// have every worker write one cache line).
const USE_GRAIN_MS: i64 = 1_000;

impl KeyRing {
    /// The ring for `records`, keeping what `old` knew of when each was last used.
    pub(crate) fn build(records: &[KeyRecord], old: &KeyRing) -> KeyRing {
        let mut ring = KeyRing::default();
        for r in records {
            let Some(digest) = parse_hex32(&r.digest) else {
                tracing::warn!(key = %r.id, "a runtime key's digest does not read; it is left out");
                continue;
            };
            let last_used = (old.keys.iter().find(|k| k.id == r.id))
                .map_or(0, |k| k.last_used.load(Ordering::Relaxed));
            let key = Arc::new(RuntimeKey {
                id: r.id.clone(),
                principal: Principal {
                    id: Arc::from(format!("key:{}", r.id)),
                    scope: Scope::from_list(r.agents.iter().cloned()),
                    anonymous: false,
                    tier: tier_of(&r.tier),
                    claims: None,
                    address: None,
                },
                expires_ms: r.expires_at.map(|t| t.timestamp_millis()),
                revoked: r.revoked_at.is_some(),
                last_used: AtomicI64::new(last_used),
            });
            ring.by_digest.insert(
                digest,
                Found {
                    key: key.clone(),
                    until_ms: None,
                },
            );
            if let Some(previous) = &r.previous {
                if let Some(d) = parse_hex32(&previous.digest) {
                    let until_ms = Some(previous.until.timestamp_millis());
                    let found = Found {
                        key: key.clone(),
                        until_ms,
                    };
                    ring.by_digest.insert(d, found);
                }
            }
            ring.keys.push(key);
        }
        ring
    }

    /// The key a secret with this digest is: its principal, or why it is refused (its id
    /// and the reason); None when no runtime key has it.
    pub(crate) fn find(&self, digest: &[u8; 32]) -> Option<Result<Principal, (String, String)>> {
        let found = self.by_digest.get(digest)?;
        let key = &found.key;
        let now = Utc::now().timestamp_millis();
        let refused = |reason: &str| Some(Err((key.id.clone(), reason.to_string())));
        if key.revoked {
            return refused("revoked");
        }
        if key.expires_ms.is_some_and(|at| at <= now) {
            return refused("expired");
        }
        if found.until_ms.is_some_and(|until| until <= now) {
            return refused("a secret replaced by rotation, past its grace");
        }
        if now - key.last_used.load(Ordering::Relaxed) >= USE_GRAIN_MS {
            key.last_used.store(now, Ordering::Relaxed);
        }
        Some(Ok(key.principal.clone()))
    }

    /// When each key was last used here, for those used since `since` (ms).
    pub(crate) fn used_since(&self, since: i64) -> Vec<(String, i64)> {
        (self.keys.iter())
            .map(|k| (k.id.clone(), k.last_used.load(Ordering::Relaxed)))
            .filter(|(_, at)| *at > since)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, digest: &str) -> KeyRecord {
        KeyRecord {
            id: id.into(),
            description: String::new(),
            agents: vec!["echo".into()],
            tier: Some("gold".into()),
            expires_at: None,
            metadata: Default::default(),
            created_at: Utc::now(),
            created_by: "admin-key:ops".into(),
            digest: digest.into(),
            previous: None,
            rotated_at: None,
            revoked_at: None,
        }
    }

    #[test]
    fn keys_are_found_by_digest_and_refused_when_revoked_expired_or_rotated_out() {
        let (secret, digest) = new_secret();
        assert!(secret.starts_with(SECRET_PREFIX) && secret.len() > 40);
        let d = super::super::digest(secret.as_bytes());
        let ring = KeyRing::build(&[record("k1", &digest)], &KeyRing::default());
        let p = ring.find(&d).unwrap().unwrap();
        assert_eq!((&*p.id, &*p.tier), ("key:k1", "gold"));
        assert!(p.scope.allows("echo") && !p.scope.allows("other"));
        assert!(ring.find(&[0; 32]).is_none());
        assert_eq!(ring.used_since(0).len(), 1);

        let mut revoked = record("k1", &digest);
        revoked.revoked_at = Some(Utc::now());
        let ring2 = KeyRing::build(&[revoked], &ring);
        assert_eq!(ring2.find(&d).unwrap().unwrap_err().1, "revoked");
        // What the old ring knew of its use is carried over.
        assert_eq!(ring2.used_since(0).len(), 1);

        let mut expired = record("k1", &digest);
        expired.expires_at = Some(Utc::now() - chrono::TimeDelta::seconds(1));
        let ring3 = KeyRing::build(&[expired], &ring);
        assert_eq!(ring3.find(&d).unwrap().unwrap_err().1, "expired");

        let (new, new_digest) = new_secret();
        let mut rotated = record("k1", &new_digest);
        rotated.previous = Some(PreviousSecret {
            digest: digest.clone(),
            until: Utc::now() + chrono::TimeDelta::seconds(60),
        });
        let ring4 = KeyRing::build(&[rotated.clone()], &ring);
        assert!(
            ring4.find(&d).unwrap().is_ok(),
            "the old secret in its grace"
        );
        assert!(ring4
            .find(&super::super::digest(new.as_bytes()))
            .unwrap()
            .is_ok());
        rotated.previous.as_mut().unwrap().until = Utc::now() - chrono::TimeDelta::seconds(1);
        let ring5 = KeyRing::build(&[rotated], &ring);
        assert!(ring5.find(&d).unwrap().is_err(), "past its grace");
    }
}

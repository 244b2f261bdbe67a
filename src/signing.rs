//! The gateway's signatures, with a P-256 key whose public half is served at
//! `/.well-known/jwks.json`: on notifications an ES256 JWT, so a receiver can check that a
//! notification comes from the gateway, was meant for its URL, is fresh, and carries the
//! body that was signed; on cards a detached JWS over the card's canonical form.

use std::path::Path;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// How long a notification's JWT is valid: long enough for a slow receiver, short enough
/// that a captured one is soon useless.
const LIFETIME_SECS: u64 = 300;

pub(crate) struct Signer {
    key: jsonwebtoken::EncodingKey,
    kid: String,
    jwk: Value,
    issuer: String,
}

impl Signer {
    /// The key in `path` (PKCS#8 PEM, P-256), or one made now; `setting` is the setting
    /// that named the file, for errors.
    pub(crate) fn load(path: Option<&Path>, issuer: &str, setting: &str) -> Result<Signer, String> {
        let der = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("{setting} {}: {e}", path.display()))?;
                pem_pkcs8(&text).map_err(|e| format!("{setting} {}: {e}", path.display()))?
            }
            None => {
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
                    .map_err(|_| "could not make a push signing key".to_string())?
                    .as_ref()
                    .to_vec()
            }
        };
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &SystemRandom::new())
                .map_err(|e| format!("{setting}: not a P-256 PKCS#8 key ({e})"))?;
        // The uncompressed point: 0x04, then x and y.
        let point = pair.public_key().as_ref();
        let (x, y) = (
            URL_SAFE_NO_PAD.encode(&point[1..33]),
            URL_SAFE_NO_PAD.encode(&point[33..65]),
        );
        // RFC 7638 thumbprint: the required members, in lexical order, without spaces.
        let canonical = format!(r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#);
        let kid = URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()));
        let jwk = json!({
            "kty": "EC", "crv": "P-256", "x": x, "y": y,
            "use": "sig", "alg": "ES256", "kid": kid,
        });
        Ok(Signer {
            key: jsonwebtoken::EncodingKey::from_ec_der(&der),
            kid,
            jwk,
            issuer: issuer.to_string(),
        })
    }

    /// The JWKS document (one key).
    pub(crate) fn jwks(&self) -> Value {
        json!({ "keys": [self.jwk] })
    }

    /// The public key, as a JWK.
    pub(crate) fn jwk(&self) -> &Value {
        &self.jwk
    }

    /// A detached JWS (RFC 7515, appendix F) over `payload`: the protected header (ES256,
    /// this key's id) and the signature, each base64url.
    pub(crate) fn detached(&self, payload: &[u8]) -> Result<(String, String), String> {
        let header = json!({"alg": "ES256", "kid": self.kid, "typ": "JOSE"});
        let protected = URL_SAFE_NO_PAD.encode(header.to_string());
        let input = format!("{protected}.{}", URL_SAFE_NO_PAD.encode(payload));
        let signature =
            jsonwebtoken::crypto::sign(input.as_bytes(), &self.key, jsonwebtoken::Algorithm::ES256)
                .map_err(|e| e.to_string())?;
        Ok((protected, signature))
    }

    /// A token for one notification to `audience` (the webhook URL) carrying `body`.
    pub(crate) fn sign(
        &self,
        audience: &str,
        task_id: &str,
        body: &[u8],
    ) -> Result<String, String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let digest = Sha256::digest(body);
        let claims = json!({
            "iss": self.issuer,
            "aud": audience,
            "iat": now,
            "exp": now + LIFETIME_SECS,
            "jti": uuid::Uuid::new_v4().to_string(),
            "taskId": task_id,
            "request_body_sha256": hex(&digest),
        });
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, &claims, &self.key).map_err(|e| e.to_string())
    }
}

/// The form a card's signature covers: RFC 8785 (JCS) of the card without `signatures`
/// and without empty (default-valued) members, as the official SDKs canonicalize.
pub(crate) fn canonical_card(card: &Value) -> Result<String, serde_json::Error> {
    let mut card = card.clone();
    if let Some(obj) = card.as_object_mut() {
        obj.remove("signatures");
    }
    let cleaned = without_empty(card).unwrap_or_else(|| json!({}));
    serde_json_canonicalizer::to_string(&cleaned)
}

/// `value` without empty strings, arrays and objects, nor nulls, at any depth (an object
/// or array left empty by that goes too).
fn without_empty(value: Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::Array(items) => {
            let kept: Vec<Value> = items.into_iter().filter_map(without_empty).collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        Value::Object(members) => {
            let kept: serde_json::Map<String, Value> = members
                .into_iter()
                .filter_map(|(k, v)| without_empty(v).map(|v| (k, v)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        other => Some(other),
    }
}

/// Whether one of `card`'s signatures (detached JWS over [`canonical_card`]) verifies
/// against `keys`, the key its header names (or any, when it names none). Only public-key
/// algorithms: an HMAC signature cannot be checked with a JWKS's public keys.
pub(crate) fn verify_card(card: &Value, keys: &jsonwebtoken::jwk::JwkSet) -> Result<(), String> {
    let signatures = card["signatures"]
        .as_array()
        .filter(|s| !s.is_empty())
        .ok_or("the card carries no signature")?;
    let payload = canonical_card(card).map_err(|e| e.to_string())?;
    let encoded = URL_SAFE_NO_PAD.encode(payload);
    let mut why = String::from("no signature verifies against the keys");
    for signature in signatures {
        let (Some(protected), Some(value)) = (
            signature["protected"].as_str(),
            signature["signature"].as_str(),
        ) else {
            why = "a signature lacks its protected header or its value".into();
            continue;
        };
        let header = URL_SAFE_NO_PAD
            .decode(protected)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<jsonwebtoken::Header>(&bytes).ok());
        let Some(header) = header else {
            why = "a protected header does not decode".into();
            continue;
        };
        use jsonwebtoken::Algorithm::{HS256, HS384, HS512};
        if matches!(header.alg, HS256 | HS384 | HS512) {
            why = format!("{:?} is not a public-key signature", header.alg);
            continue;
        }
        let input = format!("{protected}.{encoded}");
        let candidates = keys
            .keys
            .iter()
            .filter(|k| header.kid.is_none() || k.common.key_id == header.kid);
        for jwk in candidates {
            let Ok(key) = jsonwebtoken::DecodingKey::from_jwk(jwk) else {
                continue;
            };
            if jsonwebtoken::crypto::verify(value, input.as_bytes(), &key, header.alg) == Ok(true) {
                return Ok(());
            }
        }
    }
    Err(why)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// The DER inside a `PRIVATE KEY` PEM block.
fn pem_pkcs8(text: &str) -> Result<Vec<u8>, String> {
    if text.contains("BEGIN EC PRIVATE KEY") {
        return Err("this is a SEC1 key; convert it with `openssl pkcs8 -topk8 -nocrypt` (or make one with `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`)".into());
    }
    let begin = "-----BEGIN PRIVATE KEY-----";
    let end = "-----END PRIVATE KEY-----";
    let start = text
        .find(begin)
        .ok_or("no -----BEGIN PRIVATE KEY----- block")?
        + begin.len();
    let stop = text[start..]
        .find(end)
        .ok_or("the PEM block does not end")?
        + start;
    let b64: String = text[start..stop].split_whitespace().collect();
    STANDARD
        .decode(b64)
        .map_err(|e| format!("the PEM block is not base64 ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_card_verifies_and_a_changed_one_does_not() {
        let signer = Signer::load(None, "g", "k").unwrap();
        let mut card = json!({"name": "a", "description": "b", "skills": []});
        let payload = canonical_card(&card).unwrap();
        let (protected, signature) = signer.detached(payload.as_bytes()).unwrap();
        card["signatures"] = json!([{"protected": protected, "signature": signature}]);
        let keys: jsonwebtoken::jwk::JwkSet = serde_json::from_value(signer.jwks()).unwrap();
        assert_eq!(verify_card(&card, &keys), Ok(()));
        card["description"] = json!("changed");
        assert!(verify_card(&card, &keys).is_err());
        let other = Signer::load(None, "g", "k").unwrap();
        let others: jsonwebtoken::jwk::JwkSet = serde_json::from_value(other.jwks()).unwrap();
        card["description"] = json!("b");
        assert!(verify_card(&card, &others).is_err());
        assert!(verify_card(&json!({"name": "a"}), &keys)
            .unwrap_err()
            .contains("no signature"));
    }

    #[test]
    fn a_token_verifies_with_the_served_key_only_for_its_audience() {
        let signer = Signer::load(None, "a2a-gateway", "k").unwrap();
        let token = signer.sign("https://hooks.example/a", "t1", b"{}").unwrap();
        let set: jsonwebtoken::jwk::JwkSet = serde_json::from_value(signer.jwks()).unwrap();
        let key = jsonwebtoken::DecodingKey::from_jwk(&set.keys[0]).unwrap();
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
        v.set_audience(&["https://hooks.example/a"]);
        let data = jsonwebtoken::decode::<Value>(&token, &key, &v).unwrap();
        assert_eq!(data.claims["taskId"], "t1");
        assert_eq!(data.header.kid.as_deref(), Some(signer.kid.as_str()));
        v.set_audience(&["https://elsewhere.example/"]);
        assert!(jsonwebtoken::decode::<Value>(&token, &key, &v).is_err());
    }

    #[test]
    fn a_key_file_is_read_and_wrong_ones_are_named() {
        let dir = std::env::temp_dir().join(format!("push-key-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let doc =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
                .unwrap();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            STANDARD.encode(doc.as_ref())
        );
        let path = dir.join("key.pem");
        std::fs::write(&path, pem).unwrap();
        let a = Signer::load(Some(&path), "g", "k").unwrap();
        let b = Signer::load(Some(&path), "g", "k").unwrap();
        assert_eq!(a.kid, b.kid, "the same file gives the same key");
        std::fs::write(&path, "-----BEGIN EC PRIVATE KEY-----\nAAAA\n").unwrap();
        let refused = |p: &Path| Signer::load(Some(p), "g", "k").err().unwrap_or_default();
        assert!(refused(&path).contains("SEC1"));
        assert!(refused(&dir.join("missing.pem")).contains("missing.pem"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! JWT verification with the algorithm pinned per issuer: a token signed any other way,
//! including `none` or an HMAC over a public key, is refused by construction.

use std::collections::HashSet;
use std::sync::Arc;

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use serde_json::Value;

use super::{Principal, Scope};
use crate::config::JwtConfig;

enum Keys {
    One(DecodingKey),
    /// From a JWKS: by `kid`, each key usable only with the pinned algorithm.
    Set(Vec<(Option<String>, DecodingKey)>),
}

pub struct JwtVerifier {
    id: String,
    keys: Keys,
    validation: Validation,
    agents_claim: String,
    tier: Arc<str>,
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

impl JwtVerifier {
    pub fn build(cfg: &JwtConfig) -> Result<JwtVerifier, String> {
        let alg = match cfg.algorithm.as_str() {
            "HS256" => Algorithm::HS256,
            "RS256" => Algorithm::RS256,
            "ES256" => Algorithm::ES256,
            other => {
                return Err(format!(
                    "algorithm must be HS256, RS256 or ES256, got \"{other}\""
                ))
            }
        };
        let keys = match alg {
            Algorithm::HS256 => {
                let secret = match (&cfg.secret_env, &cfg.secret_file) {
                    (Some(var), None) => std::env::var(var)
                        .map_err(|_| format!("environment variable {var} is not set"))?
                        .into_bytes(),
                    (None, Some(path)) => read(path)?,
                    _ => return Err("HS256 needs exactly one of secret_env, secret_file".into()),
                };
                let secret = String::from_utf8_lossy(&secret).trim().as_bytes().to_vec();
                if secret.len() < 32 {
                    return Err("an HS256 secret must be at least 32 bytes".into());
                }
                Keys::One(DecodingKey::from_secret(&secret))
            }
            _ => match (&cfg.public_key_file, &cfg.jwks_file) {
                (Some(path), None) => {
                    let pem = read(path)?;
                    let key = if alg == Algorithm::RS256 {
                        DecodingKey::from_rsa_pem(&pem)
                    } else {
                        DecodingKey::from_ec_pem(&pem)
                    };
                    Keys::One(key.map_err(|e| format!("{}: {e}", path.display()))?)
                }
                (None, Some(path)) => {
                    let set: JwkSet = serde_json::from_slice(&read(path)?)
                        .map_err(|e| format!("{}: not a JWKS: {e}", path.display()))?;
                    let keys = set
                        .keys
                        .iter()
                        .filter_map(|k| {
                            DecodingKey::from_jwk(k)
                                .ok()
                                .map(|d| (k.common.key_id.clone(), d))
                        })
                        .collect::<Vec<_>>();
                    if keys.is_empty() {
                        return Err(format!("{}: no usable keys", path.display()));
                    }
                    Keys::Set(keys)
                }
                _ => {
                    return Err(format!(
                        "{} needs exactly one of public_key_file, jwks_file",
                        cfg.algorithm
                    ))
                }
            },
        };
        let mut validation = Validation::new(alg);
        validation.leeway = cfg.leeway_secs;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp"]);
        if let Some(iss) = &cfg.issuer {
            validation.set_issuer(&[iss]);
        }
        match &cfg.audience {
            Some(aud) => validation.set_audience(&[aud]),
            None => validation.validate_aud = false,
        }
        Ok(JwtVerifier {
            id: cfg.id.clone(),
            keys,
            validation,
            agents_claim: cfg.agents_claim.clone(),
            tier: super::tier_of(&cfg.tier),
        })
    }

    /// The principal a token stands for, or why it was refused (for the log).
    pub fn verify(&self, token: &str) -> Result<Principal, String> {
        let header = decode_header(token).map_err(|e| format!("jwt {}: {e}", self.id))?;
        if header.alg != self.validation.algorithms[0] {
            return Err(format!(
                "jwt {}: algorithm {:?} is not the pinned one",
                self.id, header.alg
            ));
        }
        let key = match &self.keys {
            Keys::One(k) => k,
            Keys::Set(set) => set
                .iter()
                .find(|(kid, _)| header.kid.is_none() || *kid == header.kid)
                .map(|(_, k)| k)
                .ok_or_else(|| format!("jwt {}: no key with kid {:?}", self.id, header.kid))?,
        };
        let data = decode::<Value>(token, key, &self.validation)
            .map_err(|e| format!("jwt {}: {e}", self.id))?;
        let claims = data.claims;
        let sub = claims["sub"].as_str().unwrap_or("-");
        let agents: Vec<String> = match &claims[&self.agents_claim] {
            Value::Array(a) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            Value::String(s) => s.split_whitespace().map(str::to_string).collect(),
            _ => Vec::new(),
        };
        Ok(Principal {
            id: Arc::from(format!("jwt:{}:{sub}", self.id)),
            scope: if agents.is_empty() {
                Scope::Agents(HashSet::new())
            } else {
                Scope::from_list(agents)
            },
            anonymous: false,
            tier: self.tier.clone(),
        })
    }
}

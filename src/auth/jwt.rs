//! JWT verification with the algorithm pinned per issuer: a token signed any other way,
//! including `none` or an HMAC over a public key, is refused by construction.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use serde_json::Value;

use super::{Principal, Scope};
use crate::config::JwtConfig;

type KeySet = Vec<(Option<String>, DecodingKey)>;

enum Keys {
    One(DecodingKey),
    /// From a JWKS file: by `kid`, each key usable only with the pinned algorithm.
    Set(KeySet),
    /// From a JWKS URL: empty until first fetched, then replaced at each refresh.
    Remote(Arc<RwLock<KeySet>>),
}

/// A JWKS URL to keep fetched.
pub(crate) struct JwksSource {
    pub(crate) issuer_id: String,
    pub(crate) url: String,
    pub(crate) refresh: Duration,
    keys: Arc<RwLock<KeySet>>,
}

fn key_set(set: &JwkSet) -> KeySet {
    set.keys
        .iter()
        .filter_map(|k| {
            DecodingKey::from_jwk(k)
                .ok()
                .map(|d| (k.common.key_id.clone(), d))
        })
        .collect()
}

impl JwksSource {
    /// Fetches the key set once; on failure the previous keys stay in use.
    pub(crate) async fn fetch(&self, client: &reqwest::Client) -> Result<usize, String> {
        let set: JwkSet = client
            .get(&self.url)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| format!("fetching {}: {e}", self.url))?
            .json()
            .await
            .map_err(|e| format!("{}: not a JWKS: {e}", self.url))?;
        let keys = key_set(&set);
        let n = keys.len();
        *self
            .keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = keys;
        Ok(n)
    }

    /// Fetches now and then every refresh period, for as long as its verifier is in use
    /// (a reload that replaces the credentials ends the loop).
    pub(crate) async fn keep_fresh(self) {
        let client = reqwest::Client::new();
        let JwksSource {
            issuer_id,
            url,
            refresh,
            keys,
        } = self;
        let keys = Arc::downgrade(&keys);
        while let Some(keys) = keys.upgrade() {
            let source = JwksSource {
                issuer_id: issuer_id.clone(),
                url: url.clone(),
                refresh,
                keys,
            };
            let wait = match source.fetch(&client).await {
                Ok(_) => refresh,
                Err(e) => {
                    tracing::warn!(issuer = %issuer_id, error = %e, "JWKS unavailable");
                    refresh.min(Duration::from_secs(5))
                }
            };
            drop(source);
            tokio::time::sleep(wait).await;
        }
    }
}

pub(super) struct JwtVerifier {
    id: String,
    keys: Keys,
    validation: Validation,
    agents_claim: String,
    tier: Arc<str>,
    source: Option<(String, Duration)>,
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

impl JwtVerifier {
    pub(super) fn build(cfg: &JwtConfig) -> Result<JwtVerifier, String> {
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
                (None, None) if cfg.jwks_url.is_some() => Keys::Remote(Arc::default()),
                (Some(path), None) if cfg.jwks_url.is_none() => {
                    let pem = read(path)?;
                    let key = if alg == Algorithm::RS256 {
                        DecodingKey::from_rsa_pem(&pem)
                    } else {
                        DecodingKey::from_ec_pem(&pem)
                    };
                    Keys::One(key.map_err(|e| format!("{}: {e}", path.display()))?)
                }
                (None, Some(path)) if cfg.jwks_url.is_none() => {
                    let set: JwkSet = serde_json::from_slice(&read(path)?)
                        .map_err(|e| format!("{}: not a JWKS: {e}", path.display()))?;
                    let keys = key_set(&set);
                    if keys.is_empty() {
                        return Err(format!("{}: no usable keys", path.display()));
                    }
                    Keys::Set(keys)
                }
                _ => {
                    return Err(format!(
                        "{} needs exactly one of public_key_file, jwks_file, jwks_url",
                        cfg.algorithm
                    ))
                }
            },
        };
        let mut validation = Validation::new(alg);
        validation.leeway = cfg.leeway_secs;
        validation.validate_nbf = true;
        // A configured issuer or audience is required in every token, not only checked
        // when present; and every token names its subject, which becomes the principal:
        // tokens without one would all share one principal and see each other's tasks.
        let mut required = vec!["exp", "sub"];
        if let Some(iss) = &cfg.issuer {
            validation.set_issuer(&[iss]);
            required.push("iss");
        }
        match &cfg.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                required.push("aud");
            }
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        Ok(JwtVerifier {
            id: cfg.id.clone(),
            keys,
            validation,
            agents_claim: cfg.agents_claim.clone(),
            tier: super::tier_of(&cfg.tier),
            source: cfg
                .jwks_url
                .clone()
                .map(|u| (u, Duration::from_secs(cfg.jwks_refresh_secs.max(1)))),
        })
    }

    /// The JWKS URL this verifier depends on, to be kept fetched.
    pub(super) fn jwks_source(&self) -> Option<JwksSource> {
        let (url, refresh) = self.source.clone()?;
        match &self.keys {
            Keys::Remote(keys) => Some(JwksSource {
                issuer_id: self.id.clone(),
                url,
                refresh,
                keys: keys.clone(),
            }),
            _ => None,
        }
    }

    /// The principal a token stands for and its `exp`, or why it was refused (for the log).
    pub(super) fn verify(&self, token: &str) -> Result<(Principal, i64), String> {
        let header = decode_header(token).map_err(|e| format!("jwt {}: {e}", self.id))?;
        if header.alg != self.validation.algorithms[0] {
            return Err(format!(
                "jwt {}: algorithm {:?} is not the pinned one",
                self.id, header.alg
            ));
        }
        let pick = |set: &KeySet| {
            set.iter()
                .find(|(kid, _)| header.kid.is_none() || *kid == header.kid)
                .map(|(_, k)| k.clone())
                .ok_or_else(|| format!("jwt {}: no key with kid {:?}", self.id, header.kid))
        };
        let key = match &self.keys {
            Keys::One(k) => k.clone(),
            Keys::Set(set) => pick(set)?,
            Keys::Remote(set) => pick(
                &set.read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            )?,
        };
        let data = decode::<Value>(token, &key, &self.validation)
            .map_err(|e| format!("jwt {}: {e}", self.id))?;
        let claims = data.claims;
        let exp = claims["exp"].as_i64().unwrap_or(0);
        let sub = match claims["sub"].as_str() {
            Some(sub) if !sub.is_empty() => sub,
            _ => {
                return Err(format!(
                    "jwt {}: the sub claim is missing or empty",
                    self.id
                ))
            }
        };
        let agents: Vec<String> = match &claims[&self.agents_claim] {
            Value::Array(a) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            Value::String(s) => s.split_whitespace().map(str::to_string).collect(),
            _ => Vec::new(),
        };
        let id = Arc::from(format!("jwt:{}:{sub}", self.id));
        let principal = Principal {
            id,
            scope: if agents.is_empty() {
                Scope::Agents(HashSet::new())
            } else {
                Scope::from_list(agents)
            },
            anonymous: false,
            tier: self.tier.clone(),
            // Kept for policies (`caller.claims`).
            claims: match claims {
                Value::Object(map) => Some(Arc::new(map)),
                _ => None,
            },
            address: None,
        };
        Ok((principal, exp))
    }
}

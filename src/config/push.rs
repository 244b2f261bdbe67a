//! `[push]`: push notifications, and where the gateway may send them.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Diagnostic, Diagnostics};

#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PushSettings {
    /// Cards say `pushNotifications: true`, and the push methods work; off, they answer
    /// -32003.
    #[serde(default)]
    pub enabled: bool,
    /// Webhooks may use plain `http://` (by default only `https://`).
    #[serde(default)]
    pub allow_http: bool,
    /// Addresses (`10.0.0.0/8`, `127.0.0.1`, `fd00::/8`) and host names (`hooks.internal`)
    /// webhooks may reach although they are not public. Everything else that is loopback,
    /// private, link-local, multicast or reserved is refused.
    #[serde(default)]
    pub allow: Vec<String>,
    /// One delivery attempt, connecting included, gives up after this long.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Attempts per notification (the first included).
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// No notification is retried once this long has passed since its first attempt.
    #[serde(default = "default_retry_for_secs")]
    pub retry_for_secs: u64,
    /// The wait before the first retry; each retry doubles it (up to `max_backoff_secs`),
    /// with a random part so that many retries do not come back at once.
    #[serde(default = "default_backoff_ms")]
    pub initial_backoff_ms: u64,
    #[serde(default = "default_max_backoff_secs")]
    pub max_backoff_secs: u64,
    /// Deliveries in flight at once to one destination (scheme, host and port).
    #[serde(default = "default_per_destination")]
    pub max_per_destination: usize,
    /// Configs one task may have.
    #[serde(default = "default_configs_per_task")]
    pub max_configs_per_task: usize,
    /// Notifications waiting for one config; past it the oldest waiting update is dropped
    /// (counted), never the task's final one.
    #[serde(default = "default_queue")]
    pub max_queued_per_config: usize,
    /// The ES256 key (PKCS#8 PEM, P-256) the gateway signs notification JWTs with; its
    /// public half is served at `/.well-known/jwks.json`. Relative to the gateway file.
    /// Unset: a key made at start (receivers must then fetch the JWKS again after a
    /// restart, and replicas each have their own).
    #[serde(default)]
    pub signing_key_file: Option<PathBuf>,
    /// The base URL upstream agents reach the gateway at, for the webhooks the gateway
    /// registers with upstreams that push. Default: `public_url`. Neither set: the gateway
    /// watches upstream tasks instead (a stream, or polling).
    #[serde(default)]
    pub relay_url: Option<String>,
    /// How often an upstream task that cannot be streamed is polled.
    #[serde(default = "default_poll_secs")]
    pub poll_interval_secs: u64,
}

impl Default for PushSettings {
    fn default() -> Self {
        PushSettings {
            enabled: false,
            allow_http: false,
            allow: Vec::new(),
            timeout_secs: default_timeout_secs(),
            max_attempts: default_max_attempts(),
            retry_for_secs: default_retry_for_secs(),
            initial_backoff_ms: default_backoff_ms(),
            max_backoff_secs: default_max_backoff_secs(),
            max_per_destination: default_per_destination(),
            max_configs_per_task: default_configs_per_task(),
            max_queued_per_config: default_queue(),
            signing_key_file: None,
            relay_url: None,
            poll_interval_secs: default_poll_secs(),
        }
    }
}

fn default_timeout_secs() -> u64 {
    10
}
fn default_max_attempts() -> u32 {
    5
}
fn default_retry_for_secs() -> u64 {
    300
}
fn default_backoff_ms() -> u64 {
    500
}
fn default_max_backoff_secs() -> u64 {
    60
}
fn default_per_destination() -> usize {
    4
}
fn default_configs_per_task() -> usize {
    10
}
fn default_queue() -> usize {
    256
}
fn default_poll_secs() -> u64 {
    2
}

/// One `allow` entry: a network, or a host name allowed whatever it resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowEntry {
    Network(ipnet::IpNet),
    Host(String),
}

impl AllowEntry {
    pub fn parse(entry: &str) -> Result<AllowEntry, String> {
        let entry = entry.trim();
        if let Ok(net) = entry.parse::<ipnet::IpNet>() {
            return Ok(AllowEntry::Network(net.trunc()));
        }
        if let Ok(ip) = entry.parse::<std::net::IpAddr>() {
            return Ok(AllowEntry::Network(ipnet::IpNet::from(ip)));
        }
        let host = entry.trim_end_matches('.').to_ascii_lowercase();
        let valid = !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
            // All digits is an address written another way (2130706433), not a name.
            && !host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        if valid {
            Ok(AllowEntry::Host(host))
        } else {
            Err(format!(
                "\"{entry}\" is neither an address, a network (10.0.0.0/8) nor a host name"
            ))
        }
    }
}

pub(super) fn check(push: &PushSettings, file: &Path, diags: &mut Diagnostics) {
    let mut bad = |msg: String| diags.push(Diagnostic::file(file, msg));
    for entry in &push.allow {
        if let Err(e) = AllowEntry::parse(entry) {
            bad(format!("push.allow: {e}"));
        }
    }
    for (key, value, min, max) in [
        ("push.timeout_secs", push.timeout_secs, 1, 300),
        ("push.max_attempts", u64::from(push.max_attempts), 1, 100),
        ("push.retry_for_secs", push.retry_for_secs, 1, 7 * 24 * 3600),
        (
            "push.initial_backoff_ms",
            push.initial_backoff_ms,
            1,
            3_600_000,
        ),
        ("push.max_backoff_secs", push.max_backoff_secs, 1, 24 * 3600),
        (
            "push.max_per_destination",
            push.max_per_destination as u64,
            1,
            1000,
        ),
        (
            "push.max_configs_per_task",
            push.max_configs_per_task as u64,
            1,
            1000,
        ),
        (
            "push.max_queued_per_config",
            push.max_queued_per_config as u64,
            2,
            100_000,
        ),
        ("push.poll_interval_secs", push.poll_interval_secs, 1, 3600),
    ] {
        if !(min..=max).contains(&value) {
            bad(format!("{key} must be between {min} and {max}"));
        }
    }
    if let Some(url) = &push.relay_url {
        let ok = url::Url::parse(url)
            .ok()
            .is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host());
        if !ok {
            bad(format!(
                "push.relay_url must be an absolute http(s) URL, got \"{url}\""
            ));
        }
    }
}

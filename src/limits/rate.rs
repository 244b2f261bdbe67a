//! Request rate limits: per caller (by tier) and per agent, with the numbers a client needs
//! to pace itself (`X-RateLimit-*`).

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::auth::Principal;
use crate::config::{AuthConfig, RateLimitConfig};
use crate::error::GatewayError;
use crate::protocol::jsonrpc::Method;
use crate::protocol::Dialect;
use crate::store::Shared;

type Keyed =
    RateLimiter<String, DashMapStateStore<String>, DefaultClock, StateInformationMiddleware>;
type Direct = RateLimiter<NotKeyed, InMemoryState, DefaultClock, StateInformationMiddleware>;

/// What a limited response tells its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateInfo {
    pub(crate) limit: u32,
    pub(crate) remaining: u32,
    /// Seconds until the allowance is full again.
    pub(crate) reset_secs: u64,
}

impl RateInfo {
    /// The numbers as a response carries them (HTTP headers, gRPC metadata).
    pub(crate) fn headers(&self) -> [(&'static str, u64); 3] {
        [
            ("x-ratelimit-limit", self.limit.into()),
            ("x-ratelimit-remaining", self.remaining.into()),
            ("x-ratelimit-reset", self.reset_secs),
        ]
    }
}

struct Tier {
    limiter: Keyed,
    quota: Quota,
    max_streams: Option<usize>,
    /// What a call of a method costs, where not 1.
    weights: Vec<(&'static str, NonZeroU32)>,
}

impl Tier {
    /// What a call costs; `method` is asked only when the tier weighs methods.
    fn cost(&self, method: impl FnOnce() -> Option<&'static str>) -> NonZeroU32 {
        if self.weights.is_empty() {
            return NonZeroU32::MIN;
        }
        let method = method();
        let weight = method.and_then(|m| self.weights.iter().find(|(w, _)| *w == m));
        weight.map_or(NonZeroU32::MIN, |(_, n)| *n)
    }
}

/// Checks a tier's `weights`: 1.0 method names, each weight from 1 to the burst (a call
/// that costs more than the burst could never pass).
fn weights(
    name: &str,
    weights: &std::collections::BTreeMap<String, u32>,
    quota: Quota,
) -> Result<Vec<(&'static str, NonZeroU32)>, Vec<String>> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (method, weight) in weights {
        let known = match Method::lookup(method) {
            Some((m, Dialect::V10)) => m.name(),
            _ => {
                errors.push(format!(
                    "tiers.{name}.weights: \"{method}\" is not an A2A 1.0 method name (SendMessage, GetTask, ...)"
                ));
                continue;
            }
        };
        match NonZeroU32::new(*weight) {
            Some(n) if n <= quota.burst_size() => out.push((known, n)),
            _ => errors.push(format!(
                "tiers.{name}.weights.{method}: {weight} must be from 1 to the burst ({})",
                quota.burst_size()
            )),
        }
    }
    match errors.is_empty() {
        true => Ok(out),
        false => Err(errors),
    }
}

struct AgentLimit {
    limiter: Direct,
    quota: Quota,
}

pub(crate) struct RateLimits {
    tiers: HashMap<String, Tier>,
    agents: HashMap<String, AgentLimit>,
    /// Networks (a single address is a /32 or /128) whose `X-Forwarded-For` is believed.
    trusted: Vec<IpNet>,
}

fn quota(rpm: u32, burst: Option<u32>) -> Result<Quota, String> {
    let rpm = NonZeroU32::new(rpm).ok_or("requests_per_minute must be at least 1")?;
    let burst = burst.unwrap_or((rpm.get() / 10).max(1));
    let burst = NonZeroU32::new(burst).ok_or("burst must be at least 1")?;
    Ok(Quota::per_minute(rpm).allow_burst(burst))
}

/// One `trusted_proxies` entry: an address (`10.0.0.1`, `fd00::1`) or a network in CIDR
/// notation (`10.0.0.0/8`, `fd00::/8`; host bits are ignored: `10.1.2.3/8` is `10.0.0.0/8`).
fn trusted_proxy(entry: &str) -> Result<IpNet, String> {
    let text = entry.trim();
    let Some((addr, len)) = text.split_once('/') else {
        return text.parse::<IpAddr>().map(IpNet::from).map_err(|_| {
            format!(
                "\"{entry}\" is neither an IP address (10.0.0.1, fd00::1) nor a network (10.0.0.0/8, fd00::/8)"
            )
        });
    };
    let ip: IpAddr = addr.trim().parse().map_err(|_| {
        format!("\"{entry}\": \"{addr}\" before the / is not an IP address (a network is written 10.0.0.0/8 or fd00::/8)")
    })?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = len
        .trim()
        .parse::<u8>()
        .ok()
        .filter(|l| *l <= max)
        .ok_or_else(|| {
            format!("\"{entry}\": the prefix length \"{len}\" is not a number from 0 to {max}")
        })?;
    IpNet::new(ip, len)
        .map(|net| net.trunc())
        .map_err(|e| format!("\"{entry}\": {e}"))
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl RateLimits {
    pub(crate) fn build(
        cfg: &RateLimitConfig,
        auth: &AuthConfig,
    ) -> Result<RateLimits, Vec<String>> {
        let mut errors = Vec::new();
        let mut tiers = HashMap::new();
        for (name, t) in &cfg.tiers {
            match quota(t.requests_per_minute, t.burst) {
                Ok(q) => match weights(name, &t.weights, q) {
                    Ok(weights) => {
                        tiers.insert(
                            name.clone(),
                            Tier {
                                limiter: RateLimiter::keyed(q).with_middleware(),
                                quota: q,
                                max_streams: t.max_streams,
                                weights,
                            },
                        );
                    }
                    Err(e) => errors.extend(e),
                },
                Err(e) => errors.push(format!("tiers.{name}: {e}")),
            }
        }
        let mut agents = HashMap::new();
        for (name, a) in &cfg.agents {
            match quota(a.requests_per_minute, a.burst) {
                Ok(q) => {
                    agents.insert(
                        name.clone(),
                        AgentLimit {
                            limiter: RateLimiter::direct(q).with_middleware(),
                            quota: q,
                        },
                    );
                }
                Err(e) => errors.push(format!("agents.{name}: {e}")),
            }
        }
        let named = auth
            .api_keys
            .iter()
            .chain(&auth.bearer_tokens)
            .filter_map(|c| c.tier.as_deref())
            .chain(auth.jwt.iter().filter_map(|j| j.tier.as_deref()));
        for tier in named {
            if !tiers.contains_key(tier) {
                errors.push(format!(
                    "tier \"{tier}\" is used by a credential but not defined"
                ));
            }
        }
        let mut trusted = Vec::new();
        for p in &cfg.trusted_proxies {
            match trusted_proxy(p) {
                Ok(net) => trusted.push(net),
                Err(e) => errors.push(format!("trusted_proxies: {e}")),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(RateLimits {
            tiers,
            agents,
            trusted,
        })
    }

    /// Whether any proxy's `X-Forwarded-For` is believed.
    pub(crate) fn trusts_proxies(&self) -> bool {
        !self.trusted.is_empty()
    }

    /// Whether any limit is configured at all.
    pub(crate) fn active(&self) -> bool {
        !self.tiers.is_empty() || !self.agents.is_empty()
    }

    /// The client's address: the peer, or for a trusted proxy the nearest address in
    /// `X-Forwarded-For` that is not itself a trusted proxy.
    pub(crate) fn client_ip(
        &self,
        peer: Option<IpAddr>,
        forwarded_for: Option<&str>,
    ) -> Option<IpAddr> {
        let peer = peer?;
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        let Some(xff) = forwarded_for else {
            return Some(peer);
        };
        xff.rsplit(',')
            .filter_map(|a| a.trim().parse::<IpAddr>().ok())
            .find(|ip| !self.is_trusted(*ip))
            .or(Some(peer))
    }

    /// Whether `ip` is in one of the trusted proxies' networks. An IPv4 address mapped into
    /// IPv6 (`::ffff:10.0.0.1`, as a dual-stack socket reports IPv4 peers) is taken as the
    /// IPv4 address it is.
    fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The key a caller is counted under: its credential, or its address group when
    /// anonymous (see [`crate::auth::address_group`]).
    pub(crate) fn caller_key(&self, caller: &Principal, ip: Option<IpAddr>) -> String {
        if caller.anonymous {
            match ip {
                Some(ip) => format!("anon:{}", crate::auth::address_group(ip)),
                None => "anon:unknown".into(),
            }
        } else {
            caller.id.to_string()
        }
    }

    fn tier(&self, caller: &Principal) -> Option<&Tier> {
        self.tiers.get(caller.tier.as_ref())
    }

    /// Streams one caller may hold open, if limited.
    pub(crate) fn max_streams(&self, caller: &Principal) -> Option<usize> {
        self.tier(caller).and_then(|t| t.max_streams)
    }

    /// Forgets the callers whose allowance is full again: without this, every address that
    /// ever called would keep its bucket (memory grows with distinct callers). Run on a
    /// timer; a forgotten caller starts again with a full allowance, as it would have.
    pub(crate) fn prune(&self) {
        for tier in self.tiers.values() {
            tier.limiter.retain_recent();
            tier.limiter.shrink_to_fit();
        }
    }

    /// Callers with a bucket right now, over every tier.
    #[cfg(test)]
    fn tracked_callers(&self) -> usize {
        self.tiers.values().map(|t| t.limiter.len()).sum()
    }

    /// Counts one request. `Ok(None)` when nothing limits it; otherwise the tighter of the
    /// caller's and the agent's allowance, or the refusal. `key` names the caller's bucket;
    /// it is only worked out when a tier applies.
    pub(crate) fn check(
        &self,
        caller: &Principal,
        key: impl FnOnce() -> String,
        agent: &str,
        method: impl FnOnce() -> Option<&'static str>,
    ) -> Result<Option<RateInfo>, (GatewayError, RateInfo)> {
        let mut info: Option<RateInfo> = None;
        let mut tighten = |i: RateInfo| {
            if info.is_none_or(|cur| i.remaining < cur.remaining) {
                info = Some(i);
            }
        };
        if let Some(tier) = self.tier(caller) {
            let outcome = match tier.cost(method) {
                NonZeroU32::MIN => tier.limiter.check_key(&key()),
                n => {
                    let key = key();
                    // Never more than the burst (checked at load): always within capacity.
                    let checked = tier.limiter.check_key_n(&key, n);
                    checked.unwrap_or_else(|_| tier.limiter.check_key(&key))
                }
            };
            tighten(outcome_of(
                outcome,
                tier.limiter.clock(),
                tier.quota,
                "caller",
            )?);
        }
        if let Some(a) = self.agents.get(agent) {
            tighten(outcome_of(
                a.limiter.check(),
                a.limiter.clock(),
                a.quota,
                "agent",
            )?);
        }
        Ok(info)
    }

    /// [`Self::check`] against allowances every replica shares (GCRA, computed atomically in
    /// the shared store on its clock): the same numbers, whichever replica a call reaches.
    pub(crate) async fn check_shared(
        &self,
        shared: &Shared,
        caller: &Principal,
        key: impl FnOnce() -> String,
        agent: &str,
        method: impl FnOnce() -> Option<&'static str>,
    ) -> Result<Option<RateInfo>, (GatewayError, RateInfo)> {
        let mut info: Option<RateInfo> = None;
        if let Some(tier) = self.tier(caller) {
            let bucket = format!("tier:{}:{}", caller.tier, key());
            let cost = tier.cost(method);
            let i = gcra(shared, &bucket, tier.quota, cost, "caller").await?;
            info = Some(i);
        }
        if let Some(a) = self.agents.get(agent) {
            let bucket = format!("agent:{agent}");
            let i = gcra(shared, &bucket, a.quota, NonZeroU32::MIN, "agent").await?;
            if info.is_none_or(|cur| i.remaining < cur.remaining) {
                info = Some(i);
            }
        }
        Ok(info)
    }
}

/// A limiter's answer as the headers' numbers, or the refusal. The limiter's own clock says
/// how long a refused caller waits: a clock of the gateway's own would calibrate at start
/// (a loop of several million instructions) even with no limit configured.
fn outcome_of(
    outcome: Result<
        governor::middleware::StateSnapshot,
        governor::NotUntil<<DefaultClock as Clock>::Instant>,
    >,
    clock: &DefaultClock,
    quota: Quota,
    scope: &'static str,
) -> Result<RateInfo, (GatewayError, RateInfo)> {
    let limit = quota.burst_size().get();
    match outcome {
        Ok(snapshot) => {
            let remaining = snapshot.remaining_burst_capacity();
            let refill = quota.replenish_interval() * (limit - remaining);
            Ok(RateInfo {
                limit,
                remaining,
                reset_secs: ceil_secs(refill),
            })
        }
        Err(not_until) => {
            let wait = ceil_secs(not_until.wait_time_from(clock.now())).max(1);
            let info = RateInfo {
                limit,
                remaining: 0,
                reset_secs: wait,
            };
            Err((
                GatewayError::RateLimited {
                    scope,
                    retry_after: wait,
                },
                info,
            ))
        }
    }
}

async fn gcra(
    shared: &Shared,
    bucket: &str,
    quota: Quota,
    cost: NonZeroU32,
    scope: &'static str,
) -> Result<RateInfo, (GatewayError, RateInfo)> {
    let limit = quota.burst_size().get();
    let interval = quota.replenish_interval().as_micros().max(1) as u64;
    let result = shared.rate(bucket, interval, limit, cost.get()).await;
    let micros_to_secs = |us: i64| (us.max(0) as u64).div_ceil(1_000_000);
    match result {
        Ok((1, remaining, _, full_in)) => Ok(RateInfo {
            limit,
            remaining: remaining.clamp(0, i64::from(limit)) as u32,
            reset_secs: micros_to_secs(full_in),
        }),
        Ok((_, _, retry_in, _)) => {
            let wait = micros_to_secs(retry_in).max(1);
            Err((
                GatewayError::RateLimited {
                    scope,
                    retry_after: wait,
                },
                RateInfo {
                    limit,
                    remaining: 0,
                    reset_secs: wait,
                },
            ))
        }
        Err(e) => Err((
            GatewayError::StoreUnavailable(e),
            RateInfo {
                limit,
                remaining: 0,
                reset_secs: 1,
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AuthConfig, RateLimitConfig, TierConfig};

    /// Buckets of callers whose allowance is full again are dropped, so distinct
    /// addresses do not grow memory for ever.
    #[test]
    fn prune_forgets_callers_with_a_full_allowance() {
        let mut cfg = RateLimitConfig::default();
        cfg.tiers.insert(
            "default".into(),
            TierConfig {
                requests_per_minute: 600_000,
                burst: Some(1),
                max_streams: None,
                weights: Default::default(),
            },
        );
        let limits = RateLimits::build(&cfg, &AuthConfig::default()).unwrap();
        let anonymous = AuthConfig::default();
        let caller = crate::auth::Authenticator::build(&anonymous)
            .unwrap()
            .authenticate(crate::auth::Presented::default(), &Default::default())
            .unwrap();
        for i in 0..1000 {
            limits
                .check(
                    &caller,
                    || format!("ip:10.0.{}.{}", i / 256, i % 256),
                    "a",
                    || None,
                )
                .unwrap();
        }
        assert_eq!(limits.tracked_callers(), 1000);
        // At 10,000 a second the one-request allowance is full again within a millisecond.
        std::thread::sleep(Duration::from_millis(20));
        limits.prune();
        assert_eq!(limits.tracked_callers(), 0);
    }

    fn trusting(proxies: &[&str]) -> Result<RateLimits, Vec<String>> {
        let cfg = RateLimitConfig {
            trusted_proxies: proxies.iter().map(|p| p.to_string()).collect(),
            ..RateLimitConfig::default()
        };
        RateLimits::build(&cfg, &AuthConfig::default())
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    /// Networks and single addresses both name trusted proxies: a peer inside one is
    /// believed about who it forwards for, a peer outside is the caller itself.
    #[test]
    fn trusted_proxies_take_networks_and_single_addresses() {
        let limits = trusting(&["10.0.0.0/8", "fd00::/8", "192.0.2.7", "2001:db8::1"]).unwrap();
        let cases = [
            // (peer, X-Forwarded-For, the caller's address)
            ("10.1.2.3", Some("203.0.113.9"), "203.0.113.9"),
            (
                "10.255.255.255",
                Some("203.0.113.9, 10.4.4.4"),
                "203.0.113.9",
            ),
            ("fd12::5", Some("2001:db8::99"), "2001:db8::99"),
            ("192.0.2.7", Some("198.51.100.1"), "198.51.100.1"),
            ("2001:db8::1", Some("198.51.100.1"), "198.51.100.1"),
            // A dual-stack socket's view of an IPv4 proxy.
            ("::ffff:10.9.9.9", Some("198.51.100.2"), "198.51.100.2"),
            // Outside every trusted network: the header is the caller's own claim.
            ("11.0.0.1", Some("203.0.113.9"), "11.0.0.1"),
            ("192.0.2.8", Some("203.0.113.9"), "192.0.2.8"),
            ("fe00::1", Some("203.0.113.9"), "fe00::1"),
            // Only trusted hops forwarded: the nearest proxy is the caller.
            ("10.0.0.1", Some("10.0.0.2"), "10.0.0.1"),
            ("10.0.0.1", None, "10.0.0.1"),
        ];
        for (peer, xff, want) in cases {
            assert_eq!(
                limits.client_ip(ip(peer), xff),
                ip(want),
                "peer {peer}, X-Forwarded-For {xff:?}"
            );
        }
        // Host bits of a network are ignored; surrounding spaces too.
        let limits = trusting(&[" 10.1.2.3/8 ", "127.0.0.1/32"]).unwrap();
        assert_eq!(
            limits.client_ip(ip("10.200.0.1"), Some("203.0.113.9")),
            ip("203.0.113.9")
        );
        assert_eq!(
            limits.client_ip(ip("127.0.0.2"), Some("203.0.113.9")),
            ip("127.0.0.2"),
            "a /32 is that one address"
        );
    }

    #[test]
    fn junk_in_trusted_proxies_is_refused_precisely() {
        let errors = trusting(&[
            "proxy.internal",
            "10.0.0.0/33",
            "fd00::/129",
            "10.0.0/8",
            "10.0.0.0/",
            "10.0.0.0/eight",
            "",
            "10.0.0.1",
        ])
        .err()
        .expect("junk is refused");
        assert_eq!(
            errors,
            [
                "trusted_proxies: \"proxy.internal\" is neither an IP address (10.0.0.1, fd00::1) nor a network (10.0.0.0/8, fd00::/8)",
                "trusted_proxies: \"10.0.0.0/33\": the prefix length \"33\" is not a number from 0 to 32",
                "trusted_proxies: \"fd00::/129\": the prefix length \"129\" is not a number from 0 to 128",
                "trusted_proxies: \"10.0.0/8\": \"10.0.0\" before the / is not an IP address (a network is written 10.0.0.0/8 or fd00::/8)",
                "trusted_proxies: \"10.0.0.0/\": the prefix length \"\" is not a number from 0 to 32",
                "trusted_proxies: \"10.0.0.0/eight\": the prefix length \"eight\" is not a number from 0 to 32",
                "trusted_proxies: \"\" is neither an IP address (10.0.0.1, fd00::1) nor a network (10.0.0.0/8, fd00::/8)",
            ]
        );
    }
}

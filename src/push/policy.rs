//! Where webhooks may point: the destination policy of `[push]`.
//!
//! A URL is checked when a config is made (a precise -32602 for the caller) and again,
//! on the addresses actually connected to, at every delivery: the HTTP client resolves
//! names through [`PolicyResolver`], so a name that resolved to a public address when the
//! config was made and to 169.254.169.254 later (DNS rebinding) reaches nothing.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use url::{Host, Url};

use crate::agents::remote::resolve::{admitted, for_reqwest};

use crate::config::{AllowEntry, PushSettings};

#[derive(Debug, Clone, Default)]
pub(crate) struct Policy {
    allow_http: bool,
    networks: Vec<ipnet::IpNet>,
    hosts: Vec<String>,
}

impl Policy {
    pub(crate) fn new(settings: &PushSettings) -> Policy {
        let mut policy = Policy {
            allow_http: settings.allow_http,
            ..Policy::default()
        };
        // Checked when the file was read; an entry that does not parse allows nothing.
        for entry in settings
            .allow
            .iter()
            .filter_map(|e| AllowEntry::parse(e).ok())
        {
            match entry {
                AllowEntry::Network(net) => policy.networks.push(net),
                AllowEntry::Host(host) => policy.hosts.push(host),
            }
        }
        policy
    }

    /// Checks a webhook URL as a caller gave it: its form, and every address its host is
    /// or resolves to now. A name that does not resolve now (a receiver deployed later, a
    /// DNS hiccup) is accepted: every delivery resolves it again through [`PolicyResolver`],
    /// so refusing it here would protect nothing. The error says why, for the caller.
    pub(crate) async fn check_url(&self, text: &str) -> Result<Url, String> {
        let url = self.check_form(text)?;
        match url.host() {
            Some(Host::Domain(name)) if !self.host_allowed(name) => {
                let port = url.port_or_known_default().unwrap_or(443);
                let found = match tokio::time::timeout(LOOKUP_TIMEOUT, lookup(name, port)).await {
                    Ok(Ok(found)) => found,
                    Ok(Err(_)) | Err(_) => return Ok(url),
                };
                // The kind of address only: the caller learns nothing of the network.
                if let Some(kind) = found.iter().find_map(|a| self.refused(a.ip())) {
                    return Err(format!(
                        "the host {name} resolves to a {kind} address, which push.allow does not name"
                    ));
                }
            }
            _ => {}
        }
        Ok(url)
    }

    /// What can be said of a URL without resolving it.
    pub(crate) fn check_form(&self, text: &str) -> Result<Url, String> {
        let url = Url::parse(text).map_err(|e| format!("\"{text}\" is not a URL ({e})"))?;
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            "http" => {
                return Err(
                    "the URL must use https (push.allow_http is off in gateway.toml)".into(),
                )
            }
            other => return Err(format!("the scheme {other}: is not http(s)")),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(
                "the URL must not carry credentials; use the config's token or authentication"
                    .into(),
            );
        }
        // The URL parser has already read every way of writing an address (2130706433,
        // 0x7f.1, 0177.0.0.1, [::ffff:127.0.0.1]) into the address itself.
        let ip = match url.host() {
            Some(Host::Ipv4(v4)) => IpAddr::V4(v4),
            Some(Host::Ipv6(v6)) => IpAddr::V6(v6),
            Some(Host::Domain(_)) => return Ok(url),
            None => return Err("the URL has no host".into()),
        };
        match self.refused(ip) {
            Some(kind) => Err(format!(
                "{ip} is a {kind} address, which push.allow does not name"
            )),
            None => Ok(url),
        }
    }

    fn host_allowed(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.');
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(name))
    }

    /// Why `ip` may not be called, or None when it may.
    fn refused(&self, ip: IpAddr) -> Option<&'static str> {
        let kind = non_public(ip)?;
        let allowed = self.networks.iter().any(|net| net.contains(&ip))
            || embedded_v4(ip).is_some_and(|v4| {
                self.networks
                    .iter()
                    .any(|net| net.contains(&IpAddr::V4(v4)))
            });
        (!allowed).then_some(kind)
    }

    /// The resolver deliveries connect through.
    pub(crate) fn resolver(self: &Arc<Self>) -> PolicyResolver {
        PolicyResolver(self.clone())
    }
}

/// An IPv4 address inside an IPv6 one: mapped, compatible, NAT64 or 6to4.
fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        // ::a.b.c.d (deprecated "compatible" form), but not :: and ::1 themselves.
        [0, 0, 0, 0, 0, 0, _, _] if u32::from(low) > 1 => Some(low),
        // NAT64 (64:ff9b::/96, and the local-use 64:ff9b:1::/48), which route to the IPv4
        // address inside.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] | [0x64, 0xff9b, 1, ..] => Some(low),
        // 6to4 (2002:aabb:ccdd::/48).
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

/// What kind of non-public address `ip` is; None for a public one.
pub(crate) fn non_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(ip) {
            Some(v4) => non_public_v4(v4).or_else(|| non_public_v6(v6)),
            None => non_public_v6(v6),
        },
    }
}

fn non_public_v4(v4: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = v4.octets();
    Some(match (a, b, c) {
        _ if v4.is_loopback() => "loopback",
        _ if v4.is_unspecified() || a == 0 => "unspecified",
        (169, 254, 169) if v4.octets()[3] == 254 => "metadata",
        // Azure's host endpoint (wire server), which serves the instance's secrets.
        (168, 63, 129) if v4.octets()[3] == 16 => "metadata",
        _ if v4.is_link_local() => "link-local",
        _ if v4.is_private() => "private",
        // Carrier-grade NAT (100.64.0.0/10) is private to a provider.
        (100, b, _) if (64..128).contains(&b) => "private",
        _ if v4.is_multicast() => "multicast",
        _ if v4.is_broadcast() => "broadcast",
        (192, 0, 0) => "reserved",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, 18 | 19, _) => "reserved",
        _ if a >= 240 => "reserved",
        _ => return None,
    })
}

fn non_public_v6(v6: Ipv6Addr) -> Option<&'static str> {
    let s = v6.segments();
    Some(match s[0] {
        _ if v6.is_loopback() => "loopback",
        _ if v6.is_unspecified() => "unspecified",
        // AWS's IPv6 instance metadata address, inside fd00::/8.
        0xfd00 if s == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] => "metadata",
        x if (x & 0xfe00) == 0xfc00 => "private",
        x if (x & 0xffc0) == 0xfe80 => "link-local",
        // Site-local (deprecated, still routed privately by some).
        x if (x & 0xffc0) == 0xfec0 => "private",
        x if (x & 0xff00) == 0xff00 => "multicast",
        // Documentation (2001:db8::/32), Teredo (2001::/32), discard (100::/64).
        0x2001 if s[1] == 0xdb8 || s[1] == 0 => "reserved",
        0x0100 if s[1..4] == [0, 0, 0] => "reserved",
        _ => return None,
    })
}

/// How long a webhook's name may take to resolve when a config is made.
const LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

async fn lookup(name: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    Ok(tokio::net::lookup_host((name, port)).await?.collect())
}

/// Resolves names for deliveries and keeps only the addresses the policy allows; a name
/// left with none fails to connect, saying so.
#[derive(Clone)]
pub(crate) struct PolicyResolver(Arc<Policy>);

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        let host = name.as_str().to_string();
        for_reqwest(async move {
            let named = policy.host_allowed(&host);
            admitted(
                &host,
                |ip| named || policy.refused(ip).is_none(),
                "addresses push.allow does not name",
            )
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], http: bool) -> Policy {
        Policy::new(&PushSettings {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            allow_http: http,
            ..PushSettings::default()
        })
    }

    #[test]
    fn every_way_of_writing_a_non_public_address_is_refused() {
        let p = policy(&[], true);
        for url in [
            "http://127.0.0.1/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://0.0.0.0/",
            "http://10.1.2.3/",
            "http://167772161/",
            "http://172.16.0.1/",
            "http://192.168.1.1/",
            "http://100.64.0.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://224.0.0.1/",
            "http://255.255.255.255/",
            "http://[::1]/",
            "http://[::]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[::ffff:169.254.169.254]/",
            "http://[::127.0.0.1]/",
            "http://[64:ff9b::a00:1]/",
            "http://[64:ff9b:1::a9fe:a9fe]/",
            "http://168.63.129.16/",
            "http://[2002:a00:1::]/",
            "http://[fe80::1]/",
            "http://[fd00:ec2::254]/",
            "http://[fd12:3456::1]/",
            "http://[ff02::1]/",
        ] {
            assert!(p.check_form(url).is_err(), "{url} was let through");
        }
        for url in [
            "http://93.184.215.14/",
            "http://[2606:4700::1111]/",
            "https://example.com/h",
        ] {
            assert!(p.check_form(url).is_ok(), "{url} was refused");
        }
    }

    #[test]
    fn the_allow_list_opens_exactly_what_it_names() {
        let p = policy(&["127.0.0.1", "10.0.0.0/8", "hooks.internal"], true);
        assert!(p.check_form("http://127.0.0.1:9/").is_ok());
        assert!(p.check_form("http://[::ffff:127.0.0.1]:9/").is_ok());
        assert!(p.check_form("http://127.0.0.2/").is_err());
        assert!(p.check_form("http://10.9.8.7/").is_ok());
        assert!(p.check_form("http://192.168.0.1/").is_err());
        assert!(p.host_allowed("HOOKS.internal."));
        assert!(!p.host_allowed("evil.hooks.internal"));
    }

    #[test]
    fn scheme_and_credentials() {
        let p = policy(&[], false);
        let e = p.check_form("http://example.com/").unwrap_err();
        assert!(e.contains("https"), "{e}");
        assert!(p.check_form("ftp://example.com/").is_err());
        assert!(p.check_form("https://u:p@example.com/").is_err());
        assert!(p.check_form("not a url").is_err());
        assert_eq!(
            non_public("169.254.169.254".parse().unwrap()),
            Some("metadata")
        );
    }

    #[tokio::test]
    async fn a_name_is_checked_on_what_it_resolves_to() {
        let p = policy(&[], true);
        let e = p.check_url("http://localhost:8080/hook").await.unwrap_err();
        assert!(e.contains("loopback"), "{e}");
        // Checked again at every delivery; refusing it now would protect nothing.
        assert!(p.check_url("https://no-such-host.invalid/").await.is_ok());
    }

    #[tokio::test]
    async fn deliveries_cannot_connect_where_the_policy_refuses() {
        use reqwest::dns::Resolve;
        let p = Arc::new(policy(&[], true));
        let name: reqwest::dns::Name = "localhost".parse().unwrap();
        let result = p.resolver().resolve(name).await;
        assert!(result.is_err());
        let allowed = Arc::new(policy(&["127.0.0.0/8", "::1"], true));
        let name: reqwest::dns::Name = "localhost".parse().unwrap();
        assert!(allowed.resolver().resolve(name).await.is_ok());
    }
}

//! Name resolution for upstream calls that refuses link-local addresses (where clouds serve
//! instance metadata and credentials) unless the agent file itself names one. The check runs
//! on the addresses a name resolves to, as the connection is made, so a name the file or a
//! card gives cannot lead there by DNS (a name that resolves to 169.254.169.254, or that
//! changes to it later). Address literals skip resolution; `is_link_local_host` checks them.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name as HyperName;

/// Resolves with the system resolver (as both HTTP stacks do by default) and keeps only the
/// addresses the policy allows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GuardedResolver {
    /// The agent file names a link-local host itself: it may be called.
    pub(crate) allow_link_local: bool,
}

impl GuardedResolver {
    async fn resolve(self, host: String) -> io::Result<Vec<SocketAddr>> {
        admitted(
            &host,
            |ip| self.allow_link_local || !is_link_local_ip(ip),
            "link-local addresses, which the agent file does not name",
        )
        .await
    }
}

/// What `host` resolves to (system resolver), keeping only the addresses `admit` allows;
/// none left is an error saying the host resolves only to `refused`.
pub(crate) async fn admitted(
    host: &str,
    admit: impl Fn(IpAddr) -> bool,
    refused: &str,
) -> io::Result<Vec<SocketAddr>> {
    let kept: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
        .await?
        .filter(|a| admit(a.ip()))
        .collect();
    if kept.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{host} resolves only to {refused}"),
        ));
    }
    Ok(kept)
}

/// A resolution as reqwest's resolver seam takes it.
pub(crate) fn for_reqwest(
    resolving: impl Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'static,
) -> reqwest::dns::Resolving {
    Box::pin(async move {
        match resolving.await {
            Ok(addrs) => Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs),
            Err(e) => Err(Box::new(e) as Box<dyn std::error::Error + Send + Sync>),
        }
    })
}

type Resolving = Pin<Box<dyn Future<Output = io::Result<std::vec::IntoIter<SocketAddr>>> + Send>>;

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let this = *self;
        let host = name.as_str().to_string();
        for_reqwest(this.resolve(host))
    }
}

/// hyper-util's `HttpConnector` takes any such service as its resolver.
impl tower_service::Service<HyperName> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Resolving;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: HyperName) -> Self::Future {
        let this = *self;
        let host = name.as_str().to_string();
        Box::pin(async move { this.resolve(host).await.map(Vec::into_iter) })
    }
}

/// Link-local addresses (IPv4 169.254/16, IPv6 fe80::/10 and IPv4 ones written as IPv6) and
/// AWS's IPv6 metadata address.
pub(crate) fn is_link_local_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.is_link_local(),
            None => {
                (v6.segments()[0] & 0xffc0) == 0xfe80
                    || v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
            }
        },
    }
}

/// A URL's host as written: a link-local address, or the metadata name clouds resolve
/// inside their networks.
pub(crate) fn is_link_local_host(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Ipv4(ip) => is_link_local_ip(IpAddr::V4(*ip)),
        url::Host::Ipv6(ip) => is_link_local_ip(IpAddr::V6(*ip)),
        url::Host::Domain(d) => d.eq_ignore_ascii_case("metadata.google.internal"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_in_every_form() {
        for ip in [
            "169.254.169.254",
            "169.254.0.1",
            "fe80::1",
            "::ffff:169.254.169.254",
            "fd00:ec2::254",
        ] {
            assert!(is_link_local_ip(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "127.0.0.1",
            "10.0.0.1",
            "::1",
            "::ffff:127.0.0.1",
            "2001:db8::1",
        ] {
            assert!(!is_link_local_ip(ip.parse().unwrap()), "{ip}");
        }
        // The URL parser reads decimal and hex IPv4 forms as the address they denote.
        for url in [
            "http://2852039166/",
            "http://0xA9FEA9FE/",
            "http://[::ffff:a9fe:a9fe]/",
            "http://METADATA.google.internal/",
        ] {
            let url = url::Url::parse(url).unwrap();
            assert!(is_link_local_host(&url.host().unwrap()), "{url}");
        }
    }

    #[tokio::test]
    async fn resolved_addresses_are_checked() {
        let guarded = GuardedResolver {
            allow_link_local: false,
        };
        let e = guarded.resolve("169.254.169.254".into()).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("link-local"), "{e}");
        let named = GuardedResolver {
            allow_link_local: true,
        };
        assert_eq!(
            named.resolve("169.254.169.254".into()).await.unwrap().len(),
            1
        );
        let local = guarded.resolve("localhost".into()).await.unwrap();
        assert!(local.iter().all(|a| a.ip().is_loopback()), "{local:?}");
    }
}

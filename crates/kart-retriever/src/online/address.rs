//! Which addresses the page reader may reach: public unicast addresses only, so that a model's
//! `<access>` cannot make the retriever fetch from its own pod, the cluster's services, or a
//! cloud metadata endpoint (server-side request forgery).
//!
//! Host names are checked after resolution, in the HTTP client's resolver, so the address checked
//! is the one connected to (a name that resolves elsewhere on a second lookup gains nothing);
//! literal addresses (`127.1`, `2130706433` and `[::ffff:127.0.0.1]` are all parsed to
//! addresses first) are checked in every URL and every redirect. `online.allow_internal` lists
//! the host names and networks (CIDR) a deployment does want its retriever to read.

use crate::RetrieverError;
use ipnet::IpNet;
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::redirect;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use url::Host;

/// Redirects followed before a page read fails.
const MAX_REDIRECTS: usize = 10;

/// The addresses pages may be read from.
#[derive(Debug, Default)]
pub(super) struct AddressPolicy {
    /// Host names allowed whatever they resolve to (lowercase, without a trailing dot).
    names: Vec<String>,
    /// Networks allowed although internal.
    networks: Vec<IpNet>,
}

/// A refused address; not retried.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct Refused(String);

impl AddressPolicy {
    /// Public addresses, and the names and networks of `allow_internal` (`online.allow_internal`:
    /// each entry a network such as `10.0.0.0/8`, an address, or a host name).
    pub(super) fn new(allow_internal: &[String]) -> Result<Self, RetrieverError> {
        let mut policy = AddressPolicy::default();
        for (i, entry) in allow_internal.iter().enumerate() {
            let entry = entry.trim();
            if let Ok(network) = entry.parse::<IpNet>() {
                policy.networks.push(network);
            } else if let Ok(ip) = entry.parse::<IpAddr>() {
                policy.networks.push(IpNet::from(ip));
            } else if !entry.is_empty() && !entry.contains(['/', ':']) && Host::parse(entry).is_ok() {
                policy.names.push(entry.trim_end_matches('.').to_ascii_lowercase());
            } else {
                return Err(RetrieverError::BadRequest {
                    field: "online.allow_internal",
                    reason: format!(
                        "entry {i}, {entry:?}, is neither a network (CIDR), an address nor a host name"
                    ),
                });
            }
        }
        Ok(policy)
    }

    /// `builder` with a resolver and a redirect policy that keep its client to this policy.
    pub(super) fn guard(self: &Arc<Self>, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        let redirects = self.clone();
        builder.dns_resolver(Arc::new(Guard(self.clone()))).redirect(redirect::Policy::custom(
            move |attempt| {
                if attempt.previous().len() >= MAX_REDIRECTS {
                    return attempt.error(Refused(format!("more than {MAX_REDIRECTS} redirects")));
                }
                match redirects.check_url(attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(refused) => attempt.error(refused),
                }
            },
        ))
    }

    /// Refuses a URL whose host is a literal internal address (names are checked when resolved).
    pub(super) fn check_url(&self, url: &Url) -> Result<(), Refused> {
        let ip = match url.host() {
            Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
            Some(Host::Domain(_)) => return Ok(()),
            None => return Err(Refused(format!("{url} has no host"))),
        };
        match self.allows(ip) {
            true => Ok(()),
            false => Err(refusal(&ip.to_string(), &[ip])),
        }
    }

    fn allows(&self, ip: IpAddr) -> bool {
        is_public(ip) || self.networks.iter().any(|n| n.contains(&ip))
    }

    fn allows_name(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.names.contains(&host)
    }
}

fn refusal(what: &str, addresses: &[IpAddr]) -> Refused {
    let list: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
    Refused(format!(
        "{what} is an internal address ({}): pages are read from public addresses only \
         (online.allow_internal lists internal ones a deployment allows)",
        list.join(", ")
    ))
}

/// The client's resolver: the system's, keeping only allowed addresses.
struct Guard(Arc<AddressPolicy>);

impl Resolve for Guard {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if policy.allows_name(&host) {
                return Ok(Box::new(resolved.into_iter()) as Addrs);
            }
            let (allowed, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
                resolved.into_iter().partition(|a| policy.allows(a.ip()));
            if allowed.is_empty() {
                let refused: Vec<IpAddr> = refused.iter().map(SocketAddr::ip).collect();
                return Err(Box::new(refusal(&host, &refused)) as _);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// Whether `ip` is a public unicast address: not loopback, private, shared (CGNAT), link-local
/// (which holds the cloud metadata address 169.254.169.254), multicast, broadcast, unspecified,
/// documentation, benchmarking or reserved, nor an IPv6 address embedding one of those.
pub(super) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(a == 0
        || ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && ip.octets()[2] == 0)
        || (a == 198 && (18..20).contains(&b))
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    if let Some(v4) = ip.to_ipv4() {
        // IPv4-mapped and IPv4-compatible addresses (and ::, ::1, which map into 0.0.0.0/8).
        return is_public_v4(v4);
    }
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // NAT64 reaches the embedded IPv4 address.
        let [.., hi, lo] = segments;
        return is_public_v4(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    }
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_unique_local()
        || ip.is_unicast_link_local()
        || (segments[0] & 0xffc0) == 0xfec0
        || (segments[0] == 0x2001 && segments[1] == 0xdb8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_not_public() {
        for internal in [
            "127.0.0.1",
            "127.1.2.3",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.0.8",
            "198.18.0.1",
            "240.0.0.1",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
        ] {
            assert!(!is_public(internal.parse().unwrap()), "{internal}");
        }
        for public in ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn literal_addresses_are_checked_in_every_spelling() {
        let policy = AddressPolicy::new(&[]).unwrap();
        for url in [
            "http://127.0.0.1/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://[::ffff:127.0.0.1]/",
            "http://0.0.0.0:8000/",
            "http://169.254.169.254/latest/meta-data/",
        ] {
            let error = policy.check_url(&Url::parse(url).unwrap()).unwrap_err();
            assert!(error.to_string().contains("internal address"), "{url}: {error}");
        }
        assert!(policy.check_url(&Url::parse("https://example.com/").unwrap()).is_ok());
        assert!(policy.check_url(&Url::parse("http://8.8.8.8/").unwrap()).is_ok());
    }

    #[test]
    fn the_allow_list_takes_networks_addresses_and_names() {
        let allow = ["10.0.0.0/8", "192.168.1.7", "Wiki.Internal."].map(String::from);
        let policy = AddressPolicy::new(&allow).unwrap();
        assert!(policy.allows("10.2.3.4".parse().unwrap()));
        assert!(policy.allows("192.168.1.7".parse().unwrap()));
        assert!(!policy.allows("192.168.1.8".parse().unwrap()));
        assert!(policy.allows_name("wiki.internal"));
        assert!(!policy.allows_name("other.internal"));
        let error = AddressPolicy::new(&["10.0.0.0/33".into()]).unwrap_err().to_string();
        assert!(error.contains("online.allow_internal") && error.contains("10.0.0.0/33"), "{error}");
    }
}

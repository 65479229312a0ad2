//! The inference replicas behind a URL: every address its host resolves to, so a headless Service
//! (one DNS record per ready Pod) stands for each of its servers rather than for one of them, as
//! a Service's virtual IP would.
//!
//! An IP address stands for itself. A name stands for each of its IPv4 addresses (or, without
//! any, each IPv6 one), so the A and AAAA records of one dual-stack Pod count once. The names are
//! resolved again at every publish: replicas come and go with the Deployment.

use std::net::SocketAddr;

/// A failed resolution.
#[derive(Debug, thiserror::Error)]
#[error("{url}: {reason}")]
pub struct ResolveError {
    pub url: String,
    pub reason: String,
}

/// The base URL (`scheme://address:port`) of every replica behind `urls`, in order, without
/// repeats.
pub async fn resolve(urls: &[String]) -> Result<Vec<String>, ResolveError> {
    let mut replicas = Vec::new();
    for url in urls {
        let error = |reason: String| ResolveError { url: url.clone(), reason };
        let parsed = reqwest::Url::parse(url).map_err(|e| error(e.to_string()))?;
        let host = parsed.host_str().ok_or_else(|| error("no host".into()))?;
        let port = parsed.port_or_known_default().ok_or_else(|| error("no port".into()))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| error(format!("resolving {host}: {e}")))?
            .collect();
        for address in one_family(addresses) {
            let replica = format!("{}://{address}", parsed.scheme());
            if !replicas.contains(&replica) {
                replicas.push(replica);
            }
        }
    }
    Ok(replicas)
}

/// The IPv4 addresses of `addresses`, sorted, or the IPv6 ones when there are none.
fn one_family(mut addresses: Vec<SocketAddr>) -> Vec<SocketAddr> {
    if addresses.iter().any(SocketAddr::is_ipv4) {
        addresses.retain(SocketAddr::is_ipv4);
    }
    addresses.sort();
    addresses.dedup();
    addresses
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn addresses_stand_for_themselves_and_names_for_each_address() {
        let urls = ["http://127.0.0.1:30000".to_string(), "http://127.0.0.2:30000/".to_string()];
        assert_eq!(resolve(&urls).await.unwrap(), ["http://127.0.0.1:30000", "http://127.0.0.2:30000"]);
        let twice = ["http://127.0.0.1:1".to_string(), "http://127.0.0.1:1".to_string()];
        assert_eq!(resolve(&twice).await.unwrap(), ["http://127.0.0.1:1"], "no repeats");
        let named = resolve(&["http://localhost:30000".to_string()]).await.unwrap();
        assert_eq!(named, ["http://127.0.0.1:30000"], "localhost's IPv4 address, not also ::1");
        let error = resolve(&["not a url".to_string()]).await.unwrap_err();
        assert_eq!(error.url, "not a url");
    }

    #[test]
    fn a_dual_stack_name_counts_once_per_ipv4_address() {
        let v4: SocketAddr = "10.0.0.2:1".parse().unwrap();
        let v4b: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let v6: SocketAddr = "[fd00::2]:1".parse().unwrap();
        assert_eq!(one_family(vec![v4, v6, v4b, v4]), [v4b, v4]);
        assert_eq!(one_family(vec![v6]), [v6]);
    }
}

//! The pod network on loopback.
//!
//! - Pod addresses: every Pod gets its own address in 127.0.0.0/8, and its servers listen there
//!   (kart's servers take it from `KART_BIND_ADDRESS` in place of the `0.0.0.0` their configs
//!   name), so Pods use the ports their specs declare without colliding (but a process of this
//!   machine that listens on such a port on every address keeps Pods from binding it).
//! - Pod DNS: an environment value that is a Pod's DNS name (`<hostname>.<subdomain>`, as a
//!   headless Service publishes it, optionally followed by `.<namespace>.svc[.cluster.local]`)
//!   becomes that Pod's address when the kubelet starts a process (see [`pod_named`]).
//! - Services: an HTTP proxy plays cluster DNS and kube-proxy. Processes get `HTTP_PROXY` pointing
//!   at it, and it sends a request for `http://<service>.<namespace>.svc[.cluster.local]:<port>/…`
//!   to a ready endpoint of that Service: a running Pod of the node that its selector matches
//!   (ready, unless the Service publishes addresses that are not), at the target port of the
//!   Service port the URL names, round robin per Service over the endpoints in address order (as kube-proxy's IPVS
//!   mode does, but per request rather than per connection). A name that is no Service answers
//!   502, a Service without that port or without endpoints 503: where a client in a cluster would
//!   fail to resolve or to connect. The proxy selects the Pods itself, as the Node may list them,
//!   rather than reading EndpointSlices as kube-proxy does: the API server refuses loopback
//!   addresses as endpoints, so the EndpointSlice controller's slices of this network stay empty.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::ListParams;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// Hands out pod addresses `127.<a>.<b>.<c>`: `a` from the process id and `b` per network, so
/// concurrent harnesses (in this process or another) stay apart.
pub struct Addresses {
    prefix: [u8; 3],
    next: AtomicU32,
}

impl Default for Addresses {
    /// A fresh range.
    fn default() -> Self {
        static NETWORKS: AtomicU32 = AtomicU32::new(0);
        let b = (NETWORKS.fetch_add(1, Ordering::Relaxed) % 256) as u8;
        let a = (std::process::id() % 200 + 20) as u8;
        Addresses { prefix: [127, a, b], next: AtomicU32::new(0) }
    }
}

impl Addresses {
    /// The address the next Pod gets (the same until [`Addresses::take`]).
    pub fn next(&self) -> Ipv4Addr {
        let n = self.next.load(Ordering::Relaxed);
        let [x, a, b] = self.prefix;
        Ipv4Addr::new(x, a, b, (n % 250 + 1) as u8)
    }

    /// Gives [`Addresses::next`] to a Pod that started.
    pub fn take(&self) {
        self.next.fetch_add(1, Ordering::Relaxed);
    }
}

/// The Service proxy's state.
struct Proxy {
    client: kube::Client,
    http: reqwest::Client,
    /// The Node whose Pods are the endpoints.
    node: String,
    /// Requests sent so far to each Service (`<namespace>/<name>`).
    turns: Mutex<HashMap<String, usize>>,
}

/// Serves the Service proxy of Node `node`'s Pods on a free loopback port until the returned task
/// is aborted; returns its URL (for `HTTP_PROXY`).
pub async fn serve_proxy(
    client: kube::Client,
    node: &str,
) -> std::io::Result<(String, tokio::task::JoinHandle<()>)> {
    let http = reqwest::Client::builder().no_proxy().build().map_err(std::io::Error::other)?;
    let proxy = Arc::new(Proxy { client, http, node: node.to_string(), turns: Mutex::default() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let app = axum::Router::new().fallback(forward).with_state(proxy);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("the Service proxy stopped: {e}");
        }
    });
    Ok((url, task))
}

/// `<service>.<namespace>` of a cluster DNS name of a Service.
fn service_of(host: &str) -> Option<(&str, &str)> {
    let host = host.strip_suffix(".cluster.local").unwrap_or(host);
    let rest = host.strip_suffix(".svc")?;
    let (service, namespace) = rest.split_once('.')?;
    (!namespace.contains('.')).then_some((service, namespace))
}

/// The `(hostname, subdomain)` of a Pod DNS name in `namespace`, if `name` has that form.
pub fn pod_named<'a>(name: &'a str, namespace: &str) -> Option<(&'a str, &'a str)> {
    let name = name.strip_suffix(".cluster.local").unwrap_or(name);
    let name =
        name.strip_suffix(".svc").and_then(|n| n.strip_suffix(namespace)?.strip_suffix('.')).unwrap_or(name);
    let (host, subdomain) = name.split_once('.')?;
    let label = |l: &str| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    (label(host) && label(subdomain)).then_some((host, subdomain))
}

/// The Pod's phase, once its kubelet reported one.
fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

/// Whether the Pod reports the Ready condition.
fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod port that Service port `port` targets on `pod`: a number, or a container port's name.
fn target_port(port: &ServicePort, pod: &Pod) -> Option<u16> {
    let number = match &port.target_port {
        None => port.port,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(name)) => {
            pod.spec
                .iter()
                .flat_map(|s| &s.containers)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some(name))?
                .container_port
        }
    };
    u16::try_from(number).ok()
}

impl Proxy {
    /// A ready endpoint of the Service `uri` names, or the status and message of a failure.
    async fn endpoint(&self, uri: &Uri) -> Result<SocketAddr, (StatusCode, String)> {
        let gateway = |m: String| (StatusCode::BAD_GATEWAY, m);
        let unavailable = |m: String| (StatusCode::SERVICE_UNAVAILABLE, m);
        let host = uri.host().ok_or_else(|| gateway(format!("{uri}: not an absolute URL")))?;
        let port = uri.port_u16().unwrap_or(80);
        let (name, namespace) = service_of(host)
            .ok_or_else(|| gateway(format!("{host}: not a <service>.<namespace>.svc name")))?;
        let service = Api::<Service>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| gateway(e.to_string()))?
            .ok_or_else(|| gateway(format!("{host}: no Service {name} in namespace {namespace}")))?;
        let spec = service.spec.unwrap_or_default();
        let service_port = spec
            .ports
            .iter()
            .flatten()
            .find(|p| p.port == i32::from(port))
            .ok_or_else(|| unavailable(format!("Service {namespace}/{name} has no port {port}")))?;
        let selector = spec.selector.unwrap_or_default();
        if selector.is_empty() {
            return Err(unavailable(format!("Service {namespace}/{name} selects no pods")));
        }
        let labels = selector.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        let pods = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default().labels(&labels).fields(&format!("spec.nodeName={}", self.node)))
            .await
            .map_err(|e| gateway(e.to_string()))?;
        let publish_not_ready = spec.publish_not_ready_addresses == Some(true);
        let mut endpoints: Vec<SocketAddr> = pods
            .items
            .iter()
            .filter(|p| phase(p) == Some("Running"))
            .filter(|p| publish_not_ready || is_ready(p))
            .filter_map(|p| {
                let ip = p.status.as_ref()?.pod_ip.as_ref()?.parse::<Ipv4Addr>().ok()?;
                Some(SocketAddr::from((ip, target_port(service_port, p)?)))
            })
            .collect();
        if endpoints.is_empty() {
            return Err(unavailable(format!("Service {namespace}/{name} has no ready endpoints")));
        }
        endpoints.sort();
        let mut turns = self.turns.lock().expect("the turns lock");
        let turn = turns.entry(format!("{namespace}/{name}")).or_default();
        *turn += 1;
        Ok(endpoints[(*turn - 1) % endpoints.len()])
    }

    /// Sends `request` to `target` and streams the answer back.
    async fn send(&self, target: SocketAddr, request: Request) -> Response {
        let (parts, body) = request.into_parts();
        let has_body = parts.headers.contains_key(header::CONTENT_LENGTH)
            || parts.headers.contains_key(header::TRANSFER_ENCODING);
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut upstream = self
            .http
            .request(parts.method, format!("http://{target}{path}"))
            .headers(end_to_end(parts.headers));
        if has_body {
            upstream = upstream.body(reqwest::Body::wrap_stream(body.into_data_stream()));
        }
        match upstream.send().await {
            Ok(answer) => {
                let mut response = Response::builder().status(answer.status());
                if let Some(headers) = response.headers_mut() {
                    *headers = end_to_end(answer.headers().clone());
                }
                response
                    .body(Body::from_stream(answer.bytes_stream()))
                    .unwrap_or_else(|e| (StatusCode::BAD_GATEWAY, e.to_string()).into_response())
            }
            Err(e) => (StatusCode::BAD_GATEWAY, format!("{target}: {e}")).into_response(),
        }
    }
}

/// `headers` without the hop-by-hop ones (and `Host`, which the forwarded request sets anew).
fn end_to_end(mut headers: HeaderMap) -> HeaderMap {
    for name in [
        header::CONNECTION,
        header::HOST,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    headers
}

async fn forward(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    match proxy.endpoint(request.uri()).await {
        Ok(target) => proxy.send(target, request).await,
        Err((code, message)) => (code, message).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_resolve_in_their_namespace() {
        assert_eq!(service_of("wiki-retriever.ml.svc"), Some(("wiki-retriever", "ml")));
        assert_eq!(service_of("wiki-retriever.ml.svc.cluster.local"), Some(("wiki-retriever", "ml")));
        assert_eq!(service_of("wiki-retriever"), None);
        assert_eq!(service_of("example.com"), None);
        assert_eq!(service_of("a.b.c.svc"), None);
    }

    #[test]
    fn pod_names_resolve_in_their_namespace() {
        assert_eq!(pod_named("run-0.nodes", "ml"), Some(("run-0", "nodes")));
        assert_eq!(pod_named("run-0.nodes.ml.svc", "ml"), Some(("run-0", "nodes")));
        assert_eq!(pod_named("run-0.nodes.ml.svc.cluster.local", "ml"), Some(("run-0", "nodes")));
        assert_eq!(pod_named("run-0.nodes.other.svc", "ml"), None);
        assert_eq!(pod_named("/etc/kart/config.json", "ml"), None);
        assert_eq!(pod_named("127.0.0.1", "ml"), None);
    }
}

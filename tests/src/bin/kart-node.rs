//! kart's node agent for the real control plane of `scripts/control-plane.sh`: registers one Node,
//! runs the Pods the scheduler binds to it as local processes of the `kart` binaries beside it,
//! serves the pod network's Service proxy (its URL written to `DIR/proxy-url`, for processes off
//! the node that reach Services, as an operator run out of the cluster does) and provisions the
//! volumes of the node's StorageClass (see `kart_tests::node_agent`).
//!
//! `kart-node --kubeconfig FILE --provisioner-kubeconfig FILE --dir DIR [--name kart-node]`, the
//! two kubeconfigs the Node's identity and the provisioner's; stops (and stops its Pods) on
//! SIGTERM.

use kart_tests::node_agent::kubelet::Kubelet;
use kart_tests::node_agent::volumes::Provisioner;
use kart_tests::node_agent::{network, registration};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the Pods and claims are looked at, and the Node's Lease renewed.
const TICK: Duration = Duration::from_millis(200);
const HEARTBEAT: Duration = Duration::from_secs(10);
/// The pause before registering the Node again after a failure.
const RETRY: Duration = Duration::from_secs(1);

/// A client with the credentials of `kubeconfig`.
async fn client_of(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut kubeconfig, mut provisioner, mut dir) = (None, None, None);
    let mut name = "kart-node".to_string();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| anyhow::anyhow!("{flag} needs a value"));
        match flag.as_str() {
            "--kubeconfig" => kubeconfig = Some(PathBuf::from(value()?)),
            "--provisioner-kubeconfig" => provisioner = Some(PathBuf::from(value()?)),
            "--dir" => dir = Some(PathBuf::from(value()?)),
            "--name" => name = value()?,
            other => anyhow::bail!(
                "unknown argument {other:?} (--kubeconfig FILE --provisioner-kubeconfig FILE --dir DIR [--name NAME])"
            ),
        }
    }
    let required =
        |value: Option<PathBuf>, flag: &str| value.ok_or_else(|| anyhow::anyhow!("{flag} is required"));
    let kubeconfig = required(kubeconfig, "--kubeconfig")?;
    let provisioner = required(provisioner, "--provisioner-kubeconfig")?;
    let dir = required(dir, "--dir")?;
    // kube and reqwest bring two rustls providers; pick one, as the operator does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = client_of(&kubeconfig).await?;
    let provisioner = Provisioner::new(client_of(&provisioner).await?, dir.join("volumes"));
    let (proxy, _proxy_task) = network::serve_proxy(client.clone(), &name).await?;
    std::fs::write(dir.join("proxy-url"), &proxy)?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // The API server may be slow or briefly unreachable (a loaded machine): registering is tried
    // again until it succeeds, as a kubelet does.
    while let Err(e) = registration::register(&client, &name).await {
        eprintln!("kart-node: registering node {name}: {e}; trying again");
        tokio::select! {
            _ = terminate.recv() => return Ok(()),
            _ = tokio::time::sleep(RETRY) => {}
        }
    }
    let bin_dir = std::env::current_exe()?.parent().expect("a binary folder").to_path_buf();
    let kubelet = Kubelet::new(client.clone(), &name, dir, &bin_dir, proxy);
    eprintln!("kart-node: node {name} registered; running its Pods");
    // The heartbeat has a task of its own, so a slow sync of the Pods never lets the Lease lapse.
    tokio::spawn(async move {
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        loop {
            heartbeat.tick().await;
            if let Err(e) = registration::heartbeat(&client, &name).await {
                eprintln!("kart-node: heartbeat: {e}");
            }
        }
    });
    loop {
        tokio::select! {
            _ = terminate.recv() => return Ok(()),
            _ = tokio::time::sleep(TICK) => {
                let (pods, volumes) = futures::join!(kubelet.sync(), provisioner.sync());
                for e in [pods.err(), volumes.err()].into_iter().flatten() {
                    eprintln!("kart-node: {e:#}");
                }
            }
        }
    }
}

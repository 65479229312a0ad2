//! kart's node agent for the real control plane of `scripts/control-plane.sh`: registers one Node
//! and runs the Pods the scheduler binds to it as local processes of the `kart` binaries beside
//! it (the simulated kubelet of `kart_tests::cluster`, on that Node), with the pod network's proxy.
//!
//! `kart-node --kubeconfig FILE --dir DIR [--name kart-node]`; stops (and stops its Pods) on
//! SIGTERM.

use kart_tests::cluster::kubelet::Kubelet;
use kart_tests::cluster::{network, node};
use std::path::PathBuf;
use std::time::Duration;

/// How often the Pods are looked at, and the Node's Lease renewed.
const TICK: Duration = Duration::from_millis(200);
const HEARTBEAT: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut kubeconfig, mut dir, mut name) = (None, None, "kart-node".to_string());
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| anyhow::anyhow!("{flag} needs a value"));
        match flag.as_str() {
            "--kubeconfig" => kubeconfig = Some(PathBuf::from(value()?)),
            "--dir" => dir = Some(PathBuf::from(value()?)),
            "--name" => name = value()?,
            other => anyhow::bail!("unknown argument {other:?} (--kubeconfig FILE --dir DIR [--name NAME])"),
        }
    }
    let kubeconfig = kubeconfig.ok_or_else(|| anyhow::anyhow!("--kubeconfig is required"))?;
    // kube and reqwest bring two rustls providers; pick one, as the operator does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = dir.ok_or_else(|| anyhow::anyhow!("--dir is required"))?;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let client = kube::Client::try_from(config)?;
    node::register(&client, &name).await?;
    let (proxy, _proxy_task) = network::serve_proxy(client.clone()).await?;
    let bin_dir = std::env::current_exe()?.parent().expect("a binary folder").to_path_buf();
    let kubelet = Kubelet::new(client.clone(), dir, &bin_dir, proxy).on_node(&name);
    eprintln!("kart-node: node {name} registered; running its Pods");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    loop {
        tokio::select! {
            _ = terminate.recv() => return Ok(()),
            _ = heartbeat.tick() => {
                if let Err(e) = node::heartbeat(&client, &name).await {
                    eprintln!("kart-node: heartbeat: {e}");
                }
            }
            _ = tokio::time::sleep(TICK) => {
                if let Err(e) = kubelet.sync().await {
                    eprintln!("kart-node: {e:#}");
                }
            }
        }
    }
}

//! `kart doctor`: what this machine's kart can use (torch, CUDA support, GPUs, NCCL, Gloo, this
//! process's rank) and the device each component would run on.

use clap::Args;
use kart_core::config::train::Device;
use kart_torch::runtime::Availability;
use kart_torch::{Ranks, Runtime};
use serde::Serialize;
use std::process::ExitCode;

/// Report the PyTorch runtime, GPUs, communication backends and the devices components choose.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    runtime: Runtime,
    ranks: Ranks,
    /// The device each component picks with its default (`auto`) on this rank.
    components: Vec<Component>,
}

#[derive(Serialize)]
struct Component {
    name: &'static str,
    device: String,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let runtime = Runtime::probe();
    let ranks = Ranks::from_env()?;
    let components = ["trainer", "rollout engine (embedded)", "dense retriever"]
        .into_iter()
        .map(|name| {
            let device = kart_torch::choose(name, "device", Device::Auto, ranks.local_rank)
                .map_or_else(|e| e.to_string(), |d| format!("{d:?}").to_lowercase());
            Component { name, device }
        })
        .collect();
    let report = Report { runtime, ranks, components };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn text(r: &Report) -> String {
    let cuda = &r.runtime.cuda;
    let mut out = format!("torch {}\n", r.runtime.torch_version);
    out += &format!(
        "CUDA support: {} (libtorch_cuda {}, hooks {})\n",
        if cuda.loaded { "loaded" } else { "not loaded" },
        if cuda.library_mapped { "mapped" } else { "not mapped" },
        if cuda.hooks_registered { "registered" } else { "not registered" },
    );
    if r.runtime.devices.is_empty() {
        out += "GPUs: none visible\n";
    }
    for d in &r.runtime.devices {
        out += &format!(
            "GPU {}: {}, {:.1} GiB\n",
            d.index,
            d.name,
            d.total_memory_bytes as f64 / f64::from(1u32 << 30)
        );
    }
    let availability = |a: &Availability| match a {
        Availability::Available(v) => format!("available ({v})"),
        Availability::Unavailable(why) => format!("unavailable: {why}"),
    };
    out += &format!("NCCL: {}\n", availability(&r.runtime.nccl));
    out += &format!("Gloo: {}\n", availability(&r.runtime.gloo));
    let k = &r.ranks;
    out += &format!(
        "rank {} of {} (local {} of {}), rendezvous {}:{}\n",
        k.rank, k.world_size, k.local_rank, k.local_world_size, k.master_addr, k.master_port
    );
    for c in &r.components {
        out += &format!("{}: {}\n", c.name, c.device);
    }
    out
}

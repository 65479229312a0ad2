//! LoRA adapters on a RolloutPool's inference servers: a TrainingJob that publishes its adapters
//! to the pool (`sglang_disk` or `vllm_disk` with `lora`) needs servers started with
//! `--enable-lora` and a `--max-lora-rank` of at least its `lora.r` (SGLang also the projections
//! adapters may target, `--lora-target-modules all`). The operator adds them to the servers it
//! runs for the pool, from the TrainingJobs that use it ([`needed_rank`], [`serve`]); a rank the
//! user set lower than a job's is that job's invalid spec ([`fit`]).

use super::InvalidSpec;
use super::rollout_pool::Inference;
use crate::crd::{RolloutPool, TrainingJob};
use kart_core::config::rollout::EngineConfig;
use kart_core::config::train::InferenceServer;
use kube::ResourceExt;

/// The ranks vLLM takes for `--max-lora-rank` (`MaxLoRARanks` of `vllm/config/lora.py`).
const VLLM_MAX_LORA_RANKS: [usize; 9] = [1, 8, 16, 32, 64, 128, 256, 320, 512];
/// vLLM's `--max-lora-rank` when none is given (SGLang has none: it must be given).
const VLLM_DEFAULT_MAX_LORA_RANK: usize = 16;

/// The server kind of `pool`'s engine, when it runs SGLang or vLLM.
fn server_of(pool: &RolloutPool) -> Option<InferenceServer> {
    match pool.spec.config.engine {
        EngineConfig::Sglang { .. } => Some(InferenceServer::Sglang),
        EngineConfig::Vllm { .. } => Some(InferenceServer::Vllm),
        EngineConfig::Embedded { .. } => None,
    }
}

/// The value of flag `name` in `args` (`name V` or `name=V`), if given.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        let rest = a.strip_prefix(name)?;
        match rest.strip_prefix('=') {
            Some(value) => Some(value),
            None if rest.is_empty() => Some(args.get(i + 1).map_or("", String::as_str)),
            None => None,
        }
    })
}

/// The `--max-lora-rank` that `args` of `server`s of `pool` give, if any.
fn max_rank(args: &[String], server: InferenceServer, pool: &str) -> Result<Option<usize>, InvalidSpec> {
    let Some(value) = flag(args, "--max-lora-rank") else { return Ok(None) };
    let rank = value.parse::<usize>().ok().filter(|&r| r > 0);
    let rank = match server {
        InferenceServer::Vllm => rank.filter(|r| VLLM_MAX_LORA_RANKS.contains(r)),
        InferenceServer::Sglang => rank,
    };
    let takes = match server {
        InferenceServer::Vllm => format!("vLLM takes one of {VLLM_MAX_LORA_RANKS:?}"),
        InferenceServer::Sglang => "must be a positive number".to_string(),
    };
    rank.map(Some).ok_or_else(|| {
        InvalidSpec::new(
            format!("RolloutPool {pool} spec.inference.args --max-lora-rank"),
            format!("{value:?}"),
            takes,
        )
    })
}

/// Whether `tj` publishes adapters to the servers the operator runs for `pool`.
fn publishes_to(tj: &TrainingJob, pool: &RolloutPool) -> bool {
    let sync_server = tj.spec.config.weight_sync.servers().map(|(server, _)| server);
    tj.spec.config.publishes_adapters()
        && pool.spec.inference.is_some()
        && server_of(pool).is_some_and(|server| sync_server == Some(server))
        && tj.spec.rollout_pool_ref.as_deref() == Some(pool.name_any().as_str())
        && tj.namespace() == pool.namespace()
}

/// The largest adapter rank among the unfinished `jobs` that publish adapters to `pool`'s
/// servers; `None` when none does.
pub fn needed_rank(pool: &RolloutPool, jobs: &[TrainingJob]) -> Option<usize> {
    jobs.iter()
        .filter(|tj| !tj.status.as_ref().is_some_and(|s| s.phase.is_finished()))
        .filter(|tj| publishes_to(tj, pool))
        .filter_map(|tj| tj.spec.config.lora.as_ref().map(|l| l.r))
        .max()
}

/// Makes `pool`'s `servers` load adapters of up to `rank`: `--enable-lora`; a `--max-lora-rank`
/// that holds `rank` when the arguments give none (vLLM's smallest, and only when its default
/// is too small); SGLang's `--lora-target-modules all` when they give none.
pub fn serve(pool: &RolloutPool, servers: &mut Inference, rank: usize) {
    let Some(server) = server_of(pool) else { return };
    let containers = servers.deployment.spec.as_mut().and_then(|s| s.template.spec.as_mut());
    let Some(container) = containers.and_then(|s| s.containers.first_mut()) else { return };
    let args = container.args.get_or_insert_default();
    // A rank the server refuses is the jobs' invalid spec ([`fit`]): left as it is.
    let rank_given = !matches!(max_rank(args, server, ""), Ok(None));
    if !args.iter().any(|a| a == "--enable-lora") {
        args.push("--enable-lora".into());
    }
    match server {
        InferenceServer::Vllm if !rank_given && rank > VLLM_DEFAULT_MAX_LORA_RANK => {
            let fits = VLLM_MAX_LORA_RANKS.into_iter().find(|&r| r >= rank);
            args.extend(["--max-lora-rank".into(), fits.unwrap_or(rank).to_string()]);
        }
        InferenceServer::Sglang => {
            if !rank_given {
                args.extend(["--max-lora-rank".into(), rank.to_string()]);
            }
            if flag(args, "--lora-target-modules").is_none() {
                args.extend(["--lora-target-modules".into(), "all".into()]);
            }
        }
        InferenceServer::Vllm => {}
    }
}

/// Whether the servers the operator runs for `pool` can take `tj`'s adapters: a
/// `--max-lora-rank` the pool's arguments give must hold `lora.r` (the operator adds the rest).
pub fn fit(tj: &TrainingJob, pool: &RolloutPool) -> Result<(), InvalidSpec> {
    let (Some(lora), Some(servers), Some(server)) =
        (&tj.spec.config.lora, &pool.spec.inference, server_of(pool))
    else {
        return Ok(());
    };
    if !publishes_to(tj, pool) {
        return Ok(());
    }
    let pool_name = pool.name_any();
    match max_rank(&servers.args, server, &pool_name)? {
        Some(max_rank) if lora.r > max_rank => Err(InvalidSpec::new(
            "spec.config.lora.r",
            lora.r,
            format!(
                "RolloutPool {pool_name}'s {} servers take adapters up to rank {max_rank} (--max-lora-rank in its spec.inference.args)",
                server.name()
            ),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{Settings, fixtures, rollout_pool};
    use kart_core::config::lora::LoraConfig;
    use kart_core::config::train::WeightSync;

    fn vllm_pool() -> RolloutPool {
        let mut pool = fixtures::rollout_pool();
        pool.spec.config.engine =
            EngineConfig::Vllm { urls: vec![], model: "qwen".into(), timeout_secs: 60.0 };
        pool
    }

    fn lora_job(r: usize) -> TrainingJob {
        let mut tj = fixtures::training_job(1);
        tj.spec.config.weight_sync = WeightSync::VllmDisk { path: "/weights".into(), urls: vec![] };
        tj.spec.config.lora = Some(LoraConfig { r, ..LoraConfig::default() });
        tj
    }

    fn server_args(pool: &RolloutPool, rank: Option<usize>) -> Vec<String> {
        let mut servers = rollout_pool::children(pool, &Settings::default()).unwrap().inference.unwrap();
        if let Some(rank) = rank {
            serve(pool, &mut servers, rank);
        }
        let spec = servers.deployment.spec.unwrap().template.spec.unwrap();
        spec.containers[0].args.clone().unwrap()
    }

    #[test]
    fn the_largest_rank_of_the_jobs_publishing_adapters_to_the_pool() {
        let pool = vllm_pool();
        let mut other_pool = lora_job(64);
        other_pool.spec.rollout_pool_ref = Some("elsewhere".into());
        let mut merged = lora_job(128);
        merged.spec.config.weight_sync =
            serde_json::from_value(serde_json::json!({"kind": "vllm_broadcast"})).unwrap();
        let mut finished = lora_job(256);
        finished.status.get_or_insert_default().phase = crate::crd::training_job::TrainingJobPhase::Succeeded;
        let full = {
            let mut tj = lora_job(8);
            tj.spec.config.lora = None;
            tj
        };
        let jobs = [lora_job(8), lora_job(32), other_pool, merged, finished, full];
        assert_eq!(needed_rank(&pool, &jobs), Some(32));
        assert_eq!(needed_rank(&pool, &jobs[2..]), None);
        assert_eq!(needed_rank(&fixtures::rollout_pool(), &jobs), None, "an SGLang pool, vllm_disk jobs");
    }

    #[test]
    fn servers_get_lora_and_a_rank_that_holds_the_jobs() {
        let pool = vllm_pool();
        let plain = server_args(&pool, None);
        assert!(!plain.contains(&"--enable-lora".to_string()), "{plain:?}");
        assert_eq!(server_args(&pool, Some(8))[plain.len()..], ["--enable-lora"], "vLLM's default holds 8");
        assert_eq!(server_args(&pool, Some(24))[plain.len()..], ["--enable-lora", "--max-lora-rank", "32"]);
        let mut given = pool.clone();
        let args = &mut given.spec.inference.as_mut().unwrap().args;
        args.extend(["--enable-lora".into(), "--max-lora-rank=64".into()]);
        let before = server_args(&given, None);
        assert_eq!(server_args(&given, Some(24)), before, "the user's arguments stand");
    }

    #[test]
    fn sglang_servers_get_lora_the_rank_and_every_projection() {
        let pool = fixtures::rollout_pool();
        let mut tj = lora_job(24);
        tj.spec.config.weight_sync = WeightSync::SglangDisk { path: "/weights".into(), urls: vec![] };
        assert_eq!(needed_rank(&pool, std::slice::from_ref(&tj)), Some(24));
        assert_eq!(needed_rank(&vllm_pool(), &[tj]), None, "an SGLang sync does not feed a vLLM pool");
        let plain = server_args(&pool, None);
        assert_eq!(
            server_args(&pool, Some(24))[plain.len()..],
            ["--enable-lora", "--max-lora-rank", "24", "--lora-target-modules", "all"]
        );
    }

    #[test]
    fn a_rank_the_pool_sets_too_low_is_the_jobs_invalid_spec() {
        let mut pool = vllm_pool();
        assert_eq!(fit(&lora_job(128), &pool), Ok(()), "the operator sets the rank");
        pool.spec.inference.as_mut().unwrap().args.extend(["--max-lora-rank".into(), "64".into()]);
        assert_eq!(fit(&lora_job(64), &pool), Ok(()));
        assert_eq!(
            fit(&lora_job(128), &pool).unwrap_err().to_string(),
            "spec.config.lora.r = 128: RolloutPool pool's vLLM servers take adapters up to rank 64 (--max-lora-rank in its spec.inference.args)"
        );
        let args = &mut pool.spec.inference.as_mut().unwrap().args;
        *args.last_mut().unwrap() = "48".into();
        assert_eq!(
            fit(&lora_job(8), &pool).unwrap_err().to_string(),
            "RolloutPool pool spec.inference.args --max-lora-rank = \"48\": vLLM takes one of [1, 8, 16, 32, 64, 128, 256, 320, 512]"
        );
    }
}

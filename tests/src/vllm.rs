//! A real vLLM server: vLLM's CPU build, which `scripts/vllm/setup.sh` installs in a virtualenv
//! of its own (`KART_VLLM_VENV`, else `.venv-vllm`), serving one of the fixture models it can
//! serve (`.serving-models/`, made by the same script).

use crate::{free_port, log, repo_root, wait_ready};
use k8s_openapi::api::core::v1::Container;
use kart_model::CausalLm;
use kart_model::logprobs::{DEFAULT_CHUNK, token_logprobs};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tch::{Device, Kind, Tensor};

/// How long a server may take to start: about a minute on an idle 2-core machine.
const START: Duration = Duration::from_secs(1200);

/// The fixture model `name` (`serve-qwen2`, `serve-llama`): head size 32, which vLLM's CPU
/// attention takes, with transformers' oracle outputs beside it.
pub fn serving_model(name: &str) -> PathBuf {
    let dir = repo_root().join(".serving-models").join(name);
    assert!(dir.join("expected.json").is_file(), "{} missing: run scripts/vllm/setup.sh", dir.display());
    dir
}

/// The Python of vLLM's virtualenv (`KART_VLLM_VENV`, else `.venv-vllm`).
pub fn python() -> PathBuf {
    let venv =
        std::env::var_os("KART_VLLM_VENV").map_or_else(|| repo_root().join(".venv-vllm"), PathBuf::from);
    let python = venv.join("bin/python");
    assert!(python.exists(), "no vLLM at {}: run scripts/vllm/setup.sh", venv.display());
    python
}

/// A vLLM OpenAI-compatible server with its RL routes (`VLLM_SERVER_DEV_MODE=1`), in a process
/// group of its own (its engine core is a second process), stopped with the group when dropped.
pub struct Vllm {
    child: crate::Child,
    /// The folder of the model copy it serves, where it made it.
    _served_dir: Option<tempfile::TempDir>,
    /// `http://127.0.0.1:{port}`.
    pub url: String,
    /// The name it serves the model under (`--served-model-name`): the folder's name.
    pub served: String,
}

/// A copy of the model folder `model` without the oracle's files, which vLLM would load as weights
/// (it loads every `*.safetensors` of a folder): the folder holding it, and the copy.
pub fn serving_copy(model: &Path) -> (tempfile::TempDir, PathBuf) {
    let served = model.file_name().expect("a model folder");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let copy = dir.path().join(served);
    std::fs::create_dir(&copy).expect("a folder for the model");
    for entry in std::fs::read_dir(model).expect("the model folder").flatten() {
        if entry.path().is_file() && !entry.file_name().to_string_lossy().starts_with("expected.") {
            std::fs::copy(entry.path(), copy.join(entry.file_name())).expect("copy the model");
        }
    }
    (dir, copy)
}

impl Vllm {
    /// Starts vLLM on a copy of `model` in float32 (the oracle's precision) with `args` added,
    /// serving it under the folder's name, and waits until it answers `/health`.
    pub fn start(model: &Path, args: &[&str]) -> Vllm {
        let (served_dir, copy) = serving_copy(model);
        let served = model.file_name().expect("a model folder").to_string_lossy().into_owned();
        let mut command = Command::new(python());
        command
            .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
            .arg(&copy)
            .args(["--served-model-name", &served])
            .args(["--dtype", "float32", "--max-model-len", "4096", "--seed", "0"])
            .args(args)
            .env("VLLM_SERVER_DEV_MODE", "1");
        Vllm::run(command, Some(served_dir), served)
    }

    /// Runs `container` (an inference server's, as the operator builds it: `vllm serve` with its
    /// arguments and environment) as a node would, with vLLM's virtualenv as its image, listening
    /// on 127.0.0.1; `served` is its `--served-model-name`. The model folder its arguments name
    /// (a [`serving_copy`]) is the caller's to keep.
    pub fn start_container(container: &Container, served: &str) -> Vllm {
        let program = container.command.as_deref().unwrap_or_default();
        let venv_bin = python().parent().expect("the venv's bin").to_path_buf();
        let (first, rest) = program.split_first().expect("the container's command");
        let mut command = Command::new(venv_bin.join(first));
        command.args(rest).args(container.args.as_deref().unwrap_or_default());
        for var in container.env.as_deref().unwrap_or_default() {
            command.env(&var.name, var.value.as_deref().expect("a literal value"));
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let path = std::env::join_paths(std::iter::once(venv_bin).chain(std::env::split_paths(&path)));
        command.env("PATH", path.expect("a PATH"));
        Vllm::run(command, None, served.to_owned())
    }

    /// Starts `command` on a free port of 127.0.0.1 (the arguments last given win) in a process
    /// group of its own, and waits until it answers `/health`.
    fn run(mut command: Command, served_dir: Option<tempfile::TempDir>, served: String) -> Vllm {
        let port = free_port();
        command
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--disable-uvicorn-access-log"])
            // GiB of KV cache: the default takes a share of the machine's memory.
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("VLLM_LOGGING_LEVEL", "WARNING")
            .env("HF_HUB_OFFLINE", "1");
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let shown = format!("{command:?}");
        let child = crate::Child(command.spawn().expect("start vLLM"));
        let mut server =
            Vllm { child, _served_dir: served_dir, url: format!("http://127.0.0.1:{port}"), served };
        let started = Instant::now();
        wait_ready(&format!("{}/health", server.url), &mut server.child, START);
        log(&format!("vLLM ready in {} s: {shown}", started.elapsed().as_secs()));
        server
    }
}

impl Drop for Vllm {
    fn drop(&mut self) {
        // The whole group: the API server and the engine core it started.
        let group = -(self.child.0.id() as i32);
        // SAFETY: a signal to a process group this test started.
        unsafe { libc::kill(group, libc::SIGKILL) };
    }
}

/// What kart's `model` makes of `continuation` after `prompt`, step by step.
pub struct Scores {
    /// Each token's log-probability at temperature 1, as the trainer computes it.
    pub logprobs: Vec<f64>,
    /// The gap between the two largest logits: where it is tiny, two correct f32 engines may
    /// pick different greedy tokens.
    pub gaps: Vec<f64>,
}

/// [`Scores`] of `continuation` after `prompt` under `model` (on the CPU).
pub fn score(model: &CausalLm, prompt: &[u32], continuation: &[u32]) -> Scores {
    let all: Vec<i64> = prompt.iter().chain(continuation).map(|&t| t as i64).collect();
    let ids = Tensor::from_slice(&all).view([1, -1]);
    let positions = Tensor::arange(all.len() as i64, (Kind::Int64, Device::Cpu)).view([1, -1]);
    let (p, g) = (prompt.len() as i64, continuation.len() as i64);
    tch::no_grad(|| {
        let hidden = model.forward(&ids, &positions, None, None).narrow(1, p - 1, g);
        let logprobs = token_logprobs(model, &hidden, &ids.narrow(1, p, g), 1.0, false, DEFAULT_CHUNK);
        let (top, _) = model.lm_head(&hidden).to_kind(Kind::Float).topk(2, -1, true, true);
        let list = |t: Tensor| Vec::<f64>::try_from(t.to_kind(Kind::Double).view([-1])).unwrap();
        Scores { logprobs: list(logprobs.logprobs), gaps: list(top.select(-1, 0) - top.select(-1, 1)) }
    })
}

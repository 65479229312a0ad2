//! Configuration of a training run: one serde type, read by `kart train --config` and rendered by
//! the operator into the ConfigMap a TrainingJob's trainer pod reads. Defaults follow verl's
//! `ppo_trainer.yaml` and the Search-R1 training scripts where they exist.

use super::ConfigError;
use super::env::EnvConfig;
use super::lora::LoraConfig;
use super::memory::{Precision, ReferenceConfig, Sharding};
use super::rollout::ContextConfig;
use super::tracking::TrackingConfig;
use crate::rl::kl::KlEstimator;
use crate::rl::loss::LossAggMode;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// The Hugging Face folder the policy (and the reference policy and critic) start from.
    pub model: PathBuf,
    /// Where checkpoints, `metrics.jsonl` and rollout dumps go.
    pub output_dir: PathBuf,
    /// Seed of data order, sampling and initialisation of new parameters.
    pub seed: u64,
    /// Optimisation steps to run.
    pub total_steps: u64,
    /// The training and held-out data.
    pub data: DataConfig,
    /// Advantage estimator, losses and their coefficients.
    pub algorithm: AlgorithmConfig,
    /// The value model of PPO (used when `algorithm.advantage` is `gae`).
    pub critic: CriticConfig,
    /// Optimiser and learning-rate schedule of the policy.
    pub optim: OptimConfig,
    /// Batch sizes.
    pub batch: BatchConfig,
    /// Where trajectories come from and how they are sampled.
    pub rollout: RolloutSource,
    /// How new weights reach the rollout engines.
    pub weight_sync: WeightSync,
    /// Checkpointing.
    pub checkpoint: CheckpointConfig,
    /// Evaluation on the held-out split.
    pub eval: EvalConfig,
    /// Append every step's decoded trajectories to `rollouts.jsonl` (what `/ui` and `kart view`
    /// show).
    pub dump_rollouts: bool,
    /// MLflow and TensorBoard, besides `metrics.jsonl`.
    pub tracking: TrackingConfig,
    /// Address of the trainer's HTTP server (`/metrics`, `/status`, `/weights/{version}`).
    pub host: String,
    /// Port of the trainer's HTTP server; 0 picks a free one.
    pub port: u16,
    /// Where the models run.
    pub device: Device,
    /// Data-parallel training over several processes (`kart train --nproc-per-node`, or the
    /// `RANK`/`WORLD_SIZE` variables the operator sets).
    pub distributed: DistributedConfig,
    /// Weights and compute in bf16 or f32; unset: bf16 on CUDA, f32 on the CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
    /// Keep only each decoder layer's input in the forward pass and recompute the layer in the
    /// backward pass.
    pub activation_checkpointing: bool,
    /// What the data-parallel ranks shard between them (`full` needs
    /// `activation_checkpointing`).
    pub sharding: Sharding,
    /// The reference policy of the KL loss.
    pub reference: ReferenceConfig,
    /// Train LoRA adapters on the frozen `model` instead of all its weights; the reference
    /// policy is then the base with the adapters switched off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
}

/// How the ranks of a data-parallel run talk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DistributedConfig {
    /// Seconds a rendezvous or collective may wait for the other ranks before the run fails (a
    /// rank that died stops the others within this).
    pub timeout_secs: f64,
    /// Size of a gradient all-reduce bucket in MiB (PyTorch DDP's `bucket_cap_mb`).
    pub bucket_mb: f64,
}

impl Default for DistributedConfig {
    fn default() -> Self {
        DistributedConfig { timeout_secs: 1800.0, bucket_mb: 25.0 }
    }
}

/// Where the trainer's models (and its in-process engine) run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// The first CUDA device when one is available, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// The first CUDA device.
    Cuda,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: PathBuf::new(),
            output_dir: PathBuf::from("kart-train"),
            seed: 0,
            total_steps: 100,
            data: DataConfig::default(),
            algorithm: AlgorithmConfig::default(),
            critic: CriticConfig::default(),
            optim: OptimConfig::default(),
            batch: BatchConfig::default(),
            rollout: RolloutSource::default(),
            weight_sync: WeightSync::default(),
            checkpoint: CheckpointConfig::default(),
            eval: EvalConfig::default(),
            dump_rollouts: false,
            tracking: TrackingConfig::default(),
            host: "0.0.0.0".into(),
            port: 8002,
            device: Device::Auto,
            distributed: DistributedConfig::default(),
            precision: None,
            activation_checkpointing: false,
            sharding: Sharding::None,
            reference: ReferenceConfig::default(),
            lora: None,
        }
    }
}

/// The dataset files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// Training prompts: Search-R1 parquet, ASearcher JSON lines or TIR JSON lines.
    pub train: PathBuf,
    /// Held-out prompts for evaluation (same formats).
    pub test: Option<PathBuf>,
    /// The file format; `auto` decides by extension and the first row.
    pub format: DataFormat,
    /// Skip (and count) rows with missing fields instead of failing with file and row.
    pub skip_bad_rows: bool,
    /// Use at most this many training prompts (0: all).
    pub max_prompts: usize,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            train: PathBuf::new(),
            test: None,
            format: DataFormat::Auto,
            skip_bad_rows: false,
            max_prompts: 0,
        }
    }
}

/// Dataset formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DataFormat {
    /// By extension (`.parquet` is Search-R1) and, for JSON lines, by the first row's keys.
    #[default]
    Auto,
    /// Search-R1 parquet: `data_source`, `prompt`, `reward_model.ground_truth.target`, `extra_info`.
    SearchR1,
    /// ASearcher JSON lines: `question`, `answer` or `answers`, `id`.
    Asearcher,
    /// TIR JSON lines: `messages` (or `question`), `answer`.
    Tir,
}

/// Advantage estimators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageEstimator {
    /// Group-normalised outcome rewards.
    #[default]
    Grpo,
    /// GRPO without division by the group's standard deviation (Dr. GRPO).
    Drgrpo,
    /// Leave-one-out baseline.
    Rloo,
    /// PPO with a critic: generalised advantage estimation over the response tokens.
    Gae,
}

/// The estimator a name denotes, as configs spell it (`grpo`, `drgrpo`, `rloo`, `gae`).
impl std::str::FromStr for AdvantageEstimator {
    type Err = serde::de::value::Error;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        use serde::de::IntoDeserializer;
        Self::deserialize(name.into_deserializer())
    }
}

/// The RL algorithm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AlgorithmConfig {
    /// The advantage estimator.
    pub advantage: AdvantageEstimator,
    /// GAE discount.
    pub gamma: f64,
    /// GAE trace decay.
    pub lam: f64,
    /// Lower PPO clip: ratios below `1 - clip_ratio_low` are clipped.
    pub clip_ratio_low: f64,
    /// Upper PPO clip (DAPO's clip-higher when above `clip_ratio_low`).
    pub clip_ratio_high: f64,
    /// Dual-clip constant for negative advantages (> 1).
    pub clip_ratio_c: f64,
    /// How the token losses are reduced.
    pub loss_agg_mode: LossAggMode,
    /// KL estimator of the KL loss to the reference policy; `null` turns the KL loss off.
    pub kl_loss: Option<KlEstimator>,
    /// Coefficient of the KL loss.
    pub kl_coef: f64,
    /// Coefficient of the entropy bonus (0: entropy is only a metric).
    pub entropy_coef: f64,
    /// Cap of truncated importance sampling (slime, verl): each token's loss weighted by
    /// `min(exp(old - rollout), tis_cap)`, the engine's log-probabilities against the recomputed
    /// ones (`null`: off).
    pub tis_cap: Option<f64>,
    /// Decoupled PPO (AReaL): the clip is taken against the proximal policy (the log-probabilities
    /// recomputed before the update) and each token's loss is weighted by
    /// `exp(proximal - behaviour)`, the behaviour policy being the engine's log-probabilities of
    /// whatever version sampled the token; tokens whose weight exceeds `behav_imp_weight_cap`
    /// are dropped.
    pub decoupled: bool,
    /// AReaL's cap of the decoupled importance weight (`null`: none).
    pub behav_imp_weight_cap: Option<f64>,
    /// Drop groups whose rewards are all equal, over-sampling prompts to keep the batch full.
    pub filter_groups: bool,
    /// Keep observation tokens out of the loss (false reproduces the Search-R1 ablation).
    pub mask_observations: bool,
    /// PPO epochs over each batch.
    pub ppo_epochs: u32,
    /// Subtract `beta * KL(policy || reference)` from each token's reward before the advantages
    /// (verl's `use_kl_in_reward`, Search-R1's PPO recipe); `beta` from `kl_ctrl`.
    pub kl_in_reward: bool,
    /// KL estimator of the penalty in the reward.
    pub kl_penalty: KlEstimator,
    /// The coefficient of the penalty in the reward and how it moves.
    pub kl_ctrl: KlCtrlConfig,
    /// What happens to trajectories that ran long (DAPO).
    pub overlong: OverlongConfig,
}

/// DAPO's over-long handling.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OverlongConfig {
    /// Truncated trajectories get no policy loss (DAPO's over-long filtering); the critic still
    /// learns their values.
    pub mask: bool,
    /// DAPO's soft over-long punishment (verl's `overlong_buffer`).
    pub buffer: Option<OverlongBuffer>,
}

/// A linear penalty over the last `len` tokens of a trajectory's room: a response of `l` tokens,
/// with room for `max` (the env's trajectory limit less the prompt), adds
/// `min(-(l - (max - len)) / len * penalty_factor, 0)` to the reward.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OverlongBuffer {
    /// Tokens before the limit where the penalty starts.
    pub len: usize,
    /// The penalty at the limit.
    #[serde(default = "default_overlong_penalty")]
    pub penalty_factor: f64,
}

fn default_overlong_penalty() -> f64 {
    1.0
}

impl OverlongBuffer {
    /// The penalty of a response of `response_len` tokens with room for `max_response` tokens.
    pub fn penalty(&self, response_len: usize, max_response: usize) -> f64 {
        let expected = max_response.saturating_sub(self.len) as f64;
        let exceed = response_len as f64 - expected;
        (-exceed / self.len as f64 * self.penalty_factor).min(0.0)
    }
}

/// verl's `algorithm.kl_ctrl`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KlCtrlConfig {
    /// `fixed` keeps `kl_coef`; `adaptive` moves it toward `target_kl`.
    #[serde(rename = "type")]
    pub kind: KlCtrlType,
    /// The initial coefficient.
    pub kl_coef: f64,
    /// The KL per trajectory the adaptive controller aims at.
    pub target_kl: f64,
    /// Trajectories over which the adaptive controller closes a 20% error.
    pub horizon: f64,
}

impl Default for KlCtrlConfig {
    fn default() -> Self {
        KlCtrlConfig { kind: KlCtrlType::Fixed, kl_coef: 0.001, target_kl: 0.1, horizon: 10000.0 }
    }
}

/// How the KL coefficient of the reward moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KlCtrlType {
    Fixed,
    Adaptive,
}

impl Default for AlgorithmConfig {
    fn default() -> Self {
        AlgorithmConfig {
            advantage: AdvantageEstimator::Grpo,
            gamma: 1.0,
            lam: 1.0,
            clip_ratio_low: 0.2,
            clip_ratio_high: 0.2,
            clip_ratio_c: 3.0,
            loss_agg_mode: LossAggMode::TokenMean,
            kl_loss: Some(KlEstimator::LowVarKl),
            kl_coef: 0.001,
            entropy_coef: 0.0,
            tis_cap: None,
            decoupled: false,
            behav_imp_weight_cap: None,
            filter_groups: false,
            mask_observations: true,
            ppo_epochs: 1,
            kl_in_reward: false,
            kl_penalty: KlEstimator::K1,
            kl_ctrl: KlCtrlConfig::default(),
            overlong: OverlongConfig::default(),
        }
    }
}

/// The critic (value model) of PPO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CriticConfig {
    /// Its optimiser (Search-R1 uses a learning rate of 1e-5).
    pub optim: OptimConfig,
    /// Steps in which only the critic learns.
    pub warmup_steps: u64,
    /// Clip of the value update around the old values.
    pub cliprange_value: f64,
    /// Coefficient of the value loss.
    pub value_loss_coef: f64,
}

impl Default for CriticConfig {
    fn default() -> Self {
        CriticConfig {
            optim: OptimConfig { lr: 1e-5, ..OptimConfig::default() },
            warmup_steps: 0,
            cliprange_value: 0.5,
            value_loss_coef: 0.5,
        }
    }
}

/// Learning-rate schedules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// Linear warm-up, then constant.
    #[default]
    Constant,
    /// Linear warm-up, then cosine decay to `min_lr_ratio * lr`.
    Cosine,
}

/// AdamW and its schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OptimConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// Adam's beta1.
    pub beta1: f64,
    /// Adam's beta2.
    pub beta2: f64,
    /// Adam's epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Share of `total_steps` spent warming up linearly from 0.
    pub warmup_ratio: f64,
    /// The schedule after warm-up.
    pub schedule: Schedule,
    /// Floor of the cosine schedule as a share of `lr`.
    pub min_lr_ratio: f64,
    /// Clip of the global gradient norm (0: off).
    pub grad_clip: f64,
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            lr: 1e-6,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            warmup_ratio: 0.0,
            schedule: Schedule::Constant,
            min_lr_ratio: 0.0,
            grad_clip: 1.0,
        }
    }
}

/// Batch sizes, counted in prompts (a prompt yields `n` trajectories).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct BatchConfig {
    /// Prompts per optimisation step (verl's `train_batch_size`).
    pub prompts: usize,
    /// Trajectories per prompt (the group size).
    pub n: usize,
    /// Prompts per optimiser update (verl's `ppo_mini_batch_size`); a step makes
    /// `prompts / mini_batch_prompts` updates per PPO epoch.
    pub mini_batch_prompts: usize,
    /// Trajectories per forward/backward pass; gradients accumulate over a mini-batch.
    pub micro_batch_size: usize,
    /// Tokens per forward/backward pass instead: trajectories packed into one row without
    /// padding, each attending only to itself (`micro_batch_size` is then unused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch_tokens: Option<usize>,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            prompts: 512,
            n: 5,
            mini_batch_prompts: 256,
            micro_batch_size: 8,
            micro_batch_tokens: None,
        }
    }
}

/// Sampling of rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Sampling {
    /// Softmax temperature of training rollouts (evaluation is greedy).
    pub temperature: f64,
    /// Nucleus sampling.
    pub top_p: f64,
    /// Top-k sampling (-1: off).
    pub top_k: i64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 1.0, top_p: 1.0, top_k: -1 }
    }
}

/// Where trajectories come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutSource {
    /// RolloutPool URLs (`kart rollout serve`); empty runs an in-process pool with the embedded
    /// engine.
    pub urls: Vec<String>,
    /// In-process pool: a local BM25 index folder searched without HTTP (instead of
    /// `retriever_url`).
    pub index: Option<PathBuf>,
    /// In-process pool: sequences decoded together.
    pub max_batch: usize,
    /// The environment and its settings, sent with each request (`kind`: search-r1, asearcher,
    /// tir).
    pub env: EnvConfig,
    /// Sampling of training rollouts.
    pub sampling: Sampling,
    /// Policy versions a trajectory may lag behind the trainer (0: synchronous on-policy).
    pub max_staleness: u64,
    /// Seconds to wait for one group before the request is retried.
    pub timeout_secs: f64,
    /// Seconds the groups of a failed `/rollout` request (a worker unreachable or restarting, a
    /// connection lost, an answer 5xx, 408 or 429) are sent again for, with backoff, each time
    /// once a worker's `/readyz` answers, before they count as failed; 0 fails them at once.
    /// Other refusals (4xx) fail them at once.
    pub retry_deadline_secs: f64,
    /// Let a weight update interrupt the generations in flight (`sglang_disk` and
    /// `sglang_broadcast`: SGLang's `abort_all_requests`) rather than wait for them to finish: the workers continue each from
    /// its prefix on the new weights, every token keeping the version that sampled it.
    pub interruptible: bool,
    /// Train on the groups recorded in this `rollouts.jsonl` (written with `dump_rollouts`), step
    /// by step in order, instead of generating: offline training, debugging, and deterministic
    /// runs.
    pub replay: Option<PathBuf>,
    /// In-process pool: the tools and engine retries, as a rollout worker takes them
    /// (`retriever_url`, `tool_timeout_secs`, ...: keys of their own beside these).
    #[serde(flatten)]
    pub context: ContextConfig,
}

impl Default for RolloutSource {
    fn default() -> Self {
        RolloutSource {
            urls: Vec::new(),
            index: None,
            max_batch: 64,
            env: EnvConfig::default(),
            sampling: Sampling::default(),
            max_staleness: 0,
            timeout_secs: 1800.0,
            retry_deadline_secs: 120.0,
            interruptible: false,
            replay: None,
            context: ContextConfig::default(),
        }
    }
}

/// How rollout engines get new weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum WeightSync {
    /// Workers pull `/weights/{version}` from the trainer (`POST /weights` on each worker).
    HttpPull {
        /// The URL workers reach the trainer at (default: `http://{host}:{port}`).
        advertise_url: Option<String>,
    },
    /// Write a Hugging Face folder to a shared path and call SGLang's `/update_weights_from_disk`
    /// on every replica, with the version as `weight_version`.
    SglangDisk {
        /// Shared folder the SGLang servers see at the same path (absolute).
        path: PathBuf,
        /// SGLang server URLs; a name with several addresses (a headless Service) stands for each
        /// of them, so every replica is updated. Under the operator, empty means every server of
        /// the RolloutPool of `rolloutPoolRef`.
        #[serde(default)]
        urls: Vec<String>,
    },
    /// Broadcast the tensors from trainer rank 0 to the workers of every SGLang replica, in
    /// buckets (SGLang's `/init_weights_update_group` and `/update_weights_from_distributed`, as
    /// slime and verl use them): over NCCL from a GPU trainer, Gloo from a CPU one. Nothing is
    /// written to disk.
    SglangBroadcast {
        /// SGLang server URLs, as for `sglang_disk`.
        #[serde(default)]
        urls: Vec<String>,
        /// The address the replicas' workers reach trainer rank 0 at (default: the pod's
        /// `POD_IP`, else 127.0.0.1).
        #[serde(default)]
        master_address: Option<String>,
        /// The port of the group's store on trainer rank 0 (0: a free one).
        #[serde(default)]
        master_port: u16,
        /// Bytes of tensors per broadcast, in MiB (one tensor larger than this goes alone).
        #[serde(default = "default_sync_bucket_mb")]
        bucket_mb: f64,
        /// Seconds the replicas' workers have to join the group and to receive one bucket.
        #[serde(default = "default_sync_timeout_secs")]
        timeout_secs: f64,
    },
    /// Write a Hugging Face folder to a shared path and have every vLLM replica load it in place
    /// (servers started with `VLLM_SERVER_DEV_MODE=1`, on any device): each is paused once its
    /// requests in flight finished, reloads its weights from the folder (`reload_weights` through
    /// `/collective_rpc`), takes the version (`/update_weight_version`) and resumes.
    VllmDisk {
        /// Shared folder the vLLM servers see at the same path (absolute).
        path: PathBuf,
        /// vLLM server URLs, as for `sglang_disk`.
        #[serde(default)]
        urls: Vec<String>,
    },
    /// Broadcast the tensors from trainer rank 0 to the workers of every vLLM replica through
    /// vLLM's weight-transfer engine (servers started with `VLLM_SERVER_DEV_MODE=1` and
    /// `--weight-transfer-config '{"backend": "nccl"}'`): the workers join an NCCL communicator
    /// as `PyNcclCommunicator` does (`/init_weight_transfer_engine`), and each publish pauses the
    /// server once its requests finished, sends the tensors in buckets (`/update_weights`) and
    /// finishes with the version (`/finish_weight_update`). A CPU trainer moves them over Gloo.
    VllmBroadcast {
        /// vLLM server URLs, as for `sglang_disk`.
        #[serde(default)]
        urls: Vec<String>,
        /// As for `sglang_broadcast`.
        #[serde(default)]
        master_address: Option<String>,
        /// As for `sglang_broadcast`.
        #[serde(default)]
        master_port: u16,
        /// Bytes of tensors per `/update_weights` call, in MiB (one tensor larger goes alone).
        #[serde(default = "default_sync_bucket_mb")]
        bucket_mb: f64,
        /// Seconds the replicas' workers have to join the communicator and to receive one bucket.
        #[serde(default = "default_sync_timeout_secs")]
        timeout_secs: f64,
    },
}

/// The kind of inference server a weight sync updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InferenceServer {
    Sglang,
    Vllm,
}

impl InferenceServer {
    /// The server's name, as errors and logs give it.
    pub fn name(self) -> &'static str {
        match self {
            InferenceServer::Sglang => "SGLang",
            InferenceServer::Vllm => "vLLM",
        }
    }
}

fn default_sync_bucket_mb() -> f64 {
    512.0
}

fn default_sync_timeout_secs() -> f64 {
    600.0
}

impl WeightSync {
    /// The inference servers this sync updates, and their kind (none for `http_pull`).
    pub fn servers(&self) -> Option<(InferenceServer, &[String])> {
        match self {
            WeightSync::HttpPull { .. } => None,
            WeightSync::SglangDisk { urls, .. } | WeightSync::SglangBroadcast { urls, .. } => {
                Some((InferenceServer::Sglang, urls))
            }
            WeightSync::VllmDisk { urls, .. } | WeightSync::VllmBroadcast { urls, .. } => {
                Some((InferenceServer::Vllm, urls))
            }
        }
    }

    /// The sync's name, as config and metrics give it.
    pub fn kind(&self) -> &'static str {
        match self {
            WeightSync::HttpPull { .. } => "http_pull",
            WeightSync::SglangDisk { .. } => "sglang_disk",
            WeightSync::SglangBroadcast { .. } => "sglang_broadcast",
            WeightSync::VllmDisk { .. } => "vllm_disk",
            WeightSync::VllmBroadcast { .. } => "vllm_broadcast",
        }
    }
}

impl Default for WeightSync {
    fn default() -> Self {
        WeightSync::HttpPull { advertise_url: None }
    }
}

/// Checkpointing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Save every this many steps (0: only at the end).
    pub every: u64,
    /// Checkpoints kept (older ones are removed).
    pub keep: usize,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig { every: 50, keep: 2 }
    }
}

/// Evaluation on the held-out split: greedy decoding, and optionally sampling as in training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Evaluate every this many steps (0: only before training and at the end).
    pub every: u64,
    /// Held-out prompts used (0: all).
    pub max_prompts: usize,
    /// Trajectories per held-out prompt also sampled with the training rollouts' sampling
    /// parameters (0: greedy only); their mean reward is `eval_sampled/reward`.
    pub sampled_n: usize,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig { every: 50, max_prompts: 0, sampled_n: 0 }
    }
}

impl TrainConfig {
    /// Whether each publish sends the LoRA adapters alone (a PEFT folder the SGLang or vLLM
    /// servers load over their base: `sglang_disk` or `vllm_disk` with `lora`), rather than the
    /// model.
    pub fn publishes_adapters(&self) -> bool {
        self.lora.is_some()
            && matches!(self.weight_sync, WeightSync::SglangDisk { .. } | WeightSync::VllmDisk { .. })
    }

    /// Checks ranges and cross-field rules serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field, value: &dyn std::fmt::Display, reason| Err(ConfigError::new(field, value, reason));
        let a = &self.algorithm;
        let b = &self.batch;
        if self.model.as_os_str().is_empty() {
            return err("model", &"\"\"", "a Hugging Face model folder is required");
        }
        if self.data.train.as_os_str().is_empty() {
            return err("data.train", &"\"\"", "a training data file is required");
        }
        if !(above(a.clip_ratio_low, 0.0) && a.clip_ratio_low < 1.0) {
            return err("algorithm.clip_ratio_low", &a.clip_ratio_low, "must be in (0, 1)");
        }
        if !above(a.clip_ratio_high, 0.0) {
            return err("algorithm.clip_ratio_high", &a.clip_ratio_high, "must be positive");
        }
        if !above(a.clip_ratio_c, 1.0) {
            return err("algorithm.clip_ratio_c", &a.clip_ratio_c, "must be greater than 1");
        }
        if !(0.0..=1.0).contains(&a.gamma) {
            return err("algorithm.gamma", &a.gamma, "must be in [0, 1]");
        }
        if !(0.0..=1.0).contains(&a.lam) {
            return err("algorithm.lam", &a.lam, "must be in [0, 1]");
        }
        if !at_least(a.kl_coef, 0.0) {
            return err("algorithm.kl_coef", &a.kl_coef, "must be >= 0");
        }
        if let Some(cap) = a.tis_cap
            && !at_least(cap, 1.0)
        {
            return err("algorithm.tis_cap", &cap, "must be >= 1");
        }
        if a.ppo_epochs == 0 {
            return err("algorithm.ppo_epochs", &a.ppo_epochs, "must be at least 1");
        }
        if let Some(cap) = a.behav_imp_weight_cap
            && !at_least(cap, 1.0)
        {
            return err("algorithm.behav_imp_weight_cap", &cap, "must be >= 1");
        }
        if a.decoupled && a.tis_cap.is_some() {
            return err(
                "algorithm.tis_cap",
                &a.tis_cap.unwrap_or_default(),
                "and algorithm.decoupled both weight tokens by the behaviour policy: use one (decoupled takes behav_imp_weight_cap)",
            );
        }
        if let Some(buffer) = &a.overlong.buffer {
            if buffer.len == 0 {
                return err("algorithm.overlong.buffer.len", &0, "must be at least 1");
            }
            if !at_least(buffer.penalty_factor, 0.0) {
                return err(
                    "algorithm.overlong.buffer.penalty_factor",
                    &buffer.penalty_factor,
                    "must be >= 0",
                );
            }
        }
        let k = &a.kl_ctrl;
        if !at_least(k.kl_coef, 0.0) {
            return err("algorithm.kl_ctrl.kl_coef", &k.kl_coef, "must be >= 0");
        }
        if k.kind == KlCtrlType::Adaptive {
            if !above(k.target_kl, 0.0) {
                return err("algorithm.kl_ctrl.target_kl", &k.target_kl, "must be positive");
            }
            if !above(k.horizon, 0.0) {
                return err("algorithm.kl_ctrl.horizon", &k.horizon, "must be positive");
            }
        }
        if self.sharding == Sharding::Full && !self.activation_checkpointing {
            return err(
                "sharding",
                &"full",
                "needs activation_checkpointing: true (a layer's gathered weights are dropped after its forward pass and gathered again for its recomputed backward pass)",
            );
        }
        if self.rollout.interruptible
            && !matches!(self.weight_sync.servers(), Some((InferenceServer::Sglang, _)))
        {
            return err(
                "rollout.interruptible",
                &true,
                "needs weight_sync.kind = sglang_disk or sglang_broadcast (the embedded engine already swaps weights between decoding steps; vLLM's updates wait for the requests in flight)",
            );
        }
        if let WeightSync::SglangDisk { path, .. } | WeightSync::VllmDisk { path, .. } = &self.weight_sync
            && !path.is_absolute()
        {
            let value = format!("{path:?}");
            return err("weight_sync.path", &value, "must be an absolute path the inference servers see too");
        }
        if let WeightSync::SglangBroadcast { master_address, bucket_mb, timeout_secs, .. }
        | WeightSync::VllmBroadcast { master_address, bucket_mb, timeout_secs, .. } = &self.weight_sync
        {
            if master_address.as_deref().is_some_and(|a| a.trim().is_empty()) {
                return err("weight_sync.master_address", &"\"\"", "must be a host name or an address");
            }
            if !above(*bucket_mb, 0.0) {
                return err("weight_sync.bucket_mb", bucket_mb, "must be positive");
            }
            if !above(*timeout_secs, 0.0) {
                return err("weight_sync.timeout_secs", timeout_secs, "must be positive");
            }
        }
        if let Some((server, urls)) = self.weight_sync.servers() {
            if urls.is_empty() {
                let reason = match server {
                    InferenceServer::Sglang => "must name the SGLang servers to update",
                    InferenceServer::Vllm => "must name the vLLM servers to update",
                };
                return err("weight_sync.urls", &"[]", reason);
            }
            if let Some(url) = urls.iter().find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
            {
                return err("weight_sync.urls", url, "must be http:// or https:// URLs");
            }
        }
        if b.micro_batch_tokens == Some(0) {
            return err("batch.micro_batch_tokens", &0, "must be at least 1");
        }
        let d = &self.distributed;
        if !above(d.timeout_secs, 0.0) {
            return err("distributed.timeout_secs", &d.timeout_secs, "must be positive");
        }
        if !above(d.bucket_mb, 0.0) {
            return err("distributed.bucket_mb", &d.bucket_mb, "must be positive");
        }
        if b.n == 0 {
            return err("batch.n", &b.n, "must be at least 1");
        }
        if matches!(a.advantage, AdvantageEstimator::Rloo) && b.n < 2 {
            return err("batch.n", &b.n, "rloo needs at least 2 trajectories per prompt");
        }
        if b.prompts == 0 {
            return err("batch.prompts", &b.prompts, "must be at least 1");
        }
        if b.mini_batch_prompts == 0 || !b.prompts.is_multiple_of(b.mini_batch_prompts) {
            return err("batch.mini_batch_prompts", &b.mini_batch_prompts, "must divide batch.prompts");
        }
        if b.micro_batch_size == 0 {
            return err("batch.micro_batch_size", &b.micro_batch_size, "must be at least 1");
        }
        for (field, o) in [("optim", &self.optim), ("critic.optim", &self.critic.optim)] {
            if !at_least(o.lr, 0.0) {
                return err(
                    if field == "optim" { "optim.lr" } else { "critic.optim.lr" },
                    &o.lr,
                    "must be >= 0",
                );
            }
            if !(0.0..1.0).contains(&o.warmup_ratio) {
                return err(
                    if field == "optim" { "optim.warmup_ratio" } else { "critic.optim.warmup_ratio" },
                    &o.warmup_ratio,
                    "must be in [0, 1)",
                );
            }
        }
        if !above(self.critic.cliprange_value, 0.0) {
            return err("critic.cliprange_value", &self.critic.cliprange_value, "must be positive");
        }
        if !above(self.rollout.sampling.temperature, 0.0) {
            return err(
                "rollout.sampling.temperature",
                &self.rollout.sampling.temperature,
                "must be positive",
            );
        }
        let deadline = self.rollout.retry_deadline_secs;
        if !(deadline >= 0.0 && std::time::Duration::try_from_secs_f64(deadline).is_ok()) {
            return err("rollout.retry_deadline_secs", &deadline, "must be a number of seconds >= 0");
        }
        if self.rollout.urls.is_empty()
            && self.rollout.context.retriever_url.is_none()
            && self.rollout.index.is_none()
            && self.rollout.env.searches()
        {
            return err(
                "rollout.index",
                &"null",
                "an in-process pool needs rollout.index or rollout.retriever_url (or set rollout.urls)",
            );
        }
        if let Some(lora) = &self.lora {
            lora.validate().map_err(|e| e.within("lora"))?;
            if self.sharding == Sharding::Full {
                // The frozen base is replicated on every rank: the ranks shard only what trains.
                return err(
                    "sharding",
                    &"full",
                    "LoRA trains adapters on a replicated base: use none, optimizer or gradients",
                );
            }
            if lora.lora_dropout > 0.0 && self.activation_checkpointing {
                return err(
                    "lora.lora_dropout",
                    &lora.lora_dropout,
                    "activation_checkpointing recomputes each layer, and would draw other dropout masks the second time: set it to 0",
                );
            }
        }
        self.tracking.validate().map_err(|e| e.within("tracking"))?;
        self.rollout.env.validate().map_err(|e| e.within("rollout.env"))?;
        self.rollout.context.validate().map_err(|e| e.within("rollout"))
    }
}

/// `x` is finite and greater than `min`.
fn above(x: f64, min: f64) -> bool {
    x.is_finite() && x > min
}

/// `x` is finite and at least `min`.
fn at_least(x: f64, min: f64) -> bool {
    x.is_finite() && x >= min
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> TrainConfig {
        TrainConfig {
            model: "/m".into(),
            data: DataConfig { train: "/d.parquet".into(), ..DataConfig::default() },
            rollout: RolloutSource { urls: vec!["http://pool:8001".into()], ..RolloutSource::default() },
            ..TrainConfig::default()
        }
    }

    #[test]
    fn defaults_follow_verl_and_search_r1() {
        let c: TrainConfig =
            serde_json::from_str(r#"{"model": "/m", "data": {"train": "t.parquet"}}"#).unwrap();
        assert_eq!(c.algorithm.kl_loss, Some(KlEstimator::LowVarKl));
        assert_eq!(c.algorithm.kl_coef, 0.001);
        assert_eq!(c.algorithm.clip_ratio_c, 3.0);
        assert_eq!(c.critic.cliprange_value, 0.5);
        assert!(c.algorithm.mask_observations);
        assert_eq!(c.weight_sync, WeightSync::HttpPull { advertise_url: None });
    }

    #[test]
    fn unknown_keys_and_values_are_named() {
        let e = serde_json::from_str::<TrainConfig>(r#"{"algorithm": {"advantage": "ppo2"}}"#).unwrap_err();
        assert!(e.to_string().contains("ppo2"), "{e}");
        let e = serde_json::from_str::<TrainConfig>(r#"{"batch": {"size": 3}}"#).unwrap_err();
        assert!(e.to_string().contains("size"), "{e}");
    }

    #[test]
    fn estimators_parse_from_their_config_names() {
        assert_eq!("drgrpo".parse::<AdvantageEstimator>().unwrap(), AdvantageEstimator::Drgrpo);
        assert_eq!("gae".parse::<AdvantageEstimator>().unwrap(), AdvantageEstimator::Gae);
        let e = "ppo2".parse::<AdvantageEstimator>().unwrap_err().to_string();
        assert!(e.contains("ppo2") && e.contains("grpo"), "{e}");
    }

    #[test]
    fn the_in_process_pool_takes_a_workers_tool_keys() {
        let c: TrainConfig = serde_json::from_str(
            r#"{"rollout": {"retriever_url": "http://r:8000", "tool_timeout_secs": 5, "search_cache_entries": 7,
                            "retry": {"retries": 1, "backoff_ms": 2}, "env": {"kind": "tir"}}}"#,
        )
        .unwrap();
        let context = &c.rollout.context;
        assert_eq!(context.retriever_url.as_deref(), Some("http://r:8000"));
        assert_eq!((context.tool_timeout_secs, context.search_cache_entries), (5.0, 7));
        assert_eq!((context.retry.retries, context.retry.backoff_ms), (1, 2));
        assert!(matches!(c.rollout.env, EnvConfig::Tir(_)));
        let e = serde_json::from_str::<TrainConfig>(r#"{"rollout": {"tool_timeout": 5}}"#).unwrap_err();
        assert!(e.to_string().contains("tool_timeout"), "{e}");
        let mut c = valid();
        c.rollout.context.tool_timeout_secs = 0.0;
        assert!(c.validate().unwrap_err().to_string().starts_with("rollout.tool_timeout_secs = 0"));
    }

    #[test]
    fn validation_names_field_and_value() {
        assert_eq!(valid().validate(), Ok(()));
        let mut c = valid();
        c.algorithm.clip_ratio_low = 1.5;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "algorithm.clip_ratio_low = 1.5: must be in (0, 1)"
        );
        let mut c = valid();
        c.batch.mini_batch_prompts = 3;
        assert!(c.validate().unwrap_err().to_string().starts_with("batch.mini_batch_prompts = 3"));
        let mut c = valid();
        c.algorithm.advantage = AdvantageEstimator::Rloo;
        c.batch.n = 1;
        assert!(c.validate().unwrap_err().to_string().starts_with("batch.n = 1"));
        let mut c = valid();
        c.rollout.urls.clear();
        assert!(c.validate().unwrap_err().to_string().starts_with("rollout.index"));
        let mut c = valid();
        c.rollout.retry_deadline_secs = -1.0;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "rollout.retry_deadline_secs = -1: must be a number of seconds >= 0"
        );
        let mut c = valid();
        c.critic.optim.lr = -1.0;
        assert!(c.validate().unwrap_err().to_string().starts_with("critic.optim.lr = -1"));
        let mut c = valid();
        c.sharding = Sharding::Full;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .starts_with("sharding = full: needs activation_checkpointing")
        );
        c.activation_checkpointing = true;
        assert_eq!(c.validate(), Ok(()));
        let mut c = valid();
        c.batch.micro_batch_tokens = Some(0);
        assert!(c.validate().unwrap_err().to_string().starts_with("batch.micro_batch_tokens = 0"));
        let sglang = |path: &str, urls: &[&str]| WeightSync::SglangDisk {
            path: path.into(),
            urls: urls.iter().map(|u| u.to_string()).collect(),
        };
        for (sync, message) in [
            (
                sglang("weights", &["http://s:30000"]),
                "weight_sync.path = \"weights\": must be an absolute path",
            ),
            (sglang("/w", &[]), "weight_sync.urls = []: must name the SGLang servers"),
            (sglang("/w", &["s:30000"]), "weight_sync.urls = s:30000: must be http:// or https://"),
            (
                serde_json::from_value(
                    serde_json::json!({"kind": "vllm_disk", "path": "w", "urls": ["http://v:8000"]}),
                )
                .unwrap(),
                "weight_sync.path = \"w\": must be an absolute path",
            ),
            (
                serde_json::from_value(serde_json::json!({"kind": "vllm_disk", "path": "/w"})).unwrap(),
                "weight_sync.urls = []: must name the vLLM servers",
            ),
        ] {
            let mut c = valid();
            c.weight_sync = sync;
            let error = c.validate().unwrap_err().to_string();
            assert!(error.starts_with(message), "{error}");
        }
        let mut c = valid();
        c.weight_sync = sglang("/w", &["http://pool-sglang-replicas.ml.svc:30000"]);
        assert_eq!(c.validate(), Ok(()));
        let vllm_disk = serde_json::json!({"kind": "vllm_disk", "path": "/w", "urls": ["http://v:8000"]});
        let vllm_disk: WeightSync = serde_json::from_value(vllm_disk).unwrap();
        assert_eq!(
            (vllm_disk.kind(), vllm_disk.servers().map(|(s, _)| s)),
            ("vllm_disk", Some(InferenceServer::Vllm))
        );
        let mut v = valid();
        v.weight_sync = vllm_disk;
        assert_eq!(v.validate(), Ok(()));
        v.rollout.interruptible = true;
        let error = v.validate().unwrap_err().to_string();
        assert!(
            error.starts_with("rollout.interruptible = true: needs weight_sync.kind = sglang_disk"),
            "{error}"
        );
        c.rollout.interruptible = true;
        assert_eq!(c.validate(), Ok(()));
        c.weight_sync = WeightSync::default();
        let error = c.validate().unwrap_err().to_string();
        assert!(
            error.starts_with("rollout.interruptible = true: needs weight_sync.kind = sglang_disk"),
            "{error}"
        );
        let broadcast: WeightSync = serde_json::from_value(
            serde_json::json!({"kind": "sglang_broadcast", "urls": ["http://s:30000"]}),
        )
        .unwrap();
        let WeightSync::SglangBroadcast { master_address, master_port, bucket_mb, timeout_secs, .. } =
            &broadcast
        else {
            panic!("{broadcast:?}")
        };
        assert_eq!((master_address, *master_port, *bucket_mb, *timeout_secs), (&None, 0, 512.0, 600.0));
        c.weight_sync = broadcast.clone();
        c.rollout.interruptible = true;
        assert_eq!(c.validate(), Ok(()));
        for (field, value, message) in [
            ("bucket_mb", serde_json::json!(0.0), "weight_sync.bucket_mb = 0: must be positive"),
            ("timeout_secs", serde_json::json!(-1.0), "weight_sync.timeout_secs = -1: must be positive"),
            ("master_address", serde_json::json!(" "), "weight_sync.master_address = \"\": must be"),
            ("urls", serde_json::json!([]), "weight_sync.urls = []: must name the SGLang servers"),
        ] {
            let mut sync = serde_json::to_value(&broadcast).unwrap();
            sync[field] = value;
            c.weight_sync = serde_json::from_value(sync).unwrap();
            let error = c.validate().unwrap_err().to_string();
            assert!(error.starts_with(message), "{error}");
        }
        let vllm: WeightSync =
            serde_json::from_value(serde_json::json!({"kind": "vllm_broadcast", "urls": ["http://v:8000"]}))
                .unwrap();
        assert_eq!(vllm.servers(), Some((InferenceServer::Vllm, &["http://v:8000".to_string()][..])));
        c.weight_sync = vllm.clone();
        c.rollout.interruptible = false;
        assert_eq!(c.validate(), Ok(()));
        c.rollout.interruptible = true;
        let error = c.validate().unwrap_err().to_string();
        assert!(
            error.starts_with("rollout.interruptible = true: needs weight_sync.kind = sglang_disk"),
            "{error}"
        );
        c.rollout.interruptible = false;
        for (field, value, message) in [
            ("bucket_mb", serde_json::json!(-2.0), "weight_sync.bucket_mb = -2: must be positive"),
            ("urls", serde_json::json!([]), "weight_sync.urls = []: must name the vLLM servers"),
        ] {
            let mut sync = serde_json::to_value(&vllm).unwrap();
            sync[field] = value;
            c.weight_sync = serde_json::from_value(sync).unwrap();
            let error = c.validate().unwrap_err().to_string();
            assert!(error.starts_with(message), "{error}");
        }
    }

    /// DAPO's linear penalty: none up to `max - len`, then down to `-penalty_factor` at `max`.
    #[test]
    fn the_overlong_penalty_is_dapos() {
        let buffer = OverlongBuffer { len: 100, penalty_factor: 0.5 };
        assert_eq!(buffer.penalty(850, 1000), 0.0);
        assert_eq!(buffer.penalty(900, 1000), 0.0);
        assert!((buffer.penalty(950, 1000) + 0.25).abs() < 1e-12);
        assert!((buffer.penalty(1000, 1000) + 0.5).abs() < 1e-12);
        let c: AlgorithmConfig =
            serde_json::from_str(r#"{"overlong": {"mask": true, "buffer": {"len": 64}}}"#).unwrap();
        assert_eq!(c.overlong.buffer, Some(OverlongBuffer { len: 64, penalty_factor: 1.0 }));
        assert!(c.overlong.mask);
    }

    #[test]
    fn memory_settings_parse() {
        let c: TrainConfig = serde_json::from_str(
            r#"{"precision": "bf16", "activation_checkpointing": true, "batch": {"micro_batch_tokens": 8192}}"#,
        )
        .unwrap();
        assert_eq!((c.precision, c.activation_checkpointing), (Some(Precision::Bf16), true));
        assert_eq!(c.batch.micro_batch_tokens, Some(8192));
        assert_eq!(Precision::resolve(None, true), Precision::Bf16);
        assert_eq!(Precision::resolve(None, false), Precision::F32);
        assert_eq!(Precision::resolve(Some(Precision::Bf16), false), Precision::Bf16);
        let e = serde_json::from_str::<TrainConfig>(r#"{"precision": "fp16"}"#).unwrap_err();
        assert!(e.to_string().contains("fp16"), "{e}");
    }
}

//! The TrainingJob kind: a `kart train` Job (indexed across nodes) with its rendered config and a
//! checkpoint volume, started once its Retriever and RolloutPool are Ready.

use super::pod::PodOverrides;
use super::schema::embedded;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kart_core::config::train::TrainConfig;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A training run.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kart.dev",
    version = "v1alpha1",
    kind = "TrainingJob",
    namespaced,
    shortname = "tj",
    status = "TrainingJobStatus",
    doc = "A training run: `kart train` in a Job, with its config and a checkpoint volume.",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Queue","type":"string","jsonPath":".status.queue.reason"}"#,
    printcolumn = r#"{"name":"Ranks","type":"integer","jsonPath":".status.worldSize"}"#,
    printcolumn = r#"{"name":"Step","type":"integer","jsonPath":".status.step"}"#,
    printcolumn = r#"{"name":"Reward","type":"number","jsonPath":".status.reward"}"#,
    printcolumn = r#"{"name":"EvalEM","type":"number","jsonPath":".status.evalEm"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.config) && has(self.config.model) && self.config.model != ''",
        "message": "config.model (a Hugging Face folder) is required"
    },
    {
        "rule": "!has(self.config) || !has(self.config.algorithm) || !has(self.config.algorithm.clip_ratio_low) || (self.config.algorithm.clip_ratio_low > 0.0 && self.config.algorithm.clip_ratio_low < 1.0)",
        "message": "config.algorithm.clip_ratio_low must be in (0, 1)"
    },
    {
        "rule": "!has(self.config) || !has(self.config.algorithm) || !has(self.config.algorithm.clip_ratio_high) || self.config.algorithm.clip_ratio_high > 0.0",
        "message": "config.algorithm.clip_ratio_high must be positive"
    },
    {
        "rule": "!has(self.config) || !has(self.config.algorithm) || !has(self.config.algorithm.clip_ratio_c) || self.config.algorithm.clip_ratio_c > 1.0",
        "message": "config.algorithm.clip_ratio_c must be greater than 1"
    },
    {
        "rule": "!has(oldSelf.config) || !has(oldSelf.config.model) || (has(self.config) && has(self.config.model) && self.config.model == oldSelf.config.model)",
        "message": "config.model is immutable"
    }
]))]
pub struct TrainingJobSpec {
    /// The run's configuration, rendered into the ConfigMap the trainer reads. `output_dir` is the
    /// checkpoint volume, `port` 8002; `rollout.urls` comes from `rolloutPoolRef` and
    /// `rollout.retriever_url` from `retrieverRef` when unset.
    #[schemars(schema_with = "embedded::<TrainConfig>")]
    pub config: TrainConfig,
    /// A Retriever in the same namespace the run waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retriever_ref: Option<String>,
    /// A RolloutPool in the same namespace the run waits for and sends rollout requests to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_pool_ref: Option<String>,
    /// Trainer pods (an indexed Job with `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE` and
    /// `NODE_RANK`). Several nodes need a `ReadWriteMany` checkpoint volume.
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub nodes: i32,
    /// Trainer processes (ranks) per pod, one per GPU: each pod runs
    /// `kart train --nproc-per-node <gpusPerNode>`. Default: the pod's `nvidia.com/gpu` limit, 1
    /// without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub gpus_per_node: Option<i32>,
    /// Failed attempts restarted (each from the last checkpoint) before the run fails.
    #[serde(default = "default_backoff_limit")]
    #[schemars(range(min = 0))]
    pub backoff_limit: i32,
    /// Stop the trainer; unsuspending resumes from the last checkpoint.
    #[serde(default)]
    pub suspend: bool,
    /// A Kueue LocalQueue in the same namespace the trainer Job waits in until Kueue admits its
    /// whole gang of pods (the label `kueue.x-k8s.io/queue-name` on the TrainingJob does the
    /// same). Kueue may evict an admitted run for one of higher priority (the TrainingJob's
    /// `kueue.x-k8s.io/priority-class` label names its WorkloadPriorityClass): the trainer then
    /// checkpoints the step it finished, and resumes from it when readmitted; an eviction is not
    /// a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_name: Option<String>,
    /// Seconds the trainer's pods get after SIGTERM (deletion, suspension, preemption, eviction)
    /// to finish the step's update and write its checkpoint before they are killed.
    #[serde(default = "default_termination_grace")]
    #[schemars(range(min = 0))]
    pub termination_grace_period_seconds: i64,
    /// Seconds after the run finished when its workloads (Job, Services, ConfigMap) are deleted;
    /// the checkpoint volume stays until the TrainingJob is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// The checkpoint volume (`config.output_dir`).
    #[serde(default)]
    pub checkpoint: CheckpointVolume,
    /// Overrides of the trainer pods (GPUs, the model and data volumes).
    #[serde(default)]
    pub pod: PodOverrides,
}

/// Where checkpoints go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointVolume {
    /// An existing PersistentVolumeClaim; when unset the operator creates `<name>-checkpoints`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_claim: Option<String>,
    /// Size of the claim the operator creates.
    #[serde(default = "default_checkpoint_size")]
    pub size: String,
    /// Storage class of the claim the operator creates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Access modes of the claim the operator creates (several nodes need `ReadWriteMany`).
    #[serde(default = "default_access_modes")]
    pub access_modes: Vec<String>,
    /// Where the volume is mounted (and `config.output_dir`).
    #[serde(default = "default_mount_path")]
    pub mount_path: String,
}

impl Default for CheckpointVolume {
    fn default() -> Self {
        CheckpointVolume {
            existing_claim: None,
            size: default_checkpoint_size(),
            storage_class_name: None,
            access_modes: default_access_modes(),
            mount_path: default_mount_path(),
        }
    }
}

fn one() -> i32 {
    1
}

fn default_backoff_limit() -> i32 {
    3
}

fn default_termination_grace() -> i64 {
    300
}

fn default_checkpoint_size() -> String {
    "50Gi".into()
}

fn default_access_modes() -> Vec<String> {
    vec!["ReadWriteOnce".into()]
}

fn default_mount_path() -> String {
    "/var/lib/kart/checkpoints".into()
}

/// Lifecycle of a TrainingJob.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TrainingJobPhase {
    /// Nothing reconciled yet, or the spec is invalid.
    #[default]
    Pending,
    /// The Retriever or RolloutPool is not Ready.
    WaitingForDependencies,
    /// The trainer Job waits in its Kueue queue (not yet admitted, or evicted and waiting to be
    /// readmitted).
    Queued,
    /// The trainer runs.
    Running,
    /// The trainer finished.
    Succeeded,
    /// The trainer failed more than `backoffLimit` times.
    Failed,
    /// `spec.suspend` stopped the trainer.
    Suspended,
}

impl TrainingJobPhase {
    /// Every phase, for the `kart_operator_training_jobs{phase}` gauge.
    pub const ALL: [TrainingJobPhase; 7] = [
        TrainingJobPhase::Pending,
        TrainingJobPhase::WaitingForDependencies,
        TrainingJobPhase::Queued,
        TrainingJobPhase::Running,
        TrainingJobPhase::Succeeded,
        TrainingJobPhase::Failed,
        TrainingJobPhase::Suspended,
    ];

    /// The phase's name, as in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            TrainingJobPhase::Pending => "Pending",
            TrainingJobPhase::WaitingForDependencies => "WaitingForDependencies",
            TrainingJobPhase::Queued => "Queued",
            TrainingJobPhase::Running => "Running",
            TrainingJobPhase::Succeeded => "Succeeded",
            TrainingJobPhase::Failed => "Failed",
            TrainingJobPhase::Suspended => "Suspended",
        }
    }

    /// Succeeded or Failed: the run's children are never recreated.
    pub fn is_finished(self) -> bool {
        matches!(self, TrainingJobPhase::Succeeded | TrainingJobPhase::Failed)
    }
}

/// Observed state of a TrainingJob.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobStatus {
    /// Lifecycle phase.
    #[serde(default)]
    pub phase: TrainingJobPhase,
    /// The trainer's last reported step.
    #[serde(default)]
    pub step: u64,
    /// The trainer's last reported policy version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
    /// Mean reward of the last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    /// Exact match of the last evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_em: Option<f64>,
    /// The last checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// Trainer processes of the run (nodes x gpusPerNode), as the trainer reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<i32>,
    /// Trainer Jobs started; every Job after the first resumes from the last checkpoint.
    #[serde(default)]
    pub attempts: i32,
    /// Trainer Jobs that failed.
    #[serde(default)]
    pub failures: i32,
    /// Times Kueue evicted the running trainer (each resumed from its checkpoint when
    /// readmitted; not failures).
    #[serde(default)]
    pub preemptions: i32,
    /// Where the trainer Job stands in its Kueue queue (with `spec.queueName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStatus>,
    /// The current (or last) trainer Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// When the first trainer Job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the run finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The finished run's workloads were deleted after `ttlSecondsAfterFinished`.
    #[serde(default)]
    pub cleaned_up: bool,
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions (`ValidationFailed`, `WaitingForDependencies`, `Queued`, `Running`,
    /// `Succeeded`, `Failed`, `Suspended`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A queued trainer Job's place in Kueue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// The LocalQueue.
    pub local_queue: String,
    /// The ClusterQueue that admitted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_queue: Option<String>,
    /// Kueue's Workload for the Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// Kueue let the Job run.
    #[serde(default)]
    pub admitted: bool,
    /// `Admitted`, or Kueue's reason it is not: `Pending` (no quota yet), `Preempted`,
    /// `InactiveWorkload`, …; `NoWorkload` when Kueue has made none.
    pub reason: String,
    /// Kueue's message (e.g. which resource lacks quota).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl TrainingJob {
    /// The Kueue LocalQueue of the run: `spec.queueName`, else the `kueue.x-k8s.io/queue-name`
    /// label.
    pub fn queue(&self) -> Option<&str> {
        self.spec
            .queue_name
            .as_deref()
            .or_else(|| self.metadata.labels.as_ref()?.get(super::kueue::QUEUE_NAME).map(String::as_str))
            .filter(|q| !q.is_empty())
    }
}

//! One optimisation step on a batch of samples: old, reference and value passes without
//! gradients, advantages, then PPO epochs over mini-batches with gradient accumulation over
//! micro-batches, for the policy and (PPO) the critic.

use super::batch::{Field, MicroBatching, Sample};
use super::checkpoint::Loaded;
use super::critic::Critic;
use super::data_parallel::DataParallel;
use super::layer_shards::{Fault, LayerShards};
use super::losses::{self, Correction, Normalizer};
use super::optim::{AdamW, StateError, learning_rate};
use super::record::{StepRecord, keys};
use super::zero::{Optimizer, ShardedAdamW};
use kart_core::config::memory::{Precision, Sharding};
use kart_core::config::train::{AdvantageEstimator, OptimConfig, OverlongConfig, TrainConfig};
use kart_core::rl::advantage::{grpo_advantages, rloo_advantages};
use kart_core::rl::kl::KlEstimator;
use kart_core::rl::kl_ctrl::KlController;
use kart_core::rl::loss::{Matrix, PolicyClip};
use kart_model::lora::AdapterMode;
use kart_model::{CausalLm, ModelError};
use kart_torch::DistError;
use std::path::PathBuf;
use tch::{Device, Kind, Tensor};

/// Why the learner could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{path}: {source}")]
    OptimizerState {
        path: PathBuf,
        #[source]
        source: StateError,
    },
    #[error("{path}: a PPO run needs the critic's checkpoint")]
    MissingCritic { path: PathBuf },
    #[error(transparent)]
    Dist(#[from] DistError),
}

/// The optimisers' states gathered whole, for a checkpoint.
pub struct OptimizerStates {
    /// The policy's, and its update count.
    pub policy: (Vec<(String, Tensor)>, i64),
    /// The critic's (PPO).
    pub critic: Option<(Vec<(String, Tensor)>, i64)>,
}

/// The models and optimisers a step updates.
pub struct Learner {
    pub policy: CausalLm,
    pub optimizer: Optimizer,
    /// The frozen reference policy of the KL loss and of the KL penalty in the reward, when it
    /// is a model of its own.
    pub reference: Option<CausalLm>,
    /// The reference is the policy's base, its LoRA adapters switched off (no second model).
    base_reference: bool,
    /// The critic and its optimiser (PPO).
    pub critic: Option<(Critic, Optimizer)>,
    /// The coefficient of the KL penalty in the reward (`algorithm.kl_in_reward`).
    pub kl_ctrl: Option<KlController>,
    /// This rank's part in a data-parallel run (none: one process does all the work).
    pub parallel: Option<DataParallel>,
    /// Where the layer gatherings of `sharding: full` leave a failed collective.
    fault: Fault,
}

/// Whether the run scores a reference policy: for the KL loss or the KL penalty in the reward.
fn wants_reference(config: &TrainConfig) -> bool {
    config.algorithm.kl_loss.is_some() || config.algorithm.kl_in_reward
}

/// The kind of the parameters and compute for `precision` (unset: bf16 on CUDA, f32 on the CPU).
pub fn parameter_kind(precision: Option<Precision>, device: Device) -> Kind {
    match Precision::resolve(precision, device.is_cuda()) {
        Precision::Bf16 => Kind::BFloat16,
        Precision::F32 => Kind::Float,
    }
}

/// The mini-batch normaliser of `rows`.
fn normalizer(samples: &[Sample], rows: &[usize]) -> Normalizer {
    let mut n = Normalizer { tokens: 0.0, sequences: 0.0, length: 0.0 };
    for &r in rows {
        let s = &samples[r];
        let tokens = s.trained_tokens() as f64;
        n.tokens += tokens;
        n.sequences += f64::from(u8::from(tokens > 0.0));
        n.length = n.length.max((s.len() - s.prompt_len) as f64);
    }
    n
}

impl Learner {
    /// Loads the policy (from `checkpoint` when resuming, else `config.model`), the frozen
    /// reference of the KL loss, and for PPO the critic, on `device`, and assembles them
    /// ([`Self::assemble`]) into `parallel`'s run; a checkpoint's optimiser states and critic are
    /// restored.
    pub fn load(
        config: &TrainConfig,
        checkpoint: Option<&Loaded>,
        device: Device,
        parallel: Option<DataParallel>,
    ) -> Result<Learner, LearnerError> {
        let policy_dir = checkpoint.map_or_else(|| config.model.clone(), Loaded::policy_dir);
        let kind = parameter_kind(config.precision, device);
        let policy = match &config.lora {
            None => CausalLm::load_as(&policy_dir, device, Kind::Float)?,
            // The frozen base in the run's kind, the adapters (a checkpoint's, or fresh) in f32.
            Some(lora) => {
                let mut policy = CausalLm::load_as(&config.model, device, kind)?;
                match checkpoint {
                    Some(_) => policy.load_lora(&policy_dir)?,
                    None => policy.attach_lora(lora, config.seed)?,
                }
                policy
            }
        };
        // With LoRA the reference is the policy's base, its adapters switched off.
        let reference = match wants_reference(config) && config.lora.is_none() {
            true => {
                let mut r = CausalLm::load_as(&config.model, device, kind)?;
                r.var_store_mut().freeze();
                if config.reference.offload {
                    r.offload_layers();
                }
                Some(r)
            }
            false => None,
        };
        let critic = match config.algorithm.advantage {
            AdvantageEstimator::Gae => {
                let mut critic = Critic::load(&config.model, device, config.seed)?;
                if let Some(c) = checkpoint {
                    let origin = c.dir.join("critic.safetensors");
                    let tensors = c
                        .critic
                        .as_ref()
                        .ok_or_else(|| LearnerError::MissingCritic { path: origin.clone() })?;
                    critic.load_parameters(tensors, &origin)?;
                }
                Some(critic)
            }
            _ => None,
        };
        let mut learner = Self::assemble(policy, reference, critic, config, kind, parallel)?;
        if let (Some(ctrl), Some(value)) = (&mut learner.kl_ctrl, checkpoint.and_then(|c| c.state.kl_coef)) {
            *ctrl = KlController::resumed(config.algorithm.kl_ctrl, value);
        }
        if let Some(c) = checkpoint {
            let state_error = |source| LearnerError::OptimizerState { path: c.dir.clone(), source };
            learner.optimizer.load_state(copy(&c.optimizer), c.state.optimizer_steps).map_err(state_error)?;
            if let (Some((_, opt)), Some(state)) = (&mut learner.critic, &c.critic_optimizer) {
                opt.load_state(copy(state), c.state.critic_optimizer_steps.unwrap_or(0))
                    .map_err(state_error)?;
            }
        }
        Ok(learner)
    }

    /// The learner of the f32 `policy` and `critic` (and the frozen `reference`): in a
    /// data-parallel run every rank starts from rank 0's parameters; each optimiser is AdamW,
    /// replicated or sharded over the ranks as `config.sharding` says, and lowers its parameters
    /// to `kind` (keeping f32 masters). With `full`, the models' decoder layers are sharded too
    /// (the reference's unless it is offloaded), and rank 0 keeps the policy and critic whole
    /// between steps (to publish and save them).
    pub fn assemble(
        mut policy: CausalLm,
        mut reference: Option<CausalLm>,
        critic: Option<Critic>,
        config: &TrainConfig,
        kind: Kind,
        parallel: Option<DataParallel>,
    ) -> Result<Learner, DistError> {
        let fault = Fault::default();
        let optimizer = |model: &mut CausalLm,
                         params: Vec<(String, Tensor)>,
                         optim: &OptimConfig,
                         kind: Kind|
         -> Result<Optimizer, DistError> {
            let Some(p) = &parallel else {
                return Ok(Optimizer::Replicated(AdamW::mixed(params, optim.clone(), kind)));
            };
            p.broadcast_parameters(&params.iter().map(|(_, t)| t.shallow_clone()).collect::<Vec<_>>())?;
            Ok(match config.sharding {
                Sharding::None => Optimizer::Replicated(AdamW::mixed(params, optim.clone(), kind)),
                sharding => {
                    let sharded = ShardedAdamW::new(params, optim.clone(), kind, sharding, p);
                    if sharding == Sharding::Full {
                        model.set_residency(Box::new(sharded.layer_shards(p.group().share(), fault.clone())));
                    }
                    Optimizer::Sharded(sharded)
                }
            })
        };
        // With LoRA only the adapters train, and they stay f32 beside a base of `kind`.
        let (params, policy_kind) = match policy.lora() {
            Some(adapters) => (adapters.named_tensors(), Kind::Float),
            None => (policy.named_tensors(), kind),
        };
        let policy_optimizer = optimizer(&mut policy, params, &config.optim, policy_kind)?;
        let critic = match critic {
            Some(mut critic) => {
                let params = critic.parameters();
                let opt = optimizer(&mut critic.model, params, &config.critic.optim, kind)?;
                Some((critic, opt))
            }
            None => None,
        };
        if let (Some(p), Sharding::Full, Some(r)) = (&parallel, config.sharding, &mut reference)
            && !config.reference.offload
        {
            let shards = LayerShards::frozen(r, p.group().share(), fault.clone());
            r.set_residency(Box::new(shards));
        }
        let kl_ctrl = config.algorithm.kl_in_reward.then(|| KlController::new(config.algorithm.kl_ctrl));
        let base_reference = policy.lora().is_some() && wants_reference(config);
        let learner = Learner {
            policy,
            optimizer: policy_optimizer,
            reference,
            base_reference,
            critic,
            kl_ctrl,
            parallel,
            fault,
        };
        learner.gather_trained()?;
        Ok(learner)
    }

    /// With `sharding: full`, gathers the policy's and critic's layers (every rank takes part):
    /// rank 0 keeps them whole, to publish and save, until [`Self::release_trained`]; the other
    /// ranks drop them at once.
    fn gather_trained(&self) -> Result<(), DistError> {
        let keep = self.parallel.as_ref().is_some_and(|p| p.group().rank() == 0);
        self.policy.gather_layers(keep);
        if let Some((critic, _)) = &self.critic {
            critic.model.gather_layers(keep);
        }
        self.fault.check()
    }

    /// Drops the layers [`Self::gather_trained`] kept whole (before a step's passes).
    fn release_trained(&self) {
        self.policy.release_layers();
        if let Some((critic, _)) = &self.critic {
            critic.model.release_layers();
        }
    }

    /// Whether a reference policy is scored (a model of its own, or the policy's base).
    fn has_reference(&self) -> bool {
        self.reference.is_some() || self.base_reference
    }

    /// The device the policy lives on.
    pub fn device(&self) -> Device {
        self.policy.device()
    }

    /// The optimisers' states, whole; with sharded optimisers every rank must call it.
    pub fn optimizer_states(&self) -> Result<OptimizerStates, DistError> {
        let parallel = self.parallel.as_ref();
        Ok(OptimizerStates {
            policy: self.optimizer.state(parallel)?,
            critic: self.critic.as_ref().map(|(_, o)| o.state(parallel)).transpose()?,
        })
    }

    /// The rows of `rows` this rank computes: all of them without data parallelism.
    fn share(&self, samples: &[Sample], rows: &[usize]) -> Vec<usize> {
        match &self.parallel {
            Some(p) => p.share(samples, rows),
            None => rows.to_vec(),
        }
    }

    /// Before this rank's `done` micro-batches of a mini-batch, when `optimizer` reduces after
    /// each (or `model`'s layers are gathered for each): idle micro-batches (the layer
    /// gatherings of a recomputed pass, then reductions of zeros) that bring it to as many as the
    /// busiest rank runs, so every rank joins the same collectives.
    fn catch_up(
        model: &CausalLm,
        optimizer: &mut Optimizer,
        parallel: Option<&DataParallel>,
        done: usize,
    ) -> Result<(), DistError> {
        let Some(p) = parallel.filter(|_| optimizer.reduces_per_micro_batch()) else { return Ok(()) };
        for _ in done..p.max(done)? {
            model.idle_pass(true);
            optimizer.after_micro_batch(parallel)?;
        }
        Ok(())
    }

    /// The models the score pass runs, in order.
    fn scored(&self) -> impl Iterator<Item = &CausalLm> {
        std::iter::once(&self.policy)
            .chain(&self.reference)
            .chain(self.critic.as_ref().map(|(c, _)| &c.model))
    }

    /// Fills old log-probabilities, reference log-probabilities and values (no gradients);
    /// returns the policy's mean entropy over the trained tokens (verl logs it from this pass).
    fn score(&self, samples: &mut [Sample], config: &TrainConfig) -> Result<f64, DistError> {
        let temperature = config.rollout.sampling.temperature;
        let all: Vec<usize> = (0..samples.len()).collect();
        let mine = self.share(samples, &all);
        let (mut entropy_sum, mut tokens) = (0.0, 0.0);
        let split = MicroBatching::of(&config.batch);
        let micros = split.split(samples, &mine);
        if let Some(p) = self.parallel.as_ref().filter(|_| self.scored().any(CausalLm::fetches_collectively))
        {
            for _ in micros.len()..p.max(micros.len())? {
                self.scored().for_each(|model| model.idle_pass(false));
            }
        }
        tch::no_grad(|| {
            for rows in micros {
                let mb = split.batch(samples, &rows, self.device());
                let (old, entropy) = mb.logprobs(&self.policy, &mb.hidden(&self.policy), temperature, true);
                let entropy = entropy.expect("entropy requested");
                entropy_sum += (entropy * &mb.mask).sum(Kind::Double).double_value(&[]);
                tokens += mb.mask.sum(Kind::Double).double_value(&[]);
                mb.scatter(samples, Field::OldLogprobs, &old);
                if let Some(reference) = &self.reference {
                    let (r, _) = mb.logprobs(reference, &mb.hidden(reference), temperature, false);
                    mb.scatter(samples, Field::RefLogprobs, &r);
                }
                if let Some(adapters) = self.policy.lora().filter(|_| self.base_reference) {
                    let _base = adapters.scoped(AdapterMode::Off);
                    let (r, _) = mb.logprobs(&self.policy, &mb.hidden(&self.policy), temperature, false);
                    mb.scatter(samples, Field::RefLogprobs, &r);
                }
                if let Some((critic, _)) = &self.critic {
                    mb.scatter(samples, Field::Values, &critic.head(&mb.hidden(&critic.model)));
                }
            }
        });
        self.fault.check()?;
        if let Some(p) = &self.parallel {
            p.combine(samples, &[Field::OldLogprobs, Field::RefLogprobs, Field::Values])?;
            let mut sums = [entropy_sum, tokens];
            p.sum(&mut sums)?;
            [entropy_sum, tokens] = sums;
        }
        Ok(if tokens > 0.0 { entropy_sum / tokens } else { 0.0 })
    }

    /// One step on `samples` at `step` (0-based): score the samples, fill their advantages, then
    /// for each PPO epoch and mini-batch update the policy (unless the critic is warming up) and
    /// the critic; returns the step's figures. Every rank of a data-parallel run calls this with
    /// the same samples.
    pub fn step(
        &mut self,
        samples: &mut [Sample],
        config: &TrainConfig,
        step: u64,
    ) -> Result<StepRecord, DistError> {
        let mut record = StepRecord::default();
        if samples.is_empty() {
            return Ok(record);
        }
        self.release_trained();
        overlong(
            samples,
            &config.algorithm.overlong,
            config.rollout.env.max_trajectory_tokens(),
            &mut record,
        );
        record.set(keys::ACTOR_ENTROPY, self.score(samples, config)?);
        let penalties = self.kl_ctrl.as_mut().map(|ctrl| {
            let (penalties, kl, beta) = reward_kl_penalties(samples, config.algorithm.kl_penalty, ctrl);
            record.set(keys::ACTOR_REWARD_KL_PENALTY, kl);
            record.set(keys::ACTOR_REWARD_KL_PENALTY_COEFF, beta);
            penalties
        });
        advantages(samples, config, penalties.as_deref());
        let train_actor = step >= config.critic.warmup_steps || self.critic.is_none();
        let lr = learning_rate(&config.optim, step, config.total_steps);
        let critic_lr = learning_rate(&config.critic.optim, step, config.total_steps);
        let minis = mini_batches(samples, config.batch.mini_batch_prompts);
        let mut sums = Sums::default();
        for _ in 0..config.algorithm.ppo_epochs {
            for rows in &minis {
                let mini = MiniBatch { samples, rows, norm: normalizer(samples, rows), config };
                if train_actor {
                    self.update_actor(&mini, lr, &mut sums)?;
                }
                self.update_critic(&mini, critic_lr, &mut sums)?;
            }
        }
        if let Some(p) = &self.parallel {
            sums.combine(p)?;
        }
        self.gather_trained()?;
        sums.write(&mut record, lr);
        Ok(record)
    }

    /// One policy update on a mini-batch, its gradient accumulated over micro-batches: PPO-clip
    /// loss, minus the entropy bonus, plus the KL loss to the reference.
    fn update_actor(&mut self, mini: &MiniBatch<'_>, lr: f64, sums: &mut Sums) -> Result<(), DistError> {
        let MiniBatch { samples, rows, norm, config } = *mini;
        let a = &config.algorithm;
        let clip = PolicyClip {
            low: a.clip_ratio_low as f32,
            high: a.clip_ratio_high as f32,
            dual_clip_c: a.clip_ratio_c as f32,
        };
        let temperature = config.rollout.sampling.temperature;
        self.optimizer.zero_grad();
        // LoRA's dropout is on in this pass alone.
        let _train = self.policy.lora().map(|adapters| adapters.scoped(AdapterMode::Train));
        let split = MicroBatching::of(&config.batch);
        let micros = split.split(samples, &self.share(samples, rows));
        Self::catch_up(&self.policy, &mut self.optimizer, self.parallel.as_ref(), micros.len())?;
        for micro in micros {
            let mb = split.batch(samples, &micro, self.device());
            let mut forward = mb.forward(&self.policy, config.activation_checkpointing);
            let (lp, entropy) = forward.logprobs(&self.policy, &mb, temperature, a.entropy_coef != 0.0);
            let old = mb.gather(samples, Field::OldLogprobs);
            let adv = mb.gather(samples, Field::Advantages);
            let correction = match (a.decoupled, a.tis_cap) {
                (true, _) => Some(Correction::Decoupled { cap: a.behav_imp_weight_cap }),
                (false, Some(cap)) => Some(Correction::Truncated { cap }),
                (false, None) => None,
            };
            let weights = correction.map(|c| {
                let w = losses::importance_weights(&old, &mb.gather(samples, Field::RolloutLogprobs), c);
                sums.is_weight_mean += losses::masked_mean(&w, &mb.mask, norm.tokens).double_value(&[]);
                let trained = w.where_self(&mb.mask.gt(0.0), &w.zeros_like());
                sums.is_weight_max = sums.is_weight_max.max(trained.max().double_value(&[]));
                let dropped = w.eq(0.0).logical_and(&mb.mask.gt(0.0)).to_kind(Kind::Float);
                sums.is_dropped += losses::masked_mean(&dropped, &mb.mask, norm.tokens).double_value(&[]);
                sums.corrected = true;
                w
            });
            let tokens = losses::PolicyTokens {
                old_log_prob: &old,
                log_prob: &lp,
                advantages: &adv,
                mask: &mb.mask,
                weights: weights.as_ref(),
            };
            let pg = losses::policy_loss(tokens, clip, a.loss_agg_mode, norm);
            let mut loss = pg.loss.shallow_clone();
            if let Some(entropy) = &entropy {
                loss -= a.entropy_coef * losses::agg_loss(entropy, &mb.mask, a.loss_agg_mode, norm);
            }
            if let (Some(estimator), true) = (a.kl_loss, self.has_reference()) {
                let reference = mb.gather(samples, Field::RefLogprobs);
                let kl = losses::kl_penalty(&lp, &reference, estimator);
                let kl = losses::agg_loss(&kl, &mb.mask, a.loss_agg_mode, norm);
                loss += a.kl_coef * &kl;
                sums.kl += kl.double_value(&[]);
                sums.kl_loss = true;
            }
            forward.backward(&loss);
            self.optimizer.after_micro_batch(self.parallel.as_ref())?;
            sums.pg_loss += pg.loss.double_value(&[]);
            sums.clipfrac += pg.clipfrac.double_value(&[]);
            sums.clipfrac_lower += pg.clipfrac_lower.double_value(&[]);
            sums.ppo_kl += pg.ppo_kl.double_value(&[]);
        }
        self.fault.check()?;
        sums.grad_norm += self.optimizer.step(self.parallel.as_ref(), lr)?;
        sums.actor_updates += 1;
        Ok(())
    }

    /// One critic update on a mini-batch (PPO; nothing without a critic): the clipped value loss,
    /// its gradient accumulated over micro-batches.
    fn update_critic(&mut self, mini: &MiniBatch<'_>, lr: f64, sums: &mut Sums) -> Result<(), DistError> {
        let MiniBatch { samples, rows, norm, config } = *mini;
        let mine = self.share(samples, rows);
        let Some((critic, optimizer)) = &mut self.critic else { return Ok(()) };
        let parallel = self.parallel.as_ref();
        optimizer.zero_grad();
        let split = MicroBatching::of(&config.batch);
        let micros = split.split(samples, &mine);
        Self::catch_up(&critic.model, optimizer, parallel, micros.len())?;
        for micro in micros {
            let mb = split.batch(samples, &micro, critic.model.device());
            let forward = mb.forward(&critic.model, config.activation_checkpointing);
            let vf = losses::value_loss(
                &critic.head(&forward.hidden),
                &mb.gather(samples, Field::Returns),
                &mb.gather(samples, Field::Values),
                &mb.mask,
                config.critic.cliprange_value,
                config.algorithm.loss_agg_mode,
                norm,
            );
            forward.backward(&(config.critic.value_loss_coef * &vf.loss));
            optimizer.after_micro_batch(parallel)?;
            sums.vf_loss += vf.loss.double_value(&[]);
            sums.vf_clipfrac += vf.clipfrac.double_value(&[]);
        }
        self.fault.check()?;
        sums.critic_grad_norm += optimizer.step(parallel, lr)?;
        sums.critic_updates += 1;
        Ok(())
    }
}

/// The samples of one optimiser update and what its losses need.
#[derive(Clone, Copy)]
struct MiniBatch<'a> {
    samples: &'a [Sample],
    rows: &'a [usize],
    /// The denominators of the loss aggregation over the mini-batch.
    norm: Normalizer,
    config: &'a TrainConfig,
}

/// Deep copies of named tensors.
fn copy(tensors: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    tensors.iter().map(|(n, t)| (n.clone(), t.copy())).collect()
}

/// The samples of each run of `prompts` consecutive groups: one optimiser update each.
fn mini_batches(samples: &[Sample], prompts: usize) -> Vec<Vec<usize>> {
    let mut minis: Vec<Vec<usize>> = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        let slot = s.group / prompts.max(1);
        if minis.len() <= slot {
            minis.resize(slot + 1, Vec::new());
        }
        minis[slot].push(i);
    }
    minis.retain(|m| !m.is_empty());
    minis
}

/// Running sums of the loss figures over updates.
#[derive(Default)]
struct Sums {
    pg_loss: f64,
    kl: f64,
    /// The KL loss ran (there is a reference to measure the KL to).
    kl_loss: bool,
    /// Importance weights of the behaviour policy: their mean, the largest, the share of tokens
    /// dropped (decoupled PPO's cap), when a correction is on.
    is_weight_mean: f64,
    is_weight_max: f64,
    is_dropped: f64,
    corrected: bool,
    clipfrac: f64,
    clipfrac_lower: f64,
    ppo_kl: f64,
    grad_norm: f64,
    actor_updates: u32,
    vf_loss: f64,
    vf_clipfrac: f64,
    critic_grad_norm: f64,
    critic_updates: u32,
}

impl Sums {
    /// Adds up the ranks' per-micro-batch figures (the gradient norms and update counts are the
    /// same on every rank).
    fn combine(&mut self, parallel: &DataParallel) -> Result<(), DistError> {
        let mut fields = [
            &mut self.pg_loss,
            &mut self.kl,
            &mut self.clipfrac,
            &mut self.clipfrac_lower,
            &mut self.ppo_kl,
            &mut self.is_weight_mean,
            &mut self.is_dropped,
            &mut self.vf_loss,
            &mut self.vf_clipfrac,
        ];
        let mut values = fields.each_ref().map(|f| **f);
        parallel.sum(&mut values)?;
        for (field, value) in fields.iter_mut().zip(values) {
            **field = value;
        }
        Ok(())
    }

    fn write(&self, r: &mut StepRecord, lr: f64) {
        if self.actor_updates > 0 {
            let n = f64::from(self.actor_updates);
            r.set(keys::ACTOR_PG_LOSS, self.pg_loss / n);
            if self.kl_loss {
                r.set(keys::ACTOR_KL, self.kl / n);
            }
            if self.corrected {
                r.set(keys::ACTOR_IS_WEIGHT_MEAN, self.is_weight_mean / n);
                r.set(keys::ACTOR_IS_WEIGHT_MAX, self.is_weight_max);
                r.set(keys::ACTOR_IS_DROPPED, self.is_dropped / n);
            }
            r.set(keys::ACTOR_CLIPFRAC, self.clipfrac / n);
            r.set(keys::ACTOR_CLIPFRAC_LOWER, self.clipfrac_lower / n);
            r.set(keys::ACTOR_PPO_KL, self.ppo_kl / n);
            r.set(keys::ACTOR_GRAD_NORM, self.grad_norm / n);
            r.set(keys::ACTOR_LR, lr);
        }
        if self.critic_updates > 0 {
            let n = f64::from(self.critic_updates);
            r.set(keys::CRITIC_VF_LOSS, self.vf_loss / n);
            r.set(keys::CRITIC_VF_CLIPFRAC, self.vf_clipfrac / n);
            r.set(keys::CRITIC_GRAD_NORM, self.critic_grad_norm / n);
        }
    }
}

/// DAPO's over-long handling: with a buffer, each reward gets the penalty of its response length
/// (the room being `max_tokens` less the prompt); with `mask`, truncated samples train nothing
/// (they still count in their group's baseline). Records the truncated share and the mean penalty.
fn overlong(samples: &mut [Sample], config: &OverlongConfig, max_tokens: usize, record: &mut StepRecord) {
    let n = samples.len().max(1) as f64;
    let truncated = samples.iter().filter(|s| s.truncated).count();
    record.set(keys::OVERLONG_TRUNCATED_SHARE, truncated as f64 / n);
    if let Some(buffer) = &config.buffer {
        let mut total = 0.0;
        for s in samples.iter_mut() {
            let penalty = buffer.penalty(s.len() - s.prompt_len, max_tokens.saturating_sub(s.prompt_len));
            s.reward += penalty as f32;
            total += penalty;
        }
        record.set(keys::OVERLONG_PENALTY_MEAN, total / n);
    }
    if config.mask {
        for s in samples.iter_mut().filter(|s| s.truncated) {
            s.loss_mask.fill(0.0);
        }
    }
}

/// verl's `apply_kl_penalty`: each trained token's penalty `beta * kl(old, reference)` (the
/// reference's log-probabilities filled), then `ctrl` moved by the step's mean over trajectories
/// of their mean KL per token; returns the penalties, that mean and the `beta` charged.
fn reward_kl_penalties(
    samples: &[Sample],
    estimator: KlEstimator,
    ctrl: &mut KlController,
) -> (Vec<Vec<f32>>, f64, f64) {
    let beta = ctrl.value();
    let mut mean_kl = 0.0;
    let penalties: Vec<Vec<f32>> = samples
        .iter()
        .map(|s| {
            let kl: Vec<f32> = (0..s.len())
                .map(|t| s.loss_mask[t] * estimator.estimate(s.old_logprobs[t], s.ref_logprobs[t]))
                .collect();
            let tokens: f64 = s.loss_mask.iter().map(|&m| f64::from(m)).sum();
            // verl's masked_mean over a row.
            mean_kl += kl.iter().map(|&k| f64::from(k)).sum::<f64>() / (tokens + 1e-8);
            kl.iter().map(|&k| (beta * f64::from(k)) as f32).collect()
        })
        .collect();
    let kl = mean_kl / samples.len().max(1) as f64;
    ctrl.update(kl, samples.len());
    (penalties, kl, beta)
}

/// Fills advantages (and, for GAE, returns) of every sample, each token's reward lowered by its
/// KL penalty when there are `penalties` (an outcome estimator sees the trajectory's score
/// lowered by their sum, as verl's `token_level_rewards.sum(-1)`).
fn advantages(samples: &mut [Sample], config: &TrainConfig, penalties: Option<&[Vec<f32>]>) {
    let a = &config.algorithm;
    if a.advantage == AdvantageEstimator::Gae {
        return gae(samples, a.gamma, a.lam, penalties);
    }
    let penalty = |i: usize| penalties.map_or(0.0, |p| p[i].iter().sum::<f32>());
    let scores: Vec<f32> = samples.iter().enumerate().map(|(i, s)| s.reward - penalty(i)).collect();
    let groups: Vec<usize> = samples.iter().map(|s| s.group).collect();
    let ones = Matrix::new(samples.len(), 1, vec![1.0; samples.len()]).expect("a column of ones");
    let per_sample = match a.advantage {
        AdvantageEstimator::Rloo => rloo_advantages(&scores, &groups, &ones),
        estimator => grpo_advantages(&scores, &groups, &ones, estimator == AdvantageEstimator::Grpo),
    }
    .expect("shapes agree by construction");
    for (s, &adv) in samples.iter_mut().zip(per_sample.as_slice()) {
        s.advantages = s.loss_mask.iter().map(|&m| m * adv).collect();
    }
}

/// GAE over each sample's response (the reward on its last trained token, less each token's KL
/// penalty), whitened over the batch.
fn gae(samples: &mut [Sample], gamma: f64, lam: f64, penalties: Option<&[Vec<f32>]>) {
    let width = samples.iter().map(|s| s.len() - s.prompt_len).max().unwrap_or(0).max(1);
    let n = samples.len();
    let (mut rewards, mut values, mut mask) =
        (vec![0f32; n * width], vec![0f32; n * width], vec![0f32; n * width]);
    for (i, s) in samples.iter().enumerate() {
        let row = i * width;
        for t in s.prompt_len..s.len() {
            values[row + t - s.prompt_len] = s.values[t];
            mask[row + t - s.prompt_len] = s.loss_mask[t];
        }
        if let Some(last) = s.last_trained() {
            rewards[row + last - s.prompt_len] = s.reward;
        }
        if let Some(penalties) = penalties {
            for t in s.prompt_len..s.len() {
                rewards[row + t - s.prompt_len] -= penalties[i][t];
            }
        }
    }
    let shape = [n as i64, width as i64];
    let t = |v: &[f32]| Tensor::from_slice(v).view(shape);
    let Some(out) = losses::gae(&t(&rewards), &t(&values), &t(&mask), gamma, lam) else {
        for s in samples.iter_mut() {
            s.advantages.fill(0.0);
            s.returns.clone_from(&s.values);
        }
        return;
    };
    let adv = Vec::<f32>::try_from(out.advantages.to_kind(Kind::Float).view([-1])).expect("f32");
    let ret = Vec::<f32>::try_from(out.returns.to_kind(Kind::Float).view([-1])).expect("f32");
    for (i, s) in samples.iter_mut().enumerate() {
        let row = i * width;
        for t in s.prompt_len..s.len() {
            s.advantages[t] = adv[row + t - s.prompt_len] * s.loss_mask[t];
            s.returns[t] = ret[row + t - s.prompt_len];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::MicroBatch;
    use kart_core::agent::trajectory::Trajectory;
    use kart_core::config::train::{
        AlgorithmConfig, BatchConfig, KlCtrlConfig, KlCtrlType, OptimConfig, OverlongBuffer,
    };

    /// Two groups of two: prompt, a model turn, an observation, a final model turn.
    fn samples(observation: u32) -> Vec<Sample> {
        (0..4)
            .map(|i| {
                let mut t = Trajectory::new(format!("t{i}"), format!("p{}", i / 2), &[5, 6, 7, 8]);
                t.push_model(&[10 + i, 11], &[-1.0, -1.0], 0).unwrap();
                t.push_env(&[observation, observation + 1, observation + 2]);
                t.push_model(&[12, 13 + i], &[-1.0, -1.0], 0).unwrap();
                t.reward = f64::from(i % 2);
                Sample::new(&t, (i / 2) as usize, true)
            })
            .collect()
    }

    fn config(advantage: AdvantageEstimator) -> TrainConfig {
        TrainConfig {
            algorithm: AlgorithmConfig { advantage, ..AlgorithmConfig::default() },
            batch: BatchConfig {
                prompts: 2,
                n: 2,
                mini_batch_prompts: 1,
                micro_batch_size: 2,
                ..Default::default()
            },
            optim: OptimConfig { lr: 1e-3, ..OptimConfig::default() },
            ..TrainConfig::default()
        }
    }

    fn learner(with_critic: bool) -> Learner {
        learner_of(with_critic, Kind::Float)
    }

    /// A learner on the tiny Qwen2 fixture with a reference, parameters of `kind`.
    fn learner_of(with_critic: bool, kind: Kind) -> Learner {
        learner_with(with_critic, kind, &config(AdvantageEstimator::Grpo), None)
    }

    /// A learner on the tiny Qwen2 fixture with a reference, parameters of `kind`, its
    /// optimisers as `config` says, in `parallel`'s run.
    fn learner_with(
        with_critic: bool,
        kind: Kind,
        config: &TrainConfig,
        parallel: Option<DataParallel>,
    ) -> Learner {
        learner_from(with_critic, kind, config, parallel, None)
    }

    /// [`learner_with`], the policy's (and critic's) parameters set to `start` (in
    /// [`parameters`]' order) before they are assembled, as a checkpoint's are loaded.
    fn learner_from(
        with_critic: bool,
        kind: Kind,
        config: &TrainConfig,
        parallel: Option<DataParallel>,
        start: Option<&[Tensor]>,
    ) -> Learner {
        let policy = CausalLm::load(&kart_testing::model("tiny-qwen2"), Device::Cpu).unwrap();
        let mut reference = CausalLm::load_as(&kart_testing::model("tiny-qwen2"), Device::Cpu, kind).unwrap();
        reference.var_store_mut().freeze();
        let critic =
            with_critic.then(|| Critic::load(&kart_testing::model("tiny-qwen2"), Device::Cpu, 0).unwrap());
        if let Some(start) = start {
            let mut params: Vec<Tensor> = policy.named_tensors().into_iter().map(|(_, t)| t).collect();
            params.extend(critic.iter().flat_map(|c| c.parameters().into_iter().map(|(_, t)| t)));
            assert_eq!(params.len(), start.len());
            tch::no_grad(|| {
                for (mut p, v) in params.into_iter().zip(start) {
                    p.copy_(v);
                }
            });
        }
        Learner::assemble(policy, Some(reference), critic, config, kind, parallel).unwrap()
    }

    /// Where a run of [`trained`] starts from and what it ends with: the policy's (and critic's)
    /// parameters and the optimisers' whole states.
    struct Snapshot {
        params: Vec<Tensor>,
        states: Vec<(Vec<(String, Tensor)>, i64)>,
    }

    fn parameters(learner: &Learner) -> Vec<Tensor> {
        let mut params = learner.optimizer.parameters();
        if let Some((_, optimizer)) = &learner.critic {
            params.extend(optimizer.parameters());
        }
        params
    }

    /// `steps` steps from `start` (else the fixture) on `samples(30)`, on `world` ranks (threads
    /// of this process, each with its own learner and process group); rank 0's end.
    fn trained_from(
        world: usize,
        config: &TrainConfig,
        with_critic: bool,
        start: Option<&Snapshot>,
        steps: std::ops::Range<u64>,
    ) -> Snapshot {
        let port = kart_testing::free_port();
        let ranks: Vec<_> = (0..world)
            .map(|rank| {
                let (config, steps) = (config.clone(), steps.clone());
                let start = start.map(|s| Snapshot {
                    params: s.params.iter().map(Tensor::copy).collect(),
                    states: s.states.iter().map(|(t, n)| (copy(t), *n)).collect(),
                });
                std::thread::spawn(move || {
                    let parallel = (world > 1).then(|| {
                        let ranks = kart_torch::Ranks::loopback(rank, world, port);
                        let timeout = std::time::Duration::from_secs(600);
                        let group = kart_torch::ProcessGroup::join(&ranks, Device::Cpu, timeout).unwrap();
                        DataParallel::new(group, 0.01)
                    });
                    let params = start.as_ref().map(|s| &s.params[..]);
                    let mut learner = learner_from(with_critic, Kind::Float, &config, parallel, params);
                    if let Some(start) = start {
                        let mut states = start.states.into_iter();
                        let (state, n) = states.next().unwrap();
                        learner.optimizer.load_state(state, n).unwrap();
                        if let Some((_, optimizer)) = &mut learner.critic {
                            let (state, n) = states.next().unwrap();
                            optimizer.load_state(state, n).unwrap();
                        }
                    }
                    for step in steps {
                        learner.step(&mut samples(30), &config, step).unwrap();
                    }
                    if config.sharding == Sharding::Full && world > 1 {
                        let layer_weights = |model: &CausalLm| -> usize {
                            let named = model.named_tensors();
                            named
                                .iter()
                                .filter(|(n, _)| n.starts_with("model.layers."))
                                .map(|(_, t)| t.numel())
                                .sum()
                        };
                        let reference = learner.reference.as_ref().unwrap();
                        assert_eq!(layer_weights(reference), 0, "the reference's layers are sharded");
                        if rank > 0 {
                            assert_eq!(layer_weights(&learner.policy), 0, "rank {rank} holds no layer whole");
                        }
                    }
                    let states = learner.optimizer_states().unwrap();
                    Snapshot {
                        params: parameters(&learner).iter().map(Tensor::copy).collect(),
                        states: std::iter::once(states.policy).chain(states.critic).collect(),
                    }
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).next().unwrap()
    }

    /// The policy (and critic) after 2 steps from the fixture on `world` ranks.
    fn trained(world: usize, config: &TrainConfig, with_critic: bool) -> Vec<Tensor> {
        trained_from(world, config, with_critic, None, 0..2).params
    }

    fn max_abs_difference(a: &[Tensor], b: &[Tensor]) -> f64 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs().max().double_value(&[])).fold(0.0, f64::max)
    }

    /// ZeRO-1, ZeRO-2 and full sharding (FSDP: the reference's and critic's layers too) on 2
    /// and 3 ranks end 3 steps (PPO's critic included, 2 epochs, several micro-batches, a rank
    /// without samples on 3) with the policy unsharded training reaches; the whole state gathered
    /// from 2 sharded ranks resumes onto 3 sharded ranks and onto one unsharded process alike.
    #[test]
    fn sharded_optimizers_reach_the_unsharded_policy_and_resume_onto_other_rank_counts() {
        let mut base = config(AdvantageEstimator::Gae);
        base.algorithm.ppo_epochs = 2;
        base.batch.micro_batch_size = 1;
        let unsharded = trained_from(1, &base, true, None, 0..3);
        for sharding in [Sharding::Optimizer, Sharding::Gradients, Sharding::Full] {
            let activation_checkpointing = sharding == Sharding::Full;
            let config = TrainConfig { sharding, activation_checkpointing, ..base.clone() };
            for world in [2, 3] {
                let sharded = trained_from(world, &config, true, None, 0..3);
                let diff = max_abs_difference(&unsharded.params, &sharded.params);
                assert!(diff <= 1e-5, "{sharding:?} on {world} ranks: max abs difference {diff}");
            }
            let midway = trained_from(2, &config, true, None, 0..2);
            let names = |s: &Snapshot| {
                let mut names: Vec<String> =
                    s.states.iter().flat_map(|(t, _)| t.iter().map(|(n, _)| n.clone())).collect();
                names.sort();
                names
            };
            assert_eq!(names(&midway), names(&trained_from(1, &base, true, None, 0..2)), "AdamW's names");
            for (world, config) in [(3, &config), (1, &base)] {
                let resumed = trained_from(world, config, true, Some(&midway), 2..3);
                let diff = max_abs_difference(&unsharded.params, &resumed.params);
                assert!(diff <= 1e-5, "{sharding:?}: resumed on {world} ranks: max abs difference {diff}");
            }
        }
    }

    /// Ranks split every mini-batch's samples and sum their gradients: the update is one
    /// process's, for each loss aggregation, with a rank left without samples (3 ranks, 2 samples
    /// a mini-batch), and for PPO's critic.
    #[test]
    fn ranks_compute_the_update_of_one_process() {
        use kart_core::rl::loss::LossAggMode;
        let modes = [
            LossAggMode::TokenMean,
            LossAggMode::SeqMeanTokenSum,
            LossAggMode::SeqMeanTokenMean,
            LossAggMode::SeqMeanTokenSumNorm,
        ];
        let mut cases: Vec<(TrainConfig, bool, usize)> = modes
            .into_iter()
            .map(|mode| {
                let mut c = config(AdvantageEstimator::Grpo);
                c.algorithm.loss_agg_mode = mode;
                c.algorithm.ppo_epochs = 2;
                c.algorithm.entropy_coef = 0.01;
                c.batch.micro_batch_size = 1;
                (c, false, 2)
            })
            .collect();
        cases.push((config(AdvantageEstimator::Grpo), false, 3));
        cases.push((config(AdvantageEstimator::Gae), true, 2));
        for (config, with_critic, world) in cases {
            let one = trained(1, &config, with_critic);
            let many = trained(world, &config, with_critic);
            let start = parameters(&learner(with_critic));
            let moved = one
                .iter()
                .zip(&start)
                .map(|(a, b)| (a - b).abs().max().double_value(&[]))
                .fold(0.0, f64::max);
            assert!(moved > 1e-4, "the steps moved the parameters ({moved})");
            let diff =
                one.iter().zip(&many).map(|(a, b)| (a - b).abs().max().double_value(&[])).fold(0.0, f64::max);
            // Ranks sum gradients in another order; Adam's normalisation makes the rounding of a
            // near-zero gradient a visible part of its update. 2% of one step (lr 1e-3) bounds it
            // on every CPU seen (1.3e-5 with 3 ranks on AVX-512 BF16 kernels).
            let mode = config.algorithm.loss_agg_mode;
            assert!(diff <= 2e-5, "{world} ranks, {mode:?}, critic {with_critic}: max abs difference {diff}");
        }
    }

    /// The gradients one update leaves in the policy's (and critic's) parameters, with the
    /// learning rate 0 so the parameters stay put, and the step's figures.
    fn gradients(config: &TrainConfig, with_critic: bool) -> (Vec<(String, Tensor)>, StepRecord) {
        let mut learner = learner(with_critic);
        let config = TrainConfig {
            optim: OptimConfig { lr: 0.0, ..config.optim.clone() },
            critic: kart_core::config::train::CriticConfig {
                optim: OptimConfig { lr: 0.0, ..config.critic.optim.clone() },
                ..config.critic.clone()
            },
            batch: BatchConfig { mini_batch_prompts: 2, ..config.batch.clone() },
            ..config.clone()
        };
        let record = learner.step(&mut samples(30), &config, 0).unwrap();
        let mut named = learner.policy.named_tensors();
        if let Some((critic, _)) = &learner.critic {
            named.extend(critic.parameters().into_iter().map(|(n, t)| (format!("critic.{n}"), t)));
        }
        (named.into_iter().map(|(n, t)| (n, t.grad().copy())).collect(), record)
    }

    fn max_difference(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> (f64, String) {
        a.iter()
            .zip(b)
            .map(|((name, x), (_, y))| ((x - y).abs().max().double_value(&[]), name.clone()))
            .fold((0.0, String::new()), |m, d| if d.0 > m.0 { d } else { m })
    }

    /// With LoRA a step trains the adapters alone (f32 beside a bf16 base, which stays bit for
    /// bit), and the reference is the base itself: no second model, and the KL to it starts at
    /// zero and grows as the adapters move.
    #[test]
    fn lora_trains_the_adapters_alone_against_the_base() {
        use kart_core::config::lora::{AllLinear, LoraConfig, TargetModules};
        let lora = LoraConfig {
            r: 4,
            lora_alpha: 8.0,
            target_modules: TargetModules::AllLinear(AllLinear::AllLinear),
            ..LoraConfig::default()
        };
        let config = TrainConfig {
            model: kart_testing::model("tiny-qwen2"),
            lora: Some(lora),
            precision: Some(Precision::Bf16),
            ..config(AdvantageEstimator::Grpo)
        };
        let mut learner = Learner::load(&config, None, Device::Cpu, None).unwrap();
        assert!(learner.reference.is_none() && learner.has_reference(), "the base is the reference");
        let base: Vec<Tensor> = learner.policy.named_tensors().iter().map(|(_, t)| t.copy()).collect();
        assert!(base.iter().all(|t| t.kind() == Kind::BFloat16));
        let adapters = learner.policy.lora().unwrap().named_tensors();
        assert!(adapters.iter().all(|(_, t)| t.kind() == Kind::Float));
        assert_eq!(learner.optimizer.parameters().len(), adapters.len(), "only the adapters train");
        let kl = |r: &StepRecord| r.get(&keys::ACTOR_KL).unwrap();
        let records: Vec<StepRecord> =
            (0..3).map(|step| learner.step(&mut samples(30), &config, step).unwrap()).collect();
        for ((name, t), start) in learner.policy.named_tensors().iter().zip(&base) {
            assert!(t.equal(start), "{name} of the frozen base moved");
        }
        let moved = adapters
            .iter()
            .filter(|(n, _)| n.contains("lora_B"))
            .map(|(_, t)| t.abs().max().double_value(&[]));
        assert!(moved.fold(0.0, f64::max) > 0.0, "B moved off zero");
        assert!(
            kl(&records[2]) > kl(&records[0]) && kl(&records[2]) > 0.0,
            "KL {:?}",
            records.iter().map(kl).collect::<Vec<_>>()
        );
    }

    /// A reference kept in CPU memory layer by layer (`reference.offload`) gives the step the
    /// resident one gives, bit for bit.
    #[test]
    fn an_offloaded_reference_changes_nothing() {
        let config = config(AdvantageEstimator::Grpo);
        let run = |offload: bool| {
            let mut learner = learner(false);
            if offload {
                learner.reference.as_mut().unwrap().offload_layers();
            }
            let records: Vec<StepRecord> =
                (0..2).map(|step| learner.step(&mut samples(30), &config, step).unwrap()).collect();
            (records, parameters(&learner))
        };
        let ((resident, a), (offloaded, b)) = (run(false), run(true));
        // The config key reaches the loaded reference: no decoder weights left on the device.
        let loaded = TrainConfig {
            model: kart_testing::model("tiny-qwen2"),
            reference: kart_core::config::memory::ReferenceConfig { offload: true },
            ..config.clone()
        };
        let learner = Learner::load(&loaded, None, Device::Cpu, None).unwrap();
        let on_device: i64 = learner
            .reference
            .as_ref()
            .unwrap()
            .named_tensors()
            .iter()
            .filter(|(n, _)| n.starts_with("model.layers."))
            .map(|(_, t)| t.numel() as i64)
            .sum();
        assert_eq!(on_device, 0);
        assert!(resident[1].get(&keys::ACTOR_KL).unwrap() > 0.0, "the KL to the reference is in play");
        for (x, y) in resident.iter().zip(&offloaded) {
            assert_eq!(x.get(&keys::ACTOR_KL), y.get(&keys::ACTOR_KL));
        }
        assert_eq!(max_abs_difference(&a, &b), 0.0);
    }

    /// Activation checkpointing recomputes the decoder and the LM head in the backward pass: the gradients of the
    /// policy and of PPO's critic are those of the plain backward pass to 1e-6.
    #[test]
    fn checkpointed_gradients_equal_the_kept_activations_ones() {
        let mut config = config(AdvantageEstimator::Gae);
        config.algorithm.entropy_coef = 0.01;
        let (plain, _) = gradients(&config, true);
        assert!(plain.iter().all(|(_, g)| g.defined()), "every parameter has a gradient");
        config.activation_checkpointing = true;
        let (checkpointed, _) = gradients(&config, true);
        let (diff, name) = max_difference(&plain, &checkpointed);
        assert!(diff <= 1e-6, "{name}: gradients differ by {diff}");
    }

    /// Samples packed into token-budget micro-batches (no padding, no attention across samples)
    /// give the padded micro-batches' losses and gradients to 1e-5, with or without
    /// checkpointing, and budgets that split the batch differently agree.
    #[test]
    fn packed_micro_batches_equal_padded_ones() {
        let mut config = config(AdvantageEstimator::Grpo);
        config.algorithm.entropy_coef = 0.01;
        let (padded, padded_record) = gradients(&config, false);
        for (tokens, checkpointing) in [(1000, false), (15, false), (30, true)] {
            config.batch.micro_batch_tokens = Some(tokens);
            config.activation_checkpointing = checkpointing;
            let (packed, record) = gradients(&config, false);
            let (diff, name) = max_difference(&padded, &packed);
            assert!(diff <= 1e-5, "budget {tokens}: {name}: gradients differ by {diff}");
            for key in [keys::ACTOR_PG_LOSS, keys::ACTOR_KL, keys::ACTOR_ENTROPY] {
                let (a, b) = (padded_record.get(&key).unwrap(), record.get(&key).unwrap());
                assert!((a - b).abs() <= 1e-5, "budget {tokens}: {key} {a} vs {b}");
            }
        }
    }

    /// Three GRPO steps with bf16 weights and compute (f32 master weights, moments and loss
    /// reductions) stay close to the same steps in f32: the step figures within 1% and, both
    /// evaluated in f32, the trained policies' per-token log-probabilities within 1% of the
    /// largest change the steps made to them (0.2% measured). Single weights are no test: AdamW
    /// turns a near-zero gradient's rounding noise (a key bias's, for one) into full-size steps.
    #[test]
    fn bf16_steps_stay_close_to_f32() {
        let config = config(AdvantageEstimator::Grpo);
        let run = |kind: Kind| {
            let mut learner = learner_of(false, kind);
            let records: Vec<StepRecord> =
                (0..3).map(|step| learner.step(&mut samples(30), &config, step).unwrap()).collect();
            let (state, _) = learner.optimizer.state(None).unwrap();
            let weights: Vec<(String, Tensor)> = match kind {
                Kind::Float => learner.policy.named_tensors(),
                _ => state
                    .into_iter()
                    .filter_map(|(n, t)| n.strip_suffix(".master").map(|n| (n.to_string(), t)))
                    .collect(),
            };
            assert!(learner.policy.named_tensors().iter().all(|(_, t)| t.kind() == kind));
            (records, weights)
        };
        // The config key reaches a loaded learner: bf16 parameters with f32 master copies.
        let loaded = TrainConfig {
            model: kart_testing::model("tiny-qwen2"),
            precision: Some(Precision::Bf16),
            ..config.clone()
        };
        let bf16 = Learner::load(&loaded, None, Device::Cpu, None).unwrap();
        assert!(bf16.policy.named_tensors().iter().all(|(_, t)| t.kind() == Kind::BFloat16));
        let reference = bf16.reference.as_ref().unwrap();
        assert!(reference.named_tensors().iter().all(|(_, t)| t.kind() == Kind::BFloat16));
        let (state, _) = bf16.optimizer.state(None).unwrap();
        let masters: Vec<&Tensor> =
            state.iter().filter(|(n, _)| n.ends_with(".master")).map(|(_, t)| t).collect();
        assert_eq!(masters.len(), bf16.policy.named_tensors().len());
        assert!(masters.iter().all(|t| t.kind() == Kind::Float));
        let (f32_records, f32_weights) = run(Kind::Float);
        let (bf16_records, bf16_weights) = run(Kind::BFloat16);
        assert_eq!(f32_weights.len(), bf16_weights.len(), "a master copy of every bf16 parameter");
        // The policies' log-probabilities of the batch, both in f32.
        let logprobs_of = |weights: &[(String, Tensor)]| {
            let model = CausalLm::load(&kart_testing::model("tiny-qwen2"), Device::Cpu).unwrap();
            tch::no_grad(|| {
                for ((_, mut p), (_, w)) in model.named_tensors().into_iter().zip(weights) {
                    p.copy_(w);
                }
                let batch = samples(30);
                let mb = MicroBatch::new(&batch, &[0, 1, 2, 3], Device::Cpu);
                mb.logprobs(&model, &mb.hidden(&model), 1.0, false).0
            })
        };
        let start = logprobs_of(&learner(false).policy.named_tensors());
        let (f32_lp, bf16_lp) = (logprobs_of(&f32_weights), logprobs_of(&bf16_weights));
        let moved = (&f32_lp - &start).abs().max().double_value(&[]);
        let diff = (&f32_lp - &bf16_lp).abs().max().double_value(&[]);
        assert!(moved > 0.1, "the steps changed the policy ({moved})");
        assert!(
            diff <= 1e-2 * moved,
            "bf16 and f32 policies differ by {diff} nats (the steps moved {moved})"
        );
        for (step, (a, b)) in f32_records.iter().zip(&bf16_records).enumerate() {
            for key in [keys::ACTOR_PG_LOSS, keys::ACTOR_KL, keys::ACTOR_ENTROPY] {
                let (x, y) = (a.get(&key).unwrap(), b.get(&key).unwrap());
                assert!(
                    (x - y).abs() <= 1e-2 * x.abs().max(1.0),
                    "step {step}: {key} {x} (f32) vs {y} (bf16)"
                );
            }
        }
    }

    #[test]
    fn ppo_step_trains_policy_and_critic_with_observations_masked() {
        let mut learner = learner(true);
        let mut batch = samples(30);
        let record = learner.step(&mut batch, &config(AdvantageEstimator::Gae), 0).unwrap();
        for key in [
            keys::ACTOR_PG_LOSS,
            keys::ACTOR_KL,
            keys::ACTOR_ENTROPY,
            keys::ACTOR_GRAD_NORM,
            keys::CRITIC_VF_LOSS,
            keys::CRITIC_GRAD_NORM,
        ] {
            let v = record.get(&key).unwrap_or_else(|| panic!("{key} missing: {record:?}"));
            assert!(v.is_finite(), "{key} = {v}");
        }
        assert!(record.get(&keys::CRITIC_GRAD_NORM).unwrap() > 0.0);
        for s in &batch {
            for t in 0..s.len() {
                if s.loss_mask[t] == 0.0 {
                    assert_eq!(s.advantages[t], 0.0, "observation or prompt token {t} has an advantage");
                }
            }
            assert!(s.returns[s.prompt_len..].iter().all(|r| r.is_finite()));
        }
    }

    /// A copy of the policy's parameters now.
    fn policy_now(learner: &Learner) -> Vec<Tensor> {
        learner.policy.named_tensors().into_iter().map(|(_, t)| t.copy()).collect()
    }

    /// During `critic.warmup_steps` only the critic learns: the policy stays put and no actor
    /// figures are recorded; from the first step after, the policy learns too.
    #[test]
    fn the_critic_warms_up_alone() {
        let mut config = config(AdvantageEstimator::Gae);
        config.critic.warmup_steps = 2;
        config.total_steps = 10;
        let mut learner = learner(true);
        let start = policy_now(&learner);
        let record = learner.step(&mut samples(30), &config, 1).unwrap();
        assert_eq!(max_abs_difference(&start, &policy_now(&learner)), 0.0, "the policy moved in warm-up");
        assert_eq!(record.get(&keys::ACTOR_PG_LOSS), None);
        assert!(record.get(&keys::CRITIC_GRAD_NORM).unwrap() > 0.0, "the critic learns");
        let record = learner.step(&mut samples(30), &config, 2).unwrap();
        assert!(max_abs_difference(&start, &policy_now(&learner)) > 0.0, "the policy learns after it");
        assert!(record.get(&keys::ACTOR_PG_LOSS).is_some());
    }

    /// With no advantage (equal rewards), no KL loss and no weight decay, an entropy bonus is the only force: the
    /// step raises the policy's entropy on the batch; without it the policy does not move.
    #[test]
    fn the_entropy_bonus_raises_entropy() {
        let mut config = config(AdvantageEstimator::Grpo);
        config.algorithm.kl_loss = None;
        config.optim.weight_decay = 0.0;
        let equal_rewards = || {
            let mut batch = samples(30);
            batch.iter_mut().for_each(|s| s.reward = 1.0);
            batch
        };
        let mut still = learner_with(false, Kind::Float, &config, None);
        let start = policy_now(&still);
        still.step(&mut equal_rewards(), &config, 0).unwrap();
        assert_eq!(max_abs_difference(&start, &policy_now(&still)), 0.0);
        config.algorithm.entropy_coef = 1.0;
        let mut learner = learner_with(false, Kind::Float, &config, None);
        let before =
            learner.step(&mut equal_rewards(), &config, 0).unwrap().get(&keys::ACTOR_ENTROPY).unwrap();
        let after =
            learner.step(&mut equal_rewards(), &config, 1).unwrap().get(&keys::ACTOR_ENTROPY).unwrap();
        assert!(after > before, "entropy {before} -> {after}");
    }

    /// Four samples whose trained tokens have K1 KL `0.1 * (i + 1)` to the reference (sample i).
    fn samples_with_kl() -> Vec<Sample> {
        let mut batch = samples(30);
        for (i, s) in batch.iter_mut().enumerate() {
            for t in 0..s.len() {
                s.old_logprobs[t] = -1.0;
                s.ref_logprobs[t] = -1.0 - 0.1 * (i as f32 + 1.0) * s.loss_mask[t];
            }
        }
        batch
    }

    /// verl's `apply_kl_penalty` by hand: penalties `beta * kl` on trained tokens, the step's KL
    /// the mean over trajectories of their mean per token, the adaptive coefficient moved by it.
    #[test]
    fn kl_in_reward_charges_every_trained_token_and_moves_the_coefficient() {
        let batch = samples_with_kl();
        let adaptive =
            KlCtrlConfig { kind: KlCtrlType::Adaptive, kl_coef: 0.2, target_kl: 0.1, horizon: 40.0 };
        let mut ctrl = KlController::new(adaptive);
        let (penalties, kl, beta) = reward_kl_penalties(&batch, KlEstimator::K1, &mut ctrl);
        assert_eq!(beta, 0.2);
        assert!((kl - 0.25).abs() < 1e-6, "mean of 0.1, 0.2, 0.3, 0.4: {kl}");
        // error clip(0.25 / 0.1 - 1, ±0.2) = 0.2 over 4 of 40 trajectories: x1.02.
        assert!((ctrl.value() - 0.204).abs() < 1e-9, "{}", ctrl.value());
        for (i, (s, p)) in batch.iter().zip(&penalties).enumerate() {
            for (t, (&penalty, &mask)) in p.iter().zip(&s.loss_mask).enumerate() {
                let expected = 0.2 * 0.1 * (i as f32 + 1.0) * mask;
                assert!((penalty - expected).abs() < 1e-7, "sample {i} token {t}: {penalty} vs {expected}");
            }
        }
        // Dr. GRPO's advantage: the score less the trajectory's penalties (4 trained tokens each),
        // less the group's mean: group 0 scores 0 - 0.08 and 1 - 0.16.
        let mut outcome = samples_with_kl();
        advantages(&mut outcome, &config(AdvantageEstimator::Drgrpo), Some(&penalties));
        let first = outcome[0].last_trained().unwrap();
        assert!((outcome[0].advantages[first] + 0.46).abs() < 1e-6, "{:?}", outcome[0].advantages);
        assert!((outcome[1].advantages[first] - 0.46).abs() < 1e-6, "{:?}", outcome[1].advantages);
        // GAE (no critic values, gamma = lam = 1): each trained token's return is the reward still
        // to come less the penalties still to come; observation tokens are charged nothing.
        let mut gae_samples = samples_with_kl();
        advantages(&mut gae_samples, &config(AdvantageEstimator::Gae), Some(&penalties));
        let s = &gae_samples[1];
        let trained: Vec<usize> = (0..s.len()).filter(|&t| s.loss_mask[t] > 0.0).collect();
        for (k, &t) in trained.iter().enumerate() {
            let expected = 1.0 - 0.04 * (trained.len() - k) as f32;
            assert!((s.returns[t] - expected).abs() < 1e-6, "token {t}: {} vs {expected}", s.returns[t]);
        }
    }

    /// A learner stepping with `kl_in_reward` records the penalty and its coefficient, which the
    /// adaptive controller then moves; without a KL loss `actor/kl` is absent, not 0.
    #[test]
    fn a_step_with_kl_in_reward_records_it_and_no_kl_loss_records_no_kl() {
        let mut config = config(AdvantageEstimator::Grpo);
        config.algorithm.kl_loss = None;
        config.algorithm.kl_in_reward = true;
        config.algorithm.kl_ctrl =
            KlCtrlConfig { kind: KlCtrlType::Adaptive, kl_coef: 0.05, target_kl: 1.0, horizon: 4.0 };
        let mut learner = learner_with(false, Kind::Float, &config, None);
        let mut batch = samples(30);
        let record = learner.step(&mut batch, &config, 0).unwrap();
        assert_eq!(record.get(&keys::ACTOR_REWARD_KL_PENALTY_COEFF), Some(0.05));
        let kl = record.get(&keys::ACTOR_REWARD_KL_PENALTY).unwrap();
        assert!((0.0..0.5).contains(&kl), "the policy starts as the reference: {kl}");
        // Far below the target: the error is -0.2, over 4 trajectories of a horizon of 4.
        assert!((learner.kl_ctrl.as_ref().unwrap().value() - 0.04).abs() < 1e-9);
        assert_eq!(record.get(&keys::ACTOR_KL), None, "no KL loss, no actor/kl");
        config.algorithm.kl_in_reward = false;
        config.algorithm.kl_loss = Some(KlEstimator::LowVarKl);
        let record =
            learner_with(false, Kind::Float, &config, None).step(&mut samples(30), &config, 0).unwrap();
        assert!(record.get(&keys::ACTOR_KL).is_some());
        assert_eq!(record.get(&keys::ACTOR_REWARD_KL_PENALTY), None);
    }

    /// `algorithm.kl_penalty` picks the estimator of the reward's KL: once a step moved the policy
    /// off the reference, `abs` charges the mean of |old - ref|, more than k1's mean of the
    /// signed differences.
    #[test]
    fn the_reward_kl_uses_the_configured_estimator() {
        let kl_after_two_steps = |estimator| {
            let mut config = config(AdvantageEstimator::Grpo);
            config.algorithm.kl_loss = None;
            config.algorithm.kl_in_reward = true;
            config.algorithm.kl_penalty = estimator;
            let mut learner = learner_with(false, Kind::Float, &config, None);
            learner.step(&mut samples(30), &config, 0).unwrap();
            learner.step(&mut samples(30), &config, 1).unwrap().get(&keys::ACTOR_REWARD_KL_PENALTY).unwrap()
        };
        let (k1, abs) = (kl_after_two_steps(KlEstimator::K1), kl_after_two_steps(KlEstimator::Abs));
        assert!(abs > 0.0, "the first step moved the policy: {abs}");
        assert!(abs > k1.abs(), "abs {abs} vs k1 {k1}");
    }

    /// With a buffer of 4 tokens and room for 11 (15 less a 4-token prompt), the 7-token responses
    /// are exactly at the buffer's start (no penalty) until the room shrinks; a masked truncated
    /// sample trains nothing and moves nothing, but still sets its group's baseline.
    #[test]
    fn overlong_penalises_by_length_and_masks_truncated_samples() {
        let buffer = OverlongBuffer { len: 4, penalty_factor: 1.0 };
        let penalised = OverlongConfig { mask: false, buffer: Some(buffer) };
        let mut batch = samples(30);
        let mut record = StepRecord::default();
        overlong(&mut batch, &penalised, 15, &mut record);
        assert_eq!(batch.iter().map(|s| s.reward).collect::<Vec<_>>(), [0.0, 1.0, 0.0, 1.0]);
        let mut batch = samples(30);
        // Room for 9: expected 5, the 7 tokens exceed it by 2 of 4: -0.5 each.
        overlong(&mut batch, &penalised, 13, &mut record);
        assert_eq!(batch.iter().map(|s| s.reward).collect::<Vec<_>>(), [-0.5, 0.5, -0.5, 0.5]);
        assert_eq!(record.get(&keys::OVERLONG_PENALTY_MEAN), Some(-0.5));
        assert_eq!(record.get(&keys::OVERLONG_TRUNCATED_SHARE), Some(0.0));

        let mut batch = samples(30);
        batch[1].truncated = true;
        overlong(&mut batch, &OverlongConfig { mask: true, buffer: None }, 15, &mut record);
        assert_eq!(record.get(&keys::OVERLONG_TRUNCATED_SHARE), Some(0.25));
        assert_eq!(batch[1].trained_tokens(), 0);
        assert_eq!(batch[0].trained_tokens(), 4);
        advantages(&mut batch, &config(AdvantageEstimator::Drgrpo), None);
        assert!(batch[1].advantages.iter().all(|&a| a == 0.0), "a masked sample gets no advantage");
        let last = batch[0].last_trained().unwrap();
        assert_eq!(batch[0].advantages[last], -0.5, "its reward still enters the group's mean");
    }

    /// AReaL's decoupled PPO with the behaviour policy equal to the proximal one (a synchronous
    /// run) is PPO to the bit; a behaviour policy far from it drops the tokens above the cap
    /// and changes the update.
    #[test]
    fn decoupled_ppo_reduces_to_ppo_when_the_behaviour_is_the_proximal_policy() {
        let ppo = config(AdvantageEstimator::Grpo);
        let mut decoupled = ppo.clone();
        decoupled.algorithm.decoupled = true;
        decoupled.algorithm.behav_imp_weight_cap = Some(5.0);
        let mut batch = samples(30);
        learner(false).score(&mut batch, &ppo).unwrap();
        for s in &mut batch {
            for t in 0..s.len() {
                if s.rollout_logprobs[t] != 0.0 {
                    s.rollout_logprobs[t] = s.old_logprobs[t];
                }
            }
        }
        let step = |config: &TrainConfig, batch: &[Sample]| {
            let mut l = learner(false);
            let record = l.step(&mut batch.to_vec(), config, 0).unwrap();
            (parameters(&l), record)
        };
        let (ppo_params, ppo_record) = step(&ppo, &batch);
        let (dec_params, dec_record) = step(&decoupled, &batch);
        assert_eq!(max_abs_difference(&ppo_params, &dec_params), 0.0);
        assert_eq!(ppo_record.get(&keys::ACTOR_PG_LOSS), dec_record.get(&keys::ACTOR_PG_LOSS));
        assert_eq!(ppo_record.get(&keys::ACTOR_IS_WEIGHT_MEAN), None, "no correction, no weights");
        assert_eq!(dec_record.get(&keys::ACTOR_IS_WEIGHT_MEAN), Some(1.0));
        assert_eq!(dec_record.get(&keys::ACTOR_IS_DROPPED), Some(0.0));
        // One token per sample sampled by a policy 3 nats less likely: weight e^3 > 5, dropped.
        for s in &mut batch {
            let t = s.last_trained().unwrap();
            s.rollout_logprobs[t] -= 3.0;
        }
        let (stale_params, stale_record) = step(&decoupled, &batch);
        assert!(max_abs_difference(&ppo_params, &stale_params) > 0.0);
        let dropped = stale_record.get(&keys::ACTOR_IS_DROPPED).unwrap();
        assert!((dropped - 0.25).abs() < 1e-6, "one of each sample's 4 trained tokens: {dropped}");
    }

    #[test]
    fn observation_targets_do_not_change_the_update() {
        // Observation tokens are inputs of later positions, so the test varies only what the loss
        // could read at their positions (their rollout logprobs, through truncated importance
        // sampling): two batches differing there must give bit-identical updates.
        let run = |garbage: f32| {
            let mut learner = learner(false);
            let mut batch = samples(30);
            for s in &mut batch {
                for t in 0..s.len() {
                    if s.loss_mask[t] == 0.0 && t >= s.prompt_len {
                        s.rollout_logprobs[t] = garbage;
                    }
                }
            }
            let cfg = TrainConfig {
                algorithm: AlgorithmConfig { tis_cap: Some(2.0), ..AlgorithmConfig::default() },
                ..config(AdvantageEstimator::Grpo)
            };
            learner.step(&mut batch, &cfg, 0).unwrap();
            learner.policy.named_tensors().into_iter().map(|(_, t)| t.copy()).collect::<Vec<_>>()
        };
        let (a, b) = (run(0.0), run(-50.0));
        for (x, y) in a.iter().zip(&b) {
            assert!(x.equal(y), "an observation token's logprob changed the update");
        }
    }

    #[test]
    fn a_shared_prefix_run_once_gives_the_full_pass_values_and_gradients() {
        // Three rows sharing a 20-token prefix (then different prompt ends, lengths and padding).
        let prefix: Vec<u32> = (0..20).map(|i| 40 + i).collect();
        let batch: Vec<Sample> = (0..3u32)
            .map(|i| {
                let prompt: Vec<u32> = prefix.iter().copied().chain([70 + i, 71]).collect();
                let mut t = Trajectory::new(format!("t{i}"), "p", &prompt);
                let turn: Vec<u32> = (0..=i * 2).map(|k| 80 + k + i).collect();
                t.push_model(&turn, &vec![-1.0; turn.len()], 0).unwrap();
                t.push_env(&[30, 31]);
                t.push_model(&[12, 13 + i], &[-1.0, -1.0], 0).unwrap();
                Sample::new(&t, 0, true)
            })
            .collect();
        let policy = CausalLm::load(&kart_testing::model("tiny-qwen2"), Device::Cpu).unwrap();
        let mut mb = MicroBatch::new(&batch, &[0, 1, 2], Device::Cpu);
        assert_eq!(mb.shared, 20);
        let run = |mb: &MicroBatch| {
            for (_, p) in policy.named_tensors() {
                p.grad().defined().then(|| p.grad().zero_());
            }
            let (lp, _) = mb.logprobs(&policy, &mb.hidden(&policy), 1.0, false);
            (lp.sum(Kind::Float) * 0.5 + lp.square().sum(Kind::Float)).backward();
            let grads: Vec<Tensor> = policy.named_tensors().iter().map(|(_, p)| p.grad().copy()).collect();
            (lp.detach(), grads)
        };
        let (shared_lp, shared_grads) = run(&mb);
        mb.shared = 0;
        let (full_lp, full_grads) = run(&mb);
        assert!(shared_lp.ne(0.0).any().int64_value(&[]) == 1, "no trained token");
        let diff = (&shared_lp - &full_lp).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "logprobs differ by {diff}");
        for ((name, _), (a, b)) in policy.named_tensors().iter().zip(shared_grads.iter().zip(&full_grads)) {
            let scale = b.abs().max().double_value(&[]).max(1e-6);
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(diff / scale < 1e-4, "{name}: gradients differ by {diff} (scale {scale})");
        }
    }
}

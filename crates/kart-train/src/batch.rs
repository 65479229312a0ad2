//! Trajectories as training samples, and micro-batches of them as padded tensors.
//!
//! Every per-token quantity of a sample is a vector over its tokens: entry `t` belongs to token
//! `t` (predicted from position `t - 1`); entries of prompt tokens are unused. A micro-batch pads
//! rows on the right and keeps only the window of positions from the shortest prompt on, so the
//! LM head never runs over most prompt tokens. Leading tokens every row shares (the instruction
//! of a dataset's prompts, the prompt of a GRPO group) run through the decoder once, not once per
//! row.

use kart_core::agent::trajectory::{Status, Trajectory};
use kart_core::wire::Group;
use kart_model::CausalLm;
use tch::{Device, Kind, Tensor};

/// Shortest shared prefix worth a separate forward pass.
const MIN_SHARED_PREFIX: i64 = 16;

/// One trajectory prepared for the update.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The group (prompt) it belongs to, an index into the step's groups.
    pub group: usize,
    pub token_ids: Vec<i64>,
    pub prompt_len: usize,
    /// 1 where the token is trained.
    pub loss_mask: Vec<f32>,
    /// The engine's log-probabilities of the sampled tokens (0 for environment tokens).
    pub rollout_logprobs: Vec<f32>,
    /// The scalar reward.
    pub reward: f32,
    /// Log-probabilities under the policy before the update (filled by the trainer).
    pub old_logprobs: Vec<f32>,
    /// Log-probabilities under the reference policy (filled when the KL loss is on).
    pub ref_logprobs: Vec<f32>,
    /// The critic's values before the update (PPO).
    pub values: Vec<f32>,
    /// Per-token advantages.
    pub advantages: Vec<f32>,
    /// Per-token returns (PPO).
    pub returns: Vec<f32>,
}

impl Sample {
    /// The sample of `trajectory`; with `mask_observations` false every token after the prompt is
    /// trained (the Search-R1 ablation).
    pub fn new(trajectory: &Trajectory, group: usize, mask_observations: bool) -> Self {
        let n = trajectory.len();
        let prompt_len = trajectory.prompt_len();
        let loss_mask = trajectory
            .loss_mask()
            .iter()
            .enumerate()
            .map(|(t, &m)| if m == 1 || (!mask_observations && t >= prompt_len) { 1.0 } else { 0.0 })
            .collect();
        Sample {
            group,
            token_ids: trajectory.token_ids().iter().map(|&id| i64::from(id)).collect(),
            prompt_len,
            loss_mask,
            rollout_logprobs: trajectory.logprobs().to_vec(),
            reward: trajectory.reward as f32,
            old_logprobs: vec![0.0; n],
            ref_logprobs: vec![0.0; n],
            values: vec![0.0; n],
            advantages: vec![0.0; n],
            returns: vec![0.0; n],
        }
    }

    /// The samples of a step's groups: every trajectory that was not aborted, in order.
    pub fn of_groups(groups: &[Group], mask_observations: bool) -> Vec<Sample> {
        let mut samples = Vec::new();
        for (gi, g) in groups.iter().enumerate() {
            for t in g.trajectories.iter().filter(|t| t.status != Status::Aborted) {
                samples.push(Sample::new(t, gi, mask_observations));
            }
        }
        samples
    }

    /// Tokens in the sample.
    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    /// Whether the sample has no tokens.
    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    /// Trained tokens.
    pub fn trained_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m > 0.0).count()
    }

    /// The position of the last trained token, where the outcome reward lands.
    pub fn last_trained(&self) -> Option<usize> {
        self.loss_mask.iter().rposition(|&m| m > 0.0)
    }
}

/// A per-token field of [`Sample`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    LossMask,
    RolloutLogprobs,
    OldLogprobs,
    RefLogprobs,
    Values,
    Advantages,
    Returns,
}

impl Field {
    pub(crate) fn of(self, s: &Sample) -> &[f32] {
        match self {
            Field::LossMask => &s.loss_mask,
            Field::RolloutLogprobs => &s.rollout_logprobs,
            Field::OldLogprobs => &s.old_logprobs,
            Field::RefLogprobs => &s.ref_logprobs,
            Field::Values => &s.values,
            Field::Advantages => &s.advantages,
            Field::Returns => &s.returns,
        }
    }

    pub(crate) fn of_mut(self, s: &mut Sample) -> &mut Vec<f32> {
        match self {
            Field::LossMask => &mut s.loss_mask,
            Field::RolloutLogprobs => &mut s.rollout_logprobs,
            Field::OldLogprobs => &mut s.old_logprobs,
            Field::RefLogprobs => &mut s.ref_logprobs,
            Field::Values => &mut s.values,
            Field::Advantages => &mut s.advantages,
            Field::Returns => &mut s.returns,
        }
    }
}

/// Some samples as right-padded tensors.
#[derive(Debug)]
pub struct MicroBatch {
    /// Indices of the samples, in row order.
    pub rows: Vec<usize>,
    /// `(B, T)` token ids (0 where padding).
    pub input_ids: Tensor,
    /// `(B, T)` positions.
    pub positions: Tensor,
    /// `(B, T)` true for real tokens.
    pub valid: Tensor,
    /// First hidden position used: the window covers positions `start .. T - 1`.
    pub start: i64,
    /// `(B, W)` the token each window position predicts.
    pub targets: Tensor,
    /// `(B, W)` loss mask of the targets (0 for padding).
    pub mask: Tensor,
    /// Leading tokens identical in every row, never past `start`.
    pub shared: i64,
}

impl MicroBatch {
    /// The micro-batch of `samples[rows]` on `device`.
    pub fn new(samples: &[Sample], rows: &[usize], device: Device) -> Self {
        let t = rows.iter().map(|&r| samples[r].len()).max().unwrap_or(1).max(2);
        let start = rows.iter().map(|&r| samples[r].prompt_len.max(1) - 1).min().unwrap_or(0) as i64;
        let (b, t64) = (rows.len() as i64, t as i64);
        let mut ids = vec![0i64; rows.len() * t];
        let mut valid = vec![false; rows.len() * t];
        for (i, &r) in rows.iter().enumerate() {
            let s = &samples[r];
            ids[i * t..i * t + s.len()].copy_from_slice(&s.token_ids);
            valid[i * t..i * t + s.len()].fill(true);
        }
        let input_ids = Tensor::from_slice(&ids).view([b, t64]).to_device(device);
        let valid = Tensor::from_slice(&valid).view([b, t64]).to_device(device);
        let positions =
            Tensor::arange(t64, (Kind::Int64, device)).unsqueeze(0).expand([b, t64], true).contiguous();
        let targets = input_ids.narrow(1, start + 1, t64 - start - 1);
        let shared = rows.first().map_or(0, |&first| {
            let first = &samples[first].token_ids;
            rows.iter().fold(start as usize, |shared, &r| {
                shared.min(first.iter().zip(&samples[r].token_ids).take_while(|(a, b)| a == b).count())
            })
        }) as i64;
        let mut batch = MicroBatch {
            rows: rows.to_vec(),
            input_ids,
            positions,
            valid,
            start,
            targets,
            mask: Tensor::new(),
            shared,
        };
        batch.mask = batch.gather(samples, Field::LossMask);
        batch
    }

    /// `(B, W, hidden)` final hidden states of `model` over the window. With several rows and a
    /// long enough shared prefix, the prefix runs once (batch 1) and every row continues from its
    /// keys and values: the same values and gradients as one full pass, for less compute.
    pub fn hidden(&self, model: &CausalLm) -> Tensor {
        let (b, t) = self.input_ids.size2().expect("(B, T)");
        let l = self.shared;
        if b < 2 || l < MIN_SHARED_PREFIX {
            let hidden = model.forward(&self.input_ids, &self.positions, Some(&self.valid), None);
            return hidden.narrow(1, self.start, self.width());
        }
        let mut cache = model.new_cache(1);
        let prefix = |x: &Tensor| x.narrow(0, 0, 1).narrow(1, 0, l);
        let _ = model.forward(&prefix(&self.input_ids), &prefix(&self.positions), None, Some(&mut cache));
        cache.retain_rows(&vec![0; b as usize]);
        let rest = |x: &Tensor| x.narrow(1, l, t - l);
        let hidden = model.forward(
            &rest(&self.input_ids),
            &rest(&self.positions),
            Some(&rest(&self.valid)),
            Some(&mut cache),
        );
        hidden.narrow(1, self.start - l, self.width())
    }

    /// Window width W.
    pub fn width(&self) -> i64 {
        self.targets.size()[1]
    }

    /// `(B, W)` f32 tensor of `field` over the window (0 beyond each sample's end).
    pub fn gather(&self, samples: &[Sample], field: Field) -> Tensor {
        let w = self.width() as usize;
        let start = self.start as usize + 1;
        let mut out = vec![0f32; self.rows.len() * w];
        for (i, &r) in self.rows.iter().enumerate() {
            let values = field.of(&samples[r]);
            let end = values.len().min(start + w);
            if end > start {
                out[i * w..i * w + end - start].copy_from_slice(&values[start..end]);
            }
        }
        Tensor::from_slice(&out).view([self.rows.len() as i64, w as i64]).to_device(self.targets.device())
    }

    /// Writes a `(B, W)` tensor back into `field` of the samples (within each sample's tokens).
    pub fn scatter(&self, samples: &mut [Sample], field: Field, values: &Tensor) {
        let w = self.width() as usize;
        let start = self.start as usize + 1;
        let host = Vec::<f32>::try_from(values.to_kind(Kind::Float).to_device(Device::Cpu).view([-1]))
            .expect("f32 values");
        for (i, &r) in self.rows.iter().enumerate() {
            let dst = field.of_mut(&mut samples[r]);
            let end = dst.len().min(start + w);
            if end > start {
                dst[start..end].copy_from_slice(&host[i * w..i * w + end - start]);
            }
        }
    }
}

/// Splits sample indices into micro-batches of at most `size`, sorted by length within the call so
/// padding stays small.
pub fn micro_batches(samples: &[Sample], indices: &[usize], size: usize) -> Vec<Vec<usize>> {
    let mut sorted = indices.to_vec();
    sorted.sort_by_key(|&i| std::cmp::Reverse(samples[i].len()));
    sorted.chunks(size.max(1)).map(<[usize]>::to_vec).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trajectory(prompt: &[u32], model: &[u32], env: &[u32]) -> Trajectory {
        let mut t = Trajectory::new("t", "p", prompt);
        t.push_model(model, &vec![-0.5; model.len()], 0).unwrap();
        t.push_env(env);
        t.push_model(&[9], &[-0.25], 0).unwrap();
        t
    }

    #[test]
    fn window_aligns_targets_with_their_fields() {
        let samples = vec![
            Sample::new(&trajectory(&[1, 2, 3], &[4, 5], &[6]), 0, true),
            Sample::new(&trajectory(&[1, 2], &[7], &[]), 0, true),
        ];
        let mb = MicroBatch::new(&samples, &[0, 1], Device::Cpu);
        assert_eq!(mb.start, 1);
        assert_eq!(
            Vec::<Vec<i64>>::try_from(&mb.targets).unwrap(),
            vec![vec![3, 4, 5, 6, 9], vec![7, 9, 0, 0, 0]]
        );
        assert_eq!(
            Vec::<Vec<f32>>::try_from(&mb.mask).unwrap(),
            vec![vec![0.0, 1.0, 1.0, 0.0, 1.0], vec![1.0, 1.0, 0.0, 0.0, 0.0]]
        );
        let lp = Vec::<Vec<f32>>::try_from(&mb.gather(&samples, Field::RolloutLogprobs)).unwrap();
        assert_eq!(lp[0], vec![0.0, -0.5, -0.5, 0.0, -0.25]);
        let mut samples = samples;
        mb.scatter(&mut samples, Field::OldLogprobs, &Tensor::ones([2, 5], (Kind::Float, Device::Cpu)));
        assert_eq!(samples[1].old_logprobs, vec![0.0, 0.0, 1.0, 1.0]);
        assert_eq!(samples[0].old_logprobs, vec![0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn unmasking_trains_observations_but_not_the_prompt() {
        let s = Sample::new(&trajectory(&[1, 2], &[4], &[6, 6]), 0, false);
        assert_eq!(s.loss_mask, vec![0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
        let s = Sample::new(&trajectory(&[1, 2], &[4], &[6, 6]), 0, true);
        assert_eq!(s.loss_mask, vec![0.0, 0.0, 1.0, 0.0, 0.0, 1.0]);
        assert_eq!(s.last_trained(), Some(5));
    }
}

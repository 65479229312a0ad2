//! Trajectories as training samples, and micro-batches of them as tensors.
//!
//! Every per-token quantity of a sample is a vector over its tokens: entry `t` belongs to token
//! `t` (predicted from position `t - 1`); entries of prompt tokens are unused. A micro-batch
//! either pads rows on the right, keeping only the window of positions from the shortest prompt
//! on (leading tokens every row shares, such as a GRPO group's prompt, run through the decoder
//! once), or packs samples back to back into one row up to a token budget, without padding.

use kart_core::agent::trajectory::{Status, Trajectory};
use kart_core::config::train::BatchConfig;
use kart_core::wire::Group;
use kart_model::logprobs::{
    DEFAULT_CHUNK, HeadRecompute, masked_token_logprobs, masked_token_logprobs_recomputed,
};
use kart_model::{CausalLm, Layout, Recomputed};
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
    /// A length limit cut the episode.
    pub truncated: bool,
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
            truncated: trajectory.status == Status::Truncated,
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

/// How a mini-batch's samples are split into forward/backward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicroBatching {
    /// At most this many samples per pass, right-padded to the longest.
    Padded { size: usize },
    /// Samples packed back to back into one row of at most this many tokens (a longer sample
    /// alone), without padding.
    Packed { tokens: usize },
}

impl MicroBatching {
    /// The split `batch` configures.
    pub fn of(batch: &BatchConfig) -> Self {
        match batch.micro_batch_tokens {
            Some(tokens) => MicroBatching::Packed { tokens },
            None => MicroBatching::Padded { size: batch.micro_batch_size },
        }
    }

    /// Splits sample indices into the passes' rows, longest samples first: runs of `size` (so
    /// padding stays small), or bins of at most `tokens` filled first-fit.
    pub fn split(self, samples: &[Sample], indices: &[usize]) -> Vec<Vec<usize>> {
        let mut sorted = indices.to_vec();
        sorted.sort_by_key(|&i| std::cmp::Reverse(samples[i].len()));
        match self {
            MicroBatching::Padded { size } => sorted.chunks(size.max(1)).map(<[usize]>::to_vec).collect(),
            MicroBatching::Packed { tokens } => {
                let mut bins: Vec<(usize, Vec<usize>)> = Vec::new();
                for i in sorted {
                    let len = samples[i].len();
                    match bins.iter_mut().find(|(used, _)| used + len <= tokens) {
                        Some((used, rows)) => {
                            *used += len;
                            rows.push(i);
                        }
                        None => bins.push((len, vec![i])),
                    }
                }
                bins.into_iter().map(|(_, rows)| rows).collect()
            }
        }
    }

    /// The micro-batch of `samples[rows]` on `device`.
    pub fn batch(self, samples: &[Sample], rows: &[usize], device: Device) -> MicroBatch {
        match self {
            MicroBatching::Padded { .. } => MicroBatch::new(samples, rows, device),
            MicroBatching::Packed { .. } => MicroBatch::packed(samples, rows, device),
        }
    }
}

/// Where one sample's per-token entries lie in a micro-batch's `(B, W)` window: `count` entries
/// from token `first` on, at row `row` from column `column`.
#[derive(Debug, Clone, Copy)]
struct Span {
    row: usize,
    column: usize,
    first: usize,
    count: usize,
}

/// Some samples as tensors: right-padded rows, or one row of packed samples.
#[derive(Debug)]
pub struct MicroBatch {
    /// Indices of the samples, in order.
    pub rows: Vec<usize>,
    /// `(B, T)` token ids (0 where padding).
    pub input_ids: Tensor,
    /// `(B, T)` positions (restarting at each packed sample).
    pub positions: Tensor,
    /// Padded rows (with the real tokens marked) or packed samples.
    pub layout: Layout,
    /// First hidden position used: the window covers positions `start .. start + W`.
    pub start: i64,
    /// `(B, W)` the token each window position predicts (0 where none).
    pub targets: Tensor,
    /// `(B, W)` loss mask of the targets (0 where no target is trained).
    pub mask: Tensor,
    /// Leading tokens identical in every padded row, never past `start`.
    pub shared: i64,
    /// Each sample's place in the window.
    spans: Vec<Span>,
    /// Window width W.
    width: usize,
}

/// The final hidden states over a micro-batch's window and, with activation checkpointing, the
/// decoder's (and the LM head's) backward pass still to run.
pub struct Forward<'m> {
    /// `(B, W, hidden)`.
    pub hidden: Tensor,
    pending: Option<Recomputed<'m>>,
    head: Option<HeadRecompute<'m>>,
}

impl<'m> Forward<'m> {
    /// Per-token log-probabilities (and entropies) of `mb`'s trained targets under `model` (the
    /// model of this pass), 0 at the tokens no loss uses; with activation checkpointing the LM
    /// head keeps no logits and is recomputed in [`Self::backward`].
    pub fn logprobs(
        &mut self,
        model: &'m CausalLm,
        mb: &MicroBatch,
        temperature: f64,
        with_entropy: bool,
    ) -> (Tensor, Option<Tensor>) {
        let out = match self.pending {
            None => return mb.logprobs(model, &self.hidden, temperature, with_entropy),
            Some(_) => {
                let (out, head) = masked_token_logprobs_recomputed(
                    model,
                    &self.hidden,
                    &mb.targets,
                    &mb.mask,
                    temperature,
                    with_entropy,
                    DEFAULT_CHUNK,
                );
                self.head = Some(head);
                out
            }
        };
        (out.logprobs, out.entropy)
    }

    /// Backpropagates `loss` through the whole model.
    pub fn backward(self, loss: &Tensor) {
        loss.backward();
        if let Some(head) = self.head {
            head.backward();
        }
        if let Some(pending) = self.pending {
            pending.backward();
        }
    }
}

impl MicroBatch {
    /// The right-padded micro-batch of `samples[rows]` on `device`.
    pub fn new(samples: &[Sample], rows: &[usize], device: Device) -> Self {
        let t = rows.iter().map(|&r| samples[r].len()).max().unwrap_or(1).max(2);
        let start = rows.iter().map(|&r| samples[r].prompt_len.max(1) - 1).min().unwrap_or(0);
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
        let width = t - start - 1;
        let spans = rows
            .iter()
            .enumerate()
            .map(|(row, &r)| Span {
                row,
                column: 0,
                first: start + 1,
                count: samples[r].len().min(start + 1 + width).saturating_sub(start + 1),
            })
            .collect();
        let shared = rows.first().map_or(0, |&first| {
            let first = &samples[first].token_ids;
            rows.iter().fold(start, |shared, &r| {
                shared.min(first.iter().zip(&samples[r].token_ids).take_while(|(a, b)| a == b).count())
            })
        }) as i64;
        Self::assemble(
            samples,
            rows,
            input_ids,
            positions,
            Layout::Padded { valid: Some(valid) },
            start,
            spans,
            width,
        )
        .with_shared(shared)
    }

    /// The micro-batch of `samples[rows]` packed into one row on `device`: positions restart at
    /// each sample, each attends to itself only, and each position but a sample's last predicts
    /// the sample's next token.
    pub fn packed(samples: &[Sample], rows: &[usize], device: Device) -> Self {
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        let mut spans = Vec::with_capacity(rows.len());
        for &r in rows {
            let s = &samples[r];
            spans.push(Span { row: 0, column: ids.len(), first: 1, count: s.len().saturating_sub(1) });
            ids.extend_from_slice(&s.token_ids);
            positions.extend(0..s.len() as i64);
        }
        let t = ids.len() as i64;
        let lengths = rows.iter().map(|&r| samples[r].len() as i64).collect();
        let input_ids = Tensor::from_slice(&ids).view([1, t]).to_device(device);
        let positions = Tensor::from_slice(&positions).view([1, t]).to_device(device);
        Self::assemble(samples, rows, input_ids, positions, Layout::Packed { lengths }, 0, spans, ids.len())
    }

    /// The micro-batch of these tensors, with its targets and loss mask gathered through `spans`.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        samples: &[Sample],
        rows: &[usize],
        input_ids: Tensor,
        positions: Tensor,
        layout: Layout,
        start: usize,
        spans: Vec<Span>,
        width: usize,
    ) -> Self {
        let mut batch = MicroBatch {
            rows: rows.to_vec(),
            input_ids,
            positions,
            layout,
            start: start as i64,
            targets: Tensor::new(),
            mask: Tensor::new(),
            shared: 0,
            spans,
            width,
        };
        let device = batch.input_ids.device();
        batch.targets = batch.window(samples, |s| &s.token_ids, 0i64).to_device(device);
        batch.mask = batch.gather(samples, Field::LossMask);
        batch
    }

    fn with_shared(mut self, shared: i64) -> Self {
        self.shared = shared;
        self
    }

    /// `(B, W, hidden)` final hidden states of `model` over the window. With several padded rows
    /// and a long enough shared prefix, the prefix runs once (batch 1) and every row continues
    /// from its keys and values: the same values and gradients as one full pass, for less compute
    /// (not when the model's layers are gathered from other ranks: one pass per micro-batch keeps
    /// every rank's gatherings in step).
    pub fn hidden(&self, model: &CausalLm) -> Tensor {
        let (b, t) = self.input_ids.size2().expect("(B, T)");
        let l = self.shared;
        let valid = match &self.layout {
            Layout::Padded { valid } if b >= 2 && l >= MIN_SHARED_PREFIX && !model.fetches_collectively() => {
                valid.as_ref()
            }
            layout => {
                let hidden = model.forward_layout(&self.input_ids, &self.positions, layout);
                return hidden.narrow(1, self.start, self.width());
            }
        };
        let mut cache = model.new_cache(1);
        let prefix = |x: &Tensor| x.narrow(0, 0, 1).narrow(1, 0, l);
        let _ = model.forward(&prefix(&self.input_ids), &prefix(&self.positions), None, Some(&mut cache));
        cache.retain_rows(&vec![0; b as usize]);
        let rest = |x: &Tensor| x.narrow(1, l, t - l);
        let hidden = model.forward(
            &rest(&self.input_ids),
            &rest(&self.positions),
            valid.map(rest).as_ref(),
            Some(&mut cache),
        );
        hidden.narrow(1, self.start - l, self.width())
    }

    /// The hidden states over the window, for a pass with gradients: with `recompute`, the
    /// decoder keeps only its layers' inputs and recomputes them in [`Forward::backward`] (and
    /// [`Forward::logprobs`] keeps no logits).
    pub fn forward<'m>(&self, model: &'m CausalLm, recompute: bool) -> Forward<'m> {
        if !recompute {
            return Forward { hidden: self.hidden(model), pending: None, head: None };
        }
        let pass = model.forward_recomputed(&self.input_ids, &self.positions, &self.layout);
        let hidden = pass.hidden().narrow(1, self.start, self.width());
        Forward { hidden, pending: Some(pass), head: None }
    }

    /// Per-token log-probabilities (and entropies) of the trained targets under `model` from its
    /// hidden states over the window (0 at the tokens no loss uses: observations, padding).
    pub fn logprobs(
        &self,
        model: &CausalLm,
        hidden: &Tensor,
        temperature: f64,
        with_entropy: bool,
    ) -> (Tensor, Option<Tensor>) {
        let out = masked_token_logprobs(
            model,
            hidden,
            &self.targets,
            &self.mask,
            temperature,
            with_entropy,
            DEFAULT_CHUNK,
        );
        (out.logprobs, out.entropy)
    }

    /// Window width W.
    pub fn width(&self) -> i64 {
        self.width as i64
    }

    /// Tokens in the micro-batch, padding included.
    pub fn tokens(&self) -> i64 {
        self.input_ids.numel() as i64
    }

    /// `(B, W)` f32 tensor of `field` over the window (0 where no sample's entry lies).
    pub fn gather(&self, samples: &[Sample], field: Field) -> Tensor {
        self.window(samples, |s| field.of(s), 0f32).to_device(self.input_ids.device())
    }

    /// `(B, W)` CPU tensor of a per-token vector of the samples, `zero` where none lies.
    fn window<T: tch::kind::Element + Copy>(
        &self,
        samples: &[Sample],
        values: impl Fn(&Sample) -> &[T],
        zero: T,
    ) -> Tensor {
        let (b, w) = (self.input_ids.size()[0] as usize, self.width);
        let mut out = vec![zero; b * w];
        for (span, &r) in self.spans.iter().zip(&self.rows) {
            let at = span.row * w + span.column;
            out[at..at + span.count]
                .copy_from_slice(&values(&samples[r])[span.first..span.first + span.count]);
        }
        Tensor::from_slice(&out).view([b as i64, w as i64])
    }

    /// Writes a `(B, W)` tensor back into `field` of the samples (within each sample's tokens).
    pub fn scatter(&self, samples: &mut [Sample], field: Field, values: &Tensor) {
        let host = Vec::<f32>::try_from(values.to_kind(Kind::Float).to_device(Device::Cpu).view([-1]))
            .expect("f32 values");
        for (span, &r) in self.spans.iter().zip(&self.rows) {
            let at = span.row * self.width + span.column;
            field.of_mut(&mut samples[r])[span.first..span.first + span.count]
                .copy_from_slice(&host[at..at + span.count]);
        }
    }
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

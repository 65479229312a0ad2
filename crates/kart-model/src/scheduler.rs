//! Continuous batching over a KV cache: the scheduler the embedded engine runs.
//!
//! Requests wait in a queue; each [`Scheduler::step`] admits as many as there is room for (their
//! prompts prefilled together), then decodes one token for every running sequence in a single
//! forward pass, and retires the sequences that finished (a stop token, a stop string, the token
//! limit). Finished sequences leave the batch at once and waiting ones take their place, so a long
//! generation never holds up short ones. Each request returns the sampled token ids, their
//! log-probabilities under `softmax(logits / T)`, and why it finished; text is never re-tokenised.

use crate::error::ModelError;
use crate::kv_cache::KvCache;
use crate::sampling::{Sampler, sample};
use crate::transformer::CausalLm;
use kart_core::generation::{FinishReason, Generation, GenerationRequest, SamplingError};
use kart_tokenizer::Tokenizer;
use std::collections::VecDeque;
use tch::{Kind, Tensor};

/// A request the engine cannot run, naming the field and value.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("input_ids is empty: a prompt needs at least one token")]
    EmptyPrompt,
    #[error("input_ids has {len} tokens; the model's context is {max} (max_position_embeddings)")]
    PromptTooLong { len: usize, max: usize },
    #[error("input_ids contains token id {id}, outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] kart_tokenizer::TokenizerError),
}

/// A sequence in the running batch.
#[derive(Debug)]
struct Running<Id> {
    id: Id,
    request: GenerationRequest,
    sampler: Sampler,
    stop_ids: Vec<u32>,
    /// Position of the next token to feed (prompt length + generated so far - 1).
    next_position: i64,
    output: Vec<u32>,
    logprobs: Vec<f32>,
}

/// Continuous batching of generation requests over one model.
#[derive(Debug)]
pub struct Scheduler<Id> {
    max_batch: usize,
    waiting: VecDeque<(Id, GenerationRequest, Sampler)>,
    running: Vec<Running<Id>>,
    cache: Option<KvCache>,
    next_seed: u64,
    admitting: bool,
}

impl<Id> Scheduler<Id> {
    /// A scheduler running at most `max_batch` sequences at once; requests without a seed get seeds
    /// derived from `seed`.
    pub fn new(max_batch: usize, seed: u64) -> Self {
        Scheduler {
            max_batch: max_batch.max(1),
            waiting: VecDeque::new(),
            running: Vec::new(),
            cache: None,
            next_seed: seed,
            admitting: true,
        }
    }

    /// Queues a request after checking it against the model.
    pub fn submit(
        &mut self,
        id: Id,
        request: GenerationRequest,
        model: &CausalLm,
    ) -> Result<(), SchedulerError> {
        request.sampling.validate()?;
        let (vocab, max) = (model.config().vocab_size, model.config().max_position_embeddings);
        if request.input_ids.is_empty() {
            return Err(SchedulerError::EmptyPrompt);
        }
        if request.input_ids.len() > max {
            return Err(SchedulerError::PromptTooLong { len: request.input_ids.len(), max });
        }
        if let Some(&id) = request.input_ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(SchedulerError::TokenOutOfRange { id, vocab });
        }
        let sampler = Sampler::new(request.sampling.clone(), self.next_seed);
        self.next_seed = self.next_seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.waiting.push_back((id, request, sampler));
        Ok(())
    }

    /// Whether nothing is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Sequences currently in the batch.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Pauses (false) or resumes (true) admitting waiting requests; running ones continue.
    pub fn set_admitting(&mut self, admitting: bool) {
        self.admitting = admitting;
    }

    /// Drops every waiting and running request (after a failed step).
    pub fn clear(&mut self) {
        self.waiting.clear();
        self.running.clear();
        self.cache = None;
    }

    /// Admits waiting requests, decodes one token for every running sequence, and returns the
    /// sequences that finished.
    pub fn step(
        &mut self,
        model: &CausalLm,
        tokenizer: &Tokenizer,
    ) -> Result<Vec<(Id, Generation)>, SchedulerError> {
        tch::no_grad(|| {
            let mut finished = if self.admitting { self.admit(model, tokenizer)? } else { Vec::new() };
            if !self.running.is_empty() {
                finished.extend(self.decode(model, tokenizer)?);
            }
            Ok(finished)
        })
    }

    /// Prefills the prompts of as many waiting requests as fit and samples their first tokens.
    fn admit(
        &mut self,
        model: &CausalLm,
        tokenizer: &Tokenizer,
    ) -> Result<Vec<(Id, Generation)>, SchedulerError> {
        let room = self.max_batch - self.running.len();
        let admitted: Vec<_> =
            (0..room.min(self.waiting.len())).filter_map(|_| self.waiting.pop_front()).collect();
        if admitted.is_empty() {
            return Ok(Vec::new());
        }
        let device = model.device();
        let longest = admitted.iter().map(|(_, r, _)| r.input_ids.len()).max().unwrap_or(0);
        let (mut ids, mut valid, mut positions) = (Vec::new(), Vec::new(), Vec::new());
        for (_, request, _) in &admitted {
            let pad = longest - request.input_ids.len();
            ids.extend(std::iter::repeat_n(0i64, pad).chain(request.input_ids.iter().map(|&t| t as i64)));
            valid.extend(
                std::iter::repeat_n(false, pad).chain(std::iter::repeat_n(true, request.input_ids.len())),
            );
            positions.extend(std::iter::repeat_n(0i64, pad).chain(0..request.input_ids.len() as i64));
        }
        let shape = [admitted.len() as i64, longest as i64];
        let ids = Tensor::from_slice(&ids).view(shape).to_device(device);
        let valid = Tensor::from_slice(&valid).view(shape).to_device(device);
        let positions = Tensor::from_slice(&positions).view(shape).to_device(device);
        let mut cache = model.new_cache(admitted.len() as i64);
        let hidden = model.decode(&ids, &positions, Some(&valid), &mut cache);
        let logits = model.next_token_logits(&hidden.select(1, longest as i64 - 1));
        let first = self.running.len();
        let eos = tokenizer.stop_token_ids();
        for (id, request, sampler) in admitted {
            let mut stop_ids = request.stop_token_ids.clone();
            if !request.ignore_eos {
                stop_ids.extend(&eos);
            }
            let next_position = request.input_ids.len() as i64;
            self.running.push(Running {
                id,
                request,
                sampler,
                stop_ids,
                next_position,
                output: Vec::new(),
                logprobs: Vec::new(),
            });
        }
        match &mut self.cache {
            Some(running) => running.merge(cache),
            None => self.cache = Some(cache),
        }
        self.sample_and_retire(&logits, first, model, tokenizer)
    }

    /// Feeds every running sequence its last sampled token and samples the next.
    fn decode(
        &mut self,
        model: &CausalLm,
        tokenizer: &Tokenizer,
    ) -> Result<Vec<(Id, Generation)>, SchedulerError> {
        let device = model.device();
        let n = self.running.len() as i64;
        let last: Vec<i64> =
            self.running.iter().map(|r| *r.output.last().expect("sampled at admission") as i64).collect();
        let positions: Vec<i64> = self.running.iter().map(|r| r.next_position).collect();
        let ids = Tensor::from_slice(&last).view([n, 1]).to_device(device);
        let positions = Tensor::from_slice(&positions).view([n, 1]).to_device(device);
        let cache = self.cache.as_mut().expect("running sequences have a cache");
        let hidden = model.decode(&ids, &positions, None, cache);
        let logits = model.next_token_logits(&hidden.select(1, 0));
        for r in &mut self.running {
            r.next_position += 1;
        }
        self.sample_and_retire(&logits, 0, model, tokenizer)
    }

    /// Samples one token for running rows `first..` from `logits` (one row each), then retires every
    /// finished sequence from the batch and the cache.
    fn sample_and_retire(
        &mut self,
        logits: &Tensor,
        first: usize,
        model: &CausalLm,
        tokenizer: &Tokenizer,
    ) -> Result<Vec<(Id, Generation)>, SchedulerError> {
        let mut samplers: Vec<Sampler> = self.running[first..].iter().map(|r| r.sampler.clone()).collect();
        let (tokens, logprobs) = sample(&logits.to_kind(Kind::Float), &mut samplers);
        let context = model.config().max_position_embeddings as i64;
        let mut reasons = Vec::with_capacity(self.running.len());
        for (i, r) in self.running.iter_mut().enumerate() {
            if i < first {
                reasons.push(None);
                continue;
            }
            let (token, logprob) = (tokens[i - first] as u32, logprobs[i - first]);
            r.sampler = samplers[i - first].clone();
            r.output.push(token);
            r.logprobs.push(logprob);
            reasons.push(finish_reason(r, token, context, tokenizer)?);
        }
        if reasons.iter().all(Option::is_none) {
            return Ok(Vec::new());
        }
        let mut finished = Vec::new();
        let mut keep = Vec::new();
        let running = std::mem::take(&mut self.running);
        for (row, (r, reason)) in running.into_iter().zip(reasons).enumerate() {
            match reason {
                Some(finish_reason) => finished
                    .push((r.id, Generation { token_ids: r.output, logprobs: r.logprobs, finish_reason })),
                None => {
                    keep.push(row as i64);
                    self.running.push(r);
                }
            }
        }
        if let Some(cache) = &mut self.cache {
            cache.retain_rows(&keep);
        }
        Ok(finished)
    }
}

/// Whether a sequence that just produced `token` is done, and why.
fn finish_reason<Id>(
    r: &Running<Id>,
    token: u32,
    context: i64,
    tokenizer: &Tokenizer,
) -> Result<Option<FinishReason>, SchedulerError> {
    if r.stop_ids.contains(&token) {
        return Ok(Some(FinishReason::Stop));
    }
    if !r.request.stop.is_empty() {
        let text = tokenizer.decode(&r.output, false)?;
        if r.request.stop.iter().any(|s| !s.is_empty() && text.contains(s.as_str())) {
            return Ok(Some(FinishReason::Stop));
        }
    }
    if r.output.len() >= r.request.max_new_tokens || r.next_position + 1 >= context {
        return Ok(Some(FinishReason::Length));
    }
    Ok(None)
}

/// Generates for a whole list of requests with continuous batching, returning results in order.
pub fn generate(
    model: &CausalLm,
    tokenizer: &Tokenizer,
    requests: Vec<GenerationRequest>,
    max_batch: usize,
    seed: u64,
) -> Result<Vec<Generation>, SchedulerError> {
    let mut scheduler = Scheduler::new(max_batch, seed);
    let n = requests.len();
    let mut results: Vec<Option<Generation>> = vec![None; n];
    for (i, request) in requests.into_iter().enumerate() {
        if request.max_new_tokens == 0 {
            results[i] =
                Some(Generation { token_ids: vec![], logprobs: vec![], finish_reason: FinishReason::Length });
        } else {
            scheduler.submit(i, request, model)?;
        }
    }
    while !scheduler.is_idle() {
        for (i, generation) in scheduler.step(model, tokenizer)? {
            results[i] = Some(generation);
        }
    }
    Ok(results.into_iter().map(|g| g.expect("every request finishes")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logprobs::token_logprobs;
    use kart_core::generation::SamplingParams;
    use tch::Device;

    fn load(name: &str) -> (CausalLm, Tokenizer) {
        (
            CausalLm::load(&kart_testing::model(name), Device::Cpu).unwrap(),
            Tokenizer::load(kart_testing::model(name)).unwrap(),
        )
    }

    fn request(input_ids: Vec<u32>, temperature: f64, max_new_tokens: usize, seed: u64) -> GenerationRequest {
        GenerationRequest {
            input_ids,
            sampling: SamplingParams { temperature, seed: Some(seed), ..SamplingParams::default() },
            max_new_tokens,
            stop: vec![],
            stop_token_ids: vec![],
            ignore_eos: true,
        }
    }

    fn expected_cases(name: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(kart_testing::model(name).join("expected.json")).unwrap(),
        )
        .unwrap();
        v["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    serde_json::from_value(c["input_ids"].clone()).unwrap(),
                    serde_json::from_value(c["greedy_continuation"].clone()).unwrap(),
                )
            })
            .collect()
    }

    /// Teacher-forced log-probabilities of `output` after `prompt` at `temperature`.
    fn teacher_forced(model: &CausalLm, prompt: &[u32], output: &[u32], temperature: f64) -> Vec<f32> {
        let all: Vec<i64> = prompt.iter().chain(output).map(|&t| t as i64).collect();
        let n = all.len() as i64;
        let ids = Tensor::from_slice(&all).view([1, n]);
        tch::no_grad(|| {
            let h =
                model.forward(&ids, &Tensor::arange(n, (Kind::Int64, Device::Cpu)).view([1, n]), None, None);
            let (p, g) = (prompt.len() as i64, output.len() as i64);
            let lp =
                token_logprobs(model, &h.narrow(1, p - 1, g), &ids.narrow(1, p, g), temperature, false, 64);
            Vec::<f32>::try_from(lp.logprobs.view([-1])).unwrap()
        })
    }

    #[test]
    fn greedy_generation_reproduces_transformers() {
        for name in ["tiny-qwen2", "tiny-qwen3", "tiny-llama"] {
            let (model, tokenizer) = load(name);
            let cases = expected_cases(name);
            let requests = cases.iter().map(|(p, g)| request(p.clone(), 0.0, g.len(), 0)).collect();
            let out = generate(&model, &tokenizer, requests, 2, 0).unwrap();
            for ((prompt, greedy), got) in cases.iter().zip(&out) {
                assert_eq!(&got.token_ids, greedy, "{name}: prompt {prompt:?}");
                assert_eq!(got.finish_reason, FinishReason::Length);
                let tf = teacher_forced(&model, prompt, greedy, 1.0);
                for (a, b) in got.logprobs.iter().zip(&tf) {
                    assert!((a - b).abs() < 1e-4, "{name}: logprob {a} vs teacher-forced {b}");
                }
            }
        }
    }

    #[test]
    fn results_do_not_depend_on_batch_mates_or_admission_order() {
        let (model, tokenizer) = load("tiny-qwen2");
        let prompts: Vec<Vec<u32>> =
            vec![vec![5, 9, 17], vec![1, 87, 85, 262, 201, 357, 223], vec![297], vec![40, 41, 42, 43, 44]];
        let requests: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| request(p.clone(), 0.9, 6 + 3 * i, 100 + i as u64))
            .collect();
        let alone: Vec<Generation> = requests
            .iter()
            .map(|r| generate(&model, &tokenizer, vec![r.clone()], 1, 0).unwrap().remove(0))
            .collect();
        for max_batch in [2, 4] {
            let together = generate(&model, &tokenizer, requests.clone(), max_batch, 0).unwrap();
            for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
                assert_eq!(a.token_ids, b.token_ids, "request {i}, max_batch {max_batch}");
                assert_eq!(a.token_ids.len(), 6 + 3 * i);
                for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                    assert!((x - y).abs() < 1e-4);
                }
            }
        }
        // Sampled logprobs are those of softmax(logits / T), as a teacher-forced pass computes them.
        let tf = teacher_forced(&model, &prompts[1], &alone[1].token_ids, 0.9);
        for (a, b) in alone[1].logprobs.iter().zip(&tf) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }

    #[test]
    fn stop_strings_and_stop_tokens_end_generation() {
        let (model, tokenizer) = load("tiny-llama");
        let prompt = vec![297, 343, 332, 337];
        let free =
            generate(&model, &tokenizer, vec![request(prompt.clone(), 0.0, 16, 0)], 1, 0).unwrap().remove(0);
        // Stop at the text of the third generated token.
        let third = tokenizer.decode(&free.token_ids[2..3], false).unwrap();
        let mut r = request(prompt.clone(), 0.0, 16, 0);
        r.stop = vec![third.clone()];
        let stopped = generate(&model, &tokenizer, vec![r], 1, 0).unwrap().remove(0);
        assert_eq!(stopped.finish_reason, FinishReason::Stop);
        let text = tokenizer.decode(&stopped.token_ids, false).unwrap();
        assert!(text.contains(&third) && stopped.token_ids.len() <= 3, "{text:?}");
        // A stop token is kept and ends generation.
        let mut r = request(prompt, 0.0, 16, 0);
        r.stop_token_ids = vec![free.token_ids[1]];
        let stopped = generate(&model, &tokenizer, vec![r], 1, 0).unwrap().remove(0);
        assert_eq!(stopped.finish_reason, FinishReason::Stop);
        assert_eq!(stopped.token_ids.last(), Some(&free.token_ids[1]));
    }

    #[test]
    fn bad_requests_name_the_field() {
        let (model, tokenizer) = load("tiny-qwen2");
        let err = generate(&model, &tokenizer, vec![request(vec![], 1.0, 4, 0)], 1, 0).unwrap_err();
        assert!(err.to_string().contains("input_ids is empty"), "{err}");
        let err = generate(&model, &tokenizer, vec![request(vec![100_000], 1.0, 4, 0)], 1, 0).unwrap_err();
        assert!(err.to_string().contains("token id 100000"), "{err}");
        let mut r = request(vec![1], 1.0, 4, 0);
        r.sampling.top_p = 1.5;
        let err = generate(&model, &tokenizer, vec![r], 1, 0).unwrap_err();
        assert!(err.to_string().contains("sampling.top_p"), "{err}");
        let out = generate(&model, &tokenizer, vec![request(vec![1], 1.0, 0, 0)], 1, 0).unwrap();
        assert!(out[0].token_ids.is_empty());
    }
}

//! The copy probe: does the warm-started model copy what it has just read?
//!
//! RL can only reinforce answers the warm-started policy sometimes gets right, and in this world
//! every right answer is a value copied from a search result. A warm start that learnt the format
//! but writes a prior over names, cities and years instead of the one it read gives GRPO almost
//! no reward to work with, and its training loss alone does not tell it apart (a warm start at
//! loss 0.040 sat between the ones that copied and the ones that did not). The probe asks
//! directly: on the gold trajectories of questions whose passages the warm start never trained
//! on (the RL split), teacher-forced through the final turn, is the value after its "... is"
//! (the answer, as the search results gave it) the model's most likely continuation, every token
//! of it, and the same value again inside `<answer>`? A warm start can copy the value into its
//! reasoning and still answer with a prior over names (`--env tools`, seed 3: a probe of 95% on
//! the reasoning alone, held-out EM 0.065), so both count. A value counts only where the searches
//! returned it, so a miss of the retriever is not the model's.

use super::gold::{GoldConfig, Segment};
use super::warm_start::{Agent, GoldError, gold_trajectory};
use super::world::World;
use kart_core::agent::trajectory::Trajectory;
use kart_model::CausalLm;
use kart_retriever::LocalIndex;
use kart_tokenizer::{Tokenizer, TokenizerError};
use kart_train::batch::{MicroBatch, Sample};
use serde::Serialize;
use std::ops::Range;
use tch::Kind;

/// RL questions the probe asks (fewer when the split is smaller).
pub const PROBE_QUESTIONS: usize = 100;

/// Share of the probe's values a warm start has to copy to pass: four in five.
pub const PASS_SHARE: f64 = 0.8;

/// Probe trajectories per forward pass.
const ROWS_PER_PASS: usize = 16;

/// The probe's questions as samples whose trained tokens are the value to copy.
pub struct ProbeSet {
    samples: Vec<Sample>,
}

/// What the probe found.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CopyProbe {
    /// Values copied, every token the most likely one.
    pub copied: usize,
    /// Values asked (questions whose searches returned their answer).
    pub values: usize,
}

impl CopyProbe {
    /// The share of values copied (0 when none was asked).
    pub fn share(&self) -> f64 {
        if self.values == 0 { 0.0 } else { self.copied as f64 / self.values as f64 }
    }

    /// Whether the model copies: at least [`PASS_SHARE`] of the values.
    pub fn passed(&self) -> bool {
        self.values > 0 && self.share() >= PASS_SHARE
    }
}

/// "`copied` of `values` values copied (share, pass at the mark)".
impl std::fmt::Display for CopyProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} values copied ({:.0}%, pass at {:.0}%)",
            self.copied,
            self.values,
            100.0 * self.share(),
            100.0 * PASS_SHARE
        )
    }
}

impl ProbeSet {
    /// The correct gold trajectories of the first [`PROBE_QUESTIONS`] RL questions, searched in
    /// `index` as the warm start searches, each with its value marked where the reasoning and
    /// the answer write it.
    pub fn new(
        world: &World,
        index: &dyn LocalIndex,
        agent: &Agent<'_>,
        topk: usize,
    ) -> Result<ProbeSet, GoldError> {
        let correct = GoldConfig { corrupt_share: 0.0, year_guess_share: 0.0, first_hop_share: 0.0, seed: 0 };
        let mut samples = Vec::new();
        for question in world.train.iter().take(PROBE_QUESTIONS) {
            let (trajectory, segments) = gold_trajectory(world, question, &correct, index, agent, topk)?;
            if let Some(spans) = value_spans(&trajectory, &segments, &question.answer, agent.tokenizer)? {
                let mut sample = Sample::new(&trajectory, 0, true);
                sample.loss_mask = vec![0.0; sample.len()];
                for span in spans {
                    sample.loss_mask[span].fill(1.0);
                }
                samples.push(sample);
            }
        }
        Ok(ProbeSet { samples })
    }

    /// Teacher-forces every probe trajectory through `model` and counts the values copied.
    pub fn measure(&self, model: &CausalLm) -> CopyProbe {
        let most_likely = 0.5f64.ln();
        let rows: Vec<usize> = (0..self.samples.len()).collect();
        let copied = tch::no_grad(|| {
            rows.chunks(ROWS_PER_PASS)
                .map(|rows| {
                    let mb = MicroBatch::new(&self.samples, rows, model.device());
                    let (logprobs, _) = mb.logprobs(model, &mb.hidden(model), 1.0, false);
                    // Above log 0.5, a token is surely the most likely one.
                    let right = logprobs.gt(most_likely).logical_or(&mb.mask.le(0.0));
                    right.all_dim(1, false).sum(Kind::Int64).int64_value(&[]) as usize
                })
                .sum()
        });
        CopyProbe { copied, values: self.samples.len() }
    }
}

/// The tokens of `answer` where the last turn of `trajectory` (made of `segments`) writes it:
/// after "... is" in its reasoning and inside `<answer>`; `None` when no search returned the
/// answer, or the turn does not tokenise apart there.
fn value_spans(
    trajectory: &Trajectory,
    segments: &[Segment],
    answer: &str,
    tokenizer: &Tokenizer,
) -> Result<Option<[Range<usize>; 2]>, TokenizerError> {
    let read = segments.iter().any(|s| matches!(s, Segment::Env(text) if text.contains(answer)));
    let Some(Segment::Model { turn, .. }) = segments.last() else { return Ok(None) };
    let reasoned = turn.find(&format!(" is {answer}.")).map(|i| i + " is".len());
    let answered = turn.rfind(&format!("<answer> {answer} </answer>")).map(|i| i + "<answer>".len());
    let (Some(reasoned), Some(answered), true) = (reasoned, answered, read) else { return Ok(None) };
    let whole = tokenizer.encode(turn, false)?;
    let start = trajectory.len() - whole.len();
    let mut spans = Vec::with_capacity(2);
    for at in [reasoned, answered] {
        let before = tokenizer.encode(&turn[..at], false)?;
        let value = tokenizer.encode(&turn[at..at + 1 + answer.len()], false)?;
        if !whole.starts_with(&[&before[..], &value].concat()) {
            return Ok(None);
        }
        spans.push(start + before.len()..start + before.len() + value.len());
    }
    Ok(spans.try_into().ok())
}

/// Probes, then while the probe fails and fewer than `rounds` extra rounds ran, trains one more
/// (`train_more(round)`, from 1) and probes again; returns the last probe and the extra rounds.
pub fn train_until_copies<E>(
    mut probe: impl FnMut() -> CopyProbe,
    rounds: u32,
    mut train_more: impl FnMut(u32) -> Result<(), E>,
) -> Result<(CopyProbe, u32), E> {
    let mut result = probe();
    let mut ran = 0;
    while !result.passed() && ran < rounds {
        ran += 1;
        train_more(ran)?;
        result = probe();
    }
    Ok((result, ran))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::format::AgentFormat;
    use crate::local::world::WorldConfig;
    use kart_model::{ModelConfig, QwenSizes};
    use kart_tokenizer::ChatTemplate;

    fn probe(copied: usize) -> CopyProbe {
        CopyProbe { copied, values: 10 }
    }

    #[test]
    fn training_goes_on_while_the_probe_fails_and_rounds_remain() {
        let run = |results: &[usize], rounds| {
            let mut results = results.iter().map(|&c| probe(c));
            let mut trained = Vec::new();
            let out = train_until_copies(
                || results.next().unwrap(),
                rounds,
                |r| {
                    trained.push(r);
                    Ok::<_, std::convert::Infallible>(())
                },
            );
            (out.unwrap(), trained)
        };
        assert_eq!(run(&[9], 2), ((probe(9), 0), vec![]), "a first pass trains no more");
        assert_eq!(run(&[3, 5, 8], 2), ((probe(8), 2), vec![1, 2]), "passes in the last round");
        assert_eq!(run(&[3, 5, 8], 1), ((probe(5), 1), vec![1]), "the bound holds: still failing");
        assert_eq!(run(&[3], 0), ((probe(3), 0), vec![]), "no extra rounds: probe only");
        assert!(probe(8).passed() && !probe(7).passed());
        assert!(!CopyProbe { copied: 0, values: 0 }.passed(), "no value asked is no pass");
        let failed = train_until_copies(|| probe(3), 2, |r| if r == 2 { Err(r) } else { Ok(()) });
        assert_eq!(failed, Err(2), "a round that fails ends the warm start with its error");
    }

    #[test]
    fn the_probe_marks_the_answer_as_read_and_a_random_model_does_not_copy_it() {
        let config = WorldConfig {
            persons: 300,
            cities: 20,
            companies: 30,
            test_questions: 10,
            train_questions: 30,
            ..WorldConfig::default()
        };
        let world = World::generate(&config).unwrap();
        let dir = tempfile::tempdir().unwrap();
        world.write_corpus(&dir.path().join("corpus.jsonl")).unwrap();
        let index_dir = dir.path().join("index");
        kart_retriever::bm25::build(&dir.path().join("corpus.jsonl"), &index_dir, 16 << 20, |_, _, _| ())
            .unwrap();
        let index = kart_retriever::bm25::Bm25Index::open(&index_dir).unwrap();
        let texts: Vec<String> = world.passages.iter().map(|p| format!("{}\n{}", p.title, p.text)).collect();
        let special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
        let tokenizer = Tokenizer::train_byte_level_bpe(
            texts.iter().map(String::as_str),
            2000,
            &special,
            "<|im_end|>",
            "<|endoftext|>",
        )
        .unwrap();
        let mut sets = Vec::new();
        for format in [AgentFormat::SearchR1, AgentFormat::Tools] {
            tokenizer.save(dir.path(), Some(format.chat_template())).unwrap();
            let template = ChatTemplate::load(dir.path()).unwrap().unwrap();
            let agent = Agent { format, tokenizer: &tokenizer, template: &template };
            let set = ProbeSet::new(&world, &index, &agent, 3).unwrap();
            assert!(
                set.samples.len() >= 20,
                "{format:?}: most searches return the answer: {}",
                set.samples.len()
            );
            for sample in &set.samples {
                let marked: Vec<u32> = (0..sample.len())
                    .filter(|&t| sample.loss_mask[t] == 1.0)
                    .map(|t| sample.token_ids[t] as u32)
                    .collect();
                let text = tokenizer.decode(&marked, false).unwrap();
                // Each sample's marked tokens are one answer of the split, in the reasoning and
                // inside <answer>.
                assert!(
                    world.train.iter().any(|q| text == format!(" {0} {0}", q.answer)),
                    "{format:?}: {text:?}"
                );
            }
            sets.push(set);
        }
        let sizes = QwenSizes {
            vocab_size: tokenizer.vocab_size(),
            hidden_size: 32,
            intermediate_size: 64,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            max_position_embeddings: 2048,
            tie_word_embeddings: true,
            initializer_range: 0.1,
        };
        let model = CausalLm::random(ModelConfig::qwen2(sizes).unwrap(), tch::Device::Cpu, 1).unwrap();
        for set in &sets {
            let result = set.measure(&model);
            assert_eq!(result.values, set.samples.len());
            assert!(result.copied <= 1 && !result.passed(), "{result:?}");
        }
    }
}

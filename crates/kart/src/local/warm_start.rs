//! The supervised warm start of `kart local`: copy drills ([`super::copy_drill`]) first, fact
//! drills ([`super::fact_drill`]) next, then the gold trajectories of the warm-start questions
//! (with more fact drills between them),
//! tokenised exactly as rollouts tokenise them (the prompt through the chat template, each model
//! turn and each observation on its own), trained with cross-entropy on the model turns (but for
//! the values imperfect turns make up) and on the observation tokens a model could copy from
//! earlier in the trajectory (never on the prompt).

use super::copy_probe::CopyProbe;
use super::format::{AgentFormat, FormatError};
use super::gold::{GoldConfig, Segment};
use super::world::{Question, World};
use indicatif::ProgressBar;
use kart_core::agent::search_r1::passages_to_string;
use kart_core::agent::trajectory::Trajectory;
use kart_core::config::train::{OptimConfig, Schedule};
use kart_model::CausalLm;
use kart_retriever::LocalIndex;
use kart_tokenizer::{ChatTemplate, Tokenizer, TokenizerError};
use kart_train::batch::{MicroBatch, Sample};
use kart_train::optim::{AdamW, learning_rate};
use serde::Serialize;
use std::collections::HashSet;
use tch::Kind;

/// Settings of the warm start.
#[derive(Debug, Clone)]
pub struct WarmStart {
    /// Optimiser updates on the gold trajectories.
    pub steps: u64,
    /// Optimiser updates on copy drills before them ([`super::copy_drill`]), one schedule over
    /// all.
    pub copy_steps: u64,
    /// Optimiser updates on fact drills ([`super::fact_drill`]) after the copy drills.
    pub fact_steps: u64,
    /// During the gold phase, one more fact-drill update after every this many gold updates (0:
    /// none). Each gold trajectory is seen several times, so its values can also be recalled
    /// from memory; the fresh values of the drills between them keep looking them up in the
    /// search results what predicts them.
    pub fact_every: u64,
    /// Trajectories per update.
    pub batch: usize,
    /// Peak learning rate of each phase: the drills, then the gold phase (the gold updates and
    /// the drills between them), each a cosine schedule after 5% warm-up of its own.
    pub lr: f64,
    /// Gold trajectories and their imperfect share.
    pub gold: GoldConfig,
}

impl WarmStart {
    /// Its fact-drill updates: those after the copy drills and those between the gold updates.
    pub fn fact_updates(&self) -> u64 {
        self.fact_steps + self.steps.checked_div(self.fact_every).unwrap_or(0)
    }

    /// Its optimiser updates: copy drills, fact drills and gold trajectories.
    pub fn updates(&self) -> u64 {
        self.copy_steps + self.fact_updates() + self.steps
    }

    /// The pool of each update, in order: the copy drills, the fact drills, then the gold
    /// trajectories with a fact-drill update after every [`WarmStart::fact_every`] of them (a
    /// pool with no samples is left out).
    fn schedule(&self, copies: bool, facts: bool, gold: bool) -> Vec<Pool> {
        let mut pools = Vec::with_capacity(self.updates() as usize);
        pools.extend(std::iter::repeat_n(Pool::Copies, if copies { self.copy_steps as usize } else { 0 }));
        pools.extend(std::iter::repeat_n(Pool::Facts, if facts { self.fact_steps as usize } else { 0 }));
        for g in 1..=if gold { self.steps } else { 0 } {
            pools.push(Pool::Gold);
            if facts && self.fact_every > 0 && g % self.fact_every == 0 {
                pools.push(Pool::Facts);
            }
        }
        pools
    }
}

/// Why a gold trajectory could not be tokenised.
#[derive(Debug, thiserror::Error)]
pub enum GoldError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("question {id}: {source}")]
    Format { id: String, source: FormatError },
    #[error("gold turn {turn:?}: {reason}")]
    Turn { turn: String, reason: String },
}

/// The gold trajectories of the world's warm-start questions, token-exact.
pub fn gold_trajectories(
    world: &World,
    gold: &GoldConfig,
    index: &dyn LocalIndex,
    agent: &Agent<'_>,
    topk: usize,
) -> Result<Vec<Trajectory>, GoldError> {
    world
        .warm_start
        .iter()
        .map(|q| gold_trajectory(world, q, gold, index, agent, topk).map(|(t, _)| t))
        .collect()
}

/// What the agent's trajectories are written with: its format, tokenizer and chat template.
#[derive(Clone, Copy)]
pub struct Agent<'a> {
    pub format: AgentFormat,
    pub tokenizer: &'a Tokenizer,
    pub template: &'a ChatTemplate,
}

/// The gold trajectory of `question`, token-exact, with the segments it was made of.
pub fn gold_trajectory(
    world: &World,
    question: &Question,
    gold: &GoldConfig,
    index: &dyn LocalIndex,
    agent: &Agent<'_>,
    topk: usize,
) -> Result<(Trajectory, Vec<Segment>), GoldError> {
    let (q, tokenizer) = (question, agent.tokenizer);
    let search = |query: &str| {
        let hits = index.search_batch(&[query.to_string()], topk).map(|mut r| r.pop().unwrap_or_default());
        passages_to_string(&hits.unwrap_or_default())
    };
    let segments = world.gold_trajectory(q, gold, search);
    let (prompt, segments) = agent
        .format
        .gold(&q.question, segments, agent.template, tokenizer, search)
        .map_err(|source| GoldError::Format { id: q.id.clone(), source })?;
    let mut t = Trajectory::new(q.id.clone(), q.id.clone(), &tokenizer.encode(&prompt, false)?);
    for segment in &segments {
        match segment {
            Segment::Model { turn, guess } => push_turn(&mut t, turn, guess.as_deref(), tokenizer)?,
            Segment::Env(text) => t.push_env(&tokenizer.encode(text, false)?),
        }
    }
    Ok((t, segments))
}

/// Appends a model turn to `t`. A made-up `guess` is appended as if the environment had written
/// it, so that the warm start trains it only where it repeats an earlier token; the turn's tokens
/// stay exactly those of the whole turn encoded at once.
fn push_turn(
    t: &mut Trajectory,
    turn: &str,
    guess: Option<&str>,
    tokenizer: &Tokenizer,
) -> Result<(), GoldError> {
    let gold_error = |reason: String| GoldError::Turn { turn: turn.to_owned(), reason };
    let push = |t: &mut Trajectory, ids: &[u32]| {
        t.push_model(ids, &vec![0.0; ids.len()], 0).map_err(|e| gold_error(e.to_string()))
    };
    let Some(g) = guess else { return push(t, &tokenizer.encode(turn, false)?) };
    // Its first occurrence as a word: after a space (kept with it, as the tokenizer keeps it)
    // or after a quote (a function call's JSON argument).
    let at = turn
        .match_indices(g)
        .map(|(i, _)| i)
        .find(|&i| turn[..i].ends_with([' ', '"']))
        .ok_or_else(|| gold_error(format!("the guess {g:?} is not in the turn {turn:?}")))?;
    let end = at + g.len();
    let at = if turn[..at].ends_with(' ') { at - 1 } else { at };
    let before = tokenizer.encode(&turn[..at], false)?;
    let guessed = tokenizer.encode(&turn[at..end], false)?;
    let after = tokenizer.encode(&turn[end..], false)?;
    if [&before[..], &guessed, &after].concat() != tokenizer.encode(turn, false)? {
        return Err(gold_error(format!("the turn {turn:?} does not tokenise apart at the guess {g:?}")));
    }
    push(t, &before)?;
    t.push_env(&guessed);
    push(t, &after)
}

/// A warm-start sample of `trajectory`: its model turns, and the observation tokens that already
/// appeared earlier in the trajectory. A model made from scratch has never read text, and the
/// search results (the query's words in a title, a title's name again in its passage, a name
/// from one passage in another) are where it first learns to copy. An observation token seen for
/// the first time (a birth year, a city, a name) can only be guessed, and training those guesses
/// teaches a prior over each kind of value instead: the tokens of years and cities become alike
/// and the model cannot copy them even from its own reasoning into its answer.
fn copy_sample(trajectory: &Trajectory) -> Sample {
    let mut sample = Sample::new(trajectory, 0, true);
    let mut seen: HashSet<i64> = sample.token_ids[..sample.prompt_len].iter().copied().collect();
    for (t, id) in sample.token_ids.iter().enumerate().skip(sample.prompt_len) {
        if !seen.insert(*id) {
            sample.loss_mask[t] = 1.0;
        }
    }
    sample
}

/// What a warm start trains on.
#[derive(Clone, Copy)]
pub struct Lessons<'a> {
    /// Copy drills, each once.
    pub copies: &'a [Trajectory],
    /// Fact drills, each once.
    pub facts: &'a [Trajectory],
    /// Gold trajectories, one set per draw of the world's warm-start facts
    /// ([`World::redrawn`]), each of the same questions in the same order. They are cycled in a
    /// seeded order, pass `k` over the questions reading draw `k` modulo their number.
    pub gold: &'a [Vec<Trajectory>],
    /// Gold updates an earlier warm start of the same seed trained: this one's rows continue
    /// the cycle after theirs, so a later round reads draws the earlier one has not.
    pub gold_done: usize,
}

/// Trains `model` on the copy drills (`config.copy_steps` updates), then the fact drills
/// ([`WarmStart::fact_updates`] updates), then the gold trajectories (`config.steps` updates)
/// with the rest of the fact drills between them; returns each update. `probe` (a period and a
/// measure, given the updates done) is measured after every period of updates.
pub fn train(
    model: &CausalLm,
    Lessons { copies, facts, gold: draws, gold_done }: Lessons<'_>,
    config: &WarmStart,
    seed: u64,
    probe: Option<(u64, &dyn Fn(u64) -> CopyProbe)>,
    bar: &ProgressBar,
) -> Vec<Update> {
    let questions = draws.first().map_or(0, Vec::len);
    assert!(draws.iter().all(|d| d.len() == questions), "every draw has a trajectory of each question");
    let schedule = config.schedule(!copies.is_empty(), !facts.is_empty(), questions > 0);
    // One pool of drills, taken in order: the copy drills' updates, then the fact drills'.
    let drills: Vec<Sample> = copies.iter().chain(facts).map(copy_sample).collect();
    let samples: Vec<Sample> = draws.iter().flatten().map(copy_sample).collect();
    let optim = OptimConfig {
        lr: config.lr,
        warmup_ratio: 0.05,
        schedule: Schedule::Cosine,
        min_lr_ratio: 0.1,
        weight_decay: 0.01,
        ..OptimConfig::default()
    };
    let mut optimizer = AdamW::new(model.named_tensors(), optim.clone());
    let order = kart_train::data::permutation(seed, 0, questions);
    let mut updates = Vec::with_capacity(schedule.len());
    let (mut drill_updates, mut gold_updates) = (0, 0);
    for (step, &pool) in (0..).zip(&schedule) {
        let (pooled, rows) = match pool {
            Pool::Gold => {
                gold_updates += 1;
                (
                    &samples,
                    rows(gold_done + gold_updates - 1, config.batch, |i| gold_row(i, &order, draws.len())),
                )
            }
            Pool::Copies | Pool::Facts => {
                drill_updates += 1;
                (&drills, rows(drill_updates - 1, config.batch, |i| i % drills.len()))
            }
        };
        let mb = MicroBatch::new(pooled, &rows, model.device());
        optimizer.zero_grad();
        let (logprobs, _) = mb.logprobs(model, &mb.hidden(model), 1.0, false);
        let loss = -(logprobs * &mb.mask).sum(Kind::Float) / mb.mask.sum(Kind::Float).clamp_min(1.0);
        loss.backward();
        optimizer.step(phase_lr(&optim, &schedule, step as usize));
        let value = loss.double_value(&[]);
        let probe =
            probe.filter(|&(every, _)| (step + 1) % every.max(1) == 0).map(|(_, measure)| measure(step + 1));
        updates.push(Update { pool, loss: value, probe });
        bar.set_position(step + 1);
        bar.set_message(format!("loss {value:.3}"));
    }
    updates
}

/// The learning rate of update `step` of `schedule`: the drills before the first gold update and
/// the gold phase after them each warm up to the peak and decay on their own cosine, so the
/// gold trajectories are learnt at the peak rate, not at the drills' tail.
fn phase_lr(optim: &OptimConfig, schedule: &[Pool], step: usize) -> f64 {
    let drills = schedule.iter().take_while(|&&pool| pool != Pool::Gold).count();
    let (step, total) = if step < drills { (step, drills) } else { (step - drills, schedule.len() - drills) };
    learning_rate(optim, step as u64, total as u64)
}

/// The rows of a pool's `k`-th update: `batch` consecutive positions, each mapped by `row`.
fn rows(k: usize, batch: usize, row: impl Fn(usize) -> usize) -> Vec<usize> {
    (k * batch..(k + 1) * batch).map(row).collect()
}

/// The sample at position `i` of the gold pool: question `order[i % n]` of draw `(i / n) % draws`
/// (the draws one after another, `n` questions each).
fn gold_row(i: usize, order: &[usize], draws: usize) -> usize {
    let n = order.len();
    (i / n % draws) * n + order[i % n]
}

/// One warm-start update: what it trained on, and its loss per trained token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Update {
    pub pool: Pool,
    pub loss: f64,
    /// The copy probe right after it, where one was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<CopyProbe>,
}

/// The mean loss of the last tenth of `updates` (at least one), the warm start's loss at its end;
/// NaN when there were no updates.
pub fn end_loss(updates: &[Update]) -> f64 {
    let tail = &updates[updates.len() - updates.len().div_ceil(10)..];
    if tail.is_empty() { f64::NAN } else { tail.iter().map(|u| u.loss).sum::<f64>() / tail.len() as f64 }
}

/// The samples a warm-start update draws from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Pool {
    /// Copy drills ([`super::copy_drill`]).
    #[serde(rename = "copy-drill")]
    Copies,
    /// Fact drills ([`super::fact_drill`]).
    #[serde(rename = "fact-drill")]
    Facts,
    /// Gold trajectories.
    #[serde(rename = "gold")]
    Gold,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_then_fact_drills_come_first_then_the_gold_updates_with_fact_drills_between_them() {
        use Pool::{Copies as C, Facts as F, Gold as G};
        let ws = |fact_every| WarmStart {
            steps: 5,
            copy_steps: 2,
            fact_steps: 1,
            fact_every,
            batch: 2,
            lr: 1e-3,
            gold: GoldConfig::default(),
        };
        assert_eq!(ws(0).schedule(true, true, true), [C, C, F, G, G, G, G, G]);
        assert_eq!(ws(2).schedule(true, true, true), [C, C, F, G, G, F, G, G, F, G]);
        assert_eq!(ws(2).updates(), 10);
        assert_eq!(ws(2).fact_updates(), 3);
        assert_eq!(ws(2).schedule(false, false, true), [G; 5], "pools without samples are left out");
        assert_eq!(ws(2).schedule(true, true, false), [C, C, F]);
    }

    #[test]
    fn a_pool_takes_consecutive_rows_and_gold_updates_cycle_through_their_order() {
        let order = [4, 0, 3, 1, 2];
        assert_eq!(rows(0, 2, |i| i % 6), [0, 1]);
        assert_eq!(rows(3, 2, |i| i % 6), [0, 1], "drills repeat when there are fewer than taken");
        assert_eq!(rows(2, 2, |i| gold_row(i, &order, 1)), [2, 4]);
        // The second pass over the questions reads the second draw, the third the first again.
        assert_eq!(rows(2, 3, |i| gold_row(i, &order, 2)), [5, 8, 6]);
        assert_eq!(rows(4, 3, |i| gold_row(i, &order, 2)), [3, 1, 2]);
        // A later round that continues after a pass's worth of updates reads the next draw.
        let gold_done = 5;
        assert_eq!(rows(gold_done, 1, |i| gold_row(i, &order, 3)), [order[0] + 5]);
    }

    #[test]
    fn a_later_warm_start_reads_the_draw_after_the_gold_updates_done_before_it() {
        // Two draws of the same two questions; one update of batch 2 is one pass over them.
        let draw = |d: u32| -> Vec<Trajectory> {
            (0..2)
                .map(|q| {
                    let mut t = Trajectory::new(format!("d{d}q{q}"), format!("q{q}"), &[1, 2 + q]);
                    let answer = [10 + 10 * d + q, 11 + 10 * d, 12 + 10 * d + q];
                    t.push_model(&answer, &[0.0; 3], 0).unwrap();
                    t
                })
                .collect()
        };
        let draws = [draw(0), draw(1)];
        let sizes = kart_model::QwenSizes {
            vocab_size: 40,
            hidden_size: 16,
            intermediate_size: 32,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            max_position_embeddings: 64,
            tie_word_embeddings: true,
            initializer_range: 0.5,
        };
        let config = WarmStart {
            steps: 1,
            copy_steps: 0,
            fact_steps: 0,
            fact_every: 0,
            batch: 2,
            lr: 1e-3,
            gold: GoldConfig::default(),
        };
        // The loss of the first update, taken before it changes the model: what that update read.
        let first_loss = |gold: &[Vec<Trajectory>], gold_done| {
            let model = CausalLm::random(kart_model::ModelConfig::qwen2(sizes).unwrap(), tch::Device::Cpu, 7)
                .unwrap();
            let lessons = Lessons { copies: &[], facts: &[], gold, gold_done };
            train(&model, lessons, &config, 3, None, &ProgressBar::hidden())[0].loss
        };
        let after_a_pass = first_loss(&draws, 1);
        assert_eq!(after_a_pass, first_loss(&draws[1..], 0), "one update done: the second draw");
        assert_ne!(after_a_pass, first_loss(&draws, 0), "none done: the first draw");
        assert_eq!(first_loss(&draws, 2), first_loss(&draws, 0), "two done: the first draw again");
    }

    #[test]
    fn the_drills_and_the_gold_phase_each_warm_up_and_decay() {
        use Pool::{Copies as C, Facts as F, Gold as G};
        let optim = OptimConfig {
            lr: 1.0,
            warmup_ratio: 0.5,
            schedule: Schedule::Cosine,
            min_lr_ratio: 0.0,
            ..OptimConfig::default()
        };
        let schedule = [C, C, F, F, G, F, G, G];
        let lrs: Vec<f64> = (0..schedule.len()).map(|step| phase_lr(&optim, &schedule, step)).collect();
        assert_eq!(lrs[..4], [0.5, 1.0, 1.0, 0.5], "the drills: warm-up, then the cosine");
        assert_eq!(lrs[4..], [0.5, 1.0, 1.0, 0.5], "the gold phase warms up and decays again");
        // Without gold updates the drills are the whole schedule.
        assert_eq!(phase_lr(&optim, &[C, C], 1), 1.0);
    }

    #[test]
    fn the_end_loss_is_the_mean_of_the_last_tenth() {
        let losses: Vec<Update> =
            (1..=20).map(|l| Update { pool: Pool::Gold, loss: f64::from(l), probe: None }).collect();
        assert_eq!(end_loss(&losses), 19.5);
        assert_eq!(end_loss(&losses[..3]), 3.0);
        assert!(end_loss(&[]).is_nan());
    }

    #[test]
    fn observations_are_trained_only_where_they_repeat_an_earlier_token() {
        let mut t = Trajectory::new("q", "q", &[1, 2, 3]);
        t.push_model(&[4, 5], &[0.0, 0.0], 0).unwrap();
        // 2 is in the prompt, 5 in the model turn, 6 repeats within the observation; 7 and the
        // first 6 are new.
        t.push_env(&[2, 6, 7, 6, 5]);
        t.push_model(&[7, 8], &[0.0, 0.0], 0).unwrap();
        let sample = copy_sample(&t);
        assert_eq!(sample.loss_mask, [0., 0., 0., 1., 1., 1., 0., 0., 1., 1., 1., 1.]);
    }

    #[test]
    fn a_made_up_value_is_not_trained_where_the_turn_first_writes_it() {
        let text = "<think> I believe the answer is Vell Harrow. </think>\n<answer> Vell Harrow </answer>";
        let texts = std::iter::repeat_n("I believe the answer is Dorn Vale. Harrow", 50).chain([text]);
        let special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
        let tokenizer =
            Tokenizer::train_byte_level_bpe(texts, 300, &special, "<|im_end|>", "<|endoftext|>").unwrap();
        let mut t = Trajectory::new("q", "q", &tokenizer.encode("Who?", false).unwrap());
        push_turn(&mut t, text, Some("Vell Harrow"), &tokenizer).unwrap();
        assert_eq!(t.response_ids(), tokenizer.encode(text, false).unwrap());
        let guess = tokenizer.encode(" Vell Harrow", false).unwrap();
        let before = tokenizer.encode("<think> I believe the answer is", false).unwrap().len();
        let sample = copy_sample(&t);
        let trained: Vec<f32> = sample.loss_mask[sample.prompt_len..].to_vec();
        // The turn is trained but for the made-up name; where the answer repeats it, it is trained.
        assert!(trained[..before].iter().all(|&m| m == 1.0));
        assert!(trained[before..before + guess.len()].iter().all(|&m| m == 0.0));
        assert!(trained[before + guess.len()..].iter().all(|&m| m == 1.0));
        let missing = push_turn(&mut t, text, Some("Dorn Vale"), &tokenizer).unwrap_err();
        assert!(missing.to_string().contains("Dorn Vale"), "{missing}");
    }
}

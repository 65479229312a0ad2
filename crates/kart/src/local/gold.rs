//! Gold trajectories for the supervised warm start, in the exact Search-R1 format.
//!
//! A trajectory alternates model turns and environment observations. Each model turn is
//! `<think> … </think>\n<search> query </search>` or, last, `<think> … </think>\n<answer> a
//! </answer>`; each search is answered by the caller's retriever and wrapped by the protocol's own
//! [`execute`], so the observation is byte for byte what a rollout sees. A configurable share of
//! the questions gets a deliberately imperfect trajectory ([`Variant`]) so that RL has something
//! to fix. Imperfections spread evenly over the questions never show under greedy decoding (the
//! most likely turn is the correct one everywhere), so optional shares are habits tied to a kind
//! of question: year questions answered from memory, without a search, as a base model answers
//! dates it believes it knows, or two-hop questions answered with the bridge entity after the
//! first hop. With most such questions answered so, the warm-started policy does it greedily
//! while its samples still do better sometimes, which RL can reward. An imperfect turn marks the
//! value it makes up (the guessed answer, the other entity of a wrong query) so that the warm
//! start teaches the mistake but not a prior over names and values. The choice and the
//! imperfections are deterministic per question and seed.

use super::rng::Rng;
use super::world::{BIRTH_YEARS, Entity, FOUNDING_YEARS, Hop, Question, Relation, World};
use kart_core::agent::search_r1::{execute, parse_action};

/// One piece of a trajectory after the prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// A model turn. `guess`, when set, is a value the turn makes up (the answer of a trajectory
    /// that does not search, the other entity of a wrong query): written first at its first
    /// occurrence after a space or a quote in `turn`, it is the one part of a model turn the warm start does
    /// not train, because training guesses teaches a prior over names and values instead of
    /// copying them. Later occurrences repeat it and are trained.
    Model { turn: String, guess: Option<String> },
    /// An environment observation (trained only where it repeats an earlier token).
    Env(String),
}

/// How many gold trajectories are imperfect, and which.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GoldConfig {
    /// Share of the questions with an imperfect trajectory.
    pub corrupt_share: f64,
    /// Share of the questions asking for a year (birth or founding) answered with a guess and no
    /// search, before `corrupt_share` applies to the rest.
    pub year_guess_share: f64,
    /// Share of the two-hop questions answered with the bridge entity after the first hop, before
    /// `corrupt_share` applies to the rest.
    pub first_hop_share: f64,
    /// Seed of the choice of questions and of their imperfections.
    pub seed: u64,
}

/// The defaults of `kart local`: a quarter of the trajectories imperfect, and half the year
/// questions answered from memory.
impl Default for GoldConfig {
    fn default() -> Self {
        GoldConfig { corrupt_share: 0.25, year_guess_share: 0.5, first_hop_share: 0.0, seed: 0 }
    }
}

/// The kind of a gold trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Searches each hop's gold query and answers correctly.
    Correct,
    /// Searches about a different entity of the same kind and answers from what came back (a
    /// [`Variant::NoSearch`] trajectory when the world has no such entity).
    WrongQuery,
    /// Answers at once with a guess of the right type (never the answer).
    NoSearch,
    /// Two-hop only: answers with the bridge entity after the first hop.
    FirstHopOnly,
}

impl Segment {
    /// A model turn with nothing made up.
    pub fn model(turn: impl Into<String>) -> Self {
        Segment::Model { turn: turn.into(), guess: None }
    }
}

impl World {
    /// The variant of `question`'s trajectory: a guess for about `year_guess_share` of the year
    /// questions; otherwise imperfect for about `corrupt_share` of the questions, then one of the
    /// imperfections that apply, uniformly.
    pub fn gold_variant(&self, question: &Question, config: &GoldConfig) -> Variant {
        let mut rng = Rng::stream(config.seed, &question.question);
        let asks_year =
            matches!(question.hops.last().map(|h| h.relation), Some(Relation::BirthYear | Relation::Founded));
        if asks_year && rng.chance(config.year_guess_share) {
            return Variant::NoSearch;
        }
        if question.hops.len() > 1 && rng.chance(config.first_hop_share) {
            return Variant::FirstHopOnly;
        }
        if !rng.chance(config.corrupt_share) {
            return Variant::Correct;
        }
        match question.hops.len() {
            1 => rng.pick(&[Variant::WrongQuery, Variant::NoSearch]),
            _ => rng.pick(&[Variant::WrongQuery, Variant::NoSearch, Variant::FirstHopOnly]),
        }
    }

    /// The trajectory of `question` after its prompt. `search` returns the retriever's results for
    /// a query as [`kart_core::agent::search_r1::passages_to_string`] text.
    pub fn gold_trajectory(
        &self,
        question: &Question,
        config: &GoldConfig,
        mut search: impl FnMut(&str) -> String,
    ) -> Vec<Segment> {
        let variant = self.gold_variant(question, config);
        let mut rng = Rng::stream(config.seed, &format!("imperfect: {}", question.question));
        let (hops, mut made_up) = match variant {
            Variant::Correct => (question.hops.clone(), None),
            Variant::FirstHopOnly => (question.hops[..1].to_vec(), None),
            Variant::WrongQuery => match self.other_subject(question, &mut rng) {
                Some(hops) => {
                    let other = hops[0].title.clone();
                    (hops, Some(other))
                }
                None => return self.no_search(question, &mut rng),
            },
            Variant::NoSearch => return self.no_search(question, &mut rng),
        };
        // Whom the reasoning believes each hop is about: the asked subject, then what came back.
        let believed: Vec<&str> = std::iter::once(question.hops[0].title.as_str())
            .chain(hops.iter().map(|h| h.answer.as_str()))
            .collect();
        let need = |k: usize| format!("I need to find {}.", hops[k].relation.phrase(believed[k]));
        let fact = |k: usize| {
            format!("{} is {}.", capitalised(&hops[k].relation.phrase(believed[k])), hops[k].answer)
        };
        let mut segments = Vec::new();
        for (k, hop) in hops.iter().enumerate() {
            let think = if k == 0 { need(k) } else { format!("{} Now {}", fact(k - 1), need(k)) };
            let turn = format!("<think> {think} </think>\n<search> {} </search>", hop.query);
            let step = execute(parse_action(&turn).as_ref(), &search(&hop.query));
            // A wrong query makes up its entity in the first turn; later turns copy what came back.
            segments.push(Segment::Model { turn, guess: made_up.take() });
            segments.push(Segment::Env(step.observation));
        }
        let last = hops.len() - 1;
        let answer = &hops[last].answer;
        segments
            .push(Segment::model(format!("<think> {} </think>\n<answer> {answer} </answer>", fact(last))));
        segments
    }

    /// The question's chain asked about another entity of the subject's kind.
    fn other_subject(&self, question: &Question, rng: &mut Rng) -> Option<Vec<Hop>> {
        let chain: Vec<Relation> = question.hops.iter().map(|h| h.relation).collect();
        let subject = self.entity(&question.hops[0].title)?;
        (0..100).find_map(|_| {
            let other = match subject {
                Entity::Person(_) => Entity::Person(rng.below(self.persons.len())),
                Entity::Company(_) => Entity::Company(rng.below(self.companies.len())),
            };
            let hops = (other != subject).then(|| self.hops(other, &chain)).flatten()?;
            (hops.last()?.answer != question.answer).then_some(hops)
        })
    }

    /// An immediate answer: a value of the answer's type that is not the answer.
    fn no_search(&self, question: &Question, rng: &mut Rng) -> Vec<Segment> {
        let last = question.hops.last().expect("a question has hops");
        let guess = loop {
            let guess = match last.relation {
                Relation::Birthplace | Relation::Headquarters => {
                    self.cities[rng.below(self.cities.len())].name.clone()
                }
                Relation::BirthYear => rng.between(BIRTH_YEARS.0, BIRTH_YEARS.1).to_string(),
                Relation::Founded => rng.between(FOUNDING_YEARS.0, FOUNDING_YEARS.1).to_string(),
                Relation::Spouse => self.persons[rng.below(self.persons.len())].name.clone(),
                Relation::Employer => self.companies[rng.below(self.companies.len())].name.clone(),
            };
            if guess != question.answer {
                break guess;
            }
        };
        vec![Segment::Model {
            turn: format!("<think> I believe the answer is {guess}. </think>\n<answer> {guess} </answer>"),
            guess: Some(guess),
        }]
    }
}

/// `s` with its first letter upper-case.
pub(super) fn capitalised(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map(|c| c.to_uppercase().collect::<String>() + chars.as_str()).unwrap_or_default()
}

#[cfg(test)]
mod tests;

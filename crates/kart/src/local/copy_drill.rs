//! Copy drills: the first lesson of a model made from scratch, before its warm start.
//!
//! A pretrained language model arrives with induction heads, the circuit that finds an earlier
//! occurrence of the current token and copies what followed it. A search agent needs little
//! more to answer from its search results, but a tiny model made from scratch has to form the
//! circuit from the gold trajectories alone, where most tokens can also be predicted from the
//! templates around them, and whether it does within a few minutes of CPU depended on the seed:
//! without it the warm-started model writes a prior over names and cities instead of the ones it
//! just read, and RL has nothing to reinforce. A drill is a run of words drawn at random from the
//! world's passages (names, cities and years at their corpus frequencies), then the same words
//! again, trained on the repeat only. Copying is the only way to predict the repeat, so the
//! circuit forms within a few hundred updates of these short sequences, for every token the
//! warm start will have to copy.

use super::rng::Rng;
use super::world::World;
use kart_core::agent::trajectory::Trajectory;
use kart_model::ModelError;
use kart_tokenizer::Tokenizer;

/// Words in a drill, before their repeat.
pub const DRILL_WORDS: usize = 24;

/// `count` drills (seeded): a prompt of [`DRILL_WORDS`] words of the world's passages, then a space
/// and the same words again as an observation (none when the world has no passages).
pub fn copy_drills(
    world: &World,
    tokenizer: &Tokenizer,
    count: usize,
    seed: u64,
) -> Result<Vec<Trajectory>, ModelError> {
    let words: Vec<&str> = world.passages.iter().flat_map(|p| p.text.split_whitespace()).collect();
    if words.is_empty() {
        return Ok(Vec::new());
    }
    let mut rng = Rng::stream(seed, "copy drills");
    (0..count)
        .map(|k| {
            let drawn: Vec<&str> = (0..DRILL_WORDS).map(|_| words[rng.below(words.len())]).collect();
            let text = drawn.join(" ");
            let id = format!("drill-{k}");
            let mut drill = Trajectory::new(id.clone(), id, &tokenizer.encode(&text, false)?);
            drill.push_env(&tokenizer.encode(&format!(" {text}"), false)?);
            Ok(drill)
        })
        .collect()
}

/// A world of 400 persons and a tokenizer trained on its passages, for the drills' tests.
#[cfg(test)]
pub(super) fn small_world() -> (World, Tokenizer) {
    let config = super::world::WorldConfig {
        persons: 400,
        cities: 30,
        companies: 40,
        test_questions: 20,
        train_questions: 20,
        ..Default::default()
    };
    let world = World::generate(&config).unwrap();
    let special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let texts = world.passages.iter().map(|p| p.text.as_str());
    let tokenizer =
        Tokenizer::train_byte_level_bpe(texts, 4000, &special, "<|im_end|>", "<|endoftext|>").unwrap();
    (world, tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drill_is_passage_words_then_the_same_words_again() {
        let (world, tokenizer) = small_world();
        let words: std::collections::HashSet<&str> =
            world.passages.iter().flat_map(|p| p.text.split_whitespace()).collect();
        let drills = copy_drills(&world, &tokenizer, 6, 7).unwrap();
        assert_eq!(drills.len(), 6);
        for drill in &drills {
            let prompt = &drill.token_ids()[..drill.prompt_len()];
            let text = tokenizer.decode(prompt, false).unwrap();
            assert_eq!(tokenizer.decode(drill.response_ids(), false).unwrap(), format!(" {text}"));
            let drawn: Vec<&str> = text.split_whitespace().collect();
            assert_eq!(drawn.len(), DRILL_WORDS, "{text}");
            assert!(drawn.iter().all(|w| words.contains(w)), "{text}");
            // After the first word, the repeat is token for token the prompt again.
            let tail = tokenizer.encode(&format!(" {}", drawn[1..].join(" ")), false).unwrap();
            assert!(prompt.ends_with(&tail) && drill.response_ids().ends_with(&tail), "{text}");
        }
        let ids = |d: &[Trajectory]| d.iter().map(|t| t.token_ids().to_vec()).collect::<Vec<_>>();
        assert_eq!(ids(&drills), ids(&copy_drills(&world, &tokenizer, 6, 7).unwrap()));
        assert_ne!(ids(&drills), ids(&copy_drills(&world, &tokenizer, 6, 8).unwrap()));
        let mut empty = world;
        empty.passages.clear();
        assert!(copy_drills(&empty, &tokenizer, 6, 7).unwrap().is_empty());
    }
}

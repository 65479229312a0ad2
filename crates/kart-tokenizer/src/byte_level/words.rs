//! The ids of pre-tokens seen before.
//!
//! Asking the BPE model for a pre-token it has cached still builds a `Token` with a `String` per
//! id and hashes the pre-token mapped to GPT-2's alphabet; most of a rollout's pre-tokens (the
//! words of templates, questions and passages) recur. [`Words`] keeps the ids of short
//! pre-tokens as they are in the text, and forgets them all when it holds [`CAPACITY`], so its
//! memory stays within a few MiB and a new vocabulary of text is learnt again.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// The most pre-tokens remembered.
const CAPACITY: usize = 1 << 16;

/// The longest pre-token remembered, in bytes: longer ones are rare and rarely recur.
const LONGEST: usize = 64;

/// Pre-tokens and their ids.
#[derive(Default)]
pub(crate) struct Words {
    known: Mutex<HashMap<Box<str>, Box<[u32]>>>,
}

impl Words {
    /// Appends the ids of each of `pieces` to `ids`: remembered ones from memory, the others from
    /// `tokenize` (called without the lock held), remembered afterwards.
    pub(crate) fn encode<'t, E>(
        &self,
        pieces: impl Iterator<Item = &'t str>,
        mut tokenize: impl FnMut(&str) -> Result<Vec<u32>, E>,
        ids: &mut Vec<u32>,
    ) -> Result<(), E> {
        let mut known = self.lock();
        for piece in pieces {
            if let Some(remembered) = known.get(piece) {
                ids.extend_from_slice(remembered);
                continue;
            }
            drop(known);
            let new = tokenize(piece)?;
            ids.extend_from_slice(&new);
            known = self.lock();
            if piece.len() <= LONGEST {
                if known.len() >= CAPACITY {
                    known.clear();
                }
                known.insert(piece.into(), new.into_boxed_slice());
            }
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Box<str>, Box<[u32]>>> {
        self.known.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many pre-tokens are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizes_each_short_piece_once_and_forgets_all_when_full() {
        let words = Words::default();
        let calls = std::cell::RefCell::new(Vec::new());
        let mut ids = Vec::new();
        let long = "x".repeat(LONGEST + 1);
        let tokenize = |piece: &str| -> Result<Vec<u32>, ()> {
            calls.borrow_mut().push(piece.to_string());
            Ok(vec![piece.len() as u32, 0])
        };
        let pieces = ["ab", " c", "ab", long.as_str(), long.as_str(), " c"];
        words.encode(pieces.into_iter(), tokenize, &mut ids).unwrap();
        assert_eq!(ids, [2, 0, 2, 0, 2, 0, 65, 0, 65, 0, 2, 0]);
        assert_eq!(
            *calls.borrow(),
            ["ab", " c", long.as_str(), long.as_str()],
            "long pieces are not remembered"
        );
        assert_eq!(words.len(), 2);

        let many: Vec<String> = (0..CAPACITY).map(|i| i.to_string()).collect();
        words.encode(many.iter().map(String::as_str), tokenize, &mut ids).unwrap();
        assert_eq!(words.len(), 2, "full at the 65535th new piece: forgotten, then the last two remembered");
    }

    #[test]
    fn a_failing_piece_fails_the_text_and_is_not_remembered() {
        let words = Words::default();
        let mut ids = Vec::new();
        let result = words.encode(
            ["a", "bad", "c"].into_iter(),
            |p| if p == "bad" { Err(p.to_string()) } else { Ok(vec![1]) },
            &mut ids,
        );
        assert_eq!(result, Err("bad".to_string()));
        assert_eq!(words.len(), 1);
    }
}

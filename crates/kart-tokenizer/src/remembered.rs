//! Texts remembered with their ids.
//!
//! Rollouts tokenise the same texts again and again: a group's prompt once per episode, the same
//! passages for every episode that retrieves them, the same words in every template and
//! question. [`Remembered`] keeps the ids of the last texts it was given (least recently used out
//! first), up to a count and a length in bytes, so a text seen before costs a lookup. It serves
//! the tokenizer's line pieces ([`crate::pieces`]) and the byte-level encoder's pre-tokens.

use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard};

use lru::LruCache;

/// Texts and their ids, least recently used first out.
pub(crate) struct Remembered {
    ids: Mutex<LruCache<Box<str>, Box<[u32]>>>,
    /// The longest text remembered, in bytes.
    longest: usize,
}

impl Remembered {
    /// Remembers at most `capacity` texts of at most `longest` bytes.
    pub(crate) fn new(capacity: NonZeroUsize, longest: usize) -> Remembered {
        Remembered { ids: Mutex::new(LruCache::new(capacity)), longest }
    }

    /// Appends the ids of each of `texts` to `ids`: remembered ones from memory, the others from
    /// `encode` (called without the lock held), remembered afterwards when short enough.
    pub(crate) fn encode<'t, E>(
        &self,
        texts: impl Iterator<Item = &'t str>,
        mut encode: impl FnMut(&str) -> Result<Vec<u32>, E>,
        ids: &mut Vec<u32>,
    ) -> Result<(), E> {
        let mut known = self.lock();
        for text in texts {
            if let Some(remembered) = known.get(text) {
                ids.extend_from_slice(remembered);
                continue;
            }
            drop(known);
            let fresh = encode(text)?;
            ids.extend_from_slice(&fresh);
            known = self.lock();
            if text.len() <= self.longest {
                known.put(text.into(), fresh.into_boxed_slice());
            }
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, LruCache<Box<str>, Box<[u32]>>> {
        self.ids.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many texts are remembered (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_each_short_text_once_and_lets_the_least_recent_go() {
        let remembered = Remembered::new(NonZeroUsize::new(2).unwrap(), 3);
        let calls = std::cell::RefCell::new(Vec::new());
        let encode = |text: &str| -> Result<Vec<u32>, ()> {
            calls.borrow_mut().push(text.to_string());
            Ok(vec![text.len() as u32, 0])
        };
        let mut ids = Vec::new();
        remembered.encode(["ab", " c", "ab", "long", "long", " c"].into_iter(), encode, &mut ids).unwrap();
        assert_eq!(ids, [2, 0, 2, 0, 2, 0, 4, 0, 4, 0, 2, 0]);
        assert_eq!(*calls.borrow(), ["ab", " c", "long", "long"], "longer than 3 bytes: not remembered");
        assert_eq!(remembered.len(), 2);
        // " c" was used last: "ab" goes out for "xyz".
        calls.borrow_mut().clear();
        remembered.encode(["xyz", " c", "ab"].into_iter(), encode, &mut ids).unwrap();
        assert_eq!(*calls.borrow(), ["xyz", "ab"]);
        assert_eq!(remembered.len(), 2);
    }

    #[test]
    fn a_failing_text_fails_the_call_and_is_not_remembered() {
        let remembered = Remembered::new(NonZeroUsize::new(8).unwrap(), 64);
        let mut ids = Vec::new();
        let encode = |t: &str| if t == "bad" { Err(t.to_string()) } else { Ok(vec![1]) };
        let result = remembered.encode(["a", "bad", "c"].into_iter(), encode, &mut ids);
        assert_eq!(result, Err("bad".to_string()));
        assert_eq!(remembered.len(), 1);
    }
}

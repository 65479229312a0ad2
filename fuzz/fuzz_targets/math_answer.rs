//! The math answer parser and grader on any completion and gold answer: the score is 0 or 1, and an
//! extracted answer is equivalent to itself unless it normalises to nothing.
#![no_main]

use kart_core::reward::math::{extract_answer, is_equivalent, normalize, score};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, &str)| {
    let (completion, gold) = input;
    let score = score(completion, gold);
    assert!(score == 0.0 || score == 1.0);
    if let Some(answer) = extract_answer(completion) {
        assert!(normalize(&answer).is_empty() || is_equivalent(&answer, &answer), "{answer:?}");
    }
});

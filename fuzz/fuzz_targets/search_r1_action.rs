//! Search-R1's turn cut and action parser on any model turn: the cut is a prefix of the turn, an
//! action's content comes from the cut turn, and only an answer ends the episode.
#![no_main]

use kart_core::agent::search_r1::{Action, execute, parse_action, postprocess};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|turn: &str| {
    let cut = postprocess(turn);
    assert!(turn.starts_with(cut));
    let action = parse_action(cut);
    if let Some(action) = &action {
        assert!(cut.contains(action.content()));
    }
    let step = execute(action.as_ref(), turn);
    assert_eq!(step.done, matches!(action, Some(Action::Answer(_))));
});

//! The TIR state machine on any sequence of generated pieces and finish reasons, with calculator
//! calls evaluated and Python calls echoed: it never panics, and the call counters stay consistent.
#![no_main]

use arbitrary::Arbitrary;
use kart_core::agent::tir::{FinishReason, Step, TirConfig, TirEpisode, Tool, ToolCall, ToolOutcome};
use kart_tools::calculator::calculate;
use libfuzzer_sys::fuzz_target;

/// [`FinishReason`], generated.
#[derive(Debug, Arbitrary)]
enum Finish {
    Eos,
    Stop,
    Length,
}

fuzz_target!(|pieces: Vec<(String, Finish)>| {
    let mut episode =
        TirEpisode::new(&TirConfig { tools: vec![Tool::Python, Tool::Calculator], max_turns: 4 });
    for (text, finish) in &pieces {
        let finish = match finish {
            Finish::Eos => FinishReason::Eos,
            Finish::Stop => FinishReason::Stop,
            Finish::Length => FinishReason::Length,
        };
        let outcome = match episode.consume_generation(text, finish) {
            Step::Done => break,
            Step::Generate | Step::Observe(_) => continue,
            Step::Execute(ToolCall::Calculator { expression }) => calculate(&expression),
            Step::Execute(ToolCall::Python { code }) => {
                assert!(!code.is_empty());
                ToolOutcome::Python { stdout: code, report: "Done".to_owned() }
            }
        };
        episode.record_tool_result(&outcome);
    }
    assert!(episode.tool_successes() <= episode.tool_calls());
});

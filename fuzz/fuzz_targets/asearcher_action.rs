//! ASearcher's action extraction on any model turn, and the same text read back as a web page in
//! small chunks (character boundaries): every action and argument is text of the turn, and the
//! agent is finished exactly when the turn answers.
#![no_main]

use kart_core::agent::asearcher::{AgentConfig, SearchAgent, Tag, ToolResponse};
use libfuzzer_sys::fuzz_target;
use std::num::NonZeroUsize;

fuzz_target!(|turn: &str| {
    let config =
        AgentConfig { page_chunk_chars: NonZeroUsize::new(7).expect("non-zero"), ..AgentConfig::default() };
    let mut agent = SearchAgent::new("Question: ", config);
    let calls = agent.consume_llm_response(turn);
    for call in &calls {
        assert!(turn.contains(&call.action()));
        assert!(call.content.contains(call.argument()));
    }
    assert_eq!(agent.is_finished(), calls.iter().any(|call| call.tag == Tag::Answer));
    agent.answer();
    agent
        .consume_tool_response(&ToolResponse::Access { page: Some(turn.to_owned()) })
        .expect("10 chunks fit");
    while agent.pending_jobs() > 0 {
        agent.prepare_llm_query();
    }
});

//! The tools agents call, run on behalf of the environments: pure evaluators and the clients and
//! sandboxes that do I/O. The protocols that decide when a tool runs and how its result reads to
//! the model live in [`kart_core::agent`]; the tools' contracts in [`kart_core::tool`].
//!
//! - [`batched_search`]: concurrent searches coalesced into batched requests;
//! - [`calculator`]: tool-integrated reasoning's arithmetic evaluator (pure, no `eval`);
//! - [`functions`]: named functions for tool-calling models: the built-in tools, HTTP endpoints
//!   and MCP servers' tools;
//! - [`post`]: retried JSON `POST`s to the services functions and rewards rely on;
//! - [`python`]: tool-integrated reasoning's Python executor, a sandboxed child process per call;
//! - [`search`]: search and page access through a retriever over HTTP, and a cache in front of
//!   any search tool (a local index searched in process is `kart-retriever`'s).

pub mod batched_search;
pub mod calculator;
pub mod functions;
pub mod post;
pub mod python;
pub mod search;

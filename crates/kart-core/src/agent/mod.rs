//! Agent protocols: what the model is prompted with, how its output is cut and parsed, what the
//! environment answers, and when an episode ends. Pure functions, no I/O.

pub mod asearcher;
pub mod function_calls;
pub mod search_r1;
pub mod tir;
pub mod trajectory;

//! Rule-based rewards with the exact semantics of the upstream reference code.

pub mod asearcher;
pub mod math;
pub mod normalize;
pub mod search_r1;

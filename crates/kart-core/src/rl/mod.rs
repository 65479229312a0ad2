//! RL math on plain slices: advantage estimators, KL estimators, loss aggregation and the reference
//! policy and value losses that the trainer's tensor versions are checked against.

pub mod advantage;
pub mod gae;
pub mod kl;
pub mod loss;

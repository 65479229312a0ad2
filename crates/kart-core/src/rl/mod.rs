//! RL math on plain slices: advantage estimators, KL estimators and the KL controller of the
//! reward, loss aggregation and the reference
//! policy and value losses that the trainer's tensor versions are checked against.

pub mod advantage;
pub mod gae;
pub mod kl;
pub mod kl_ctrl;
pub mod loss;

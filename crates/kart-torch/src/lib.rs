//! What kart uses of the installed PyTorch beyond tch's tensors and modules.
//!
//! - [`runtime`]: what the loaded libtorch offers (version, CUDA support, devices, NCCL, Gloo),
//!   for `kart doctor`.
//! - [`device`]: the device a component runs on, chosen from its config and logged.
//! - [`ranks`]: this process's place in a distributed run, from torchrun's variables.
//! - [`grad`]: dropping a tensor's gradient, which tch can only zero;
//! - [`memory`]: the peak memory of a CUDA device's tensors;
//! - [`group`]: c10d process groups over a `TCPStore` rendezvous, and the collectives training
//!   needs (all-reduce, broadcast, all-gather, reduce-scatter, barrier), with timeouts;
//! - [`nccl`]: a bare NCCL communicator opened as vLLM's weight-transfer engine opens one;
//! - [`onednn`]: oneDNN's CPU linear layer over weights reordered once, for generation.
//!
//! The C++ side is a small shim in `shim/`, compiled against the headers and libraries of the
//! torch that torch-sys links; c10d errors come back as Rust errors, never as an abort.

pub mod device;
mod ffi;
pub mod grad;
pub mod group;
pub mod memory;
pub mod nccl;
pub mod onednn;
pub mod ranks;
pub mod runtime;

pub use device::{DeviceError, auto, choose};
pub use group::{Backend, DistError, ProcessGroup, ReduceOp, ServedStore, Work};
pub use nccl::NcclCommunicator;
pub use ranks::{Ranks, RanksError};
pub use runtime::Runtime;

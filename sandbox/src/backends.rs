//! The backends inside `kiln-worker`: each one's compile step and its mechanics of the
//! evaluation contract ([`crate::contract::Target`]).
//!
//! - [`host`]: C on the CPU (the system compiler; candidate code in runner processes);
//! - [`cuda`]: CUDA C on the worker's GPU (NVRTC; kernels through `kiln-gpu`);
//! - [`limits`]: which resource limit ended a compile, for both.

pub mod cuda;
pub mod host;
pub mod limits;

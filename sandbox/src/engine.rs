//! The evaluation engine: kiln's trusted code inside `kiln-worker` that compiles, runs,
//! checks and times candidates. It is the worker's side of each backend (kilnd's side is
//! `kiln_daemon::backends`); candidate code runs beside it, in the same jail.
//!
//! - [`contract`]: the evaluation contract, once for every backend, over a small
//!   [`contract::Target`] trait (trials, inputs from the secret seed, comparison, timing,
//!   the verdict);
//! - [`host`]: C on the CPU (the system compiler; candidate code in runner processes);
//! - [`cuda`]: CUDA C on the worker's GPU (NVRTC; kernels through `kiln-gpu`);
//! - [`triton`]: Triton's Python, compiled by Triton in the compile jail, then run by
//!   [`cuda`] as plain CUDA launches of its CUBINs;
//! - [`hosted`]: KernelBench `ModelNew` files run as written by a jailed python runner
//!   (trust mode `hosted`), checked and timed from the worker's side;
//! - [`limits`]: which resource limit ended a compile, for all of them.

pub mod build_claim;
pub mod contract;
pub mod cuda;
pub mod host;
pub mod hosted;
pub mod limits;
pub mod triton;

/// A fresh compile's info: the wall time since `started` and the compiler's log.
pub(crate) fn compile_info(started: std::time::Instant, log: String) -> kiln_types::CompileInfo {
    kiln_types::CompileInfo {
        duration_ms: started.elapsed().as_secs_f64() * 1e3,
        log,
        cached: false,
        kernels: Vec::new(),
    }
}

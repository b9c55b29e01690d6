//! The cuda backend: CUDA C candidates compiled by NVRTC and run on the worker's GPU, under
//! the same evaluation contract as every backend ([`crate::contract`]).
//!
//! - [`compile`]: NVRTC inside the jailed worker's compile role; the artifact is the CUBIN
//!   (or PTX) image itself;
//! - [`target`]: [`target::GpuTarget`], the contract's mechanics on one GPU: inputs drawn on
//!   the GPU from the secret seed, reference outputs downloaded and scrubbed before
//!   candidate code runs, poisoned outputs, keyed GPU-side input hashes, L2-cold timed
//!   samples, faults and timeouts;
//! - [`telemetry`]: NVML around the timing window, and which samples ran throttled;
//! - [`setup`]: what a GPU worker's jail must show (device nodes, driver libraries) and
//!   whether the backend is usable here.
//!
//! Per-kernel resources (registers, shared and local memory, max threads, occupancy for
//! the launch's block) need the module loaded on a GPU, so they are filled at evaluation
//! time, into `Evaluation.compile.kernels` and `Evaluation.telemetry.kernels`.
//!
//! After a fault or timeout the CUDA context is poisoned: the worker answers with the
//! verdict and exits; the next evaluation gets a fresh worker (each job has its own).

pub mod compile;
pub mod setup;
pub mod target;
pub mod telemetry;

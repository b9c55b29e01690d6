//! The cuda backend: CUDA C candidates compiled by NVRTC and run on the worker's GPU, under
//! the same evaluation contract as every backend ([`crate::engine::contract`]).
//!
//! - [`compile`]: NVRTC inside the jailed worker's compile role (`kiln_gpu::cxx`: toolkit
//!   headers, stand-ins, kernels by C++ name); the artifact is the image with its kernel
//!   manifest (`kiln_gpu::artifact`);
//! - [`context`]: [`context::GpuContext`], the CUDA context and NVML a GPU worker keeps
//!   between evaluations;
//! - [`workspace`]: [`workspace::GpuWorkspace`], one evaluation's memory on the GPU and its
//!   reference, for every target that runs candidate code there: inputs drawn on the GPU
//!   from the secret seed, keyed GPU-side input hashes, poisoned outputs, guards after
//!   every buffer, kept copies, the reference run and scrubbed before candidate code runs
//!   again;
//! - [`target`]: [`target::GpuTarget`], the contract's mechanics for a candidate kiln
//!   launches (CUDA C, lowered Triton): its module and checked plan, L2-cold timed samples,
//!   faults and timeouts (a hosted file's target is `engine::hosted::gpu_target`);
//! - [`baseline`]: the reference, cuBLAS and cuDNN timed as baselines under the same protocol;
//! - [`telemetry`]: NVML around the timing window, and which samples ran throttled;
//! - [`timer_log`]: which figure of each timed sample is the time (CUPTI kernel span or
//!   sum, or events), the fallback to events, and the timing evidence of every figure;
//! - [`printf`]: device `printf` captured off the protocol pipe, counted and bounded;
//! - [`setup`]: what a GPU worker's jail must show (device nodes, driver libraries) and
//!   whether the backend is usable here;
//! - [`launcher`]: `kiln-worker launch`, a problem's own seed or reference kernel run on
//!   its own for an external profiler (`kiln bench agreement` runs it under Nsight Compute);
//! - [`launch_timing`]: `kiln-worker launch --time`, the same runs timed by kiln's own
//!   samples (the bench's timer-floor calibration);
//! - [`toolkit`]: where the CUDA toolkit's headers are, bound into the compile jail;
//! - [`pch`]: NVRTC precompiled headers of candidates' include prefixes — who builds
//!   them, where they live, which compiles start from them.
//!
//! Per-kernel resources (registers, shared and local memory, max threads, occupancy for
//! the launch's block) need the module loaded on a GPU, so they are filled at evaluation
//! time, into `Evaluation.compile.kernels` and `Evaluation.telemetry.kernels`.
//!
//! A GPU worker is warm: it keeps its context from one evaluation to the next
//! ([`context::GpuContext`]). After a fault or timeout the context is poisoned: the worker
//! answers with the verdict and `retire: true`, and exits; its caller
//! ([`crate::WarmWorker`]) starts a fresh worker.

pub mod baseline;
pub mod compile;
pub mod context;
pub mod launch_timing;
pub mod launcher;
pub mod pch;
pub mod printf;
pub mod setup;
pub mod target;
pub mod telemetry;
pub mod timer_log;
pub mod toolkit;
pub mod workspace;

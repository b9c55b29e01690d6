//! kiln's sandbox: the jail that isolates untrusted code, and the machinery of
//! `kiln-worker`, which compiles, runs, checks and times candidates.
//!
//! # Brief overview
//!
//! - [`compile`], [`evaluate`], [`probe_layers`], [`backend_status`]: the blocking API
//!   kilnd calls (wrap it in `spawn_blocking`). Each call starts a fresh jailed
//!   `kiln-worker` ([`SandboxConfig::worker_exe`], see [`default_worker_exe`]).
//! - [`WarmWorker`]: one GPU's warm jailed worker, reused from one evaluation to the next
//!   and replaced after a fault, a timeout or a number of evaluations. What it shares with
//!   the one-shot calls (job directory, jail spec, request, wall budget) is in
//!   `jailed_worker`.
//! - [`measure_baselines`]: every baseline kind through one path ([`baselines`]): the
//!   reference, cuBLAS, cuDNN in a jailed GPU worker, torch eager and `torch.compile` in
//!   kiln's trusted torch runner (crate `kiln_torch_runner`).
//! - [`jail`]: start a command isolated from the host (namespaces, private root, rlimits,
//!   cgroup, `no_new_privs`, seccomp, parent-death signal, tree kill on a deadline).
//! - [`protocol`]: the messages between caller and worker (framed by `kiln_protocol`).
//! - [`engine`]: the evaluation engine inside `kiln-worker`: the contract
//!   ([`engine::contract`]: what it checks and in what order, generic over a backend, with
//!   the backend-neutral input data and comparison code) and each backend's worker side,
//!   [`engine::host`] (C on the CPU), [`engine::cuda`] (NVRTC, kernels on the worker's GPU
//!   through `kiln-gpu`) and [`engine::triton`] (Triton's compiler in the compile jail; its
//!   CUBINs then run on the cuda engine).
//! - [`worker`]: `kiln-worker serve`, which dispatches each request to a backend.
//! - [`plugin_host`]: one search's `kiln-plugin-host`, started in the jail.
//!
//! Errors ([`SandboxError`]) are infrastructure failures only; anything a candidate does
//! ends as a verdict inside an [`kiln_types::Evaluation`].
//!
//! Trust zones (docs/security.md): the caller is trusted; `kiln-worker serve` is trusted
//! code handling hostile data; a runner is hostile from the instruction that loads the
//! candidate's artifact.
//!
//! ```no_run
//! use kiln_sandbox::{SandboxConfig, compile};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = SandboxConfig::new("/var/lib/kiln/scratch");
//! let problem = kiln_types::ProblemSpec::load_dir("problems/vecadd-4096".as_ref())?;
//! let candidate: kiln_types::Candidate = serde_json::from_str(r#"{"problem":"vecadd-4096",
//!     "language":"c","source":"void f(const float*a,float*y,int n){}",
//!     "launches":[{"kernel":"f","args":["a","y",{"i32":4096}]}]}"#)?;
//! let outcome = compile(&cfg, &problem, &candidate)?;
//! assert!(outcome.artifact.is_some() || outcome.failure.is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }
//! ```
#![deny(missing_docs)]

mod api;
pub mod baselines;
mod config;
pub mod engine;
mod error;
pub mod jail;
mod jailed_worker;
pub mod plugin_host;
pub mod protocol;
mod warm_worker;
pub mod worker;

pub use api::{
    BackendStatus, CompileOutcome, backend_status, compile, evaluate, evaluate_with, probe_layers,
};
pub use baselines::{TorchSource, measure_baselines};
pub use config::{SandboxConfig, default_worker_exe, which_cc};
pub use error::SandboxError;
pub use jail::{JailReport, LayerStatus};
/// The GPU mechanics crate, for callers that need its types (clock policy, facts).
pub use kiln_gpu;

/// A content hash of this build's compile path (the backends' compile code, kiln-gpu's
/// NVRTC recipe, stand-in headers and artifact format), computed by `build.rs`: part of
/// the compile cache's key, so a cached artifact is never served to a kiln whose compile
/// path differs.
pub const COMPILE_BUILD: &str = env!("KILN_COMPILE_BUILD");
pub use warm_worker::{WarmWorker, WarmWorkerStats};

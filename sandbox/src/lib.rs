//! kiln's sandbox: the jail that isolates untrusted code, and the machinery of
//! `kiln-worker`, which compiles, runs, checks and times candidates.
//!
//! # Brief overview
//!
//! - [`compile`], [`evaluate`], [`probe_layers`], [`backend_status`]: the blocking API
//!   kilnd calls (wrap it in `spawn_blocking`). Each call starts a fresh jailed
//!   `kiln-worker` ([`SandboxConfig::worker_exe`], see [`default_worker_exe`]).
//! - [`GpuLane`]: one GPU's warm jailed worker, reused from one evaluation to the next and
//!   replaced after a fault, a timeout or a number of evaluations.
//! - [`measure_baselines`] (the reference, cuBLAS, cuDNN in a jailed GPU worker) and
//!   [`torch_baseline`] (torch eager in kiln's trusted helper): library baselines.
//! - [`jail`]: start a command isolated from the host (namespaces, private root, rlimits,
//!   cgroup, `no_new_privs`, seccomp, parent-death signal, tree kill on a deadline).
//! - [`protocol`]: the framed messages between caller and worker.
//! - [`contract`]: the evaluation contract (design guide §5), generic over a backend.
//! - [`host`]: the host backend (C on the CPU).
//! - [`cuda`]: the cuda backend (NVRTC, kernels on the worker's GPU through `kiln-cuda`).
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
//! let candidate: kiln_types::Candidate = serde_json::from_str(r#"{"problem":"vecadd-4096",
//!     "language":"c","source":"void f(const float*a,float*y,int n){}",
//!     "launches":[{"kernel":"f","args":["a","y",{"i32":4096}]}]}"#)?;
//! let outcome = compile(&cfg, &candidate)?;
//! assert!(outcome.artifact.is_some() || outcome.failure.is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }
//! ```
#![deny(missing_docs)]

mod api;
pub mod baselines;
pub mod contract;
pub mod cuda;
mod error;
pub mod host;
pub mod jail;
mod lane;
pub mod plugin_host;
pub mod protocol;
pub mod torch_baseline;
pub mod worker;

pub use api::{
    BackendStatus, CompileOutcome, SandboxConfig, backend_status, compile, default_worker_exe,
    evaluate, probe_layers,
};
pub use baselines::measure_baselines;
pub use error::SandboxError;
pub use jail::{JailReport, LayerStatus};
/// The GPU mechanics crate, for callers that need its types (clock policy, facts).
pub use kiln_cuda;
pub use lane::{GpuLane, LaneStats};
pub use torch_baseline::{TorchHelper, torch_baseline};

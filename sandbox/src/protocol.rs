//! The worker protocol: the messages between the caller (kilnd, through this crate's API) and
//! `kiln-worker`, and between a jailed process and whoever spawned it.
//!
//! # Protocol
//!
//! Every message is framed by [`kiln_protocol`] (a JSON envelope, then raw blobs; its one
//! spec is `sandbox/protocol/framing.json`); its items are re-exported here. This module
//! holds what the worker's messages say.
//!
//! The conversation on a jailed worker's stdin (requests) and stdout (responses):
//!
//! ```text
//! jail helper  -> caller : JailReport          (first frame on stdout, always; see jail)
//! caller       -> worker : Request::Compile    (0 blobs)
//! worker       -> caller : Response::Compiled  (1 blob: the artifact, when ok; else 0)
//!   or
//! caller       -> worker : Request::BuildPch   (0 blobs; cuda: a precompiled header)
//! worker       -> caller : Response::PchBuilt  (0 blobs; the header is in the scratch dir)
//!   or
//! caller       -> worker : Request::Evaluate   (2 blobs: reference artifact, candidate artifact)
//!   zero or more times, for a torch reference (host and cuda), between candidate runs:
//!   worker     -> caller : Response::Reference         (blobs: one input set)
//!   caller     -> worker : Request::ReferenceOutputs   (blobs: the reference's outputs)
//!   or, on a GPU worker whose stdout is a socket (the warm worker's is):
//!   worker     -> caller : Response::ReferenceShared   (then SCM_RIGHTS: one fd per tensor)
//!   caller     -> worker : Request::ReferenceOutputs   (no blobs: written in place)
//! worker       -> caller : Response::Evaluated (0 blobs)
//!   or
//! caller       -> worker : Request::Baselines  (1 blob: reference artifact)
//! worker       -> caller : Response::Baselines (0 blobs)
//!   at any point
//! worker       -> caller : Response::Failed    (infrastructure failure inside the worker)
//! ```
//!
//! A compile, a precompiled-header build, a host evaluation and a baselines request each
//! get a fresh jail and one request; a baselines worker then exits, the others exit when
//! the caller closes stdin.
//! A GPU worker is warm ([`crate::WarmWorker`]): it answers one evaluate request after
//! another until stdin closes, or until it answers `retire: true` (a fault or timeout
//! poisoned its CUDA context) and exits. The worker's stderr carries its tracing log and
//! is not part of the protocol. Every backend (host and cuda) speaks these same messages;
//! the candidate's `language` picks the backend inside the worker.
//!
//! Candidate code never writes to these pipes. Host candidates run in a separate runner
//! process (see `engine::host::runner`), whose own pipes carry single bytes (`G`o /
//! `D`one) plus one JSON setup frame and one JSON ready frame, in the same framing. A GPU
//! worker's device `printf` lands on its fd 1, so the protocol moves to a duplicate
//! descriptor first (see `engine::cuda::printf`).

use std::path::PathBuf;

use kiln_types::{Candidate, CompileInfo, EvalPlan, Evaluation, ProblemSpec};
use serde::{Deserialize, Serialize};

pub use kiln_protocol::{
    Envelope, MAX_BLOBS, MAX_FRAME, MAX_FRAMES_PER_BLOB, MAX_MESSAGE_BYTES, ProtocolError,
    read_frame, read_message, read_message_within, write_frame, write_message,
};

/// Version of the worker protocol; the worker refuses a request for another version.
pub const PROTOCOL_VERSION: u32 = 1;

/// The most blob bytes a message of the torch reference exchange of `problem` may carry:
/// its tensors of `role` (inputs: the worker's `Response::Reference`; outputs: the
/// answer), and never less than [`MAX_MESSAGE_BYTES`].
pub fn reference_bound(problem: &ProblemSpec, role: kiln_types::Role) -> u64 {
    let tensors: u64 = problem
        .tensors
        .iter()
        .filter(|t| t.role == role)
        .map(|t| t.bytes())
        .sum();
    tensors.max(MAX_MESSAGE_BYTES)
}

/// One tensor of a [`Response::ReferenceShared`]: which it is and how much memory its
/// descriptor maps (the tensor's bytes first, then the worker's guard and rounding).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedTensor {
    /// The tensor's name in the problem.
    pub name: String,
    /// Bytes of the allocation (what the importer maps).
    pub mapped: u64,
}

/// Limits a run of candidate code is held to, chosen by the caller.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunLimits {
    /// Address-space limit of a runner, bytes.
    pub memory_limit_bytes: u64,
    /// Bytes a runner may print (stdout + stderr) in one evaluation before it is stopped.
    pub output_limit_bytes: u64,
    /// CPU seconds a runner may use in its whole life.
    pub cpu_limit_s: u64,
}

/// A request from the caller to the worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Compile a candidate; no blobs.
    Compile {
        /// Protocol version the caller speaks.
        version: u32,
        /// The candidate.
        candidate: Candidate,
        /// The C compiler, as a path valid inside the jail.
        cc: PathBuf,
        /// Wall-clock limit for the compiler, milliseconds.
        timeout_ms: u64,
        /// GPU architecture for cuda compiles (`sm_90`); ignored by the host backend.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arch: Option<String>,
        /// The CUDA toolkit's include folders as the worker sees them (cuda only).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        include_dirs: Vec<PathBuf>,
        /// For a Triton candidate: the python, Triton version and compile plan.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        triton: Option<crate::engine::triton::compile::TritonJob>,
        /// For a hosted file that calls `load_inline`: the python and the architecture its
        /// libraries are built for (`engine::hosted::build`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hosted: Option<crate::engine::hosted::build::HostedBuild>,
        /// For a cuda candidate: the precompiled header of its include prefix, as the
        /// worker sees it (read-only), to start the compile from (`engine::cuda::pch`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pch: Option<PathBuf>,
    },
    /// Build the precompiled header of an include prefix (cuda only; no blobs): the
    /// prefix's includes, re-spelled by kiln, compiled with the options a candidate with
    /// that prefix, these flags and these implied headers gets, plus `--create-pch=out`.
    /// Nothing of a candidate's source is sent.
    BuildPch {
        /// Protocol version the caller speaks.
        version: u32,
        /// The prefix (names checked again by the worker).
        prefix: kiln_gpu::cxx::pch::Prefix,
        /// kiln's target architecture (`sm_90`).
        arch: String,
        /// The candidate's flags (allow-listed again by the worker).
        flags: Vec<String>,
        /// The CUDA toolkit's include folders as the worker sees them.
        include_dirs: Vec<PathBuf>,
        /// The headers the candidate's compile pre-includes because it uses their names.
        implied: Vec<String>,
        /// Where the worker writes the header (in its scratch directory).
        out: PathBuf,
    },
    /// Evaluate a compiled candidate; blobs: reference artifact, candidate artifact.
    Evaluate {
        /// Protocol version the caller speaks.
        version: u32,
        /// The problem.
        problem: Box<ProblemSpec>,
        /// The candidate.
        candidate: Candidate,
        /// How to evaluate.
        plan: EvalPlan,
        /// Limits for the runners.
        limits: RunLimits,
        /// A hosted candidate's python and import limit (`engine::hosted`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hosted: Option<crate::engine::hosted::setup::HostedJob>,
    },
    /// Time the problem's baselines on the worker's GPU (cuda only); blob: the compiled
    /// reference. See `engine::cuda::baseline`.
    Baselines {
        /// Protocol version the caller speaks.
        version: u32,
        /// The problem.
        problem: Box<ProblemSpec>,
        /// Seed, run timeout and the stop rule (the candidates' own).
        plan: EvalPlan,
        /// Kinds to time besides the reference (those the GPU worker runs).
        kinds: Vec<kiln_types::baseline::BaselineKind>,
    },
    /// The answer to `Response::Reference`: blobs are the torch reference's output
    /// tensors (problem order), or none with `error` set.
    ReferenceOutputs {
        /// Protocol version the caller speaks.
        version: u32,
        /// How the reference computed (`float64`, or the declared dtypes and why).
        #[serde(default)]
        precision: String,
        /// Why there are no outputs (kiln's failure, not the candidate's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

/// A response from the worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    /// The compile finished; one blob (the artifact) when `ok`.
    Compiled {
        /// True if and only if an artifact follows.
        ok: bool,
        /// Duration and log.
        info: CompileInfo,
        /// Why it failed, for people (empty when ok).
        message: String,
        /// The failure's verdict when it is not `compile_error` (a Triton launch plan that
        /// does not fit its jit function: `invalid_launch`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verdict: Option<kiln_types::Verdict>,
        /// Whether NVRTC used the precompiled header the request named (none named: `None`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pch: Option<kiln_gpu::cxx::pch::Outcome>,
    },
    /// The answer to `Request::BuildPch`.
    PchBuilt {
        /// True if and only if the header was written to the request's `out`.
        ok: bool,
        /// Its size, bytes (0 when not ok).
        bytes: u64,
        /// Wall time of the build, milliseconds.
        duration_ms: f64,
        /// Why not, when not ok.
        message: String,
    },
    /// The evaluation finished with a verdict.
    Evaluated {
        /// The evaluation.
        evaluation: Box<Evaluation>,
        /// True when the worker exits after this answer (its GPU context was poisoned by a
        /// fault or timeout): the caller must start a fresh worker for the next request.
        #[serde(default)]
        retire: bool,
    },
    /// The worker could not do its job for a reason that is not the candidate's fault.
    Failed {
        /// What went wrong.
        message: String,
    },
    /// Mid-evaluation, between candidate runs: the worker asks its caller for the torch
    /// reference's outputs on the input set in the blobs (problem input order); the caller
    /// answers `Request::ReferenceOutputs`.
    Reference,
    /// Mid-evaluation, between candidate runs, on a GPU worker whose protocol stream is a
    /// socket: the input set is already in the listed tensors, in device memory the worker
    /// shares; one descriptor per tensor (listed order) follows as `SCM_RIGHTS`
    /// (`kiln_protocol::fds`). The caller's torch runner maps them, writes the outputs in
    /// place and unmaps them; the caller answers `Request::ReferenceOutputs` with no blobs.
    ReferenceShared {
        /// The problem's tensors, inputs then outputs, each in problem order; with
        /// `inputs_seed`, only the inputs whose init is `get_inputs`.
        tensors: Vec<SharedTensor>,
        /// Set when the runner is to write the problem's own inputs (what its file's
        /// `get_inputs()` returns, torch seeded with this input set's secret seed) instead
        /// of computing the reference.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inputs_seed: Option<u64>,
    },
    /// The baselines were timed (each says whether it was measured).
    Baselines {
        /// One entry per baseline, the reference first.
        results: Vec<kiln_types::BaselineResult>,
    },
}

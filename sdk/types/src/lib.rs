//! Wire types shared by every part of kiln.
//!
//! kilnd, the `kiln` CLI, `kiln-worker` and the plugin SDK (`kiln-sdk`) all speak in these
//! types, so a candidate or a verdict means the same thing wherever it travels.
//!
//! - [`backend`]: the backends (`host`, `cuda`) by name.
//! - [`candidate`]: what a proposer submits — device code plus a declarative launch list.
//! - [`problem`]: a problem's spec as read from `problem.toml`, with its sources inlined.
//! - [`verdict`]: the verdicts of the evaluation contract, their evidence and timing statistics.
//! - [`baseline`]: library baselines named by a problem, and their measured times.
//! - [`kernelbench`]: KernelBench-format files, as described by kiln's torch runner,
//!   written as problem folders.
//! - [`eval_plan`]: how an evaluation is run (trials, stop rule, secret seed).
//! - [`lift`]: what lifting a hosted `ModelNew` file into a contract candidate came to.
//! - [`names`]: the names people and plugins choose (problems, proposers).
//! - [`summary`]: the summary document of the bundled search strategies (rounds, grid).
//! - [`triton`]: what a Triton candidate's module may hold, as one rules file.
//!
//! Every type that is read from untrusted input denies unknown fields, so a typo is a
//! `400` naming the field rather than a silently ignored setting; the exception is the
//! summary document, which is only displayed and is read leniently.
#![deny(missing_docs)]

pub mod backend;
pub mod baseline;
pub mod candidate;
pub mod eval_plan;
pub mod kernelbench;
pub mod lift;
pub mod memory;
pub mod names;
pub mod plugin;
pub mod problem;
pub mod summary;
pub mod triton;
pub mod verdict;

pub use backend::{BackendKind, UnknownBackend};
pub use baseline::{BaselineOp, BaselineResult, BaselineStatus};
pub use candidate::{
    Arg, Candidate, CandidateError, Language, Launch, ScratchBuffer, TrustMode, defines_model_new,
};
pub use eval_plan::{
    EvalPlan, JobOptions, RaceAgainst, RaceBound, RaceTarget, ThrottlePolicy, TimingFigure,
    TimingPlan,
};
pub use problem::{
    Dtype, ForwardConstant, Init, KernelSource, ProblemError, ProblemSpec, References, Role,
    Roofline, TensorSpec, Tolerance, TorchPrecision, TorchReference,
};
pub use verdict::{
    CompileInfo, ErrorMetrics, Evaluation, Evidence, FigureSummary, MAX_KEPT_SAMPLES,
    PrecisionTier, TimerEvidence, TimingStats, Verdict, kept_samples, t95,
};

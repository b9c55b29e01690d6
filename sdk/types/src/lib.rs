//! Wire types shared by every part of kiln.
//!
//! kilnd, the `kiln` CLI, `kiln-worker` and the plugin SDK (`kiln-sdk`) all speak in these
//! types, so a candidate or a verdict means the same thing wherever it travels.
//!
//! - [`candidate`]: what a proposer submits — device code plus a declarative launch list.
//! - [`problem`]: a problem's spec as read from `problem.toml`, with its sources inlined.
//! - [`verdict`]: the verdicts of the evaluation contract, their evidence and timing statistics.
//! - [`baseline`]: library baselines named by a problem, and their measured times.
//! - [`eval_plan`]: how an evaluation is run (trials, stop rule, secret seed).
//! - [`names`]: the names people and plugins choose (problems, proposers).
//!
//! Every type that is read from untrusted input denies unknown fields, so a typo is a
//! `400` naming the field rather than a silently ignored setting.
#![deny(missing_docs)]

pub mod baseline;
pub mod candidate;
pub mod eval_plan;
pub mod names;
pub mod plugin;
pub mod problem;
pub mod verdict;

pub use baseline::{BaselineOp, BaselineResult, BaselineStatus};
pub use candidate::{Arg, Candidate, CandidateError, Language, Launch, ScratchBuffer};
pub use eval_plan::{
    EvalPlan, JobOptions, RaceAgainst, RaceBound, RaceTarget, ThrottlePolicy, TimingFigure,
    TimingPlan,
};
pub use problem::{
    Dtype, Init, KernelSource, ProblemError, ProblemSpec, Role, Roofline, TensorSpec, Tolerance,
};
pub use verdict::{
    CompileInfo, ErrorMetrics, Evaluation, Evidence, FigureSummary, PrecisionTier, TimerEvidence,
    TimingStats, Verdict, t95,
};

//! The Rust guest SDK for kiln proposers.
//!
//! A proposer is a search strategy that runs inside kiln's plugin host as a WebAssembly
//! component (`wasm32-wasip2`). It reads the problem and its seed kernel, submits
//! candidate kernels, waits for their evaluations and returns the best one. This crate
//! wraps the `kiln:proposer@0.1.0` WIT world (`sdk/wit/since_v0.1.0/`) in typed Rust.
//!
//! # Brief overview
//!
//! - [`Proposer`] and [`export_proposer!`]: implement `run`, export it; the macro also
//!   writes the `kiln:abi-version` custom section the host checks before loading.
//! - [`evaluator`]: [`problem`], [`submit`], [`wait`], [`wait_all`], [`archive`].
//! - [`CandidateBuilder`]: derive a candidate from the seed (new source, note, parent).
//! - [`llm`]: chat completions through kilnd's gateway.
//! - [`plugin_host`]: logging ([`info!`] and friends), monotonic time, the seeded [`Rng`],
//!   [`checkpoint`] / [`restore`], [`budget`].
//! - [`knobs`]: the `// @knob` / `// @idea` annotation parser and rewriter for seed kernels.
//! - [`stats`]: median, mean, confidence intervals, and whether two timings differ.
//! - [`search`]: pieces the bundled strategies share: offline/LLM mode, a batch
//!   ledger, the acceptance rule, idea families, prompt evidence, reply parsing.
//!
//! [`knobs`] and [`stats`] are pure Rust and work on any target; the rest calls the host
//! and works only inside the plugin host (on other targets the imports are stubs that
//! panic).
//!
//! # A minimal proposer
//!
//! ```no_run
//! use kiln_sdk::{knobs, CandidateBuilder, Proposer, Summary};
//! use std::time::Duration;
//!
//! struct FirstKnob;
//!
//! impl Proposer for FirstKnob {
//!     fn run(_config: &str) -> Result<Summary, String> {
//!         let problem = kiln_sdk::problem().map_err(|e| e.to_string())?;
//!         let seed = problem.seed.ok_or("the problem has no seed kernel")?;
//!         let notes = knobs::parse(&seed.source).map_err(|e| e.to_string())?;
//!         let knob = notes.knobs.first().ok_or("the seed has no knob")?;
//!         let mut ids = Vec::new();
//!         for value in &knob.values {
//!             let source = knobs::set(&seed.source, &knob.name, value).map_err(|e| e.to_string())?;
//!             let candidate = CandidateBuilder::from(&seed)
//!                 .source(source)
//!                 .note(format!("{}={value}", knob.name))
//!                 .build()
//!                 .map_err(|e| e.to_string())?;
//!             ids.push(kiln_sdk::submit(&candidate).map_err(|e| e.to_string())?.id);
//!         }
//!         let evals = kiln_sdk::wait_all(&ids, Duration::from_secs(600)).map_err(|e| e.to_string())?;
//!         let best = kiln_sdk::best(&evals);
//!         Ok(Summary::new(best.map(|e| e.candidate_id.clone()), "tried the first knob"))
//!     }
//! }
//!
//! kiln_sdk::export_proposer!(FirstKnob);
//! ```
#![deny(missing_docs)]

// Lets the generated bindings and the exported macros name this crate as `kiln_sdk`
// both inside it and from a plugin crate.
extern crate self as kiln_sdk;

#[doc(hidden)]
pub mod bindings;
mod candidate;
pub mod evaluator;
pub mod knobs;
pub mod llm;
pub mod plugin_host;
mod proposer;
pub mod search;
pub mod stats;

pub use candidate::CandidateBuilder;
pub use evaluator::{
    Baseline, DeviceFacts, Entry, Evaluation, EvaluatorError, Problem, ProblemError, Submission,
    archive, best, problem, submit, wait, wait_all,
};
pub use plugin_host::{
    Budget, HostError, Level, Rng, budget, checkpoint, log, now, random_u64, restore,
};
#[doc(hidden)]
pub use proposer::__run;
pub use proposer::{Proposer, Summary};

/// kiln-types, re-exported so plugins use the same `Candidate`, `ProblemSpec`, `Verdict`...
pub use kiln_types as types;
pub use kiln_types::{Candidate, PrecisionTier, ProblemSpec, Verdict};

/// The ABI version this SDK speaks: `kiln:proposer@0.1.0`.
pub const ABI_VERSION: (u16, u16, u16) = (0, 1, 0);

/// Name of the custom section carrying [`ABI_VERSION`] in a plugin's wasm.
pub const ABI_SECTION: &str = "kiln:abi-version";

/// The contents of the `kiln:abi-version` section: major, minor and patch as
/// big-endian `u16`s.
#[doc(hidden)]
pub const ABI_VERSION_BYTES: [u8; 6] = {
    let (a, b, c) = ABI_VERSION;
    let (a, b, c) = (a.to_be_bytes(), b.to_be_bytes(), c.to_be_bytes());
    [a[0], a[1], b[0], b[1], c[0], c[1]]
};

#[doc(hidden)]
pub use wit_bindgen as __wit_bindgen;

//! Triton candidates: Python with `@triton.jit` functions, compiled ahead of time by
//! Triton's own compiler in the jail's compile role, then run by the cuda backend under the
//! same contract as CUDA C candidates.
//!
//! - [`setup`]: the python that has triton, its version, and what a compile jail must show
//!   for it (found once at start, by kilnd);
//! - [`spec`]: what to compile, worked out by trusted code from the candidate and its
//!   problem (argument types, divisibility hints, constexprs, options);
//! - [`compile`]: inside the jail, kiln's trusted driver script (`driver.py`: the
//!   candidate's Python is filtered before any of it runs) and the checks on its answer;
//! - [`artifact`]: the CUBINs with their manifest, as stored in the compile cache;
//! - [`lower`]: the candidate's launches as plain CUDA launches of the artifact's kernels
//!   (block = 32 × warps, Triton's shared memory, its trailing scratch pointers), which the
//!   cuda backend then runs.

pub mod artifact;
pub mod compile;
pub mod lower;
pub mod setup;
pub mod spec;

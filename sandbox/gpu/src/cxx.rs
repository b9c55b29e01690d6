//! CUDA C++ as people and LLMs write it: what a candidate's source may contain and how it
//! is compiled with NVRTC.
//!
//! - [`lexer`]: logical lines with comments and literals told apart;
//! - [`screen`]: host code refused with a message a model can act on, `#include`s and
//!   reserved macros checked (defence in depth; the compile jail is the boundary);
//! - [`standins`]: kiln's own small headers for the host C/C++ headers NVRTC lacks, and the
//!   prelude (types, limits, math constants);
//! - [`names`]: the kernels a CUBIN holds, demangled, and the name expressions NVRTC could
//!   not resolve;
//! - [`compile`]: [`compile_candidate`], the whole recipe — toolkit include folders, stand-ins,
//!   prelude, `-default-device`, kernels by name expression — ending in an
//!   [`crate::artifact::Artifact`] whose manifest maps each launch name to its symbol;
//!   [`compile_candidate_with_pch`], the same starting from a precompiled header;
//! - [`pch`]: precompiled headers of a candidate's leading `#include`s — the prefix, the
//!   key, the trusted build text, and what NVRTC's log says about them.

pub mod compile;
pub mod lexer;
pub mod names;
pub mod pch;
pub mod screen;
pub mod standins;

pub use compile::{
    CandidateModule, CandidateOptions, CandidateSource, SOURCE_NAME, candidate_options,
    compile_candidate, compile_candidate_with_pch,
};

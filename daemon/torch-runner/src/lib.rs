//! kiln's trusted torch runner, from kilnd's side: the Python beside this crate
//! (`kiln_torch.py`) run as a child process outside every jail.
//!
//! - [`process`]: the process itself ([`TorchRunner`] finds it, [`process::RunnerProcess`]
//!   starts it and makes one framed call at a time with a deadline), and `describe`, which
//!   reads KernelBench files for the importer.
//! - [`reference`]: [`ReferenceRunner`], a lane's warm runner of a problem's PyTorch
//!   reference, which answers a worker's requests for the reference's outputs.
//!
//! Trust: the runner is kiln's code and runs the problem author's PyTorch module (trusted)
//! and kiln's fixed op registry; it never runs candidate code, and candidate code never
//! reaches it (docs/security.md). It speaks kiln's framing ([`kiln_protocol`]).
#![deny(missing_docs)]

pub mod process;
pub mod reference;

pub use process::{SCRIPT_NAME, TorchRunner};
pub use reference::ReferenceRunner;

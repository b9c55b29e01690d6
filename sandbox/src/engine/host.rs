//! The host backend: C candidates compiled by the system compiler and run on the CPU, for
//! machines without a GPU and for CI. Keeps the same evaluation contract as every backend
//! (`crate::engine::contract`).
//!
//! - [`flags`]: the compile-flag allow-list;
//! - [`compile`]: `cc` inside the jail, with a timeout;
//! - [`layout`]: buffers in the shared memfd and the calling convention of launches;
//! - [`runner`]: the process that holds candidate code (hostile);
//! - [`runner_ctl`]: the worker's control of a runner (go, done, stop, read);
//! - [`evaluate`]: the runners behind the generic contract (`crate::engine::contract`, whose
//!   `data` and `compare` draw the inputs and judge the outputs).

pub mod compile;
pub mod evaluate;
pub mod flags;
pub mod layout;
pub mod runner;
pub mod runner_ctl;

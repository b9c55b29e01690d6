//! The host backend: C candidates compiled by the system compiler and run on the CPU, for
//! machines without a GPU and for CI. Keeps the same evaluation contract as every backend
//! (design guide §5).
//!
//! - [`flags`]: the compile-flag allow-list;
//! - [`compile`]: `cc` inside the jail, with a timeout;
//! - [`layout`]: buffers in the shared memfd and the calling convention of launches;
//! - [`data`]: inputs from the secret seed, the poison pattern;
//! - [`compare`]: error metrics and precision tiers;
//! - [`runner`]: the process that holds candidate code (hostile);
//! - [`runner_ctl`]: the worker's control of a runner (go, done, stop, read);
//! - [`evaluate`]: the runners behind the generic contract (`crate::contract`).

pub mod compare;
pub mod compile;
pub mod data;
pub mod evaluate;
pub mod flags;
pub mod layout;
pub mod runner;
pub mod runner_ctl;

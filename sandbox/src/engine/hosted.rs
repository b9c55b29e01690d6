//! Hosted candidates: a KernelBench `ModelNew` file run as written (trust mode `hosted`,
//! docs/security.md). Its python is hostile from its first import, so it runs in a
//! runner process of its own, under the worker's jail plus a filter of its own, and owns
//! nothing that decides: the worker (trusted) draws the inputs and the weights, writes
//! them where the runner reads them, takes the time on its own clock from the command to
//! the runner's answer, stops the runner, and reads and compares the outputs itself.
//!
//! - [`setup`]: the python with torch that runs them, found once by kilnd, and the runner
//!   script (`sandbox/hosted/kiln_hosted.py`) carried inside `kiln-worker`;
//! - [`wrapper`]: `kiln-worker hosted-runner`, which loads the hosted filter and execs
//!   that python (the filter outlives the exec);
//! - [`cpu`]: `modelnew-cpu` on the host backend: the host engine's runner protocol and
//!   shared buffers, with the python runner in place of the C one;
//! - [`gpu`]: `modelnew` on the cuda backend: the GPU engine's shared tensors, mapped by
//!   the runner, and the time of a forward taken on the worker's clock;
//! - [`kernels`]: the kernels a forward launched (the runner's claim), sorted into the
//!   file's own and library ones.

pub mod cpu;
pub mod gpu;
pub mod kernels;
pub mod setup;
pub mod wrapper;

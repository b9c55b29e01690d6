//! kiln's plugin host: runs one proposer (a `wasm32-wasip2` component speaking the
//! `kiln:proposer` WIT world) under fuel, memory and wall-clock limits, and serves its
//! imports from kilnd through a [`bridge::Bridge`].
//!
//! # Brief overview
//!
//! - [`component::run`]: check, compile, link, instantiate, call `run`, classify the end.
//! - [`abi::check`]: the `kiln:abi-version` section, read before anything is compiled.
//! - [`bridge::kilnd::KilndBridge`]: the real bridge, HTTP/1.1 JSON on kilnd's socket;
//!   [`bridge::fake::FakeBridge`]: an in-memory one for tests.
//! - [`protocol`]: the JSON bodies of the host ↔ kilnd protocol (docs/plugins.md).
//! - [`limits::Limits`], [`outcome::Outcome`] (with the exit codes) and
//!   [`outcome::Report`].
//!
//! The binary `kiln-plugin-host` (src/main.rs) wraps [`component::run`] with a CLI, the
//! bearer token, a last-resort wall-clock watchdog and the final report. kilnd starts
//! it as its own jailed process, one per search: nothing a plugin does can reach kilnd
//! except through the bridge's endpoints for its own search.
#![deny(missing_docs)]

pub mod abi;
pub mod bridge;
pub mod component;
pub mod http;
pub mod limits;
pub mod outcome;
mod output;
pub mod protocol;
mod state;
pub mod wit;

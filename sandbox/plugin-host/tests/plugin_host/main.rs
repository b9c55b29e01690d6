//! kiln-plugin-host's tests: real guest components (built for `wasm32-wasip2` on first
//! use, see `guests.rs`) run against the in-memory bridge (`run.rs`, `abuse.rs`) and,
//! through the real binary, against a fake kilnd on a Unix socket (`process.rs`).
//!
//! Tests named `plugin_abuse_*` show that a misbehaving plugin is stopped with its
//! reason and cannot reach files, sockets or clocks.

mod abuse;
mod fake_kilnd;
mod guests;
mod process;
mod run;

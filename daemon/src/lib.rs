//! kiln's daemon crate: the pieces of `kilnd` (the service) and `kiln` (its CLI client).
//!
//! - [`config`]: the TOML schema, defaults and paths;
//! - [`store`]: SQLite — problems, candidates, the durable job queue, evaluations, compile cache;
//! - [`sched`]: the scheduler — compile pool, one lane per backend;
//! - [`plan`]: the per-job part of an evaluation plan (plain timing, racing);
//! - [`backend`] / [`backends`]: the seam to the jailed evaluation backends;
//! - [`api`]: HTTP/1.1 + JSON on the Unix socket, SSE, metrics;
//! - [`client`]: the HTTP-over-Unix-socket client the CLI uses;
//! - [`gpu`], [`systemd`], [`logging`], [`events`], [`metrics`]: the rest of the service.

pub mod api;
pub mod backend;
pub mod backends;
pub mod client;
pub mod config;
pub mod events;
pub mod gpu;
pub mod llm;
pub mod logging;
pub mod metrics;
pub mod plan;
pub mod sched;
pub mod search;
pub mod store;
pub mod systemd;

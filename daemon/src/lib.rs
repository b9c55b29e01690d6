//! kiln's daemon crate: the pieces of `kilnd` (the service) and `kiln` (its CLI client).
//!
//! - [`config`]: the TOML schema, defaults and paths;
//! - [`store`]: the durable store — SQLite on one host, PostgreSQL shared by a cluster
//!   (problems, candidates, the job queue, evaluations, searches; compile cache local);
//! - [`cluster`]: what a node of a cluster does besides its own work (heartbeat, reaper,
//!   relayed events, calibration) and its GPU classes;
//! - [`sched`]: the scheduler — compile pool, evaluation lanes (one per GPU for cuda, one
//!   for the host), a job's options applied to its evaluation plan, baselines;
//! - [`backends`]: the evaluation backends (host, cuda) behind the trait the scheduler
//!   uses, built at start;
//! - [`api`]: HTTP/1.1 + JSON on the Unix socket, SSE, metrics;
//! - [`report`]: the HTML reports of searches and candidates (plots as inline SVG);
//! - [`client`]: the HTTP-over-Unix-socket client the CLI uses;
//! - [`gpu`], [`systemd`], [`logging`], [`events`], [`metrics`]: the rest of the service.

pub mod api;
pub mod backends;
pub mod client;
pub mod cluster;
pub mod config;
pub mod events;
pub mod gpu;
pub mod llm;
pub mod logging;
pub mod metrics;
pub mod report;
pub mod sched;
pub mod search;
pub mod store;
pub mod systemd;

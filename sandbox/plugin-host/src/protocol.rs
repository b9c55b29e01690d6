//! The JSON bodies of the plugin host ↔ kilnd protocol (docs/plugins.md, "Plugin host ↔
//! kilnd protocol"). They live in kiln-types (`kiln_types::plugin`), shared with kilnd,
//! which serves them, so the two sides cannot drift; this module re-exports them for the
//! host's bridges and tests.
//!
//! Every request carries `Authorization: Bearer TOKEN`, a token kilnd minted for one
//! search; every path is under `/v1/searches/{id}/`. Errors are kilnd's usual
//! `{"error": {"code", "message"}}`; the codes in [`codes`] are the ones the host turns
//! into typed errors for the plugin. Any other error ends the plugin (`bridge`).

pub use kiln_types::plugin::*;

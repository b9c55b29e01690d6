//! Building blocks shared by kiln's search strategies (hill-climb, idea-branch,
//! map-elites): the mode switch between offline and LLM search, a ledger that submits
//! batches and waits for them within the search's budgets, the "is it really faster"
//! rule, the six families of optimisation ideas, the evidence a prompt shows a model,
//! and the parser that turns a model's reply into a candidate.
//!
//! [`families`], [`evidence`], [`reply`] and [`Accept`] are pure Rust (tested on the
//! host); [`Ledger`] and [`Mode::parse`] call the plugin host.

pub mod ask;
pub mod evidence;
pub mod families;
mod ledger;
mod mode;
pub mod moves;
pub mod reply;
pub mod report;

pub use ask::{AskError, ask};
pub use ledger::{Ledger, Outcome};
pub use mode::{Accept, Mode};
pub use report::{Cell, Grid, Report, Round, Tried};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Stores a strategy's state as its checkpoint (JSON); a failure is logged, not fatal.
pub fn save<T: Serialize>(state: &T) {
    match serde_json::to_vec(state) {
        Ok(bytes) => {
            if let Err(e) = crate::host::checkpoint(&bytes) {
                crate::warn!("checkpoint not stored: {e}");
            }
        }
        Err(e) => crate::warn!("checkpoint not serialised: {e}"),
    }
}

/// The state stored by [`save`] before a restart, if any and if it still parses.
pub fn load<T: DeserializeOwned>() -> Option<T> {
    let bytes = crate::host::restore()?;
    match serde_json::from_slice(&bytes) {
        Ok(t) => Some(t),
        Err(e) => {
            crate::warn!("checkpoint ignored (does not parse): {e}");
            None
        }
    }
}

/// Reads a strategy's JSON config; empty text (no `--config`) gives the defaults.
pub fn config<T: DeserializeOwned + Default>(text: &str) -> Result<T, String> {
    if text.trim().is_empty() || text.trim() == "null" {
        return Ok(T::default());
    }
    serde_json::from_str(text).map_err(|e| format!("config: {e}"))
}

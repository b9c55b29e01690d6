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
    store(serde_json::to_vec(state));
}

/// Stores a strategy's state as its checkpoint together with its summary document so far,
/// as `{"state": …, "report": …}`: kilnd shows that document (rounds, the MAP-Elites grid)
/// in the search's report while the search runs. [`load`] reads either form.
pub fn save_with_report<T: Serialize>(state: &T, report: &Report) {
    store(serde_json::to_vec(&WithReport { state, report }));
}

#[derive(Serialize)]
struct WithReport<'a, T> {
    state: &'a T,
    report: &'a Report,
}

fn store(bytes: serde_json::Result<Vec<u8>>) {
    match bytes {
        Ok(bytes) => {
            if let Err(e) = crate::plugin_host::checkpoint(&bytes) {
                crate::warn!("checkpoint not stored: {e}");
            }
        }
        Err(e) => crate::warn!("checkpoint not serialised: {e}"),
    }
}

/// The state stored by [`save`] or [`save_with_report`] before a restart, if any and if
/// it still parses.
pub fn load<T: DeserializeOwned>() -> Option<T> {
    let bytes = crate::plugin_host::restore()?;
    match parse_checkpoint(&bytes) {
        Ok(t) => Some(t),
        Err(e) => {
            crate::warn!("checkpoint ignored (does not parse): {e}");
            None
        }
    }
}

/// The state in a checkpoint: `{"state": …, "report": …}` or the state alone.
fn parse_checkpoint<T: DeserializeOwned>(bytes: &[u8]) -> serde_json::Result<T> {
    #[derive(serde::Deserialize)]
    struct Envelope<T> {
        state: T,
        #[allow(dead_code)]
        report: serde::de::IgnoredAny,
    }
    match serde_json::from_slice::<Envelope<T>>(bytes) {
        Ok(e) => Ok(e.state),
        Err(_) => serde_json::from_slice(bytes),
    }
}

/// Reads a strategy's JSON config; empty text (no `--config`) gives the defaults.
pub fn config<T: DeserializeOwned + Default>(text: &str) -> Result<T, String> {
    if text.trim().is_empty() || text.trim() == "null" {
        return Ok(T::default());
    }
    serde_json::from_str(text).map_err(|e| format!("config: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, serde::Deserialize)]
    struct St {
        round: u32,
    }

    #[test]
    fn checkpoints_with_or_without_a_report_read_back() {
        let st = St { round: 3 };
        let report = Report {
            strategy: "x".into(),
            ..Report::default()
        };
        let with = serde_json::to_vec(&WithReport {
            state: &st,
            report: &report,
        })
        .expect("json");
        assert_eq!(parse_checkpoint::<St>(&with).expect("envelope"), st);
        assert_eq!(Report::from_checkpoint(&with), Some(report));
        let plain = serde_json::to_vec(&st).expect("json");
        assert_eq!(parse_checkpoint::<St>(&plain).expect("plain"), st);
        assert!(parse_checkpoint::<St>(br#""text""#).is_err());
    }
}

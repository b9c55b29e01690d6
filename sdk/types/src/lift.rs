//! What lifting a hosted `ModelNew` file came to (issue 29): the contract candidate kiln
//! made of the GPU work its forward recorded, or why it could not.
//!
//! The worker writes it into the file's evaluation telemetry under `"lift"`; kilnd then
//! queues the lifted candidate, whose result is `lifted` (its job carries
//! `lifted_from`). Everything here came from a hosted runner's recording (the file's
//! claim): a lifted candidate is still an ordinary contract candidate that kiln compiles,
//! launches and times itself, so a false recording can only make a different candidate,
//! judged on its own code.

use serde::{Deserialize, Serialize};

use crate::Candidate;

/// The key of a hosted evaluation's telemetry that holds its [`LiftOutcome`].
pub const TELEMETRY_KEY: &str = "lift";

/// What became of a hosted file's recorded forwards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum LiftOutcome {
    /// The forward was lifted into `candidate` (id `candidate_id`, its content hash).
    Lifted {
        /// The lifted candidate's id.
        candidate_id: String,
        /// The contract candidate: the file's device code and kiln's launch plan.
        candidate: Box<Candidate>,
        /// What was dropped or assumed on the way (syncs, flags kiln refuses).
        #[serde(default)]
        notes: Vec<String>,
    },
    /// It could not be lifted: the file stays hosted.
    NotLifted {
        /// A short stable key of the reason (`memset`, `differs`, `side_stream`, ...).
        code: String,
        /// The reason, for people.
        reason: String,
    },
}

impl LiftOutcome {
    /// The outcome recorded in an evaluation's telemetry, if any.
    pub fn of(telemetry: Option<&serde_json::Value>) -> Option<LiftOutcome> {
        let v = telemetry?.get(TELEMETRY_KEY)?;
        serde_json::from_value(v.clone()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_reads_back_from_telemetry() {
        let not = LiftOutcome::NotLifted {
            code: "memset".into(),
            reason: "forward calls cudaMemsetAsync".into(),
        };
        let tele = serde_json::json!({ "device": {}, TELEMETRY_KEY: not });
        assert_eq!(LiftOutcome::of(Some(&tele)), Some(not));
        assert_eq!(tele[TELEMETRY_KEY]["outcome"], "not_lifted");
        assert_eq!(LiftOutcome::of(Some(&serde_json::json!({}))), None);
        assert_eq!(LiftOutcome::of(None), None);
        let garbage = serde_json::json!({ TELEMETRY_KEY: { "outcome": "lifted" } });
        assert_eq!(LiftOutcome::of(Some(&garbage)), None, "incomplete: ignored");
    }
}

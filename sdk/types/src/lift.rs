//! What lifting a hosted `ModelNew` file came to (issue 29): the contract candidate kiln
//! made of the GPU work its forward recorded, or why it could not.
//!
//! The worker writes it into the file's evaluation (`Evaluation::lift`); kilnd then
//! queues the lifted candidate, whose result is `lifted` (its job carries
//! `lifted_from`). Everything here came from a hosted runner's recording (the file's
//! claim): a lifted candidate is still an ordinary contract candidate that kiln compiles,
//! launches and times itself, so a false recording can only make a different candidate,
//! judged on its own code.

use serde::{Deserialize, Serialize};

use crate::Candidate;

/// Where records written before `Evaluation::lift` existed carried the outcome: under this
/// key of their telemetry (read from there when such a record is loaded).
pub const OLD_TELEMETRY_KEY: &str = "lift";

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

#[cfg(test)]
mod tests {
    use super::*;

    fn evaluation(extra: serde_json::Value) -> serde_json::Value {
        let mut e = serde_json::json!({
            "verdict": "ok", "message": "", "backend": "cuda", "trust": "hosted",
        });
        for (k, v) in extra.as_object().expect("object") {
            e[k] = v.clone();
        }
        e
    }

    /// The outcome is a field of the evaluation; an older record's `telemetry.lift` is read
    /// into it (and leaves the telemetry); a malformed one is an error, not `None`.
    #[test]
    fn an_outcome_is_a_field_and_older_records_read_into_it() {
        let not = LiftOutcome::NotLifted {
            code: "memset".into(),
            reason: "forward calls cudaMemsetAsync".into(),
        };
        let new: crate::Evaluation =
            serde_json::from_value(evaluation(serde_json::json!({ "lift": not }))).expect("parses");
        assert_eq!(new.lift.as_ref(), Some(&not));
        let back = serde_json::to_value(&new).expect("serializes");
        assert_eq!(back["lift"]["outcome"], "not_lifted");
        let old: crate::Evaluation = serde_json::from_value(evaluation(serde_json::json!({
            "telemetry": { "device": {}, OLD_TELEMETRY_KEY: not },
        })))
        .expect("an older record parses");
        assert_eq!(old.lift, Some(not));
        assert_eq!(
            old.telemetry,
            Some(serde_json::json!({ "device": {} })),
            "moved out of the telemetry"
        );
        let none: crate::Evaluation =
            serde_json::from_value(evaluation(serde_json::json!({}))).expect("parses");
        assert_eq!(none.lift, None);
        let garbage = evaluation(serde_json::json!({
            "telemetry": { OLD_TELEMETRY_KEY: { "outcome": "lifted" } },
        }));
        let err = serde_json::from_value::<crate::Evaluation>(garbage).expect_err("malformed");
        assert!(err.to_string().contains("telemetry.lift"), "{err}");
        let garbage = evaluation(serde_json::json!({ "lift": { "outcome": "maybe" } }));
        assert!(serde_json::from_value::<crate::Evaluation>(garbage).is_err());
    }
}

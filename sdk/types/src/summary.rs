//! The structured summary kiln's bundled search strategies return. The WIT summary is only
//! `{best, message}`, so `message` carries this document as compact JSON; `kiln search
//! show` prints its rounds and grid, and the search report (`GET /v1/searches/{id}/report`)
//! draws them. A strategy may also publish it while running, in its checkpoint (see
//! `kiln_sdk::search::save_with_report`): a checkpoint that is a JSON object with a
//! `report` member holding this document ([`Report::from_checkpoint`]).
//!
//! Written by plugins, so untrusted: readers parse it leniently (unknown fields are ignored,
//! a document that does not parse is shown as plain text) and bound what they draw.

use serde::{Deserialize, Serialize};

/// What one idea (idea-branch) or one move (hill-climb) led to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tried {
    /// The family of the idea (see `kiln_sdk::search::families`), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    /// The idea or change, in words.
    pub idea: String,
    /// Candidates submitted for it.
    pub candidates: u32,
    /// Its best candidate, when one was correct.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<String>,
    /// That candidate's median time, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_us: Option<f64>,
    /// `improved`, `correct`, `no-gain`, `failed` (none correct) or a verdict.
    pub outcome: String,
}

/// One step or round of a search.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Round {
    /// 1-based.
    pub round: u32,
    /// What the round did (the move, the parent, a restart, a migration...).
    pub note: String,
    /// Candidates it evaluated.
    pub evaluated: u32,
    /// The search's best after the round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<String>,
    /// Its median time, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_us: Option<f64>,
    /// Whether the round beat the best before it (by the search's acceptance rule).
    pub improved: bool,
    /// Ideas or moves of the round and their outcomes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tried: Vec<Tried>,
}

/// One occupied cell of a MAP-Elites grid.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// The island.
    pub island: u32,
    /// The cell's bin per descriptor.
    pub bins: Vec<String>,
    /// The elite's id.
    pub id: String,
    /// Its median time, µs.
    pub median_us: f64,
}

/// A MAP-Elites archive: descriptor names and occupied cells.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Grid {
    /// Descriptor names, one per axis (`registers`, `block`, or knob names...).
    pub descriptors: Vec<String>,
    /// Where the descriptors come from (`resources` or `knobs`).
    pub source: String,
    /// Occupied cells.
    pub cells: Vec<Cell>,
}

/// The summary document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// `hill-climb`, `idea-branch`, `map-elites`...
    pub strategy: String,
    /// `offline` or `llm`.
    pub mode: String,
    /// One line for people: what was tried, what won.
    pub text: String,
    /// The seed's id and median, µs, when evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<String>,
    /// The seed's median time, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_us: Option<f64>,
    /// The best candidate and its median, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<String>,
    /// The best's median time, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_us: Option<f64>,
    /// Steps or rounds, in order.
    pub rounds: Vec<Round>,
    /// The MAP-Elites archive, for map-elites.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid: Option<Grid>,
}

impl Report {
    /// The report as compact JSON, for the summary's `message`.
    pub fn to_message(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| self.text.clone())
    }

    /// The document in a summary's `message`, if it is one (a JSON object with `rounds`).
    pub fn from_message(message: &str) -> Option<Report> {
        let v: serde_json::Value = serde_json::from_str(message).ok()?;
        if !v.get("rounds").is_some_and(serde_json::Value::is_array) {
            return None;
        }
        serde_json::from_value(v).ok()
    }

    /// The document a running strategy published in its checkpoint: a JSON object whose
    /// `report` member is a [`Report`] (the rest is the strategy's own state).
    pub fn from_checkpoint(bytes: &[u8]) -> Option<Report> {
        #[derive(Deserialize)]
        struct Envelope {
            report: Option<Report>,
        }
        serde_json::from_slice::<Envelope>(bytes).ok()?.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_from_a_message_or_a_checkpoint() {
        let r = Report {
            strategy: "idea-branch".into(),
            rounds: vec![Round {
                round: 1,
                ..Round::default()
            }],
            ..Report::default()
        };
        assert_eq!(Report::from_message(&r.to_message()), Some(r.clone()));
        assert_eq!(Report::from_message("best of 3 values"), None);
        assert_eq!(Report::from_message(r#"{"text": "no rounds"}"#), None);
        let cp = serde_json::json!({"state": {"round": 1}, "report": r}).to_string();
        assert_eq!(Report::from_checkpoint(cp.as_bytes()), Some(r));
        assert_eq!(Report::from_checkpoint(br#"{"round": 1}"#), None);
        assert_eq!(Report::from_checkpoint(b"\x00binary"), None);
    }
}

//! The structured summary the bundled strategies return: the WIT summary is only
//! `{best, message}`, so `message` carries this document as compact JSON
//! (`kiln search show` prints its rounds, and with `--archive` its grid).

use serde::{Deserialize, Serialize};

/// What one idea (idea-branch) or one move (hill-climb) led to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tried {
    /// The family of the idea (see [`super::families`]), if it has one.
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
    /// The report as compact JSON, for [`crate::Summary::message`].
    pub fn to_message(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| self.text.clone())
    }
}

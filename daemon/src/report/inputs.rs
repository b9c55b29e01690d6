//! What a page is built from. The API handler gathers it from the store (and the
//! backends' peak rates); the pages only read it, so they are pure and tested on
//! synthetic data.

use kiln_types::summary::Report;

use crate::store::{BaselineSet, CandidateRecord, SearchRecord, Speedup, TimelineEntry};

/// Where a search's summary document came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummarySource {
    /// The summary the strategy returned when it ended.
    Final,
    /// The document the strategy published with its last checkpoint (it is still running).
    Checkpoint,
}

/// A horizontal line drawn across the time plots.
#[derive(Debug, Clone, PartialEq)]
pub struct FloorLine {
    /// What it is (`roofline floor`, `roofline floor, fp32 FMA`).
    pub label: String,
    /// Its time, µs.
    pub us: f64,
}

/// Everything the search page shows.
#[derive(Debug, Clone)]
pub struct SearchInputs {
    /// The search with its progress.
    pub search: SearchRecord,
    /// Every candidate it submitted, with times and evaluations.
    pub timeline: Vec<TimelineEntry>,
    /// The id of the problem's seed kernel for the search's backend, if it has one.
    pub seed_id: Option<String>,
    /// The backend the search's candidates ran on (`host`, `cuda`), if known.
    pub backend: Option<String>,
    /// The problem's baselines on the GPU the search ran on, when measured (only for a
    /// search on the cuda backend: host times are not comparable with them).
    pub baselines: Option<BaselineSet>,
    /// Roofline floors on the search's backend (none where its peak rates are unknown).
    pub floors: Vec<FloorLine>,
    /// The strategy's summary document, when it published one.
    pub summary: Option<(Report, SummarySource)>,
    /// When the page was made, ms since the epoch.
    pub generated_at: i64,
}

/// Everything the candidate page shows.
#[derive(Debug, Clone)]
pub struct CandidateInputs {
    /// The candidate with its latest job and evaluation.
    pub record: CandidateRecord,
    /// Its speedups against the baselines cached for this GPU (cuda only).
    pub speedups: Vec<Speedup>,
    /// When the page was made, ms since the epoch.
    pub generated_at: i64,
}

//! Search and candidate reports: self-contained HTML pages built from what the store
//! holds, with plots drawn in Rust by plotters' SVG backend and inlined. The pages carry
//! their CSS and need nothing else: no scripts, stylesheets, fonts or images are fetched,
//! and a page of something still running reloads itself with a meta refresh.
//!
//! - [`inputs`]: what a page is built from (the API handler gathers it from the store);
//! - [`points`]: a search's finished evaluations as points, and the best so far;
//! - [`lineage`]: a kernel's chain of parents with notes and speedups;
//! - [`rounds`]: a strategy's rounds as a table;
//! - [`style`]: colours of verdicts, marker shapes of precision tiers, number formats;
//! - [`html`]: escaping, tables, the page frame;
//! - [`plots`]: one file per plot;
//! - [`search_page`] and [`candidate_page`]: the two pages.

pub mod candidate_page;
pub mod html;
pub mod inputs;
pub mod lineage;
pub mod plots;
pub mod points;
pub mod rounds;
pub mod search_page;
pub mod style;

#[cfg(test)]
pub(crate) mod fixtures;

pub use inputs::{CandidateInputs, FloorLine, SearchInputs, SummarySource};

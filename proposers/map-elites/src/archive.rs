//! The islands' archives and the search state that is checkpointed.

use std::collections::BTreeMap;

use kiln_sdk::Candidate;
use kiln_sdk::search::{Cell, Grid, Mode, Report, Round};
use serde::{Deserialize, Serialize};

use crate::descriptors::{self, Source};

/// The fastest correct kernel of one cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Elite {
    /// Its id.
    pub id: String,
    /// Its median, µs.
    pub median_us: f64,
    /// The kernel.
    pub candidate: Candidate,
}

/// One island: cell key (bins joined by `|`) → elite.
pub type Island = BTreeMap<String, Elite>;

/// Everything a search needs to continue after a restart of kilnd.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    /// `offline` or `llm` (after any fallback).
    pub mode: String,
    /// The generator's state.
    pub rng: u64,
    /// Generations done.
    pub generation: u32,
    /// Where descriptors come from (decided on the seed's evaluation).
    pub source: Option<Source>,
    /// The seed's id.
    pub seed_id: Option<String>,
    /// The seed's median, µs.
    pub seed_us: Option<f64>,
    /// The best kernel found.
    pub best_id: Option<String>,
    /// Its median, µs.
    pub best_us: Option<f64>,
    /// The islands.
    pub islands: Vec<Island>,
    /// One entry per generation.
    pub rounds: Vec<Round>,
}

impl State {
    /// A fresh search with `islands` empty islands.
    pub fn new(mode: Mode, rng: u64, islands: usize) -> State {
        State {
            mode: mode.as_str().into(),
            rng,
            generation: 0,
            source: None,
            seed_id: None,
            seed_us: None,
            best_id: None,
            best_us: None,
            islands: vec![Island::new(); islands.max(1)],
            rounds: Vec::new(),
        }
    }

    /// Elites over all islands.
    pub fn elites(&self) -> usize {
        self.islands.iter().map(BTreeMap::len).sum()
    }

    /// Puts `elite` in `cell` of island `i` if the cell is empty or its elite is slower.
    pub fn insert(&mut self, i: usize, cell: &[String], elite: Elite) -> bool {
        let key = cell.join("|");
        let island = &mut self.islands[i];
        match island.get(&key) {
            Some(old) if old.median_us <= elite.median_us => false,
            _ => {
                island.insert(key, elite);
                true
            }
        }
    }

    /// The summary document, with the grid.
    pub fn report(&self, seed: &Candidate) -> Report {
        let source = self.source.unwrap_or(Source::Knobs);
        let mut cells = Vec::new();
        for (i, island) in self.islands.iter().enumerate() {
            for (key, e) in island {
                cells.push(Cell {
                    island: i as u32,
                    bins: key.split('|').map(String::from).collect(),
                    id: e.id.clone(),
                    median_us: e.median_us,
                });
            }
        }
        let speed = match (self.seed_us, self.best_us) {
            (Some(s), Some(b)) if b > 0.0 => format!(" ({:.2}x the seed)", s / b),
            _ => String::new(),
        };
        Report {
            strategy: "map-elites".into(),
            mode: self.mode.clone(),
            text: format!(
                "map-elites ({}): {} generations, {} islands, {} elites in cells over {}; best {}{speed}",
                self.mode,
                self.generation,
                self.islands.len(),
                cells.len(),
                match source {
                    Source::Resources => "kernel resources",
                    Source::Knobs => "knob values",
                },
                self.best_us
                    .map_or("none correct".into(), |b| format!("{b:.2} µs"))
            ),
            seed: self.seed_id.clone(),
            seed_us: self.seed_us,
            best: self.best_id.clone(),
            best_us: self.best_us,
            rounds: self.rounds.clone(),
            grid: Some(Grid {
                descriptors: descriptors::axes(source, seed),
                source: match source {
                    Source::Resources => "resources".into(),
                    Source::Knobs => "knobs".into(),
                },
                cells,
            }),
        }
    }
}

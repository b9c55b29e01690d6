//! MAP-Elites with islands, as a kiln proposer.
//!
//! The archive keeps, per island, the fastest correct kernel ("elite") of every cell of
//! a grid over behaviour descriptors read from the compiled kernel: registers per
//! thread, shared memory per block, theoretical occupancy and block size, on fixed bins
//! (see `descriptors`). The host backend reports no resources, so there the descriptors
//! fall back to the knob values (one axis per `@knob`), and the log says so.
//!
//! Each generation, every island picks `batch` parents among its elites (uniformly, with
//! the search's seeded generator) and makes a child of each: offline by changing one or
//! two knobs; with an LLM by one model edit that sees the parent, its evidence and its
//! cell. Children land in their parent's island. Every `migrate_every` generations each
//! island sends a copy of its best elite to the next island (a ring). The archive is
//! checkpointed after every generation, so a restarted search resumes with it.
//!
//! Config (JSON, every key optional): `{"mode": "auto"|"offline"|"llm",
//! "language": "c"|"cuda"|"triton", "islands": 2,
//! "batch": 2, "migrate_every": 3, "generations": 1000, "radius": 1,
//! "accept": "significant"|"median", "fixes": 2, "temperature": 0.8, "max_tokens": 4096}`.

mod archive;
mod descriptors;
mod generation;
mod prompt;

use kiln_sdk::search::{self, Accept, Ledger, Mode};
use kiln_sdk::{Proposer, Summary};
use serde::Deserialize;

/// The configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `auto` (default), `offline` or `llm`.
    pub mode: Option<String>,
    /// The seed's language: `c`, `cuda` or `triton` (default: the seed of the search's
    /// backend, or the Triton seed of a cuda problem that has only that one).
    pub language: Option<String>,
    /// Islands.
    pub islands: usize,
    /// Children per island per generation.
    pub batch: usize,
    /// Generations between migrations.
    pub migrate_every: u32,
    /// Most generations.
    pub generations: u32,
    /// Offline: how far along a knob's list of values a change may go.
    pub radius: usize,
    /// `significant` (default) or `median`: when the search's best changes.
    pub accept: Option<String>,
    /// LLM: how often an unusable reply is sent back with its error.
    pub fixes: u32,
    /// LLM sampling temperature.
    pub temperature: Option<f32>,
    /// LLM: most tokens per reply.
    pub max_tokens: Option<u32>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: None,
            language: None,
            islands: 2,
            batch: 2,
            migrate_every: 3,
            generations: 1000,
            radius: 1,
            accept: None,
            fixes: 2,
            temperature: Some(0.8),
            max_tokens: None,
        }
    }
}

struct MapElites;

impl Proposer for MapElites {
    fn run(config: &str) -> Result<Summary, String> {
        let cfg: Config = search::config(config)?;
        let accept = Accept::parse(cfg.accept.as_deref())?;
        let problem = kiln_sdk::problem().map_err(|e| e.to_string())?;
        let seed = problem.seed_for(cfg.language.as_deref())?;
        let mut ledger = Ledger::load();
        let mut st = match search::load::<archive::State>() {
            Some(st) => {
                kiln_sdk::info!(
                    "resuming at generation {} with {} elites",
                    st.generation + 1,
                    st.elites()
                );
                st
            }
            None => {
                let mode = Mode::parse(cfg.mode.as_deref())?;
                kiln_sdk::info!(
                    "map-elites, {} mode: {} islands, {} children each a generation",
                    mode.as_str(),
                    cfg.islands.max(1),
                    cfg.batch.max(1)
                );
                archive::State::new(mode, kiln_sdk::Rng::from_host().state(), cfg.islands)
            }
        };
        let mut cx = generation::Ctx {
            cfg: &cfg,
            accept,
            problem: &problem,
            seed: &seed,
            ledger: &mut ledger,
        };
        generation::start(&mut cx, &mut st)?;
        search::save_with_report(&st, &st.report(&seed));
        while st.generation < cfg.generations && !cx.ledger.done() {
            if !generation::generation(&mut cx, &mut st) {
                break;
            }
            search::save_with_report(&st, &st.report(&seed));
        }
        let report = st.report(&seed);
        kiln_sdk::info!("{}", report.text);
        Ok(Summary::new(st.best_id.clone(), report.to_message()))
    }
}

kiln_sdk::export_proposer!(MapElites);

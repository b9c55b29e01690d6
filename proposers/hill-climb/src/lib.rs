//! Hill-climbing proposer for kiln.
//!
//! Each step evaluates up to `neighbours` neighbours of the current kernel and moves to
//! the fastest one if it is faster by kiln's statistics (lower median and 95 % intervals
//! that do not overlap; `"accept": "median"` drops the interval test). After
//! `restart_after` steps without a move (or when no untried neighbour is left) it
//! restarts from a random point. The best kernel ever seen is returned.
//!
//! Neighbours are, offline, the seed's `@knob`s changed one at a time by at most
//! `radius` places in the knob's list; with an LLM, `neighbours` independent single
//! edits asked of the model, which sees the problem, the current kernel and its evidence.
//!
//! Config (JSON, every key optional):
//! `{"mode": "auto"|"offline"|"llm", "language": "c"|"cuda"|"triton", "neighbours": 4, "radius": 1, "restart_after": 2,
//!   "max_steps": 1000, "accept": "significant"|"median", "fixes": 2,
//!   "temperature": 0.7, "max_tokens": 4096}`.
//!
//! State is checkpointed after every step; a restarted search continues from it, and
//! the step in flight is proposed again identically (offline), which kilnd answers
//! from its store.

mod prompt;
mod step;

use kiln_sdk::search::{self, Accept, Ledger, Mode, Report};
use kiln_sdk::{Proposer, Summary};
use serde::Deserialize;

pub use step::State;

/// The configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `auto` (default), `offline` or `llm`.
    pub mode: Option<String>,
    /// The seed's language: `c`, `cuda` or `triton` (default: the seed of the search's
    /// backend, or the Triton seed of a cuda problem that has only that one).
    pub language: Option<String>,
    /// Neighbours evaluated per step.
    pub neighbours: usize,
    /// Offline: how far along a knob's list of values a move may go.
    pub radius: usize,
    /// Steps without a move before a random restart.
    pub restart_after: u32,
    /// Most steps.
    pub max_steps: u32,
    /// `significant` (default) or `median`.
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
            neighbours: 4,
            radius: 1,
            restart_after: 2,
            max_steps: 1000,
            accept: None,
            fixes: 2,
            temperature: Some(0.7),
            max_tokens: None,
        }
    }
}

struct HillClimb;

impl Proposer for HillClimb {
    fn run(config: &str) -> Result<Summary, String> {
        let cfg: Config = search::config(config)?;
        let accept = Accept::parse(cfg.accept.as_deref())?;
        let problem = kiln_sdk::problem().map_err(|e| e.to_string())?;
        let seed = problem.seed_for(cfg.language.as_deref())?;
        let mut ledger = Ledger::load();
        let mut st = match search::load::<State>() {
            Some(st) => {
                kiln_sdk::info!("resuming at step {} ({} mode)", st.step + 1, st.mode);
                st
            }
            None => {
                let mode = Mode::parse(cfg.mode.as_deref())?;
                kiln_sdk::info!("hill-climb, {} mode, from the seed", mode.as_str());
                State::new(mode, kiln_sdk::Rng::from_host().state())
            }
        };
        let mut sx = step::Ctx {
            cfg: &cfg,
            accept,
            problem: &problem,
            seed: &seed,
            ledger: &mut ledger,
        };
        step::start(&mut sx, &mut st);
        search::save_with_report(&st, &st.report());
        while st.step < cfg.max_steps && !sx.ledger.done() {
            if !step::step(&mut sx, &mut st) {
                break;
            }
            search::save_with_report(&st, &st.report());
        }
        let report = st.report();
        kiln_sdk::info!("{}", report.text);
        Ok(Summary::new(st.best_id.clone(), report.to_message()))
    }
}

impl State {
    fn report(&self) -> Report {
        let speed = match (self.seed_us, self.best_us) {
            (Some(s), Some(b)) if b > 0.0 => format!(" ({:.2}x the seed)", s / b),
            _ => String::new(),
        };
        Report {
            strategy: "hill-climb".into(),
            mode: self.mode.clone(),
            text: format!(
                "hill-climb ({}): {} steps, {} restarts; best {}{speed}",
                self.mode,
                self.step,
                self.restarts,
                self.best_us
                    .map_or("none correct".into(), |b| format!("{b:.2} µs"))
            ),
            seed: self.seed_id.clone(),
            seed_us: self.seed_us,
            best: self.best_id.clone(),
            best_us: self.best_us,
            rounds: self.rounds.clone(),
            grid: None,
        }
    }
}

kiln_sdk::export_proposer!(HillClimb);

//! Idea-branching proposer for kiln (the seed project's method).
//!
//! Each round takes the best kernel so far, chooses `ideas` (K) ideas spread across the
//! six families (memory access; asynchrony and latency hiding; data type and precision;
//! compute and instructions; parallelism and occupancy; control flow and loops), makes
//! `impls` (M) implementations of each, evaluates all K×M, and lets the fastest seed the
//! next round if it beats the incumbent by kiln's statistics. Every idea and its outcome
//! goes to the search log and into the summary's per-round records.
//!
//! Offline, ideas are the seed's `@idea` lines (with the `KNOB=VALUE`s, knobs and flags
//! their text names) plus one "tune KNOB" idea per knob no idea names, each filed under
//! a family by keywords; implementations are the idea's knob settings applied to the
//! round's parent. With an LLM, the model proposes the ideas (a JSON list with
//! families), then writes each implementation; unusable replies go back with the error.
//!
//! Config (JSON, every key optional): `{"mode": "auto"|"offline"|"llm",
//! "language": "c"|"cuda"|"triton", "ideas": 3,
//! "impls": 2, "rounds": 100, "accept": "significant"|"median", "fixes": 2,
//! "temperature": 0.8, "max_tokens": 4096}`.

mod ideas;
mod prompt;
mod round;

use kiln_sdk::search::{self, Accept, Ledger, Mode, Report};
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
    /// Ideas per round (K).
    pub ideas: usize,
    /// Implementations per idea (M).
    pub impls: usize,
    /// Most rounds.
    pub rounds: u32,
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
            ideas: 3,
            impls: 2,
            rounds: 100,
            accept: None,
            fixes: 2,
            temperature: Some(0.8),
            max_tokens: None,
        }
    }
}

struct IdeaBranch;

impl Proposer for IdeaBranch {
    fn run(config: &str) -> Result<Summary, String> {
        let cfg: Config = search::config(config)?;
        let accept = Accept::parse(cfg.accept.as_deref())?;
        let problem = kiln_sdk::problem().map_err(|e| e.to_string())?;
        let seed = problem.seed_for(cfg.language.as_deref())?;
        let mut ledger = Ledger::load();
        let mut st = match search::load::<round::State>() {
            Some(st) => {
                kiln_sdk::info!("resuming at round {} ({} mode)", st.round + 1, st.mode);
                st
            }
            None => {
                let mode = Mode::parse(cfg.mode.as_deref())?;
                kiln_sdk::info!(
                    "idea-branch, {} mode: {} ideas x {} implementations a round",
                    mode.as_str(),
                    cfg.ideas,
                    cfg.impls
                );
                round::State::new(mode, kiln_sdk::Rng::from_host().state())
            }
        };
        let mut cx = round::Ctx {
            cfg: &cfg,
            accept,
            problem: &problem,
            seed: &seed,
            ledger: &mut ledger,
        };
        round::start(&mut cx, &mut st);
        search::save_with_report(&st, &report(&st));
        while st.round < cfg.rounds && !cx.ledger.done() {
            if !round::round(&mut cx, &mut st) {
                break;
            }
            search::save_with_report(&st, &report(&st));
        }
        let report = report(&st);
        kiln_sdk::info!("{}", report.text);
        Ok(Summary::new(st.best_id.clone(), report.to_message()))
    }
}

fn report(st: &round::State) -> Report {
    let speed = match (st.seed_us, st.best_us) {
        (Some(s), Some(b)) if b > 0.0 => format!(" ({:.2}x the seed)", s / b),
        _ => String::new(),
    };
    Report {
        strategy: "idea-branch".into(),
        mode: st.mode.clone(),
        text: format!(
            "idea-branch ({}): {} rounds, {} ideas tried; best {}{speed}",
            st.mode,
            st.round,
            st.rounds.iter().map(|r| r.tried.len()).sum::<usize>(),
            st.best_us
                .map_or("none correct".into(), |b| format!("{b:.2} µs"))
        ),
        seed: st.seed_id.clone(),
        seed_us: st.seed_us,
        best: st.best_id.clone(),
        best_us: st.best_us,
        rounds: st.rounds.clone(),
        grid: None,
    }
}

kiln_sdk::export_proposer!(IdeaBranch);

//! The minimal kiln proposer: try every value of the seed kernel's first knob, submit
//! them all, wait, log each result, and return the fastest correct one.
//!
//! Build: `cargo build --release --target wasm32-wasip2 -p kiln-example-minimal`
//! (or `scripts/build-plugins.sh`); the component is
//! `target/wasm32-wasip2/release/kiln_example_minimal.wasm`.

use std::time::Duration;

use kiln_sdk::{CandidateBuilder, Proposer, Summary, knobs};

struct FirstKnob;

impl Proposer for FirstKnob {
    fn run(_config: &str) -> Result<Summary, String> {
        let problem = kiln_sdk::problem().map_err(|e| e.to_string())?;
        let seed = problem.seed.ok_or("the problem has no seed kernel")?;
        let notes = knobs::parse(&seed.source).map_err(|e| e.to_string())?;
        let knob = notes.knobs.first().ok_or("the seed kernel has no @knob")?;
        let mut ids = Vec::new();
        for value in &knob.values {
            let source = knobs::set(&seed.source, &knob.name, value).map_err(|e| e.to_string())?;
            let note = format!("{}={value}", knob.name);
            let candidate = CandidateBuilder::from(&seed).source(source).note(&note);
            let candidate = candidate.build().map_err(|e| e.to_string())?;
            let submitted = kiln_sdk::submit(&candidate).map_err(|e| e.to_string())?;
            kiln_sdk::info!("submitted {note} as {}", submitted.id);
            ids.push(submitted.id);
        }
        let evals =
            kiln_sdk::wait_all(&ids, Duration::from_secs(3600)).map_err(|e| e.to_string())?;
        for e in &evals {
            kiln_sdk::info!("{}: {:?} {:?} µs", e.candidate_id, e.verdict, e.median_us);
        }
        let best = kiln_sdk::best(&evals).ok_or("no candidate was correct")?;
        let message = format!(
            "best of {} values of {}: {:?} µs",
            ids.len(),
            knob.name,
            best.median_us
        );
        Ok(Summary::new(Some(best.candidate_id.clone()), message))
    }
}

kiln_sdk::export_proposer!(FirstKnob);

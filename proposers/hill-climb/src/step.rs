//! The state of a climb and one step of it.

use kiln_sdk::search::{self, Accept, AskError, Ledger, Mode, Outcome, Round, Tried, moves};
use kiln_sdk::{Candidate, Evaluation, Problem, Rng};
use serde::{Deserialize, Serialize};

use crate::{Config, prompt};

/// Everything a climb needs to continue after a restart of kilnd.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    /// `offline` or `llm` (after any fallback).
    pub mode: String,
    /// The generator's state.
    pub rng: u64,
    /// Steps done.
    pub step: u32,
    /// The seed's id and median.
    pub seed_id: Option<String>,
    /// The seed's median, µs.
    pub seed_us: Option<f64>,
    /// The point the climb stands on.
    pub current: Option<Candidate>,
    /// Its id.
    pub current_id: Option<String>,
    /// The best kernel found.
    pub best_id: Option<String>,
    /// Its median, µs.
    pub best_us: Option<f64>,
    /// Steps since the last move.
    pub stale: u32,
    /// Random restarts made.
    pub restarts: u32,
    /// One entry per step.
    pub rounds: Vec<Round>,
}

impl State {
    /// A fresh climb.
    pub fn new(mode: Mode, rng: u64) -> State {
        State {
            mode: mode.as_str().into(),
            rng,
            step: 0,
            seed_id: None,
            seed_us: None,
            current: None,
            current_id: None,
            best_id: None,
            best_us: None,
            stale: 0,
            restarts: 0,
            rounds: Vec::new(),
        }
    }
}

/// What a step works with.
pub struct Ctx<'a> {
    pub cfg: &'a Config,
    pub accept: Accept,
    pub problem: &'a Problem,
    pub seed: &'a Candidate,
    pub ledger: &'a mut Ledger,
}

impl Ctx<'_> {
    fn eval(&self, id: &Option<String>) -> Option<Evaluation> {
        id.as_ref().and_then(|i| self.ledger.get(i)).cloned()
    }
}

fn median(o: &Outcome) -> Option<f64> {
    o.median_us()
}

/// Evaluates the seed (once) and stands on it.
pub fn start(cx: &mut Ctx, st: &mut State) {
    if st.seed_id.is_some() {
        return;
    }
    let out = cx.ledger.evaluate(std::slice::from_ref(cx.seed)).remove(0);
    kiln_sdk::info!(
        "seed {}: {}",
        out.id,
        out.median_us()
            .map_or("not correct".into(), |m| format!("{m:.2} µs"))
    );
    st.seed_id = Some(out.id.clone());
    st.seed_us = out.median_us();
    st.current = Some(cx.seed.clone());
    st.current_id = Some(out.id.clone());
    if out.is_ok() {
        st.best_id = Some(out.id);
        st.best_us = st.seed_us;
    }
}

/// Proposes the step's neighbours of `cur`: `(candidate, note)`.
fn propose(cx: &mut Ctx, st: &mut State, cur: &Candidate, cur_id: &str) -> Vec<Candidate> {
    if st.mode == "llm" {
        match llm_neighbours(cx, cur, cur_id) {
            Ok(v) => return v,
            Err(e) => {
                kiln_sdk::warn!("{e}; continuing offline from the seed's knobs");
                st.mode = Mode::Offline.as_str().into();
            }
        }
    }
    let mut rng = Rng::from_state(st.rng);
    let mut moves = moves::neighbours(&cur.source, cx.cfg.radius);
    rng.shuffle(&mut moves);
    st.rng = rng.state();
    let mut out = Vec::new();
    for (k, v) in moves {
        if out.len() >= cx.cfg.neighbours.max(1) {
            break;
        }
        let Ok(mut c) = moves::apply(cur, &[(k.clone(), v.clone())], &[]) else {
            continue;
        };
        if cx.ledger.get(&c.content_hash()).is_some() {
            continue; // already evaluated: it cannot be a better move than it was
        }
        c.parent = Some(cur_id.to_string());
        c.note = Some(format!("{k}={v}"));
        out.push(c);
    }
    out
}

/// `neighbours` single edits asked of the model. Fails (to fall back offline) when no
/// model can be asked at all.
fn llm_neighbours(cx: &mut Ctx, cur: &Candidate, cur_id: &str) -> Result<Vec<Candidate>, AskError> {
    let cur_eval = cx.ledger.get(cur_id).cloned();
    let mut out: Vec<Candidate> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    for i in 0..cx.cfg.neighbours.max(1) {
        let msgs = prompt::improve(cx.problem, cur, cur_eval.as_ref(), &notes);
        match search::ask(msgs, cur, cx.cfg.fixes, &prompt::options(cx.cfg)) {
            Ok(p) => {
                let mut c = p.candidate;
                let note = p.note.unwrap_or_else(|| format!("model edit {}", i + 1));
                notes.push(note.clone());
                c.parent = Some(cur_id.to_string());
                c.note = Some(note);
                out.push(c);
            }
            Err(AskError::Unusable(e)) => kiln_sdk::warn!("edit {} dropped: {e}", i + 1),
            Err(e) if out.is_empty() => return Err(e),
            Err(e) => {
                kiln_sdk::warn!("{e}; evaluating the {} edits so far", out.len());
                break;
            }
        }
    }
    Ok(out)
}

/// A random point (offline) or the best so far (LLM) to climb from.
fn restart(cx: &mut Ctx, st: &mut State, round: &mut Round) {
    st.restarts += 1;
    st.stale = 0;
    let mut rng = Rng::from_state(st.rng);
    let mut pick = None;
    for _ in 0..16 {
        let a = moves::random_assignment(&cx.seed.source, &mut rng);
        if let Ok(c) = moves::apply(cx.seed, &a, &[])
            && cx.ledger.get(&c.content_hash()).is_none()
        {
            pick = Some((c, a));
            break;
        }
    }
    st.rng = rng.state();
    let Some((mut c, a)) = pick else {
        round.note.push_str("; restart: no untried point left");
        return;
    };
    c.parent = st.seed_id.clone();
    c.note = Some(format!("restart: {}", moves::describe(&a)));
    let out = cx.ledger.evaluate(std::slice::from_ref(&c)).remove(0);
    round.evaluated += 1;
    round
        .note
        .push_str(&format!("; restart at {}", moves::describe(&a)));
    note_best(cx, st, &out);
    round.tried.push(tried(&c, &out, "restart"));
    if out.is_ok() {
        st.current = Some(c);
        st.current_id = Some(out.id);
    }
}

fn tried(c: &Candidate, o: &Outcome, outcome: &str) -> Tried {
    Tried {
        family: None,
        idea: c.note.clone().unwrap_or_default(),
        candidates: 1,
        best: o.is_ok().then(|| o.id.clone()),
        best_us: median(o),
        outcome: match &o.evaluation {
            Some(e) if e.is_ok() => outcome.to_string(),
            Some(e) => e.verdict.map_or("not-evaluated".into(), |v| v.to_string()),
            None => "not-evaluated".into(),
        },
    }
}

fn note_best(cx: &Ctx, st: &mut State, o: &Outcome) -> bool {
    let Some(e) = &o.evaluation else { return false };
    let best = cx.eval(&st.best_id);
    if cx.accept.faster(e, best.as_ref()) {
        st.best_id = Some(o.id.clone());
        st.best_us = o.median_us();
        return true;
    }
    false
}

/// One step; false when nothing is left to try.
pub fn step(cx: &mut Ctx, st: &mut State) -> bool {
    let (Some(cur), Some(cur_id)) = (st.current.clone(), st.current_id.clone()) else {
        return false;
    };
    let mut round = Round {
        round: st.step + 1,
        note: format!(
            "from {} ({})",
            &cur_id[..cur_id.len().min(8)],
            cur.note.clone().unwrap_or_else(|| "seed".into())
        ),
        ..Round::default()
    };
    let batch = propose(cx, st, &cur, &cur_id);
    let before_best = st.best_id.clone();
    if batch.is_empty() {
        round.note.push_str("; no untried neighbour");
        restart(cx, st, &mut round);
        if round.evaluated == 0 {
            return false;
        }
    } else {
        let outs = cx.ledger.evaluate(&batch);
        round.evaluated += outs.iter().filter(|o| o.evaluation.is_some()).count() as u32;
        let cur_eval = cx.eval(&Some(cur_id.clone()));
        let winner = outs
            .iter()
            .zip(&batch)
            .filter(|(o, _)| o.is_ok())
            .min_by(|a, b| {
                median(a.0)
                    .unwrap_or(f64::MAX)
                    .total_cmp(&median(b.0).unwrap_or(f64::MAX))
            });
        let moved = winner.is_some_and(|(o, _)| {
            o.evaluation
                .as_ref()
                .is_some_and(|e| cx.accept.faster(e, cur_eval.as_ref()))
        });
        for (o, c) in outs.iter().zip(&batch) {
            let won = moved && winner.is_some_and(|(w, _)| w.id == o.id);
            round
                .tried
                .push(tried(c, o, if won { "improved" } else { "no-gain" }));
            kiln_sdk::info!(
                "step {}: {} → {}",
                st.step + 1,
                c.note.as_deref().unwrap_or(""),
                median(o).map_or_else(
                    || o.evaluation
                        .as_ref()
                        .and_then(|e| e.verdict)
                        .map_or("not evaluated".into(), |v| v.to_string()),
                    |m| format!("{m:.2} µs")
                )
            );
        }
        if let Some((o, c)) = winner.filter(|_| moved) {
            note_best(cx, st, o);
            st.current = Some(c.clone());
            st.current_id = Some(o.id.clone());
            st.stale = 0;
            round
                .note
                .push_str(&format!("; moved to {}", c.note.as_deref().unwrap_or("")));
        } else {
            if let Some((o, _)) = winner {
                note_best(cx, st, o);
            }
            st.stale += 1;
            if st.stale >= cx.cfg.restart_after.max(1) && !cx.ledger.done() {
                restart(cx, st, &mut round);
            }
        }
    }
    round.improved = st.best_id != before_best;
    round.best = st.best_id.clone();
    round.best_us = st.best_us;
    st.rounds.push(round);
    st.step += 1;
    true
}

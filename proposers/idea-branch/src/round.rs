//! The state of an idea-branch search and one round of it.

use kiln_sdk::search::families::Family;
use kiln_sdk::search::{self, Accept, AskError, Ledger, Mode, Outcome, Round, Tried};
use kiln_sdk::{Candidate, Problem, Rng};
use serde::{Deserialize, Serialize};

use crate::Config;
use crate::ideas::{self, Idea};
use crate::prompt;

/// Everything a search needs to continue after a restart of kilnd.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    /// `offline` or `llm` (after any fallback).
    pub mode: String,
    /// The generator's state.
    pub rng: u64,
    /// Rounds done.
    pub round: u32,
    /// The seed's id.
    pub seed_id: Option<String>,
    /// The seed's median, µs.
    pub seed_us: Option<f64>,
    /// The incumbent: the parent of the next round.
    pub best: Option<Candidate>,
    /// Its id.
    pub best_id: Option<String>,
    /// Its median, µs.
    pub best_us: Option<f64>,
    /// `label → outcome` of every idea tried (for LLM prompts).
    pub history: Vec<String>,
    /// One entry per round.
    pub rounds: Vec<Round>,
}

impl State {
    /// A fresh search.
    pub fn new(mode: Mode, rng: u64) -> State {
        State {
            mode: mode.as_str().into(),
            rng,
            round: 0,
            seed_id: None,
            seed_us: None,
            best: None,
            best_id: None,
            best_us: None,
            history: Vec::new(),
            rounds: Vec::new(),
        }
    }
}

/// What a round works with.
pub struct Ctx<'a> {
    pub cfg: &'a Config,
    pub accept: Accept,
    pub problem: &'a Problem,
    pub seed: &'a Candidate,
    pub ledger: &'a mut Ledger,
}

/// Evaluates the seed once; it is the first incumbent.
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
    st.best = Some(cx.seed.clone());
    st.best_id = Some(out.id);
    st.best_us = st.seed_us;
}

/// The round's ideas with their implementations (candidates with parent and note).
type Plan = Vec<(Idea, Vec<Candidate>)>;

fn offline_plan(cx: &Ctx, st: &mut State, parent: &Candidate, parent_id: &str) -> Plan {
    let mut rng = Rng::from_state(st.rng);
    let notes = kiln_sdk::search::moves::annotations(&cx.seed.source);
    let mut avail: Vec<(Family, (Idea, Vec<Candidate>))> = Vec::new();
    for idea in ideas::offline_pool(&notes) {
        let fresh: Vec<Candidate> = ideas::variants(&idea, parent, &mut rng)
            .into_iter()
            .filter(|c| cx.ledger.get(&c.content_hash()).is_none())
            .take(cx.cfg.impls.max(1))
            .map(|mut c| {
                c.parent = Some(parent_id.to_string());
                c
            })
            .collect();
        if fresh.is_empty() {
            if idea.assign.is_empty() && idea.free.is_empty() && idea.flags.is_empty() {
                kiln_sdk::debug!("idea {} names no knob or flag: it needs an LLM", idea.name);
            }
            continue;
        }
        avail.push((idea.family, (idea, fresh)));
    }
    let plan = ideas::pick_across_families(&avail, cx.cfg.ideas.max(1), &mut rng);
    st.rng = rng.state();
    plan
}

fn llm_plan(cx: &Ctx, st: &State, parent: &Candidate, parent_id: &str) -> Result<Plan, AskError> {
    let eval = cx.ledger.get(parent_id);
    let opts = prompt::options(cx.cfg);
    let msgs = prompt::ideas_request(cx.problem, parent, eval, cx.cfg.ideas.max(1), &st.history);
    let mut list = prompt::ask_ideas(msgs, cx.cfg.fixes, &opts)?;
    list.truncate(cx.cfg.ideas.max(1));
    let mut plan = Vec::new();
    for idea in list {
        let mut impls = Vec::new();
        for j in 1..=cx.cfg.impls.max(1) {
            let msgs = prompt::implement_request(cx.problem, parent, eval, &idea, j);
            match search::ask(msgs, parent, cx.cfg.fixes, &opts) {
                Ok(p) => {
                    let mut c = p.candidate;
                    c.parent = Some(parent_id.to_string());
                    let how = p.note.map(|n| format!(" — {n}")).unwrap_or_default();
                    c.note = Some(format!("[{}] {}{how}", idea.family.name(), idea.name));
                    impls.push(c);
                }
                Err(AskError::Unusable(e)) => {
                    kiln_sdk::warn!("implementation {j} of {} dropped: {e}", idea.name)
                }
                Err(e) => {
                    kiln_sdk::warn!("{e}; stopping this round's requests");
                    plan.push((idea, impls));
                    return Ok(plan);
                }
            }
        }
        plan.push((idea, impls));
    }
    Ok(plan)
}

fn verdict_word(o: &Outcome) -> String {
    match &o.evaluation {
        Some(e) if e.is_ok() => "ok".into(),
        Some(e) => e.verdict.map_or("not-evaluated".into(), |v| v.to_string()),
        None => "not-evaluated".into(),
    }
}

/// One round; false when no idea is left to try.
pub fn round(cx: &mut Ctx, st: &mut State) -> bool {
    let (Some(parent), Some(parent_id)) = (st.best.clone(), st.best_id.clone()) else {
        return false;
    };
    let mut plan = Vec::new();
    if st.mode == "llm" {
        match llm_plan(cx, st, &parent, &parent_id) {
            Ok(p) => plan = p,
            Err(e) => {
                kiln_sdk::warn!("{e}; continuing offline from the seed's ideas and knobs");
                st.mode = Mode::Offline.as_str().into();
            }
        }
    }
    if st.mode == "offline" {
        plan = offline_plan(cx, st, &parent, &parent_id);
    }
    if plan.iter().all(|(_, v)| v.is_empty()) {
        kiln_sdk::info!("round {}: no idea left to try", st.round + 1);
        return false;
    }
    let batch: Vec<Candidate> = plan.iter().flat_map(|(_, v)| v.iter().cloned()).collect();
    let outs = cx.ledger.evaluate(&batch);
    let incumbent = cx.ledger.get(&parent_id).cloned();
    // The round's fastest correct candidate.
    let winner = outs
        .iter()
        .zip(&batch)
        .filter(|(o, _)| o.is_ok())
        .min_by(|a, b| {
            a.0.median_us()
                .unwrap_or(f64::MAX)
                .total_cmp(&b.0.median_us().unwrap_or(f64::MAX))
        });
    let improved = winner.is_some_and(|(o, _)| {
        o.evaluation
            .as_ref()
            .is_some_and(|e| cx.accept.faster(e, incumbent.as_ref()))
    });
    let mut rec = Round {
        round: st.round + 1,
        note: format!(
            "parent {} ({})",
            &parent_id[..parent_id.len().min(8)],
            parent.note.clone().unwrap_or_else(|| "seed".into())
        ),
        evaluated: outs.iter().filter(|o| o.evaluation.is_some()).count() as u32,
        improved,
        ..Round::default()
    };
    let mut at = 0;
    for (idea, impls) in &plan {
        let mine = &outs[at..at + impls.len()];
        at += impls.len();
        let best = mine.iter().filter(|o| o.is_ok()).min_by(|a, b| {
            a.median_us()
                .unwrap_or(f64::MAX)
                .total_cmp(&b.median_us().unwrap_or(f64::MAX))
        });
        let outcome = match best {
            Some(b) if improved && winner.is_some_and(|(w, _)| w.id == b.id) => "improved".into(),
            Some(b)
                if b.evaluation
                    .as_ref()
                    .is_some_and(|e| cx.accept.faster(e, incumbent.as_ref())) =>
            {
                "faster".into()
            }
            Some(_) => "no-gain".into(),
            None if impls.is_empty() => "no usable implementation".into(),
            None if mine.iter().all(|o| o.evaluation.is_none()) => {
                "not evaluated (budget or time spent)".into()
            }
            None => format!(
                "failed ({})",
                mine.iter().map(verdict_word).collect::<Vec<_>>().join(", ")
            ),
        };
        let t = Tried {
            family: Some(idea.family.name().into()),
            idea: format!("{}: {}", idea.name, idea.text),
            candidates: impls.len() as u32,
            best: best.map(|b| b.id.clone()),
            best_us: best.and_then(Outcome::median_us),
            outcome: outcome.clone(),
        };
        kiln_sdk::info!(
            "round {} idea {} → {outcome}{}",
            st.round + 1,
            idea.label(),
            t.best_us
                .map_or(String::new(), |m| format!(", best {m:.2} µs"))
        );
        st.history.push(format!("{} → {outcome}", idea.label()));
        rec.tried.push(t);
    }
    if let Some((o, c)) = winner.filter(|_| improved) {
        st.best = Some(c.clone());
        st.best_id = Some(o.id.clone());
        st.best_us = o.median_us();
        rec.note
            .push_str(&format!("; new best {}", c.note.as_deref().unwrap_or("")));
    }
    rec.best = st.best_id.clone();
    rec.best_us = st.best_us;
    st.rounds.push(rec);
    st.round += 1;
    true
}

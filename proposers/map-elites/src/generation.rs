//! Starting the archive from the seed, and one generation: children of random elites
//! on every island, evaluation, insertion, and migration along the ring.

use kiln_sdk::search::{self, Accept, AskError, Ledger, Mode, Outcome, Round, Tried, moves};
use kiln_sdk::{Candidate, Problem, Rng};

use crate::Config;
use crate::archive::{Elite, State};
use crate::descriptors::{self, Source};
use crate::prompt;

/// What a generation works with.
pub struct Ctx<'a> {
    pub cfg: &'a Config,
    pub accept: Accept,
    pub problem: &'a Problem,
    pub seed: &'a Candidate,
    pub ledger: &'a mut Ledger,
}

/// Evaluates the seed once, picks the descriptor source, and seeds every island.
pub fn start(cx: &mut Ctx, st: &mut State) -> Result<(), String> {
    if st.seed_id.is_some() {
        return Ok(());
    }
    let out = cx.ledger.evaluate(std::slice::from_ref(cx.seed)).remove(0);
    let eval = out
        .evaluation
        .clone()
        .filter(|e| e.is_ok())
        .ok_or("the seed kernel is not correct: map-elites needs a correct seed to start")?;
    let source = if eval.resources.is_empty() {
        kiln_sdk::info!(
            "the {} backend reports no kernel resources: descriptors fall back to the knob values ({})",
            cx.problem.device.backend,
            descriptors::axes(Source::Knobs, cx.seed).join(", ")
        );
        Source::Knobs
    } else {
        kiln_sdk::info!("descriptors: registers, shared memory, occupancy, block size");
        Source::Resources
    };
    st.source = Some(source);
    st.seed_id = Some(out.id.clone());
    st.seed_us = out.median_us();
    st.best_id = Some(out.id.clone());
    st.best_us = out.median_us();
    let cell = descriptors::cell(source, cx.seed, &eval);
    for i in 0..st.islands.len() {
        st.insert(
            i,
            &cell,
            Elite {
                id: out.id.clone(),
                median_us: out.median_us().unwrap_or(f64::MAX),
                candidate: cx.seed.clone(),
            },
        );
    }
    Ok(())
}

/// An offline child of `parent`: one or two knobs changed, not evaluated before.
fn offline_child(
    cx: &Ctx,
    parent: &Candidate,
    rng: &mut Rng,
    taken: &[String],
) -> Option<Candidate> {
    for _ in 0..24 {
        let mut c = parent.clone();
        let mut changes = Vec::new();
        let n = 1 + rng.below(2);
        for _ in 0..n {
            let nb = moves::neighbours(&c.source, cx.cfg.radius);
            let Some((k, v)) = rng.choose(&nb).cloned() else {
                break;
            };
            if let Ok(next) = moves::apply(&c, &[(k.clone(), v.clone())], &[]) {
                c = next;
                changes.push(format!("{k}={v}"));
            }
        }
        let id = c.content_hash();
        if !changes.is_empty() && cx.ledger.get(&id).is_none() && !taken.contains(&id) {
            c.note = Some(changes.join(" "));
            return Some(c);
        }
    }
    None
}

/// One generation; false when no island could make a new child.
pub fn generation(cx: &mut Ctx, st: &mut State) -> bool {
    let Some(source) = st.source else {
        return false;
    };
    let g = st.generation + 1;
    let mut rng = Rng::from_state(st.rng);
    // (island, child)
    let mut children: Vec<(usize, Candidate)> = Vec::new();
    let mut taken: Vec<String> = Vec::new();
    for i in 0..st.islands.len() {
        let elites: Vec<Elite> = st.islands[i].values().cloned().collect();
        for _ in 0..cx.cfg.batch.max(1) {
            let Some(parent) = rng.choose(&elites).cloned() else {
                break;
            };
            let child = if st.mode == "llm" {
                match llm_child(cx, st, i, &parent) {
                    Ok(c) => c,
                    Err(e) => {
                        kiln_sdk::warn!("{e}; continuing offline from the seed's knobs");
                        st.mode = Mode::Offline.as_str().into();
                        offline_child(cx, &parent.candidate, &mut rng, &taken)
                    }
                }
            } else {
                offline_child(cx, &parent.candidate, &mut rng, &taken)
            };
            if let Some(mut c) = child {
                c.parent = Some(parent.id.clone());
                taken.push(c.content_hash());
                children.push((i, c));
            }
        }
    }
    st.rng = rng.state();
    if children.is_empty() {
        kiln_sdk::info!("generation {g}: no new child could be made");
        return false;
    }
    let batch: Vec<Candidate> = children.iter().map(|(_, c)| c.clone()).collect();
    let outs = cx.ledger.evaluate(&batch);
    let before = st.best_id.clone();
    let mut rec = Round {
        round: g,
        note: String::new(),
        evaluated: outs.iter().filter(|o| o.evaluation.is_some()).count() as u32,
        ..Round::default()
    };
    let mut placed = 0;
    for ((i, c), o) in children.iter().zip(&outs) {
        let outcome = place(cx, st, source, *i, c, o);
        if outcome.starts_with("new") || outcome.starts_with("better") {
            placed += 1;
        }
        kiln_sdk::info!(
            "gen {g} island {i}: {} → {outcome}",
            c.note.as_deref().unwrap_or("")
        );
        rec.tried.push(Tried {
            family: Some(format!("island {i}")),
            idea: c.note.clone().unwrap_or_default(),
            candidates: 1,
            best: o.is_ok().then(|| o.id.clone()),
            best_us: o.median_us(),
            outcome,
        });
    }
    rec.note = format!("{placed} elites placed, {} in the archive", st.elites());
    if st.islands.len() > 1 && cx.cfg.migrate_every > 0 && g.is_multiple_of(cx.cfg.migrate_every) {
        rec.note.push_str(&format!("; {}", migrate(cx, st, source)));
    }
    rec.improved = st.best_id != before;
    rec.best = st.best_id.clone();
    rec.best_us = st.best_us;
    st.rounds.push(rec);
    st.generation = g;
    true
}

/// Inserts a child into island `i`'s grid; the outcome in words.
fn place(cx: &Ctx, st: &mut State, source: Source, i: usize, c: &Candidate, o: &Outcome) -> String {
    let Some(e) = o.evaluation.as_ref().filter(|e| e.is_ok()) else {
        return o.evaluation.as_ref().map_or("not evaluated".into(), |e| {
            e.verdict.map_or("not-evaluated".into(), |v| v.to_string())
        });
    };
    let cell = descriptors::cell(source, c, e);
    let key = cell.join("|");
    let existed = st.islands[i].contains_key(&key);
    let m = o.median_us().unwrap_or(f64::MAX);
    let won = st.insert(
        i,
        &cell,
        Elite {
            id: o.id.clone(),
            median_us: m,
            candidate: c.clone(),
        },
    );
    let best = st.best_id.as_ref().and_then(|b| cx.ledger.get(b));
    if cx.accept.faster(e, best) {
        st.best_id = Some(o.id.clone());
        st.best_us = Some(m);
    }
    match (won, existed) {
        (true, false) => format!("new cell [{key}] {m:.2} µs"),
        (true, true) => format!("better elite of [{key}] {m:.2} µs"),
        _ => format!("slower than the elite of [{key}]"),
    }
}

/// Copies each island's best elite to the next island of the ring.
fn migrate(cx: &Ctx, st: &mut State, source: Source) -> String {
    let n = st.islands.len();
    let bests: Vec<Option<Elite>> = st
        .islands
        .iter()
        .map(|isl| {
            isl.values()
                .min_by(|a, b| a.median_us.total_cmp(&b.median_us))
                .cloned()
        })
        .collect();
    let mut moved = 0;
    for (i, b) in bests.into_iter().enumerate() {
        let Some(e) = b else { continue };
        let Some(ev) = cx.ledger.get(&e.id) else {
            continue;
        };
        let cell = descriptors::cell(source, &e.candidate, ev);
        if st.insert((i + 1) % n, &cell, e) {
            moved += 1;
        }
    }
    kiln_sdk::info!("migration: {moved} elites moved along the ring of {n} islands");
    format!("migration: {moved} elites moved")
}

/// One model edit of `parent`.
fn llm_child(
    cx: &Ctx,
    st: &State,
    island: usize,
    parent: &Elite,
) -> Result<Option<Candidate>, AskError> {
    let eval = cx.ledger.get(&parent.id);
    let others: Vec<String> = st.islands[island]
        .values()
        .filter(|e| e.id != parent.id)
        .filter_map(|e| {
            e.candidate
                .note
                .clone()
                .map(|n| format!("{n} ({:.2} µs)", e.median_us))
        })
        .take(5)
        .collect();
    let msgs = prompt::mutate(cx.problem, &parent.candidate, eval, &others);
    match search::ask(
        msgs,
        &parent.candidate,
        cx.cfg.fixes,
        &prompt::options(cx.cfg),
    ) {
        Ok(p) => {
            let mut c = p.candidate;
            c.note = Some(p.note.unwrap_or_else(|| "model edit".into()));
            Ok(Some(c))
        }
        Err(AskError::Unusable(e)) => {
            kiln_sdk::warn!("child dropped: {e}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

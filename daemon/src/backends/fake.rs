//! A fake backend for tests: `n` lanes labelled `GPU-fake-0`.. (as
//! `crate::gpu::fake_inventory` names its GPUs), which records what ran on which lane. Its
//! first `n` evaluations wait until all `n` lanes are busy at once (at most [`PATIENCE`]),
//! so a test sees whether the scheduler fills every lane; the rest answer at once, or
//! after a set delay ([`FakeLanes::with_delays`], which delays compiles too and counts
//! those in flight).

use std::sync::Arc;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use kiln_sandbox::{BackendStatus, CompileOutcome};
use kiln_types::BackendKind;
use kiln_types::{
    BaselineResult, Candidate, CompileInfo, EvalPlan, Evaluation, ProblemSpec, TimingStats, Verdict,
};

use super::{Backend, BackendError};

/// How long a test waits for the scheduler before it fails (never reached when it works).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// What the fake saw.
#[derive(Default)]
pub struct Seen {
    /// Lanes evaluating right now.
    pub busy: Vec<bool>,
    /// Evaluations that found their lane already busy.
    pub overlaps: usize,
    /// Most lanes busy at one moment.
    pub most_busy: usize,
    /// (candidate note, lane) per evaluation.
    pub evaluated: Vec<(String, usize)>,
    /// Lanes baselines were measured on.
    pub baselines_on: Vec<usize>,
    /// Per evaluation: (candidate note, whether its plan asked to record launches).
    pub recorded: Vec<(String, bool)>,
    /// Compiles running now.
    pub compiling: usize,
    /// Most compiles running at one moment.
    pub most_compiling: usize,
}

/// The fake backend (see the module docs).
pub struct FakeLanes {
    name: &'static str,
    kind: BackendKind,
    n: usize,
    seen: Mutex<Seen>,
    changed: Condvar,
    compile_delay: Duration,
    eval_delay: Duration,
}

impl FakeLanes {
    /// A fake of backend `kind` with `n` lanes.
    pub fn new(kind: BackendKind, n: usize) -> Arc<FakeLanes> {
        Self::with_delays(kind, n, Duration::ZERO, Duration::ZERO)
    }

    /// A cuda fake under a name of its own (its lane counters and metrics, which are
    /// process-wide, then stay apart from other tests').
    pub fn named(name: &'static str, n: usize) -> Arc<FakeLanes> {
        Self::build(name, BackendKind::Cuda, n, Duration::ZERO, Duration::ZERO)
    }

    /// A fake whose every compile takes `compile` and every evaluation `evaluation`.
    pub fn with_delays(
        kind: BackendKind,
        n: usize,
        compile: Duration,
        evaluation: Duration,
    ) -> Arc<FakeLanes> {
        Self::build(kind.as_str(), kind, n, compile, evaluation)
    }

    fn build(
        name: &'static str,
        kind: BackendKind,
        n: usize,
        compile: Duration,
        evaluation: Duration,
    ) -> Arc<FakeLanes> {
        Arc::new(FakeLanes {
            name,
            kind,
            n,
            seen: Mutex::new(Seen {
                busy: vec![false; n],
                ..Seen::default()
            }),
            changed: Condvar::new(),
            compile_delay: compile,
            eval_delay: evaluation,
        })
    }

    pub fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Backend for FakeLanes {
    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn status(&self) -> BackendStatus {
        BackendStatus {
            name: self.kind,
            usable: true,
            detail: format!("fake, {} lanes", self.n),
        }
    }

    fn compile(&self, _: &ProblemSpec, _: &Candidate) -> Result<CompileOutcome, BackendError> {
        if !self.compile_delay.is_zero() {
            {
                let mut seen = self.seen();
                seen.compiling += 1;
                seen.most_compiling = seen.most_compiling.max(seen.compiling);
            }
            std::thread::sleep(self.compile_delay);
            self.seen().compiling -= 1;
        }
        Ok(CompileOutcome {
            artifact: Some(b"fake artifact".to_vec()),
            info: CompileInfo::default(),
            failure: None,
            layers: Vec::new(),
        })
    }

    fn lanes(&self) -> usize {
        self.n
    }

    fn lane_label(&self, lane: usize) -> String {
        format!("GPU-fake-{lane}")
    }

    fn evaluate(
        &self,
        lane: usize,
        _problem: &ProblemSpec,
        _reference: &[u8],
        candidate: &Candidate,
        _artifact: &[u8],
        plan: &EvalPlan,
    ) -> Result<Evaluation, BackendError> {
        let mut seen = self.seen();
        let note = candidate.note.clone().unwrap_or_default();
        seen.recorded.push((note.clone(), plan.record_launches));
        if seen.busy[lane] {
            seen.overlaps += 1;
        }
        seen.busy[lane] = true;
        let busy = seen.busy.iter().filter(|b| **b).count();
        seen.most_busy = seen.most_busy.max(busy);
        let first_wave = seen.evaluated.len() < self.n;
        seen.evaluated
            .push((candidate.note.clone().unwrap_or_default(), lane));
        self.changed.notify_all();
        if first_wave {
            let (s, _) = self
                .changed
                .wait_timeout_while(seen, PATIENCE, |s| s.most_busy < self.n)
                .unwrap_or_else(|p| p.into_inner());
            seen = s;
        }
        if !self.eval_delay.is_zero() {
            drop(seen);
            std::thread::sleep(self.eval_delay);
            seen = self.seen();
        }
        seen.busy[lane] = false;
        let mut e = Evaluation::early(Verdict::Ok, self.kind, "ok");
        e.trust = candidate.language.trust();
        e.timing = Some(TimingStats {
            median_us: 10.0,
            ..TimingStats::default()
        });
        // A candidate whose note says `lift-me` is lifted, as a hosted file's worker lifts
        // one: its evaluation names a contract candidate (its source with a comment more,
        // noted `lifted`).
        if note.contains("lift-me") {
            let mut lifted = candidate.clone();
            lifted.note = Some("lifted".into());
            lifted.source.push_str("\n/* lifted */");
            let outcome = kiln_types::lift::LiftOutcome::Lifted {
                candidate_id: lifted.content_hash(),
                candidate: Box::new(lifted),
                notes: vec!["1 sync dropped".into()],
            };
            e.lift = Some(outcome);
        }
        Ok(e)
    }

    fn baselines(
        &self,
        lane: usize,
        _problem: &ProblemSpec,
        _reference: &[u8],
        _plan: &EvalPlan,
    ) -> Result<Vec<BaselineResult>, BackendError> {
        self.seen().baselines_on.push(lane);
        Ok(vec![crate::store::measured_reference(100.0 + lane as f64)])
    }
}

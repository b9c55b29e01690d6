//! The evaluation contract, once, for every backend (docs/architecture.md, "One
//! candidate's path", shows where it runs).
//!
//! A backend implements [`Target`]: a few mechanical steps (draw an input set from the
//! secret seed, run the trusted reference, run the candidate once, take one timed sample
//! over one or more fresh input sets, report which inputs changed, read the outputs).
//! [`Session`] drives them and owns every verdict: correctness trials on fresh inputs
//! (plus the shifted/scaled trial), poisoned outputs, the input tamper check, run-twice
//! determinism, error metrics against the reference, the precision tier, then timing
//! ([`timing`]: fresh inputs for every timed run), the measurability check
//! (`unmeasurable_time`) and the roofline floor check (`implausible_time`).
//!
//! Backend-neutral pieces every backend uses: [`data`] (inputs drawn from the secret seed,
//! the poison pattern, elements read back) and [`compare`] (error metrics, precision
//! tiers).
//!
//! Targets: `engine::host::evaluate::HostTarget` (C, or a hosted file's python, in runner
//! processes), `engine::cuda::target::GpuTarget` (kernels kiln launches on the worker's
//! GPU) and `engine::hosted::gpu_target::HostedGpuTarget` (a hosted file's runner on the
//! GPU, beside the same GPU memory). A verdict reached before any candidate code could run
//! (a module that does not load, a launch plan or scratch list kiln refuses, a file that
//! does not import) is the target's setup's, as `Evaluation::early`; every verdict after
//! that, `no_own_kernels` included, is the [`Session`]'s.

pub mod compare;
pub mod data;
pub mod timing;

use std::time::Instant;

use kiln_types::{
    Dtype, ErrorMetrics, EvalPlan, Evaluation, Evidence, ProblemSpec, Role, TimingStats, Verdict,
};

/// Output tensors: (name, bytes).
pub type Outputs = Vec<(String, Vec<u8>)>;

/// The largest relative L2 error (over a whole output) a correct answer may have, whatever
/// its elements' tolerance: an output every element of which is within `atol` of a
/// reference that is itself below `atol` (a softmax over a long row, zeros returned) is
/// nothing like the reference. Far above every precision tier (coarse starts at 8e-3).
pub const MAX_REL_L2: f64 = 0.5;

/// log2 of the factor the range trial scales float inputs down by.
pub const RANGE_SCALE_LOG2: i32 = 20;

/// Which distribution an input set is drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputVariant {
    /// Each tensor's own distribution.
    Normal,
    /// Float inputs that allow it: mean 1000, std 0.1 (catches naive variance formulas
    /// and other cancellation).
    Shifted,
    /// Float inputs of f32/f64 scaled by 2^-[`RANGE_SCALE_LOG2`] (the range trial).
    Tiny,
}

impl InputVariant {
    /// The distribution a tensor is drawn from in this variant.
    pub fn init(self, t: &kiln_types::TensorSpec) -> kiln_types::Init {
        use kiln_types::Init;
        match self {
            // The problem's own get_inputs() makes it: kiln shifts and scales only what it
            // draws itself.
            _ if t.init == Init::GetInputs => Init::GetInputs,
            InputVariant::Shifted if t.shifted_trial && t.dtype.is_float() => data::SHIFTED,
            InputVariant::Tiny if matches!(t.dtype, Dtype::F32 | Dtype::F64) => {
                let s = (2.0f64).powi(-RANGE_SCALE_LOG2);
                match t.init {
                    Init::Normal { mean, std } => Init::Normal {
                        mean: mean * s,
                        std: std * s,
                    },
                    Init::Uniform { low, high } => Init::Uniform {
                        low: low * s,
                        high: high * s,
                    },
                    other => other,
                }
            }
            _ => t.init,
        }
    }
}

/// Why one run of candidate code did not finish normally.
#[derive(Debug, Clone, PartialEq)]
pub enum RunFailure {
    /// It ran past the run timeout (the detail says what was done about it).
    Timeout(String),
    /// It crashed, was killed, or faulted (the detail names the fault).
    Fault(String),
    /// The launch could not be made (found only when launching).
    InvalidLaunch(String),
    /// kiln could not set the run up (the torch runner making the problem's own inputs
    /// failed): kiln's failure, never a verdict.
    Infra(String),
}

/// The label of run `rep` of a timed sample of `reps` runs (the sample's own label when it
/// has one run).
pub fn rep_label(label: &str, rep: usize, reps: usize) -> String {
    if reps <= 1 {
        label.to_string()
    } else {
        format!("{label}, run {} of {reps}", rep + 1)
    }
}

/// Elements of one output still holding the backend's poison: (tensor, count, first indices).
pub type Unwritten = (String, u64, Vec<u64>);

/// Why [`Target::check`] could not compare.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckError {
    /// The reference misbehaved or the backend broke (not the candidate's fault).
    Infra(String),
    /// A kept copy of an earlier run changed while candidate code ran afterwards.
    KeptChanged(String),
}

/// The mechanics a backend provides; [`Session`] turns their results into verdicts.
///
/// Every method that runs candidate code first poisons the outputs and zeroes the
/// candidate's scratch, and makes `inputs` the current input set.
pub trait Target {
    /// One drawn input set (host: the bytes; GPU: the seeds and the hashes).
    type Inputs;
    /// A candidate run's outputs kept for comparison (host: the bytes; GPU: a device copy).
    type Kept;
    /// The backend this target evaluates on.
    fn backend(&self) -> kiln_types::BackendKind;
    /// How the candidate is run: kiln launching its device code (the default), or its own
    /// host code in a hosted runner.
    fn trust(&self) -> kiln_types::TrustMode {
        kiln_types::TrustMode::Contract
    }
    /// Draws an input set from the secret `seed`, keyed by (`purpose`, `index`), each
    /// tensor from [`InputVariant::init`]. `Err` is an infrastructure failure.
    fn draw(
        &mut self,
        seed: u64,
        purpose: &str,
        index: u64,
        variant: InputVariant,
    ) -> Result<Self::Inputs, String>;
    /// Runs the candidate once, untimed by the contract; returns the backend's elapsed
    /// time in microseconds (host: wall time between go and done; GPU: 0).
    fn run(&mut self, inputs: &Self::Inputs) -> Result<f64, RunFailure>;
    /// One timed sample of the candidate, in microseconds: one run of the launch list on
    /// each of `sets` (never more than [`Target::reps_max`], each drawn fresh for this
    /// sample), in order, between one start and one stop of the timer. Every run's outputs
    /// are poisoned and its scratch zeroed before the timer starts. Afterwards rep 0 is
    /// selected (see [`Target::select_rep`]).
    fn sample(&mut self, sets: &[Self::Inputs]) -> Result<f64, RunFailure>;
    /// How many input sets one timed sample can run on (host: the runner's buffer slots;
    /// 1 where the backend times one run per sample).
    fn reps_max(&self) -> usize {
        1
    }
    /// Makes run `rep` of the last timed sample the one [`Target::tampered`],
    /// [`Target::keep`] and [`Target::unwritten`] look at (only called with `rep` below
    /// the number of sets of that sample; [`Target::run`] and [`Target::sample`] select 0).
    fn select_rep(&mut self, _rep: usize) {}
    /// The timer's resolution, microseconds: a sample at or below it (or at or below the
    /// overhead it subtracts) is not a time.
    fn resolution_us(&self) -> f64;
    /// One plain (KernelBench-style) sample of the candidate, in microseconds: events
    /// around one launch of the plan on the worker's stream, then a wait for the end
    /// event; no L2 flush, no blocking kernel, no poisoning between samples. `inputs` are
    /// the current set (the warm-up just ran on them). Called a fixed number of times when
    /// the plan asks for plain timing (`EvalPlan::plain`); the last run's outputs are
    /// then kept and re-checked. Backends without it answer
    /// `RunFailure::Fault(timing::plain::UNSUPPORTED)`, which fails the job (not a verdict).
    fn plain_sample(&mut self, _inputs: &Self::Inputs) -> Result<f64, RunFailure> {
        Err(RunFailure::Fault(timing::plain::UNSUPPORTED.into()))
    }
    /// Names of the inputs the last candidate run changed.
    fn tampered(&mut self, inputs: &Self::Inputs) -> Result<Vec<String>, RunFailure>;
    /// Keeps the last candidate run's outputs in `slot` (0 or 1; a slot is reused) and
    /// reports the outputs that still hold poison.
    fn keep(&mut self, slot: usize) -> Result<(Self::Kept, Vec<Unwritten>), RunFailure>;
    /// The outputs of the last candidate run that still hold poison, without keeping them
    /// (warm-up runs).
    fn unwritten(&mut self) -> Result<Vec<Unwritten>, RunFailure> {
        self.keep(0).map(|(_, u)| u)
    }
    /// Runs the trusted reference on `inputs` (after the candidate's runs, never while
    /// candidate code can run) and compares each of `kept` with it under `tol`, one
    /// metrics list per kept run; leaves nothing of the reference's results where
    /// candidate code could reach them.
    fn check(
        &mut self,
        inputs: &Self::Inputs,
        kept: &[&Self::Kept],
        tol: kiln_types::Tolerance,
    ) -> Result<Vec<Vec<ErrorMetrics>>, CheckError>;
    /// Elements whose bits differ between two kept runs, and whether every element of
    /// one is within `tol` of the other.
    fn diff(
        &mut self,
        a: &Self::Kept,
        b: &Self::Kept,
        tol: kiln_types::Tolerance,
    ) -> Result<(u64, bool), RunFailure>;
    /// The timer's fixed overhead per sample, microseconds (subtracted from samples).
    fn overhead(&mut self) -> Result<f64, RunFailure>;
    /// One more empty round trip, microseconds, taken between timed samples where the
    /// timer has an overhead at all (host); `None` where it has none (GPU). The overhead
    /// subtracted from every sample is the fastest of these and of [`Target::overhead`]'s.
    fn overhead_probe(&mut self) -> Result<Option<f64>, RunFailure> {
        Ok(None)
    }
    /// True when reading every timed run's outputs is cheap (host: shared memory), so
    /// unwritten outputs are checked after every sample and not only on re-checks.
    fn outputs_every_sample(&self) -> bool;
    /// What candidate code printed, if anything.
    fn output_excerpt(&self) -> Option<String> {
        None
    }
    /// Called just before the timed samples (telemetry starts here).
    fn timing_started(&mut self) {}
    /// Called after the last timed sample with each sample's wall window; returns the
    /// backend's telemetry for the window.
    fn timing_finished(&mut self, _windows: &[(Instant, Instant)]) -> Option<serde_json::Value> {
        None
    }
    /// Indices of the samples of the last finished timing window that ran throttled
    /// (GPU: overlapping an NVML reading with a throttling reason); none by default.
    fn throttled_samples(&self) -> Vec<usize> {
        Vec::new()
    }
    /// How the last timing window's samples were measured and their other figures,
    /// leaving out the samples at `excluded` (GPU: CUPTI kernel records or events, see
    /// `TimingStats::timer`); none by default.
    fn timer_evidence(&self, _excluded: &[usize]) -> Option<kiln_types::TimerEvidence> {
        None
    }
    /// The kernels one more run of the candidate launched, as its own process claims them
    /// (a hosted runner's profiler), sorted into its own and library ones; `Err` says why
    /// there is no list. `None` where kiln launches every kernel itself (nothing to
    /// claim). Asked only of a candidate found correct and timed; the claim decides
    /// `no_own_kernels` ([`Session::run`]), never a time.
    fn claimed_kernels(
        &mut self,
    ) -> Option<Result<crate::engine::hosted::kernels::Breakdown, String>> {
        None
    }
}

/// Why an evaluation ended before its last step.
#[derive(Debug)]
pub enum Stop {
    /// The candidate earned this verdict.
    Verdict(Box<Evaluation>),
    /// Something that is not the candidate's fault (the reference misbehaved).
    Infra(String),
}

impl From<Box<Evaluation>> for Stop {
    fn from(e: Box<Evaluation>) -> Stop {
        Stop::Verdict(e)
    }
}

/// A step of the contract.
pub type Step<T> = Result<T, Stop>;

/// An evaluation in progress.
pub struct Session<'a, T: Target> {
    /// The problem.
    pub problem: &'a ProblemSpec,
    /// The plan.
    pub plan: &'a EvalPlan,
    /// The backend.
    pub target: T,
    /// Evidence gathered so far.
    pub evidence: Evidence,
    /// Telemetry returned by the target for the timing window.
    pub telemetry: Option<serde_json::Value>,
    /// The kernels the candidate's process claims it launched, as JSON for the
    /// evaluation's telemetry (see [`Target::claimed_kernels`]).
    pub claimed_kernels: Option<serde_json::Value>,
}

impl<'a, T: Target> Session<'a, T> {
    /// A session with no evidence yet.
    pub fn new(problem: &'a ProblemSpec, plan: &'a EvalPlan, target: T) -> Self {
        Session {
            problem,
            plan,
            target,
            evidence: Evidence::default(),
            telemetry: None,
            claimed_kernels: None,
        }
    }

    /// Runs the whole contract. `Err` is an infrastructure failure, never the candidate's.
    pub fn run(&mut self) -> Result<Evaluation, String> {
        let mut e = match self.run_contract() {
            Ok(e) | Err(Stop::Verdict(e)) => *e,
            Err(Stop::Infra(msg)) => return Err(msg),
        };
        self.own_kernels(&mut e);
        Ok(e)
    }

    /// For a candidate found correct and timed whose process claims its kernels (hosted):
    /// a forward that launched none of its own is the reference renamed, and `ok` becomes
    /// `no_own_kernels` (its time kept). The claim's totals are checked against kiln's
    /// time and noted; a target that cannot say leaves the verdict and adds a note.
    fn own_kernels(&mut self, e: &mut Evaluation) {
        if !matches!(e.verdict, Verdict::Ok | Verdict::UnmeasurableTime) {
            return;
        }
        let b = match self.target.claimed_kernels() {
            None => return,
            Some(Ok(b)) => b,
            Some(Err(why)) => {
                e.evidence
                    .notes
                    .push(format!("kernels: not recorded ({why})"));
                return;
            }
        };
        if b.kernels.is_empty() {
            e.evidence
                .notes
                .push("kernels: the runner's profiler recorded no GPU work".into());
        } else if !b.has_own() && e.verdict == Verdict::Ok {
            e.verdict = Verdict::NoOwnKernels;
            e.message = format!(
                "{}; but forward launched no kernel of its own: {} library kernel(s) ran ({}), \
                 so it is the reference renamed and does not rank",
                e.message,
                b.kernels.len(),
                b.kernels
                    .iter()
                    .take(3)
                    .map(|(k, _)| k.name.chars().take(60).collect::<String>())
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        let sum = b.own_us + b.library_us;
        if let Some(t) = &e.timing
            && sum > t.median_us * 1.5 + 5.0
        {
            e.evidence.notes.push(format!(
                "kernels: the runner's records sum to {sum:.1} us of GPU time, above the {:.1} us \
                 kiln measured from its side: they disagree (the records are the runner's claim)",
                t.median_us
            ));
        }
        if let Some(span) = b.span_us {
            let time = e.timing.as_ref().map(|t| t.median_us);
            e.evidence.notes.push(format!(
                "kernels: the forward's span on the GPU, first kernel start to last kernel end \
                 on any stream, {span:.1} us (the runner's claim, never the time){}",
                time.map_or(String::new(), |t| format!(", beside kiln's {t:.1} us"))
            ));
            if let Some(t) = time
                && t * 1.5 + 5.0 < span
            {
                e.evidence.notes.push(format!(
                    "kernels: flagged: kiln's time ({t:.1} us) is far below the span the runner \
                     claims ({span:.1} us): they disagree"
                ));
            }
            if span * 1.5 + 5.0 < sum {
                e.evidence.notes.push(format!(
                    "kernels: flagged: the span ({span:.1} us) is far below the kernels' sum \
                     ({sum:.1} us): kernels ran side by side on several streams"
                ));
            }
        }
        e.evidence.notes.push(format!(
            "kernels: {} recorded, {:.0} % of their GPU time in library kernels (the runner's \
             claim)",
            b.kernels.len(),
            100.0 * b.library_fraction()
        ));
        self.claimed_kernels = Some(b.to_json());
    }

    /// An evaluation with the evidence gathered so far.
    pub fn verdict(&self, verdict: Verdict, message: String) -> Evaluation {
        let mut evidence = self.evidence.clone();
        evidence.output_excerpt = self.target.output_excerpt();
        Evaluation {
            verdict,
            message,
            backend: self.target.backend().to_string(),
            trust: self.target.trust(),
            compile: None,
            evidence,
            timing: None,
            tier: None,
            lift: None,
            telemetry: self.telemetry.clone(),
        }
    }

    /// The verdict for a run that did not finish, or kiln's failure when kiln could not
    /// set the run up ([`RunFailure::Infra`]).
    pub fn failure_verdict(&mut self, failure: RunFailure, during: &str) -> Stop {
        let (verdict, detail) = match failure {
            RunFailure::Infra(why) => return Stop::Infra(format!("{during}: {why}")),
            RunFailure::Timeout(detail) => (Verdict::Timeout, detail),
            RunFailure::Fault(fault) => {
                self.evidence.fault = Some(fault.clone());
                (Verdict::RuntimeFault, fault)
            }
            RunFailure::InvalidLaunch(why) => (Verdict::InvalidLaunch, why),
        };
        self.evidence.deciding_trial = Some(during.to_string());
        Stop::Verdict(Box::new(
            self.verdict(verdict, format!("{during}: {detail}")),
        ))
    }

    fn run_contract(&mut self) -> Step<Box<Evaluation>> {
        let t0 = Instant::now();
        let worst_rel_l2 = self.correctness()?;
        if worst_rel_l2 > MAX_REL_L2 {
            // Not a trial's decision: every element was within the tolerance, as
            // KernelBench's check accepts; kiln's own bound on the whole output refuses it.
            let mut e = self.verdict(
                Verdict::WrongAnswer,
                format!(
                    "every element is within the tolerance, but the output's relative L2 error \
                     is {worst_rel_l2:.2e} (above {MAX_REL_L2}): the reference's values are \
                     below its absolute tolerance and the answer is not them (zeros, or noise)"
                ),
            );
            e.tier = Some(kiln_types::PrecisionTier::Coarse);
            return Err(Box::new(e).into());
        }
        let mut tier = compare::tier(worst_rel_l2);
        let range = self.range_trial()?;
        if let Some(range_rel) = range {
            tier = compare::tier_with_range(tier, worst_rel_l2, range_rel);
        }
        // An output held in f16 has fp16's range whatever the arithmetic was.
        let f16_out = self
            .problem
            .tensors
            .iter()
            .any(|t| t.role == Role::Output && t.dtype == Dtype::F16);
        if f16_out && tier == kiln_types::PrecisionTier::Tf32Like {
            tier = kiln_types::PrecisionTier::Fp16Like;
        }
        self.evidence.correctness_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
        tracing::debug!("correctness took {:?}", t0.elapsed());
        if let Some(req) = self.problem.required_tier
            && tier > req
        {
            let range_note = match range {
                Some(r) if tier == kiln_types::PrecisionTier::Fp16Like => format!(
                    "; on inputs scaled by 2^-{RANGE_SCALE_LOG2} its relative L2 error is {r:.2e}, \
                     as when values are held in a format with fp16's range"
                ),
                _ => String::new(),
            };
            let mut e = self.verdict(
                Verdict::WrongAnswer,
                format!(
                    "delivers {tier:?} precision (relative L2 {worst_rel_l2:.2e}{range_note}); \
                     the problem requires {req:?}"
                ),
            );
            e.tier = Some(tier);
            return Err(Box::new(e).into());
        }
        let t1 = Instant::now();
        let stats = timing::time(self)?;
        tracing::debug!("timing took {:?}", t1.elapsed());
        if let Some(why) = timing::unmeasurable(&stats, self.target.resolution_us()) {
            // Not a time: no figure is reported, so nothing can rank it.
            let mut e = self.verdict(Verdict::UnmeasurableTime, why);
            e.tier = Some(tier);
            return Ok(Box::new(e));
        }
        let mut e = self.floor_check(&stats);
        e.tier = Some(tier);
        e.timing = Some(stats);
        Ok(Box::new(e))
    }

    /// Correctness trials; returns the worst relative L2 error seen.
    fn correctness(&mut self) -> Step<f64> {
        let shifted = self
            .problem
            .tensors
            .iter()
            .any(|t| t.role == Role::Input && t.shifted_trial && t.dtype.is_float());
        let normal = self.plan.trials.max(1);
        let total = normal + u32::from(shifted);
        let mut worst: Vec<ErrorMetrics> = Vec::new();
        let mut worst_rel = 0.0f64;
        for t in 0..total {
            let is_shifted = t >= normal;
            let label = if is_shifted {
                format!("trial {} (shifted: mean 1000, std 0.1)", t + 1)
            } else {
                format!("trial {}", t + 1)
            };
            let variant = if is_shifted {
                InputVariant::Shifted
            } else {
                InputVariant::Normal
            };
            let inputs = self.draw_variant("trial", u64::from(t), variant)?;
            let (ma, mb, diffs, agree) = self.two_runs(&inputs, &label)?;
            self.evidence.trials_run += 1;
            self.evidence.bitwise_diffs += diffs;
            let a_ok = ma.iter().all(|m| m.mismatches == 0);
            let b_ok = mb.iter().all(|m| m.mismatches == 0);
            if !a_ok && !b_ok && agree {
                self.evidence.deciding_trial = Some(label.clone());
                self.evidence.errors = ma.clone();
                let worst_m = ma.iter().max_by(|x, y| x.mismatches.cmp(&y.mismatches));
                let msg = worst_m.map_or(String::new(), |m| {
                    format!(
                        "{}: {} of its elements outside tolerance (max abs {:.3e}, rel L2 {:.3e})",
                        m.tensor, m.mismatches, m.max_abs, m.rel_l2
                    )
                });
                return Err(Box::new(
                    self.verdict(Verdict::WrongAnswer, format!("{label}: {msg}")),
                )
                .into());
            }
            if !(a_ok && b_ok && agree) {
                self.evidence.deciding_trial = Some(label.clone());
                self.evidence.errors = if a_ok { mb.clone() } else { ma.clone() };
                return Err(Box::new(self.verdict(
                    Verdict::Nondeterministic,
                    format!(
                        "{label}: two runs on the same inputs disagree beyond the tolerance \
                         ({diffs} elements differ bitwise; run 1 {}, run 2 {})",
                        if a_ok { "correct" } else { "wrong" },
                        if b_ok { "correct" } else { "wrong" }
                    ),
                ))
                .into());
            }
            if diffs > 0 {
                self.evidence.notes.push(format!(
                    "{label}: {diffs} elements differ bitwise between two runs on the same inputs (within tolerance)"
                ));
            }
            self.evidence.trials_passed += 1;
            for m in ma.into_iter().chain(mb) {
                if m.rel_l2 >= worst_rel {
                    worst_rel = m.rel_l2;
                    worst.retain(|w| w.tensor != m.tensor);
                    worst.push(m);
                }
            }
        }
        self.evidence.errors = worst;
        Ok(worst_rel)
    }

    /// Two candidate runs on `inputs` (each with the per-run checks), then the reference
    /// on the same inputs: (run 1's metrics, run 2's metrics, bitwise differences between
    /// the runs, whether the runs agree within the tolerance).
    fn two_runs(
        &mut self,
        inputs: &T::Inputs,
        label: &str,
    ) -> Step<(Vec<ErrorMetrics>, Vec<ErrorMetrics>, u64, bool)> {
        let a = self.candidate_run(inputs, &format!("{label}, run 1"), 0)?.0;
        let b = self.candidate_run(inputs, &format!("{label}, run 2"), 1)?.0;
        let tol = self.problem.tolerance;
        let (diffs, agree) = match self.target.diff(&a, &b, tol) {
            Ok(d) => d,
            Err(f) => return Err(self.failure_verdict(f, label)),
        };
        let mut metrics = self.check(inputs, &[&a, &b], label)?.into_iter();
        let ma = metrics.next().unwrap_or_default();
        let mb = metrics.next().unwrap_or_default();
        Ok((ma, mb, diffs, agree))
    }

    /// The range trial: float inputs (f32, f64) scaled by 2^-20, where a format with
    /// fp16's range (subnormal below 6.1e-5) loses its precision while fp32, TF32 and
    /// bf16 keep theirs. Returns the worst relative L2 error; it decides the precision
    /// tier only, never the verdict, except for the per-run checks (faults, tampered
    /// inputs, unwritten outputs). `None` when the problem has no such inputs.
    fn range_trial(&mut self) -> Step<Option<f64>> {
        let any = self
            .problem
            .tensors
            .iter()
            .any(|t| t.role == Role::Input && matches!(t.dtype, Dtype::F32 | Dtype::F64));
        if !any {
            return Ok(None);
        }
        let label = format!("range trial (float inputs scaled by 2^-{RANGE_SCALE_LOG2})");
        let inputs = self.draw_variant("range", 0, InputVariant::Tiny)?;
        let a = self.candidate_run(&inputs, &label, 0)?.0;
        let metrics = self.check(&inputs, &[&a], &label)?;
        let worst = metrics
            .iter()
            .flatten()
            .map(|m| m.rel_l2)
            .fold(0.0f64, f64::max);
        self.evidence.notes.push(format!(
            "{label}: relative L2 error {worst:.2e} (decides the fp16-like tier, not the verdict)"
        ));
        Ok(Some(worst))
    }

    /// Runs the reference on `inputs` and compares `kept` with it.
    pub fn check(
        &mut self,
        inputs: &T::Inputs,
        kept: &[&T::Kept],
        label: &str,
    ) -> Step<Vec<Vec<ErrorMetrics>>> {
        match self.target.check(inputs, kept, self.problem.tolerance) {
            Ok(m) => Ok(m),
            Err(CheckError::Infra(msg)) => Err(Stop::Infra(format!("the reference kernel {msg}"))),
            Err(CheckError::KeptChanged(msg)) => {
                self.evidence.deciding_trial = Some(label.to_string());
                Err(
                    Box::new(self.verdict(Verdict::InputTampered, format!("{label}: {msg}")))
                        .into(),
                )
            }
        }
    }

    /// The dtype of a tensor (f32 if unknown).
    pub fn dtype(&self, name: &str) -> Dtype {
        self.problem.tensor(name).map_or(Dtype::F32, |t| t.dtype)
    }

    /// Draws an input set from the secret seed (the shifted distribution when `shifted`).
    pub fn draw(&mut self, purpose: &str, index: u64, shifted: bool) -> Step<T::Inputs> {
        let variant = if shifted {
            InputVariant::Shifted
        } else {
            InputVariant::Normal
        };
        self.draw_variant(purpose, index, variant)
    }

    /// Draws an input set of the given variant from the secret seed.
    pub fn draw_variant(
        &mut self,
        purpose: &str,
        index: u64,
        variant: InputVariant,
    ) -> Step<T::Inputs> {
        self.target
            .draw(self.plan.seed, purpose, index, variant)
            .map_err(Stop::Infra)
    }

    /// Checks after a candidate run: inputs unchanged.
    fn check_inputs(&mut self, inputs: &T::Inputs, label: &str) -> Step<()> {
        let tampered = match self.target.tampered(inputs) {
            Ok(t) => t,
            Err(f) => return Err(self.failure_verdict(f, label)),
        };
        if tampered.is_empty() {
            return Ok(());
        }
        self.evidence.deciding_trial = Some(label.to_string());
        self.evidence.tampered_inputs = tampered.clone();
        Err(Box::new(self.verdict(
            Verdict::InputTampered,
            format!(
                "{label}: input tampered: {} changed during the run",
                tampered.join(", ")
            ),
        ))
        .into())
    }

    /// Keeps the last run's outputs in `slot` and fails on unwritten elements.
    pub fn kept_outputs(&mut self, label: &str, slot: usize) -> Step<T::Kept> {
        let (kept, unwritten) = match self.target.keep(slot) {
            Ok(k) => k,
            Err(f) => return Err(self.failure_verdict(f, label)),
        };
        self.fail_unwritten(unwritten, label)?;
        Ok(kept)
    }

    /// Runs the candidate once on `inputs` with the per-run checks (fault, timeout,
    /// tampered inputs, unwritten outputs) and keeps nothing (warm-up runs); returns the
    /// backend's elapsed µs ([`Target::run`]).
    pub fn warmup_run(&mut self, inputs: &T::Inputs, label: &str) -> Step<f64> {
        let us = match self.target.run(inputs) {
            Ok(us) => us,
            Err(f) => return Err(self.failure_verdict(f, label)),
        };
        self.check_inputs(inputs, label)?;
        let unwritten = match self.target.unwritten() {
            Ok(u) => u,
            Err(f) => return Err(self.failure_verdict(f, label)),
        };
        self.fail_unwritten(unwritten, label)?;
        Ok(us)
    }

    fn fail_unwritten(&mut self, unwritten: Vec<Unwritten>, label: &str) -> Step<()> {
        if unwritten.is_empty() {
            return Ok(());
        }
        self.evidence.deciding_trial = Some(label.to_string());
        let desc: Vec<String> = unwritten
            .iter()
            .map(|(n, c, f)| format!("{n}: {c} elements unwritten (first at {f:?})"))
            .collect();
        self.evidence.unwritten = unwritten;
        Err(Box::new(self.verdict(
            Verdict::IncompleteOutput,
            format!("{label}: {}", desc.join("; ")),
        ))
        .into())
    }

    /// Runs the candidate once on `inputs` with the per-run checks (fault, timeout,
    /// tampered inputs, unwritten outputs); keeps the outputs in `slot`. Returns them and
    /// the elapsed µs.
    pub fn candidate_run(
        &mut self,
        inputs: &T::Inputs,
        label: &str,
        slot: usize,
    ) -> Step<(T::Kept, f64)> {
        let us = match self.target.run(inputs) {
            Ok(us) => us,
            Err(f) => return Err(self.failure_verdict(f, label)),
        };
        self.check_inputs(inputs, label)?;
        let out = self.kept_outputs(label, slot)?;
        Ok((out, us))
    }

    /// One timed sample on `sets` with the per-run checks of every run (inputs unchanged,
    /// and where outputs are cheap to read, every output written); returns the kept
    /// outputs of each run (slot 0, only where they are cheap; `None` otherwise) and the
    /// sample's µs.
    pub fn candidate_sample(
        &mut self,
        sets: &[T::Inputs],
        label: &str,
    ) -> Step<(Vec<Option<T::Kept>>, f64)> {
        let us = match self.target.sample(sets) {
            Ok(us) => us,
            Err(f) => return Err(self.failure_verdict(f, label)),
        };
        let mut kept = Vec::with_capacity(sets.len());
        for (rep, inputs) in sets.iter().enumerate() {
            let label = rep_label(label, rep, sets.len());
            self.target.select_rep(rep);
            self.check_inputs(inputs, &label)?;
            kept.push(if self.target.outputs_every_sample() {
                Some(self.kept_outputs(&label, 0)?)
            } else {
                None
            });
        }
        self.target.select_rep(0);
        Ok((kept, us))
    }

    /// `implausible_time` when the median is below the roofline floor, else `ok`.
    fn floor_check(&self, stats: &TimingStats) -> Evaluation {
        let r = self.problem.roofline;
        let mut floor_s = 0.0f64;
        if self.plan.peak_bytes_per_s > 0.0 && r.min_bytes > 0 {
            floor_s = floor_s.max(r.min_bytes as f64 / self.plan.peak_bytes_per_s);
        }
        if self.plan.peak_flops > 0.0 && r.flops > 0 {
            floor_s = floor_s.max(r.flops as f64 / self.plan.peak_flops);
        }
        let median_s = stats.median_us * 1e-6;
        if floor_s > 0.0 && median_s < floor_s {
            return self.verdict(
                Verdict::ImplausibleTime,
                format!(
                    "median {:.3} us is below the roofline floor of {:.3} us: the work cannot have been done",
                    stats.median_us,
                    floor_s * 1e6
                ),
            );
        }
        self.verdict(
            Verdict::Ok,
            format!(
                "correct on {} trials; median {:.2} us over {} samples (rse {:.2} %)",
                self.evidence.trials_passed,
                stats.median_us,
                stats.n,
                stats.rse * 100.0
            ),
        )
    }
}

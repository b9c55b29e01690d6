//! The evaluation contract of design guide §5, once, for every backend.
//!
//! A backend implements [`Target`]: a few mechanical steps (draw an input set from the
//! secret seed, run the trusted reference, run the candidate once, take one timed sample,
//! report which inputs changed, read the outputs). [`Session`] drives them and owns every
//! verdict: correctness trials on fresh inputs (plus the shifted/scaled trial), poisoned
//! outputs, the input tamper check, run-twice determinism, error metrics against the
//! reference, the precision tier, then timing ([`timing`]) and the roofline floor check.
//!
//! Backends: `host::evaluate::HostTarget` (C in runner processes) and
//! `cuda::target::GpuTarget` (CUDA kernels on the worker's GPU).

pub mod timing;

use std::time::Instant;

use kiln_types::{
    Dtype, ErrorMetrics, EvalPlan, Evaluation, Evidence, ProblemSpec, Role, TimingStats, Verdict,
};

use crate::host::compare;

/// Output tensors: (name, bytes).
pub type Outputs = Vec<(String, Vec<u8>)>;

/// Why one run of candidate code did not finish normally.
#[derive(Debug, Clone, PartialEq)]
pub enum RunFailure {
    /// It ran past the run timeout (the detail says what was done about it).
    Timeout(String),
    /// It crashed, was killed, or faulted (the detail names the fault).
    Fault(String),
    /// The launch could not be made (found only when launching).
    InvalidLaunch(String),
}

/// The mechanics a backend provides; [`Session`] turns their results into verdicts.
///
/// Every method that runs candidate code first poisons the outputs and zeroes the
/// candidate's scratch, and makes `inputs` the current input set.
pub trait Target {
    /// One drawn input set (host: the bytes; GPU: the seeds and the hashes).
    type Inputs;
    /// `host` or `cuda`.
    fn backend(&self) -> &'static str;
    /// Draws an input set from the secret `seed`, keyed by (`purpose`, `index`); the
    /// shifted/scaled distribution for float inputs that allow it when `shifted`.
    /// `Err` is an infrastructure failure.
    fn draw(
        &mut self,
        seed: u64,
        purpose: &str,
        index: u64,
        shifted: bool,
    ) -> Result<Self::Inputs, String>;
    /// Runs the trusted reference on `inputs`; returns its outputs, copied into the worker,
    /// and scrubs them from wherever candidate code could reach them. `Err`: infrastructure.
    fn reference(&mut self, inputs: &Self::Inputs) -> Result<Outputs, String>;
    /// Runs the candidate once, untimed by the contract; returns the backend's elapsed
    /// time in microseconds (host: wall time between go and done; GPU: 0).
    fn run(&mut self, inputs: &Self::Inputs) -> Result<f64, RunFailure>;
    /// One timed sample of the candidate, in microseconds.
    fn sample(&mut self, inputs: &Self::Inputs) -> Result<f64, RunFailure>;
    /// Names of the inputs the last candidate run changed.
    fn tampered(&mut self, inputs: &Self::Inputs) -> Result<Vec<String>, RunFailure>;
    /// Outputs of the last candidate run.
    fn outputs(&mut self) -> Result<Outputs, RunFailure>;
    /// Elements of an output still holding this backend's poison: (count, first indices).
    fn unwritten(&self, bytes: &[u8], dtype: Dtype) -> (u64, Vec<u64>);
    /// The timer's fixed overhead per sample, microseconds (subtracted from samples).
    fn overhead(&mut self) -> Result<f64, RunFailure>;
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
        }
    }

    /// Runs the whole contract. `Err` is an infrastructure failure, never the candidate's.
    pub fn run(&mut self) -> Result<Evaluation, String> {
        match self.run_contract() {
            Ok(e) | Err(Stop::Verdict(e)) => Ok(*e),
            Err(Stop::Infra(msg)) => Err(msg),
        }
    }

    /// An evaluation with the evidence gathered so far.
    pub fn verdict(&self, verdict: Verdict, message: String) -> Evaluation {
        let mut evidence = self.evidence.clone();
        evidence.output_excerpt = self.target.output_excerpt();
        Evaluation {
            verdict,
            message,
            backend: self.target.backend().into(),
            compile: None,
            evidence,
            timing: None,
            tier: None,
            telemetry: self.telemetry.clone(),
        }
    }

    /// The verdict for a run that did not finish.
    pub fn failure_verdict(&mut self, failure: RunFailure, during: &str) -> Box<Evaluation> {
        self.evidence.deciding_trial = Some(during.to_string());
        Box::new(match failure {
            RunFailure::Timeout(detail) => {
                self.verdict(Verdict::Timeout, format!("{during}: {detail}"))
            }
            RunFailure::Fault(fault) => {
                self.evidence.fault = Some(fault.clone());
                self.verdict(Verdict::RuntimeFault, format!("{during}: {fault}"))
            }
            RunFailure::InvalidLaunch(why) => {
                self.verdict(Verdict::InvalidLaunch, format!("{during}: {why}"))
            }
        })
    }

    fn run_contract(&mut self) -> Step<Box<Evaluation>> {
        let t0 = Instant::now();
        let worst_rel_l2 = self.correctness()?;
        tracing::debug!("correctness took {:?}", t0.elapsed());
        let tier = compare::tier(worst_rel_l2);
        if let Some(req) = self.problem.required_tier
            && tier > req
        {
            let mut e = self.verdict(
                Verdict::WrongAnswer,
                format!("delivers {tier:?} precision (relative L2 {worst_rel_l2:.2e}); the problem requires {req:?}"),
            );
            e.tier = Some(tier);
            return Err(Box::new(e).into());
        }
        let t1 = Instant::now();
        let stats = timing::time(self)?;
        tracing::debug!("timing took {:?}", t1.elapsed());
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
            let inputs = self.draw("trial", u64::from(t), is_shifted)?;
            let want = self.reference_outputs(&inputs)?;
            let a = self.candidate_run(&inputs, &format!("{label}, run 1"))?.0;
            let b = self.candidate_run(&inputs, &format!("{label}, run 2"))?.0;
            self.evidence.trials_run += 1;
            let tol = self.problem.tolerance;
            let ma = self.metrics(&a, &want);
            let mb = self.metrics(&b, &want);
            let diffs: u64 = a
                .iter()
                .zip(&b)
                .map(|((n, x), (_, y))| compare::bitwise_diffs(x, y, self.dtype(n)))
                .sum();
            self.evidence.bitwise_diffs += diffs;
            let a_ok = ma.iter().all(|m| m.mismatches == 0);
            let b_ok = mb.iter().all(|m| m.mismatches == 0);
            let agree = diffs == 0
                || a.iter()
                    .zip(&b)
                    .all(|((n, x), (_, y))| compare::agree(x, y, self.dtype(n), tol));
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

    /// The dtype of a tensor (f32 if unknown).
    pub fn dtype(&self, name: &str) -> Dtype {
        self.problem.tensor(name).map_or(Dtype::F32, |t| t.dtype)
    }

    /// Error metrics of every output.
    pub fn metrics(&self, got: &Outputs, want: &Outputs) -> Vec<ErrorMetrics> {
        got.iter()
            .zip(want)
            .map(|((name, g), (_, w))| {
                compare::metrics(name, g, w, self.dtype(name), self.problem.tolerance)
            })
            .collect()
    }

    /// Draws an input set from the secret seed.
    pub fn draw(&mut self, purpose: &str, index: u64, shifted: bool) -> Step<T::Inputs> {
        self.target
            .draw(self.plan.seed, purpose, index, shifted)
            .map_err(Stop::Infra)
    }

    /// Runs the trusted reference on `inputs` and returns its outputs.
    pub fn reference_outputs(&mut self, inputs: &T::Inputs) -> Step<Outputs> {
        let out = self
            .target
            .reference(inputs)
            .map_err(|e| Stop::Infra(format!("the reference kernel {e}")))?;
        for (name, bytes) in &out {
            if self.target.unwritten(bytes, self.dtype(name)).0 > 0 {
                return Err(Stop::Infra(format!(
                    "the reference kernel left {name} partly unwritten"
                )));
            }
        }
        Ok(out)
    }

    /// Checks after a candidate run: inputs unchanged.
    fn check_inputs(&mut self, inputs: &T::Inputs, label: &str) -> Step<()> {
        let tampered = match self.target.tampered(inputs) {
            Ok(t) => t,
            Err(f) => return Err(self.failure_verdict(f, label).into()),
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

    /// Reads the last run's outputs and fails on unwritten elements.
    pub fn checked_outputs(&mut self, label: &str) -> Step<Outputs> {
        let out = match self.target.outputs() {
            Ok(o) => o,
            Err(f) => return Err(self.failure_verdict(f, label).into()),
        };
        let unwritten: Vec<(String, u64, Vec<u64>)> = out
            .iter()
            .filter_map(|(name, bytes)| {
                let (n, first) = self.target.unwritten(bytes, self.dtype(name));
                (n > 0).then(|| (name.clone(), n, first))
            })
            .collect();
        if unwritten.is_empty() {
            return Ok(out);
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
    /// tampered inputs, unwritten outputs). Returns the outputs and the elapsed µs.
    pub fn candidate_run(&mut self, inputs: &T::Inputs, label: &str) -> Step<(Outputs, f64)> {
        let us = match self.target.run(inputs) {
            Ok(us) => us,
            Err(f) => return Err(self.failure_verdict(f, label).into()),
        };
        self.check_inputs(inputs, label)?;
        let out = self.checked_outputs(label)?;
        Ok((out, us))
    }

    /// One timed sample with the per-run checks; outputs only where they are cheap.
    pub fn candidate_sample(
        &mut self,
        inputs: &T::Inputs,
        label: &str,
    ) -> Step<(Option<Outputs>, f64)> {
        let us = match self.target.sample(inputs) {
            Ok(us) => us,
            Err(f) => return Err(self.failure_verdict(f, label).into()),
        };
        self.check_inputs(inputs, label)?;
        let out = if self.target.outputs_every_sample() {
            Some(self.checked_outputs(label)?)
        } else {
            None
        };
        Ok((out, us))
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

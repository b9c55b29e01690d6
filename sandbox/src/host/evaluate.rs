//! The evaluation contract of design guide §5 for the host backend: correctness trials on
//! fresh inputs from the secret seed (plus the shifted/scaled trial), poisoned outputs,
//! input tamper checks, run-twice determinism, error metrics against the reference, the
//! precision tier; then timing (see [`super::timing`]) and the roofline floor check.
//!
//! The reference and the candidate run in two separate runners with separate memfds: the
//! reference's outputs are copied into this (trusted) process, compared after the
//! candidate has been stopped, and poisoned again in the reference's buffers afterwards.

use std::path::Path;
use std::time::Duration;

use kiln_types::{
    Candidate, ErrorMetrics, EvalPlan, Evaluation, Evidence, ProblemSpec, Role, TimingStats,
    Verdict,
};

use super::compare;
use super::data;
use super::layout::{self, Kind, Layout};
use super::runner_ctl::{RunEnd, Runner, RunnerConfig};
use crate::protocol::RunLimits;

/// One drawn input set: (tensor name, bytes, blake3 of the bytes).
pub type Inputs = Vec<(String, Vec<u8>, blake3::Hash)>;
/// Output tensors: (name, bytes).
pub type Outputs = Vec<(String, Vec<u8>)>;

/// What the worker hands to [`evaluate`].
pub struct Job<'a> {
    /// The problem.
    pub problem: &'a ProblemSpec,
    /// The candidate.
    pub candidate: &'a Candidate,
    /// The plan (secret seed, trials, stop rule).
    pub plan: &'a EvalPlan,
    /// Runner limits.
    pub limits: &'a RunLimits,
    /// The reference's artifact.
    pub reference_artifact: &'a [u8],
    /// The candidate's artifact.
    pub candidate_artifact: &'a [u8],
    /// kiln-worker's own path (runners are exec'd from it).
    pub exe: &'a Path,
    /// Tag for the runners' argv.
    pub tag: &'a str,
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
pub struct Session<'a> {
    /// The problem.
    pub problem: &'a ProblemSpec,
    /// The plan.
    pub plan: &'a EvalPlan,
    /// The reference runner.
    pub reference: Runner,
    /// The candidate runner.
    pub candidate: Runner,
    /// Evidence gathered so far.
    pub evidence: Evidence,
    /// Per-run wall limit.
    pub run_timeout: Duration,
}

/// Runs the whole contract. `Err` is an infrastructure failure (broken reference, no
/// scratch space), never the candidate's fault.
pub fn evaluate(job: Job) -> Result<Evaluation, String> {
    let problem = job.problem;
    let ref_ks = problem
        .reference
        .get("host")
        .ok_or_else(|| format!("problem {} has no host reference", problem.name))?;
    let ref_layout =
        Layout::new(&problem.tensors, &ref_ks.scratch).map_err(|e| format!("reference: {e}"))?;
    let ref_calls =
        layout::resolve(&ref_ks.launches, &ref_layout).map_err(|e| format!("reference: {e}"))?;
    let cand_layout = match Layout::new(&problem.tensors, &job.candidate.scratch) {
        Ok(l) => l,
        Err(e) => return Ok(early(Verdict::InvalidLaunch, e)),
    };
    let cand_calls = match layout::resolve(&job.candidate.launches, &cand_layout) {
        Ok(c) => c,
        Err(e) => return Ok(early(Verdict::InvalidLaunch, e)),
    };
    let dir = std::env::current_dir().map_err(|e| format!("scratch: {e}"))?;
    let (ref_path, cand_path) = (dir.join("reference.so"), dir.join("candidate.so"));
    std::fs::write(&ref_path, job.reference_artifact)
        .map_err(|e| format!("write reference artifact: {e}"))?;
    std::fs::write(&cand_path, job.candidate_artifact)
        .map_err(|e| format!("write candidate artifact: {e}"))?;

    let run_timeout = Duration::from_millis(job.plan.run_timeout_ms.max(1));
    let base = RunnerConfig {
        exe: job.exe,
        tag: job.tag,
        artifact: &ref_path,
        as_bytes: job.limits.memory_limit_bytes,
        cpu_s: job.limits.cpu_limit_s,
        output_limit: job.limits.output_limit_bytes,
        load_timeout: Duration::from_secs(10).max(run_timeout),
    };
    let (reference, ready) = Runner::spawn(&base, ref_layout, ref_calls)?;
    match ready {
        Ok(r) if r.error.is_none() && r.missing.is_empty() => {}
        Ok(r) => {
            return Err(format!(
                "reference failed to load: {:?} missing {:?}",
                r.error, r.missing
            ));
        }
        Err(end) => return Err(format!("reference failed to load: {end:?}")),
    }
    let cand_cfg = RunnerConfig {
        artifact: &cand_path,
        ..base
    };
    let (candidate, ready) = Runner::spawn(&cand_cfg, cand_layout, cand_calls)?;
    let mut session = Session {
        problem,
        plan: job.plan,
        reference,
        candidate,
        evidence: Evidence::default(),
        run_timeout,
    };
    match ready {
        Ok(r) if !r.missing.is_empty() => {
            return Ok(session.verdict(
                Verdict::InvalidLaunch,
                format!(
                    "unknown function{} {}: dlsym found no such symbol in the artifact",
                    if r.missing.len() > 1 { "s" } else { "" },
                    r.missing.join(", ")
                ),
            ));
        }
        Ok(r) if r.error.is_some() => {
            let e = r.error.unwrap_or_default();
            session.evidence.fault = Some(e.clone());
            return Ok(session.verdict(
                Verdict::RuntimeFault,
                format!("the artifact failed to load: {e}"),
            ));
        }
        Ok(_) => {}
        Err(end) => return Ok(*session.run_end_verdict(end, "loading the artifact")),
    }
    match session.run_contract() {
        Ok(e) | Err(Stop::Verdict(e)) => Ok(*e),
        Err(Stop::Infra(msg)) => Err(msg),
    }
}

fn early(v: Verdict, msg: String) -> Evaluation {
    Evaluation::early(v, "host", msg)
}

impl Session<'_> {
    /// An evaluation with the evidence gathered so far.
    pub fn verdict(&self, verdict: Verdict, message: String) -> Evaluation {
        let mut evidence = self.evidence.clone();
        evidence.output_excerpt = self.candidate.output_excerpt();
        Evaluation {
            verdict,
            message,
            backend: "host".into(),
            compile: None,
            evidence,
            timing: None,
            tier: None,
            telemetry: None,
        }
    }

    /// The verdict for a run that did not answer `D`.
    pub fn run_end_verdict(&mut self, end: RunEnd, during: &str) -> Box<Evaluation> {
        self.evidence.deciding_trial = Some(during.to_string());
        Box::new(match end {
            RunEnd::Timeout => self.verdict(
                Verdict::Timeout,
                format!(
                    "{during}: no answer within the run timeout of {} ms; runner killed",
                    self.run_timeout.as_millis()
                ),
            ),
            RunEnd::Died(fault) => {
                self.evidence.fault = Some(fault.clone());
                self.verdict(Verdict::RuntimeFault, format!("{during}: {fault}"))
            }
            RunEnd::Flood(n) => {
                let fault =
                    format!("output flood: {n} bytes written to stdout/stderr; runner killed");
                self.evidence.fault = Some(fault.clone());
                self.verdict(Verdict::RuntimeFault, format!("{during}: {fault}"))
            }
            RunEnd::Done(_) => self.verdict(Verdict::Ok, String::new()),
        })
    }

    fn run_contract(&mut self) -> Step<Box<Evaluation>> {
        let t0 = std::time::Instant::now();
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
        let t1 = std::time::Instant::now();
        let stats = super::timing::time(self)?;
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
            let inputs = self.draw("trial", u64::from(t), is_shifted);
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
                .map(|((_, x), (_, y))| compare::bitwise_diffs(x, y, self.dtype(&a[0].0)))
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

    fn dtype(&self, name: &str) -> kiln_types::Dtype {
        self.problem
            .tensor(name)
            .map_or(kiln_types::Dtype::F32, |t| t.dtype)
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
    pub fn draw(&self, purpose: &str, index: u64, shifted: bool) -> Inputs {
        let mut rng = data::rng_for(self.plan.seed, purpose, index);
        self.problem
            .tensors
            .iter()
            .filter(|t| t.role == Role::Input)
            .map(|t| {
                let mut bytes = vec![0u8; t.bytes() as usize];
                let init = if shifted && t.shifted_trial && t.dtype.is_float() {
                    data::SHIFTED
                } else {
                    t.init
                };
                data::fill(&mut bytes, t.dtype, init, &mut rng);
                let hash = blake3::hash(&bytes);
                (t.name.clone(), bytes, hash)
            })
            .collect()
    }

    /// Writes inputs, poisons outputs and zeroes scratch of a runner.
    fn prepare(runner: &mut Runner, inputs: &Inputs) {
        for (name, bytes, _) in inputs {
            runner.bytes_mut(name).copy_from_slice(bytes);
        }
        let buffers = runner.layout.buffers.clone();
        for b in buffers {
            match b.kind {
                Kind::Output => data::poison(runner.bytes_mut(&b.name), b.dtype),
                Kind::Scratch => runner.bytes_mut(&b.name).fill(0),
                Kind::Input => {}
            }
        }
    }

    fn outputs(runner: &Runner) -> Outputs {
        runner
            .layout
            .buffers
            .iter()
            .filter(|b| b.kind == Kind::Output)
            .map(|b| (b.name.clone(), runner.bytes(&b.name).to_vec()))
            .collect()
    }

    /// Runs the trusted reference on `inputs` and returns its outputs (then scrubs them).
    pub fn reference_outputs(&mut self, inputs: &Inputs) -> Step<Outputs> {
        Self::prepare(&mut self.reference, inputs);
        let end = self
            .reference
            .run(b'G', self.run_timeout.max(Duration::from_secs(10)) * 4);
        let infra = |what: String| Stop::Infra(format!("the reference kernel {what}"));
        if !matches!(end, RunEnd::Done(_)) {
            return Err(infra(format!("did not finish: {end:?}")));
        }
        let out = Self::outputs(&self.reference);
        for (name, bytes) in &out {
            if data::unwritten(bytes, self.dtype(name)).0 > 0 {
                return Err(infra(format!("left {name} partly unwritten")));
            }
        }
        let buffers = self.reference.layout.buffers.clone();
        for b in buffers.iter().filter(|b| b.kind == Kind::Output) {
            data::poison(self.reference.bytes_mut(&b.name), b.dtype);
        }
        Ok(out)
    }

    /// Runs the candidate once on `inputs` and applies the per-run checks (fault, timeout,
    /// tampered inputs, unwritten outputs). Returns the outputs and the time.
    pub fn candidate_run(&mut self, inputs: &Inputs, label: &str) -> Step<(Outputs, Duration)> {
        Self::prepare(&mut self.candidate, inputs);
        let elapsed = match self.candidate.run(b'G', self.run_timeout) {
            RunEnd::Done(d) => d,
            end => return Err(self.run_end_verdict(end, label).into()),
        };
        let tampered: Vec<String> = inputs
            .iter()
            .filter(|(name, _, hash)| blake3::hash(self.candidate.bytes(name)) != *hash)
            .map(|(name, _, _)| name.clone())
            .collect();
        if !tampered.is_empty() {
            self.evidence.deciding_trial = Some(label.to_string());
            self.evidence.tampered_inputs = tampered.clone();
            return Err(Box::new(self.verdict(
                Verdict::InputTampered,
                format!(
                    "{label}: input tampered: {} changed during the run",
                    tampered.join(", ")
                ),
            ))
            .into());
        }
        let out = Self::outputs(&self.candidate);
        let unwritten: Vec<(String, u64, Vec<u64>)> = out
            .iter()
            .filter_map(|(name, bytes)| {
                let (n, first) = data::unwritten(bytes, self.dtype(name));
                (n > 0).then(|| (name.clone(), n, first))
            })
            .collect();
        if !unwritten.is_empty() {
            self.evidence.deciding_trial = Some(label.to_string());
            let desc: Vec<String> = unwritten
                .iter()
                .map(|(n, c, f)| format!("{n}: {c} elements unwritten (first at {f:?})"))
                .collect();
            self.evidence.unwritten = unwritten;
            return Err(Box::new(self.verdict(
                Verdict::IncompleteOutput,
                format!("{label}: {}", desc.join("; ")),
            ))
            .into());
        }
        Ok((out, elapsed))
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

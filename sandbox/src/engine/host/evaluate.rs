//! The host backend's side of the evaluation contract: [`HostTarget`] implements
//! [`crate::engine::contract::Target`] over two runner processes, and [`evaluate`] sets them up
//! and hands them to the generic [`crate::engine::contract::Session`], which owns the verdicts.
//!
//! The reference and the candidate run in two separate runners with separate memfds: the
//! reference's outputs are copied into this (trusted) process, compared after the
//! candidate has been stopped, and poisoned again in the reference's buffers afterwards.
//! A problem whose reference is PyTorch ([`TorchAsk`]) has no reference runner: between
//! candidate runs this process asks its caller, whose trusted reference runner computes
//! the outputs from the same input bytes (`Response::Reference`).
//!
//! The candidate's layout has as many slots as fit in [`REP_SLOT_BYTES`] (at most
//! `layout::MAX_SLOTS`), so a kernel too short to time one run at a time can run several
//! times within one timed sample, each run on its own fresh inputs in its own slot.

use std::path::Path;
use std::time::Duration;

use kiln_types::{Candidate, Dtype, EvalPlan, Evaluation, ProblemSpec, Role, Verdict};

use super::layout::{self, Kind, Layout};
use super::runner_ctl::{RunEnd, Runner, RunnerConfig};
use crate::engine::contract::compare;
use crate::engine::contract::data;
use crate::engine::contract::{
    CheckError, InputVariant, Outputs, RunFailure, Session, Target, Unwritten,
};
use crate::protocol::RunLimits;

/// One drawn input set: (tensor name, bytes).
pub type Inputs = Vec<(String, Vec<u8>)>;

/// Memory for the candidate's extra slots (copies of every buffer, for repeated runs
/// within one timed sample), bytes.
pub const REP_SLOT_BYTES: u64 = 16 << 20;

/// Asks the caller for the torch reference's outputs on an input set: each output
/// tensor's bytes (problem order) and how the reference computed.
pub type TorchAsk<'a> = dyn FnMut(&Inputs) -> Result<(Vec<Vec<u8>>, String), String> + 'a;

/// What the worker hands to [`evaluate`].
pub struct Job<'a, 'b> {
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
    /// The torch reference, when the problem has no host kernel.
    pub torch: Option<&'a mut TorchAsk<'b>>,
}

/// The host backend's mechanics: a reference runner and a candidate runner, each with its
/// own memfd, so the reference's outputs are never in memory the candidate can reach.
pub struct HostTarget<'a, 'b> {
    problem: &'a ProblemSpec,
    /// The reference runner (a host kernel), or the caller's torch reference.
    pub reference: Reference<'a, 'b>,
    /// The candidate runner.
    pub candidate: Runner,
    /// Per-run wall limit.
    pub run_timeout: Duration,
    /// The candidate's slot that `tampered` and `keep` look at (see `select_rep`).
    rep: usize,
    /// How the candidate runs: its C artifact, or its hosted python.
    trust: kiln_types::TrustMode,
    /// For a hosted file: kiln's echo runner, whose round trips are the timer's overhead
    /// (the file's python answers `E` itself, and could slow it to have more subtracted).
    echo: Option<Runner>,
}

/// Where the reference's outputs come from.
pub enum Reference<'a, 'b> {
    /// The problem's host kernel in its own runner.
    Kernel(Runner),
    /// The caller's torch reference runner; the precision it last reported.
    Torch(&'a mut TorchAsk<'b>, String),
}

/// What every runner of one evaluation on the host shares: the evaluation's folder, the
/// candidate's layout, the reference (its runner started, or the caller's torch runner)
/// and the limits its runners start under.
pub struct Prepared<'a, 'b> {
    /// The candidate's buffers (as many slots as fit in [`REP_SLOT_BYTES`]).
    pub layout: Layout,
    /// Where the reference's outputs come from.
    pub reference: Reference<'a, 'b>,
    /// The evaluation's folder (the worker's scratch).
    pub dir: std::path::PathBuf,
    /// The candidate's artifact's path there.
    pub cand_path: std::path::PathBuf,
    /// Per-run wall limit.
    pub run_timeout: Duration,
}

impl Prepared<'_, '_> {
    /// The candidate runner's settings (`job`'s limits, its artifact at `cand_path`).
    pub fn runner_config<'c>(&'c self, job: &JobLimits<'c>) -> RunnerConfig<'c> {
        runner_config(job, &self.cand_path, self.run_timeout)
    }
}

/// A runner's settings: `job`'s limits, the artifact at `artifact`, and a load limit of at
/// least 10 s.
fn runner_config<'c>(
    job: &JobLimits<'c>,
    artifact: &'c Path,
    run_timeout: Duration,
) -> RunnerConfig<'c> {
    RunnerConfig {
        exe: job.exe,
        tag: job.tag,
        artifact,
        as_bytes: job.limits.memory_limit_bytes,
        cpu_s: job.limits.cpu_limit_s,
        output_limit: job.limits.output_limit_bytes,
        load_timeout: Duration::from_secs(10).max(run_timeout),
    }
}

/// The parts of a [`Job`] a runner's settings are made from.
#[derive(Clone, Copy)]
pub struct JobLimits<'a> {
    /// Runner limits.
    pub limits: &'a RunLimits,
    /// kiln-worker's own path.
    pub exe: &'a Path,
    /// Tag for the runners' argv.
    pub tag: &'a str,
}

impl<'a> Job<'a, '_> {
    /// The parts of the job a runner's settings are made from.
    pub fn runner_limits(&self) -> JobLimits<'a> {
        JobLimits {
            limits: self.limits,
            exe: self.exe,
            tag: self.tag,
        }
    }
}

/// Lays the candidate's buffers out and puts the reference in place (its runner started
/// and loaded). `Ok(Err(e))` is the candidate's verdict already (buffers it cannot have);
/// `Err` is an infrastructure failure (broken reference, no scratch space).
pub fn prepare<'a, 'b>(job: Job<'a, 'b>) -> Result<Result<Prepared<'a, 'b>, Evaluation>, String> {
    let problem = job.problem;
    let ref_ks = problem.reference.kernel(kiln_types::BackendKind::Host);
    if ref_ks.is_none() && (problem.reference.torch.is_none() || job.torch.is_none()) {
        return Err(format!(
            "problem {} has no host reference (and no torch reference runner)",
            problem.name
        ));
    }
    let layout = match Layout::new(&problem.tensors, &job.candidate.scratch) {
        Ok(l) => l.with_slots_within(REP_SLOT_BYTES),
        Err(e) => return Ok(Err(early(Verdict::InvalidLaunch, e))),
    };
    let dir = std::env::current_dir().map_err(|e| format!("scratch: {e}"))?;
    let (ref_path, cand_path) = (dir.join("reference.so"), dir.join("candidate.so"));
    let run_timeout = Duration::from_millis(job.plan.run_timeout_ms.max(1));
    let reference = match (ref_ks, job.torch) {
        (Some(ref_ks), _) => {
            let ref_layout = Layout::new(&problem.tensors, &ref_ks.scratch)
                .map_err(|e| format!("reference: {e}"))?;
            let ref_calls = layout::resolve(&ref_ks.launches, &ref_layout)
                .map_err(|e| format!("reference: {e}"))?;
            std::fs::write(&ref_path, job.reference_artifact)
                .map_err(|e| format!("write reference artifact: {e}"))?;
            let limits = JobLimits {
                limits: job.limits,
                exe: job.exe,
                tag: job.tag,
            };
            let cfg = runner_config(&limits, &ref_path, run_timeout);
            let (reference, ready) = Runner::spawn(&cfg, ref_layout, ref_calls)?;
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
            Reference::Kernel(reference)
        }
        (None, Some(ask)) => Reference::Torch(ask, String::new()),
        (None, None) => return Err("no reference".into()),
    };
    Ok(Ok(Prepared {
        layout,
        reference,
        dir,
        cand_path,
        run_timeout,
    }))
}

/// Runs a C candidate's whole contract. `Err` is an infrastructure failure (broken
/// reference, no scratch space), never the candidate's fault.
pub fn evaluate(job: Job) -> Result<Evaluation, String> {
    let (problem, candidate, plan) = (job.problem, job.candidate, job.plan);
    let (artifact, limits) = (job.candidate_artifact, job.runner_limits());
    let p = match prepare(job)? {
        Ok(p) => p,
        Err(e) => return Ok(e),
    };
    let calls = match layout::resolve(&candidate.launches, &p.layout) {
        Ok(c) => c,
        Err(e) => return Ok(early(Verdict::InvalidLaunch, e)),
    };
    std::fs::write(&p.cand_path, artifact).map_err(|e| format!("write candidate artifact: {e}"))?;
    let (runner, ready) = Runner::spawn(&p.runner_config(&limits), p.layout.clone(), calls)?;
    let target = HostTarget::new(problem, p, runner, kiln_types::TrustMode::Contract, None);
    let mut session = Session::new(problem, plan, target);
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
        Err(end) => return HostTarget::did_not_load(&mut session, end, "loading the artifact"),
    }
    let mut e = session.run()?;
    session.target.reference_note(&mut e);
    Ok(e)
}

/// An evaluation on the host backend that ended before any candidate code ran.
pub fn early(v: Verdict, msg: String) -> Evaluation {
    Evaluation::early(v, kiln_types::BackendKind::Host, msg)
}

impl<'a, 'b> HostTarget<'a, 'b> {
    /// The target over a started candidate runner and the reference of `p`; `echo` is
    /// kiln's echo runner, whose round trips are the timer's overhead where the
    /// candidate's runner is not kiln's own code (a hosted file's python).
    pub fn new(
        problem: &'a ProblemSpec,
        p: Prepared<'a, 'b>,
        candidate: Runner,
        trust: kiln_types::TrustMode,
        echo: Option<Runner>,
    ) -> Self {
        HostTarget {
            problem,
            reference: p.reference,
            candidate,
            run_timeout: p.run_timeout,
            rep: 0,
            trust,
            echo,
        }
    }

    /// The evaluation for a candidate runner that ended before it was ready (`during`
    /// says what it was doing): its verdict, or kiln's failure.
    pub fn did_not_load(
        session: &mut Session<'_, Self>,
        end: RunEnd,
        during: &str,
    ) -> Result<Evaluation, String> {
        let f = session.target.failure(end);
        match session.failure_verdict(f, during) {
            crate::engine::contract::Stop::Verdict(e) => Ok(*e),
            crate::engine::contract::Stop::Infra(why) => Err(why),
        }
    }

    /// A note on `e` of how a torch reference computed, if it said.
    pub fn reference_note(&self, e: &mut Evaluation) {
        if let Reference::Torch(_, precision) = &self.reference
            && !precision.is_empty()
        {
            e.evidence.notes.push(format!(
                "reference: the problem's PyTorch module, computed in {precision}"
            ));
        }
    }

    /// The contract's failure for a run that did not answer `D`.
    fn failure(&self, end: RunEnd) -> RunFailure {
        match end {
            RunEnd::Timeout => RunFailure::Timeout(format!(
                "no answer within the run timeout of {} ms; runner killed",
                self.run_timeout.as_millis()
            )),
            RunEnd::Died(fault) => RunFailure::Fault(fault),
            RunEnd::Flood(n) => RunFailure::Fault(format!(
                "output flood: {n} bytes written to stdout/stderr; runner killed"
            )),
            RunEnd::Done(_) => RunFailure::Fault("runner answered unexpectedly".into()),
        }
    }

    /// One empty round trip, µs: of kiln's echo runner for a hosted file, else of the
    /// candidate's runner (kiln's own code answers `E` there).
    fn empty_round_trip(&mut self) -> Result<f64, RunFailure> {
        let (runner, ours) = match self.echo.as_mut() {
            Some(echo) => (echo, true),
            None => (&mut self.candidate, false),
        };
        match runner.run(b'E', self.run_timeout) {
            RunEnd::Done(d) => Ok(d.as_secs_f64() * 1e6),
            end if ours => Err(RunFailure::Infra(format!("kiln's echo runner: {end:?}"))),
            end => Err(self.failure(end)),
        }
    }

    /// Writes inputs, poisons outputs and zeroes scratch of a runner's `slot`.
    fn prepare(runner: &mut Runner, slot: usize, inputs: &Inputs) {
        for (name, bytes) in inputs {
            runner.bytes_in_mut(slot, name).copy_from_slice(bytes);
        }
        let buffers = runner.layout.buffers.clone();
        for b in buffers {
            match b.kind {
                Kind::Output => data::poison(runner.bytes_in_mut(slot, &b.name), b.dtype),
                Kind::Scratch => runner.bytes_in_mut(slot, &b.name).fill(0),
                Kind::Input => {}
            }
        }
    }

    fn read_outputs(runner: &Runner, slot: usize) -> Outputs {
        runner
            .layout
            .buffers
            .iter()
            .filter(|b| b.kind == Kind::Output)
            .map(|b| (b.name.clone(), runner.bytes_in(slot, &b.name).to_vec()))
            .collect()
    }

    fn dtype(&self, name: &str) -> Dtype {
        self.problem.tensor(name).map_or(Dtype::F32, |t| t.dtype)
    }

    /// Runs the reference on `inputs`, copies its outputs into this process and poisons
    /// them again in the reference's runner (a torch reference: asks the caller).
    fn reference_outputs(&mut self, inputs: &Inputs) -> Result<Outputs, String> {
        let runner = match &mut self.reference {
            Reference::Kernel(r) => r,
            Reference::Torch(ask, precision) => {
                let (blobs, how) = ask(inputs)?;
                *precision = how;
                let names = self
                    .problem
                    .tensors
                    .iter()
                    .filter(|t| t.role == Role::Output)
                    .map(|t| t.name.clone());
                return Ok(names.zip(blobs).collect());
            }
        };
        Self::prepare(runner, 0, inputs);

        let end = runner.run(b'G', self.run_timeout.max(Duration::from_secs(10)) * 4);
        if !matches!(end, RunEnd::Done(_)) {
            return Err(format!("did not finish: {end:?}"));
        }
        let out = Self::read_outputs(runner, 0);
        // Check before scrubbing: the contract refuses a reference that left holes.
        let holes: Vec<String> = out
            .iter()
            .filter(|(name, bytes)| {
                let dtype = self.problem.tensor(name).map_or(Dtype::F32, |t| t.dtype);
                data::unwritten(bytes, dtype).0 > 0
            })
            .map(|(n, _)| n.clone())
            .collect();
        if let Some(name) = holes.first() {
            return Err(format!("left {name} partly unwritten"));
        }
        let buffers = runner.layout.buffers.clone();
        for b in buffers.iter().filter(|b| b.kind == Kind::Output) {
            data::poison(runner.bytes_mut(&b.name), b.dtype);
        }
        Ok(out)
    }

    fn go(&mut self, inputs: &Inputs) -> Result<f64, RunFailure> {
        self.rep = 0;
        Self::prepare(&mut self.candidate, 0, inputs);
        self.timed(b'G', 1)
    }

    /// Runs `cmd` (`G`: slot 0; `T`: slots `0..n`) and takes its time, µs. The run timeout
    /// applies to each run.
    fn timed(&mut self, cmd: u8, n: usize) -> Result<f64, RunFailure> {
        let end = if cmd == b'T' {
            let limit = self.run_timeout.saturating_mul(n.max(1) as u32);
            self.candidate.run_slots(n, limit)
        } else {
            self.candidate.run(cmd, self.run_timeout)
        };
        match end {
            RunEnd::Done(d) => Ok(d.as_secs_f64() * 1e6),
            end => Err(self.failure(end)),
        }
    }
}

/// Empty round trips used to measure the timer's overhead.
const OVERHEAD_ROUNDS: usize = 16;

impl Target for HostTarget<'_, '_> {
    type Inputs = Inputs;
    type Kept = Outputs;

    fn backend(&self) -> kiln_types::BackendKind {
        kiln_types::BackendKind::Host
    }

    fn trust(&self) -> kiln_types::TrustMode {
        self.trust
    }

    fn draw(
        &mut self,
        seed: u64,
        purpose: &str,
        index: u64,
        variant: InputVariant,
    ) -> Result<Inputs, String> {
        self.problem
            .tensors
            .iter()
            .filter(|t| t.role == Role::Input)
            .map(|t| {
                let mut bytes = vec![0u8; t.bytes() as usize];
                let s = data::tensor_seed(seed, purpose, index, &t.name);
                data::fill(&mut bytes, t.dtype, variant.init(t), s)
                    .map_err(|e| format!("input {}: {e}", t.name))?;
                Ok((t.name.clone(), bytes))
            })
            .collect()
    }

    fn keep(&mut self, _slot: usize) -> Result<(Outputs, Vec<Unwritten>), RunFailure> {
        let out = Self::read_outputs(&self.candidate, self.rep);
        let unwritten = out
            .iter()
            .filter_map(|(name, bytes)| {
                let (n, first) = data::unwritten(bytes, self.dtype(name));
                (n > 0).then(|| (name.clone(), n, first))
            })
            .collect();
        Ok((out, unwritten))
    }

    fn check(
        &mut self,
        inputs: &Inputs,
        kept: &[&Outputs],
        tol: kiln_types::Tolerance,
    ) -> Result<Vec<Vec<kiln_types::ErrorMetrics>>, CheckError> {
        let want = self.reference_outputs(inputs).map_err(CheckError::Infra)?;
        Ok(kept
            .iter()
            .map(|got| {
                got.iter()
                    .zip(&want)
                    .map(|((name, g), (_, w))| compare::metrics(name, g, w, self.dtype(name), tol))
                    .collect()
            })
            .collect())
    }

    fn diff(
        &mut self,
        a: &Outputs,
        b: &Outputs,
        tol: kiln_types::Tolerance,
    ) -> Result<(u64, bool), RunFailure> {
        let mut diffs = 0;
        let mut agree = true;
        for ((name, x), (_, y)) in a.iter().zip(b) {
            let dtype = self.dtype(name);
            let d = compare::bitwise_diffs(x, y, dtype);
            diffs += d;
            if d > 0 {
                agree &= compare::agree(x, y, dtype, tol);
            }
        }
        Ok((diffs, agree))
    }

    fn run(&mut self, inputs: &Inputs) -> Result<f64, RunFailure> {
        self.go(inputs)
    }

    fn sample(&mut self, sets: &[Inputs]) -> Result<f64, RunFailure> {
        if sets.len() <= 1 {
            return match sets.first() {
                Some(inputs) => self.go(inputs),
                None => Err(RunFailure::Fault(
                    "internal: a sample with no inputs".into(),
                )),
            };
        }
        if sets.len() > self.reps_max() {
            return Err(RunFailure::Fault(format!(
                "internal: {} runs in one sample, the runner has {} slots",
                sets.len(),
                self.reps_max()
            )));
        }
        for (slot, inputs) in sets.iter().enumerate() {
            Self::prepare(&mut self.candidate, slot, inputs);
        }
        self.rep = 0;
        self.timed(b'T', sets.len())
    }

    fn reps_max(&self) -> usize {
        self.candidate.layout.slots as usize
    }

    fn select_rep(&mut self, rep: usize) {
        self.rep = rep.min(self.reps_max().saturating_sub(1));
    }

    fn resolution_us(&self) -> f64 {
        crate::jail::sys::monotonic_resolution()
            .map_or(1e-3, |d| d.as_secs_f64() * 1e6)
            .max(1e-3)
    }

    /// The host timing has no cache flush to leave out: a plain sample is the same timed
    /// round trip, without rewriting the (current) inputs or poisoning the outputs first.
    fn plain_sample(&mut self, _inputs: &Inputs) -> Result<f64, RunFailure> {
        self.rep = 0;
        self.timed(b'G', 1)
    }

    /// Compared with the drawn bytes themselves (cheaper than hashing both).
    fn tampered(&mut self, inputs: &Inputs) -> Result<Vec<String>, RunFailure> {
        Ok(inputs
            .iter()
            .filter(|(name, bytes)| self.candidate.bytes_in(self.rep, name) != bytes.as_slice())
            .map(|(name, _)| name.clone())
            .collect())
    }

    fn overhead(&mut self) -> Result<f64, RunFailure> {
        let mut empty = Vec::with_capacity(OVERHEAD_ROUNDS);
        for _ in 0..OVERHEAD_ROUNDS {
            empty.push(self.empty_round_trip()?);
        }
        // The smallest empty round trip is the fixed part of the overhead: every sample
        // carries at least that much. Subtracting the median instead drove half the samples
        // of a ~1 µs kernel to zero (and its median to 0 µs, which no speedup can divide).
        Ok(empty.iter().copied().fold(f64::INFINITY, f64::min).max(0.0))
    }

    /// One empty round trip between samples: on a loaded machine the round trips measured
    /// before the samples can all come out slower than those during them, and then the
    /// overhead would swallow a short kernel's samples whole.
    fn overhead_probe(&mut self) -> Result<Option<f64>, RunFailure> {
        self.empty_round_trip().map(Some)
    }

    fn outputs_every_sample(&self) -> bool {
        true
    }

    fn output_excerpt(&self) -> Option<String> {
        self.candidate.output_excerpt()
    }
}

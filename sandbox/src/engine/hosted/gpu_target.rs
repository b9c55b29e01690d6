//! [`HostedGpuTarget`]: the evaluation contract's mechanics for a hosted `ModelNew` file on
//! the lane's GPU (trust `hosted`). The memory, the inputs, the guards, the kept copies and
//! the reference are the GPU workspace's, as for a contract candidate
//! (`engine::cuda::workspace`); only the candidate's code differs: a python runner
//! ([`super::gpu::HostedGpu`]) maps every tensor and runs `forward` when told to, and each
//! timed sample is the worker's clock from its command to the runner's answer
//! ([`super::gpu`] explains the window).
//!
//! What this target adds to the workspace's checks:
//! - the outputs are hashed right after each run's window, and a kept copy taken later
//!   must still match that hash: work the file left running on the GPU after answering
//!   (a side stream, a thread) is a `runtime_fault`;
//! - the kernels one more forward launched, as the runner's profiler claims them, given to
//!   the contract ([`Target::claimed_kernels`]), which decides `no_own_kernels` with every
//!   other verdict;
//! - the file's recorded forwards lifted into a contract candidate where they allow
//!   (`super::lifting`).

use std::path::Path;
use std::time::Instant;

use kiln_types::{ErrorMetrics, Evaluation, Tolerance, Verdict};

use super::gpu::{Exported, HostedGpu};
use super::kernels::Breakdown;
use crate::engine::contract::{CheckError, InputVariant, RunFailure, Session, Target, Unwritten};
use crate::engine::cuda::telemetry::Telemetry;
use crate::engine::cuda::workspace::{GpuInputs, GpuWorkspace, Job, Memory, Opened, early};
use crate::engine::host::runner_ctl::RunnerConfig;

/// What starting a hosted runner on the GPU takes.
pub struct HostedCode<'a> {
    /// The artifact: the file and the libraries its compile step built
    /// (`engine::hosted::artifact`).
    pub artifact: &'a [u8],
    /// The python and the import limit.
    pub hosted: super::Hosted<'a>,
    /// The runner's process settings (kiln-worker's path, tag, limits).
    pub runner: RunnerConfig<'a>,
    /// The job's scratch directory (the runner's home).
    pub dir: &'a Path,
}

/// The contract's mechanics for a hosted file on one GPU. Field order is drop order: the
/// runner (killed) before the workspace whose memory it mapped.
pub struct HostedGpuTarget<'g> {
    runner: Box<HostedGpu>,
    /// The output hashes taken right after the last run's window, until the reference
    /// writes the outputs.
    after: Option<Vec<u64>>,
    /// The file's text (its own kernels are named there).
    source: &'g str,
    ws: Box<GpuWorkspace<'g>>,
}

/// Opens the workspace on shareable memory, starts the runner over it, and runs the
/// contract. `Err` is an infrastructure failure, never the candidate's.
pub fn evaluate_on(
    gpu: &kiln_gpu::Gpu,
    telemetry: &mut Telemetry,
    job: Job,
    code: &HostedCode,
) -> Result<Evaluation, String> {
    let (problem, candidate, plan) = (job.problem, job.candidate, job.plan);
    let ws = match GpuWorkspace::open(gpu, telemetry, job, Memory::Shareable)? {
        Opened::Ready(ws, _) => ws,
        Opened::Early(e) => return Ok(hosted(*e)),
    };
    let exported = ws
        .export_all()?
        .into_iter()
        .map(|(spec, fd, mapped)| Exported { spec, fd, mapped })
        .collect();
    let (runner, ready) = super::gpu::spawn(
        problem,
        code.artifact,
        exported,
        &code.hosted,
        &code.runner,
        code.dir,
        plan,
    )?;
    // What the runner said when it was ready (parameters matched by order).
    let mut ready_notes = Vec::new();
    let failed = match ready {
        Ok(r) => match super::ready_verdict(&r) {
            None => {
                ready_notes = r.notes;
                None
            }
            Some((v, m)) => {
                let mut e = early(v, m);
                if v == Verdict::RuntimeFault {
                    e.evidence.fault = r.error.clone();
                }
                Some(e)
            }
        },
        Err(end) => {
            let (v, m) = match runner.failure(end) {
                RunFailure::Timeout(m) => (Verdict::Timeout, m),
                RunFailure::Fault(m) | RunFailure::InvalidLaunch(m) => (Verdict::RuntimeFault, m),
                RunFailure::Infra(m) => return Err(m),
            };
            Some(early(v, format!("importing the ModelNew file: {m}")))
        }
    };
    if let Some(mut e) = failed {
        e.evidence.output_excerpt = runner.output_excerpt();
        return Ok(hosted(e));
    }
    let target = HostedGpuTarget {
        runner: Box::new(runner),
        after: None,
        source: &candidate.source,
        ws,
    };
    let mut session = Session::new(problem, plan, target);
    let mut e = session.run()?;
    e.evidence.notes.extend(ready_notes);
    let mut tele = session
        .target
        .ws
        .finish(&mut e, plan, session.telemetry.take());
    tele["kernels"] = serde_json::json!([]);
    if let Some(k) = session.claimed_kernels.take() {
        tele["hosted"] = k;
    }
    // The file's recorded forwards, lifted into a contract candidate where they allow.
    if plan.record_launches {
        e.lift = Some(super::lifting::outcome(
            problem,
            code.artifact,
            session.target.runner.recordings(),
            e.verdict,
        ));
    }
    e.telemetry = Some(tele);
    e.compile = Some(session.target.runner.compile_info());
    Ok(e)
}

/// `e` as a hosted file's result.
fn hosted(mut e: Evaluation) -> Evaluation {
    e.trust = kiln_types::TrustMode::Hosted;
    e
}

impl HostedGpuTarget<'_> {
    /// One run of the file's forward (the inputs current, the outputs poisoned): the L2
    /// flushed and the worker's stream idle first (`timed`), the time on the worker's clock
    /// from `G` to `D`, µs; then the outputs hashed at once (see
    /// [`HostedGpuTarget::check_after_window`]) and the guards checked.
    fn forward(&mut self, inputs: &GpuInputs, timed: bool) -> Result<f64, RunFailure> {
        self.ws.before_run(inputs)?;
        let gpu = self.ws.gpu();
        if timed {
            gpu.l2_flush().map_err(|e| self.ws.fail(e))?;
        }
        gpu.synchronize().map_err(|e| self.ws.fail(e))?;
        let us = if timed {
            self.runner.run()?
        } else {
            self.runner.run_untimed()?;
            0.0
        };
        self.after = Some(self.ws.output_hashes()?);
        self.ws.check_guards()?;
        Ok(us)
    }

    /// A run's outputs are still what they were right after its window: work the file
    /// left running on the GPU after answering would change them later.
    fn check_after_window(&self) -> Result<(), RunFailure> {
        let Some(after) = &self.after else {
            return Ok(());
        };
        match self.ws.outputs_changed_since(after)?.first() {
            None => Ok(()),
            Some(name) => Err(RunFailure::Fault(format!(
                "output {name} changed after the runner answered: work left running on the \
                 GPU after forward returned"
            ))),
        }
    }
}

impl Target for HostedGpuTarget<'_> {
    type Inputs = GpuInputs;
    type Kept = usize;

    fn backend(&self) -> kiln_types::BackendKind {
        kiln_types::BackendKind::Cuda
    }

    fn trust(&self) -> kiln_types::TrustMode {
        kiln_types::TrustMode::Hosted
    }

    fn draw(
        &mut self,
        seed: u64,
        purpose: &str,
        index: u64,
        variant: InputVariant,
    ) -> Result<GpuInputs, String> {
        self.ws.draw(seed, purpose, index, variant)
    }

    fn run(&mut self, inputs: &GpuInputs) -> Result<f64, RunFailure> {
        self.forward(inputs, false).map(|_| 0.0)
    }

    fn sample(&mut self, sets: &[GpuInputs]) -> Result<f64, RunFailure> {
        let [inputs] = sets else {
            return Err(RunFailure::Fault(format!(
                "internal: a hosted sample runs on one input set, not {}",
                sets.len()
            )));
        };
        self.forward(inputs, true)
    }

    fn resolution_us(&self) -> f64 {
        crate::jail::sys::monotonic_resolution()
            .map_or(1e-3, |d| d.as_secs_f64() * 1e6)
            .max(1e-3)
    }

    fn tampered(&mut self, inputs: &GpuInputs) -> Result<Vec<String>, RunFailure> {
        self.ws.tampered(inputs)
    }

    fn keep(&mut self, slot: usize) -> Result<(usize, Vec<Unwritten>), RunFailure> {
        self.check_after_window()?;
        self.ws.keep(slot)
    }

    fn unwritten(&mut self) -> Result<Vec<Unwritten>, RunFailure> {
        self.check_after_window()?;
        self.ws.unwritten()
    }

    fn check(
        &mut self,
        inputs: &GpuInputs,
        kept: &[&usize],
        tol: Tolerance,
    ) -> Result<Vec<Vec<ErrorMetrics>>, CheckError> {
        // The reference writes the output tensors: from here on they are not a run's any
        // more, and its post-window hashes no longer apply.
        self.after = None;
        self.ws.check(inputs, kept, tol)
    }

    fn diff(&mut self, a: &usize, b: &usize, tol: Tolerance) -> Result<(u64, bool), RunFailure> {
        self.ws.diff(a, b, tol)
    }

    fn overhead(&mut self) -> Result<f64, RunFailure> {
        // The worker's clock around a round trip: kiln's own empty round trip is the
        // overhead.
        self.runner.overhead()
    }

    fn overhead_probe(&mut self) -> Result<Option<f64>, RunFailure> {
        self.runner.empty().map(Some)
    }

    fn outputs_every_sample(&self) -> bool {
        false
    }

    fn output_excerpt(&self) -> Option<String> {
        self.runner.output_excerpt()
    }

    fn timing_started(&mut self) {
        self.ws.telemetry().start();
    }

    fn timing_finished(&mut self, windows: &[(Instant, Instant)]) -> Option<serde_json::Value> {
        Some(self.ws.telemetry().finish(windows))
    }

    fn throttled_samples(&self) -> Vec<usize> {
        self.ws.throttled_samples()
    }

    fn claimed_kernels(&mut self) -> Option<Result<Breakdown, String>> {
        Some(self.runner.kernels().map(|(records, span_us)| Breakdown {
            span_us,
            ..super::kernels::classify(self.source, records)
        }))
    }
}

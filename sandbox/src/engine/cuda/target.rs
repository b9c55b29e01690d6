//! [`GpuTarget`]: the evaluation contract's mechanics on the worker's GPU for a candidate
//! kiln launches itself (trust `contract`: CUDA C, or Triton lowered to CUDA launches).
//! [`evaluate_on`] opens the evaluation's memory and reference
//! ([`super::workspace::GpuWorkspace`]), loads the candidate's module and checks its
//! launch plan, and hands the target to [`crate::engine::contract::Session`], which owns
//! every verdict. Each timed sample is one run of the plan, L2-cold, timed by CUPTI's
//! kernel records or events ([`super::timer_log`]).

use std::time::Instant;

use kiln_gpu::timing::SampleConfig;
use kiln_gpu::{CheckedLaunches, GpuError, Module};
use kiln_types::verdict::KernelResources;
use kiln_types::{CompileInfo, ErrorMetrics, Evaluation, Tolerance, Verdict};

use super::telemetry::Telemetry;
use super::timer_log::TimerLog;
use super::workspace::{GpuInputs, GpuWorkspace, Job, Memory, Opened, early};
use crate::engine::contract::{CheckError, InputVariant, RunFailure, Session, Target, Unwritten};
use kiln_gpu::artifact::Artifact;

/// A candidate's compiled code as the GPU target loads it.
#[derive(Clone, Copy)]
pub enum Code<'a> {
    /// A CUDA C candidate's artifact: one CUBIN (or PTX) image whose kernels the plan names
    /// by their symbols.
    Artifact(&'a [u8]),
    /// Several images, each with the kernels taken from it as (name in the plan, symbol):
    /// a lowered Triton candidate (`engine::triton::lower`).
    Parts(&'a [(kiln_gpu::CompiledModule, Vec<(String, String)>)]),
}

/// The contract's mechanics on one GPU for one candidate kiln launches. Field order is
/// drop order: the plan and module, then the workspace (the reference, then buffers).
pub struct GpuTarget<'g> {
    launches: CheckedLaunches,
    module: Module,
    /// Each timed sample's figures, and which one is the time.
    timer: TimerLog,
    ws: Box<GpuWorkspace<'g>>,
}

/// Sets up the workspace and the candidate's module, checks its plan, and runs the
/// contract. `Err` is an infrastructure failure (a broken reference, the GPU), never the
/// candidate's.
pub(super) fn evaluate_on(
    gpu: &kiln_gpu::Gpu,
    telemetry: &mut Telemetry,
    job: Job,
    code: Code,
) -> Result<Evaluation, String> {
    let (problem, candidate, plan) = (job.problem, job.candidate, job.plan);
    let (ws, cand_args) = match GpuWorkspace::open(gpu, telemetry, job, Memory::Private)? {
        Opened::Ready(ws, args) => (ws, args),
        Opened::Early(e) => return Ok(*e),
    };
    let names: Vec<&str> = candidate
        .launches
        .iter()
        .map(|l| l.kernel.as_str())
        .collect();
    let loaded = match code {
        Code::Artifact(bytes) => Artifact::decode(bytes)
            .map_err(|e| GpuError::Usage(e.to_string()))
            .and_then(|a| gpu.load_artifact(&a, &names)),
        Code::Parts(parts) => {
            let parts: Vec<kiln_gpu::ImagePart> = parts
                .iter()
                .map(|(module, kernels)| kiln_gpu::ImagePart { module, kernels })
                .collect();
            gpu.load_parts(&parts)
        }
    };
    let module = match loaded {
        Ok(m) => m,
        Err(e) => {
            let mut ev = early(
                Verdict::RuntimeFault,
                format!("the candidate's module failed to load: {e}"),
            );
            ev.evidence.fault = Some(e.to_string());
            return Ok(ev);
        }
    };
    let launches = match gpu.check_launches(&module, &candidate.launches, &cand_args) {
        Ok(p) => p,
        Err(e) => return Ok(early(Verdict::InvalidLaunch, e.to_string())),
    };
    let kernels = resources(&module, &launches);
    let asked = problem.timing_figure.unwrap_or(plan.timing.figure);
    let timer = TimerLog::new(asked, kiln_gpu::cupti::status(), launches.launches.len());
    let target = GpuTarget {
        launches,
        module,
        timer,
        ws,
    };
    let mut session = Session::new(problem, plan, target);
    let mut e = session.run()?;
    let mut tele = session
        .target
        .ws
        .finish(&mut e, plan, session.telemetry.take());
    tele["kernels"] = serde_json::to_value(&kernels).unwrap_or_default();
    e.telemetry = Some(tele);
    e.compile = Some(CompileInfo {
        kernels,
        ..CompileInfo::default()
    });
    Ok(e)
}

/// Resources of each kernel of the plan, with occupancy for its first launch's shape.
fn resources(module: &Module, plan: &CheckedLaunches) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    for l in &plan.launches {
        if out.iter().any(|k| k.name == l.kernel) {
            continue;
        }
        match module.resources(&l.kernel, l.block_threads(), l.shared_bytes) {
            Ok(r) => out.push(r),
            Err(e) => {
                tracing::warn!(kernel = %l.kernel, "no resources: {e}");
                if let Some(info) = module.kernel(&l.kernel) {
                    out.push(KernelResources {
                        name: info.name.clone(),
                        registers: info.registers,
                        static_shared_bytes: info.static_shared_bytes,
                        local_bytes: info.local_bytes,
                        max_threads_per_block: info.max_threads_per_block,
                        occupancy: None,
                    });
                }
            }
        }
    }
    out
}

/// Resolution of `cuEventElapsedTime` ("around 0.5 microseconds", CUDA driver API
/// reference): a median of the events figure at or below it is not a time.
const EVENT_RESOLUTION_US: f64 = 0.5;
/// Resolution of CUPTI's kernel-record timestamps (nanoseconds), for the kernel figures.
const KERNEL_RECORD_RESOLUTION_US: f64 = 0.001;

impl Target for GpuTarget<'_> {
    type Inputs = GpuInputs;
    type Kept = usize;

    fn backend(&self) -> kiln_types::BackendKind {
        kiln_types::BackendKind::Cuda
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

    fn keep(&mut self, slot: usize) -> Result<(usize, Vec<Unwritten>), RunFailure> {
        self.ws.keep(slot)
    }

    fn unwritten(&mut self) -> Result<Vec<Unwritten>, RunFailure> {
        self.ws.unwritten()
    }

    fn check(
        &mut self,
        inputs: &GpuInputs,
        kept: &[&usize],
        tol: Tolerance,
    ) -> Result<Vec<Vec<ErrorMetrics>>, CheckError> {
        self.ws.check(inputs, kept, tol)
    }

    fn diff(&mut self, a: &usize, b: &usize, tol: Tolerance) -> Result<(u64, bool), RunFailure> {
        self.ws.diff(a, b, tol)
    }

    fn run(&mut self, inputs: &GpuInputs) -> Result<f64, RunFailure> {
        self.ws.before_run(inputs)?;
        self.ws
            .gpu()
            .run_launches(&self.module, &self.launches, self.ws.run_timeout())
            .map_err(|e| self.ws.fail(e))?;
        self.ws.check_printed()?;
        self.ws.check_guards()?;
        Ok(0.0)
    }

    fn sample(&mut self, sets: &[GpuInputs]) -> Result<f64, RunFailure> {
        // One run per sample (`reps_max` is 1): a launch list takes microseconds, well
        // above the resolution of events and of kernel records.
        let [inputs] = sets else {
            return Err(RunFailure::Fault(format!(
                "internal: a GPU sample runs on one input set, not {}",
                sets.len()
            )));
        };
        self.ws.before_run(inputs)?;
        let cfg = SampleConfig::contract(&self.launches, self.ws.run_timeout());
        let times = self
            .ws
            .gpu()
            .time_sample(&self.module, &self.launches, &cfg)
            .map_err(|e| self.ws.fail(e))?;
        self.ws.check_printed()?;
        self.ws.check_guards()?;
        Ok(self.timer.record(&times))
    }

    fn plain_sample(&mut self, inputs: &GpuInputs) -> Result<f64, RunFailure> {
        self.ws.before_plain(inputs)?;
        let ms = self
            .ws
            .gpu()
            .time_plain(&self.module, &self.launches, self.ws.run_timeout())
            .map_err(|e| self.ws.fail(e))?;
        self.ws.check_printed()?;
        self.ws.check_guards()?;
        Ok(ms * 1e3)
    }

    fn tampered(&mut self, inputs: &GpuInputs) -> Result<Vec<String>, RunFailure> {
        self.ws.tampered(inputs)
    }

    fn overhead(&mut self) -> Result<f64, RunFailure> {
        // Events and kernel records time the GPU itself.
        Ok(0.0)
    }

    fn resolution_us(&self) -> f64 {
        match self.timer.figure() {
            kiln_types::TimingFigure::Events => EVENT_RESOLUTION_US,
            _ => KERNEL_RECORD_RESOLUTION_US,
        }
    }

    fn outputs_every_sample(&self) -> bool {
        false // a check per sample would dominate short kernels' wall time
    }

    fn output_excerpt(&self) -> Option<String> {
        super::printf::excerpt()
    }

    fn timing_started(&mut self) {
        self.timer.reset();
        self.ws.telemetry().start();
    }

    fn timer_evidence(&self, excluded: &[usize]) -> Option<kiln_types::TimerEvidence> {
        self.timer.evidence(excluded)
    }

    fn timing_finished(&mut self, windows: &[(Instant, Instant)]) -> Option<serde_json::Value> {
        Some(self.ws.telemetry().finish(windows))
    }

    fn throttled_samples(&self) -> Vec<usize> {
        self.ws.throttled_samples()
    }
}

//! [`GpuContext`]: what a GPU worker keeps from one evaluation to the next — the CUDA
//! context (with kiln's trusted kernels and the L2 flush buffer) and NVML. Each
//! [`GpuContext::evaluate`] sets up a fresh target on it: [`super::target::GpuTarget`] for
//! a candidate kiln launches, `engine::hosted::gpu_target::HostedGpuTarget` for a hosted
//! file. After a
//! fault or a timeout the context is poisoned and the worker is replaced.
//!
//! The kernel tracer (CUPTI, `kiln_gpu::cupti`) is started before the context, as CUPTI
//! asks, from the setting kilnd passes in `KILN_CUPTI` ([`start_kernel_tracer`]).

use kiln_gpu::Gpu;
use kiln_types::Evaluation;

use super::target::Code;
use super::telemetry::Telemetry;
use super::workspace::Job;
use crate::engine::hosted::gpu_target::HostedCode;

/// What a GPU worker keeps between evaluations: the context (with kiln's trusted kernels
/// and the L2 flush buffer) and NVML. Replaced by a fresh worker after a fault or timeout
/// poisons the context.
pub struct GpuContext {
    gpu: Gpu,
    telemetry: Telemetry,
    served: u32,
}

impl GpuContext {
    /// Opens the worker's GPU (ordinal 0: inside the jail only its own GPU is visible),
    /// after starting the kernel tracer.
    pub fn open() -> Result<GpuContext, String> {
        start_kernel_tracer();
        let gpu = Gpu::open(0).map_err(|e| format!("cannot open the GPU: {e}"))?;
        let telemetry = Telemetry::new(&gpu.facts().uuid);
        Ok(GpuContext {
            gpu,
            telemetry,
            served: 0,
        })
    }

    /// Why the context can no longer be used (a fault or a timeout), if it cannot.
    pub fn poisoned(&self) -> Option<String> {
        self.gpu.poisoned()
    }

    /// Evaluations served so far.
    pub fn served(&self) -> u32 {
        self.served
    }

    /// Evaluates one candidate on this context's GPU.
    pub fn evaluate(&mut self, job: Job, code: Candidate) -> Result<Evaluation, String> {
        self.served += 1;
        super::printf::reset();
        match code {
            Candidate::Launches(code) => {
                super::target::evaluate_on(&self.gpu, &mut self.telemetry, job, code)
            }
            Candidate::Hosted(code) => crate::engine::hosted::gpu_target::evaluate_on(
                &self.gpu,
                &mut self.telemetry,
                job,
                code,
            ),
        }
    }
}

/// A candidate's code as a GPU worker runs it.
pub enum Candidate<'a> {
    /// Kernels kiln launches from the candidate's plan (trust `contract`).
    Launches(Code<'a>),
    /// A hosted `ModelNew` file's runner (trust `hosted`).
    Hosted(&'a HostedCode<'a>),
}

/// Starts the process's kernel tracer from `KILN_CUPTI` (`auto` when unset); once per
/// process, before any CUDA context. Never fails: without CUPTI, timing uses events and
/// the evidence says why.
pub fn start_kernel_tracer() -> &'static kiln_gpu::cupti::TimerStatus {
    kiln_gpu::cupti::start(&kiln_gpu::cupti::CuptiSetting::from_env())
}

//! [`GpuTarget`]: the evaluation contract's mechanics on the worker's GPU, and
//! [`evaluate`], which sets it up and hands it to [`crate::contract::Session`].
//!
//! Memory discipline (design guide §5): the problem's tensors are allocated once and
//! shared by the reference and the candidate; each has its own scratch. Inputs are drawn
//! on the GPU (`Gpu::fill`) from the secret seed and hashed on the GPU with a secret key.
//! The reference runs first; its outputs are downloaded into the worker and the output and
//! reference scratch buffers are zeroed before any candidate code runs, so reference
//! results are never resident where candidate code can reach them. Outputs are poisoned
//! and the candidate's scratch zeroed before every candidate run.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kiln_cuda::inputs::{derive_seed, poison_pattern};
use kiln_cuda::launch::BufferArg;
use kiln_cuda::timing::SampleConfig;
use kiln_cuda::{CheckedPlan, DeviceBuffer, Gpu, GpuError, Module};
use kiln_types::verdict::KernelResources;
use kiln_types::{
    Candidate, CompileInfo, Dtype, EvalPlan, Evaluation, Init, ProblemSpec, Role, Verdict,
};

use super::compile::module_from_artifact;
use super::telemetry::Telemetry;
use crate::contract::{Outputs, RunFailure, Session, Target};
use crate::host::data;

/// Largest total scratch a candidate may ask for, bytes.
const MAX_SCRATCH_BYTES: u64 = 16 << 30;

/// What the worker hands to [`evaluate`].
pub struct Job<'a> {
    /// The problem.
    pub problem: &'a ProblemSpec,
    /// The candidate.
    pub candidate: &'a Candidate,
    /// The plan (secret seed, trials, stop rule, peaks).
    pub plan: &'a EvalPlan,
    /// The reference's CUBIN/PTX.
    pub reference_artifact: &'a [u8],
    /// The candidate's CUBIN/PTX.
    pub candidate_artifact: &'a [u8],
}

/// One of the problem's tensors on the GPU.
struct Tensor {
    name: String,
    dtype: Dtype,
    elems: u64,
    role: Role,
    init: Init,
    shifted_trial: bool,
    buf: DeviceBuffer,
}

/// A drawn input set: how each input was generated, and its keyed hash.
pub struct GpuInputs {
    id: u64,
    /// (tensor index, distribution, generator seed).
    draws: Vec<(usize, Init, u64)>,
    /// (tensor index, keyed hash after generation).
    hashes: Vec<(usize, u64)>,
}

/// The contract's mechanics on one GPU. Field order is drop order: plans and modules,
/// then buffers (scrubbed when freed), then the GPU.
pub struct GpuTarget {
    ref_plan: CheckedPlan,
    cand_plan: CheckedPlan,
    reference: Module,
    candidate: Module,
    tensors: Vec<Tensor>,
    ref_scratch: Vec<DeviceBuffer>,
    cand_scratch: Vec<DeviceBuffer>,
    run_timeout: Duration,
    hash_key: u64,
    current: Option<u64>,
    next_id: u64,
    telemetry: Telemetry,
    gpu: Gpu,
}

fn early(v: Verdict, msg: String) -> Evaluation {
    Evaluation::early(v, "cuda", msg)
}

/// The contract's failure for a GPU error while candidate code ran.
pub fn failure(e: GpuError, run_timeout: Duration) -> RunFailure {
    match e {
        GpuError::Timeout(waited) => RunFailure::Timeout(format!(
            "the launch plan did not finish within the run timeout of {} ms (waited {:.0} ms); \
             the GPU context is abandoned and the worker replaced",
            run_timeout.as_millis(),
            waited.as_secs_f64() * 1e3
        )),
        GpuError::Fault(f) => RunFailure::Fault(f.to_string()),
        GpuError::InvalidLaunch(il) => RunFailure::InvalidLaunch(il.to_string()),
        GpuError::Poisoned(p) => {
            RunFailure::Fault(format!("the GPU context was poisoned earlier by {p}"))
        }
        other => RunFailure::Fault(other.to_string()),
    }
}

/// Sets up the GPU, the buffers and both modules, checks both plans, and runs the contract.
/// `Err` is an infrastructure failure (no GPU, a broken reference), never the candidate's.
pub fn evaluate(job: Job) -> Result<Evaluation, String> {
    let problem = job.problem;
    let ref_ks = problem
        .reference
        .get("cuda")
        .ok_or_else(|| format!("problem {} has no cuda reference", problem.name))?;
    if let Err(e) = check_scratch(problem, &job.candidate.scratch) {
        return Ok(early(Verdict::InvalidLaunch, e));
    }
    check_scratch(problem, &ref_ks.scratch).map_err(|e| format!("reference: {e}"))?;
    // Inside the jail only the worker's GPU is visible (CUDA_VISIBLE_DEVICES): ordinal 0.
    let gpu = Gpu::open(0).map_err(|e| format!("cannot open the GPU: {e}"))?;
    let arch = gpu.facts().arch.clone();
    let infra = |what: &str, e: GpuError| format!("{what}: {e}");
    let mut tensors = Vec::new();
    for t in &problem.tensors {
        let buf = gpu
            .alloc(t.bytes() as usize)
            .map_err(|e| infra(&format!("allocating tensor {}", t.name), e))?;
        tensors.push(Tensor {
            name: t.name.clone(),
            dtype: t.dtype,
            elems: t.elems(),
            role: t.role,
            init: t.init,
            shifted_trial: t.shifted_trial,
            buf,
        });
    }
    let tensor_args: BTreeMap<String, BufferArg> = tensors
        .iter()
        .map(|t| {
            let arg = BufferArg {
                ptr: t.buf.ptr(),
                dtype: t.dtype,
                elems: t.elems,
            };
            (t.name.clone(), arg)
        })
        .collect();
    let scratch = |list: &[kiln_types::ScratchBuffer]| -> Result<_, GpuError> {
        let mut args = tensor_args.clone();
        let mut bufs = Vec::new();
        for s in list {
            let buf = gpu.alloc((s.elems * s.dtype.size()) as usize)?;
            let arg = BufferArg {
                ptr: buf.ptr(),
                dtype: s.dtype,
                elems: s.elems,
            };
            args.insert(s.name.clone(), arg);
            bufs.push(buf);
        }
        Ok((args, bufs))
    };
    let (ref_args, ref_scratch) =
        scratch(&ref_ks.scratch).map_err(|e| infra("reference scratch", e))?;
    let (cand_args, cand_scratch) = match scratch(&job.candidate.scratch) {
        Ok(x) => x,
        Err(e) => {
            return Ok(early(
                Verdict::InvalidLaunch,
                format!("cannot allocate the candidate's scratch: {e}"),
            ));
        }
    };
    let names = |ls: &[kiln_types::Launch]| -> Vec<String> {
        ls.iter().map(|l| l.kernel.clone()).collect()
    };
    let ref_names = names(&ref_ks.launches);
    let ref_refs: Vec<&str> = ref_names.iter().map(String::as_str).collect();
    let reference = gpu
        .load_module(
            &module_from_artifact(job.reference_artifact, &arch),
            &ref_refs,
        )
        .map_err(|e| infra("loading the reference module", e))?;
    let ref_plan = gpu
        .check_plan(&reference, &ref_ks.launches, &ref_args)
        .map_err(|e| format!("the reference's launch plan: {e}"))?;
    let cand_names = names(&job.candidate.launches);
    let cand_refs: Vec<&str> = cand_names.iter().map(String::as_str).collect();
    let candidate = match gpu.load_module(
        &module_from_artifact(job.candidate_artifact, &arch),
        &cand_refs,
    ) {
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
    let cand_plan = match gpu.check_plan(&candidate, &job.candidate.launches, &cand_args) {
        Ok(p) => p,
        Err(e) => return Ok(early(Verdict::InvalidLaunch, e.to_string())),
    };
    let kernels = resources(&candidate, &cand_plan);
    let uuid = gpu.facts().uuid.clone();
    let device = serde_json::json!({
        "name": gpu.facts().name,
        "uuid": uuid,
        "arch": arch,
    });
    let target = GpuTarget {
        ref_plan,
        cand_plan,
        reference,
        candidate,
        tensors,
        ref_scratch,
        cand_scratch,
        run_timeout: Duration::from_millis(job.plan.run_timeout_ms.max(1)),
        hash_key: derive_seed(job.plan.seed, "kiln/input-hash"),
        current: None,
        next_id: 0,
        telemetry: Telemetry::new(&uuid),
        gpu,
    };
    let mut session = Session::new(problem, job.plan, target);
    let mut e = session.run()?;
    let mut tele = serde_json::json!({ "device": device });
    tele["kernels"] = serde_json::to_value(&kernels).unwrap_or_default();
    if let Some(gpu_t) = session.telemetry.take() {
        tele["gpu"] = gpu_t;
    }
    e.telemetry = Some(tele);
    e.compile = Some(CompileInfo {
        kernels,
        ..CompileInfo::default()
    });
    Ok(e)
}

/// Scratch names must be new, sizes positive and bounded.
fn check_scratch(problem: &ProblemSpec, list: &[kiln_types::ScratchBuffer]) -> Result<(), String> {
    let mut total = 0u64;
    for s in list {
        if problem.tensor(&s.name).is_some() {
            return Err(format!(
                "scratch buffer {:?} shadows a tensor of the problem",
                s.name
            ));
        }
        if s.elems == 0 {
            return Err(format!("scratch buffer {:?} has no elements", s.name));
        }
        total = total.saturating_add(s.elems.saturating_mul(s.dtype.size()));
    }
    if total > MAX_SCRATCH_BYTES {
        return Err(format!(
            "{total} bytes of scratch exceed the limit of {MAX_SCRATCH_BYTES}"
        ));
    }
    Ok(())
}

/// Resources of each kernel of the plan, with occupancy for its first launch's shape.
fn resources(module: &Module, plan: &CheckedPlan) -> Vec<KernelResources> {
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

impl GpuTarget {
    fn fail(&self, e: GpuError) -> RunFailure {
        failure(e, self.run_timeout)
    }

    /// Makes `inputs` the set on the device (regenerating it if another set was drawn since).
    fn ensure(&mut self, inputs: &GpuInputs) -> Result<(), GpuError> {
        if self.current == Some(inputs.id) {
            return Ok(());
        }
        for &(i, init, seed) in &inputs.draws {
            let t = &self.tensors[i];
            self.gpu.fill(&t.buf, t.dtype, t.elems, &init, seed)?;
        }
        self.gpu.synchronize()?;
        self.current = Some(inputs.id);
        Ok(())
    }

    /// Poisons the outputs and zeroes the candidate's scratch.
    fn prepare_candidate(&self) -> Result<(), GpuError> {
        for t in self.tensors.iter().filter(|t| t.role == Role::Output) {
            self.gpu.poison(&t.buf, t.dtype, t.elems)?;
        }
        for b in &self.cand_scratch {
            self.gpu.memset(b, 0)?;
        }
        Ok(())
    }

    fn download_outputs(&self) -> Result<Outputs, GpuError> {
        self.tensors
            .iter()
            .filter(|t| t.role == Role::Output)
            .map(|t| {
                let bytes = self.gpu.download_vec::<u8>(&t.buf, t.buf.bytes())?;
                Ok((t.name.clone(), bytes))
            })
            .collect()
    }
}

impl Target for GpuTarget {
    type Inputs = GpuInputs;

    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn draw(
        &mut self,
        seed: u64,
        purpose: &str,
        index: u64,
        shifted: bool,
    ) -> Result<GpuInputs, String> {
        let id = self.next_id;
        self.next_id += 1;
        let draws: Vec<(usize, Init, u64)> = self
            .tensors
            .iter()
            .enumerate()
            .filter(|(_, t)| t.role == Role::Input)
            .map(|(i, t)| {
                let init = if shifted && t.shifted_trial && t.dtype.is_float() {
                    data::SHIFTED
                } else {
                    t.init
                };
                let s = derive_seed(seed, &format!("{purpose}/{index}/{}", t.name));
                (i, init, s)
            })
            .collect();
        let mut inputs = GpuInputs {
            id,
            draws,
            hashes: Vec::new(),
        };
        self.ensure(&inputs)
            .map_err(|e| format!("drawing inputs on the GPU: {e}"))?;
        for &(i, _, _) in &inputs.draws {
            let h = self
                .gpu
                .hash(&self.tensors[i].buf, self.hash_key)
                .map_err(|e| format!("hashing inputs on the GPU: {e}"))?;
            inputs.hashes.push((i, h));
        }
        Ok(inputs)
    }

    fn reference(&mut self, inputs: &GpuInputs) -> Result<Outputs, String> {
        let wrap = |e: GpuError| e.to_string();
        self.ensure(inputs).map_err(wrap)?;
        for t in self.tensors.iter().filter(|t| t.role == Role::Output) {
            self.gpu.poison(&t.buf, t.dtype, t.elems).map_err(wrap)?;
        }
        for b in &self.ref_scratch {
            self.gpu.memset(b, 0).map_err(wrap)?;
        }
        let limit = self.run_timeout.max(Duration::from_secs(10)) * 4;
        self.gpu
            .run_plan(&self.reference, &self.ref_plan, limit)
            .map_err(|e| format!("did not finish: {e}"))?;
        let out = self.download_outputs().map_err(wrap)?;
        // Scrub: nothing of the reference's results stays on the device.
        for t in self.tensors.iter().filter(|t| t.role == Role::Output) {
            self.gpu.memset(&t.buf, 0).map_err(wrap)?;
        }
        for b in &self.ref_scratch {
            self.gpu.memset(b, 0).map_err(wrap)?;
        }
        Ok(out)
    }

    fn run(&mut self, inputs: &GpuInputs) -> Result<f64, RunFailure> {
        self.ensure(inputs).map_err(|e| self.fail(e))?;
        self.prepare_candidate().map_err(|e| self.fail(e))?;
        self.gpu
            .run_plan(&self.candidate, &self.cand_plan, self.run_timeout)
            .map_err(|e| self.fail(e))?;
        Ok(0.0)
    }

    fn sample(&mut self, inputs: &GpuInputs) -> Result<f64, RunFailure> {
        self.ensure(inputs).map_err(|e| self.fail(e))?;
        self.prepare_candidate().map_err(|e| self.fail(e))?;
        let cfg = SampleConfig::contract(&self.cand_plan, self.run_timeout);
        let ms = self
            .gpu
            .time_sample(&self.candidate, &self.cand_plan, &cfg)
            .map_err(|e| self.fail(e))?;
        Ok(ms * 1e3)
    }

    fn tampered(&mut self, inputs: &GpuInputs) -> Result<Vec<String>, RunFailure> {
        let mut changed = Vec::new();
        for &(i, want) in &inputs.hashes {
            let t = &self.tensors[i];
            let got = self
                .gpu
                .hash(&t.buf, self.hash_key)
                .map_err(|e| self.fail(e))?;
            if got != want {
                changed.push(t.name.clone());
            }
        }
        if !changed.is_empty() {
            self.current = None; // regenerate before any further use
        }
        Ok(changed)
    }

    fn outputs(&mut self) -> Result<Outputs, RunFailure> {
        self.download_outputs().map_err(|e| self.fail(e))
    }

    fn unwritten(&self, bytes: &[u8], dtype: Dtype) -> (u64, Vec<u64>) {
        unwritten(bytes, dtype)
    }

    fn overhead(&mut self) -> Result<f64, RunFailure> {
        Ok(0.0) // events time the GPU itself
    }

    fn outputs_every_sample(&self) -> bool {
        false // a download per sample would dominate short kernels' wall time
    }

    fn timing_started(&mut self) {
        self.telemetry.start();
    }

    fn timing_finished(&mut self, windows: &[(Instant, Instant)]) -> Option<serde_json::Value> {
        Some(self.telemetry.finish(windows))
    }
}

/// Elements still holding `kiln_cuda`'s poison pattern: (count, first few indices).
pub fn unwritten(bytes: &[u8], dtype: Dtype) -> (u64, Vec<u64>) {
    let size = dtype.size() as usize;
    let pattern = poison_pattern(dtype).to_le_bytes();
    let pattern = &pattern[..size];
    let mut count = 0u64;
    let mut first = Vec::new();
    for (i, c) in bytes.chunks_exact(size).enumerate() {
        if c == pattern {
            count += 1;
            if first.len() < 8 {
                first.push(i as u64);
            }
        }
    }
    (count, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poison_is_found_per_dtype() {
        let mut b = Vec::new();
        b.extend_from_slice(&(poison_pattern(Dtype::F16) as u16).to_le_bytes());
        b.extend_from_slice(&0x3c00u16.to_le_bytes());
        b.extend_from_slice(&(poison_pattern(Dtype::F16) as u16).to_le_bytes());
        assert_eq!(unwritten(&b, Dtype::F16), (2, vec![0, 2]));
        let f = (poison_pattern(Dtype::F32) as u32).to_le_bytes();
        assert_eq!(unwritten(&f, Dtype::F32).0, 1);
        assert_eq!(unwritten(&1.0f32.to_le_bytes(), Dtype::F32).0, 0);
    }
}

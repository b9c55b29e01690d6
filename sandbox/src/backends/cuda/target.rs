//! [`GpuTarget`]: the evaluation contract's mechanics on the worker's GPU. `evaluate_on`
//! sets a target up on the warm context ([`super::context::GpuContext`]) and hands it to
//! [`crate::contract::Session`].
//!
//! Memory discipline (design guide §5): the problem's tensors are allocated per
//! evaluation and shared by the reference and the candidate; each has its own scratch.
//! Inputs are drawn on the GPU (`Gpu::fill`) from the secret seed and hashed on the GPU
//! with a secret key. Outputs are poisoned and the candidate's scratch zeroed before every
//! candidate run. A candidate run's outputs are copied into kiln's own "kept" buffers
//! (hashed, so a later run that scribbles on them is caught). Only after the candidate's
//! runs does the reference run, into the output tensors; `kiln_compare` compares the kept
//! copies with it on the GPU, and the outputs and the reference's scratch are zeroed
//! before any candidate code runs again — reference results are resident only while no
//! candidate code can run. Nothing but a few counters and, on a mismatch, a window of a
//! few thousand elements is downloaded.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kiln_gpu::compare::{Against, Comparison};
use kiln_gpu::inputs::{derive_seed, poison_pattern};
use kiln_gpu::launch::BufferArg;
use kiln_gpu::timing::SampleConfig;
use kiln_gpu::{CheckedLaunches, DeviceBuffer, Gpu, GpuError, Module};
use kiln_types::verdict::KernelResources;
use kiln_types::verdict::Mismatch;
use kiln_types::{
    Candidate, CompileInfo, Dtype, ErrorMetrics, EvalPlan, Evaluation, Init, ProblemSpec, Role,
    Tolerance, Verdict,
};

use super::compile::module_from_artifact;
use super::telemetry::Telemetry;
use super::timer_log::TimerLog;
use crate::contract::{CheckError, InputVariant, RunFailure, Session, Target, Unwritten};
use crate::contract::{compare, data};

/// Largest total scratch a candidate may ask for, bytes.
const MAX_SCRATCH_BYTES: u64 = 16 << 30;

/// What the worker hands to [`GpuContext::evaluate`](super::context::GpuContext::evaluate).
pub struct Job<'a> {
    /// The problem.
    pub problem: &'a ProblemSpec,
    /// The candidate.
    pub candidate: &'a Candidate,
    /// The plan (secret seed, trials, stop rule, peaks).
    pub plan: &'a EvalPlan,
    /// The reference's CUBIN/PTX.
    pub reference_artifact: &'a [u8],
    /// The candidate's compiled code.
    pub candidate_code: Code<'a>,
    /// Bytes device `printf` may print in the whole evaluation before it is a fault.
    pub output_limit_bytes: u64,
}

/// A candidate's compiled code as the GPU target loads it.
#[derive(Clone, Copy)]
pub enum Code<'a> {
    /// A CUDA C candidate's artifact: one CUBIN (or PTX) image whose kernels the plan names
    /// by their symbols.
    Artifact(&'a [u8]),
    /// Several images, each with the kernels taken from it as (name in the plan, symbol):
    /// a lowered Triton candidate (`backends::triton::lower`).
    Parts(&'a [(kiln_gpu::CompiledModule, Vec<(String, String)>)]),
}

/// One of the problem's tensors on the GPU.
struct Tensor {
    name: String,
    dtype: Dtype,
    elems: u64,
    role: Role,
    spec: kiln_types::TensorSpec,
    buf: DeviceBuffer,
}

/// A kept copy of one run's outputs: one buffer per output tensor, with its keyed hash
/// once taken. The hash is taken only when candidate code is about to run while the copy
/// waits to be checked (a copy checked before any candidate code runs again needs none).
struct KeptSet {
    bufs: Vec<(DeviceBuffer, Option<u64>)>,
}

/// A drawn input set: how each input was generated, and its keyed hash.
pub struct GpuInputs {
    id: u64,
    /// (tensor index, distribution, generator seed).
    draws: Vec<(usize, Init, u64)>,
    /// (tensor index, keyed hash after generation).
    hashes: Vec<(usize, u64)>,
}

/// The contract's mechanics on one GPU for one evaluation. Field order is drop order:
/// plans and modules, then buffers (scrubbed when freed); the GPU outlives it.
pub struct GpuTarget<'g> {
    ref_launches: CheckedLaunches,
    cand_launches: CheckedLaunches,
    reference: Module,
    candidate: Module,
    tensors: Vec<Tensor>,
    ref_scratch: Vec<DeviceBuffer>,
    cand_scratch: Vec<DeviceBuffer>,
    kept: Vec<Option<KeptSet>>,
    /// Kept slots not checked yet (hashed before candidate code runs again).
    awaiting: Vec<usize>,
    run_timeout: Duration,
    output_limit: u64,
    hash_key: u64,
    current: Option<u64>,
    next_id: u64,
    /// Each timed sample's figures, and which one is the time.
    timer: TimerLog,
    telemetry: &'g mut Telemetry,
    gpu: &'g Gpu,
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

/// Sets up the buffers and both modules, checks both plans, and runs the contract.
/// `Err` is an infrastructure failure (a broken reference, the GPU), never the candidate's.
pub(super) fn evaluate_on(
    gpu: &Gpu,
    telemetry: &mut Telemetry,
    job: Job,
) -> Result<Evaluation, String> {
    let problem = job.problem;
    let ref_ks = problem
        .reference
        .get("cuda")
        .ok_or_else(|| format!("problem {} has no cuda reference", problem.name))?;
    if let Err(e) = check_scratch(problem, &job.candidate.scratch) {
        return Ok(early(Verdict::InvalidLaunch, e));
    }
    check_scratch(problem, &ref_ks.scratch).map_err(|e| format!("reference: {e}"))?;
    if let Some(p) = gpu.poisoned() {
        return Err(format!(
            "the GPU context is poisoned ({p}); the worker must be replaced"
        ));
    }
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
            spec: t.clone(),
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
    let ref_launches = gpu
        .check_launches(&reference, &ref_ks.launches, &ref_args)
        .map_err(|e| format!("the reference's launch plan: {e}"))?;
    let cand_names = names(&job.candidate.launches);
    let cand_refs: Vec<&str> = cand_names.iter().map(String::as_str).collect();
    let loaded = match job.candidate_code {
        Code::Artifact(bytes) => gpu.load_module(&module_from_artifact(bytes, &arch), &cand_refs),
        Code::Parts(parts) => {
            let parts: Vec<kiln_gpu::ImagePart> = parts
                .iter()
                .map(|(module, kernels)| kiln_gpu::ImagePart { module, kernels })
                .collect();
            gpu.load_parts(&parts)
        }
    };
    let candidate = match loaded {
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
    let cand_launches = match gpu.check_launches(&candidate, &job.candidate.launches, &cand_args) {
        Ok(p) => p,
        Err(e) => return Ok(early(Verdict::InvalidLaunch, e.to_string())),
    };
    let kernels = resources(&candidate, &cand_launches);
    let device = serde_json::json!({
        "name": gpu.facts().name,
        "uuid": gpu.facts().uuid,
        "arch": arch,
    });
    let asked = problem.timing_figure.unwrap_or(job.plan.timing.figure);
    let timer = TimerLog::new(
        asked,
        kiln_gpu::cupti::status(),
        cand_launches.launches.len(),
    );
    let target = GpuTarget {
        ref_launches,
        cand_launches,
        reference,
        candidate,
        tensors,
        ref_scratch,
        cand_scratch,
        kept: Vec::new(),
        awaiting: Vec::new(),
        run_timeout: Duration::from_millis(job.plan.run_timeout_ms.max(1)),
        output_limit: job.output_limit_bytes,
        hash_key: derive_seed(job.plan.seed, "kiln/input-hash"),
        current: None,
        next_id: 0,
        timer,
        telemetry,
        gpu,
    };
    let mut session = Session::new(problem, job.plan, target);
    let mut e = session.run()?;
    let mut tele = serde_json::json!({ "device": device });
    tele["kernels"] = serde_json::to_value(&kernels).unwrap_or_default();
    if let Some(mut gpu_t) = session.telemetry.take() {
        gpu_t["throttle_policy"] =
            serde_json::to_value(job.plan.timing.throttle_policy).unwrap_or_default();
        // The worker never changes clocks; kilnd says when it locked them.
        gpu_t["clock_policy"] = "observe".into();
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

impl GpuTarget<'_> {
    fn fail(&self, e: GpuError) -> RunFailure {
        failure(e, self.run_timeout)
    }

    /// Hashes every kept copy that awaits its check and has no hash yet: candidate code is
    /// about to run, and a copy it changes must be caught.
    fn protect_kept(&mut self) -> Result<(), GpuError> {
        for &slot in &self.awaiting {
            let key = self.hash_key ^ (slot as u64 + 1);
            let Some(set) = self.kept.get(slot).and_then(Option::as_ref) else {
                continue;
            };
            let mut hashes = Vec::new();
            for (b, h) in &set.bufs {
                hashes.push(match h {
                    Some(h) => *h,
                    None => self.gpu.hash(b, key)?,
                });
            }
            if let Some(set) = self.kept.get_mut(slot).and_then(Option::as_mut) {
                for ((_, h), new) in set.bufs.iter_mut().zip(hashes) {
                    *h = Some(new);
                }
            }
        }
        Ok(())
    }

    /// A device-printf flood is a fault (checked after every candidate run).
    fn check_printed(&self) -> Result<(), RunFailure> {
        let n = super::printf::printed();
        if n > self.output_limit {
            return Err(RunFailure::Fault(format!(
                "output flood: device printf wrote {n} bytes, over the limit of {}",
                self.output_limit
            )));
        }
        Ok(())
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

    fn against<'b>(
        want: Option<&'b DeviceBuffer>,
        other: Option<&'b DeviceBuffer>,
        tol: Tolerance,
    ) -> Against<'b> {
        Against {
            want,
            other,
            atol: tol.atol,
            rtol: tol.rtol,
        }
    }

    /// Output tensors (index into `tensors`).
    fn outputs(&self) -> Vec<usize> {
        (0..self.tensors.len())
            .filter(|&i| self.tensors[i].role == Role::Output)
            .collect()
    }

    /// Poisoned elements of `buf` holding tensor `t`: (count, first few indices).
    fn unwritten_in(&self, buf: &DeviceBuffer, t: &Tensor) -> Result<(u64, Vec<u64>), GpuError> {
        let c = self
            .gpu
            .compare(buf, t.dtype, t.elems, Against::default())?;
        let Some(first) = c.first_unwritten else {
            return Ok((0, Vec::new()));
        };
        let window = self.gpu.window(buf, t.dtype, t.elems, first, WINDOW)?;
        let (_, idx) = unwritten(&window, t.dtype);
        Ok((c.unwritten, idx.into_iter().map(|i| i + first).collect()))
    }

    /// Error metrics of a kept output against the reference's output in `t.buf`.
    fn metrics(
        &self,
        got: &DeviceBuffer,
        t: &Tensor,
        tol: Tolerance,
    ) -> Result<ErrorMetrics, GpuError> {
        let c: Comparison = self.gpu.compare(
            got,
            t.dtype,
            t.elems,
            Self::against(Some(&t.buf), None, tol),
        )?;
        let mut m = ErrorMetrics {
            tensor: t.name.clone(),
            max_abs: c.max_abs,
            max_rel: c.max_rel,
            rel_l2: c.rel_l2(),
            mismatches: c.mismatches,
            first_mismatches: Vec::new(),
            nonfinite_mismatches: c.nonfinite_mismatches,
        };
        if let Some(first) = c.first_mismatch {
            let g = self.gpu.window(got, t.dtype, t.elems, first, WINDOW)?;
            let w = self.gpu.window(&t.buf, t.dtype, t.elems, first, WINDOW)?;
            let n = g.len() / t.dtype.size() as usize;
            for i in 0..n {
                let (gv, wv) = (data::get(&g, t.dtype, i), data::get(&w, t.dtype, i));
                if !compare::close(gv, wv, tol) {
                    m.first_mismatches.push(Mismatch {
                        index: first + i as u64,
                        got: gv,
                        want: wv,
                    });
                    if m.first_mismatches.len() >= 8 {
                        break;
                    }
                }
            }
        }
        Ok(m)
    }

    /// Zeroes the outputs and the reference's scratch (after a reference run).
    fn scrub_reference(&self) -> Result<(), GpuError> {
        for t in self.tensors.iter().filter(|t| t.role == Role::Output) {
            self.gpu.memset(&t.buf, 0)?;
        }
        for b in &self.ref_scratch {
            self.gpu.memset(b, 0)?;
        }
        Ok(())
    }

    /// Runs the reference on `inputs` into the output tensors, checks it wrote them all.
    fn run_reference(&mut self, inputs: &GpuInputs) -> Result<(), String> {
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
            .run_launches(&self.reference, &self.ref_launches, limit)
            .map_err(|e| format!("did not finish: {e}"))?;
        for i in self.outputs() {
            let t = &self.tensors[i];
            let (n, _) = self.unwritten_in(&t.buf, t).map_err(wrap)?;
            if n > 0 {
                return Err(format!("left {} partly unwritten", t.name));
            }
        }
        Ok(())
    }
}

/// Resolution of `cuEventElapsedTime` ("around 0.5 microseconds", CUDA driver API
/// reference): a median of the events figure at or below it is not a time.
const EVENT_RESOLUTION_US: f64 = 0.5;
/// Resolution of CUPTI's kernel-record timestamps (nanoseconds), for the kernel figures.
const KERNEL_RECORD_RESOLUTION_US: f64 = 0.001;

/// Elements downloaded around a first mismatch or hole, to list them by value.
const WINDOW: u64 = 4096;

impl Target for GpuTarget<'_> {
    type Inputs = GpuInputs;
    type Kept = usize;

    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn draw(
        &mut self,
        seed: u64,
        purpose: &str,
        index: u64,
        variant: InputVariant,
    ) -> Result<GpuInputs, String> {
        let id = self.next_id;
        self.next_id += 1;
        let draws: Vec<(usize, Init, u64)> = self
            .tensors
            .iter()
            .enumerate()
            .filter(|(_, t)| t.role == Role::Input)
            .map(|(i, t)| {
                let init = variant.init(&t.spec);
                let s = data::tensor_seed(seed, purpose, index, &t.name);
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

    fn keep(&mut self, slot: usize) -> Result<(usize, Vec<Unwritten>), RunFailure> {
        let unwritten_list = Target::unwritten(self)?;
        if !unwritten_list.is_empty() {
            return Ok((slot, unwritten_list));
        }
        let outs = self.outputs();
        while self.kept.len() <= slot {
            self.kept.push(None);
        }
        if self.kept[slot].is_none() {
            let mut bufs = Vec::new();
            for &i in &outs {
                let b = self
                    .gpu
                    .alloc(self.tensors[i].buf.bytes())
                    .map_err(|e| self.fail(e))?;
                bufs.push((b, None));
            }
            self.kept[slot] = Some(KeptSet { bufs });
        }
        if let Some(set) = &self.kept[slot] {
            for (&i, (b, _)) in outs.iter().zip(&set.bufs) {
                self.gpu
                    .copy(b, &self.tensors[i].buf)
                    .map_err(|e| self.fail(e))?;
            }
        }
        if let Some(set) = self.kept[slot].as_mut() {
            for (_, h) in set.bufs.iter_mut() {
                *h = None;
            }
        }
        if !self.awaiting.contains(&slot) {
            self.awaiting.push(slot);
        }
        Ok((slot, Vec::new()))
    }

    fn unwritten(&mut self) -> Result<Vec<Unwritten>, RunFailure> {
        let mut list = Vec::new();
        for i in self.outputs() {
            let t = &self.tensors[i];
            let (n, first) = self.unwritten_in(&t.buf, t).map_err(|e| self.fail(e))?;
            if n > 0 {
                list.push((t.name.clone(), n, first));
            }
        }
        Ok(list)
    }

    fn check(
        &mut self,
        inputs: &GpuInputs,
        kept: &[&usize],
        tol: Tolerance,
    ) -> Result<Vec<Vec<ErrorMetrics>>, CheckError> {
        let infra = |e: GpuError| CheckError::Infra(e.to_string());
        for &&slot in kept {
            let key = self.hash_key ^ (slot as u64 + 1);
            let Some(set) = self.kept.get(slot).and_then(Option::as_ref) else {
                return Err(CheckError::Infra(format!("no kept outputs in slot {slot}")));
            };
            for (b, h) in set.bufs.iter().filter_map(|(b, h)| h.map(|h| (b, h))) {
                if self.gpu.hash(b, key).map_err(infra)? != h {
                    return Err(CheckError::KeptChanged(format!(
                        "kiln's copy of the outputs of run {} changed while later candidate code ran",
                        slot + 1
                    )));
                }
            }
        }
        self.run_reference(inputs).map_err(CheckError::Infra)?;
        let outs = self.outputs();
        let mut result = Vec::new();
        for &&slot in kept {
            let mut per_run = Vec::new();
            if let Some(set) = self.kept.get(slot).and_then(Option::as_ref) {
                for (&i, (b, _)) in outs.iter().zip(&set.bufs) {
                    per_run.push(self.metrics(b, &self.tensors[i], tol).map_err(infra)?);
                }
            }
            result.push(per_run);
        }
        // Scrub: nothing of the reference's results stays on the device.
        self.scrub_reference().map_err(infra)?;
        for &&slot in kept {
            if let Some(set) = self.kept.get_mut(slot).and_then(Option::as_mut) {
                for (_, h) in set.bufs.iter_mut() {
                    *h = None;
                }
            }
        }
        self.awaiting.retain(|s| !kept.iter().any(|k| **k == *s));
        Ok(result)
    }

    fn diff(&mut self, a: &usize, b: &usize, tol: Tolerance) -> Result<(u64, bool), RunFailure> {
        let (Some(sa), Some(sb)) = (
            self.kept.get(*a).and_then(Option::as_ref),
            self.kept.get(*b).and_then(Option::as_ref),
        ) else {
            return Err(RunFailure::Fault("internal: kept outputs missing".into()));
        };
        let mut diffs = 0;
        let mut agree = true;
        for (&i, ((x, _), (y, _))) in self.outputs().iter().zip(sa.bufs.iter().zip(&sb.bufs)) {
            let t = &self.tensors[i];
            let c = self
                .gpu
                .compare(x, t.dtype, t.elems, Self::against(None, Some(y), tol))
                .map_err(|e| failure(e, self.run_timeout))?;
            diffs += c.bitwise_diffs;
            agree &= c.disagreements == 0;
        }
        Ok((diffs, agree))
    }

    fn run(&mut self, inputs: &GpuInputs) -> Result<f64, RunFailure> {
        self.protect_kept().map_err(|e| self.fail(e))?;
        self.ensure(inputs).map_err(|e| self.fail(e))?;
        self.prepare_candidate().map_err(|e| self.fail(e))?;
        self.gpu
            .run_launches(&self.candidate, &self.cand_launches, self.run_timeout)
            .map_err(|e| self.fail(e))?;
        self.check_printed()?;
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
        self.protect_kept().map_err(|e| self.fail(e))?;
        self.ensure(inputs).map_err(|e| self.fail(e))?;
        self.prepare_candidate().map_err(|e| self.fail(e))?;
        let cfg = SampleConfig::contract(&self.cand_launches, self.run_timeout);
        let times = self
            .gpu
            .time_sample(&self.candidate, &self.cand_launches, &cfg)
            .map_err(|e| self.fail(e))?;
        self.check_printed()?;
        Ok(self.timer.record(&times))
    }

    fn plain_sample(&mut self, inputs: &GpuInputs) -> Result<f64, RunFailure> {
        self.protect_kept().map_err(|e| self.fail(e))?;
        self.ensure(inputs).map_err(|e| self.fail(e))?;
        let ms = self
            .gpu
            .time_plain(&self.candidate, &self.cand_launches, self.run_timeout)
            .map_err(|e| self.fail(e))?;
        self.check_printed()?;
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

    fn overhead(&mut self) -> Result<f64, RunFailure> {
        Ok(0.0) // events and kernel records time the GPU itself
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
        self.telemetry.start();
    }

    fn timer_evidence(&self, excluded: &[usize]) -> Option<kiln_types::TimerEvidence> {
        self.timer.evidence(excluded)
    }

    fn timing_finished(&mut self, windows: &[(Instant, Instant)]) -> Option<serde_json::Value> {
        Some(self.telemetry.finish(windows))
    }

    fn throttled_samples(&self) -> Vec<usize> {
        self.telemetry.flagged().to_vec()
    }
}

/// Elements still holding `kiln_gpu`'s poison pattern: (count, first few indices).
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

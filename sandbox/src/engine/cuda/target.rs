//! [`GpuTarget`]: the evaluation contract's mechanics on the worker's GPU. `evaluate_on`
//! sets a target up on the warm context ([`super::context::GpuContext`]) and hands it to
//! [`crate::engine::contract::Session`].
//!
//! Memory discipline (`crate::engine::contract`, docs/security.md section 4b): the problem's tensors are allocated per
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

use super::telemetry::Telemetry;
use super::timer_log::TimerLog;
use crate::engine::contract::data;
use crate::engine::contract::timing;
use crate::engine::contract::{CheckError, InputVariant, RunFailure, Session, Target, Unwritten};
use crate::engine::host::evaluate::TorchAsk;
use crate::engine::host::runner_ctl::RunnerConfig;
use crate::engine::hosted::gpu::{Exported, HostedGpu};
use crate::protocol::SharedTensor;
use kiln_gpu::artifact::Artifact;
use std::os::fd::OwnedFd;

/// Largest total scratch a candidate may ask for, bytes.
const MAX_SCRATCH_BYTES: u64 = 16 << 30;

/// Bytes kept after every buffer candidate code can reach (each tensor, each scratch
/// buffer), filled with a secret word before each candidate run and checked after it: a
/// write up to this far past a buffer's end (an unmasked store of one block too many, the
/// usual bounds bug) is a `runtime_fault`, where without it the write would land unseen in
/// allocator padding or the next buffer.
pub const GUARD_BYTES: usize = 64 << 10;

/// Where a buffer's data ends and its guard begins (data rounded up to 256 bytes).
fn guard_offset(data_bytes: u64) -> usize {
    (data_bytes as usize).next_multiple_of(256)
}

/// One guard: the buffer it follows, by name, and where in that buffer it starts.
struct Guard {
    name: String,
    of: GuardOf,
    offset: usize,
}

/// Which buffer a guard is part of.
#[derive(Clone, Copy)]
enum GuardOf {
    Tensor(usize),
    Scratch(usize),
}

/// What the worker hands to [`GpuContext::evaluate`](super::context::GpuContext::evaluate).
pub struct Job<'a, 'b> {
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
    /// The torch reference, when the problem has no cuda kernel: asked for the outputs of
    /// each checked input set (only between candidate runs).
    pub torch: Option<TorchReference<'a, 'b>>,
}

/// The torch runner working in place, in device memory this worker shares with it: given
/// what to do, the tensors (in problem order) and one exported descriptor per tensor, it
/// writes into them and answers (the reference: how it computed).
pub type TorchShare<'a> =
    dyn FnMut(SharedCall, &[SharedTensor], Vec<OwnedFd>) -> Result<String, String> + 'a;

/// What a shared-memory call to the torch runner does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedCall {
    /// The reference: the tensors are every input then every output; it writes the
    /// outputs.
    Reference,
    /// The problem's own inputs: the tensors are those whose init is `get_inputs`; it
    /// writes what the file's `get_inputs()` returns for them under `seed`.
    Inputs {
        /// The input set's secret seed (for torch's generators).
        seed: u64,
    },
}

/// Why an input set could not be put in place: the GPU, or the torch runner making the
/// problem's own inputs (kiln's failure either way; only the first can poison the context).
enum EnsureError {
    Gpu(GpuError),
    Runner(String),
}

impl std::fmt::Display for EnsureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnsureError::Gpu(e) => write!(f, "{e}"),
            EnsureError::Runner(e) => write!(f, "the problem's get_inputs(): {e}"),
        }
    }
}

/// How the worker reaches a torch reference.
pub enum TorchReference<'a, 'b> {
    /// The input set's bytes go out and the outputs' bytes come back (through host memory).
    Bytes(&'a mut TorchAsk<'b>),
    /// The tensors are shared: the runner maps them, computes, writes the outputs in place
    /// and unmaps them before it answers. No tensor crosses host memory.
    Shared(&'a mut TorchShare<'b>),
}

impl TorchReference<'_, '_> {
    /// Whether the problem's tensors must be exportable device memory.
    fn shares_memory(&self) -> bool {
        matches!(self, TorchReference::Shared(_))
    }
}

/// Where the reference's outputs come from. Declared before the buffers (drop order).
enum GpuReference<'t> {
    /// The problem's cuda kernel: its checked launch plan and its module.
    Kernel(CheckedLaunches, Module),
    /// The caller's torch reference runner (a process of its own, another CUDA context),
    /// given the inputs' bytes or the shared tensors; the precision it last reported.
    Torch(TorchReference<'t, 't>, String),
}

/// A candidate's compiled code as the GPU target loads it.
#[derive(Clone, Copy)]
pub enum Code<'a> {
    /// A CUDA C candidate's artifact: one CUBIN (or PTX) image whose kernels the plan names
    /// by their symbols.
    Artifact(&'a [u8]),
    /// Several images, each with the kernels taken from it as (name in the plan, symbol):
    /// a lowered Triton candidate (`engine::triton::lower`).
    Parts(&'a [(kiln_gpu::CompiledModule, Vec<(String, String)>)]),
    /// A hosted `ModelNew` file, run by its own python runner (`engine::hosted::gpu`).
    Hosted(&'a HostedCode<'a>),
}

/// What starting a hosted runner on the GPU takes.
pub struct HostedCode<'a> {
    /// The artifact: the file and the libraries its compile step built
    /// (`engine::hosted::artifact`).
    pub artifact: &'a [u8],
    /// The python and the import limit.
    pub hosted: crate::engine::hosted::Hosted<'a>,
    /// The runner's process settings (kiln-worker's path, tag, limits).
    pub runner: RunnerConfig<'a>,
    /// The job's scratch directory (the runner's home).
    pub dir: &'a std::path::Path,
}

/// The candidate's code as the target runs it.
enum CandCode {
    /// Kernels kiln launches from the checked plan.
    Launches(Module, CheckedLaunches),
    /// A hosted runner; the output hashes taken right after its last run's window.
    Hosted(Box<HostedGpu>, Option<Vec<u64>>),
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
    /// The guard after each buffer candidate code can reach, its secret word, the key of
    /// its hash and the hash it must have.
    guards: Vec<Guard>,
    guard_word: u64,
    guard_key: u64,
    guard_hash: u64,
    reference: GpuReference<'g>,
    code: CandCode,
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
    Evaluation::early(v, kiln_types::BackendKind::Cuda, msg)
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
    let ref_ks = problem.reference.kernel(kiln_types::BackendKind::Cuda);
    if ref_ks.is_none() && (problem.reference.torch.is_none() || job.torch.is_none()) {
        return Err(format!(
            "problem {} has no cuda reference (and no torch reference runner)",
            problem.name
        ));
    }
    if let Err(e) = check_scratch(problem, &job.candidate.scratch) {
        return Ok(early(Verdict::InvalidLaunch, e));
    }
    let no_scratch = Vec::new();
    let ref_scratch_spec = ref_ks.map_or(&no_scratch, |k| &k.scratch);
    check_scratch(problem, ref_scratch_spec).map_err(|e| format!("reference: {e}"))?;
    if let Some(p) = gpu.poisoned() {
        return Err(format!(
            "the GPU context is poisoned ({p}); the worker must be replaced"
        ));
    }
    let arch = gpu.facts().arch.clone();
    let infra = |what: &str, e: GpuError| format!("{what}: {e}");
    let hosted = matches!(job.candidate_code, Code::Hosted(_));
    // A hosted runner maps every tensor, whatever the reference does.
    let shared = hosted
        || (ref_ks.is_none()
            && job
                .torch
                .as_ref()
                .is_some_and(TorchReference::shares_memory));
    let mut tensors = Vec::new();
    for t in &problem.tensors {
        let bytes = guard_offset(t.bytes()) + GUARD_BYTES;
        let buf = if shared {
            gpu.alloc_shareable(bytes)
        } else {
            gpu.alloc(bytes)
        }
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
            let buf = gpu.alloc(guard_offset(s.elems * s.dtype.size()) + GUARD_BYTES)?;
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
        scratch(ref_scratch_spec).map_err(|e| infra("reference scratch", e))?;
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
    let reference = match (ref_ks, job.torch) {
        (Some(ref_ks), _) => {
            let ref_names = names(&ref_ks.launches);
            let ref_refs: Vec<&str> = ref_names.iter().map(String::as_str).collect();
            let ref_artifact = Artifact::decode(job.reference_artifact)
                .map_err(|e| format!("the reference's artifact: {e}"))?;
            let module = gpu
                .load_artifact(&ref_artifact, &ref_refs)
                .map_err(|e| infra("loading the reference module", e))?;
            let launches = gpu
                .check_launches(&module, &ref_ks.launches, &ref_args)
                .map_err(|e| format!("the reference's launch plan: {e}"))?;
            GpuReference::Kernel(launches, module)
        }
        // Re-wrapped so each reference's trait object takes the target's shorter lifetime.
        (None, Some(TorchReference::Bytes(ask))) => {
            GpuReference::Torch(TorchReference::Bytes(ask), String::new())
        }
        (None, Some(TorchReference::Shared(share))) => {
            GpuReference::Torch(TorchReference::Shared(share), String::new())
        }
        (None, None) => return Err("no reference".into()),
    };
    // What a hosted runner said when it was ready (parameters matched by order).
    let mut ready_notes: Vec<String> = Vec::new();
    let code = match job.candidate_code {
        Code::Hosted(h) => {
            let exported = tensors
                .iter()
                .map(|t| {
                    let mapped = kiln_gpu::shareable::mapped_bytes(&t.buf)
                        .ok_or_else(|| format!("tensor {} is not shared memory", t.name))?;
                    let fd = gpu.export_fd(&t.buf).map_err(|e| e.to_string())?;
                    Ok(Exported {
                        spec: &t.spec,
                        fd,
                        mapped: mapped as u64,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            let (runner, ready) = crate::engine::hosted::gpu::spawn(
                problem, h.artifact, exported, &h.hosted, &h.runner, h.dir, job.plan,
            )?;
            let failed = match ready {
                Ok(r) => crate::engine::hosted::ready_verdict(&r).map_or_else(
                    || {
                        ready_notes = r.notes.clone();
                        None
                    },
                    |(v, m)| {
                        let mut e = early(v, m);
                        if v == Verdict::RuntimeFault {
                            e.evidence.fault = r.error.clone();
                        }
                        Some(e)
                    },
                ),
                Err(end) => {
                    let f = runner.failure(end);
                    let (v, m) = match f {
                        RunFailure::Timeout(m) => (Verdict::Timeout, m),
                        RunFailure::Fault(m) | RunFailure::InvalidLaunch(m) => {
                            (Verdict::RuntimeFault, m)
                        }
                        RunFailure::Infra(m) => return Err(m),
                    };
                    Some(early(v, format!("importing the ModelNew file: {m}")))
                }
            };
            if let Some(mut e) = failed {
                e.trust = kiln_types::TrustMode::Hosted;
                e.evidence.output_excerpt = runner.output_excerpt();
                return Ok(e);
            }
            CandCode::Hosted(Box::new(runner), None)
        }
        code => {
            let cand_names = names(&job.candidate.launches);
            let cand_refs: Vec<&str> = cand_names.iter().map(String::as_str).collect();
            let loaded = match code {
                Code::Artifact(bytes) => Artifact::decode(bytes)
                    .map_err(|e| GpuError::Usage(e.to_string()))
                    .and_then(|a| gpu.load_artifact(&a, &cand_refs)),
                Code::Parts(parts) => {
                    let parts: Vec<kiln_gpu::ImagePart> = parts
                        .iter()
                        .map(|(module, kernels)| kiln_gpu::ImagePart { module, kernels })
                        .collect();
                    gpu.load_parts(&parts)
                }
                Code::Hosted(_) => unreachable!("matched above"),
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
            let cand_launches =
                match gpu.check_launches(&candidate, &job.candidate.launches, &cand_args) {
                    Ok(p) => p,
                    Err(e) => return Ok(early(Verdict::InvalidLaunch, e.to_string())),
                };
            CandCode::Launches(candidate, cand_launches)
        }
    };
    let kernels = match &code {
        CandCode::Launches(candidate, cand_launches) => resources(candidate, cand_launches),
        CandCode::Hosted(..) => Vec::new(),
    };
    let n_launches = match &code {
        CandCode::Launches(_, l) => l.launches.len(),
        CandCode::Hosted(..) => 0,
    };
    let device = serde_json::json!({
        "name": gpu.facts().name,
        "uuid": gpu.facts().uuid,
        "arch": arch,
    });
    let asked = problem.timing_figure.unwrap_or(job.plan.timing.figure);
    let timer = TimerLog::new(asked, kiln_gpu::cupti::status(), n_launches);
    let mut guards: Vec<Guard> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| Guard {
            name: format!("tensor {}", t.name),
            of: GuardOf::Tensor(i),
            offset: guard_offset(t.spec.bytes()),
        })
        .collect();
    guards.extend(
        job.candidate
            .scratch
            .iter()
            .enumerate()
            .map(|(j, sb)| Guard {
                name: format!("scratch buffer {}", sb.name),
                of: GuardOf::Scratch(j),
                offset: guard_offset(sb.elems * sb.dtype.size()),
            }),
    );
    let guard_key = derive_seed(job.plan.seed, "kiln/guard-hash");
    let guard_word = derive_seed(job.plan.seed, "kiln/guard-word");
    let guard_bytes: Vec<u8> = std::iter::repeat_n(guard_word.to_le_bytes(), GUARD_BYTES / 8)
        .flatten()
        .collect();
    let target = GpuTarget {
        guards,
        guard_word,
        guard_key,
        guard_hash: kiln_gpu::inputs::host_hash(&guard_bytes, guard_key),
        reference,
        code,
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
    e.evidence.notes.extend(ready_notes);
    let hosted_kernels = hosted_breakdown(&mut session.target, job.candidate, &mut e);
    if let GpuReference::Torch(_, precision) = &session.target.reference
        && !precision.is_empty()
    {
        e.evidence.notes.push(format!(
            "reference: the problem's PyTorch module, computed in {precision}"
        ));
    }
    let mut tele = serde_json::json!({ "device": device });
    tele["kernels"] = serde_json::to_value(&kernels).unwrap_or_default();
    if let Some(mut gpu_t) = session.telemetry.take() {
        gpu_t["throttle_policy"] =
            serde_json::to_value(job.plan.timing.throttle_policy).unwrap_or_default();
        // The worker never changes clocks; kilnd says when it locked them.
        gpu_t["clock_policy"] = "observe".into();
        tele["gpu"] = gpu_t;
    }
    if let Some(k) = hosted_kernels {
        tele["hosted"] = k;
    }
    // A hosted file's recorded forwards, lifted into a contract candidate where they allow.
    if let (Code::Hosted(h), CandCode::Hosted(runner, _)) =
        (&job.candidate_code, &session.target.code)
        && job.plan.record_launches
    {
        let lift = crate::engine::hosted::lifting::outcome(
            problem,
            h.artifact,
            runner.recordings(),
            e.verdict,
        );
        tele[kiln_types::lift::TELEMETRY_KEY] = serde_json::to_value(lift).unwrap_or_default();
    }
    e.telemetry = Some(tele);
    e.compile = Some(match &session.target.code {
        CandCode::Hosted(runner, _) => runner.compile_info(),
        CandCode::Launches(..) => CompileInfo {
            kernels,
            ..CompileInfo::default()
        },
    });
    Ok(e)
}

/// For a hosted file that came out correct and timed: the kernels one more forward
/// launches (the runner's claim), sorted into the file's own and library ones, as JSON for
/// the telemetry; a forward with none of its own turns `ok` into `no_own_kernels` (its
/// time kept). A runner that cannot say leaves the verdict and adds a note.
fn hosted_breakdown(
    target: &mut GpuTarget<'_>,
    candidate: &Candidate,
    e: &mut Evaluation,
) -> Option<serde_json::Value> {
    let CandCode::Hosted(runner, _) = &mut target.code else {
        return None;
    };
    if !matches!(e.verdict, Verdict::Ok | Verdict::UnmeasurableTime) {
        return None;
    }
    let records = match runner.kernels() {
        Ok(r) => r,
        Err(why) => {
            e.evidence
                .notes
                .push(format!("kernels: not recorded ({why})"));
            return None;
        }
    };
    let b = crate::engine::hosted::kernels::classify(&candidate.source, records);
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
    if let Some(t) = &e.timing
        && b.own_us + b.library_us > t.median_us * 1.5 + 5.0
    {
        e.evidence.notes.push(format!(
            "kernels: the runner's records sum to {:.1} us of GPU time, above the {:.1} us \
             kiln measured from its side: they disagree (the records are the runner's claim)",
            b.own_us + b.library_us,
            t.median_us
        ));
    }
    e.evidence.notes.push(format!(
        "kernels: {} recorded, {:.0} % of their GPU time in library kernels (the runner's \
         claim)",
        b.kernels.len(),
        100.0 * b.library_fraction()
    ));
    Some(b.to_json())
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

    /// One run of a hosted file's forward (the inputs current, the outputs poisoned): the
    /// L2 flushed and the worker's stream idle first (`timed`), the time on the worker's
    /// clock from `G` to `D`, µs; then the outputs hashed at once (see
    /// [`GpuTarget::check_after_window`]) and the guards checked.
    fn hosted_run(&mut self, timed: bool) -> Result<f64, RunFailure> {
        if timed {
            self.gpu.l2_flush().map_err(|e| self.fail(e))?;
        }
        self.gpu.synchronize().map_err(|e| self.fail(e))?;
        let CandCode::Hosted(runner, _) = &mut self.code else {
            return Err(RunFailure::Fault("internal: not a hosted candidate".into()));
        };
        let us = if timed {
            runner.run()?
        } else {
            runner.run_untimed()?;
            0.0
        };
        let mut hashes = Vec::new();
        for i in self.outputs() {
            let t = &self.tensors[i];
            let h = self
                .gpu
                .hash_range(&t.buf, 0, t.spec.bytes() as usize, self.hash_key)
                .map_err(|e| self.fail(e))?;
            hashes.push(h);
        }
        if let CandCode::Hosted(_, after) = &mut self.code {
            *after = Some(hashes);
        }
        self.check_guards()?;
        Ok(us)
    }

    /// A hosted run's outputs are still what they were right after its window: work the
    /// file left running on the GPU after answering would change them later.
    fn check_after_window(&self) -> Result<(), RunFailure> {
        let CandCode::Hosted(_, Some(after)) = &self.code else {
            return Ok(());
        };
        for (i, want) in self.outputs().into_iter().zip(after) {
            let t = &self.tensors[i];
            let got = self
                .gpu
                .hash_range(&t.buf, 0, t.spec.bytes() as usize, self.hash_key)
                .map_err(|e| self.fail(e))?;
            if got != *want {
                return Err(RunFailure::Fault(format!(
                    "output {} changed after the runner answered: work left running on the \
                     GPU after forward returned",
                    t.name
                )));
            }
        }
        Ok(())
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
    fn ensure(&mut self, inputs: &GpuInputs) -> Result<(), EnsureError> {
        if self.current == Some(inputs.id) {
            return Ok(());
        }
        // Not current until every input is in place.
        self.current = None;
        let mut from_problem = Vec::new();
        let mut set_seed = None;
        for &(i, init, seed) in &inputs.draws {
            if init == Init::GetInputs {
                from_problem.push(i);
                set_seed.get_or_insert(seed);
                continue;
            }
            let t = &self.tensors[i];
            self.gpu
                .fill(&t.buf, t.dtype, t.elems, &init, seed)
                .map_err(EnsureError::Gpu)?;
        }
        self.gpu.synchronize().map_err(EnsureError::Gpu)?;
        if let Some(seed) = set_seed {
            self.fill_from_problem(&from_problem, seed)
                .map_err(EnsureError::Runner)?;
        }
        self.current = Some(inputs.id);
        Ok(())
    }

    /// [`GpuTarget::ensure`] where candidate code is about to run: a GPU error is the
    /// run's failure, the torch runner's is kiln's.
    fn ensure_for_run(&mut self, inputs: &GpuInputs) -> Result<(), RunFailure> {
        match self.ensure(inputs) {
            Ok(()) => Ok(()),
            Err(EnsureError::Gpu(e)) => Err(self.fail(e)),
            Err(e @ EnsureError::Runner(_)) => Err(RunFailure::Infra(e.to_string())),
        }
    }

    /// Has the torch runner write the problem's own inputs (those of `indices`, made by
    /// its file's `get_inputs()` under `seed`) into their tensors, in shared memory.
    fn fill_from_problem(&mut self, indices: &[usize], seed: u64) -> Result<(), String> {
        let GpuReference::Torch(TorchReference::Shared(share), _) = &mut self.reference else {
            return Err(
                "inputs from get_inputs() need the torch runner on shared memory \
                        (a GPU worker whose stream is a socket)"
                    .into(),
            );
        };
        let (listed, fds) = export_tensors(self.gpu, indices.iter().map(|&i| &self.tensors[i]))?;
        share(SharedCall::Inputs { seed }, &listed, fds).map(drop)
    }

    /// Poisons the outputs, zeroes the candidate's scratch and arms every guard.
    fn prepare_candidate(&self) -> Result<(), GpuError> {
        for t in self.tensors.iter().filter(|t| t.role == Role::Output) {
            self.gpu.poison(&t.buf, t.dtype, t.elems)?;
        }
        for b in &self.cand_scratch {
            self.gpu.memset(b, 0)?;
        }
        self.arm_guards()
    }

    /// Fills every guard with its word (kiln's own scrubs zero whole buffers).
    fn arm_guards(&self) -> Result<(), GpuError> {
        for g in &self.guards {
            self.gpu
                .pattern_range(self.guarded(g.of), g.offset, GUARD_BYTES, self.guard_word)?;
        }
        Ok(())
    }

    fn guarded(&self, of: GuardOf) -> &DeviceBuffer {
        match of {
            GuardOf::Tensor(i) => &self.tensors[i].buf,
            GuardOf::Scratch(j) => &self.cand_scratch[j],
        }
    }

    /// After candidate code ran: every guard still holds its word, or the run wrote past
    /// the end of a buffer (a fault of the candidate's).
    fn check_guards(&self) -> Result<(), RunFailure> {
        for g in &self.guards {
            let h = self
                .gpu
                .hash_range(self.guarded(g.of), g.offset, GUARD_BYTES, self.guard_key)
                .map_err(|e| self.fail(e))?;
            if h != self.guard_hash {
                return Err(RunFailure::Fault(format!(
                    "out-of-bounds write: candidate code wrote past the end of {} (into the \
                     {} KiB kiln keeps after every buffer)",
                    g.name,
                    GUARD_BYTES >> 10
                )));
            }
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
                if !tol.accepts(gv, wv) {
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

    /// Writes the torch reference's answer (one blob per output, problem order) into the
    /// output tensors.
    fn upload_answer(&self, blobs: &[Vec<u8>]) -> Result<(), String> {
        let outs: Vec<&Tensor> = self
            .tensors
            .iter()
            .filter(|t| t.role == Role::Output)
            .collect();
        if blobs.len() != outs.len() {
            return Err(format!(
                "the torch reference answered {} outputs; the problem has {}",
                blobs.len(),
                outs.len()
            ));
        }
        for (t, blob) in outs.into_iter().zip(blobs) {
            if blob.len() as u64 != t.spec.bytes() {
                return Err(format!(
                    "the torch reference answered {} bytes for {}; it has {}",
                    blob.len(),
                    t.name,
                    t.spec.bytes()
                ));
            }
            self.gpu
                .upload(&t.buf, 0, blob)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Runs the reference on `inputs` into the output tensors, checks it wrote them all.
    fn run_reference(&mut self, inputs: &GpuInputs) -> Result<(), String> {
        let wrap = |e: GpuError| e.to_string();
        self.ensure(inputs).map_err(|e| e.to_string())?;
        for t in self.tensors.iter().filter(|t| t.role == Role::Output) {
            self.gpu.poison(&t.buf, t.dtype, t.elems).map_err(wrap)?;
        }
        for b in &self.ref_scratch {
            self.gpu.memset(b, 0).map_err(wrap)?;
        }
        let (launches, module) = match &mut self.reference {
            GpuReference::Kernel(launches, module) => (&*launches, &*module),
            GpuReference::Torch(TorchReference::Shared(share), precision) => {
                // The runner maps the tensors, reads the inputs and writes the outputs in
                // place; it has unmapped them and synchronized before it answers.
                self.gpu.synchronize().map_err(wrap)?;
                let in_order = [Role::Input, Role::Output]
                    .into_iter()
                    .flat_map(|r| self.tensors.iter().filter(move |t| t.role == r));
                let (listed, fds) = export_tensors(self.gpu, in_order)?;
                *precision = share(SharedCall::Reference, &listed, fds)?;
                for i in self.outputs() {
                    let t = &self.tensors[i];
                    let (n, _) = self.unwritten_in(&t.buf, t).map_err(wrap)?;
                    if n > 0 {
                        return Err(format!(
                            "the torch reference left {n} elements of {} unwritten",
                            t.name
                        ));
                    }
                }
                return Ok(());
            }
            GpuReference::Torch(TorchReference::Bytes(ask), precision) => {
                // The torch runner computes from the inputs' bytes in its own process; its
                // answer is written into the output tensors, as the kernel would have.
                // Tensors of any size: a blob longer than a frame travels as several
                // frames (see `protocol`).
                let mut sent = Vec::new();
                for t in self.tensors.iter().filter(|t| t.role == Role::Input) {
                    let bytes = self
                        .gpu
                        .download_vec::<u8>(&t.buf, t.spec.bytes() as usize)
                        .map_err(wrap)?;
                    sent.push((t.name.clone(), bytes));
                }
                let (mut blobs, how) = ask(&sent)?;
                drop(sent);
                *precision = how;
                let uploaded = self.upload_answer(&blobs);
                // The answer's host copy is wiped before candidate code runs again (a GPU
                // with HMM can read the worker's pageable memory).
                for b in &mut blobs {
                    b.fill(0);
                    std::hint::black_box(&b);
                }
                return uploaded;
            }
        };
        let limit = self.run_timeout.max(Duration::from_secs(10)) * 4;
        self.gpu
            .run_launches(module, launches, limit)
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

/// The shared-memory list and one exported descriptor for each of `tensors`, in order.
fn export_tensors<'t>(
    gpu: &Gpu,
    tensors: impl Iterator<Item = &'t Tensor>,
) -> Result<(Vec<SharedTensor>, Vec<OwnedFd>), String> {
    let mut listed = Vec::new();
    let mut fds = Vec::new();
    for t in tensors {
        let mapped = kiln_gpu::shareable::mapped_bytes(&t.buf)
            .ok_or_else(|| format!("tensor {} is not shared memory", t.name))?;
        fds.push(gpu.export_fd(&t.buf).map_err(|e| e.to_string())?);
        listed.push(SharedTensor {
            name: t.name.clone(),
            mapped: mapped as u64,
        });
    }
    Ok((listed, fds))
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
            let t = &self.tensors[i];
            let h = self
                .gpu
                .hash_range(&t.buf, 0, t.spec.bytes() as usize, self.hash_key)
                .map_err(|e| format!("hashing inputs on the GPU: {e}"))?;
            inputs.hashes.push((i, h));
        }
        Ok(inputs)
    }

    fn keep(&mut self, slot: usize) -> Result<(usize, Vec<Unwritten>), RunFailure> {
        self.check_after_window()?;
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
        // The reference writes the output tensors: from here on they are not a hosted
        // run's any more, and its post-window hashes no longer apply.
        if let CandCode::Hosted(_, after) = &mut self.code {
            *after = None;
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
        self.ensure_for_run(inputs)?;
        self.prepare_candidate().map_err(|e| self.fail(e))?;
        if let CandCode::Hosted(..) = self.code {
            self.hosted_run(false)?;
            return Ok(0.0);
        }
        let CandCode::Launches(candidate, launches) = &self.code else {
            unreachable!("hosted returned above");
        };
        self.gpu
            .run_launches(candidate, launches, self.run_timeout)
            .map_err(|e| self.fail(e))?;
        self.check_printed()?;
        self.check_guards()?;
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
        self.ensure_for_run(inputs)?;
        self.prepare_candidate().map_err(|e| self.fail(e))?;
        if let CandCode::Hosted(..) = self.code {
            return self.hosted_run(true);
        }
        let CandCode::Launches(candidate, launches) = &self.code else {
            unreachable!("hosted returned above");
        };
        let cfg = SampleConfig::contract(launches, self.run_timeout);
        let times = self
            .gpu
            .time_sample(candidate, launches, &cfg)
            .map_err(|e| self.fail(e))?;
        self.check_printed()?;
        self.check_guards()?;
        Ok(self.timer.record(&times))
    }

    fn plain_sample(&mut self, inputs: &GpuInputs) -> Result<f64, RunFailure> {
        self.protect_kept().map_err(|e| self.fail(e))?;
        self.ensure_for_run(inputs)?;
        self.arm_guards().map_err(|e| self.fail(e))?;
        let CandCode::Launches(candidate, launches) = &self.code else {
            return Err(RunFailure::Fault(timing::plain::UNSUPPORTED.into()));
        };
        let ms = self
            .gpu
            .time_plain(candidate, launches, self.run_timeout)
            .map_err(|e| self.fail(e))?;
        self.check_printed()?;
        self.check_guards()?;
        Ok(ms * 1e3)
    }

    fn tampered(&mut self, inputs: &GpuInputs) -> Result<Vec<String>, RunFailure> {
        let mut changed = Vec::new();
        for &(i, want) in &inputs.hashes {
            let t = &self.tensors[i];
            let got = self
                .gpu
                .hash_range(&t.buf, 0, t.spec.bytes() as usize, self.hash_key)
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
        match &mut self.code {
            // The worker's clock around a round trip: its empty round trip is the overhead.
            CandCode::Hosted(runner, _) => runner.overhead(),
            // Events and kernel records time the GPU itself.
            CandCode::Launches(..) => Ok(0.0),
        }
    }

    fn overhead_probe(&mut self) -> Result<Option<f64>, RunFailure> {
        match &mut self.code {
            CandCode::Hosted(runner, _) => runner.empty().map(Some),
            CandCode::Launches(..) => Ok(None),
        }
    }

    fn trust(&self) -> kiln_types::TrustMode {
        match self.code {
            CandCode::Hosted(..) => kiln_types::TrustMode::Hosted,
            CandCode::Launches(..) => kiln_types::TrustMode::Contract,
        }
    }

    fn resolution_us(&self) -> f64 {
        if let CandCode::Hosted(..) = self.code {
            return crate::jail::sys::monotonic_resolution()
                .map_or(1e-3, |d| d.as_secs_f64() * 1e6)
                .max(1e-3);
        }
        match self.timer.figure() {
            kiln_types::TimingFigure::Events => EVENT_RESOLUTION_US,
            _ => KERNEL_RECORD_RESOLUTION_US,
        }
    }

    fn outputs_every_sample(&self) -> bool {
        false // a check per sample would dominate short kernels' wall time
    }

    fn output_excerpt(&self) -> Option<String> {
        match &self.code {
            CandCode::Hosted(runner, _) => runner.output_excerpt(),
            CandCode::Launches(..) => super::printf::excerpt(),
        }
    }

    fn timing_started(&mut self) {
        self.timer.reset();
        self.telemetry.start();
    }

    fn timer_evidence(&self, excluded: &[usize]) -> Option<kiln_types::TimerEvidence> {
        match self.code {
            CandCode::Hosted(..) => None,
            CandCode::Launches(..) => self.timer.evidence(excluded),
        }
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

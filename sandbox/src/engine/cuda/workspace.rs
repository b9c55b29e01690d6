//! [`GpuWorkspace`]: one evaluation's memory on the worker's GPU and the trusted reference
//! beside it, shared by the two targets that run candidate code there: kiln's launch plan
//! ([`super::target::GpuTarget`], trust `contract`) and a hosted `ModelNew` runner
//! (`engine::hosted::gpu_target::HostedGpuTarget`, trust `hosted`).
//!
//! Memory discipline (`crate::engine::contract`, docs/security.md section 4b): the problem's
//! tensors are allocated per evaluation and shared by the reference and the candidate; the
//! candidate has its own scratch. Inputs are drawn on the GPU (`Gpu::fill`) from the secret
//! seed and hashed on the GPU with a secret key. Outputs are poisoned and the candidate's
//! scratch zeroed before every candidate run, and a guard after every buffer candidate code
//! can reach is armed. A candidate run's outputs are copied into kiln's own "kept" buffers
//! (hashed, so a later run that scribbles on them is caught). Only after the candidate's
//! runs does the reference run, into the output tensors; `kiln_compare` compares the kept
//! copies with it on the GPU, and the outputs and the reference's scratch are zeroed
//! before any candidate code runs again — reference results are resident only while no
//! candidate code can run. Nothing but a few counters and, on a mismatch, a window of a
//! few thousand elements is downloaded.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::time::Duration;

use kiln_gpu::artifact::Artifact;
use kiln_gpu::compare::{Against, Comparison};
use kiln_gpu::inputs::{derive_seed, poison_pattern};
use kiln_gpu::launch::BufferArg;
use kiln_gpu::{CheckedLaunches, DeviceBuffer, Gpu, GpuError, Module};
use kiln_types::verdict::Mismatch;
use kiln_types::{
    Candidate, Dtype, ErrorMetrics, EvalPlan, Evaluation, Init, ProblemSpec, Role, Tolerance,
    Verdict,
};

use super::telemetry::Telemetry;
use crate::engine::contract::data;
use crate::engine::contract::{CheckError, InputVariant, RunFailure, Unwritten};
use crate::engine::host::evaluate::TorchAsk;
use crate::protocol::SharedTensor;

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

/// What the worker hands to a GPU target (its code comes beside it: a launch plan's
/// modules, or a hosted file).
pub struct Job<'a, 'b> {
    /// The problem.
    pub problem: &'a ProblemSpec,
    /// The candidate.
    pub candidate: &'a Candidate,
    /// The plan (secret seed, trials, stop rule, peaks).
    pub plan: &'a EvalPlan,
    /// The reference's CUBIN/PTX.
    pub reference_artifact: &'a [u8],
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

/// One evaluation's buffers on the GPU and its reference. Field order is drop order:
/// the reference's module, then the buffers (scrubbed when freed); the GPU outlives it.
pub struct GpuWorkspace<'g> {
    /// The guard after each buffer candidate code can reach, its secret word, the key of
    /// its hash and the hash it must have.
    guards: Vec<Guard>,
    guard_word: u64,
    guard_key: u64,
    guard_hash: u64,
    reference: GpuReference<'g>,
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
    telemetry: &'g mut Telemetry,
    gpu: &'g Gpu,
}

/// What [`GpuWorkspace::open`] came to: a workspace with the arguments the candidate's
/// launches may name (its tensors and scratch), or the candidate's verdict before any of
/// its code ran (a scratch list that cannot be had).
pub enum Opened<'g> {
    /// Ready for candidate code.
    Ready(Box<GpuWorkspace<'g>>, BTreeMap<String, BufferArg>),
    /// The candidate's verdict already.
    Early(Box<Evaluation>),
}

/// An evaluation on the cuda backend that ends before any candidate code ran.
pub fn early(v: Verdict, msg: String) -> Evaluation {
    Evaluation::early(v, kiln_types::BackendKind::Cuda, msg)
}

/// Where a workspace's tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// The worker's own allocations.
    Private,
    /// Allocations another process can map (a hosted runner maps every tensor; a torch
    /// reference on shared memory maps them too).
    Shareable,
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

impl<'g> GpuWorkspace<'g> {
    /// Allocates the problem's tensors (each with its guard) and the scratch of both sides,
    /// loads and checks the reference, and arms nothing yet. `Err` is kiln's failure (a
    /// broken reference, the GPU), never the candidate's.
    pub fn open<'a: 'g, 'b: 'g>(
        gpu: &'g Gpu,
        telemetry: &'g mut Telemetry,
        job: Job<'a, 'b>,
        memory: Memory,
    ) -> Result<Opened<'g>, String> {
        let problem = job.problem;
        let ref_ks = problem.reference.kernel(kiln_types::BackendKind::Cuda);
        if ref_ks.is_none() && (problem.reference.torch.is_none() || job.torch.is_none()) {
            return Err(format!(
                "problem {} has no cuda reference (and no torch reference runner)",
                problem.name
            ));
        }
        if let Err(e) = check_scratch(problem, &job.candidate.scratch) {
            return Ok(Opened::Early(Box::new(early(Verdict::InvalidLaunch, e))));
        }
        let no_scratch = Vec::new();
        let ref_scratch_spec = ref_ks.map_or(&no_scratch, |k| &k.scratch);
        check_scratch(problem, ref_scratch_spec).map_err(|e| format!("reference: {e}"))?;
        if let Some(p) = gpu.poisoned() {
            return Err(format!(
                "the GPU context is poisoned ({p}); the worker must be replaced"
            ));
        }
        let infra = |what: &str, e: GpuError| format!("{what}: {e}");
        let shared = memory == Memory::Shareable
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
                return Ok(Opened::Early(Box::new(early(
                    Verdict::InvalidLaunch,
                    format!("cannot allocate the candidate's scratch: {e}"),
                ))));
            }
        };
        let reference = match (ref_ks, job.torch) {
            (Some(ref_ks), _) => {
                let ref_names: Vec<&str> =
                    ref_ks.launches.iter().map(|l| l.kernel.as_str()).collect();
                let ref_artifact = Artifact::decode(job.reference_artifact)
                    .map_err(|e| format!("the reference's artifact: {e}"))?;
                let module = gpu
                    .load_artifact(&ref_artifact, &ref_names)
                    .map_err(|e| infra("loading the reference module", e))?;
                let launches = gpu
                    .check_launches(&module, &ref_ks.launches, &ref_args)
                    .map_err(|e| format!("the reference's launch plan: {e}"))?;
                GpuReference::Kernel(launches, module)
            }
            // Re-wrapped so each reference's trait object takes the workspace's shorter
            // lifetime.
            (None, Some(TorchReference::Bytes(ask))) => {
                GpuReference::Torch(TorchReference::Bytes(ask), String::new())
            }
            (None, Some(TorchReference::Shared(share))) => {
                GpuReference::Torch(TorchReference::Shared(share), String::new())
            }
            (None, None) => return Err("no reference".into()),
        };
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
        let plan = job.plan;
        let guard_key = derive_seed(plan.seed, "kiln/guard-hash");
        let guard_word = derive_seed(plan.seed, "kiln/guard-word");
        let guard_bytes: Vec<u8> = std::iter::repeat_n(guard_word.to_le_bytes(), GUARD_BYTES / 8)
            .flatten()
            .collect();
        let ws = GpuWorkspace {
            guards,
            guard_word,
            guard_key,
            guard_hash: kiln_gpu::inputs::host_hash(&guard_bytes, guard_key),
            reference,
            tensors,
            ref_scratch,
            cand_scratch,
            kept: Vec::new(),
            awaiting: Vec::new(),
            run_timeout: Duration::from_millis(plan.run_timeout_ms.max(1)),
            output_limit: job.output_limit_bytes,
            hash_key: derive_seed(plan.seed, "kiln/input-hash"),
            current: None,
            next_id: 0,
            telemetry,
            gpu,
        };
        Ok(Opened::Ready(Box::new(ws), cand_args))
    }

    /// The GPU.
    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    /// The run timeout of the plan.
    pub fn run_timeout(&self) -> Duration {
        self.run_timeout
    }

    /// The telemetry around the timing window.
    pub fn telemetry(&mut self) -> &mut Telemetry {
        self.telemetry
    }

    /// Samples of the last timing window that overlapped an NVML reading with a
    /// throttling reason.
    pub fn throttled_samples(&self) -> Vec<usize> {
        self.telemetry.flagged().to_vec()
    }

    /// What the evaluation's telemetry says of the device, the timing window's NVML
    /// readings (`window`, the session's), and the reference's precision as a note on `e`.
    pub fn finish(
        &self,
        e: &mut Evaluation,
        plan: &EvalPlan,
        window: Option<serde_json::Value>,
    ) -> serde_json::Value {
        if let GpuReference::Torch(_, precision) = &self.reference
            && !precision.is_empty()
        {
            e.evidence.notes.push(format!(
                "reference: the problem's PyTorch module, computed in {precision}"
            ));
        }
        let facts = self.gpu.facts();
        let mut tele = serde_json::json!({
            "device": { "name": facts.name, "uuid": facts.uuid, "arch": facts.arch },
        });
        if let Some(mut gpu_t) = window {
            gpu_t["throttle_policy"] =
                serde_json::to_value(plan.timing.throttle_policy).unwrap_or_default();
            // The worker never changes clocks; kilnd says when it locked them.
            gpu_t["clock_policy"] = "observe".into();
            tele["gpu"] = gpu_t;
        }
        tele
    }

    /// Every output tensor's keyed hash, in problem order.
    pub fn output_hashes(&self) -> Result<Vec<u64>, RunFailure> {
        let mut hashes = Vec::new();
        for i in self.outputs() {
            let t = &self.tensors[i];
            let h = self
                .gpu
                .hash_range(&t.buf, 0, t.spec.bytes() as usize, self.hash_key)
                .map_err(|e| self.fail(e))?;
            hashes.push(h);
        }
        Ok(hashes)
    }

    /// The output tensors whose keyed hash is no longer the one in `want` (in problem
    /// order, as [`GpuWorkspace::output_hashes`] gives them), by name.
    pub fn outputs_changed_since(&self, want: &[u64]) -> Result<Vec<String>, RunFailure> {
        let now = self.output_hashes()?;
        Ok(self
            .outputs()
            .into_iter()
            .zip(now.iter().zip(want))
            .filter(|(_, (got, want))| got != want)
            .map(|(i, _)| self.tensors[i].name.clone())
            .collect())
    }

    /// Exported descriptors of every tensor, in problem order, with each allocation's
    /// size (a hosted runner maps them).
    pub fn export_all(&self) -> Result<Vec<(&kiln_types::TensorSpec, OwnedFd, u64)>, String> {
        self.tensors
            .iter()
            .map(|t| {
                let mapped = kiln_gpu::shareable::mapped_bytes(&t.buf)
                    .ok_or_else(|| format!("tensor {} is not shared memory", t.name))?;
                let fd = self.gpu.export_fd(&t.buf).map_err(|e| e.to_string())?;
                Ok((&t.spec, fd, mapped as u64))
            })
            .collect()
    }

    /// Before candidate code runs on `inputs`: kept copies awaiting their check hashed,
    /// `inputs` made current, the outputs poisoned, the candidate's scratch zeroed and every
    /// guard armed.
    pub fn before_run(&mut self, inputs: &GpuInputs) -> Result<(), RunFailure> {
        self.protect_kept().map_err(|e| self.fail(e))?;
        self.ensure_for_run(inputs)?;
        self.prepare_candidate().map_err(|e| self.fail(e))
    }

    /// Before a plain (KernelBench-style) sample on `inputs`: as [`Self::before_run`], but
    /// the outputs are not poisoned again (plain samples follow one another unpoisoned).
    pub fn before_plain(&mut self, inputs: &GpuInputs) -> Result<(), RunFailure> {
        self.protect_kept().map_err(|e| self.fail(e))?;
        self.ensure_for_run(inputs)?;
        self.arm_guards().map_err(|e| self.fail(e))
    }

    /// The contract's failure for a GPU error while candidate code ran.
    pub fn fail(&self, e: GpuError) -> RunFailure {
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
    pub fn check_printed(&self) -> Result<(), RunFailure> {
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
    pub fn check_guards(&self) -> Result<(), RunFailure> {
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

    /// Draws an input set on the GPU from the secret `seed` (see `Target::draw`) and
    /// hashes it.
    pub fn draw(
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

    /// Copies the outputs of the last candidate run into kept `slot` (0 or 1; reused) and
    /// reports the outputs that still hold poison (then nothing is kept).
    pub fn keep(&mut self, slot: usize) -> Result<(usize, Vec<Unwritten>), RunFailure> {
        let unwritten_list = self.unwritten()?;
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

    /// The outputs of the last candidate run that still hold poison.
    pub fn unwritten(&mut self) -> Result<Vec<Unwritten>, RunFailure> {
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

    /// Runs the reference on `inputs` and compares each kept slot with it (see
    /// `Target::check`); the reference's results are scrubbed before this returns.
    pub fn check(
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

    /// Bitwise differences between two kept slots, and whether they agree within `tol`.
    pub fn diff(
        &mut self,
        a: &usize,
        b: &usize,
        tol: Tolerance,
    ) -> Result<(u64, bool), RunFailure> {
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

    /// Names of the inputs the last candidate run changed.
    pub fn tampered(&mut self, inputs: &GpuInputs) -> Result<Vec<String>, RunFailure> {
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

/// Elements downloaded around a first mismatch or hole, to list them by value.
const WINDOW: u64 = 4096;

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

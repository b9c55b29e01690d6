//! The lift (issue 29): a hosted `ModelNew` forward turned into an ordinary contract
//! candidate (CUDA device code plus a declarative launch plan) when what it did on the GPU
//! was a fixed sequence of the file's own kernel launches.
//!
//! Input: two recordings of the forward ([`Recording`], the runner's `R` command: every
//! CUDA API call that enqueued GPU work, with each launch's symbol, grid, block and
//! parameter bytes, and where kiln's tensors, the forward's outputs and torch's temporaries
//! lay), made on two different input draws by the same runner, and the file's device
//! sources ([`DeviceSource`], the extractor's reading of its text). [`lift`] checks that
//! the forward was only launches on torch's current stream (syncs are dropped; a memset, a
//! copy, a raw allocation or any other GPU work refuses the lift; torch's own fill kernel,
//! a `torch::zeros` in the wrapper, is kept as kiln's fill kernel: [`fill`]), that both draws made
//! the same launches with the same parameters, and maps each parameter: a pointer to the
//! start of one of kiln's tensors is that tensor, a pointer to the start of a block torch's
//! allocator handed out is a scratch buffer (`lift_scratch0`, ... in order of first use),
//! anything else a literal typed from the kernel's demangled signature. The kernel names
//! are the recorded symbols demangled into C++ name expressions ([`names`]), and the source
//! is the first device source that defines every launched kernel. Every way this can fail
//! is a [`Refusal`], with a stable [`Refusal::code`] for counting reasons.
//!
//! A forward that launched Triton kernels ([`lift_file`] finds the recordings' `triton`
//! captures) is lifted by [`triton`] into a `triton` candidate instead: every GPU launch
//! CUPTI saw must be one of the file's Triton launches (in order, named after the jit
//! function), and each becomes a launch of the file's Triton source (the extractor's:
//! its jit functions without autotune / heuristics), with the launch's non-constexpr
//! arguments, its constexprs and its options as the runner's capture of
//! `JITFunction.run` gave them.
//!
//! Why the result can be trusted although the recording cannot: the recording is a claim
//! by the candidate's own process (its python ran the forward, and the CUPTI callbacks
//! that wrote it live there), but the lift's product is only a proposal, [`Lifted`] — a
//! contract candidate that kiln then compiles, launches from its own plan and judges like
//! any other (kiln's inputs, poisoned outputs, its own timer, no candidate host code). A
//! recording that lies yields a different contract candidate, whose own verdict is honest:
//! wrong launches give wrong outputs, a missing launch leaves an output unwritten. The two
//! draws catch a wrapper whose plan depends on the data (a grid, a scalar or a launch
//! count that changes with the inputs), which one recording could not show. This module
//! is pure: no I/O, no GPU, and never a panic on what the runner wrote.

pub mod fill;
pub mod names;
pub mod recording;
pub mod triton;

#[cfg(test)]
mod tests;

use kiln_types::candidate::{
    Arg, Launch, MAX_ARGS, MAX_FLAGS, MAX_LAUNCHES, MAX_NOTE_BYTES, MAX_SCRATCH, MAX_SCRATCH_ELEMS,
    MAX_SOURCE_BYTES, Scalar, ScratchBuffer,
};
use kiln_types::{Candidate, Dtype, Language, ProblemSpec, Role};
use serde::Serialize;
use thiserror::Error;

use names::{KernelName, ScalarKind};
pub use recording::{
    Allocation, DeviceSource, DeviceSources, LaunchOp, MAX_OPS, MAX_PARAMS, Op, Param, Recording,
    Region, RegionRole, Stream, TritonArg, TritonLaunch, TritonSource,
};

/// Longest runner-given text (an error, an API or a symbol) quoted in a refusal.
const MAX_QUOTE: usize = 200;

/// `s`, cut to [`MAX_QUOTE`] bytes (at a character boundary) with `…` when longer.
pub(crate) fn clip(s: &str) -> String {
    if s.len() <= MAX_QUOTE {
        return s.to_string();
    }
    let mut end = MAX_QUOTE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Why a forward cannot be lifted into a launch plan.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refusal {
    /// The runner could not record the forward (its `error`).
    #[error("the forward could not be recorded: {0}")]
    NotRecorded(String),
    /// The runner's answer is not a recording kiln reads (malformed JSON, a list over its
    /// bound, a parameter's bytes that are not `2 * size` hex digits).
    #[error("the runner's recording is malformed: {0}")]
    BadRecording(String),
    /// A memset: a launch plan holds kernel launches only (kiln zeroes scratch itself).
    #[error("the forward calls {api}, a memset; a launch plan holds kernel launches only")]
    Memset {
        /// The API called.
        api: String,
    },
    /// A copy (host to device, device to host, device to device...).
    #[error("the forward calls {api}, a copy ({kind}); a launch plan holds kernel launches only")]
    Copy {
        /// The API called.
        api: String,
        /// The copy's kind as recorded.
        kind: String,
    },
    /// Device memory allocated outside torch's caching allocator.
    #[error(
        "the forward allocates device memory with {api} outside torch's allocator; a launch \
         plan's temporaries are scratch buffers"
    )]
    Alloc {
        /// The API called.
        api: String,
    },
    /// Other GPU work (a graph launch, an event on another stream...).
    #[error("the forward calls {api}, GPU work that is not a kernel launch")]
    Other {
        /// The API called.
        api: String,
    },
    /// No kernel was launched at all.
    #[error("the forward launched no kernel")]
    NoLaunches,
    /// The two draws launched differently: the plan depends on the data.
    #[error(
        "launch {launch} ({kernel}) differs between two input draws: {what} (the forward's \
         work depends on the data)"
    )]
    Differs {
        /// The launch (0-based).
        launch: usize,
        /// Its kernel (name expression, or the symbol when it does not demangle).
        kernel: String,
        /// What differs.
        what: String,
    },
    /// A launch on a stream other than torch's current one.
    #[error(
        "launch {launch} ({kernel}) is on a stream other than torch's current one; kiln runs a \
         plan on one stream"
    )]
    SideStream {
        /// The launch.
        launch: usize,
        /// Its kernel.
        kernel: String,
    },
    /// More than a launch plan holds.
    #[error("too large for a launch plan: {0}")]
    TooLarge(String),
    /// A pointer into a tensor (or a temporary) not at its start.
    #[error(
        "launch {launch} ({kernel}) parameter {param} points {offset} bytes into {name}; a \
         launch plan passes whole tensors only"
    )]
    Offset {
        /// The launch.
        launch: usize,
        /// Its kernel.
        kernel: String,
        /// The parameter (0-based).
        param: usize,
        /// The tensor (or "a temporary from torch's allocator").
        name: String,
        /// Bytes from its start.
        offset: u64,
    },
    /// One of torch's fills writes where no tensor of the problem and no temporary lies,
    /// or past the end of the one it starts at.
    #[error("launch {launch} (torch's fill) {why}")]
    FillTarget {
        /// The launch's position.
        launch: usize,
        /// What is wrong with where it writes.
        why: String,
    },
    /// A region the runner named after no tensor of the problem.
    #[error("{place} the runner's region {name:?}, which names no tensor of the problem")]
    UnknownTensor {
        /// The region's name as the runner gave it.
        name: String,
        /// Where it was met (`launch 0 (k) parameter 1 points into`, `the forward returned as
        /// an output`).
        place: String,
    },
    /// An output the forward returned that is not a contiguous tensor of its own.
    #[error(
        "output {name}: the forward returned a non-contiguous view; a launch plan writes \
         whole contiguous tensors"
    )]
    OutputView {
        /// The problem's output.
        name: String,
    },
    /// An output that shares memory with another tensor.
    #[error("output {name} overlaps {other} (the forward returned memory it was given)")]
    OutputIsInput {
        /// The problem's output.
        name: String,
        /// The tensor it overlaps.
        other: String,
    },
    /// An output no launch was given.
    #[error("output {name} is passed to no launch (the forward wrote it some other way)")]
    OutputUnwritten {
        /// The problem's output.
        name: String,
    },
    /// A literal parameter that is not a 4- or 8-byte scalar.
    #[error(
        "launch {launch} ({kernel}) parameter {param} is a {size}-byte value; a launch plan \
         passes 4- and 8-byte scalars and tensors only"
    )]
    ParamSize {
        /// The launch.
        launch: usize,
        /// Its kernel.
        kernel: String,
        /// The parameter.
        param: usize,
        /// Its size in bytes.
        size: u32,
    },
    /// A symbol that does not demangle to a name expression kiln launches by.
    #[error(
        "kernel symbol {symbol} does not demangle to a name kiln can launch by (an anonymous \
         namespace, a lambda, or a name that is no C++ name expression)"
    )]
    Demangle {
        /// The recorded symbol.
        symbol: String,
    },
    /// No device source defines the kernel (together with the forward's other kernels).
    #[error(
        "no device source read from the file defines kernel {kernel} (with all the forward's \
         other kernels); a library kernel cannot be part of a launch plan"
    )]
    NoSource {
        /// The kernel's name expression.
        kernel: String,
    },
    /// The GPU launches CUPTI saw are not the Triton launches the runner captured (a torch
    /// or library kernel between them, a launch only one of them saw, another grid...).
    #[error("launch {launch}: the GPU launches and the Triton launches do not match: {what}")]
    TritonMismatch {
        /// The launch (0-based, among the GPU launches).
        launch: usize,
        /// What does not match.
        what: String,
    },
    /// The forward launched both Triton kernels and the file's own CUDA kernels.
    #[error(
        "the forward launches Triton kernels and the file's CUDA kernel {kernel}: a candidate \
         is CUDA or Triton, not both"
    )]
    Mixed {
        /// The CUDA kernel (name expression).
        kernel: String,
    },
    /// A Triton launch's argument a launch plan cannot pass.
    #[error("Triton launch {launch} ({kernel}) argument {param}: {why}")]
    TritonArg {
        /// The launch.
        launch: usize,
        /// Its jit function.
        kernel: String,
        /// The parameter's name.
        param: String,
        /// Why it cannot be passed.
        why: String,
    },
    /// A Triton launch's compile option the contract does not take.
    #[error("Triton launch {launch} ({kernel}): {what}")]
    TritonOption {
        /// The launch.
        launch: usize,
        /// Its jit function.
        kernel: String,
        /// The option and why.
        what: String,
    },
    /// The file's Triton source (as the extractor read it) does not define the function.
    #[error(
        "the file's Triton source (its top-level @triton.jit functions, read from its text) \
         defines no jit function {kernel}"
    )]
    NoTritonSource {
        /// The jit function launched.
        kernel: String,
    },
}

impl Refusal {
    /// A short stable key for counting reasons.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::NotRecorded(_) => "not_recorded",
            Refusal::BadRecording(_) => "bad_recording",
            Refusal::Memset { .. } => "memset",
            Refusal::Copy { .. } => "copy",
            Refusal::Alloc { .. } => "alloc",
            Refusal::Other { .. } => "other_api",
            Refusal::NoLaunches => "no_launches",
            Refusal::Differs { .. } => "differs",
            Refusal::SideStream { .. } => "side_stream",
            Refusal::TooLarge(_) => "too_large",
            Refusal::Offset { .. } => "offset",
            Refusal::UnknownTensor { .. } => "unknown_tensor",
            Refusal::FillTarget { .. } => "fill_target",
            Refusal::OutputView { .. } => "output_view",
            Refusal::OutputIsInput { .. } => "output_is_input",
            Refusal::OutputUnwritten { .. } => "output_unwritten",
            Refusal::ParamSize { .. } => "param_size",
            Refusal::Demangle { .. } => "demangle",
            Refusal::NoSource { .. } => "no_source",
            Refusal::TritonMismatch { .. } => "triton_mismatch",
            Refusal::Mixed { .. } => "mixed",
            Refusal::TritonArg { .. } => "triton_arg",
            Refusal::TritonOption { .. } => "triton_option",
            Refusal::NoTritonSource { .. } => "no_triton_source",
        }
    }
}

/// A forward lifted into the contract: the pieces of a `cuda` or a `triton` candidate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lifted {
    /// The candidate's language: `cuda` (the file's load_inline kernels) or `triton` (its
    /// jit functions).
    pub language: Language,
    /// The device source holding every launched kernel (CUDA), or the file's Triton
    /// source (its jit functions, the imports and constants they use).
    pub source: String,
    /// Its author's flags that kiln accepts (the others dropped, each with a note); none
    /// for Triton.
    pub flags: Vec<String>,
    /// The launches, in the forward's order.
    pub launches: Vec<Launch>,
    /// torch's temporaries as scratch buffers (`u8`, their recorded bytes).
    pub scratch: Vec<ScratchBuffer>,
    /// What the lift did that a reader should know.
    pub notes: Vec<String>,
}

impl Lifted {
    /// The contract candidate ([`Lifted::language`]) for `problem`; its note says it was lifted (from
    /// `parent_note`, a word on where the forward came from, when not empty) and carries
    /// the lift's notes.
    pub fn candidate(&self, problem: &str, parent_note: &str) -> Candidate {
        let mut note = String::from("lifted into the contract from a hosted ModelNew forward");
        if !parent_note.trim().is_empty() {
            note.push_str(&format!(" ({})", parent_note.trim()));
        }
        for n in &self.notes {
            note.push_str("; ");
            note.push_str(n);
        }
        if note.len() > MAX_NOTE_BYTES {
            let mut end = MAX_NOTE_BYTES;
            while !note.is_char_boundary(end) {
                end -= 1;
            }
            note.truncate(end);
        }
        Candidate {
            problem: problem.to_string(),
            language: self.language,
            source: self.source.clone(),
            launches: self.launches.clone(),
            scratch: self.scratch.clone(),
            flags: self.flags.clone(),
            parent: None,
            note: Some(note),
        }
    }
}

/// A launch's kernel as shown in a refusal: its name expression, or its symbol.
fn shown(l: &LaunchOp) -> String {
    names::kernel_name(&l.symbol).map_or_else(|| clip(&l.symbol), |k| k.expr)
}

/// Refuses a recording over its bounds (one built without [`Recording::parse`]).
fn check_bounds(r: &Recording) -> Result<(), Refusal> {
    if r.ops.len() > MAX_OPS {
        return Err(Refusal::BadRecording(format!(
            "{} operations; at most {MAX_OPS} are read",
            r.ops.len()
        )));
    }
    if r.regions.len() > recording::MAX_REGIONS || r.allocations.len() > recording::MAX_ALLOCATIONS
    {
        return Err(Refusal::BadRecording(
            "too many regions or allocations".into(),
        ));
    }
    if let Some(l) = r.launches().find(|l| l.params.len() > MAX_PARAMS) {
        return Err(Refusal::BadRecording(format!(
            "a launch of {} with {} parameters; at most {MAX_PARAMS} are read",
            shown(l),
            l.params.len()
        )));
    }
    Ok(())
}

/// Refuses any operation but launches and syncs.
fn check_ops(r: &Recording) -> Result<(), Refusal> {
    for op in &r.ops {
        match op {
            Op::Launch(_) | Op::Sync { .. } => {}
            Op::Memset { api, .. } => return Err(Refusal::Memset { api: clip(api) }),
            Op::Copy { api, kind, .. } => {
                return Err(Refusal::Copy {
                    api: clip(api),
                    kind: clip(kind),
                });
            }
            Op::Alloc { api, .. } => return Err(Refusal::Alloc { api: clip(api) }),
            Op::Other { api } => return Err(Refusal::Other { api: clip(api) }),
        }
    }
    Ok(())
}

/// Refuses launches on any stream but torch's current one (`a`, `b`: the two draws'
/// launches, the same in number).
fn current_stream_only(a: &[&LaunchOp], b: &[&LaunchOp]) -> Result<(), Refusal> {
    match a
        .iter()
        .chain(b)
        .enumerate()
        .find(|(_, l)| l.stream != Stream::Current)
    {
        Some((i, l)) => Err(Refusal::SideStream {
            launch: i % a.len().max(1),
            kernel: shown(l),
        }),
        None => Ok(()),
    }
}

/// Refuses a plan of more than [`MAX_LAUNCHES`] launches.
fn within_launches(n: usize) -> Result<(), Refusal> {
    if n > MAX_LAUNCHES {
        return Err(Refusal::TooLarge(format!(
            "{n} launches; a plan holds at most {MAX_LAUNCHES}"
        )));
    }
    Ok(())
}

/// Refuses two launch sequences that differ in anything but their parameters' bytes.
fn compare_launches(a: &[&LaunchOp], b: &[&LaunchOp]) -> Result<(), Refusal> {
    if a.len() != b.len() {
        let i = a.len().min(b.len());
        let l = a.get(i).or(b.get(i)).copied();
        return Err(Refusal::Differs {
            launch: i,
            kernel: l.map(shown).unwrap_or_default(),
            what: format!(
                "{} launches in the first draw, {} in the second",
                a.len(),
                b.len()
            ),
        });
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let differs = |what: String| Refusal::Differs {
            launch: i,
            kernel: shown(x),
            what,
        };
        if x.symbol != y.symbol {
            return Err(differs(format!(
                "the kernel ({} then {})",
                shown(x),
                shown(y)
            )));
        }
        if x.grid != y.grid {
            return Err(differs(format!(
                "the grid ({:?} then {:?})",
                x.grid, y.grid
            )));
        }
        if x.block != y.block {
            return Err(differs(format!(
                "the block ({:?} then {:?})",
                x.block, y.block
            )));
        }
        if x.shared_bytes != y.shared_bytes {
            return Err(differs(format!(
                "the shared memory ({} then {} bytes)",
                x.shared_bytes, y.shared_bytes
            )));
        }
        if x.cooperative != y.cooperative || x.cluster != y.cluster {
            return Err(differs("the launch kind (cooperative or cluster)".into()));
        }
        if x.params.len() != y.params.len() {
            return Err(differs(format!(
                "the number of parameters ({} then {})",
                x.params.len(),
                y.params.len()
            )));
        }
        if let Some(j) = (0..x.params.len()).find(|&j| x.params[j].size != y.params[j].size) {
            return Err(differs(format!(
                "the size of parameter {j} ({} then {} bytes)",
                x.params[j].size, y.params[j].size
            )));
        }
    }
    Ok(())
}

/// What one recording's memory is: its regions with the problem tensor each stands for
/// (`None`: named after no tensor of the problem) and torch's temporaries.
struct Memory<'a> {
    regions: Vec<(&'a Region, Option<String>)>,
    allocations: Blocks,
}

/// torch's temporaries, sorted by start, for lookups in logarithmic time (a recording may
/// hold many, and every 8-byte parameter is looked up).
struct Blocks {
    /// `(start, bytes)`, sorted; empty blocks left out.
    sorted: Vec<(u64, u64)>,
    /// The furthest end among `sorted[..=i]`.
    reach: Vec<u64>,
}

impl Blocks {
    fn new(allocations: &[Allocation]) -> Blocks {
        let mut sorted: Vec<(u64, u64)> = allocations
            .iter()
            .filter(|a| a.bytes > 0)
            .map(|a| (a.ptr, a.bytes))
            .collect();
        sorted.sort_unstable();
        let mut reach = Vec::with_capacity(sorted.len());
        let mut end = 0u64;
        for (p, b) in &sorted {
            end = end.max(p.saturating_add(*b));
            reach.push(end);
        }
        Blocks { sorted, reach }
    }

    /// The largest block starting at `v`, in bytes.
    fn starting_at(&self, v: u64) -> Option<u64> {
        let from = self.sorted.partition_point(|(p, _)| *p < v);
        self.sorted[from..]
            .iter()
            .take_while(|(p, _)| *p == v)
            .map(|(_, b)| *b)
            .max()
    }

    /// The start of a block holding `v`, if any.
    fn holding(&self, v: u64) -> Option<u64> {
        let upto = self.sorted.partition_point(|(p, _)| *p <= v);
        if upto == 0 || self.reach[upto - 1] <= v {
            return None;
        }
        self.sorted[..upto]
            .iter()
            .rev()
            .find(|(p, b)| v < p.saturating_add(*b))
            .map(|(p, _)| *p)
    }
}

impl<'a> Memory<'a> {
    /// Maps `rec`'s regions to `problem`'s tensors and checks its outputs: each an output
    /// of the problem, contiguous, sharing no byte with another region.
    fn new(problem: &ProblemSpec, rec: &'a Recording) -> Result<Memory<'a>, Refusal> {
        let outputs: Vec<&str> = problem
            .tensors
            .iter()
            .filter(|t| t.role == Role::Output)
            .map(|t| t.name.as_str())
            .collect();
        let output_regions = rec
            .regions
            .iter()
            .filter(|r| r.role == RegionRole::Output)
            .count();
        let mut regions = Vec::with_capacity(rec.regions.len());
        for r in &rec.regions {
            let tensor = match r.role {
                RegionRole::Input | RegionRole::Weight | RegionRole::Buffer => problem
                    .tensor(&r.name)
                    .filter(|t| t.role == Role::Input)
                    .map(|t| t.name.clone()),
                RegionRole::Output => {
                    let named = outputs.iter().find(|o| **o == r.name);
                    // The one output, whatever the runner called it.
                    let only = (outputs.len() == 1 && output_regions == 1).then(|| &outputs[0]);
                    match named.or(only) {
                        Some(o) => Some(o.to_string()),
                        None => {
                            return Err(Refusal::UnknownTensor {
                                name: clip(&r.name),
                                place: "the forward returned as an output".into(),
                            });
                        }
                    }
                }
            };
            regions.push((r, tensor));
        }
        let label = |r: &Region, t: &Option<String>| t.clone().unwrap_or_else(|| clip(&r.name));
        for (k, (r, t)) in regions.iter().enumerate() {
            if r.role != RegionRole::Output {
                continue;
            }
            let name = label(r, t);
            if regions[..k]
                .iter()
                .any(|(o, ot)| o.role == RegionRole::Output && ot == t)
            {
                return Err(Refusal::BadRecording(format!(
                    "output {name} is recorded twice"
                )));
            }
            if r.contiguous != Some(true) {
                return Err(Refusal::OutputView { name });
            }
            if let Some((o, ot)) = regions
                .iter()
                .enumerate()
                .find(|(m, (o, _))| *m != k && r.overlaps(o))
                .map(|(_, x)| x)
            {
                return Err(Refusal::OutputIsInput {
                    name,
                    other: label(o, ot),
                });
            }
        }
        Ok(Memory {
            regions,
            allocations: Blocks::new(&rec.allocations),
        })
    }
}

/// What a parameter is in one recording.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Class {
    /// A problem tensor, by name.
    Tensor(String),
    /// torch's temporary number `n` (by first use).
    Scratch(usize),
    /// Its bytes, passed as they are.
    Literal(Vec<u8>),
}

impl Class {
    fn describe(&self) -> String {
        match self {
            Class::Tensor(n) => format!("tensor {n}"),
            Class::Scratch(k) => format!("temporary #{k}"),
            Class::Literal(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                format!("the literal bytes {}", clip(&hex))
            }
        }
    }
}

/// Every launch's parameters classified, and the temporaries' sizes by number.
struct Classified {
    args: Vec<Vec<Class>>,
    /// `(start, bytes)` of each temporary, by number.
    scratch: Vec<(u64, u64)>,
}

/// Classifies the parameters of one recording's `launches` in its `mem`.
fn classify(launches: &[&LaunchOp], mem: &Memory) -> Result<Classified, Refusal> {
    let mut out = Classified {
        args: Vec::with_capacity(launches.len()),
        scratch: Vec::new(),
    };
    for (i, l) in launches.iter().enumerate() {
        let mut args = Vec::with_capacity(l.params.len());
        for (j, p) in l.params.iter().enumerate() {
            let bytes = p.bytes().map_err(|e| {
                Refusal::BadRecording(format!("launch {i} ({}) parameter {j}: {e}", shown(l)))
            })?;
            let pointer = <[u8; 8]>::try_from(bytes.as_slice()).ok();
            let class = match pointer {
                Some(b) => pointer_class(mem, u64::from_le_bytes(b), &mut out.scratch)
                    .map_err(|miss| miss.refusal(i, l, j))?,
                None => None,
            };
            args.push(class.unwrap_or(Class::Literal(bytes)));
        }
        out.args.push(args);
    }
    Ok(out)
}

/// Why an 8-byte value could not be classified, before the launch is known.
enum Miss {
    Unknown(String),
    Offset(String, u64),
}

impl Miss {
    fn refusal(self, launch: usize, l: &LaunchOp, param: usize) -> Refusal {
        match self {
            Miss::Unknown(name) => Refusal::UnknownTensor {
                name,
                place: format!(
                    "launch {launch} ({}) parameter {param} points into",
                    shown(l)
                ),
            },
            Miss::Offset(name, offset) => Refusal::Offset {
                launch,
                kernel: shown(l),
                param,
                name,
                offset,
            },
        }
    }
}

/// What an 8-byte value `v` is: a tensor (at its start), a temporary of torch's allocator
/// (at its start; numbered in `scratch` by first use), or `None` (a literal).
fn pointer_class(
    mem: &Memory,
    v: u64,
    scratch: &mut Vec<(u64, u64)>,
) -> Result<Option<Class>, Miss> {
    let hit = mem
        .regions
        .iter()
        .find(|(r, _)| r.ptr == v && r.bytes > 0)
        .or_else(|| mem.regions.iter().find(|(r, _)| r.contains(v)));
    if let Some((r, t)) = hit {
        let Some(t) = t else {
            return Err(Miss::Unknown(clip(&r.name)));
        };
        if r.ptr != v {
            return Err(Miss::Offset(t.clone(), v - r.ptr));
        }
        return Ok(Some(Class::Tensor(t.clone())));
    }
    // The allocator may hand the same address out twice in a forward (a block freed and
    // reused): one temporary per start address, as large as the largest block there.
    if let Some(bytes) = mem.allocations.starting_at(v) {
        let n = match scratch.iter().position(|(p, _)| *p == v) {
            Some(n) => n,
            None => {
                scratch.push((v, bytes));
                scratch.len() - 1
            }
        };
        return Ok(Some(Class::Scratch(n)));
    }
    if let Some(start) = mem.allocations.holding(v) {
        return Err(Miss::Offset(
            "a temporary from torch's allocator".into(),
            v - start,
        ));
    }
    Ok(None)
}

/// The scalar for a literal's bytes, typed by its parameter's `kind` (`None`: no
/// signature). `None` for a size other than 4 or 8. The bytes are kept exactly: a float
/// that is not finite, or a type kiln does not know, is the integer of the same bytes.
fn scalar(bytes: &[u8], kind: Option<ScalarKind>) -> Option<Scalar> {
    if let Ok(b) = <[u8; 4]>::try_from(bytes) {
        let f = f32::from_le_bytes(b);
        return Some(match kind {
            Some(ScalarKind::F32) if f.is_finite() => Scalar::F32(f),
            _ => Scalar::I32(i32::from_le_bytes(b)),
        });
    }
    let b = <[u8; 8]>::try_from(bytes).ok()?;
    let f = f64::from_le_bytes(b);
    Some(match kind {
        Some(ScalarKind::F64) if f.is_finite() => Scalar::F64(f),
        Some(ScalarKind::Unsigned) => Scalar::U64(u64::from_le_bytes(b)),
        _ => Scalar::I64(i64::from_le_bytes(b)),
    })
}

/// Lifts a file's forward recorded on two input draws with the file's device sources:
/// through [`triton::lift`] when either draw captured a Triton launch, else through
/// [`lift`] (its load_inline CUDA).
pub fn lift_file(
    problem: &ProblemSpec,
    sources: &DeviceSources,
    first: &Recording,
    second: &Recording,
) -> Result<Lifted, Refusal> {
    if first.triton.is_empty() && second.triton.is_empty() {
        lift(problem, &sources.sources, first, second)
    } else {
        triton::lift(problem, sources, first, second)
    }
}

/// Lifts a forward recorded on two input draws (`first`, `second`, the same runner after
/// its first forward) into a launch plan over `problem`'s tensors, with the device code
/// of the first of `sources` that defines every launched kernel. The rules (spec §3), in
/// order, each failure a [`Refusal`]: both recorded; launches and syncs only; at least
/// one launch; the same launches in both draws; torch's current stream only; within a
/// plan's limits; every pointer a whole tensor or temporary, the same in both draws, the
/// outputs contiguous, apart from every input and each passed to a launch; literals of 4
/// or 8 bytes; symbols that demangle to name expressions; a source holding the kernels.
pub fn lift(
    problem: &ProblemSpec,
    sources: &[DeviceSource],
    first: &Recording,
    second: &Recording,
) -> Result<Lifted, Refusal> {
    let draws = [first, second];
    for r in draws {
        if let Some(e) = &r.error {
            return Err(Refusal::NotRecorded(clip(e)));
        }
    }
    for r in draws {
        check_bounds(r)?;
    }
    for r in draws {
        check_ops(r)?;
    }
    let a: Vec<&LaunchOp> = first.launches().collect();
    let b: Vec<&LaunchOp> = second.launches().collect();
    if a.is_empty() && b.is_empty() {
        return Err(Refusal::NoLaunches);
    }
    compare_launches(&a, &b)?;
    // torch's fills, pieces of one fill joined (the plan launches kiln's fill kernel for
    // each); both draws must fill alike.
    let (a, fills) = fill::merge(&a);
    let (b, fills_b) = fill::merge(&b);
    if let Some(i) = (0..fills.len().max(fills_b.len())).find(|&i| {
        match (
            fills.get(i).copied().flatten(),
            fills_b.get(i).copied().flatten(),
        ) {
            (Some(x), Some(y)) => !x.same_work(&y),
            (None, None) => false,
            _ => true,
        }
    }) {
        return Err(Refusal::Differs {
            launch: i,
            kernel: a.get(i).or(b.get(i)).map(|l| shown(l)).unwrap_or_default(),
            what: "torch's fill (its elements or value)".into(),
        });
    }
    current_stream_only(&a, &b)?;
    within_launches(a.len())?;
    if let Some((i, l)) = a
        .iter()
        .enumerate()
        .find(|(_, l)| l.params.len() > MAX_ARGS)
    {
        return Err(Refusal::TooLarge(format!(
            "launch {i} ({}) has {} parameters; a launch takes at most {MAX_ARGS}",
            shown(l),
            l.params.len()
        )));
    }

    // torch's fills (`torch::zeros`, `fill_`) are kept as kiln's fill kernels; every
    // other launch must be one of the file's.
    let own: Vec<&LaunchOp> = a
        .iter()
        .zip(&fills)
        .filter(|(_, f)| f.is_none())
        .map(|(l, _)| *l)
        .collect();
    if own.is_empty() {
        return Err(Refusal::NoSource {
            kernel: shown(a[0]),
        });
    }

    // A kernel that no source of the file defines (a torch or library kernel) says more
    // than what it does to the pointers, so it is named first.
    if let Some(kernel) = foreign_kernel(&own, sources) {
        return Err(Refusal::NoSource { kernel });
    }

    let c1 = classify(&a, &Memory::new(problem, first)?)?;
    let c2 = classify(&b, &Memory::new(problem, second)?)?;
    for (i, (x, y)) in c1.args.iter().zip(&c2.args).enumerate() {
        if let Some(j) = x.iter().zip(y).position(|(p, q)| p != q) {
            return Err(Refusal::Differs {
                launch: i,
                kernel: shown(a[i]),
                what: format!(
                    "parameter {j} is {} in the first draw, {} in the second",
                    x[j].describe(),
                    y[j].describe()
                ),
            });
        }
    }
    outputs_passed(problem, |name| {
        c1.args
            .iter()
            .flatten()
            .any(|c| matches!(c, Class::Tensor(n) if n == name))
    })?;

    let mut notes = vec!["launch names from recorded symbols (demangled)".to_string()];
    notes.extend(syncs_note(first));

    // Scratch buffers: torch's temporaries, named by first use, bytes.
    let scratch = scratch_buffers(problem, &c1.scratch, &c2.scratch, |_| Dtype::U8, &mut notes)?;

    // Arguments, with literals typed from the demangled signatures.
    let kernel_names: Vec<Option<KernelName>> =
        a.iter().map(|l| names::kernel_name(&l.symbol)).collect();
    let mut all_args = Vec::with_capacity(a.len());
    for (i, (l, classes)) in a.iter().zip(&c1.args).enumerate() {
        if let Some(f) = &fills[i] {
            let (target, room) = match classes.get(2) {
                Some(Class::Tensor(n)) => (n.clone(), problem.tensor(n).map_or(0, |t| t.bytes())),
                Some(Class::Scratch(k)) => (
                    scratch[*k].name.clone(),
                    scratch[*k].elems.saturating_mul(scratch[*k].dtype.size()),
                ),
                _ => {
                    return Err(Refusal::FillTarget {
                        launch: i,
                        why: "writes to an address that is no tensor of the problem and no \
                              temporary of torch's allocator"
                            .into(),
                    });
                }
            };
            if f.bytes() > room {
                return Err(Refusal::FillTarget {
                    launch: i,
                    why: format!(
                        "sets {} bytes from the start of {target}, which holds {room}",
                        f.bytes()
                    ),
                });
            }
            notes.push(format!("launch {i}: {}", f.describe(&target)));
            all_args.push(vec![
                Arg::Buffer(target),
                Arg::Scalar(f.value()),
                Arg::Scalar(f.count()),
            ]);
            continue;
        }
        let signature = kernel_names[i].as_ref().and_then(|k| k.params.as_ref());
        let types = signature.filter(|s| s.len() == l.params.len());
        match (&kernel_names[i], signature) {
            (Some(k), None) => notes.push(format!(
                "launch {i} ({}): an extern \"C\" kernel, its literals passed as integers of \
                 the same bytes",
                k.expr
            )),
            (Some(k), Some(s)) if types.is_none() => notes.push(format!(
                "launch {i} ({}): its signature has {} parameters but {} were recorded; \
                 literals passed as integers of the same bytes",
                k.expr,
                s.len(),
                l.params.len()
            )),
            _ => {}
        }
        let mut args = Vec::with_capacity(classes.len());
        for (j, c) in classes.iter().enumerate() {
            args.push(match c {
                Class::Tensor(n) => Arg::Buffer(n.clone()),
                Class::Scratch(k) => Arg::Buffer(scratch[*k].name.clone()),
                Class::Literal(bytes) => {
                    let kind = types.map(|t| names::scalar_kind(&t[j]));
                    let Some(s) = scalar(bytes, kind) else {
                        return Err(Refusal::ParamSize {
                            launch: i,
                            kernel: shown(l),
                            param: j,
                            size: l.params[j].size,
                        });
                    };
                    if kind == Some(ScalarKind::Pointer) {
                        notes.push(format!(
                            "launch {i} ({}) parameter {j}: a pointer passed as the literal \
                             {} (null, or an address that is no tensor), kept as it is",
                            shown(l),
                            c.describe()
                        ));
                    }
                    Arg::Scalar(s)
                }
            });
        }
        all_args.push(args);
    }

    let mut kernels = Vec::with_capacity(a.len());
    for ((l, k), f) in a.iter().zip(&kernel_names).zip(&fills) {
        match (f, k) {
            (Some(f), _) => kernels.push(f.kernel().to_string()),
            (None, Some(k)) => kernels.push(k.expr.clone()),
            (None, None) => {
                return Err(Refusal::Demangle {
                    symbol: clip(&l.symbol),
                });
            }
        }
    }

    // The source: the first that defines every launched kernel of the file (by base name).
    let bases: Vec<String> = kernels
        .iter()
        .zip(&fills)
        .filter(|(_, f)| f.is_none())
        .map(|(k, _)| names::base_name(k))
        .collect();
    let holds =
        |s: &DeviceSource, base: &str| s.kernels.iter().any(|k| names::base_name(k) == base);
    let Some(si) = sources
        .iter()
        .position(|s| bases.iter().all(|b| holds(s, b)))
    else {
        let held_nowhere = |k: &usize| !sources.iter().any(|s| holds(s, &bases[*k]));
        let first_source = |k: &usize| sources.first().is_none_or(|s| !holds(s, &bases[*k]));
        let k = (0..kernels.len())
            .find(held_nowhere)
            .or_else(|| (0..kernels.len()).find(first_source))
            .unwrap_or(0);
        return Err(Refusal::NoSource {
            kernel: kernels[k].clone(),
        });
    };
    let src = &sources[si];
    let mut widths: Vec<u32> = fills.iter().flatten().map(|f| f.width).collect();
    widths.dedup();
    let source = if widths.is_empty() {
        src.source.clone()
    } else {
        format!("{}{}", src.source, fill::source(&widths))
    };
    if source.len() > MAX_SOURCE_BYTES {
        return Err(Refusal::TooLarge(format!(
            "the device source is {} bytes; a candidate's is at most {MAX_SOURCE_BYTES}",
            source.len()
        )));
    }
    if sources.len() > 1 {
        notes.push(format!(
            "device source {} of the file's {} (the first defining every launched kernel)",
            si + 1,
            sources.len()
        ));
    }
    if src.names_skipped > 0 {
        notes.push(format!(
            "the extractor could not name {} kernel(s) of that source",
            src.names_skipped
        ));
    }

    // Flags: the author's, less those kiln's allow-list refuses.
    let mut flags = Vec::new();
    for f in &src.flags {
        if kiln_gpu::nvrtc::check_flags(std::slice::from_ref(f)).is_err() {
            notes.push(format!("flag {} dropped (kiln refuses it)", clip(f)));
        } else if flags.len() == MAX_FLAGS {
            notes.push(format!(
                "flag {} dropped (a candidate takes at most {MAX_FLAGS})",
                clip(f)
            ));
        } else {
            flags.push(f.clone());
        }
    }

    let launches = a
        .iter()
        .zip(kernels)
        .zip(all_args)
        .zip(&fills)
        .map(|(((l, kernel), args), f)| match f {
            Some(f) => {
                let (grid, block) = f.config();
                Launch {
                    kernel,
                    grid,
                    block,
                    args,
                    ..Launch::default()
                }
            }
            None => Launch {
                kernel,
                grid: l.grid,
                block: l.block,
                shared_bytes: l.shared_bytes,
                args,
                cooperative: l.cooperative,
                cluster: l.cluster,
                ..Launch::default()
            },
        })
        .collect();
    Ok(Lifted {
        language: Language::Cuda,
        source,
        flags,
        launches,
        scratch,
        notes,
    })
}

/// The note on the synchronisations a forward made, if any: kiln drops them (it runs the
/// launches in order on one stream).
fn syncs_note(r: &Recording) -> Option<String> {
    let syncs = r
        .ops
        .iter()
        .filter(|op| matches!(op, Op::Sync { .. }))
        .count();
    (syncs > 0).then(|| {
        format!(
            "{syncs} sync{} in the forward dropped (kiln runs the launches in order on one stream)",
            if syncs == 1 { "" } else { "s" }
        )
    })
}

/// Scratch buffers for torch's temporaries (`(address, bytes)` per draw, numbered by first
/// use): `lift_scratchK` (a name no tensor of the problem has), of element type
/// `dtype_of(K)`, as large as the larger of the two draws' blocks holds; a difference in
/// size is noted.
fn scratch_buffers(
    problem: &ProblemSpec,
    first: &[(u64, u64)],
    second: &[(u64, u64)],
    dtype_of: impl Fn(usize) -> Dtype,
    notes: &mut Vec<String>,
) -> Result<Vec<ScratchBuffer>, Refusal> {
    if first.len() > MAX_SCRATCH {
        return Err(Refusal::TooLarge(format!(
            "{} temporaries; a plan holds at most {MAX_SCRATCH} scratch buffers",
            first.len()
        )));
    }
    let mut scratch = Vec::with_capacity(first.len());
    for (k, (_, x)) in first.iter().enumerate() {
        // The same numbers in both draws (their parameters matched); kept safe regardless.
        let y = second.get(k).map_or(x, |(_, y)| y);
        let mut name = format!("lift_scratch{k}");
        while problem.tensor(&name).is_some() {
            name.push('_');
        }
        let dtype = dtype_of(k);
        let elems = ((*x).max(*y) / dtype.size()).max(1);
        if elems > MAX_SCRATCH_ELEMS {
            return Err(Refusal::TooLarge(format!(
                "a temporary of {elems} elements; a scratch buffer holds at most \
                 {MAX_SCRATCH_ELEMS}"
            )));
        }
        if x != y {
            notes.push(format!(
                "{name}: the temporary was {x} bytes in the first draw and {y} in the second; \
                 the larger kept"
            ));
        }
        scratch.push(ScratchBuffer { name, dtype, elems });
    }
    Ok(scratch)
}

/// Every output of the problem is passed to some launch (`passed(name)`), else
/// `OutputUnwritten`: the forward wrote it some other way.
fn outputs_passed(problem: &ProblemSpec, passed: impl Fn(&str) -> bool) -> Result<(), Refusal> {
    match problem
        .tensors
        .iter()
        .find(|t| t.role == Role::Output && !passed(&t.name))
    {
        Some(t) => Err(Refusal::OutputUnwritten {
            name: t.name.clone(),
        }),
        None => Ok(()),
    }
}

/// The first launched kernel whose name demangles and which no source defines (by base
/// name), as its name expression; symbols that do not demangle are left to the later
/// name check.
fn foreign_kernel(launches: &[&LaunchOp], sources: &[DeviceSource]) -> Option<String> {
    launches.iter().find_map(|l| {
        let k = names::kernel_name(&l.symbol)?;
        let base = names::base_name(&k.expr);
        let held = sources
            .iter()
            .any(|s| s.kernels.iter().any(|n| names::base_name(n) == base));
        (!held).then_some(k.expr)
    })
}

//! Candidates: device code plus a declarative launch list, never host code.
//!
//! The JSON shape is the one docs/api.md gives (`POST /v1/candidates`). kiln launches every kernel itself
//! from the plan, so a candidate cannot patch timers, use side streams or fall back to a
//! library. For the host backend (`language = "c"`), each launch names a C function that is
//! called with the args; grid and block are ignored.
//!
//! A CUDA launch names its kernel by C++ name expression (`softmax<256, float>`,
//! `ns::kernel`, or a plain identifier, see [`is_kernel_name`]) and may ask for a launch
//! kind: `"cooperative": true` (grid-wide synchronisation) or `"cluster": [x, y, z]`
//! (thread-block clusters). Both fields are left out of the JSON when unset, so older
//! candidates keep their content hash.
//!
//! A Triton candidate (`language = "triton"`) is Python text holding `@triton.jit`
//! functions; each launch names one, gives its grid, its non-constexpr arguments in order,
//! its `constexprs` by name and `num_warps` / `num_stages`. Block size and shared memory
//! come from Triton's compile, so a Triton launch leaves `block` and `shared_bytes` out
//! (see [`Launch::constexprs`]). Triton candidates run on the cuda backend.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Longest accepted source, in bytes.
pub const MAX_SOURCE_BYTES: usize = 1 << 20;
/// Most launches in one plan.
pub const MAX_LAUNCHES: usize = 64;
/// Most arguments to one launch.
pub const MAX_ARGS: usize = 64;
/// Most scratch buffers.
pub const MAX_SCRATCH: usize = 16;
/// Most compile flags.
pub const MAX_FLAGS: usize = 32;
/// Largest scratch buffer, in elements (1 Gi elements).
pub const MAX_SCRATCH_ELEMS: u64 = 1 << 30;
/// Longest free-text note.
pub const MAX_NOTE_BYTES: usize = 16 << 10;

/// The language a candidate's source is written in, which picks the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// CUDA C++, compiled by NVRTC; runs on the cuda backend.
    Cuda,
    /// C, compiled by the system C compiler; runs on the host backend.
    C,
    /// Python with `@triton.jit` functions, compiled ahead of time by Triton's own
    /// compiler; runs on the cuda backend.
    Triton,
    /// A KernelBench `ModelNew` file (Python defining `class ModelNew(nn.Module)`, with its
    /// `load_inline` CUDA, Triton kernels and torch layers), run as written in a jailed
    /// hosted runner on the lane's GPU (trust mode [`TrustMode::Hosted`]); cuda backend.
    #[serde(rename = "modelnew")]
    ModelNew,
    /// The same file run on the CPU in the hosted runner (torch on the CPU), for problems
    /// with a torch reference on machines without a GPU; host backend.
    #[serde(rename = "modelnew-cpu")]
    ModelNewCpu,
}

/// How a candidate was run, shown with every result (docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TrustMode {
    /// kiln launched the candidate's device code from its declarative plan (CUDA, Triton,
    /// C): no candidate host code ran.
    #[default]
    Contract,
    /// The candidate's own Python ran in a jailed hosted runner; kiln owned the inputs,
    /// weights and outputs, compared in its own process and timed from its side.
    Hosted,
    /// A `ModelNew` file's device code and launches, recorded in its hosted runner and
    /// turned into a contract candidate that kiln launched (no host code of the file ran
    /// while it was timed): the contract's guarantees, for code the file's forward ran.
    Lifted,
}

impl TrustMode {
    /// How a candidate in `language` is run by a job with `options`: `lifted` when kilnd
    /// lifted it from a `ModelNew` file (the job says `lifted_from`), else its language's
    /// mode. The one place this is decided: the scheduler writes it into the evaluation,
    /// the store answers it for a candidate not evaluated yet, and clients read `trust`.
    pub fn of(language: Language, options: Option<&crate::JobOptions>) -> TrustMode {
        if options.is_some_and(|o| o.lifted_from.is_some()) {
            return TrustMode::Lifted;
        }
        language.trust()
    }

    /// The mode's name on the wire (`contract`, `hosted`, `lifted`).
    pub fn as_str(self) -> &'static str {
        match self {
            TrustMode::Contract => "contract",
            TrustMode::Hosted => "hosted",
            TrustMode::Lifted => "lifted",
        }
    }
}

impl std::fmt::Display for TrustMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Language {
    /// The backend that runs candidates in this language.
    pub fn backend(self) -> crate::BackendKind {
        match self {
            Language::Cuda | Language::Triton | Language::ModelNew => crate::BackendKind::Cuda,
            Language::C | Language::ModelNewCpu => crate::BackendKind::Host,
        }
    }

    /// How candidates in this language are run.
    pub fn trust(self) -> TrustMode {
        match self {
            Language::ModelNew | Language::ModelNewCpu => TrustMode::Hosted,
            Language::Cuda | Language::C | Language::Triton => TrustMode::Contract,
        }
    }

    /// True for the hosted languages (a `ModelNew` file: no launches, no scratch).
    pub fn is_hosted(self) -> bool {
        self.trust() == TrustMode::Hosted
    }

    /// The language of a backend's trusted reference kernels (`cuda`: CUDA C, `host`: C).
    pub fn of_reference(backend: crate::BackendKind) -> Language {
        match backend {
            crate::BackendKind::Cuda => Language::Cuda,
            crate::BackendKind::Host => Language::C,
        }
    }

    /// The language's name on the wire (`cuda`, `c`, `triton`).
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Cuda => "cuda",
            Language::C => "c",
            Language::Triton => "triton",
            Language::ModelNew => "modelnew",
            Language::ModelNewCpu => "modelnew-cpu",
        }
    }
}

/// Most `constexprs` of one Triton launch.
pub const MAX_CONSTEXPRS: usize = 64;
/// Longest string constexpr, in bytes.
pub const MAX_CONSTEXPR_STR: usize = 128;
/// Most warps of one Triton program (32 warps = 1024 threads, the block limit).
pub const MAX_NUM_WARPS: u32 = 32;
/// Most pipeline stages of one Triton launch.
pub const MAX_NUM_STAGES: u32 = 8;

/// The value of one Triton `tl.constexpr` parameter: a boolean, an integer, a float or a
/// short string, written as the JSON value itself (`{"BLOCK": 1024, "ACT": "relu"}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Constexpr {
    /// `True` / `False`.
    Bool(bool),
    /// A Python `int`.
    Int(i64),
    /// A Python `float` (JSON numbers with a fraction or an exponent).
    Float(f64),
    /// A Python `str`.
    Str(String),
}

/// One argument of a launch: a tensor or scratch buffer by name, or a typed literal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Arg {
    /// A problem tensor or a scratch buffer, by name.
    Buffer(String),
    /// A typed scalar literal.
    Scalar(Scalar),
}

/// A typed scalar literal, written `{"i32": 5}` and so on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Scalar {
    /// 32-bit signed integer.
    I32(i32),
    /// 64-bit signed integer.
    I64(i64),
    /// 32-bit unsigned integer.
    U32(u32),
    /// 64-bit unsigned integer.
    U64(u64),
    /// 32-bit float.
    F32(f32),
    /// 64-bit float.
    F64(f64),
}

fn default_dim() -> [u32; 3] {
    [1, 1, 1]
}

/// Longest kernel name expression, in bytes.
pub const MAX_KERNEL_NAME_BYTES: usize = 256;
/// Most blocks in one thread-block cluster: the portable limit of the CUDA programming
/// guide (kiln checks at launch that the device can hold the cluster).
pub const MAX_CLUSTER_BLOCKS: u32 = 8;

/// One kernel launch in the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Launch {
    /// The kernel to launch (CUDA: a C++ name expression, see [`is_kernel_name`]) or the
    /// function to call (C: an identifier).
    pub kernel: String,
    /// Grid dimensions (CUDA only).
    #[serde(default = "default_dim")]
    pub grid: [u32; 3],
    /// Block dimensions (CUDA only).
    #[serde(default = "default_dim")]
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes (CUDA only).
    #[serde(default)]
    pub shared_bytes: u32,
    /// Arguments, in order. Triton: the jit function's non-constexpr parameters only.
    #[serde(default)]
    pub args: Vec<Arg>,
    /// Launch cooperatively (CUDA only: `cooperative_groups::this_grid().sync()` needs it);
    /// kiln checks first that the whole grid can be resident at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cooperative: bool,
    /// Thread-block cluster dimensions (CUDA only, compute capability 9.0+); each grid
    /// dimension must be a multiple of the cluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<[u32; 3]>,
    /// Triton only: the values of the jit function's `tl.constexpr` parameters by name
    /// (those with a default may be left out). Left out of the JSON when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub constexprs: BTreeMap<String, Constexpr>,
    /// Triton only: warps per program, a power of two up to [`MAX_NUM_WARPS`] (Triton's
    /// default 4 when left out); the block is 32 × the warps Triton's compile reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_warps: Option<u32>,
    /// Triton only: software-pipelining stages, 1 to [`MAX_NUM_STAGES`] (Triton's default
    /// 3 when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_stages: Option<u32>,
    /// Triton only: CTAs per program (a thread-block cluster on Hopper). Only 1 is
    /// accepted so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_ctas: Option<u32>,
}

impl Default for Launch {
    /// A plain launch of no kernel yet: one block of one thread, no shared memory, no args.
    fn default() -> Self {
        Launch {
            kernel: String::new(),
            grid: default_dim(),
            block: default_dim(),
            shared_bytes: 0,
            args: Vec::new(),
            constexprs: BTreeMap::new(),
            num_warps: None,
            num_stages: None,
            num_ctas: None,
            cooperative: false,
            cluster: None,
        }
    }
}

impl Launch {
    /// True if and only if any Triton-only field is set.
    pub fn has_triton_fields(&self) -> bool {
        !self.constexprs.is_empty()
            || self.num_warps.is_some()
            || self.num_stages.is_some()
            || self.num_ctas.is_some()
    }
}

/// A scratch buffer the candidate may use between launches; zeroed before each run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScratchBuffer {
    /// Name used in launch args; an identifier distinct from every tensor name.
    pub name: String,
    /// Element type.
    pub dtype: crate::Dtype,
    /// Number of elements.
    pub elems: u64,
}

/// A candidate kernel as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    /// The problem this candidate solves (a registered problem's name).
    pub problem: String,
    /// Source language; picks the backend.
    pub language: Language,
    /// Device code (CUDA), C source (host) or Python with `@triton.jit` functions (Triton).
    pub source: String,
    /// The launch list, executed in order by trusted code (empty, and may be left out, for
    /// a hosted `ModelNew` file: its `forward` is the plan).
    #[serde(default)]
    pub launches: Vec<Launch>,
    /// Scratch buffers.
    #[serde(default)]
    pub scratch: Vec<ScratchBuffer>,
    /// Compile flags, each checked against the backend's allow-list.
    #[serde(default)]
    pub flags: Vec<String>,
    /// Id of the candidate this one was derived from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Free text: the idea or change this candidate tries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Why a candidate is structurally invalid (before any problem-specific check).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CandidateError {
    /// The source is empty.
    #[error("source is empty")]
    EmptySource,
    /// The source is longer than [`MAX_SOURCE_BYTES`].
    #[error("source is {0} bytes; the limit is {MAX_SOURCE_BYTES}")]
    SourceTooLong(usize),
    /// The source contains a NUL byte.
    #[error("source contains a NUL byte")]
    NulInSource,
    /// No launches, or too many.
    #[error("launches: {0} given; between 1 and {MAX_LAUNCHES} are allowed")]
    LaunchCount(usize),
    /// Too many args in one launch.
    #[error("launches[{0}].args: more than {MAX_ARGS} arguments")]
    TooManyArgs(usize),
    /// A name that is not an identifier.
    #[error(
        "{field}: {name:?} is not an identifier (letters, digits and _, not starting with a digit, at most 128 characters)"
    )]
    BadIdentifier {
        /// Where the name appears.
        field: String,
        /// The offending name.
        name: String,
    },
    /// A zero grid or block dimension.
    #[error("launches[{0}]: grid and block dimensions must be at least 1")]
    ZeroDim(usize),
    /// A kernel name that is not a C++ name expression kiln accepts.
    #[error(
        "launches[{index}].kernel: {name:?} is not a kernel name (an identifier, a qualified \
         name such as ns::k, or a template instance such as k<256, float>; at most \
         {MAX_KERNEL_NAME_BYTES} bytes)"
    )]
    BadKernelName {
        /// The launch.
        index: usize,
        /// The offending name.
        name: String,
    },
    /// A launch kind the launch cannot have.
    #[error("launches[{index}]: {reason}")]
    LaunchKind {
        /// The launch.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// Too many scratch buffers or one too large.
    #[error("scratch: {0}")]
    Scratch(String),
    /// Too many flags.
    #[error("flags: more than {MAX_FLAGS} given")]
    TooManyFlags,
    /// The note is too long.
    #[error("note is longer than {MAX_NOTE_BYTES} bytes")]
    NoteTooLong,
    /// Compile flags on a Triton candidate.
    #[error(
        "flags: triton candidates take no compile flags (num_warps, num_stages and constexprs \
         belong to each launch)"
    )]
    TritonFlags,
    /// A launch whose Triton fields do not fit its language.
    #[error("launches[{index}]: {reason}")]
    TritonLaunch {
        /// The launch.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A field a hosted `ModelNew` file does not take (its `forward` is the plan).
    #[error("{0}: a {1} candidate takes none (its ModelNew.forward is the plan)")]
    HostedField(&'static str, &'static str),
    /// A hosted source with no `class ModelNew` at the top level.
    #[error(
        "source: no top-level `class ModelNew` (a KernelBench answer defines          `class ModelNew(nn.Module)`)"
    )]
    NoModelNew,
}

/// True when `source` defines `class ModelNew` at the top level (a line starting with it,
/// followed by `(` or `:`). The Python itself is checked only by the runner.
pub fn defines_model_new(source: &str) -> bool {
    source.lines().any(|line| {
        line.strip_prefix("class")
            .filter(|rest| rest.starts_with([' ', '\t']))
            .map(str::trim_start)
            .and_then(|rest| rest.strip_prefix("ModelNew"))
            .is_some_and(|rest| rest.trim_start().starts_with(['(', ':']))
    })
}

/// True if and only if `s` is a C identifier of at most 128 characters.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    s.len() <= 128 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// True if and only if `s` is a kernel name kiln resolves with NVRTC's name expressions:
/// an identifier, optionally qualified (`ns::k`, `::k`), optionally with template
/// arguments (`k<256, float>`, `ns::k<ns::Op, 4u, true>`, `k<(1 << 4)>`). Only letters,
/// digits, `_`, `:`, `<`, `>`, `,`, `(`, `)`, `*`, `&`, `+`, `-`, `.`, `|`, `^`, `~`, `!`,
/// `=`, `?` and spaces may appear; brackets must balance; at most
/// [`MAX_KERNEL_NAME_BYTES`] bytes. The name is parsed by NVRTC in the candidate's own
/// compile, so this check keeps it to one expression, not a boundary.
pub fn is_kernel_name(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_KERNEL_NAME_BYTES || s.contains("/*") || s.contains("//") {
        return false;
    }
    let allowed = |c: char| {
        c.is_ascii_alphanumeric()
            || matches!(
                c,
                '_' | ':'
                    | '<'
                    | '>'
                    | ','
                    | '('
                    | ')'
                    | '*'
                    | '&'
                    | '+'
                    | '-'
                    | '.'
                    | '|'
                    | '^'
                    | '~'
                    | '!'
                    | '='
                    | '?'
                    | ' '
            )
    };
    if !s.chars().all(allowed) {
        return false;
    }
    // The name proper: an optionally qualified identifier before any template arguments.
    let head_end = s.find('<').unwrap_or(s.len());
    let head = s[..head_end].trim();
    let head = head.strip_prefix("::").unwrap_or(head);
    if head.is_empty() || !head.split("::").all(is_identifier) {
        return false;
    }
    let tail = s[head_end..].trim_end();
    if tail.is_empty() {
        return true;
    }
    if !tail.ends_with('>') {
        return false;
    }
    let (mut angle, mut paren) = (0i32, 0i32);
    for c in tail.chars() {
        match c {
            '(' => paren += 1,
            ')' => paren -= 1,
            '<' if paren == 0 => angle += 1,
            '>' if paren == 0 => angle -= 1,
            _ => {}
        }
        if angle < 0 || paren < 0 {
            return false;
        }
    }
    angle == 0 && paren == 0
}

/// Checks one launch's kind: cooperative or cluster (not both), for CUDA only, the cluster
/// positive, at most [`MAX_CLUSTER_BLOCKS`] blocks, dividing the grid.
fn check_launch_kind(language: Language, index: usize, l: &Launch) -> Result<(), CandidateError> {
    let bad = |reason: String| CandidateError::LaunchKind { index, reason };
    if language != Language::Cuda && (l.cooperative || l.cluster.is_some()) {
        return Err(bad(
            "cooperative and cluster launches are for CUDA kernels only".into(),
        ));
    }
    if l.cooperative && l.cluster.is_some() {
        return Err(bad(
            "a launch is either cooperative or a cluster launch, not both".into(),
        ));
    }
    if let Some(c) = l.cluster {
        if c.contains(&0) {
            return Err(bad("cluster dimensions must be at least 1".into()));
        }
        let blocks: u64 = c.iter().map(|&d| u64::from(d)).product();
        if blocks > u64::from(MAX_CLUSTER_BLOCKS) {
            return Err(bad(format!(
                "a cluster of {blocks} blocks exceeds the limit of {MAX_CLUSTER_BLOCKS}"
            )));
        }
        for (axis, (&g, &d)) in ["x", "y", "z"].iter().zip(l.grid.iter().zip(c.iter())) {
            if g % d != 0 {
                return Err(bad(format!(
                    "grid.{axis} = {g} is not a multiple of cluster.{axis} = {d}"
                )));
            }
        }
    }
    Ok(())
}

/// Checks one launch's Triton fields: present only in Triton candidates; there, no block or
/// shared memory of its own, warps a power of two, stages and constexprs bounded.
fn check_triton_fields(language: Language, index: usize, l: &Launch) -> Result<(), CandidateError> {
    let bad = |reason: String| CandidateError::TritonLaunch { index, reason };
    if language != Language::Triton {
        if l.has_triton_fields() {
            return Err(bad(
                "constexprs, num_warps, num_stages and num_ctas are for triton launches only"
                    .into(),
            ));
        }
        return Ok(());
    }
    if l.block != default_dim() || l.shared_bytes != 0 {
        return Err(bad(
            "a triton launch takes its block (32 x num_warps threads) and its shared memory \
             from Triton's compile: leave block and shared_bytes out"
                .into(),
        ));
    }
    if let Some(w) = l.num_warps
        && (w == 0 || w > MAX_NUM_WARPS || !w.is_power_of_two())
    {
        return Err(bad(format!(
            "num_warps = {w}: a power of two from 1 to {MAX_NUM_WARPS}"
        )));
    }
    if let Some(s) = l.num_stages
        && (s == 0 || s > MAX_NUM_STAGES)
    {
        return Err(bad(format!(
            "num_stages = {s}: between 1 and {MAX_NUM_STAGES}"
        )));
    }
    if let Some(c) = l.num_ctas
        && c != 1
    {
        return Err(bad(format!(
            "num_ctas = {c}: kiln launches triton kernels with num_ctas = 1 only (no \
             thread-block clusters yet)"
        )));
    }
    if l.constexprs.len() > MAX_CONSTEXPRS {
        return Err(bad(format!("more than {MAX_CONSTEXPRS} constexprs")));
    }
    for (name, v) in &l.constexprs {
        if !is_identifier(name) {
            return Err(bad(format!("constexpr name {name:?} is not an identifier")));
        }
        match v {
            Constexpr::Float(f) if !f.is_finite() => {
                return Err(bad(format!("constexpr {name} is not a finite number")));
            }
            Constexpr::Str(s) if s.len() > MAX_CONSTEXPR_STR || s.contains('\0') => {
                return Err(bad(format!(
                    "constexpr {name}: strings are at most {MAX_CONSTEXPR_STR} bytes, without NUL"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

impl Candidate {
    /// The backend that runs this candidate (its language's).
    pub fn backend(&self) -> crate::BackendKind {
        self.language.backend()
    }

    /// How this candidate is run (its language's).
    pub fn trust(&self) -> TrustMode {
        self.language.trust()
    }

    /// [`Candidate::validate`] for a hosted `ModelNew` file.
    fn validate_hosted(&self) -> Result<(), CandidateError> {
        let lang = self.language.as_str();
        if !self.launches.is_empty() {
            return Err(CandidateError::HostedField("launches", lang));
        }
        if !self.scratch.is_empty() {
            return Err(CandidateError::HostedField("scratch", lang));
        }
        if !self.flags.is_empty() {
            return Err(CandidateError::HostedField("flags", lang));
        }
        if self.note.as_ref().is_some_and(|n| n.len() > MAX_NOTE_BYTES) {
            return Err(CandidateError::NoteTooLong);
        }
        if !defines_model_new(&self.source) {
            return Err(CandidateError::NoModelNew);
        }
        Ok(())
    }

    /// Checks the candidate's structure: sizes, names and dimensions.
    ///
    /// Problem-specific checks (do the args name real tensors?) happen at evaluation and
    /// end in `invalid_launch`.
    pub fn validate(&self) -> Result<(), CandidateError> {
        if self.source.trim().is_empty() {
            return Err(CandidateError::EmptySource);
        }
        if self.source.len() > MAX_SOURCE_BYTES {
            return Err(CandidateError::SourceTooLong(self.source.len()));
        }
        if self.source.contains('\0') {
            return Err(CandidateError::NulInSource);
        }
        if self.language.is_hosted() {
            return self.validate_hosted();
        }
        if self.launches.is_empty() || self.launches.len() > MAX_LAUNCHES {
            return Err(CandidateError::LaunchCount(self.launches.len()));
        }
        for (i, l) in self.launches.iter().enumerate() {
            match self.language {
                Language::Cuda if !is_kernel_name(&l.kernel) => {
                    return Err(CandidateError::BadKernelName {
                        index: i,
                        name: l.kernel.clone(),
                    });
                }
                Language::C | Language::Triton if !is_identifier(&l.kernel) => {
                    return Err(CandidateError::BadIdentifier {
                        field: format!("launches[{i}].kernel"),
                        name: l.kernel.clone(),
                    });
                }
                _ => {}
            }
            if l.args.len() > MAX_ARGS {
                return Err(CandidateError::TooManyArgs(i));
            }
            if l.grid.contains(&0) || l.block.contains(&0) {
                return Err(CandidateError::ZeroDim(i));
            }
            check_launch_kind(self.language, i, l)?;
            check_triton_fields(self.language, i, l)?;
            for (j, a) in l.args.iter().enumerate() {
                if let Arg::Buffer(name) = a
                    && !is_identifier(name)
                {
                    return Err(CandidateError::BadIdentifier {
                        field: format!("launches[{i}].args[{j}]"),
                        name: name.clone(),
                    });
                }
            }
        }
        if self.scratch.len() > MAX_SCRATCH {
            return Err(CandidateError::Scratch(format!(
                "more than {MAX_SCRATCH} buffers"
            )));
        }
        for (i, s) in self.scratch.iter().enumerate() {
            if !is_identifier(&s.name) {
                return Err(CandidateError::BadIdentifier {
                    field: format!("scratch[{i}].name"),
                    name: s.name.clone(),
                });
            }
            if s.elems == 0 || s.elems > MAX_SCRATCH_ELEMS {
                return Err(CandidateError::Scratch(format!(
                    "scratch[{i}].elems must be between 1 and {MAX_SCRATCH_ELEMS}"
                )));
            }
            if self.scratch[..i].iter().any(|o| o.name == s.name) {
                return Err(CandidateError::Scratch(format!(
                    "scratch[{i}].name {:?} is used twice",
                    s.name
                )));
            }
        }
        if self.flags.len() > MAX_FLAGS {
            return Err(CandidateError::TooManyFlags);
        }
        if self.language == Language::Triton && !self.flags.is_empty() {
            return Err(CandidateError::TritonFlags);
        }
        if self.note.as_ref().is_some_and(|n| n.len() > MAX_NOTE_BYTES) {
            return Err(CandidateError::NoteTooLong);
        }
        Ok(())
    }

    /// The content hash that identifies this candidate: blake3 over the normalised
    /// candidate (line endings and trailing whitespace of the source normalised;
    /// `parent` and `note` left out, since they describe where it came from, not what it is).
    pub fn content_hash(&self) -> String {
        let source: String = self
            .source
            .replace("\r\n", "\n")
            .lines()
            .map(str::trim_end)
            .collect::<Vec<_>>()
            .join("\n");
        let normalised = serde_json::json!({
            "problem": self.problem,
            "language": self.language,
            "source": source.trim_end(),
            "launches": self.launches,
            "scratch": self.scratch,
            "flags": self.flags,
        });
        let bytes = serde_json::to_vec(&normalised).unwrap_or_default();
        blake3::hash(&bytes).to_hex()[..32].to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Candidate {
        serde_json::from_str(
            r#"{"problem":"p","language":"c","source":"void f(float*x){}\n",
                "launches":[{"kernel":"f","args":["x",{"i32":4}]}]}"#,
        )
        .expect("sample parses")
    }

    #[test]
    fn parses_design_shape_and_validates() {
        let c = sample();
        assert_eq!(c.launches[0].grid, [1, 1, 1]);
        assert_eq!(c.launches[0].args[1], Arg::Scalar(Scalar::I32(4)));
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn unknown_field_is_refused_by_name() {
        let err = serde_json::from_str::<Candidate>(
            r#"{"problem":"p","language":"c","source":"x","launches":[],"bogus":1}"#,
        )
        .expect_err("unknown field must fail");
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn hash_ignores_note_and_whitespace_but_not_code() {
        let a = sample();
        let mut b = a.clone();
        b.note = Some("idea".into());
        b.source = "void f(float*x){}   \r\n\n".into();
        assert_eq!(a.content_hash(), b.content_hash());
        let mut c = a.clone();
        c.source = "void f(float*y){}".into();
        assert_ne!(a.content_hash(), c.content_hash());
    }

    fn cuda(launch: &str) -> Candidate {
        serde_json::from_str(&format!(
            r#"{{"problem":"p","language":"cuda","source":"x","launches":[{launch}]}}"#
        ))
        .expect("cuda sample parses")
    }

    #[test]
    fn kernel_names_are_cxx_name_expressions() {
        for ok in [
            "k",
            "softmax_kernel<256, float>",
            "ns::inner::k",
            "::k",
            "k<ns::Op<float>, 4u, true>",
            "k<(1 << 4), -1>",
            "gemm<128,128,32,__nv_bfloat16>",
        ] {
            assert!(is_kernel_name(ok), "{ok}");
        }
        for bad in [
            "", "1k", "k<256", "k>", "k<a>>", "k(", "k; int x", "k<\"s\">", "k/*x*/", "ns::",
            "a::1b", "k{}", "k#",
        ] {
            assert!(!is_kernel_name(bad), "{bad}");
        }
        assert!(!is_kernel_name(&"k".repeat(MAX_KERNEL_NAME_BYTES + 1)));
        // CUDA candidates take name expressions; C candidates still take identifiers.
        assert_eq!(cuda(r#"{"kernel":"k<256, float>"}"#).validate(), Ok(()));
        let mut c = sample();
        c.launches[0].kernel = "f<int>".into();
        assert!(matches!(
            c.validate(),
            Err(CandidateError::BadIdentifier { .. })
        ));
        assert!(matches!(
            cuda(r#"{"kernel":"k<"}"#).validate(),
            Err(CandidateError::BadKernelName { index: 0, .. })
        ));
    }

    #[test]
    fn launch_kinds_are_validated() {
        assert_eq!(
            cuda(r#"{"kernel":"k","grid":[8,2,1],"cluster":[2,2,1]}"#).validate(),
            Ok(())
        );
        assert_eq!(
            cuda(r#"{"kernel":"k","cooperative":true}"#).validate(),
            Ok(())
        );
        for (launch, needle) in [
            (
                r#"{"kernel":"k","grid":[3,1,1],"cluster":[2,1,1]}"#,
                "grid.x = 3",
            ),
            (r#"{"kernel":"k","cluster":[0,1,1]}"#, "at least 1"),
            (
                r#"{"kernel":"k","grid":[16,1,1],"cluster":[16,1,1]}"#,
                "limit of 8",
            ),
            (
                r#"{"kernel":"k","grid":[2,1,1],"cluster":[2,1,1],"cooperative":true}"#,
                "not both",
            ),
        ] {
            let err = cuda(launch).validate().expect_err(launch).to_string();
            assert!(err.contains(needle), "{launch}: {err}");
        }
        let mut c = sample();
        c.launches[0].cooperative = true;
        let err = c.validate().expect_err("host").to_string();
        assert!(err.contains("CUDA kernels only"), "{err}");
    }

    #[test]
    fn new_launch_fields_keep_old_hashes_and_round_trip() {
        let a = cuda(r#"{"kernel":"k"}"#);
        let json = serde_json::to_string(&a.launches[0]).expect("serialises");
        assert!(
            !json.contains("cooperative") && !json.contains("cluster"),
            "{json}"
        );
        let b = cuda(r#"{"kernel":"k","cooperative":false}"#);
        assert_eq!(a.content_hash(), b.content_hash());
        let c = cuda(r#"{"kernel":"k","cooperative":true}"#);
        assert_ne!(a.content_hash(), c.content_hash());
        let back: Launch = serde_json::from_str(
            &serde_json::to_string(
                &cuda(r#"{"kernel":"k","cluster":[2,1,1],"grid":[2,1,1]}"#).launches[0],
            )
            .expect("serialises"),
        )
        .expect("parses");
        assert_eq!(back.cluster, Some([2, 1, 1]));
    }

    #[test]
    fn validation_names_the_problem() {
        let mut c = sample();
        c.launches[0].kernel = "1bad".into();
        assert!(matches!(
            c.validate(),
            Err(CandidateError::BadIdentifier { .. })
        ));
        let mut c = sample();
        c.launches.clear();
        assert_eq!(c.validate(), Err(CandidateError::LaunchCount(0)));
        let mut c = sample();
        c.source = " \n".into();
        assert_eq!(c.validate(), Err(CandidateError::EmptySource));
    }

    fn triton(launch: &str) -> Candidate {
        serde_json::from_str(&format!(
            r#"{{"problem":"p","language":"triton","source":"import triton\n","launches":[{launch}]}}"#
        ))
        .expect("triton sample parses")
    }

    #[test]
    fn triton_launches_parse_and_validate() {
        let c = triton(
            r#"{"kernel":"softmax_kernel","grid":[4096,1,1],"args":["x","y",{"i32":65536}],
                "constexprs":{"BLOCK":4096,"EPS":1e-5,"FAST":true,"ACT":"relu"},
                "num_warps":8,"num_stages":2}"#,
        );
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.language.backend(), crate::BackendKind::Cuda);
        let l = &c.launches[0];
        assert_eq!(l.constexprs["BLOCK"], Constexpr::Int(4096));
        assert_eq!(l.constexprs["EPS"], Constexpr::Float(1e-5));
        assert_eq!(l.constexprs["FAST"], Constexpr::Bool(true));
        assert_eq!(l.constexprs["ACT"], Constexpr::Str("relu".into()));
        assert_eq!(l.num_warps, Some(8));
        // An integer-valued float stays a float through the wire.
        let back: Launch = serde_json::from_str(
            &serde_json::to_string(&triton(r#"{"kernel":"k","constexprs":{"S":2.0}}"#).launches[0])
                .expect("json"),
        )
        .expect("parses");
        assert_eq!(back.constexprs["S"], Constexpr::Float(2.0));
    }

    #[test]
    fn triton_fields_are_checked_and_kept_off_other_languages() {
        for (launch, needle) in [
            (
                r#"{"kernel":"k","block":[128,1,1]}"#,
                "leave block and shared_bytes out",
            ),
            (
                r#"{"kernel":"k","shared_bytes":1024}"#,
                "leave block and shared_bytes out",
            ),
            (r#"{"kernel":"k","num_warps":3}"#, "power of two"),
            (r#"{"kernel":"k","num_warps":64}"#, "power of two"),
            (r#"{"kernel":"k","num_stages":0}"#, "num_stages = 0"),
            (r#"{"kernel":"k","num_ctas":2}"#, "num_ctas = 1 only"),
            (
                r#"{"kernel":"k","constexprs":{"1x":1}}"#,
                "not an identifier",
            ),
        ] {
            let err = triton(launch).validate().expect_err(launch).to_string();
            assert!(err.contains(needle), "{launch}: {err}");
        }
        let mut c = triton(r#"{"kernel":"k"}"#);
        c.flags = vec!["-O3".into()];
        assert_eq!(c.validate(), Err(CandidateError::TritonFlags));
        let mut c = sample();
        c.launches[0].num_warps = Some(4);
        let err = c.validate().expect_err("c launch with triton fields");
        assert!(err.to_string().contains("triton launches only"), "{err}");
    }

    #[test]
    fn triton_fields_leave_old_hashes_alone() {
        // The new fields are left out of the JSON when unset.
        let json = serde_json::to_string(&sample().launches[0]).expect("json");
        assert!(
            !json.contains("constexprs") && !json.contains("num_warps"),
            "{json}"
        );
    }
}

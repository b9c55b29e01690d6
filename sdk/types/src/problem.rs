//! Problems: fixed shapes, tensors with their input distributions, tolerances, roofline
//! figures, and the trusted reference and seed kernels per backend.
//!
//! A problem lives in a folder with a `problem.toml`; [`ProblemSpec::load_dir`] reads it
//! and inlines the source files it names, so the spec travels as one value.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::BackendKind;
use crate::candidate::{Launch, ScratchBuffer};

/// Largest tensor accepted, in elements (4 Gi).
pub const MAX_TENSOR_ELEMS: u64 = 1 << 32;

/// Element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// Unsigned byte.
    U8,
}

impl Dtype {
    /// Size of one element in bytes.
    pub fn size(self) -> u64 {
        match self {
            Dtype::F64 | Dtype::I64 => 8,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::U8 => 1,
        }
    }

    /// True if and only if this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F64 | Dtype::F16 | Dtype::Bf16)
    }
}

/// Whether a tensor is read or written by the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Filled by kiln before each run; the candidate must not change it.
    Input,
    /// Poisoned before each run; the candidate must write every element.
    Output,
}

/// How an input tensor is drawn for each trial.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "lowercase", deny_unknown_fields)]
pub enum Init {
    /// Normal distribution.
    Normal {
        /// Mean.
        #[serde(default)]
        mean: f64,
        /// Standard deviation.
        #[serde(default = "one")]
        std: f64,
    },
    /// Uniform on `[low, high)`.
    Uniform {
        /// Lower bound.
        low: f64,
        /// Upper bound.
        high: f64,
    },
    /// Uniform integers on `[low, high)`.
    Randint {
        /// Lower bound.
        low: i64,
        /// Upper bound (exclusive).
        high: i64,
    },
    /// What the problem's own `get_inputs()` returns for this forward argument (a torch
    /// reference's file), made on the lane's GPU by the trusted torch runner under a fresh
    /// secret seed per input set: for inputs kiln cannot draw itself (`triu` of a drawn
    /// matrix, a softmax of one, `randint * 2 - 1`). Never shifted or ranged; the cuda
    /// backend only.
    #[serde(rename = "get_inputs")]
    GetInputs,
}

fn one() -> f64 {
    1.0
}

impl Init {
    /// Checks the distribution's parameters: finite, a non-negative standard deviation, and
    /// `low < high` for the ranges (an empty or inverted range draws nothing sensible).
    pub fn check(&self) -> Result<(), String> {
        match *self {
            Init::Normal { mean, std } => {
                if !(mean.is_finite() && std.is_finite() && std >= 0.0) {
                    return Err(format!(
                        "normal(mean = {mean}, std = {std}) needs a finite mean and a finite, \
                         non-negative std"
                    ));
                }
            }
            Init::Uniform { low, high } => {
                if !(low.is_finite() && high.is_finite() && low < high) {
                    return Err(format!(
                        "uniform on [{low}, {high}) needs finite bounds with low < high"
                    ));
                }
            }
            Init::Randint { low, high } => {
                if low >= high {
                    return Err(format!("randint on [{low}, {high}) needs low < high"));
                }
            }
            Init::GetInputs => {}
        }
        Ok(())
    }
}

impl Default for Init {
    fn default() -> Self {
        Init::Normal {
            mean: 0.0,
            std: 1.0,
        }
    }
}

/// One tensor of the problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    /// Name used in launch args.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major, contiguous).
    pub shape: Vec<u64>,
    /// Input or output.
    pub role: Role,
    /// Distribution of an input (ignored for outputs).
    #[serde(default)]
    pub init: Init,
    /// Whether the contract's shifted/scaled trial (mean 1000, std 0.1) applies to this
    /// input. Off for tensors whose values have a meaning (indices, masks).
    #[serde(default = "yes")]
    pub shifted_trial: bool,
}

fn yes() -> bool {
    true
}

impl TensorSpec {
    /// Number of elements.
    pub fn elems(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.elems() * self.dtype.size()
    }
}

/// Absolute and relative tolerance: an element passes if
/// `|got - want| <= atol + rtol * |want|` (see [`Tolerance::accepts`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Tolerance {
    /// True if and only if `got` is within tolerance of `want`:
    /// `|got - want| <= atol + rtol * |want|`, where NaN must meet NaN and an infinity the
    /// same infinity. The one statement of the rule: the CPU comparison calls this, and
    /// the GPU comparison kernel compiles [`Tolerance::CUDA_RULE`], this same function in
    /// CUDA (kept beside it; the GPU tests check both give the same counts).
    pub fn accepts(&self, got: f64, want: f64) -> bool {
        if got.is_nan() || want.is_nan() {
            return got.is_nan() && want.is_nan();
        }
        if got.is_infinite() || want.is_infinite() {
            return got == want;
        }
        (got - want).abs() <= self.atol + self.rtol * want.abs()
    }

    /// [`Tolerance::accepts`] in CUDA, as the GPU comparison kernel compiles it
    /// (`kiln_close(got, want, atol, rtol)`, with the `kiln_isnan` and `kiln_isinf` it
    /// uses; no headers).
    pub const CUDA_RULE: &'static str = r#"
__device__ __forceinline__ bool kiln_isnan(double x) { return x != x; }
__device__ __forceinline__ bool kiln_isinf(double x) {
    return fabs(x) == __longlong_as_double(0x7FF0000000000000LL);
}
__device__ __forceinline__ bool kiln_close(double g, double w, double atol, double rtol) {
    if (kiln_isnan(g) || kiln_isnan(w)) return kiln_isnan(g) && kiln_isnan(w);
    if (kiln_isinf(g) || kiln_isinf(w)) return g == w;
    return fabs(g - w) <= atol + rtol * fabs(w);
}
"#;
}

/// The least work any correct kernel must do, for the floor check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Roofline {
    /// Fewest bytes any correct kernel moves to and from memory.
    #[serde(default)]
    pub min_bytes: u64,
    /// Floating-point operations of the computation.
    #[serde(default)]
    pub flops: u64,
}

/// A trusted kernel shipped with the problem (reference or seed) for one backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSource {
    /// File in the problem folder holding the source.
    pub file: String,
    /// The source text, inlined by [`ProblemSpec::load_dir`].
    #[serde(default)]
    pub source: String,
    /// Launch list.
    pub launches: Vec<Launch>,
    /// Scratch buffers.
    #[serde(default)]
    pub scratch: Vec<ScratchBuffer>,
    /// Compile flags.
    #[serde(default)]
    pub flags: Vec<String>,
}

/// The problem's trusted references: a kernel per backend, and/or a PyTorch module
/// (`[reference.host]`, `[reference.cuda]`, `[reference.torch]`). A backend can evaluate
/// the problem when it has a kernel of its own or there is a torch reference (run by the
/// trusted reference runner on that backend's device).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct References {
    /// CUDA C reference kernel and its launch plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<KernelSource>,
    /// C reference for the host backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<KernelSource>,
    /// A PyTorch module in KernelBench's format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<TorchReference>,
}

impl References {
    /// The reference kernel for `backend`, if the problem has one.
    pub fn kernel(&self, backend: BackendKind) -> Option<&KernelSource> {
        match backend {
            BackendKind::Cuda => self.cuda.as_ref(),
            BackendKind::Host => self.host.as_ref(),
        }
    }

    /// True when `backend` can evaluate the problem: a kernel of its own, or the torch
    /// reference (host and cuda).
    pub fn has(&self, backend: BackendKind) -> bool {
        self.kernel(backend).is_some() || self.torch.is_some()
    }

    /// The reference kernels, by backend.
    pub fn kernels(&self) -> impl Iterator<Item = (BackendKind, &KernelSource)> {
        BackendKind::ALL
            .into_iter()
            .filter_map(|b| self.kernel(b).map(|k| (b, k)))
    }

    /// True when the problem has no reference at all.
    pub fn is_empty(&self) -> bool {
        self.cuda.is_none() && self.host.is_none() && self.torch.is_none()
    }
}

/// How the torch reference computes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TorchPrecision {
    /// float64 (module and inputs cast) where every op supports it; otherwise the declared
    /// dtypes, and the evaluation notes the fallback.
    #[default]
    Auto,
    /// float64 always (an op without f64 support is the reference's failure).
    F64,
    /// The declared dtypes.
    Declared,
}

/// A PyTorch module in KernelBench's format (`class Model(nn.Module)`, `get_inputs()`,
/// `get_init_inputs()`) as the problem's trusted reference. Its parameters and buffers are
/// problem input tensors (drawn per trial like any input) passed to the module with
/// `torch.func.functional_call`; `get_inputs()` is not called at evaluation time (kiln
/// draws the inputs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TorchReference {
    /// The Python file in the problem folder.
    pub file: String,
    /// Its text, inlined by [`ProblemSpec::load_dir`].
    #[serde(default)]
    pub source: String,
    /// `get_init_inputs()` as a JSON array, fixed at import (lists are passed as tuples).
    #[serde(default = "empty_json_list")]
    pub init_inputs: String,
    /// `forward`'s arguments, in order: the problem's input tensors, and the names of
    /// [`Self::constants`].
    pub forward: Vec<String>,
    /// `forward` arguments that are a fixed Python number or bool, not a tensor (KernelBench
    /// level-1 5: `get_inputs()` returns `[A, 3.14]`): passed as they are, never drawn.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub constants: BTreeMap<String, ForwardConstant>,
    /// The module's parameters and buffers (`conv.weight`) and the problem's input
    /// tensors holding them.
    #[serde(default)]
    pub state: BTreeMap<String, String>,
    /// The problem's output tensors, in the order `forward` returns them (a 0-d result is
    /// a tensor of shape `[1]`).
    pub outputs: Vec<String>,
    /// Inputs kiln holds as `u8` (0 or 1) that the module takes as `torch.bool`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bool_tensors: Vec<String>,
    /// How it computes.
    #[serde(default)]
    pub precision: TorchPrecision,
}

fn empty_json_list() -> String {
    "[]".into()
}

/// A `forward` argument that is a Python value, not a tensor (see
/// [`TorchReference::constants`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ForwardConstant {
    /// `True` / `False`.
    Bool(bool),
    /// A Python int.
    Int(i64),
    /// A Python float.
    Float(f64),
}

impl std::fmt::Display for ForwardConstant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForwardConstant::Bool(true) => write!(f, "True"),
            ForwardConstant::Bool(false) => write!(f, "False"),
            ForwardConstant::Int(i) => write!(f, "{i}"),
            ForwardConstant::Float(x) => write!(f, "{x:?}"),
        }
    }
}

impl TorchReference {
    /// Checks that it names the problem's tensors consistently: every input exactly once
    /// (forward or state), every output once, `init_inputs` a JSON array.
    fn check(&self, tensors: &[TensorSpec]) -> Result<(), String> {
        let at = |m: String| format!("[reference.torch]: {m}");
        let role = |n: &str| tensors.iter().find(|t| t.name == n).map(|t| t.role);
        let mut seen: Vec<&str> = Vec::new();
        for (n, c) in &self.constants {
            if !self.forward.contains(n) {
                return Err(at(format!("constant {n:?} is not a forward argument")));
            }
            if role(n).is_some() {
                return Err(at(format!("constant {n:?} is also a tensor")));
            }
            if matches!(c, ForwardConstant::Float(x) if !x.is_finite()) {
                return Err(at(format!("constant {n:?} is not a finite number")));
            }
        }
        let tensor_args = self
            .forward
            .iter()
            .filter(|n| !self.constants.contains_key(*n));
        for n in tensor_args.chain(self.state.values()) {
            match role(n) {
                Some(Role::Input) => {}
                Some(Role::Output) => return Err(at(format!("{n:?} is an output, not an input"))),
                None => return Err(at(format!("no tensor {n:?}"))),
            }
            if seen.contains(&n.as_str()) {
                return Err(at(format!("tensor {n:?} is named twice")));
            }
            seen.push(n);
        }
        for n in &self.outputs {
            if role(n) != Some(Role::Output) {
                return Err(at(format!("{n:?} is not an output tensor")));
            }
            if seen.contains(&n.as_str()) {
                return Err(at(format!("tensor {n:?} is named twice")));
            }
            seen.push(n);
        }
        if let Some(t) = tensors.iter().find(|t| !seen.contains(&t.name.as_str())) {
            return Err(at(format!(
                "tensor {:?} is neither a forward argument, a parameter nor an output",
                t.name
            )));
        }
        for n in &self.bool_tensors {
            let u8_input = tensors
                .iter()
                .any(|t| &t.name == n && t.role == Role::Input && t.dtype == Dtype::U8);
            if !u8_input {
                return Err(at(format!("bool tensor {n:?} must be a u8 input")));
            }
        }
        match serde_json::from_str::<serde_json::Value>(&self.init_inputs) {
            Ok(serde_json::Value::Array(_)) => Ok(()),
            _ => Err(at("init_inputs must be a JSON array".into())),
        }
    }
}

/// A problem: fixed shapes and everything needed to judge a candidate for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProblemSpec {
    /// Unique name: lowercase letters, digits, `-`, `_` and `.`, starting with a letter or
    /// a digit ([`crate::names`]).
    pub name: String,
    /// One line saying what is computed.
    #[serde(default)]
    pub summary: String,
    /// The tensors, inputs and outputs.
    #[serde(rename = "tensor")]
    pub tensors: Vec<TensorSpec>,
    /// Tolerance for the comparison with the reference.
    pub tolerance: Tolerance,
    /// Precision tier a candidate must reach to be `ok` (none: any tier passes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_tier: Option<crate::PrecisionTier>,
    /// Roofline figures.
    #[serde(default)]
    pub roofline: Roofline,
    /// Which figure of a GPU sample ranks candidates for this problem (`kernel_span`,
    /// `kernel_sum`, `events`); none: the daemon's `[evaluation.timing] figure`. Left out
    /// of the JSON when unset, so specs without it keep their hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing_figure: Option<crate::TimingFigure>,
    /// Trusted references: a kernel per backend and/or a PyTorch module.
    pub reference: References,
    /// Plain correct starting kernel per backend (`host`, `cuda`) or language (`triton`,
    /// evaluated on the cuda backend), carrying knobs.
    #[serde(default)]
    pub seed: BTreeMap<String, KernelSource>,
    /// Library baselines per library (`cublas`, `cudnn`, `torch`): named ops, never code
    /// (see [`crate::baseline`]). Left out of the JSON when empty, so specs without
    /// baselines keep their hash.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub baseline: crate::baseline::Baselines,
}

/// Why a problem folder or spec was refused.
#[derive(Debug, Error)]
pub enum ProblemError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// `problem.toml` did not parse.
    #[error("problem.toml: {0}")]
    Parse(String),
    /// The spec parsed but is inconsistent.
    #[error("problem {name:?}: {message}")]
    Invalid {
        /// The problem's name.
        name: String,
        /// What is wrong.
        message: String,
    },
}

/// Largest source file a problem may ship.
const MAX_PROBLEM_SOURCE: u64 = 1 << 20;

/// The text of a file of a problem folder: a regular file (symbolic links followed) of at
/// most [`MAX_PROBLEM_SOURCE`] bytes, else `FileTooLarge`, or `InvalidInput` for anything
/// but a regular file.
fn read_file(path: &Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    // Looked at before opening: opening a FIFO would wait for a writer.
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    let too_large = || {
        Error::new(
            ErrorKind::FileTooLarge,
            format!("larger than {MAX_PROBLEM_SOURCE} bytes"),
        )
    };
    if meta.len() > MAX_PROBLEM_SOURCE {
        return Err(too_large());
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_PROBLEM_SOURCE + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_PROBLEM_SOURCE {
        return Err(too_large());
    }
    Ok(text)
}

impl ProblemSpec {
    /// Parses `problem.toml` text (sources not inlined).
    pub fn from_toml(text: &str) -> Result<Self, ProblemError> {
        toml::from_str(text).map_err(|e| ProblemError::Parse(e.to_string()))
    }

    /// Reads `DIR/problem.toml`, inlines the reference and seed sources it names (files
    /// inside `DIR` only), and validates the result. Every file read must be a regular file
    /// of at most 1 MiB (so a device or a FIFO named as a source cannot hang the reader).
    pub fn load_dir(dir: &Path) -> Result<Self, ProblemError> {
        let toml_path = dir.join("problem.toml");
        let text = read_file(&toml_path).map_err(|source| ProblemError::Read {
            path: toml_path.display().to_string(),
            source,
        })?;
        let mut spec = Self::from_toml(&text)?;
        let name = spec.name.clone();
        let References { cuda, host, torch } = &mut spec.reference;
        let torch = torch.as_mut().map(|t| (&t.file, &mut t.source));
        let kernels = [cuda.as_mut(), host.as_mut()]
            .into_iter()
            .flatten()
            .chain(spec.seed.values_mut())
            .map(|ks| (&ks.file, &mut ks.source));
        for (file, source) in kernels.chain(torch) {
            if file.contains('/') || file.starts_with('.') || file.is_empty() {
                return Err(ProblemError::Invalid {
                    name,
                    message: format!(
                        "source file {file:?} must be a plain file name in the problem folder"
                    ),
                });
            }
            let path = dir.join(file);
            *source = read_file(&path).map_err(|source| match source.kind() {
                std::io::ErrorKind::FileTooLarge => ProblemError::Invalid {
                    name: name.clone(),
                    message: format!("{file} is larger than {MAX_PROBLEM_SOURCE} bytes"),
                },
                _ => ProblemError::Read {
                    path: path.display().to_string(),
                    source,
                },
            })?;
        }
        spec.validate()?;
        Ok(spec)
    }

    /// Checks names, shapes and that every launch arg names a tensor, a scratch buffer or
    /// a literal.
    pub fn validate(&self) -> Result<(), ProblemError> {
        let bad = |message: String| ProblemError::Invalid {
            name: self.name.clone(),
            message,
        };
        crate::names::check(crate::names::NameKind::Problem, &self.name).map_err(bad)?;
        if self.tensors.is_empty() {
            return Err(bad("no tensors".into()));
        }
        if !self.tensors.iter().any(|t| t.role == Role::Output) {
            return Err(bad("no output tensor".into()));
        }
        for (i, t) in self.tensors.iter().enumerate() {
            if !crate::candidate::is_identifier(&t.name) {
                return Err(bad(format!("tensor {:?} is not an identifier", t.name)));
            }
            if self.tensors[..i].iter().any(|o| o.name == t.name) {
                return Err(bad(format!("tensor {:?} is declared twice", t.name)));
            }
            if t.shape.is_empty() || t.shape.contains(&0) {
                return Err(bad(format!(
                    "tensor {:?} has an empty or zero shape",
                    t.name
                )));
            }
            let elems = t
                .shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n <= MAX_TENSOR_ELEMS);
            if elems.is_none() {
                return Err(bad(format!(
                    "tensor {:?} has more than {MAX_TENSOR_ELEMS} elements",
                    t.name
                )));
            }
            t.init
                .check()
                .map_err(|e| bad(format!("tensor {:?}: init: {e}", t.name)))?;
        }
        let Tolerance { atol, rtol } = self.tolerance;
        if !(atol >= 0.0 && rtol >= 0.0 && atol.is_finite() && rtol.is_finite()) {
            return Err(bad("tolerance must be non-negative and finite".into()));
        }
        if self.reference.is_empty() {
            return Err(bad("no reference kernel".into()));
        }
        if let Some(t) = &self.reference.torch {
            t.check(&self.tensors).map_err(bad)?;
        }
        self.check_get_inputs().map_err(bad)?;
        // Reference backends are the fields of `References` (unknown ones fail to parse).
        for backend in self.seed.keys() {
            if !matches!(backend.as_str(), "host" | "cuda" | "triton") {
                return Err(bad(format!(
                    "unknown seed backend {backend:?} (host, cuda, or triton)"
                )));
            }
        }
        let references = self.reference.kernels().map(|(_, k)| k);
        for ks in references.chain(self.seed.values()) {
            if let Some(s) = ks.scratch.iter().find(|s| self.tensor(&s.name).is_some()) {
                return Err(bad(format!(
                    "{}: scratch buffer {:?} has the name of a tensor",
                    ks.file, s.name
                )));
            }
            for l in &ks.launches {
                for a in &l.args {
                    if let crate::Arg::Buffer(n) = a
                        && !self.tensors.iter().any(|t| &t.name == n)
                        && !ks.scratch.iter().any(|s| &s.name == n)
                    {
                        return Err(bad(format!(
                            "{} launch {:?} names unknown buffer {n:?}",
                            ks.file, l.kernel
                        )));
                    }
                }
            }
        }
        crate::baseline::check(self).map_err(bad)?;
        Ok(())
    }

    /// Backends this problem can be evaluated on (a kernel reference, or the torch
    /// reference for both; only cuda when an input comes from `get_inputs()`).
    pub fn backends(&self) -> Vec<BackendKind> {
        BackendKind::ALL
            .into_iter()
            .filter(|&b| self.evaluable_on(b))
            .collect()
    }

    /// Whether candidates for `backend` can be evaluated: it has a reference there, and
    /// an input from `get_inputs()` (made on the GPU) does not keep the host backend out.
    pub fn evaluable_on(&self, backend: BackendKind) -> bool {
        self.reference.has(backend) && !(backend == BackendKind::Host && self.has_get_inputs())
    }

    /// Whether some input comes from the problem's own `get_inputs()` ([`Init::GetInputs`]).
    pub fn has_get_inputs(&self) -> bool {
        self.tensors.iter().any(|t| t.init == Init::GetInputs)
    }

    /// The rules of [`Init::GetInputs`]: inputs only, of a problem whose one reference is
    /// its torch module, each a forward argument (get_inputs() returns those, in order).
    /// Such an input is never shifted, whatever its `shifted_trial` says.
    fn check_get_inputs(&self) -> Result<(), String> {
        for t in self.tensors.iter().filter(|t| t.init == Init::GetInputs) {
            let what = format!("tensor {:?}: init get_inputs", t.name);
            if t.role != Role::Input {
                return Err(format!("{what} is for inputs only"));
            }
            let Some(torch) = &self.reference.torch else {
                return Err(format!(
                    "{what} needs a [reference.torch] (its file's get_inputs())"
                ));
            };
            if self.reference.kernels().next().is_some() {
                return Err(format!(
                    "{what}: a problem with inputs from get_inputs() has the torch module as its \
                     only reference (a kernel reference has no get_inputs())"
                ));
            }
            if !torch.forward.contains(&t.name) {
                return Err(format!(
                    "{what}: only forward's arguments come from get_inputs(); a parameter is drawn"
                ));
            }
        }
        Ok(())
    }

    /// The seed kernel for a backend (`host`, `cuda`) or for the `triton` language as a
    /// submittable candidate.
    pub fn seed_candidate(&self, backend: &str) -> Option<crate::Candidate> {
        let mut c = self.kernel_candidate(self.seed.get(backend)?, backend);
        c.note = Some("seed kernel".into());
        Some(c)
    }

    /// The reference kernel for `backend` as a candidate (to compile or profile it like
    /// one), if the problem has one; `None` for a torch-only reference (nothing to compile).
    pub fn reference_candidate(&self, backend: BackendKind) -> Option<crate::Candidate> {
        Some(self.kernel_candidate(self.reference.kernel(backend)?, backend.as_str()))
    }

    fn kernel_candidate(&self, ks: &KernelSource, backend: &str) -> crate::Candidate {
        crate::Candidate {
            problem: self.name.clone(),
            // A seed's key is a backend or the `triton` language (checked at load).
            language: if backend == "triton" {
                crate::Language::Triton
            } else {
                crate::Language::of_reference(backend.parse().unwrap_or(BackendKind::Host))
            },
            source: ks.source.clone(),
            launches: ks.launches.clone(),
            scratch: ks.scratch.clone(),
            flags: ks.flags.clone(),
            parent: None,
            note: None,
        }
    }

    /// Looks up a tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorSpec> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = r#"
name = "tiny-add"
summary = "y = a + b"
[[tensor]]
name = "a"
dtype = "f32"
shape = [4, 8]
role = "input"
init = { dist = "uniform", low = -1.0, high = 1.0 }
[[tensor]]
name = "y"
dtype = "f32"
shape = [4, 8]
role = "output"
[tolerance]
atol = 1e-6
rtol = 1e-6
[reference.host]
file = "reference.c"
launches = [{ kernel = "ref_add", args = ["a", "y", { i32 = 32 }] }]
"#;

    #[test]
    fn parses_and_validates() {
        let spec = ProblemSpec::from_toml(TOML).expect("parses");
        spec.validate().expect("valid");
        assert_eq!(spec.tensor("a").map(TensorSpec::bytes), Some(128));
        assert_eq!(spec.backends(), vec![BackendKind::Host]);
    }

    const TORCH: &str = r#"
name = "kb-tiny"
[[tensor]]
name = "x"
dtype = "f32"
shape = [4, 8]
role = "input"
[[tensor]]
name = "w"
dtype = "f32"
shape = [8]
role = "input"
[[tensor]]
name = "out"
dtype = "f32"
shape = [4, 8]
role = "output"
[tolerance]
atol = 1e-4
rtol = 1e-4
[reference.torch]
file = "reference.py"
init_inputs = "[8]"
forward = ["x"]
outputs = ["out"]
[reference.torch.state]
"ln.weight" = "w"
"#;

    #[test]
    fn a_torch_reference_serves_both_backends_and_names_every_tensor_once() {
        let spec = ProblemSpec::from_toml(TORCH).expect("parses");
        spec.validate().expect("valid");
        assert_eq!(spec.backends(), [BackendKind::Cuda, BackendKind::Host]);
        assert!(
            spec.reference_candidate(BackendKind::Host).is_none(),
            "nothing to compile"
        );
        for (from, to, needle) in [
            (
                "forward = [\"x\"]",
                "forward = [\"x\", \"w\"]",
                "named twice",
            ),
            ("forward = [\"x\"]", "forward = []", "neither"),
            ("outputs = [\"out\"]", "outputs = [\"x\"]", "not an output"),
            ("init_inputs = \"[8]\"", "init_inputs = \"8\"", "JSON array"),
            (
                "\"ln.weight\" = \"w\"",
                "\"ln.weight\" = \"nope\"",
                "no tensor",
            ),
        ] {
            let text = TORCH.replacen(from, to, 1);
            assert_ne!(text, TORCH, "{from}");
            let err = ProblemSpec::from_toml(&text)
                .expect("parses")
                .validate()
                .expect_err(needle)
                .to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }

    /// A Python number among forward's arguments is a constant: named in `forward`, given
    /// in `constants`, never a tensor; it round-trips through TOML and JSON as it was.
    #[test]
    fn a_forward_constant_is_an_argument_that_is_not_a_tensor() {
        let with = TORCH.replacen(
            "forward = [\"x\"]",
            "forward = [\"x\", \"s\"]\nconstants = { s = 2.75 }",
            1,
        );
        let spec = ProblemSpec::from_toml(&with).expect("parses");
        spec.validate().expect("valid");
        let torch = spec.reference.torch.as_ref().expect("torch");
        assert_eq!(torch.constants["s"], ForwardConstant::Float(2.75));
        assert_eq!(torch.constants["s"].to_string(), "2.75");
        let json = serde_json::to_string(&spec).expect("json");
        let back: ProblemSpec = serde_json::from_str(&json).expect("back");
        assert_eq!(
            back.reference.torch.as_ref().unwrap().constants,
            torch.constants
        );
        for (text, want) in [
            ("constants = { s = 2 }", ForwardConstant::Int(2)),
            ("constants = { s = true }", ForwardConstant::Bool(true)),
        ] {
            let t = with.replacen("constants = { s = 2.75 }", text, 1);
            let spec = ProblemSpec::from_toml(&t).expect("parses");
            spec.validate().expect("valid");
            assert_eq!(spec.reference.torch.unwrap().constants["s"], want);
        }
        for (from, to, needle) in [
            (
                "forward = [\"x\", \"s\"]",
                "forward = [\"x\"]",
                "not a forward argument",
            ),
            (
                "constants = { s = 2.75 }",
                "constants = { x = 1.0, s = 2.75 }",
                "also a tensor",
            ),
            (
                "constants = { s = 2.75 }",
                "constants = { s = nan }",
                "finite",
            ),
            ("constants = { s = 2.75 }", "constants = { s = \"pi\" }", ""),
            ("constants = { s = 2.75 }", "", "no tensor \"s\""),
        ] {
            let t = with.replacen(from, to, 1);
            assert_ne!(t, with, "{from}");
            let err = ProblemSpec::from_toml(&t)
                .map_err(|e| e.to_string())
                .and_then(|s| s.validate().map_err(|e| e.to_string()))
                .expect_err(to);
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn unknown_buffer_is_refused() {
        let text = TOML.replace(r#"args = ["a", "y""#, r#"args = ["a", "zz""#);
        let spec = ProblemSpec::from_toml(&text).expect("parses");
        let err = spec.validate().expect_err("unknown buffer");
        assert!(err.to_string().contains("zz"), "{err}");
    }

    #[test]
    fn bad_input_distributions_and_tolerances_are_refused() {
        for (from, to, needle) in [
            (
                "low = -1.0, high = 1.0",
                "low = 1.0, high = 1.0",
                "low < high",
            ),
            (
                "low = -1.0, high = 1.0",
                "low = -1.0, high = inf",
                "finite bounds",
            ),
            (
                "dist = \"uniform\", low = -1.0, high = 1.0",
                "dist = \"normal\", std = -1.0",
                "non-negative std",
            ),
            (
                "dist = \"uniform\", low = -1.0, high = 1.0",
                "dist = \"randint\", low = 3, high = 2",
                "low < high",
            ),
            ("atol = 1e-6", "atol = inf", "non-negative and finite"),
            ("rtol = 1e-6", "rtol = -1e-6", "non-negative and finite"),
        ] {
            let text = TOML.replacen(from, to, 1);
            assert_ne!(text, TOML, "{from}");
            let err = ProblemSpec::from_toml(&text)
                .expect("parses")
                .validate()
                .expect_err(needle)
                .to_string();
            assert!(err.contains(needle), "{to}: {err}");
        }
        assert_eq!(Init::default().check(), Ok(()));
        let randint = Init::Randint { low: 0, high: 2 };
        assert_eq!(randint.check(), Ok(()));
    }

    #[test]
    fn scratch_may_not_take_a_tensor_name() {
        let text = TOML.replace(
            "launches = [{ kernel = \"ref_add\"",
            "scratch = [{ name = \"y\", dtype = \"f32\", elems = 4 }]\nlaunches = [{ kernel = \"ref_add\"",
        );
        assert_ne!(text, TOML);
        let err = ProblemSpec::from_toml(&text)
            .expect("parses")
            .validate()
            .expect_err("shadowing scratch")
            .to_string();
        assert!(err.contains("has the name of a tensor"), "{err}");
    }

    #[test]
    fn load_dir_reads_only_small_regular_files() {
        let dir = std::env::temp_dir().join(format!("kiln-types-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("problem.toml"), TOML).expect("write");
        // A device named as the source: refused without reading it.
        let _ = std::fs::remove_file(dir.join("reference.c"));
        std::os::unix::fs::symlink("/dev/zero", dir.join("reference.c")).expect("symlink");
        let err = ProblemSpec::load_dir(&dir).expect_err("device").to_string();
        assert!(err.contains("not a regular file"), "{err}");
        std::fs::remove_file(dir.join("reference.c")).expect("rm");
        let big = vec![b'x'; (MAX_PROBLEM_SOURCE + 1) as usize];
        std::fs::write(dir.join("reference.c"), &big).expect("write");
        let err = ProblemSpec::load_dir(&dir)
            .expect_err("too large")
            .to_string();
        assert!(err.contains("reference.c is larger than"), "{err}");
        std::fs::write(dir.join("problem.toml"), &big).expect("write");
        let err = ProblemSpec::load_dir(&dir)
            .expect_err("too large")
            .to_string();
        assert!(err.contains("problem.toml: larger than"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn load_dir_inlines_sources_and_refuses_escapes() {
        let dir = std::env::temp_dir().join(format!("kiln-types-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("problem.toml"), TOML).expect("write");
        std::fs::write(dir.join("reference.c"), "void ref_add(void){}").expect("write");
        let spec = ProblemSpec::load_dir(&dir).expect("loads");
        assert!(
            spec.reference
                .kernel(BackendKind::Host)
                .is_some_and(|k| k.source.contains("ref_add"))
        );
        std::fs::write(
            dir.join("problem.toml"),
            TOML.replace("reference.c", "../etc/passwd"),
        )
        .expect("write");
        assert!(ProblemSpec::load_dir(&dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod get_inputs_tests {
    use super::*;

    fn spec(extra: &str, init: &str) -> Result<ProblemSpec, ProblemError> {
        let p = ProblemSpec::from_toml(&format!(
            r#"
name = "p"
[[tensor]]
name = "a"
dtype = "f32"
shape = [64]
role = "input"
init = {init}
[[tensor]]
name = "w"
dtype = "f32"
shape = [64]
role = "input"
[[tensor]]
name = "out"
dtype = "f32"
shape = [64]
role = "output"
[tolerance]
atol = 1e-4
rtol = 1e-4
[reference.torch]
file = "reference.py"
source = "class Model: ..."
forward = ["a"]
outputs = ["out"]
[reference.torch.state]
"weight" = "w"
{extra}
"#
        ))?;
        p.validate()?;
        Ok(p)
    }

    /// A forward argument from get_inputs() is valid on a torch-only problem, which then
    /// runs on the cuda backend only, and is never shifted.
    #[test]
    fn a_forward_argument_may_come_from_get_inputs() {
        let p = spec("", r#"{ dist = "get_inputs" }"#).expect("valid");
        assert!(p.has_get_inputs());
        assert_eq!(p.backends(), [BackendKind::Cuda]);
        assert!(!p.evaluable_on(BackendKind::Host));
        let drawn = spec("", r#"{ dist = "normal" }"#).expect("valid");
        assert_eq!(drawn.backends(), [BackendKind::Cuda, BackendKind::Host]);
    }

    /// Parameters, outputs and problems with a kernel reference cannot use it.
    #[test]
    fn get_inputs_is_refused_where_it_cannot_be_made() {
        let mut param = spec("", r#"{ dist = "normal" }"#).expect("valid");
        param.tensors[1].init = Init::GetInputs;
        let e = param.validate().expect_err("a parameter").to_string();
        assert!(e.contains("only forward's arguments"), "{e}");
        let mut out = spec("", r#"{ dist = "normal" }"#).expect("valid");
        out.tensors[2].init = Init::GetInputs;
        let e = out.validate().expect_err("an output").to_string();
        assert!(e.contains("inputs only"), "{e}");
        let with_kernel = spec(
            r#"[reference.host]
file = "r.c"
source = "void r(const float*a,const float*w,float*o){}"
launches = [{ kernel = "r", args = ["a", "w", "out"] }]"#,
            r#"{ dist = "get_inputs" }"#,
        );
        let e = with_kernel.expect_err("a kernel reference").to_string();
        assert!(e.contains("only reference"), "{e}");
    }
}

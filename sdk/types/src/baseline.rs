//! Baselines: what a problem computes as one of kiln's named library ops, and the times
//! of those library calls measured on this GPU.
//!
//! A problem names its baselines in `problem.toml`, one table per library:
//!
//! ```toml
//! [baseline.cudnn]
//! op = "conv2d"
//! x = "x"
//! w = "w"
//! b = "b"
//! y = "y"
//! stride = 4
//! padding = 2
//!
//! [baseline.torch]            # the same table, for torch eager
//! op = "conv2d"
//! # ...
//! ```
//!
//! Problem files are untrusted: an op is a name from a fixed registry ([`BaselineOp`]) with
//! typed parameters naming the problem's tensors, never code. [`check`] validates each op
//! against the tensors (roles, dtypes, shapes) and against what its library offers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::problem::{Dtype, ProblemSpec, Role};
use crate::verdict::TimingStats;

/// Every kind of baseline kiln measures, registered once: its name, its library, the
/// `[baseline.TABLE]` of `problem.toml` that asks for it, and who runs it. Adding a kind
/// is one variant here, its row in [`BaselineKind::ALL`], and its measurement: a GPU
/// library's in the sandbox's `engine/cuda/baseline.rs`, torch's in the torch runner's
/// `kiln_torch.py` (docs/architecture.md, "Baselines").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BaselineKind {
    /// The problem's own trusted reference kernel (always measured).
    Reference,
    /// cuBLAS GEMM (`[baseline.cublas]`).
    Cublas,
    /// cuDNN convolution (`[baseline.cudnn]`).
    Cudnn,
    /// torch eager (`[baseline.torch]`).
    TorchEager,
    /// `torch.compile` of the same op or module (`[baseline.torch]`).
    TorchCompile,
    /// The problem's own PyTorch `Model`, run as a hosted `ModelNew` file through the
    /// hosted path a hosted candidate takes (its runner, its wake-up, its device wait,
    /// the hand-back of its result): the baseline a hosted candidate's speedup is taken
    /// against (`[baseline.torch]` of a problem with a PyTorch reference).
    TorchEagerHosted,
    /// `torch.compile` of that `Model`, run the same way.
    TorchCompileHosted,
}

/// How a time was taken, which decides which times a ratio may be formed of: a speedup is
/// only the same-harness figure when the candidate and the baseline share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Harness {
    /// On the GPU's own clock in kiln's trusted process (CUPTI kernel records or events
    /// around the launches): the contract's candidates, the reference, cuBLAS, cuDNN and
    /// the torch runner's eager and compile.
    #[default]
    InProcess,
    /// The worker's clock from its command to a hosted runner's answer, less kiln's
    /// empty round trip: hosted candidates and the hosted baselines.
    Hosted,
}

impl Harness {
    /// The harness that timed a candidate run under `trust`.
    pub fn of(trust: crate::TrustMode) -> Harness {
        match trust {
            crate::TrustMode::Hosted => Harness::Hosted,
            crate::TrustMode::Contract | crate::TrustMode::Lifted => Harness::InProcess,
        }
    }
}

/// Who runs a baseline kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaselineRunner {
    /// kiln's jailed GPU worker (`Request::Baselines`).
    GpuWorker,
    /// kiln's trusted torch runner (`kiln_torch.py`).
    TorchRunner,
    /// kilnd, through the hosted path: the problem's module written as a `ModelNew` file
    /// ([`hosted_file`]) and evaluated on the lane like a hosted candidate.
    HostedPath,
}

/// The `ModelNew` file of a hosted baseline `kind`: the problem's own reference module
/// (its trusted text, as registered) with `ModelNew` naming `Model` itself (eager), or
/// `Model` whose forward `torch.compile` compiled (compile); `None` for the other kinds.
/// Its parameters are `Model`'s own, by the same names, so kiln sets them as it sets the
/// reference's.
pub fn hosted_file(
    kind: BaselineKind,
    reference: &crate::problem::TorchReference,
) -> Option<String> {
    let tail = match kind {
        BaselineKind::TorchEagerHosted => {
            "\n\n# kiln's hosted baseline (torch eager): the problem's own Model, run as a hosted file.\n\
             class ModelNew(Model):\n    pass\n"
        }
        BaselineKind::TorchCompileHosted => {
            "\n\n# kiln's hosted baseline (torch.compile): the problem's own Model, its forward\n\
             # compiled, run as a hosted file.\n\
             import functools as _kiln_functools\n\
             import torch as _kiln_torch\n\n\n\
             class ModelNew(Model):\n\
             \x20   def __init__(self, *args, **kwargs):\n\
             \x20       super().__init__(*args, **kwargs)\n\
             \x20       self._kiln_compiled = _kiln_torch.compile(_kiln_functools.partial(Model.forward, self))\n\n\
             \x20   def forward(self, *args):\n\
             \x20       return self._kiln_compiled(*args)\n"
        }
        _ => return None,
    };
    Some(format!("{}{tail}", reference.source.trim_end()))
}

impl BaselineKind {
    /// Every kind, in the order they are measured and shown.
    pub const ALL: [BaselineKind; 7] = [
        BaselineKind::Reference,
        BaselineKind::Cublas,
        BaselineKind::Cudnn,
        BaselineKind::TorchEager,
        BaselineKind::TorchCompile,
        BaselineKind::TorchEagerHosted,
        BaselineKind::TorchCompileHosted,
    ];

    /// The kind's name, the stem of its results' names (`cublas` → `cublas-fp32`).
    pub fn name(self) -> &'static str {
        match self {
            BaselineKind::Reference => "reference",
            BaselineKind::Cublas => "cublas",
            BaselineKind::Cudnn => "cudnn",
            BaselineKind::TorchEager => "torch-eager",
            BaselineKind::TorchCompile => "torch-compile",
            BaselineKind::TorchEagerHosted => "torch-eager-hosted",
            BaselineKind::TorchCompileHosted => "torch-compile-hosted",
        }
    }

    /// The library it measures (`kiln` for the reference).
    pub fn library(self) -> &'static str {
        match self {
            BaselineKind::Reference => "kiln",
            BaselineKind::Cublas => "cublas",
            BaselineKind::Cudnn => "cudnn",
            BaselineKind::TorchEager
            | BaselineKind::TorchCompile
            | BaselineKind::TorchEagerHosted
            | BaselineKind::TorchCompileHosted => "torch",
        }
    }

    /// The `[baseline.TABLE]` of `problem.toml` that asks for it (none: always measured).
    pub fn table(self) -> Option<&'static str> {
        match self {
            BaselineKind::Reference => None,
            BaselineKind::Cublas => Some("cublas"),
            BaselineKind::Cudnn => Some("cudnn"),
            BaselineKind::TorchEager
            | BaselineKind::TorchCompile
            | BaselineKind::TorchEagerHosted
            | BaselineKind::TorchCompileHosted => Some("torch"),
        }
    }

    /// Who runs it.
    pub fn runner(self) -> BaselineRunner {
        match self {
            BaselineKind::Reference | BaselineKind::Cublas | BaselineKind::Cudnn => {
                BaselineRunner::GpuWorker
            }
            BaselineKind::TorchEager | BaselineKind::TorchCompile => BaselineRunner::TorchRunner,
            BaselineKind::TorchEagerHosted | BaselineKind::TorchCompileHosted => {
                BaselineRunner::HostedPath
            }
        }
    }

    /// How its times are taken.
    pub fn harness(self) -> Harness {
        match self.runner() {
            BaselineRunner::HostedPath => Harness::Hosted,
            BaselineRunner::GpuWorker | BaselineRunner::TorchRunner => Harness::InProcess,
        }
    }

    /// For a hosted kind, the in-process kind it is the same-harness twin of.
    pub fn in_process_twin(self) -> Option<BaselineKind> {
        match self {
            BaselineKind::TorchEagerHosted => Some(BaselineKind::TorchEager),
            BaselineKind::TorchCompileHosted => Some(BaselineKind::TorchCompile),
            _ => None,
        }
    }

    /// The name of one of its results: the kind's name, then the precision variant
    /// (`cublas-tf32`, `torch-compile-fp32`); the reference has one result, `reference`.
    pub fn result_name(self, precision: &str) -> String {
        if self == BaselineKind::Reference || precision.is_empty() {
            self.name().to_string()
        } else {
            format!("{}-{precision}", self.name())
        }
    }

    /// The kinds a problem asks for: the reference, then those whose table it has (the
    /// hosted ones only where the reference is a PyTorch module they can run).
    pub fn asked_by(spec: &ProblemSpec) -> Vec<BaselineKind> {
        BaselineKind::ALL
            .into_iter()
            .filter(|k| k.table().is_none_or(|t| spec.baseline.contains_key(t)))
            .filter(|k| k.harness() == Harness::InProcess || spec.reference.torch.is_some())
            .collect()
    }

    /// A result of this kind that was not measured, with the reason.
    pub fn not_measured(
        self,
        precision: &str,
        status: BaselineStatus,
        detail: impl Into<String>,
    ) -> BaselineResult {
        BaselineResult {
            harness: self.harness(),
            ..BaselineResult::not_measured(
                &self.result_name(precision),
                self.library(),
                precision,
                status,
                detail,
            )
        }
    }
}

/// The `[baseline.TABLE]` names a problem may use, from the registry.
pub fn tables() -> Vec<&'static str> {
    let mut t: Vec<&'static str> = BaselineKind::ALL.iter().filter_map(|k| k.table()).collect();
    t.dedup();
    t
}

/// A max-pooling window after a convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pool {
    /// Square window side.
    pub kernel: u32,
    /// Stride in both dimensions (no padding).
    pub stride: u32,
}

/// One of kiln's named ops, with the problem's tensors it reads and writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum BaselineOp {
    /// `c = a @ b`: a `[M, K]`, b `[K, N]`, c `[M, N]`, one float dtype.
    Matmul {
        /// Left operand.
        a: String,
        /// Right operand.
        b: String,
        /// Result.
        c: String,
    },
    /// `y = maxpool?(relu?(conv2d(x, w) + b))`, NCHW, square stride and padding.
    Conv2d {
        /// Input `[N, C, H, W]`.
        x: String,
        /// Filters `[K, C, R, S]`.
        w: String,
        /// Bias `[K]`, optional.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        b: Option<String>,
        /// Output.
        y: String,
        /// Stride.
        stride: u32,
        /// Zero padding on every side.
        #[serde(default)]
        padding: u32,
        /// ReLU after the bias.
        #[serde(default)]
        relu: bool,
        /// Max pooling after the ReLU.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        maxpool: Option<Pool>,
    },
    /// Softmax over the last dimension.
    Softmax {
        /// Input.
        x: String,
        /// Output, same shape.
        y: String,
    },
    /// LayerNorm over the last `dims` dimensions, with optional elementwise weight and bias.
    LayerNorm {
        /// Input.
        x: String,
        /// Weight, shaped like the normalised dimensions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        w: Option<String>,
        /// Bias, shaped like the normalised dimensions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        b: Option<String>,
        /// Output, same shape as `x`.
        y: String,
        /// How many trailing dimensions are normalised.
        dims: u32,
        /// Epsilon added to the variance.
        eps: f64,
    },
    /// The problem's own PyTorch module (`[reference.torch]`) on the problem's tensors;
    /// torch only.
    Module {},
    /// Scaled dot-product attention, `softmax(q kᵀ / sqrt(d)) v`, on `[B, H, S, D]`.
    Sdpa {
        /// Queries.
        q: String,
        /// Keys.
        k: String,
        /// Values.
        v: String,
        /// Output.
        out: String,
        /// Causal mask.
        #[serde(default)]
        causal: bool,
    },
}

impl BaselineOp {
    /// The op's name as written in `problem.toml`.
    pub fn name(&self) -> &'static str {
        match self {
            BaselineOp::Matmul { .. } => "matmul",
            BaselineOp::Conv2d { .. } => "conv2d",
            BaselineOp::Softmax { .. } => "softmax",
            BaselineOp::LayerNorm { .. } => "layer_norm",
            BaselineOp::Sdpa { .. } => "sdpa",
            BaselineOp::Module {} => "module",
        }
    }

    /// Whether `library` offers this op (cuBLAS: matmul; cuDNN: conv2d; torch: all,
    /// including the problem's own module).
    pub fn offered_by(&self, library: &str) -> bool {
        match library {
            "cublas" => matches!(self, BaselineOp::Matmul { .. }),
            "cudnn" => matches!(self, BaselineOp::Conv2d { .. }),
            "torch" => true,
            _ => false,
        }
    }
}

/// Checks every baseline of `spec`: known library, op offered by it, tensors that exist
/// with the right roles, dtypes and shapes. The message names the table.
pub fn check(spec: &ProblemSpec) -> Result<(), String> {
    for (library, op) in &spec.baseline {
        let at = |m: String| format!("[baseline.{library}]: {m}");
        let known = tables();
        if !known.contains(&library.as_str()) {
            return Err(at(format!("unknown library (one of {})", known.join(", "))));
        }
        if !op.offered_by(library) {
            return Err(at(format!("{library} has no op {:?}", op.name())));
        }
        check_op(spec, library, op).map_err(at)?;
    }
    Ok(())
}

struct Look<'a>(&'a ProblemSpec);

impl Look<'_> {
    fn get(&self, name: &str, role: Role) -> Result<(&[u64], Dtype), String> {
        let t = self
            .0
            .tensor(name)
            .ok_or_else(|| format!("no tensor {name:?}"))?;
        if t.role != role {
            return Err(format!("tensor {name:?} must be an {role:?}").to_lowercase());
        }
        Ok((&t.shape, t.dtype))
    }
}

fn same_dtype(dtypes: &[Dtype], allowed: &[Dtype], what: &str) -> Result<(), String> {
    let first = dtypes[0];
    if dtypes.iter().any(|d| *d != first) {
        return Err(format!("{what}: every tensor must have the same dtype"));
    }
    if !allowed.contains(&first) {
        return Err(format!(
            "{what}: dtype {first:?} is not supported here (supported: {allowed:?})"
        ));
    }
    Ok(())
}

/// Output side of a window: `(n + 2p - k) / s + 1`, or `None` when it does not fit.
pub fn window_out(n: u64, k: u64, s: u64, p: u64) -> Option<u64> {
    if s == 0 || n + 2 * p < k {
        return None;
    }
    Some((n + 2 * p - k) / s + 1)
}

fn check_op(spec: &ProblemSpec, library: &str, op: &BaselineOp) -> Result<(), String> {
    let l = Look(spec);
    let floats: &[Dtype] = if library == "torch" {
        &[Dtype::F32, Dtype::F16, Dtype::Bf16, Dtype::F64]
    } else {
        &[Dtype::F32, Dtype::F16]
    };
    match op {
        BaselineOp::Module {} => {
            if spec.reference.torch.is_none() {
                return Err("op \"module\" needs a [reference.torch]".into());
            }
        }
        BaselineOp::Matmul { a, b, c } => {
            let (sa, da) = l.get(a, Role::Input)?;
            let (sb, db) = l.get(b, Role::Input)?;
            let (sc, dc) = l.get(c, Role::Output)?;
            same_dtype(&[da, db, dc], floats, "matmul")?;
            let ok = sa.len() == 2
                && sb.len() == 2
                && sc.len() == 2
                && sa[1] == sb[0]
                && sc[0] == sa[0]
                && sc[1] == sb[1];
            if !ok {
                return Err(format!(
                    "matmul needs a [M,K], b [K,N], c [M,N]; got {sa:?}, {sb:?}, {sc:?}"
                ));
            }
            if sa.iter().chain(sb).any(|&d| d > i32::MAX as u64) {
                return Err("matmul dimensions must fit a 32-bit int".into());
            }
        }
        BaselineOp::Conv2d {
            x,
            w,
            b,
            y,
            stride,
            padding,
            maxpool,
            ..
        } => {
            let (sx, dx) = l.get(x, Role::Input)?;
            let (sw, dw) = l.get(w, Role::Input)?;
            let (sy, dy) = l.get(y, Role::Output)?;
            let mut dtypes = vec![dx, dw, dy];
            if let Some(b) = b {
                let (sb, db) = l.get(b, Role::Input)?;
                if sw.len() == 4 && sb != [sw[0]] {
                    return Err(format!("conv2d bias must be [{}], got {sb:?}", sw[0]));
                }
                dtypes.push(db);
            }
            let conv_floats: &[Dtype] = if library == "torch" {
                floats
            } else {
                &[Dtype::F32]
            };
            same_dtype(&dtypes, conv_floats, "conv2d")?;
            if sx.len() != 4 || sw.len() != 4 || sy.len() != 4 || sx[1] != sw[1] {
                return Err(format!(
                    "conv2d needs x [N,C,H,W], w [K,C,R,S], y 4-D; got {sx:?}, {sw:?}, {sy:?}"
                ));
            }
            let (s, p) = (u64::from(*stride), u64::from(*padding));
            let shape = |h: u64, r: u64| -> Option<u64> {
                let o = window_out(h, r, s, p)?;
                match maxpool {
                    Some(pool) => window_out(o, u64::from(pool.kernel), u64::from(pool.stride), 0),
                    None => Some(o),
                }
            };
            let (n, k) = (sx[0], sw[0]);
            let (Some(oh), Some(ow)) = (shape(sx[2], sw[2]), shape(sx[3], sw[3])) else {
                return Err("conv2d: the window does not fit the input".into());
            };
            if sy != [n, k, oh, ow] {
                return Err(format!(
                    "conv2d output must be {:?} for these parameters, got {sy:?}",
                    [n, k, oh, ow]
                ));
            }
            if sx.iter().chain(sw).any(|&d| d > i32::MAX as u64) {
                return Err("conv2d dimensions must fit a 32-bit int".into());
            }
        }
        BaselineOp::Softmax { x, y } => {
            let (sx, dx) = l.get(x, Role::Input)?;
            let (sy, dy) = l.get(y, Role::Output)?;
            same_dtype(&[dx, dy], floats, "softmax")?;
            if sx != sy {
                return Err(format!("softmax: x {sx:?} and y {sy:?} differ"));
            }
        }
        BaselineOp::LayerNorm {
            x,
            w,
            b,
            y,
            dims,
            eps,
        } => {
            let (sx, dx) = l.get(x, Role::Input)?;
            let (sy, dy) = l.get(y, Role::Output)?;
            let mut dtypes = vec![dx, dy];
            let d = *dims as usize;
            if d == 0 || d > sx.len() {
                return Err(format!("layer_norm: dims must be 1..={}", sx.len()));
            }
            if sx != sy {
                return Err(format!("layer_norm: x {sx:?} and y {sy:?} differ"));
            }
            let norm = &sx[sx.len() - d..];
            for t in [w, b].into_iter().flatten() {
                let (st, dt) = l.get(t, Role::Input)?;
                if st != norm {
                    return Err(format!("layer_norm: {t:?} must be {norm:?}, got {st:?}"));
                }
                dtypes.push(dt);
            }
            same_dtype(&dtypes, floats, "layer_norm")?;
            if !(eps.is_finite() && *eps > 0.0) {
                return Err("layer_norm: eps must be positive".into());
            }
        }
        BaselineOp::Sdpa { q, k, v, out, .. } => {
            let (sq, dq) = l.get(q, Role::Input)?;
            let (sk, dk) = l.get(k, Role::Input)?;
            let (sv, dv) = l.get(v, Role::Input)?;
            let (so, d_o) = l.get(out, Role::Output)?;
            same_dtype(&[dq, dk, dv, d_o], floats, "sdpa")?;
            if sq.len() != 4 || sk != sv || sq != so || sk.len() != 4 || sq[3] != sk[3] {
                return Err(format!(
                    "sdpa needs q, k, v, out [B,H,S,D] (k and v alike, out like q); got {sq:?}, {sk:?}, {sv:?}, {so:?}"
                ));
            }
        }
    }
    Ok(())
}

/// How a baseline computes, as a label shown next to its time.
pub mod precision {
    /// kiln's trusted reference (accumulates in f64 where it matters).
    pub const REFERENCE: &str = "reference-f64acc";
    /// Strict fp32 arithmetic (FMA only, no tensor cores).
    pub const FP32: &str = "fp32";
    /// fp32 data through TF32 tensor cores (10-bit mantissa products).
    pub const TF32: &str = "tf32";
    /// fp16 data, fp32 accumulation.
    pub const FP16: &str = "fp16";
    /// bf16 data.
    pub const BF16: &str = "bf16";
}

/// Whether a baseline was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BaselineStatus {
    /// Timed; `timing` is set.
    Measured,
    /// The library (or python3/torch) is not installed or not found; `detail` says which.
    Unavailable,
    /// It ran but failed (an error, or output outside the tolerance for a strict variant).
    Failed,
}

/// One baseline's outcome on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineResult {
    /// Stable name: [`BaselineKind::result_name`] (`reference`, `cublas-fp32`,
    /// `cudnn-tf32`, `torch-eager-fp32`, `torch-compile-fp32`, ...).
    pub name: String,
    /// `kiln`, `cublas`, `cudnn` or `torch`.
    pub library: String,
    /// How it computes (see [`precision`]).
    pub precision: String,
    /// Measured, unavailable or failed.
    pub status: BaselineStatus,
    /// Times under kiln's protocol (L2 flush, events, sync, stop rule), when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<TimingStats>,
    /// Relative L2 error of its output against kiln's reference, when checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rel_l2: Option<f64>,
    /// Output elements outside the problem's tolerance, when checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mismatches: Option<u64>,
    /// The algorithm picked, library versions, or why it is unavailable or failed.
    #[serde(default)]
    pub detail: String,
    /// How its times were taken (records from before hosted baselines: in process).
    #[serde(default)]
    pub harness: Harness,
}

impl BaselineResult {
    /// A baseline that could not run, with the reason.
    pub fn not_measured(
        name: &str,
        library: &str,
        precision: &str,
        status: BaselineStatus,
        detail: impl Into<String>,
    ) -> Self {
        BaselineResult {
            name: name.to_string(),
            library: library.to_string(),
            precision: precision.to_string(),
            status,
            timing: None,
            rel_l2: None,
            mismatches: None,
            detail: detail.into(),
            harness: Harness::InProcess,
        }
    }

    /// The median in microseconds, when measured.
    pub fn median_us(&self) -> Option<f64> {
        match (&self.status, &self.timing) {
            (BaselineStatus::Measured, Some(t)) if t.median_us > 0.0 => Some(t.median_us),
            _ => None,
        }
    }
}

/// Baselines of one problem per library, as written in `problem.toml`.
pub type Baselines = BTreeMap<String, BaselineOp>;

#[cfg(test)]
mod tests {
    use super::*;

    const CONV: &str = r#"
name = "conv"
[[tensor]]
name = "x"
dtype = "f32"
shape = [2, 3, 32, 32]
role = "input"
[[tensor]]
name = "w"
dtype = "f32"
shape = [8, 3, 5, 5]
role = "input"
[[tensor]]
name = "b"
dtype = "f32"
shape = [8]
role = "input"
[[tensor]]
name = "y"
dtype = "f32"
shape = [2, 8, 7, 7]
role = "output"
[tolerance]
atol = 1e-3
rtol = 1e-3
[reference.cuda]
file = "r.cu"
launches = [{ kernel = "k", args = ["x", "w", "b", "y"] }]
[baseline.cudnn]
op = "conv2d"
x = "x"
w = "w"
b = "b"
y = "y"
stride = 2
padding = 1
relu = true
maxpool = { kernel = 3, stride = 2 }
[baseline.torch]
op = "conv2d"
x = "x"
w = "w"
b = "b"
y = "y"
stride = 2
padding = 1
relu = true
maxpool = { kernel = 3, stride = 2 }
"#;

    #[test]
    fn conv_with_pool_parses_and_checks() {
        let spec = ProblemSpec::from_toml(CONV).expect("parses");
        spec.validate().expect("valid");
        // (32 + 2 - 5) / 2 + 1 = 15, then (15 - 3) / 2 + 1 = 7.
        assert!(matches!(
            spec.baseline.get("cudnn"),
            Some(BaselineOp::Conv2d {
                maxpool: Some(Pool {
                    kernel: 3,
                    stride: 2
                }),
                relu: true,
                ..
            })
        ));
    }

    #[test]
    fn wrong_shapes_roles_and_libraries_are_refused_with_the_table_named() {
        for (from, to, needle) in [
            (
                "shape = [2, 8, 7, 7]",
                "shape = [2, 8, 15, 15]",
                "output must be",
            ),
            (
                "[baseline.cudnn]\nop = \"conv2d\"",
                "[baseline.cudnn]\nop = \"softmax\"",
                "unknown field",
            ),
            ("[baseline.cudnn]", "[baseline.cublas]", "cublas has no op"),
            ("[baseline.torch]", "[baseline.mkl]", "unknown library"),
            (
                "y = \"y\"\nstride = 2\npadding = 1\nrelu = true\nmaxpool = { kernel = 3, stride = 2 }\n[baseline.torch]",
                "y = \"x\"\nstride = 2\npadding = 1\nrelu = true\nmaxpool = { kernel = 3, stride = 2 }\n[baseline.torch]",
                "must be an output",
            ),
            ("x = \"x\"\nw", "x = \"nope\"\nw", "no tensor \"nope\""),
        ] {
            let text = CONV.replacen(from, to, 1);
            assert_ne!(text, CONV, "{from}");
            let err = match ProblemSpec::from_toml(&text) {
                Err(e) => e.to_string(),
                Ok(spec) => spec.validate().expect_err(needle).to_string(),
            };
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn arbitrary_code_is_not_an_op() {
        let text = CONV.replacen(
            "[baseline.torch]\nop = \"conv2d\"",
            "[baseline.torch]\nop = \"__import__('os').system('id')\"",
            1,
        );
        assert!(ProblemSpec::from_toml(&text).is_err());
    }

    #[test]
    fn matmul_dims_and_dtypes() {
        let text = r#"
name = "mm"
[[tensor]]
name = "A"
dtype = "f32"
shape = [4, 8]
role = "input"
[[tensor]]
name = "B"
dtype = "f32"
shape = [8, 2]
role = "input"
[[tensor]]
name = "C"
dtype = "f32"
shape = [4, 2]
role = "output"
[tolerance]
atol = 1e-3
rtol = 1e-3
[reference.cuda]
file = "r.cu"
launches = [{ kernel = "k", args = ["A", "B", "C"] }]
[baseline.cublas]
op = "matmul"
a = "A"
b = "B"
c = "C"
"#;
        ProblemSpec::from_toml(text)
            .expect("parses")
            .validate()
            .expect("valid");
        let bad = text.replace("shape = [8, 2]", "shape = [7, 2]");
        let err = ProblemSpec::from_toml(&bad)
            .expect("parses")
            .validate()
            .expect_err("K differs");
        assert!(err.to_string().contains("[baseline.cublas]"), "{err}");
        let bad = text.replace(
            "dtype = \"f32\"\nshape = [4, 2]",
            "dtype = \"f16\"\nshape = [4, 2]",
        );
        assert!(
            ProblemSpec::from_toml(&bad)
                .expect("parses")
                .validate()
                .is_err()
        );
    }

    #[test]
    fn the_registry_names_each_kind_once() {
        let names: Vec<&str> = BaselineKind::ALL.iter().map(|k| k.name()).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        assert_eq!(tables(), vec!["cublas", "cudnn", "torch"]);
        assert_eq!(BaselineKind::Cublas.result_name("tf32"), "cublas-tf32");
        assert_eq!(
            BaselineKind::Reference.result_name("reference-f64acc"),
            "reference"
        );
        assert_eq!(
            serde_json::to_value(BaselineKind::TorchCompile).expect("json"),
            "torch-compile"
        );
        let spec = ProblemSpec::from_toml(CONV).expect("parses");
        assert_eq!(
            BaselineKind::asked_by(&spec),
            vec![
                BaselineKind::Reference,
                BaselineKind::Cudnn,
                BaselineKind::TorchEager,
                BaselineKind::TorchCompile
            ]
        );
    }

    #[test]
    fn result_median_only_when_measured() {
        let r = BaselineResult::not_measured(
            "cublas-fp32",
            "cublas",
            precision::FP32,
            BaselineStatus::Unavailable,
            "libcublas.so not found",
        );
        assert_eq!(r.median_us(), None);
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["status"], "unavailable");
    }
}

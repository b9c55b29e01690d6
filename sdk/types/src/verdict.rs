//! Verdicts of the evaluation contract, the evidence behind each, and timing statistics.
//!
//! Every backend reports through these types, so a `wrong_answer` from the host backend
//! and one from the cuda backend carry the same fields.

use serde::{Deserialize, Serialize};

/// The outcome of evaluating one candidate (design guide §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The compiler refused the source, a flag was not allowed, or the compile timed out.
    CompileError,
    /// The launch plan cannot run: unknown kernel or buffer, bad argument types, limits.
    InvalidLaunch,
    /// The candidate crashed, was killed by the jail (forbidden syscall, resource limit) or faulted.
    RuntimeFault,
    /// A run took longer than its wall-clock limit.
    Timeout,
    /// Outputs differ from the reference beyond the tolerance.
    WrongAnswer,
    /// Some output elements were left unwritten (still poisoned).
    IncompleteOutput,
    /// The candidate changed its inputs.
    InputTampered,
    /// Two runs on the same inputs disagreed beyond the tolerance.
    Nondeterministic,
    /// The measured time is below the roofline floor: the work cannot have been done.
    ImplausibleTime,
    /// Correct, timed, and plausible.
    Ok,
}

impl Verdict {
    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::CompileError => "compile_error",
            Verdict::InvalidLaunch => "invalid_launch",
            Verdict::RuntimeFault => "runtime_fault",
            Verdict::Timeout => "timeout",
            Verdict::WrongAnswer => "wrong_answer",
            Verdict::IncompleteOutput => "incomplete_output",
            Verdict::InputTampered => "input_tampered",
            Verdict::Nondeterministic => "nondeterministic",
            Verdict::ImplausibleTime => "implausible_time",
            Verdict::Ok => "ok",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The precision a correct candidate really delivers, judged from its error against a
/// high-precision reference on the same inputs. Ordered from most to least precise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrecisionTier {
    /// Error of the order of fp32 rounding.
    Fp32Faithful,
    /// Error of a 10-bit mantissa with fp32 range (TF32 tensor cores).
    Tf32Like,
    /// Error of a 10-bit mantissa with fp16's range.
    Fp16Like,
    /// Error of an 7-bit mantissa (bfloat16).
    Bf16Like,
    /// Coarser than bfloat16.
    Coarse,
}

/// One mismatching element.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    /// Flat index into the tensor.
    pub index: u64,
    /// The candidate's value (NaN and infinities travel as the strings `"NaN"`, `"inf"`,
    /// `"-inf"`, since JSON numbers cannot hold them).
    #[serde(with = "nonfinite")]
    pub got: f64,
    /// The reference's value (same encoding as `got`).
    #[serde(with = "nonfinite")]
    pub want: f64,
}

/// Serde for an `f64` that may be NaN or infinite: finite values as JSON numbers, the
/// others as `"NaN"`, `"inf"` and `"-inf"` (serde_json would write `null` and then fail to
/// read it back).
pub mod nonfinite {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes a finite value as a number, the others as strings.
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_nan() {
            s.serialize_str("NaN")
        } else if v.is_infinite() {
            s.serialize_str(if *v > 0.0 { "inf" } else { "-inf" })
        } else {
            s.serialize_f64(*v)
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NumOrStr {
        Num(f64),
        Str(String),
    }

    /// Reads a number, or one of the strings written by [`serialize`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::Num(v) => Ok(v),
            NumOrStr::Str(s) => match s.as_str() {
                "NaN" | "nan" => Ok(f64::NAN),
                "inf" | "+inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!("not a number: {other:?}"))),
            },
        }
    }
}

/// Error of one output tensor against the reference.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorMetrics {
    /// The output tensor.
    pub tensor: String,
    /// Largest absolute error.
    pub max_abs: f64,
    /// Largest relative error (|got - want| / |want|, over elements with want != 0).
    pub max_rel: f64,
    /// Relative L2 error: ||got - want|| / ||want||.
    pub rel_l2: f64,
    /// Elements outside the tolerance.
    pub mismatches: u64,
    /// The first few mismatching elements.
    pub first_mismatches: Vec<Mismatch>,
    /// Elements where NaN or Inf appears in one and not the other.
    pub nonfinite_mismatches: u64,
}

/// Resources of one compiled kernel (cuda backend; empty on the host backend).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelResources {
    /// Kernel name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub static_shared_bytes: u32,
    /// Local memory per thread, bytes (spills land here).
    pub local_bytes: u32,
    /// Largest block the kernel can be launched with.
    pub max_threads_per_block: u32,
    /// Theoretical occupancy (resident warps / the SM's maximum, 0 to 1) for the block size
    /// and dynamic shared memory of the kernel's launch in the plan; absent where not computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupancy: Option<f64>,
}

/// What the compile step produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompileInfo {
    /// Wall time of the compile, milliseconds.
    pub duration_ms: f64,
    /// Compiler output (truncated).
    pub log: String,
    /// True if the artifact came from the compile cache.
    pub cached: bool,
    /// Per-kernel resources, where the backend reports them.
    #[serde(default)]
    pub kernels: Vec<KernelResources>,
}

/// The evidence behind a verdict.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// Fault or signal that ended a run (`SIGSEGV`, `forbidden syscall socket`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// Error metrics of the worst output in the deciding trial.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ErrorMetrics>,
    /// Correctness trials run and passed.
    pub trials_passed: u32,
    /// Correctness trials run.
    pub trials_run: u32,
    /// Name of the trial that decided the verdict (`trial 2 (shifted)`, `recheck after sample 17`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deciding_trial: Option<String>,
    /// Inputs whose contents changed during a run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tampered_inputs: Vec<String>,
    /// Output elements left unwritten: (tensor, count, first flat indices).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unwritten: Vec<(String, u64, Vec<u64>)>,
    /// Elements that differed bitwise between two runs on the same inputs.
    pub bitwise_diffs: u64,
    /// Excerpt of what the candidate printed (stdout/stderr), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_excerpt: Option<String>,
    /// Other observations worth a reader's attention.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Timing statistics of the timed samples, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimingStats {
    /// Median sample.
    pub median_us: f64,
    /// Mean sample.
    pub mean_us: f64,
    /// Sample standard deviation.
    pub stdev_us: f64,
    /// Fastest sample.
    pub min_us: f64,
    /// Slowest sample.
    pub max_us: f64,
    /// Number of samples.
    pub n: u32,
    /// Relative standard error of the mean (stdev / sqrt(n) / mean).
    pub rse: f64,
    /// Why sampling stopped: `converged`, `wall_cap` or `raced_out`.
    pub stop_reason: String,
    /// Wall time spent timing, milliseconds.
    pub wall_ms: f64,
    /// Fresh input sets drawn while timing.
    pub fresh_inputs: u32,
    /// Timed runs whose outputs were re-checked against the reference.
    pub rechecks: u32,
    /// Fixed per-sample overhead of the timer (measured with an empty run), already subtracted.
    pub overhead_us: f64,
}

/// A finished evaluation, as stored and returned by the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// The verdict.
    pub verdict: Verdict,
    /// One line saying why, for people.
    pub message: String,
    /// Backend that ran it (`host`, `cuda`).
    pub backend: String,
    /// Compile step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<CompileInfo>,
    /// Evidence behind the verdict.
    #[serde(default)]
    pub evidence: Evidence,
    /// Timing statistics (correct candidates only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<TimingStats>,
    /// Precision tier (correct candidates only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<PrecisionTier>,
    /// Backend-specific telemetry (GPU clocks, throttle reasons, power...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<serde_json::Value>,
}

impl Evaluation {
    /// An evaluation that ended before any run, with only a verdict and a message.
    pub fn early(verdict: Verdict, backend: &str, message: impl Into<String>) -> Self {
        Evaluation {
            verdict,
            message: message.into(),
            backend: backend.to_string(),
            compile: None,
            evidence: Evidence::default(),
            timing: None,
            tier: None,
            telemetry: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonfinite_mismatch_values_round_trip() {
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.5] {
            let m = Mismatch {
                index: 3,
                got: v,
                want: 0.0,
            };
            let json = serde_json::to_string(&m).expect("serializes");
            let back: Mismatch = serde_json::from_str(&json).expect("reads back");
            assert!(back.got == v || (v.is_nan() && back.got.is_nan()), "{json}");
        }
    }
}

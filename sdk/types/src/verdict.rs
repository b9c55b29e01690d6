//! Verdicts of the evaluation contract, the evidence behind each, and timing statistics.
//!
//! Every backend reports through these types, so a `wrong_answer` from the host backend
//! and one from the cuda backend carry the same fields.

use serde::{Deserialize, Serialize};

/// The outcome of evaluating one candidate (the contract: `kiln_sandbox::engine::contract`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The compiler refused the source, a flag was not allowed, or the compile timed out.
    CompileError,
    /// The launch list cannot run: unknown kernel or buffer, bad argument types, limits.
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
    /// Correct, but its time is at or below what the timer can resolve (its resolution or
    /// the overhead it subtracts) even with repeated runs per sample: no time is reported,
    /// and it never ranks.
    UnmeasurableTime,
    /// Correct and timed, but a hosted `ModelNew` whose forward launched no GPU kernel of
    /// its own (only library ones: cuBLAS, cuDNN, ATen...): the reference renamed. Its time
    /// is shown; it never ranks.
    NoOwnKernels,
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
            Verdict::UnmeasurableTime => "unmeasurable_time",
            Verdict::NoOwnKernels => "no_own_kernels",
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
    /// Wall time of the correctness stage (trials and the range trial), milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correctness_ms: Option<f64>,
}

/// Timing statistics of the timed samples, in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Why sampling stopped: `converged`, `max_samples`, `wall_cap`, `raced_out`, or `plain`
    /// (a plain timing's fixed number of samples).
    pub stop_reason: String,
    /// Wall time spent timing, milliseconds.
    pub wall_ms: f64,
    /// Fresh input sets drawn while timing: one per run of every timed sample, none of
    /// them seen by the candidate before.
    pub fresh_inputs: u32,
    /// Runs of the launch list per timed sample, each on its own fresh input set, between
    /// one start and one stop of the timer (more than 1 only for kernels too short to time
    /// one run at a time, on backends that can); the figures above are per run.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub reps: u32,
    /// Timed runs whose outputs were re-checked against the reference.
    pub rechecks: u32,
    /// Fixed per-sample overhead of the timer (measured with an empty run), already subtracted.
    pub overhead_us: f64,
    /// Where the timer has an overhead (a hosted file's round trip; the host runner's):
    /// the median per run before it was subtracted (`median_us + overhead_us / reps`), µs,
    /// beside the net `median_us`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_median_us: Option<f64>,
    /// Lower end of the 95 % confidence interval of the mean, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_low_us: Option<f64>,
    /// Upper end of the 95 % confidence interval of the mean, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_high_us: Option<f64>,
    /// Wall time before the samples (timer overhead, discarded launch, warm-up), ms.
    #[serde(default)]
    pub warmup_ms: f64,
    /// Timing stopped early because the candidate is clearly slower than the incumbent it
    /// raced (`stop_reason` is `raced_out`); the interval is the one it reached. Still `ok`,
    /// never ranked as a best.
    #[serde(default, skip_serializing_if = "is_false")]
    pub raced_out: bool,
    /// Plain timing (events around one launch, a fixed number of samples, no L2 flush, no
    /// blocking kernel): for comparison only, never ranked as a best.
    #[serde(default, skip_serializing_if = "is_false")]
    pub plain: bool,
    /// Samples dropped because they ran throttled (throttle policy `discard`/`retry`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub throttled_discarded: u32,
    /// The timing was taken a second time because too many samples ran throttled.
    #[serde(default, skip_serializing_if = "is_false")]
    pub throttle_retried: bool,
    /// GPU only: which figure of each sample the statistics above are of, how the samples
    /// were measured (CUPTI kernel records or events only, and why), and the other figures
    /// of the same samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer: Option<TimerEvidence>,
    /// The samples the statistics were computed from, µs, in the order taken, rounded to
    /// the nanosecond; at most [`MAX_KEPT_SAMPLES`] of them (evenly spaced through the run
    /// when there were more). Empty in records written before samples were kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples_us: Vec<f64>,
}

/// How a GPU timing's samples were measured, and every figure of them.
///
/// Each sample has its event time (start to end event) and, when CUPTI's kernel records
/// were read, the sum of the work's kernel durations and their span (first start to last
/// end). `figure` is the one [`TimingStats`] is of; the summaries cover the same samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimerEvidence {
    /// The figure the statistics are of.
    pub figure: crate::TimingFigure,
    /// The figure asked for (the problem's, else the daemon's); differs from `figure` when
    /// kernel records could not be read.
    pub asked: crate::TimingFigure,
    /// `cupti` when kernel records were read, `events` otherwise.
    pub source: String,
    /// Why no kernel records were read (library missing, a profiler attached, turned off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// The libcupti in use, and CUPTI's API version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
    /// Launches of the work in each sample.
    pub launches: u32,
    /// Event times.
    pub events: FigureSummary,
    /// Sums of the kernels' durations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_sum: Option<FigureSummary>,
    /// First kernel start to last kernel end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_span: Option<FigureSummary>,
    /// Samples whose kernel records could not be attributed: counted with their event
    /// time (never shorter than their kernel time), and the first reason.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub records_missing: u32,
    /// Why the first such sample had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_missing_reason: Option<String>,
}

/// A few numbers about one figure over a timing's samples, µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct FigureSummary {
    /// Samples.
    pub n: u32,
    /// Median.
    pub median_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// Fastest.
    pub min_us: f64,
    /// Coefficient of variation (sample stdev / mean).
    pub cv: f64,
}

impl Default for TimingStats {
    fn default() -> Self {
        TimingStats {
            median_us: 0.0,
            mean_us: 0.0,
            stdev_us: 0.0,
            min_us: 0.0,
            max_us: 0.0,
            n: 0,
            rse: 0.0,
            stop_reason: String::new(),
            wall_ms: 0.0,
            fresh_inputs: 0,
            reps: 1,
            rechecks: 0,
            overhead_us: 0.0,
            raw_median_us: None,
            ci_low_us: None,
            ci_high_us: None,
            warmup_ms: 0.0,
            raced_out: false,
            plain: false,
            throttled_discarded: 0,
            throttle_retried: false,
            timer: None,
            samples_us: Vec::new(),
        }
    }
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Most timing samples kept with an evaluation ([`TimingStats::samples_us`]).
pub const MAX_KEPT_SAMPLES: usize = 1000;

/// The samples to keep with an evaluation: all of them when there are at most
/// [`MAX_KEPT_SAMPLES`], else that many evenly spaced through the run (the first and the
/// last included); each rounded to the nanosecond.
pub fn kept_samples(samples: &[f64]) -> Vec<f64> {
    let round = |v: f64| (v * 1e3).round() / 1e3;
    let n = samples.len();
    if n <= MAX_KEPT_SAMPLES {
        return samples.iter().copied().map(round).collect();
    }
    (0..MAX_KEPT_SAMPLES)
        .map(|i| round(samples[i * (n - 1) / (MAX_KEPT_SAMPLES - 1)]))
        .collect()
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl TimingStats {
    /// The 95 % confidence interval of the mean, µs: the stored one, or one computed from
    /// the mean, the relative standard error and `n` (records written before it was stored).
    pub fn interval95(&self) -> (f64, f64) {
        if let (Some(lo), Some(hi)) = (self.ci_low_us, self.ci_high_us) {
            return (lo, hi);
        }
        let half = t95(self.n.saturating_sub(1)) * self.rse * self.mean_us;
        (self.mean_us - half, self.mean_us + half)
    }
}

/// The two-sided 95 % quantile of Student's t distribution with `df` degrees of freedom
/// (tabulated to 30, then the normal's 1.96); infinite for `df` = 0.
pub fn t95(df: u32) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        d if d <= 30 => TABLE[d as usize - 1],
        d if d <= 60 => 2.000 + (2.042 - 2.000) * f64::from(60 - d) / 30.0,
        d if d <= 120 => 1.980 + (2.000 - 1.980) * f64::from(120 - d) / 60.0,
        _ => 1.96,
    }
}

/// A finished evaluation, as stored and returned by the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "stored::Evaluation")]
pub struct Evaluation {
    /// The verdict.
    pub verdict: Verdict,
    /// One line saying why, for people.
    pub message: String,
    /// Backend that ran it (`host`, `cuda`).
    pub backend: String,
    /// How it was run: `contract` (kiln launched its device code), `hosted` (its own
    /// Python ran in a jailed runner) or `lifted` (a hosted file's forward, recorded and
    /// turned into a contract candidate: kilnd sets it on that candidate's evaluation).
    /// Older records without it were all `contract`.
    #[serde(default)]
    pub trust: crate::TrustMode,
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
    /// What lifting a hosted file came to (only on a hosted file's evaluation whose plan
    /// recorded its forwards): the contract candidate kilnd queues, or why there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lift: Option<crate::lift::LiftOutcome>,
    /// Backend-specific telemetry (GPU clocks, throttle reasons, power...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<serde_json::Value>,
}

/// The stored form of an [`Evaluation`], as every version of kiln wrote it: records from
/// before `lift` was a field of its own carried it in `telemetry.lift`, where it is read
/// from (and removed) when the field is absent.
mod stored {
    use serde::Deserialize;

    use super::{CompileInfo, Evidence, PrecisionTier, TimingStats, Verdict};

    #[derive(Deserialize)]
    pub struct Evaluation {
        verdict: Verdict,
        message: String,
        backend: String,
        #[serde(default)]
        trust: crate::TrustMode,
        #[serde(default)]
        compile: Option<CompileInfo>,
        #[serde(default)]
        evidence: Evidence,
        #[serde(default)]
        timing: Option<TimingStats>,
        #[serde(default)]
        tier: Option<PrecisionTier>,
        #[serde(default)]
        lift: Option<crate::lift::LiftOutcome>,
        #[serde(default)]
        telemetry: Option<serde_json::Value>,
    }

    impl TryFrom<Evaluation> for super::Evaluation {
        type Error = String;

        fn try_from(e: Evaluation) -> Result<Self, String> {
            let mut telemetry = e.telemetry;
            let mut lift = e.lift;
            let old = telemetry
                .as_mut()
                .and_then(serde_json::Value::as_object_mut)
                .and_then(|t| t.remove(crate::lift::OLD_TELEMETRY_KEY));
            if let (None, Some(old)) = (&lift, old) {
                lift = Some(
                    serde_json::from_value(old)
                        .map_err(|err| format!("telemetry.lift of an older record: {err}"))?,
                );
            }
            Ok(super::Evaluation {
                verdict: e.verdict,
                message: e.message,
                backend: e.backend,
                trust: e.trust,
                compile: e.compile,
                evidence: e.evidence,
                timing: e.timing,
                tier: e.tier,
                lift,
                telemetry,
            })
        }
    }
}

impl Evaluation {
    /// An evaluation that ended before any run, with only a verdict and a message.
    pub fn early(
        verdict: Verdict,
        backend: crate::BackendKind,
        message: impl Into<String>,
    ) -> Self {
        Evaluation {
            verdict,
            message: message.into(),
            backend: backend.as_str().to_string(),
            trust: crate::TrustMode::Contract,
            compile: None,
            evidence: Evidence::default(),
            timing: None,
            tier: None,
            lift: None,
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

    #[test]
    fn interval_from_stored_or_derived() {
        let mut t = TimingStats {
            mean_us: 100.0,
            rse: 0.01,
            n: 1000,
            ..TimingStats::default()
        };
        let (lo, hi) = t.interval95();
        assert!(
            (lo - 98.04).abs() < 1e-9 && (hi - 101.96).abs() < 1e-9,
            "{lo} {hi}"
        );
        t.ci_low_us = Some(90.0);
        t.ci_high_us = Some(110.0);
        assert_eq!(t.interval95(), (90.0, 110.0));
        assert!(t95(0).is_infinite());
        assert!(t95(2) > t95(10) && t95(10) > t95(100) && t95(100) > 1.96 - 1e-12);
        // Old records (no new fields) still read.
        let old = r#"{"median_us":1,"mean_us":1,"stdev_us":0,"min_us":1,"max_us":1,"n":3,
            "rse":0,"stop_reason":"converged","wall_ms":1,"fresh_inputs":0,"rechecks":1,"overhead_us":0}"#;
        let t: TimingStats = serde_json::from_str(old).expect("old record");
        assert!(!t.raced_out && !t.plain);
        assert!(t.timer.is_none() && t.samples_us.is_empty());
        assert_eq!(t.reps, 1, "a record without reps ran one run per sample");
    }

    #[test]
    fn kept_samples_are_all_or_evenly_spaced() {
        let few = [1.23456, 2.0, 3.0004];
        assert_eq!(kept_samples(&few), [1.235, 2.0, 3.0]);
        let many: Vec<f64> = (0..2500).map(f64::from).collect();
        let kept = kept_samples(&many);
        assert_eq!(kept.len(), MAX_KEPT_SAMPLES);
        assert_eq!((kept[0], kept[kept.len() - 1]), (0.0, 2499.0));
        assert!(kept.windows(2).all(|w| w[1] > w[0]), "in order, no repeats");
    }
}

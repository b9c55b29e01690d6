//! Problems: fixed shapes, tensors with their input distributions, tolerances, roofline
//! figures, and the trusted reference and seed kernels per backend.
//!
//! A problem lives in a folder with a `problem.toml`; [`ProblemSpec::load_dir`] reads it
//! and inlines the source files it names, so the spec travels as one value.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

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
}

fn one() -> f64 {
    1.0
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
/// `|got - want| <= atol + rtol * |want|`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
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
    /// Trusted reference per backend (`host`, `cuda`).
    pub reference: BTreeMap<String, KernelSource>,
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

impl ProblemSpec {
    /// Parses `problem.toml` text (sources not inlined).
    pub fn from_toml(text: &str) -> Result<Self, ProblemError> {
        toml::from_str(text).map_err(|e| ProblemError::Parse(e.to_string()))
    }

    /// Reads `DIR/problem.toml`, inlines the reference and seed sources it names (files
    /// inside `DIR` only), and validates the result.
    pub fn load_dir(dir: &Path) -> Result<Self, ProblemError> {
        let toml_path = dir.join("problem.toml");
        let text = std::fs::read_to_string(&toml_path).map_err(|source| ProblemError::Read {
            path: toml_path.display().to_string(),
            source,
        })?;
        let mut spec = Self::from_toml(&text)?;
        let name = spec.name.clone();
        for ks in spec.reference.values_mut().chain(spec.seed.values_mut()) {
            if ks.file.contains('/') || ks.file.starts_with('.') || ks.file.is_empty() {
                return Err(ProblemError::Invalid {
                    name,
                    message: format!(
                        "source file {:?} must be a plain file name in the problem folder",
                        ks.file
                    ),
                });
            }
            let path = dir.join(&ks.file);
            let meta = std::fs::metadata(&path).map_err(|source| ProblemError::Read {
                path: path.display().to_string(),
                source,
            })?;
            if meta.len() > MAX_PROBLEM_SOURCE {
                return Err(ProblemError::Invalid {
                    name,
                    message: format!("{} is larger than {MAX_PROBLEM_SOURCE} bytes", ks.file),
                });
            }
            ks.source = std::fs::read_to_string(&path).map_err(|source| ProblemError::Read {
                path: path.display().to_string(),
                source,
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
        }
        if !(self.tolerance.atol >= 0.0 && self.tolerance.rtol >= 0.0) {
            return Err(bad("tolerance must be non-negative".into()));
        }
        if self.reference.is_empty() {
            return Err(bad("no reference kernel".into()));
        }
        for backend in self.reference.keys() {
            if !matches!(backend.as_str(), "host" | "cuda") {
                return Err(bad(format!(
                    "unknown reference backend {backend:?} (host or cuda)"
                )));
            }
        }
        for backend in self.seed.keys() {
            if !matches!(backend.as_str(), "host" | "cuda" | "triton") {
                return Err(bad(format!(
                    "unknown seed backend {backend:?} (host, cuda, or triton)"
                )));
            }
        }
        for ks in self.reference.values().chain(self.seed.values()) {
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

    /// Backends this problem can be evaluated on (those with a reference).
    pub fn backends(&self) -> Vec<String> {
        self.reference.keys().cloned().collect()
    }

    /// The seed kernel for a backend (`host`, `cuda`) or for the `triton` language as a
    /// submittable candidate.
    pub fn seed_candidate(&self, backend: &str) -> Option<crate::Candidate> {
        let mut c = self.kernel_candidate(self.seed.get(backend)?, backend);
        c.note = Some("seed kernel".into());
        Some(c)
    }

    /// The reference kernel for `backend` as a candidate (to compile or profile it like
    /// one), if the problem has one.
    pub fn reference_candidate(&self, backend: &str) -> Option<crate::Candidate> {
        Some(self.kernel_candidate(self.reference.get(backend)?, backend))
    }

    fn kernel_candidate(&self, ks: &KernelSource, backend: &str) -> crate::Candidate {
        crate::Candidate {
            problem: self.name.clone(),
            language: match backend {
                "triton" => crate::Language::Triton,
                other => crate::Language::of_reference(other),
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
        assert_eq!(spec.backends(), vec!["host".to_string()]);
    }

    #[test]
    fn unknown_buffer_is_refused() {
        let text = TOML.replace(r#"args = ["a", "y""#, r#"args = ["a", "zz""#);
        let spec = ProblemSpec::from_toml(&text).expect("parses");
        let err = spec.validate().expect_err("unknown buffer");
        assert!(err.to_string().contains("zz"), "{err}");
    }

    #[test]
    fn load_dir_inlines_sources_and_refuses_escapes() {
        let dir = std::env::temp_dir().join(format!("kiln-types-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("problem.toml"), TOML).expect("write");
        std::fs::write(dir.join("reference.c"), "void ref_add(void){}").expect("write");
        let spec = ProblemSpec::load_dir(&dir).expect("loads");
        assert!(spec.reference["host"].source.contains("ref_add"));
        std::fs::write(
            dir.join("problem.toml"),
            TOML.replace("reference.c", "../etc/passwd"),
        )
        .expect("write");
        assert!(ProblemSpec::load_dir(&dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! KernelBench-format Python files as ordinary kiln problem folders (what
//! `kiln problems import kernelbench` writes).
//!
//! kiln's torch runner (`kiln_torch.py describe`, run by
//! `kiln_torch_runner::process::describe`) runs a file's `get_inputs()`,
//! `get_init_inputs()` and module on torch's meta device and answers a [`Description`]: the
//! tensors (forward arguments, then parameters and buffers, then outputs, the order a launch
//! plan names them), their dtypes and the distributions they are drawn from, the flops
//! (torch's flop counter), or why the file cannot be taken. This module turns a description
//! into `problem.toml` + `reference.py` ([`write`]): the torch reference, a tolerance
//! (KernelBench's fp32 one unless the importer is given another; with a warning when it
//! would accept an all-zero output), the roofline figures and `[baseline.torch] op = "module"`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use crate::{ProblemSpec, Tolerance};

/// Why a description could not be written as a problem.
#[derive(Debug, Error)]
pub enum ImportError {
    /// The description is not one the writer can use.
    #[error("{0}")]
    Description(String),
    /// A file could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The problem written does not load back.
    #[error("the problem written to {path}: {source}")]
    Invalid {
        /// The folder.
        path: String,
        /// Why it does not load.
        source: crate::ProblemError,
    },
}

type Result<T> = std::result::Result<T, ImportError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ImportError + '_ {
    move |source| ImportError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// KernelBench's fp32 tolerance (`get_tolerance_for_precision`: atol = rtol = 1e-4).
pub const KERNELBENCH_FP32_TOL: f64 = 1e-4;

/// The tolerance an import writes unless told otherwise: KernelBench's fp32 one.
pub const KERNELBENCH_TOLERANCE: Tolerance = Tolerance {
    atol: KERNELBENCH_FP32_TOL,
    rtol: KERNELBENCH_FP32_TOL,
};

/// What `kiln_torch.py describe` says of one file.
#[derive(Debug, Deserialize)]
pub struct Description {
    /// The file.
    pub file: String,
    /// Why it cannot be taken, if so.
    #[serde(default)]
    pub refused: Option<String>,
    #[serde(default)]
    tensors: Vec<DescribedTensor>,
    #[serde(default)]
    forward: Vec<String>,
    /// forward's arguments that are Python numbers (not tensors).
    #[serde(default)]
    constants: BTreeMap<String, crate::problem::ForwardConstant>,
    #[serde(default)]
    state: BTreeMap<String, String>,
    #[serde(default)]
    outputs: Vec<String>,
    #[serde(default)]
    bool_tensors: Vec<String>,
    #[serde(default)]
    init_inputs: String,
    #[serde(default)]
    flops: u64,
    #[serde(default)]
    min_bytes: u64,
    #[serde(default)]
    summary: String,
    #[serde(default)]
    output_max_abs: Option<f64>,
    #[serde(default)]
    zero_passes: Option<f64>,
    #[serde(default)]
    output_note: String,
    /// Buffers made from no draw (a causal mask): the module keeps its own.
    #[serde(default)]
    kept_buffers: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct DescribedTensor {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    role: String,
    #[serde(default)]
    init: Option<serde_json::Value>,
    #[serde(default)]
    shifted_trial: bool,
    #[serde(default)]
    parameter: Option<String>,
    #[serde(default)]
    source: Option<String>,
    /// Why kiln cannot draw it (an input from get_inputs()).
    #[serde(default)]
    why: Option<String>,
}

/// One imported problem: where it was written and what to tell the user.
#[derive(Debug)]
pub struct Imported {
    /// Problem name.
    pub name: String,
    /// Its folder.
    pub dir: PathBuf,
    /// Warnings (a tolerance that accepts zeros, notes on parameters).
    pub warnings: Vec<String>,
}

/// The kiln name of a KernelBench file: `kb-l1-23-softmax` for `level1/23_Softmax.py`.
pub fn problem_name(file: &Path) -> String {
    let stem = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("problem");
    let level = file
        .parent()
        .and_then(|d| d.file_name())
        .and_then(|d| d.to_str())
        .and_then(|d| d.strip_prefix("level"))
        .filter(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_digit()));
    let mut slug = String::new();
    for c in stem.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            slug.push(c);
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug = slug.trim_matches('-');
    let name = match level {
        Some(l) => format!("kb-l{l}-{slug}"),
        None => format!("kb-{slug}"),
    };
    name.chars()
        .take(120)
        .collect::<String>()
        .trim_end_matches('-')
        .to_string()
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn toml_init(init: &serde_json::Value) -> Result<String> {
    let bad = || ImportError::Description(format!("an input distribution is not a table: {init}"));
    let Ok(toml::Value::Table(t)) = serde_json::from_value::<toml::Value>(init.clone()) else {
        return Err(bad());
    };
    let parts: Vec<String> = t.iter().map(|(k, v)| format!("{k} = {v}")).collect();
    Ok(format!("{{ {} }}", parts.join(", ")))
}

/// Refuses a tolerance an import cannot judge by: atol finite and >= 0, 0 <= rtol < 1
/// (below 1, so that the all-zero check has a bound).
pub fn check_tolerance(tol: Tolerance) -> Result<()> {
    if tol.atol >= 0.0 && tol.atol.is_finite() && (0.0..1.0).contains(&tol.rtol) {
        return Ok(());
    }
    Err(ImportError::Description(format!(
        "the tolerance atol = {}, rtol = {} is not one to judge by (atol >= 0 and finite, \
         0 <= rtol < 1)",
        tol.atol, tol.rtol
    )))
}

/// `problem.toml` for a description (the reference file is `reference.py`) under the
/// tolerance `tol`, and the warnings to show.
pub fn problem_toml(name: &str, d: &Description, tol: Tolerance) -> Result<(String, Vec<String>)> {
    check_tolerance(tol)?;
    let mut warnings = Vec::new();
    let mut t = String::new();
    let file = Path::new(&d.file)
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or("");
    t.push_str(&format!(
        "# Imported from {file} (KernelBench format) by `kiln problems import kernelbench`.\n\
         # Tensors are in launch order: forward's arguments, the module's parameters and\n\
         # buffers (drawn per trial like any input; PyTorch's default initialiser gives the\n\
         # distribution, a constant initialiser is drawn as U(c - 0.5, c + 0.5)), the outputs.\n"
    ));
    t.push_str(&format!("name = {}\n", toml_str(name)));
    let summary = if d.summary.is_empty() {
        format!("KernelBench {file}")
    } else {
        format!("{} ({file})", d.summary.trim_end_matches('.'))
    };
    t.push_str(&format!("summary = {}\n", toml_str(&summary)));
    for x in &d.tensors {
        t.push_str("\n[[tensor]]\n");
        if let Some(p) = &x.parameter {
            t.push_str(&format!("# the module's {p}\n"));
        }
        t.push_str(&format!("name = {}\n", toml_str(&x.name)));
        t.push_str(&format!("dtype = {}\n", toml_str(&x.dtype)));
        t.push_str(&format!(
            "shape = [{}]\n",
            x.shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
        t.push_str(&format!("role = {}\n", toml_str(&x.role)));
        if x.role == "input" {
            let init = x.init.as_ref().ok_or_else(|| {
                ImportError::Description(format!("input {} has no distribution", x.name))
            })?;
            t.push_str(&format!("init = {}\n", toml_init(init)?));
            // The shifted trial is for data; parameters keep their own scale.
            let shifted = x.shifted_trial && x.parameter.is_none();
            if !shifted {
                t.push_str("shifted_trial = false\n");
            }
            if x.source.as_deref() == Some("const") {
                warnings.push(format!(
                    "{}: PyTorch initialises it to a constant; kiln draws it around that value",
                    x.name
                ));
            }
            if x.source.as_deref() == Some("get_inputs") {
                t.push_str(
                    "# from the file's own get_inputs(), made on the GPU by kiln's torch runner\n\
                     # under a fresh secret seed per input set (never shifted): cuda backend only\n",
                );
                warnings.push(format!(
                    "{}: kiln cannot draw it ({}); it comes from the file's get_inputs() on the \
                     GPU, fresh per input set, never shifted (cuda backend only)",
                    x.name,
                    x.why.as_deref().unwrap_or("an expression of drawn tensors")
                ));
            }
        }
    }
    for b in &d.kept_buffers {
        warnings.push(format!(
            "buffer {b} is made from no draw (a constant of the module, such as a causal \
             mask): the module keeps its own, and it is not one of the problem's tensors"
        ));
    }
    if tol == KERNELBENCH_TOLERANCE {
        t.push_str(
            "\n# KernelBench's fp32 tolerance (atol = rtol = 1e-4); kiln's own relative L2 check\n\
             # (the precision tier) is reported beside the verdict.\n",
        );
    } else {
        t.push_str(
            "\n# The tolerance given to the import (KernelBench's fp32 one is atol = rtol = 1e-4);\n\
             # kiln's own relative L2 check (the precision tier) is reported beside the verdict.\n",
        );
    }
    // A zero output passes an element w when |w| <= atol / (1 - rtol).
    let zero_bound = tol.atol / (1.0 - tol.rtol);
    match d.output_max_abs {
        Some(m) if m <= zero_bound => {
            let w = format!(
                "the tolerance accepts an all-zero output: every output is at most {m:.3e} in \
                 magnitude ({}); tighten atol before trusting verdicts",
                d.output_note
            );
            t.push_str(&format!("# WARNING: {w}\n"));
            warnings.push(w);
        }
        Some(m) => {
            t.push_str(&format!(
                "# Largest output magnitude {m:.3e} ({}): an all-zero output fails.\n",
                d.output_note
            ));
            if let Some(f) = d.zero_passes.filter(|f| *f > 0.5) {
                let w = format!(
                    "a zero passes the tolerance for {:.0} % of the outputs (those at most \
                     {zero_bound:.1e} in magnitude): consider a smaller atol",
                    f * 100.0
                );
                t.push_str(&format!("# WARNING: {w}\n"));
                warnings.push(w);
            }
        }
        None => t.push_str(&format!(
            "# Not checked whether it accepts an all-zero output: {}.\n",
            d.output_note
        )),
    }
    t.push_str(&format!(
        "[tolerance]\natol = {:e}\nrtol = {:e}\n",
        tol.atol, tol.rtol
    ));
    t.push_str(&format!(
        "\n# Bytes of every tensor once; flops from torch's flop counter (matmul, conv, attention).\n\
         [roofline]\nmin_bytes = {}\nflops = {}\n",
        d.min_bytes, d.flops
    ));
    let list = |v: &[String]| v.iter().map(|s| toml_str(s)).collect::<Vec<_>>().join(", ");
    t.push_str("\n[reference.torch]\nfile = \"reference.py\"\n");
    t.push_str(&format!("init_inputs = {}\n", toml_str(&d.init_inputs)));
    t.push_str(&format!("forward = [{}]\n", list(&d.forward)));
    if !d.constants.is_empty() {
        let items: Vec<String> = d
            .constants
            .iter()
            .map(|(k, v)| format!("{} = {}", toml_str(k), toml_constant(v)))
            .collect();
        t.push_str(&format!(
            "# forward's arguments that get_inputs() gives as Python values, passed as they are.\n\
             constants = {{ {} }}\n",
            items.join(", ")
        ));
    }
    t.push_str(&format!("outputs = [{}]\n", list(&d.outputs)));
    if !d.bool_tensors.is_empty() {
        t.push_str(&format!("bool_tensors = [{}]\n", list(&d.bool_tensors)));
    }
    if !d.state.is_empty() {
        t.push_str("[reference.torch.state]\n");
        for (k, v) in &d.state {
            t.push_str(&format!("{} = {}\n", toml_str(k), toml_str(v)));
        }
    }
    t.push_str(
        "\n# torch eager and torch.compile of the module itself.\n[baseline.torch]\nop = \"module\"\n",
    );
    Ok((t, warnings))
}

/// Writes the problem folder for `d` under `out`, judged by `tol`
/// ([`KERNELBENCH_TOLERANCE`] unless the user chose another), and reads it back (validated).
pub fn write(out: &Path, d: &Description, tol: Tolerance) -> Result<Imported> {
    let name = problem_name(Path::new(&d.file));
    let (text, warnings) = problem_toml(&name, d, tol)?;
    let dir = out.join(&name);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    std::fs::copy(&d.file, dir.join("reference.py")).map_err(io(Path::new(&d.file)))?;
    std::fs::write(dir.join("problem.toml"), text).map_err(io(&dir))?;
    ProblemSpec::load_dir(&dir).map_err(|source| ImportError::Invalid {
        path: dir.display().to_string(),
        source,
    })?;
    Ok(Imported {
        name,
        dir,
        warnings,
    })
}

/// A forward constant as a TOML value.
fn toml_constant(c: &crate::problem::ForwardConstant) -> String {
    use crate::problem::ForwardConstant;
    match c {
        ForwardConstant::Bool(b) => b.to_string(),
        ForwardConstant::Int(i) => i.to_string(),
        // `{:?}` keeps a decimal point or an exponent (3.0, 1e300): a TOML float.
        ForwardConstant::Float(x) => format!("{x:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax() -> Description {
        serde_json::from_value(serde_json::json!({
            "file": "level1/23_Softmax.py",
            "tensors": [
                {"name": "x", "dtype": "f32", "shape": [4, 8], "role": "input",
                 "init": {"dist": "uniform", "low": 0.0, "high": 1.0}, "shifted_trial": true,
                 "source": "drawn"},
                {"name": "w", "dtype": "f32", "shape": [8], "role": "input", "parameter": "ln.weight",
                 "init": {"dist": "uniform", "low": 0.5, "high": 1.5}, "shifted_trial": true,
                 "source": "const"},
                {"name": "out", "dtype": "f32", "shape": [4, 8], "role": "output"}],
            "forward": ["x"], "state": {"ln.weight": "w"}, "outputs": ["out"],
            "init_inputs": "[8, [2, 3]]", "flops": 64, "min_bytes": 288,
            "summary": "Softmax.", "output_max_abs": 0.9, "output_note": "one CPU run"
        }))
        .expect("description")
    }

    #[test]
    fn names_follow_the_level_and_file() {
        assert_eq!(
            problem_name(Path::new("KernelBench/level1/23_Softmax.py")),
            "kb-l1-23-softmax"
        );
        assert_eq!(
            problem_name(Path::new("x/level2/1_Conv2D_ReLU_BiasAdd.py")),
            "kb-l2-1-conv2d-relu-biasadd"
        );
        assert_eq!(problem_name(Path::new("mine/Soft max__.py")), "kb-soft-max");
    }

    #[test]
    fn a_description_becomes_a_valid_problem() {
        let d = softmax();
        let (text, warnings) =
            problem_toml("kb-l1-23-softmax", &d, KERNELBENCH_TOLERANCE).expect("toml");
        let spec = ProblemSpec::from_toml(&text).expect("parses");
        spec.validate().expect("valid");
        let torch = spec.reference.torch.as_ref().expect("torch reference");
        assert_eq!(torch.forward, ["x"]);
        assert_eq!(torch.state.get("ln.weight").map(String::as_str), Some("w"));
        assert_eq!(torch.init_inputs, "[8, [2, 3]]");
        assert!(spec.reference.kernel(crate::BackendKind::Cuda).is_none());
        assert_eq!(
            spec.backends(),
            [crate::BackendKind::Cuda, crate::BackendKind::Host]
        );
        assert!(spec.tensor("x").is_some_and(|t| t.shifted_trial));
        assert!(
            spec.tensor("w").is_some_and(|t| !t.shifted_trial),
            "parameters keep their own scale"
        );
        assert_eq!(spec.tolerance.atol, KERNELBENCH_FP32_TOL);
        assert_eq!((spec.roofline.flops, spec.roofline.min_bytes), (64, 288));
        assert!(matches!(
            spec.baseline.get("torch"),
            Some(crate::BaselineOp::Module {})
        ));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("constant"));
    }

    /// Python values among forward's arguments are written as constants and come back as
    /// they were (a float that prints like an int stays a float).
    #[test]
    fn forward_constants_are_written_and_read_back() {
        use crate::problem::ForwardConstant;
        let mut d = softmax();
        d.forward = vec![
            "x".into(),
            "s".into(),
            "k".into(),
            "flag".into(),
            "big".into(),
        ];
        d.constants = [
            ("s".to_string(), ForwardConstant::Float(3.0)),
            ("k".to_string(), ForwardConstant::Int(-7)),
            ("flag".to_string(), ForwardConstant::Bool(false)),
            ("big".to_string(), ForwardConstant::Float(1e300)),
        ]
        .into_iter()
        .collect();
        let (text, _) = problem_toml("p", &d, KERNELBENCH_TOLERANCE).expect("toml");
        let spec = ProblemSpec::from_toml(&text).expect("parses");
        spec.validate().expect("valid");
        let torch = spec.reference.torch.expect("torch");
        assert_eq!(torch.constants, d.constants);
        assert_eq!(torch.forward, d.forward);
    }

    #[test]
    fn a_tolerance_that_accepts_zeros_is_warned_about() {
        let mut d = softmax();
        d.output_max_abs = Some(5e-5);
        let (text, warnings) = problem_toml("p", &d, KERNELBENCH_TOLERANCE).expect("toml");
        assert!(text.contains("# WARNING: the tolerance accepts an all-zero output"));
        assert!(warnings.iter().any(|w| w.contains("all-zero")));
        d.output_max_abs = None;
        let (text, _) = problem_toml("p", &d, KERNELBENCH_TOLERANCE).expect("toml");
        assert!(text.contains("Not checked"));
    }

    #[test]
    fn a_chosen_tolerance_is_written_and_judges_the_zero_check() {
        let mut d = softmax();
        let loose = Tolerance {
            atol: 1e-2,
            rtol: 1e-2,
        };
        // Outputs up to 5e-3: a zero fails 1e-4 but passes 1e-2.
        d.output_max_abs = Some(5e-3);
        let (text, warnings) = problem_toml("p", &d, KERNELBENCH_TOLERANCE).expect("toml");
        assert!(
            !warnings.iter().any(|w| w.contains("all-zero")),
            "{warnings:?}"
        );
        assert!(text.contains("KernelBench's fp32 tolerance"));
        let (text, warnings) = problem_toml("p", &d, loose).expect("toml");
        assert!(
            warnings.iter().any(|w| w.contains("all-zero")),
            "{warnings:?}"
        );
        let spec = ProblemSpec::from_toml(&text).expect("parses");
        assert_eq!(spec.tolerance, loose);
        for bad in [
            (-1.0, 0.0),
            (f64::NAN, 0.0),
            (0.0, 1.0),
            (f64::INFINITY, 0.0),
        ] {
            let tol = Tolerance {
                atol: bad.0,
                rtol: bad.1,
            };
            assert!(
                matches!(problem_toml("p", &d, tol), Err(ImportError::Description(_))),
                "{bad:?} refused"
            );
        }
    }
}

//! `kiln problems import kernelbench` on pinned KernelBench files
//! (`tests/fixtures/kernelbench-423217d`, MIT, see its NOTICE.md) and on kiln's own
//! KernelBench-format fixtures (`problems/kernelbench-format/tiny`).
//!
//! Needs a python with torch: `KILN_PYTHON` (CI sets it), else `python3`; skipped with the
//! reason when that python cannot import torch.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln_types::{Dtype, Init, ProblemSpec, Role};
use serde_json::Value;

fn python() -> Option<String> {
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIP: {python} cannot import torch (set KILN_PYTHON to a python with torch)");
        return None;
    }
    Some(python)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The import with JSON output and `extra` arguments.
fn import_command(python: &str, paths: &[PathBuf], out: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["-o", "json", "problems", "import", "kernelbench"])
        .args(paths)
        .arg("--out")
        .arg(out)
        .args(["--python", python, "--helper"])
        .arg(repo().join("daemon/torch-runner/kiln_torch.py"))
        .args(extra)
        .output()
        .expect("kiln runs")
}

/// Runs the import with JSON output; returns it.
fn import(python: &str, paths: &[PathBuf], out: &Path) -> Value {
    let o = import_command(python, paths, out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("json")
}

fn names(v: &Value, key: &str, field: &str) -> Vec<String> {
    v[key]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| x[field].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn pinned_kernelbench_files_import_or_are_refused_with_a_reason() {
    let Some(python) = python() else {
        return;
    };
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kernelbench-423217d");
    let out = tempfile::tempdir().expect("tmp");
    let v = import(
        &python,
        &[fixtures.join("level1"), fixtures.join("level2")],
        out.path(),
    );
    assert_eq!(
        names(&v, "imported", "name"),
        [
            "kb-l1-5-matrix-scalar-multiplication",
            "kb-l1-23-softmax",
            "kb-l1-40-layernorm",
            "kb-l1-95-crossentropyloss",
            "kb-l1-100-hingeloss",
            "kb-l2-1-conv2d-relu-biasadd"
        ]
    );
    let refused = v["refused"].as_array().cloned().unwrap_or_default();
    assert_eq!(refused.len(), 1, "{refused:?}");
    let reason = |file: &str| {
        refused
            .iter()
            .find(|r| r["file"].as_str().is_some_and(|f| f.ends_with(file)))
            .and_then(|r| r["reason"].as_str())
            .unwrap_or("")
            .to_string()
    };
    assert!(reason("66_Matmul_Dropout_Softmax.py").contains("random ops"));

    let load = |name: &str| ProblemSpec::load_dir(&out.path().join(name)).expect("loads");
    let conv = load("kb-l2-1-conv2d-relu-biasadd");
    let order: Vec<&str> = conv.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(order, ["x", "bias", "conv_weight", "conv_bias", "out"]);
    // nn.Conv2d(64, 128, 3): PyTorch's default init is U(±1/sqrt(64*3*3)) = U(±1/24).
    match conv.tensor("conv_weight").map(|t| t.init) {
        Some(Init::Uniform { low, high }) => {
            assert!((high - 1.0 / 24.0).abs() < 1e-9 && (low + high).abs() < 1e-12)
        }
        other => panic!("conv weight init {other:?}"),
    }
    // nn.Parameter(torch.randn(bias_shape)).
    assert_eq!(
        conv.tensor("bias").map(|t| (t.shape.clone(), t.init)),
        Some((
            vec![128, 1, 1],
            Init::Normal {
                mean: 0.0,
                std: 1.0
            }
        ))
    );
    assert_eq!(
        conv.tensor("out").map(|t| t.shape.clone()),
        Some(vec![128, 128, 126, 126])
    );
    // 2 * N * K * C * R * S * OH * OW from torch's flop counter.
    assert_eq!(conv.roofline.flops, 2 * 128 * 128 * 64 * 9 * 126 * 126);
    let torch = conv.reference.torch.as_ref().expect("torch reference");
    assert_eq!(torch.init_inputs, "[64, 128, 3, [128, 1, 1]]");

    // `get_inputs()` returns `[A, 3.14]`: the float is a constant forward takes, not a
    // tensor kiln draws (KernelBench's literal, not π).
    let scalar = load("kb-l1-5-matrix-scalar-multiplication");
    let torch = scalar.reference.torch.as_ref().expect("torch reference");
    assert_eq!(torch.forward, ["A", "s"]);
    assert_eq!(
        torch.constants.get("s"),
        Some(&kiln_types::ForwardConstant::Float("3.14".parse().unwrap()))
    );
    assert!(scalar.tensor("s").is_none());
    assert_eq!(
        scalar.tensor("A").map(|t| t.shape.clone()),
        Some(vec![65536, 16384])
    );

    let ce = load("kb-l1-95-crossentropyloss");
    let targets = ce.tensor("targets").expect("targets");
    assert_eq!(
        (targets.dtype, targets.init, targets.shifted_trial),
        (Dtype::I64, Init::Randint { low: 0, high: 4096 }, false),
        "KernelBench's own harness casts these to float; kiln keeps them"
    );
    let softmax = load("kb-l1-23-softmax");
    assert_eq!(
        softmax
            .tensor("x")
            .map(|t| (t.shape.clone(), t.init, t.role)),
        Some((
            vec![4096, 393216],
            Init::Uniform {
                low: 0.0,
                high: 1.0
            },
            Role::Input
        ))
    );
    assert_eq!(softmax.backends(), ["cuda", "host"]);

    // HingeLoss's targets are `randint(0, 2) * 2 - 1`, which kiln cannot draw: they come
    // from the file's own get_inputs() (on the GPU, so on the cuda backend only); the
    // predictions, plain `rand`, are still kiln's, and the import says which is which.
    let hinge = load("kb-l1-100-hingeloss");
    let init = |n: &str| hinge.tensor(n).map(|t| t.init);
    assert_eq!(init("targets"), Some(Init::GetInputs));
    assert_eq!(
        init("predictions"),
        Some(Init::Uniform {
            low: 0.0,
            high: 1.0
        })
    );
    assert_eq!(hinge.backends(), ["cuda"]);
    let warned = v["imported"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["name"] == "kb-l1-100-hingeloss")
        .map(|i| i["warnings"].to_string())
        .unwrap_or_default();
    assert!(
        warned.contains("targets: kiln cannot draw it") && warned.contains("get_inputs()"),
        "{warned}"
    );
}

#[test]
fn kilns_own_fixtures_import_and_dropout_is_refused() {
    let Some(python) = python() else {
        return;
    };
    let out = tempfile::tempdir().expect("tmp");
    let v = import(
        &python,
        &[repo().join("problems/kernelbench-format/tiny")],
        out.path(),
    );
    assert_eq!(names(&v, "imported", "name").len(), 7, "{v}");
    let refused = names(&v, "refused", "file");
    assert_eq!(refused.len(), 1, "{v}");
    assert!(refused[0].ends_with("dropout_refused.py"), "{v}");
    let ln = ProblemSpec::load_dir(&out.path().join("kb-layernorm-4x8x16")).expect("loads");
    assert_eq!(
        ln.tensor("ln_weight").map(|t| t.init),
        Some(Init::Uniform {
            low: 0.5,
            high: 1.5
        }),
        "a constant initialiser (ones) drawn around its value"
    );
    // A buffer made from no draw (a causal mask) stays the module's own: not a tensor of
    // the problem, and the import says so.
    let mask = ProblemSpec::load_dir(&out.path().join("kb-causal-mask-8x8")).expect("loads");
    let order: Vec<&str> = mask.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(order, ["x", "out"]);
    let warned = v["imported"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["name"] == "kb-causal-mask-8x8")
        .map(|i| i["warnings"].to_string())
        .unwrap_or_default();
    assert!(
        warned.contains("buffer mask is made from no draw"),
        "{warned}"
    );
}

#[test]
fn a_chosen_tolerance_is_written_and_a_bad_one_refused() {
    let Some(python) = python() else {
        return;
    };
    let out = tempfile::tempdir().expect("tmp");
    let file = repo().join("problems/kernelbench-format/tiny/softmax_8x64.py");
    let o = import_command(
        &python,
        std::slice::from_ref(&file),
        out.path(),
        &["--atol", "1e-2", "--rtol", "2e-3"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    let name = names(&v, "imported", "name");
    assert_eq!(name.len(), 1, "{v}");
    let spec = ProblemSpec::load_dir(&out.path().join(&name[0])).expect("loads");
    assert_eq!((spec.tolerance.atol, spec.tolerance.rtol), (1e-2, 2e-3));
    // Nothing is written for a tolerance that judges nothing.
    let out = tempfile::tempdir().expect("tmp");
    let o = import_command(&python, &[file], out.path(), &["--rtol", "1.5"]);
    assert!(!o.status.success(), "rtol 1.5 taken");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rtol < 1"), "{err}");
    assert_eq!(std::fs::read_dir(out.path()).expect("dir").count(), 0);
}

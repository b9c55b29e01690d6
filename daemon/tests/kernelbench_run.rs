//! `kiln kernelbench run` against a real kilnd on the host backend (`--cpu`): kiln's own
//! KernelBench-format fixtures (`problems/kernelbench-format/tiny`) numbered as a level,
//! and a few `ModelNew` answers named as KernelBench names its runs — a correct one, one
//! wrong on every input, one wrong only on kiln's shifted trial (KernelBench-correct, not
//! kiln-correct), the reference renamed (a torch fallback: `ok` on the CPU, where kiln
//! records no kernels), a file without `class ModelNew` — and files that answer nothing.
//! A second run is answered from kilnd's store.
//!
//! Needs a python with torch (`KILN_PYTHON`), for the import and for kilnd's hosted
//! runner; skipped with the reason without one.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Daemon, kiln_cli, repo_root};
use serde_json::Value;

fn python() -> Option<String> {
    let Some(python) = std::env::var("KILN_PYTHON").ok().filter(|p| !p.is_empty()) else {
        eprintln!("SKIP: KILN_PYTHON (a python with torch) is not set");
        return None;
    };
    let ok = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIP: {python} cannot import torch");
        return None;
    }
    Some(python)
}

const STABLE_SOFTMAX: &str = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    \
    def forward(self, x):\n        e = torch.exp(x - x.max(dim=1, keepdim=True).values)\n        \
    return e / e.sum(dim=1, keepdim=True)\n";

/// exp without the max subtracted: right on KernelBench's inputs (randn), inf/inf on
/// kiln's shifted trial (mean 1000).
const NAIVE_SOFTMAX: &str = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    \
    def forward(self, x):\n        e = torch.exp(x)\n        return e / e.sum(dim=1, keepdim=True)\n";

/// The reference renamed.
const TORCH_FALLBACK: &str = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    \
    def __init__(self, in_features, out_features):\n        super().__init__()\n        \
    self.linear = nn.Linear(in_features, out_features)\n\n    def forward(self, x):\n        \
    return torch.relu(self.linear(x))\n";

/// Wrong on every input: the layer norm left out.
const WRONG_LAYERNORM: &str = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    \
    def __init__(self, *args):\n        super().__init__()\n        self.ln = nn.LayerNorm([8, 16])\n\n    \
    def forward(self, x):\n        return x\n";

/// The level (4 problems, one the import refuses) and the answers.
fn write_level_and_answers(root: &Path) -> (PathBuf, PathBuf) {
    let tiny = repo_root().join("problems/kernelbench-format/tiny");
    let level = root.join("level1");
    let answers = root.join("answers");
    std::fs::create_dir_all(&level).expect("mkdir");
    std::fs::create_dir_all(&answers).expect("mkdir");
    for (from, to) in [
        ("softmax_8x64.py", "1_Softmax_8x64.py"),
        ("linear_relu_4x16x8.py", "2_Linear_ReLU_4x16x8.py"),
        ("dropout_refused.py", "3_Dropout.py"),
        ("layernorm_4x8x16.py", "4_LayerNorm_4x8x16.py"),
    ] {
        std::fs::copy(tiny.join(from), level.join(to)).expect("copy a fixture");
    }
    for (name, text) in [
        ("level_1_problem_1_sample_0_kernel.py", NAIVE_SOFTMAX),
        ("level_1_problem_1_sample_1_kernel.py", STABLE_SOFTMAX),
        ("2_Linear_ReLU_4x16x8.py", TORCH_FALLBACK),
        (
            "level_1_problem_2_sample_1_kernel.py",
            "import torch\nprint('no ModelNew here')\n",
        ),
        ("level_1_problem_4_sample_0_kernel.py", WRONG_LAYERNORM),
        // Answers nothing evaluable: a problem the import refuses, another level, no name.
        ("level_1_problem_3_sample_0_kernel.py", STABLE_SOFTMAX),
        ("level_2_problem_1_sample_0_kernel.py", STABLE_SOFTMAX),
        ("model_new.py", STABLE_SOFTMAX),
    ] {
        std::fs::write(answers.join(name), text).expect("write an answer");
    }
    std::fs::write(answers.join("README.txt"), "not an answer").expect("write");
    (level, answers)
}

fn run(d: &Daemon, python: &str, level: &Path, answers: &Path, extra: &[&str]) -> (String, String) {
    let out = Command::new(kiln_cli())
        .env("KILN_SOCKET", &d.socket)
        .env("KILN_PYTHON", python)
        .args(["kernelbench", "run", "--level", "1", "--cpu", "--answers"])
        .arg(answers)
        .arg("--problems")
        .arg(level)
        .arg("--helper")
        .arg(repo_root().join("daemon/torch-runner/kiln_torch.py"))
        .args(extra)
        .output()
        .expect("run kiln");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "kiln kernelbench run failed\n{stdout}\n{stderr}\nkilnd:\n{}",
        d.log()
    );
    (stdout, stderr)
}

fn answer<'a>(doc: &'a Value, file: &str) -> &'a Value {
    doc["answers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["file"] == file)
        .unwrap_or_else(|| panic!("no answer {file} in {doc:#}"))
}

#[test]
fn a_level_of_answers_gives_the_table_and_a_second_run_comes_from_the_store() {
    let Some(python) = python() else {
        return;
    };
    let d = Daemon::start(&format!("[gpu]\npython = {python:?}\n"));
    let (level, answers) = write_level_and_answers(d.dir.path());

    let (stdout, _) = run(&d, &python, &level, &answers, &["-o", "json"]);
    let doc: Value = serde_json::from_str(&stdout).expect("-o json is JSON");
    let verdict = |f: &str| {
        let a = answer(&doc, f);
        (
            a["status"].as_str().unwrap_or("").to_string(),
            a["verdict"].as_str().unwrap_or("-").to_string(),
            a["kernelbench_correct"] == true,
            a["kiln_correct"] == true,
        )
    };
    let v = |s: &str, verdict: &str, kb: bool, kiln: bool| {
        (s.to_string(), verdict.to_string(), kb, kiln)
    };
    assert_eq!(
        verdict("level_1_problem_1_sample_0_kernel.py"),
        v("evaluated", "wrong_answer", true, false),
        "{doc:#}"
    );
    let naive = answer(&doc, "level_1_problem_1_sample_0_kernel.py");
    assert!(
        naive["deciding_trial"]
            .as_str()
            .is_some_and(|t| t.contains("shifted")),
        "{naive:#}"
    );
    assert_eq!(
        verdict("level_1_problem_1_sample_1_kernel.py"),
        v("evaluated", "ok", true, true)
    );
    assert_eq!(
        verdict("2_Linear_ReLU_4x16x8.py"),
        v("evaluated", "ok", true, true),
        "on the CPU kiln records no kernels, so a torch fallback is ok there"
    );
    assert_eq!(
        verdict("level_1_problem_2_sample_1_kernel.py"),
        v("refused", "-", false, false)
    );
    assert_eq!(
        verdict("level_1_problem_4_sample_0_kernel.py"),
        v("evaluated", "wrong_answer", false, false)
    );
    for a in doc["answers"].as_array().expect("answers") {
        if a["status"] == "evaluated" {
            assert_eq!(a["trust"], "hosted", "{a:#}");
            assert_eq!(a["from_store"], false, "{a:#}");
        }
    }
    let skipped: Vec<&str> = doc["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .filter_map(|s| s["file"].as_str())
        .collect();
    assert_eq!(
        skipped,
        [
            "level_1_problem_3_sample_0_kernel.py",
            "level_2_problem_1_sample_0_kernel.py",
            "model_new.py"
        ],
        "{doc:#}"
    );
    let dropout = doc["problems"]
        .as_array()
        .expect("problems")
        .iter()
        .find(|p| p["id"] == 3)
        .expect("problem 3");
    assert!(
        dropout["not_registered"]
            .as_str()
            .is_some_and(|r| r.contains("random ops")),
        "{dropout:#}"
    );

    let s = &doc["summary"];
    let c = &s["counts"];
    assert_eq!(
        (
            &c["level_problems"],
            &c["registered"],
            &c["answered_problems"],
            &c["answers"],
            &c["evaluated"],
            &c["refused"],
            &c["from_store"],
            &c["skipped"]
        ),
        (
            &Value::from(4),
            &Value::from(3),
            &Value::from(3),
            &Value::from(5),
            &Value::from(4),
            &Value::from(1),
            &Value::from(0),
            &Value::from(3)
        ),
        "{s:#}"
    );
    // Sample 0 of each problem: the naive softmax (KernelBench-correct), the torch fallback
    // (correct), the wrong layer norm: 2 of 3 for KernelBench, 1 of 3 for kiln. Best of
    // samples: problem 1's stable softmax makes kiln's 2 of 3.
    let correct = |view: &str, pick: &str| {
        let n = &s[view][pick]["correctness"];
        (n["correct"].as_u64(), n["problems"].as_u64())
    };
    assert_eq!(correct("kernelbench", "first_sample"), (Some(2), Some(3)));
    assert_eq!(
        correct("kernelbench", "best_of_samples"),
        (Some(2), Some(3))
    );
    assert_eq!(correct("kiln", "first_sample"), (Some(1), Some(3)));
    assert_eq!(correct("kiln", "best_of_samples"), (Some(2), Some(3)));
    let rate = s["kernelbench"]["first_sample"]["correctness"]["rate"]
        .as_f64()
        .expect("rate");
    assert!((rate - 2.0 / 3.0).abs() < 1e-9, "{rate}");
    // The host backend has no torch baselines (they are timed on a GPU): fast_p says
    // nothing rather than 0, and each problem says why.
    let eager = &s["kernelbench"]["first_sample"]["vs_eager"];
    let measured = doc["problems"]
        .as_array()
        .expect("problems")
        .iter()
        .any(|p| p["baselines"]["eager_us"].is_number());
    if !measured {
        assert!(eager["fast_p"][0]["value"].is_null(), "{eager:#}");
        let p1 = &doc["problems"][0];
        assert!(p1["baselines"]["note"].is_string(), "{p1:#}");
    }
    assert_eq!(
        doc["arithmetic"]["commit"],
        "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"
    );

    // Again, as text and a page: nothing is imported or evaluated again.
    let html = d.dir.path().join("level1.html");
    let (stdout, stderr) = run(
        &d,
        &python,
        &level,
        &answers,
        &["--html", html.to_str().expect("utf-8")],
    );
    assert!(stderr.contains("already imported"), "{stderr}");
    assert!(stdout.contains("4 answered from kilnd's store"), "{stdout}");
    for needle in [
        "level_1_problem_1_sample_0_kernel.py *",
        "kb-l1-1-softmax-8x64",
        "KernelBench's numbers, sample 0",
        "kiln's stricter view (ok only), best of samples",
        "2/3  66.7 %",
        "1/3  33.3 %",
        "not registered: 3_Dropout.py",
        "skipped: model_new.py",
        "level_1_problem_2_sample_1_kernel.py: refused",
    ] {
        assert!(stdout.contains(needle), "{needle:?} in\n{stdout}");
    }
    let page = std::fs::read_to_string(&html).expect("the page");
    assert!(page.starts_with("<!DOCTYPE html>") && page.contains("<table"));
    assert!(page.contains("kb-l1-4-layernorm-4x8x16"));
    assert!(
        !page.contains("src=") && !page.contains("<link") && !page.contains("<script"),
        "self-contained"
    );
}

/// No kilnd, no level folder: said, not a panic.
#[test]
fn clear_errors_without_a_daemon_or_a_folder() {
    let dir = tempfile::tempdir().expect("tmp");
    let answers = dir.path().join("answers");
    std::fs::create_dir_all(&answers).expect("mkdir");
    let kiln = |args: &[&str]| {
        let out = Command::new(kiln_cli())
            .arg("--socket")
            .arg(dir.path().join("none.sock"))
            .env_remove("KERNELBENCH")
            .args(args)
            .output()
            .expect("run kiln");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let a = answers.to_str().expect("utf-8");
    let err = kiln(&["kernelbench", "run", "--level", "1", "--answers", a]);
    assert!(
        err.contains("--problems") && err.contains("KERNELBENCH"),
        "{err}"
    );
    let err = kiln(&[
        "kernelbench",
        "run",
        "--level",
        "1",
        "--answers",
        a,
        "--problems",
        "/nonexistent/level1",
    ]);
    assert!(err.contains("no such folder"), "{err}");
    let level = repo_root().join("problems/kernelbench-format/tiny");
    let err = kiln(&[
        "kernelbench",
        "run",
        "--level",
        "1",
        "--answers",
        a,
        "--problems",
        level.to_str().expect("utf-8"),
    ]);
    assert!(err.contains("kilnd is not running"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

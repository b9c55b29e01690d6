//! Baselines through kilnd and the CLI on a machine without a GPU: typed refusals (never a
//! panic or a hang), the problem view with its floor, doctor's library report, and every
//! suite problem's `[baseline.*]` tables valid. GPU measurements are in
//! sandbox/tests/gpu.rs (`baseline_*`).

mod common;

use std::path::Path;
use std::process::Command;

use common::{Daemon, write_double_problem};

fn kiln(d: &Daemon, args: &[&str]) -> std::process::Output {
    Command::new(common::kiln_cli())
        .env("KILN_SOCKET", &d.socket)
        .args(args)
        .output()
        .expect("run kiln")
}

#[test]
fn every_suite_problem_with_baselines_loads_and_validates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../problems");
    let mut with = Vec::new();
    for entry in std::fs::read_dir(&root).expect("problems/") {
        let dir = entry.expect("entry").path();
        if !dir.join("problem.toml").is_file() {
            continue;
        }
        let spec = kiln_types::ProblemSpec::load_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        if !spec.baseline.is_empty() {
            with.push(spec.name.clone());
        }
    }
    with.sort();
    for seed in [
        "conv2d-3to96-k11s4p2",
        "conv2d-relu-maxpool",
        "layernorm-16x64x256x256",
        "matmul-fp32-4096",
        "softmax-4096x65536",
        "matmul-fp16-4096",
        "sdpa-fp16-b4h16s2048d64",
    ] {
        assert!(
            with.iter().any(|n| n == seed),
            "{seed} names no baseline: {with:?}"
        );
    }
}

#[test]
fn baselines_without_a_gpu_are_a_clear_refusal() {
    let d = Daemon::start("");
    let dir = write_double_problem(d.dir.path(), "bl-double");
    let out = kiln(&d, &["problems", "add", dir.to_str().expect("utf8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Unknown problem: 404 through the API, exit 1 through the CLI.
    let out = kiln(&d, &["problems", "baseline", "nope"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A registered problem on a machine without a GPU (or without cuda): a typed 409.
    let out = kiln(&d, &["problems", "baseline", "bl-double", "--remeasure"]);
    let err = String::from_utf8_lossy(&out.stderr);
    if nvml_present() {
        eprintln!("skipped the no-GPU half: this machine has NVML ({err})");
        return;
    }
    assert!(!out.status.success());
    assert!(
        err.contains("no GPU facts") || err.contains("cuda backend is not usable"),
        "{err}"
    );

    // The problem view still answers, with no baselines measured.
    let out = kiln(&d, &["problems", "show", "bl-double"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("none measured yet"), "{text}");
    let out = kiln(&d, &["problems", "show", "bl-double", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["baselines"], serde_json::json!([]));
}

#[test]
fn doctor_reports_the_baseline_libraries() {
    let d = Daemon::start("[gpu]\nlibrary_dirs = [\"/nonexistent-kiln-libs\"]\npython = \"\"\n");
    let out = kiln(&d, &["doctor", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let libs = v["baseline_libraries"]["libraries"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = libs.iter().filter_map(|l| l["name"].as_str()).collect();
    assert_eq!(names, vec!["cublas", "cudnn"], "{v}");
    assert!(
        v["baseline_libraries"]["torch_python"]
            .as_str()
            .is_some_and(|s| s.starts_with("off")),
        "{v}"
    );
    let out = kiln(&d, &["doctor"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("baseline libraries"), "{text}");
}

fn nvml_present() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib64/libnvidia-ml.so.1",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
}

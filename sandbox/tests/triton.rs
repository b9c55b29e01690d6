//! Triton candidates through the real jailed compile (no GPU needed: Triton compiles for
//! `sm_90` anywhere). Needs a python with triton: `KILN_TRITON_PYTHON` (CI installs one,
//! see `.ci/run`), else `python3`; every test skips, saying why, when there is none.
//!
//! Checked: the seed compiles to a manifest that lowers to plain CUDA launches; hostile
//! Python at module level or in a kernel is refused as `compile_error` before any of it
//! runs, and touches nothing; launch plans that do not fit the jit function are
//! `invalid_launch`; Triton's own errors reach the candidate as `compile_error`.

mod common;
#[path = "triton/plans.rs"]
mod plans;

use std::time::{Duration, Instant};

use kiln_sandbox::SandboxConfig;
use kiln_sandbox::engine::triton::artifact::Artifact;
use kiln_sandbox::engine::triton::lower::lower;
use kiln_sandbox::engine::triton::setup::TritonSetup;
use kiln_types::{Candidate, Evaluation, ProblemSpec, Verdict};

/// A sandbox config with a Triton, or `None` (printed) when there is no python with triton.
fn triton() -> Option<(tempfile::TempDir, SandboxConfig)> {
    let python = std::env::var("KILN_TRITON_PYTHON").unwrap_or_else(|_| "python3".into());
    let setup = match TritonSetup::find(&python, Duration::from_secs(60)) {
        Ok(s) => s,
        Err(e) => {
            println!("SKIP: no triton: {e}");
            return None;
        }
    };
    println!("using {}", setup.describe());
    let (dir, mut cfg) = common::setup();
    cfg.triton = Some(setup);
    // Python's and Triton's start on a busy 2-core machine.
    cfg.compile_timeout = Duration::from_secs(120);
    cfg.memory_limit_bytes = 2 << 30;
    Some((dir, cfg))
}

fn softmax() -> ProblemSpec {
    common::problem("softmax-4096x65536")
}

fn candidate(source: &str, launches: serde_json::Value) -> Candidate {
    serde_json::from_value(serde_json::json!({
        "problem": "softmax-4096x65536", "language": "triton", "source": source,
        "launches": launches,
    }))
    .expect("candidate")
}

/// A plain one-row-per-program softmax, with `top` at module level and `body` as the
/// first statement of the kernel.
fn kernel(top: &str, body: &str) -> String {
    format!(
        "import triton\nimport triton.language as tl\n{top}\n\n@triton.jit\n\
         def k(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):\n    {body}\n\
         \x20   row = tl.program_id(0).to(tl.int64)\n\
         \x20   offs = tl.arange(0, BLOCK)\n\
         \x20   x = tl.load(x_ptr + row * n_cols + offs)\n\
         \x20   tl.store(y_ptr + row * n_cols + offs, x)\n"
    )
}

fn launch() -> serde_json::Value {
    serde_json::json!([{"kernel": "k", "grid": [4096, 1, 1], "args": ["x", "y", {"i32": 65536}],
                        "constexprs": {"BLOCK": 1024}}])
}

fn compile_failure(cfg: &SandboxConfig, c: &Candidate) -> Evaluation {
    let out = kiln_sandbox::compile(cfg, &softmax(), c).expect("compile runs");
    assert!(out.artifact.is_none(), "{c:?} compiled");
    out.failure.expect("a failure")
}

#[test]
fn triton_seed_compiles_in_the_jail_and_lowers_to_cuda_launches() {
    let Some((dir, cfg)) = triton() else { return };
    let p = softmax();
    let seed = p
        .seed_candidate("triton")
        .expect("softmax has a triton seed");
    let t0 = Instant::now();
    let out = kiln_sandbox::compile(&cfg, &p, &seed).expect("compile runs");
    let cold = t0.elapsed();
    let bytes = out
        .artifact
        .unwrap_or_else(|| panic!("the seed failed: {:#?}", out.failure));
    println!(
        "SUMMARY triton seed compile (cold, jailed): {:.2} s wall, {:.0} ms reported; log: {}",
        cold.as_secs_f64(),
        out.info.duration_ms,
        out.info.log
    );
    assert!(
        out.layers.iter().any(|l| l.name == "seccomp" && l.active),
        "{:?}",
        out.layers
    );
    let art = Artifact::decode(&bytes).expect("the artifact decodes");
    let m = &art.manifest;
    assert_eq!(
        m.triton_version,
        cfg.triton.as_ref().expect("triton").version
    );
    assert_eq!(m.kernels.len(), 1);
    let k = &m.kernels[0];
    assert_eq!(
        (k.function.as_str(), k.symbol.as_str()),
        ("softmax_rows", "softmax_rows")
    );
    assert_eq!(k.num_warps, 8);
    assert_eq!(k.user_params, 3);
    assert!(art.images[0].starts_with(b"\x7fELF"));
    let lowered = lower(&seed, &art).expect("lowers");
    let l = &lowered.candidate.launches[0];
    assert_eq!(l.block, [256, 1, 1]);
    assert_eq!(l.grid, [4096, 1, 1]);
    assert_eq!(l.shared_bytes, k.shared_bytes);
    assert_eq!(l.args.len(), 3 + k.trailing_params as usize);
    common::assert_clean(dir.path());
}

#[test]
fn triton_hostile_python_is_refused_before_it_runs_and_touches_nothing() {
    let Some((dir, cfg)) = triton() else { return };
    // A witness outside the job's scratch: nothing may create it.
    let witness = dir.path().join("touched");
    let w = witness.display();
    let cases: Vec<(String, String, &str)> = vec![
        (
            format!("open({:?}, 'w').write('x')", w.to_string()),
            String::new(),
            "open(",
        ),
        ("import os".into(), String::new(), "import os"),
        ("import socket".into(), String::new(), "import socket"),
        (
            "import subprocess".into(),
            String::new(),
            "import subprocess",
        ),
        (
            format!("__import__('os').system('touch {w}')"),
            String::new(),
            "__import__",
        ),
        (
            "from triton import compiler".into(),
            String::new(),
            "from triton import compiler",
        ),
        (
            "X = tl.constexpr(open('/etc/passwd').read())".into(),
            String::new(),
            "X = tl.constexpr(",
        ),
        ("if True:\n    import os".into(), String::new(), "if True"),
        (
            String::new(),
            format!("triton.compiler.compiler.os.system('touch {w}')"),
            "triton.compiler",
        ),
        (
            String::new(),
            "getattr(triton, 'compiler')".to_string(),
            "getattr",
        ),
        (
            String::new(),
            "q = tl.core.builtins.open".into(),
            "reaches outside triton.language",
        ),
        (String::new(), "q = tl.__class__".into(), "dunder"),
        (String::new(), "q = open".into(), "open is not defined"),
        (String::new(), "k.fn(0)".into(), "fn"),
        (String::new(), "import os".into(), "not allowed inside"),
    ];
    for (top, body, needle) in cases {
        let src = kernel(&top, if body.is_empty() { "pass" } else { &body });
        let f = compile_failure(&cfg, &candidate(&src, launch()));
        assert_eq!(f.verdict, Verdict::CompileError, "{top}{body}: {f:#?}");
        assert!(f.message.contains(needle), "{top}{body}: {}", f.message);
        assert!(f.message.starts_with("line "), "{}", f.message);
        assert!(!witness.exists(), "{top}{body} touched the witness");
    }
    // A decorator, a default argument and an annotation that would run code at import.
    for (src, needle) in [
        (
            "import triton\n@triton.autotune(configs=[], key=[])\n@triton.jit\ndef k(x_ptr, y_ptr, n_cols):\n    pass\n",
            "one decorator",
        ),
        (
            "import triton\n@triton.jit(repr=print)\ndef k(x_ptr, y_ptr, n_cols):\n    pass\n",
            "literal values",
        ),
        (
            &format!(
                "import triton\n@triton.jit\ndef k(x_ptr, y_ptr, n_cols=__import__('os').system('touch {w}')):\n    pass\n"
            ),
            "default values",
        ),
        (
            &format!(
                "import triton\n@triton.jit\ndef k(x_ptr, y_ptr, n_cols: open({:?}, 'w')):\n    pass\n",
                w.to_string()
            ),
            "annotations",
        ),
    ] {
        let f = compile_failure(&cfg, &candidate(src, launch()));
        assert_eq!(f.verdict, Verdict::CompileError, "{src}: {f:#?}");
        assert!(f.message.contains(needle), "{src}: {}", f.message);
        assert!(!witness.exists(), "{src} touched the witness");
    }
    common::assert_clean(dir.path());
}

#[test]
fn triton_launch_plans_that_do_not_fit_are_invalid_launch() {
    let Some((_dir, cfg)) = triton() else { return };
    let src = kernel("", "pass");
    for (launches, needle) in [
        (
            serde_json::json!([{"kernel": "nope", "grid": [1, 1, 1], "args": ["x", "y", {"i32": 1}]}]),
            "no @triton.jit function named nope in the source (found: k)",
        ),
        (
            serde_json::json!([{"kernel": "k", "args": ["x", "y"], "constexprs": {"BLOCK": 16}}]),
            "takes 3 arguments besides its constexprs (x_ptr, y_ptr, n_cols); the launch passes 2",
        ),
        (
            serde_json::json!([{"kernel": "k", "args": ["x", "y", {"i32": 1}]}]),
            "constexpr BLOCK has no value",
        ),
        (
            serde_json::json!([{"kernel": "k", "args": ["x", "y", {"i32": 1}], "constexprs": {"BLOCK": 16, "n_cols": 3}}]),
            "not a tl.constexpr",
        ),
        (
            serde_json::json!([{"kernel": "k", "args": ["x", "zz", {"i32": 1}], "constexprs": {"BLOCK": 16}}]),
            "unknown buffer \"zz\"",
        ),
    ] {
        let f = compile_failure(&cfg, &candidate(&src, launches.clone()));
        assert_eq!(f.verdict, Verdict::InvalidLaunch, "{launches}: {f:#?}");
        assert!(f.message.contains(needle), "{launches}: {}", f.message);
    }
}

#[test]
fn triton_compile_errors_are_the_candidates() {
    let Some((_dir, cfg)) = triton() else { return };
    // tl.arange needs a power-of-two range: Triton's compiler refuses BLOCK = 1000.
    let mut launches = launch();
    launches[0]["constexprs"]["BLOCK"] = 1000.into();
    let f = compile_failure(&cfg, &candidate(&kernel("", "pass"), launches));
    assert_eq!(f.verdict, Verdict::CompileError, "{f:#?}");
    assert!(
        f.message.contains("launches[0] (kernel \"k\")"),
        "{}",
        f.message
    );
    assert!(f.message.contains("power of 2"), "{}", f.message);
    // A syntax error names its line.
    let f = compile_failure(&cfg, &candidate("import triton\ndef (:\n", launch()));
    assert_eq!(f.verdict, Verdict::CompileError, "{f:#?}");
    assert!(f.message.contains("line 2: syntax error"), "{}", f.message);
}

#[test]
fn triton_without_a_python_is_backend_unavailable() {
    let (_dir, cfg) = common::setup();
    let p = softmax();
    let seed = p.seed_candidate("triton").expect("seed");
    match kiln_sandbox::compile(&cfg, &p, &seed) {
        Err(kiln_sandbox::SandboxError::BackendUnavailable(name, why)) => {
            assert_eq!(name, "triton");
            assert!(why.contains("[triton] python"), "{why}");
        }
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
}

#[test]
fn triton_test_kernels_compile_for_the_gpu_and_lower() {
    let Some((_dir, cfg)) = triton() else { return };
    let mut cases = vec![
        ("layernorm", plans::layernorm()),
        ("matmul f32 3xTF32", plans::matmul_f32(false)),
        ("matmul f32 operands cast to f16", plans::matmul_f32(true)),
        ("matmul f16", plans::matmul_f16()),
    ];
    for mode in 0..=5 {
        cases.push((
            "vecadd red-team",
            plans::redteam(mode, u32::from(mode == 2)),
        ));
    }
    for (what, c) in cases {
        let p = common::problem(&c.problem);
        let t0 = Instant::now();
        let out = kiln_sandbox::compile(&cfg, &p, &c).expect("compile runs");
        let bytes = out
            .artifact
            .unwrap_or_else(|| panic!("{what} failed: {:#?}", out.failure));
        let art = Artifact::decode(&bytes).expect("decodes");
        let lowered = lower(&c, &art).expect("lowers");
        println!(
            "SUMMARY triton compile {what} ({}): {:.2} s; {}",
            c.problem,
            t0.elapsed().as_secs_f64(),
            lowered
                .candidate
                .launches
                .iter()
                .map(|l| format!(
                    "{} block {} shared {}",
                    l.kernel, l.block[0], l.shared_bytes
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert_eq!(lowered.candidate.launches.len(), c.launches.len());
        for (l, k) in lowered.candidate.launches.iter().zip(&c.launches) {
            assert_eq!(l.block[0], 32 * k.num_warps.unwrap_or(4), "{what}");
        }
    }
}

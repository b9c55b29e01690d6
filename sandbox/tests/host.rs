//! Host backend, end to end through the jail: honest kernels, problem suite, contract.

mod common;

use kiln_types::Verdict;

#[test]
fn host_vecadd_seed_is_ok_with_timing() {
    let (dir, cfg) = common::setup();
    let p = common::problem("vecadd-4096");
    let seed = p.seed_candidate("host").expect("seed");
    let e = common::run(&cfg, &p, &seed, &common::plan());
    assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
    let t = e.timing.expect("timing");
    eprintln!("{t:?}");
    assert!(t.n >= 5 && t.median_us > 0.0, "{t:?}");
    // A ~1 µs kernel: several runs per sample, each on fresh inputs, so the sample is a
    // time and not the timer's noise.
    assert!(t.reps > 1, "{t:?}");
    assert_eq!(t.fresh_inputs, t.n * t.reps, "{t:?}");
    assert!(t.median_us * f64::from(t.reps) > t.overhead_us, "{t:?}");
    common::assert_clean(dir.path());
}

fn with_knobs(
    mut c: kiln_types::Candidate,
    knobs: &[(&str, &str)],
    flags: &[&str],
) -> kiln_types::Candidate {
    for (name, value) in knobs {
        let line = c
            .source
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("knob {name}"))
            .to_string();
        c.source = c.source.replace(&line, &format!("#define {name} {value}"));
    }
    c.flags = flags.iter().map(|f| f.to_string()).collect();
    c
}

#[test]
fn host_softmax_seed_and_fast_variant_are_ok() {
    let (dir, cfg) = common::setup();
    let p = common::problem("softmax-256x4096");
    let seed = p.seed_candidate("host").expect("seed");
    let plan = common::plan();
    let slow = common::run(&cfg, &p, &seed, &plan);
    assert_eq!(slow.verdict, Verdict::Ok, "{slow:#?}");
    assert_eq!(
        slow.tier,
        Some(kiln_types::PrecisionTier::Fp32Faithful),
        "{slow:#?}"
    );
    assert!(
        slow.evidence.trials_run == 3,
        "two trials plus the shifted one: {slow:#?}"
    );
    let fast = with_knobs(
        seed,
        &[
            ("ACC_T", "float"),
            ("EXP", "expf"),
            ("ONLINE", "1"),
            ("UNROLL", "8"),
        ],
        &["-O3", "-march=native"],
    );
    let fast = common::run(&cfg, &p, &fast, &plan);
    assert_eq!(fast.verdict, Verdict::Ok, "{fast:#?}");
    let (s, f) = (slow.timing.expect("timing"), fast.timing.expect("timing"));
    eprintln!(
        "softmax seed {:.0} us, fast variant {:.0} us",
        s.median_us, f.median_us
    );
    // Which is faster is a benchmark's question (`kiln bench`), not a test's: on a loaded
    // 2-core machine either median can come out above the other.
    assert!(s.median_us > 0.0 && f.median_us > 0.0, "{s:?} {f:?}");
    common::assert_clean(dir.path());
}

#[test]
fn host_layernorm_seed_is_ok_and_naive_variance_fails_the_shifted_trial() {
    let (dir, cfg) = common::setup();
    let p = common::problem("layernorm-128x4096");
    let seed = p.seed_candidate("host").expect("seed");
    let plan = common::plan();
    let e = common::run(&cfg, &p, &seed, &plan);
    assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
    let fast = with_knobs(
        seed.clone(),
        &[("ACC_T", "float"), ("PASSES", "2"), ("UNROLL", "8")],
        &["-O3"],
    );
    let f = common::run(&cfg, &p, &fast, &plan);
    assert_eq!(f.verdict, Verdict::Ok, "{f:#?}");
    let mut naive = seed;
    naive.source = r#"
#include <math.h>
void layernorm(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float s = 0, q = 0;
        for (int c = 0; c < cols; c++) { s += xr[c]; q += xr[c] * xr[c]; }
        float mean = s / cols, var = q / cols - mean * mean;
        for (int c = 0; c < cols; c++) y[(long)r * cols + c] = (xr[c] - mean) / sqrtf(var + 1e-5f);
    }
}"#
    .into();
    let n = common::run(&cfg, &p, &naive, &plan);
    assert_eq!(n.verdict, Verdict::WrongAnswer, "{n:#?}");
    let trial = n.evidence.deciding_trial.clone().unwrap_or_default();
    assert!(
        trial.contains("shifted"),
        "the normal trials pass, the shifted one fails: {n:#?}"
    );
    assert!(
        n.evidence.errors[0].mismatches > 0 && !n.evidence.errors[0].first_mismatches.is_empty()
    );
    common::assert_clean(dir.path());
}

#[test]
fn host_float_and_integer_scalars_interleave() {
    let (dir, cfg) = common::setup();
    let p = common::problem("vecadd-4096");
    let c: kiln_types::Candidate = serde_json::from_value(serde_json::json!({
        "problem": "vecadd-4096", "language": "c",
        "source": "void axpby(float alpha, const float *a, double beta, const float *b, int n, float *y) {\n  for (int i = 0; i < n; i++) y[i] = alpha * a[i] + (float)beta * b[i];\n}\n",
        "launches": [{"kernel": "axpby", "args": [{"f32": 1.0}, "a", {"f64": 1.0}, "b", {"i32": 4096}, "y"]}]
    }))
    .expect("candidate");
    let e = common::run(&cfg, &p, &c, &common::plan());
    assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
    common::assert_clean(dir.path());
}

#[test]
fn host_time_below_the_roofline_floor_is_implausible() {
    let (dir, cfg) = common::setup();
    let p = common::problem("vecadd-4096");
    let mut plan = common::plan();
    plan.peak_bytes_per_s = 1e6; // 48 KiB at 1 MB/s: a floor of ~49 ms
    let e = common::run(&cfg, &p, &p.seed_candidate("host").expect("seed"), &plan);
    assert_eq!(e.verdict, Verdict::ImplausibleTime, "{e:#?}");
    assert!(e.message.contains("roofline floor"), "{}", e.message);
    common::assert_clean(dir.path());
}

#[test]
fn host_required_tier_refuses_coarse_kernels() {
    let (dir, cfg) = common::setup();
    let mut p = common::problem("vecadd-4096");
    p.tolerance.rtol = 1e-2;
    p.required_tier = Some(kiln_types::PrecisionTier::Fp32Faithful);
    let c: kiln_types::Candidate = serde_json::from_value(serde_json::json!({
        "problem": "vecadd-4096", "language": "c",
        "source": "void k(const float *a, const float *b, float *y, int n) {\n  for (int i = 0; i < n; i++) y[i] = (a[i] + b[i]) * 1.003f;\n}\n",
        "launches": [{"kernel": "k", "args": ["a", "b", "y", {"i32": 4096}]}]
    }))
    .expect("candidate");
    let e = common::run(&cfg, &p, &c, &common::plan());
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
    assert!(e.message.contains("requires Fp32Faithful"), "{}", e.message);
    common::assert_clean(dir.path());
}

#[test]
fn host_backend_status_names_both_backends() {
    let s = kiln_sandbox::backend_status();
    assert!(s.iter().any(|b| b.name == "host" && b.usable), "{s:?}");
    assert!(s.iter().any(|b| b.name == "cuda" && !b.usable), "{s:?}");
}

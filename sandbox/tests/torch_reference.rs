//! The torch reference on the host backend: problems imported (as `kiln problems import
//! kernelbench` does: the helper's describe, then `kiln_types::kernelbench::write`) from
//! kiln's own KernelBench-format files in `problems/kernelbench-format/tiny`, judged
//! against their PyTorch module, run by the lane's warm reference runner on kiln's own
//! inputs (parameters included).
//!
//! Needs a python with torch: `KILN_PYTHON` (CI sets it), else `python3`; skipped with the
//! reason when that python cannot import torch.

mod common;

use common::kernelbench::{fixture, python, runner};

use kiln_sandbox::SandboxConfig;
use kiln_torch_runner::ReferenceRunner;
use kiln_types::{Candidate, Evaluation, Language, ProblemSpec, Verdict};

/// `e` passed every correctness trial: `ok`, or `unmeasurable_time` (these kernels take
/// well under a microsecond, and on a loaded 2-core machine the timer's overhead can swamp
/// them; timing is not what these tests check).
fn assert_correct(e: &Evaluation) {
    let correct = e.evidence.trials_run > 0
        && e.evidence.trials_passed == e.evidence.trials_run
        && e.evidence.errors.iter().all(|m| m.mismatches == 0);
    assert!(
        e.verdict == Verdict::Ok || (e.verdict == Verdict::UnmeasurableTime && correct),
        "{e:#?}"
    );
    assert!(correct, "{e:#?}");
}

fn candidate(p: &ProblemSpec, source: &str, kernel: &str, args: &str) -> Candidate {
    serde_json::from_value(serde_json::json!({
        "problem": p.name,
        "language": "c",
        "source": source,
        "launches": [{"kernel": kernel, "args": serde_json::from_str::<serde_json::Value>(args).expect("args")}],
    }))
    .expect("candidate")
}

fn evaluate(
    cfg: &SandboxConfig,
    p: &ProblemSpec,
    c: &Candidate,
    runner: &mut ReferenceRunner,
) -> Evaluation {
    assert_eq!(c.language, Language::C);
    let out = kiln_sandbox::compile(cfg, p, c).expect("compile runs");
    let art = out.artifact.expect("compiles");
    let e = kiln_sandbox::evaluate_with(cfg, p, &[], c, &art, &common::plan(), Some(runner))
        .expect("evaluate runs");
    eprintln!("{}: {} ({}) {:?}", p.name, e.verdict, e.message, e.tier);
    e
}

const SOFTMAX: &str = r#"
#include <math.h>
void softmax(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + r * cols; float *yr = y + r * cols;
        double m = -INFINITY, s = 0;
        for (int c = 0; c < cols; c++) if (xr[c] > m) m = xr[c];
        for (int c = 0; c < cols; c++) s += exp(xr[c] - m);
        for (int c = 0; c < cols; c++) yr[c] = (float)(exp(xr[c] - m) / s);
    }
}
"#;

#[test]
fn softmax_honest_naive_and_caching_candidates_against_the_module() {
    let Some(mut runner) = runner() else {
        return;
    };
    let (_d, cfg) = common::setup();
    let p = fixture("kb-softmax-8x64");
    let args = r#"["x", "out", {"i32": 8}, {"i32": 64}]"#;

    let e = evaluate(
        &cfg,
        &p,
        &candidate(&p, SOFTMAX, "softmax", args),
        &mut runner,
    );
    assert_correct(&e);
    assert_eq!(
        e.tier,
        Some(kiln_types::PrecisionTier::Fp32Faithful),
        "{e:#?}"
    );
    assert!(
        e.evidence
            .notes
            .iter()
            .any(|n| n.contains("PyTorch module, computed in float64")),
        "{:?}",
        e.evidence.notes
    );

    let naive = SOFTMAX.replace("if (xr[c] > m) m = xr[c];", "m = 0;");
    let e = evaluate(
        &cfg,
        &p,
        &candidate(&p, &naive, "softmax", args),
        &mut runner,
    );
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
    assert!(
        e.evidence
            .deciding_trial
            .as_deref()
            .is_some_and(|t| t.contains("shifted")),
        "no max subtraction fails the shifted trial: {e:#?}"
    );

    let caching = format!(
        "{}\nstatic float kept[512]; static int have;\n\
         void cached(const float *x, float *y, int rows, int cols) {{\n\
           if (!have) {{ softmax(x, kept, rows, cols); have = 1; }}\n\
           for (int i = 0; i < rows * cols; i++) y[i] = kept[i];\n\
         }}\n",
        SOFTMAX
    );
    let e = evaluate(
        &cfg,
        &p,
        &candidate(&p, &caching, "cached", args),
        &mut runner,
    );
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
    assert_eq!(
        e.evidence.deciding_trial.as_deref(),
        Some("trial 2"),
        "outputs cached from the first input set fail on the next: {e:#?}"
    );
    assert_eq!(
        runner.starts(),
        1,
        "one warm runner served every evaluation"
    );
}

#[test]
fn parameters_are_inputs_the_candidate_must_use() {
    let Some(mut runner) = runner() else {
        return;
    };
    let (_d, cfg) = common::setup();
    let p = fixture("kb-linear-relu-4x16x8");
    let src = r#"
void linear_relu(const float *x, const float *w, const float *b, float *y, int n, int k, int m) {
    for (int i = 0; i < n; i++) for (int o = 0; o < m; o++) {
        double s = b[o];
        for (int j = 0; j < k; j++) s += (double)x[i * k + j] * w[o * k + j];
        y[i * m + o] = s > 0 ? (float)s : 0.0f;
    }
}
"#;
    let args =
        r#"["x", "linear_weight", "linear_bias", "out", {"i32": 4}, {"i32": 16}, {"i32": 8}]"#;
    let e = evaluate(
        &cfg,
        &p,
        &candidate(&p, src, "linear_relu", args),
        &mut runner,
    );
    assert_correct(&e);
    let no_bias = src.replace("double s = b[o];", "double s = 0;");
    let e = evaluate(
        &cfg,
        &p,
        &candidate(&p, &no_bias, "linear_relu", args),
        &mut runner,
    );
    assert_eq!(
        e.verdict,
        Verdict::WrongAnswer,
        "the bias is drawn per trial: {e:#?}"
    );
}

#[test]
fn layernorm_affine_terms_are_drawn_so_ignoring_them_fails() {
    let Some(mut runner) = runner() else {
        return;
    };
    let (_d, cfg) = common::setup();
    let p = fixture("kb-layernorm-4x8x16");
    let src = r#"
#include <math.h>
void ln(const float *x, const float *w, const float *b, float *y, int n, int d) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + i * d; double m = 0, v = 0;
        for (int j = 0; j < d; j++) m += xi[j];
        m /= d;
        for (int j = 0; j < d; j++) v += (xi[j] - m) * (xi[j] - m);
        v /= d;
        for (int j = 0; j < d; j++) y[i * d + j] = (float)((xi[j] - m) / sqrt(v + 1e-5) * w[j] + b[j]);
    }
}
"#;
    let args = r#"["x", "ln_weight", "ln_bias", "out", {"i32": 4}, {"i32": 128}]"#;
    let e = evaluate(&cfg, &p, &candidate(&p, src, "ln", args), &mut runner);
    assert_correct(&e);
    let plain = src.replace("* w[j] + b[j]", "");
    let e = evaluate(&cfg, &p, &candidate(&p, &plain, "ln", args), &mut runner);
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
}

#[test]
fn integer_and_bool_inputs_keep_their_dtype_and_range() {
    let Some(mut runner) = runner() else {
        return;
    };
    let (_d, cfg) = common::setup();
    let p = fixture("kb-cross-entropy-16x10");
    let targets = p.tensor("targets").expect("targets");
    assert_eq!(targets.dtype, kiln_types::Dtype::I64);
    assert_eq!(targets.init, kiln_types::Init::Randint { low: 0, high: 10 });
    let src = r#"
#include <math.h>
void ce(const float *p, const long long *t, float *out, int n, int c) {
    double total = 0;
    for (int i = 0; i < n; i++) {
        const float *r = p + i * c; double m = -INFINITY, s = 0;
        for (int j = 0; j < c; j++) if (r[j] > m) m = r[j];
        for (int j = 0; j < c; j++) s += exp(r[j] - m);
        total += m + log(s) - r[t[i]];
    }
    out[0] = (float)(total / n);
}
"#;
    let args = r#"["predictions", "targets", "out", {"i32": 16}, {"i32": 10}]"#;
    let e = evaluate(&cfg, &p, &candidate(&p, src, "ce", args), &mut runner);
    assert_correct(&e);

    let p = fixture("kb-masked-cumsum-4x32");
    assert_eq!(
        p.reference.torch.as_ref().map(|t| t.bool_tensors.clone()),
        Some(vec!["mask".to_string()])
    );
    let src = r#"
void mcs(const float *x, const unsigned char *mask, float *y, int n, int d) {
    for (int i = 0; i < n; i++) {
        float acc = 0;
        for (int j = 0; j < d; j++) { acc += mask[i * d + j] ? x[i * d + j] : 0.0f; y[i * d + j] = acc; }
    }
}
"#;
    let args = r#"["x", "mask", "out", {"i32": 4}, {"i32": 32}]"#;
    let e = evaluate(&cfg, &p, &candidate(&p, src, "mcs", args), &mut runner);
    assert_correct(&e);
    let unmasked = src.replace("mask[i * d + j] ? x[i * d + j] : 0.0f", "x[i * d + j]");
    let e = evaluate(
        &cfg,
        &p,
        &candidate(&p, &unmasked, "mcs", args),
        &mut runner,
    );
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
}

#[test]
fn without_a_runner_a_torch_problem_is_kilns_failure_not_a_verdict() {
    if python().is_none() {
        return;
    }
    let (_d, cfg) = common::setup();
    let p = fixture("kb-softmax-8x64");
    let c = candidate(
        &p,
        SOFTMAX,
        "softmax",
        r#"["x", "out", {"i32": 8}, {"i32": 64}]"#,
    );
    let art = kiln_sandbox::compile(&cfg, &p, &c)
        .expect("compile runs")
        .artifact
        .expect("compiles");
    let err = kiln_sandbox::evaluate(&cfg, &p, &[], &c, &art, &common::plan())
        .expect_err("no runner: an infrastructure error");
    assert!(err.to_string().contains("torch reference"), "{err}");
}

/// A torch runner that dies in the middle of a trial (its module exits the process) is
/// kiln's failure, named as the runner's: the evaluation is an error, never a verdict on
/// the candidate; the next evaluation starts a fresh runner and goes on.
#[test]
fn a_runner_crash_mid_trial_is_kilns_failure_not_a_verdict() {
    let Some(mut runner) = runner() else {
        return;
    };
    let (_d, cfg) = common::setup();
    let p = fixture("kb-softmax-8x64");
    let mut crashing = p.clone();
    crashing.name = "kb-softmax-8x64-crashing".into();
    let torch = crashing
        .reference
        .torch
        .as_mut()
        .expect("a torch reference");
    torch.source = torch.source.replace(
        "def forward(self",
        "def forward(self, *a, **k):\n        import os\n        os._exit(3)\n\n    def original_forward(self",
    );
    assert!(torch.source.contains("os._exit(3)"), "{}", torch.source);
    let args = r#"["x", "out", {"i32": 8}, {"i32": 64}]"#;
    let c = candidate(&crashing, SOFTMAX, "softmax", args);
    let art = kiln_sandbox::compile(&cfg, &crashing, &c)
        .expect("compile runs")
        .artifact
        .expect("compiles");
    let got = kiln_sandbox::evaluate_with(
        &cfg,
        &crashing,
        &[],
        &c,
        &art,
        &common::plan(),
        Some(&mut runner),
    );
    let err = got.expect_err("a crashed runner is an error, not an evaluation");
    assert!(err.to_string().contains("torch runner"), "{err}");
    let e = evaluate(
        &cfg,
        &p,
        &candidate(&p, SOFTMAX, "softmax", args),
        &mut runner,
    );
    assert_correct(&e);
    assert_eq!(runner.starts(), 2, "a fresh runner after the crash");
}

/// A module's constant buffer (a causal mask) stays the module's own in the reference:
/// a candidate that applies the mask is correct, one that ignores it is not.
#[test]
fn a_modules_own_causal_mask_is_applied_by_the_reference() {
    let Some(mut runner) = runner() else {
        return;
    };
    let (_d, cfg) = common::setup();
    let p = fixture("kb-causal-mask-8x8");
    let src = r#"
void causal(const float *x, float *y, int n) {
    for (int b = 0; b < n; b++) for (int i = 0; i < 8; i++) for (int j = 0; j < 8; j++)
        y[(b * 8 + i) * 8 + j] = j <= i ? x[(b * 8 + i) * 8 + j] : 0.0f;
}
"#;
    let args = r#"["x", "out", {"i32": 4}]"#;
    let e = evaluate(&cfg, &p, &candidate(&p, src, "causal", args), &mut runner);
    assert_correct(&e);
    let unmasked = src.replace(
        "j <= i ? x[(b * 8 + i) * 8 + j] : 0.0f",
        "x[(b * 8 + i) * 8 + j]",
    );
    let e = evaluate(
        &cfg,
        &p,
        &candidate(&p, &unmasked, "causal", args),
        &mut runner,
    );
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
}

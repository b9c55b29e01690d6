//! Helpers for the tests of hosted `ModelNew` files on the host backend (`modelnew-cpu`):
//! a config whose hosted python is the test's (skipped without torch), a file as a
//! candidate, and one evaluation of it through the worker and its jail.

use std::time::Duration;

use kiln_sandbox::SandboxConfig;
use kiln_sandbox::engine::hosted::setup::HostedSetup;
use kiln_torch_runner::ReferenceRunner;
use kiln_types::{Candidate, EvalPlan, Evaluation, ProblemSpec, TrustMode, Verdict};

use super::kernelbench::{python, runner};

/// A config whose hosted python is the test's, and the CPU reference runner; `None` when
/// there is no python with torch.
pub fn hosted_setup() -> Option<(tempfile::TempDir, SandboxConfig, ReferenceRunner)> {
    let python = python()?;
    let (dir, mut cfg) = super::setup();
    cfg.hosted = Some(
        HostedSetup::find(&python.display().to_string(), Duration::from_secs(120))
            .expect("torch found"),
    );
    Some((dir, cfg, runner()?))
}

/// `source` as a `modelnew-cpu` candidate for `p`.
pub fn modelnew(p: &ProblemSpec, source: &str) -> Candidate {
    serde_json::from_value(serde_json::json!({
        "problem": p.name,
        "language": "modelnew-cpu",
        "source": source,
    }))
    .expect("candidate")
}

/// Compiles and evaluates `source` on `p` with the quick plan ([`super::plan`]).
pub fn evaluate(
    cfg: &SandboxConfig,
    p: &ProblemSpec,
    source: &str,
    runner: &mut ReferenceRunner,
) -> Evaluation {
    evaluate_with_plan(cfg, p, source, runner, &super::plan())
}

/// Compiles and evaluates `source` on `p` with `plan`; every result must say `hosted`
/// and `host` (kiln's failures panic: they are never the file's verdict).
pub fn evaluate_with_plan(
    cfg: &SandboxConfig,
    p: &ProblemSpec,
    source: &str,
    runner: &mut ReferenceRunner,
    plan: &EvalPlan,
) -> Evaluation {
    let c = modelnew(p, source);
    let out = kiln_sandbox::compile(cfg, p, &c).expect("compile step runs");
    let art = out.artifact.expect("a hosted file is its own artifact");
    let e = kiln_sandbox::evaluate_with(cfg, p, &[], &c, &art, plan, Some(runner))
        .expect("evaluate runs");
    eprintln!("{}: {} ({})", p.name, e.verdict, e.message);
    assert_eq!(e.trust, TrustMode::Hosted, "every hosted result says so");
    assert_eq!(e.backend, "host");
    e
}

/// Correct on every trial: `ok`, or `unmeasurable_time` (a forward of these sizes is a few
/// microseconds; timing is not what most of these tests check).
pub fn assert_correct(e: &Evaluation) {
    assert!(
        matches!(e.verdict, Verdict::Ok | Verdict::UnmeasurableTime),
        "{e:#?}"
    );
    assert!(e.evidence.trials_run > 0, "{e:#?}");
    assert_eq!(e.evidence.trials_passed, e.evidence.trials_run, "{e:#?}");
}

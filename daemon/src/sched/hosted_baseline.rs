//! The hosted baselines (`torch-eager-hosted`, `torch-compile-hosted`): the problem's own
//! PyTorch `Model`, written as a `ModelNew` file (`kiln_types::baseline::hosted_file`), is
//! compiled and evaluated on the held lane exactly as a hosted candidate is — the same
//! runner start, wake-up, device wait and hand-back of the result, the same overhead
//! taken off — so a hosted candidate's speedup is a ratio of two times taken the same
//! way. The file is trusted text (the problem author's module and kiln's two lines), but
//! it runs under the hosted jail like any candidate; its verdict is `no_own_kernels` (it
//! is the reference renamed), which is what a baseline is.

use kiln_types::baseline::{BaselineKind, BaselineRunner, BaselineStatus, hosted_file};
use kiln_types::{BaselineResult, Candidate, EvalPlan, Language, ProblemSpec, Verdict};

use crate::backends::Backend;

/// Every hosted baseline `spec` asks for, measured on `lane` (held by the caller) against
/// the compiled `reference` (empty for a PyTorch reference). Never fails: a kind that
/// could not be measured is a result that says why.
pub fn measure(
    backend: &dyn Backend,
    lane: usize,
    spec: &ProblemSpec,
    reference: &[u8],
    plan: &EvalPlan,
) -> Vec<BaselineResult> {
    BaselineKind::asked_by(spec)
        .into_iter()
        .filter(|k| k.runner() == BaselineRunner::HostedPath)
        .map(|kind| one(backend, lane, spec, reference, plan, kind))
        .collect()
}

/// The `ModelNew` candidate of hosted baseline `kind` for `spec`, if it has a PyTorch
/// reference.
pub fn candidate(spec: &ProblemSpec, kind: BaselineKind) -> Option<Candidate> {
    let torch = spec.reference.torch.as_ref()?;
    Some(Candidate {
        problem: spec.name.clone(),
        language: Language::ModelNew,
        source: hosted_file(kind, torch)?,
        launches: Vec::new(),
        scratch: Vec::new(),
        flags: Vec::new(),
        parent: None,
        note: Some(format!("kiln's {} baseline", kind.name())),
    })
}

fn one(
    backend: &dyn Backend,
    lane: usize,
    spec: &ProblemSpec,
    reference: &[u8],
    plan: &EvalPlan,
    kind: BaselineKind,
) -> BaselineResult {
    let not = |status, why: String| kind.not_measured("", status, why);
    let Some(file) = candidate(spec, kind) else {
        return not(
            BaselineStatus::Unavailable,
            "the problem's reference is not a PyTorch module".into(),
        );
    };
    let compiled = match backend.compile(spec, &file) {
        Ok(c) => c,
        Err(e) => return not(BaselineStatus::Unavailable, format!("hosted path: {e}")),
    };
    let Some(artifact) = compiled.artifact else {
        let why = compiled.failure.map(|f| f.message).unwrap_or_default();
        return not(BaselineStatus::Failed, format!("the hosted file: {why}"));
    };
    // A baseline is timed, not lifted.
    let plan = EvalPlan {
        record_launches: false,
        ..plan.clone()
    };
    let e = match backend.evaluate(lane, spec, reference, &file, &artifact, &plan) {
        Ok(e) => e,
        Err(err) => return not(BaselineStatus::Failed, format!("hosted path: {err}")),
    };
    match (e.verdict, e.timing) {
        (Verdict::Ok | Verdict::NoOwnKernels, Some(timing)) => BaselineResult {
            timing: Some(timing),
            rel_l2: e.evidence.errors.iter().map(|m| m.rel_l2).reduce(f64::max),
            mismatches: Some(e.evidence.errors.iter().map(|m| m.mismatches).sum()),
            detail: format!(
                "the problem's Model as a hosted ModelNew file{}, timed as a hosted candidate is",
                if kind == BaselineKind::TorchCompileHosted {
                    " (forward under torch.compile)"
                } else {
                    ""
                }
            ),
            ..not(BaselineStatus::Measured, String::new())
        },
        (verdict, _) => not(
            BaselineStatus::Failed,
            format!("the hosted file came out {verdict}: {}", e.message),
        ),
    }
}

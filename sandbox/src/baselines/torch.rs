//! The torch runner's baseline kinds (torch eager, `torch.compile`) timed by the
//! baselines' one driver ([`super::driver`]).
//!
//! The helper ([`kiln_torch_runner::helper`]) only runs what it is asked: it sets up the op of
//! `[baseline.torch]` (a name from its fixed registry, or the problem's own PyTorch module
//! when the problem has a `[reference.torch]`), draws inputs from the problem's
//! distributions, checks each precision variant against its own f64 run, and takes one
//! sample when told to, with the flush size and blocking-kernel length kiln gives it
//! ([`super::driver::SampleSpec`]). Warm-up, fresh input sets, the stop rule and the
//! statistics are the driver's. Never an error: a missing python or torch is
//! `unavailable`, anything else that goes wrong is `failed`, each with the reason.

use std::time::Duration;

use kiln_types::baseline::{BaselineKind, BaselineResult, BaselineStatus};
use kiln_types::{EvalPlan, ProblemSpec};
use serde_json::{Value, json};

use super::driver::{self, SampleSpec, Sampler};
use kiln_torch_runner::process::{RunnerError, RunnerProcess, TorchRunner};

/// Launches a torch op is budgeted for when sizing the blocking kernel (a module's
/// forward may launch dozens).
const TORCH_LAUNCHES: usize = 32;

/// Times the problem's torch kinds in `kinds` with one helper process seeing `gpu`.
pub fn measure(
    gpu: Option<&str>,
    helper: &TorchRunner,
    problem: &ProblemSpec,
    plan: &EvalPlan,
    kinds: &[BaselineKind],
) -> Vec<BaselineResult> {
    if !problem.baseline.contains_key("torch") || kinds.is_empty() {
        return Vec::new();
    }
    let all = |status: BaselineStatus, detail: String| -> Vec<BaselineResult> {
        kinds
            .iter()
            .map(|k| k.not_measured("", status, detail.clone()))
            .collect()
    };
    let mut p = match RunnerProcess::start(helper, gpu) {
        Ok(p) => p,
        Err(e) => return all(BaselineStatus::Unavailable, e.to_string()),
    };
    let hello = match p.call(
        &json!({"cmd": "hello", "device": "cuda"}),
        &[],
        helper.timeout,
    ) {
        Ok((v, _)) => v,
        Err(RunnerError::Answer(why)) => return all(BaselineStatus::Unavailable, why),
        Err(e) => return all(BaselineStatus::Failed, e.to_string()),
    };
    let spec = SampleSpec {
        flush_bytes: kiln_gpu::timing::l2_flush_bytes(hello["l2_bytes"].as_u64().unwrap_or(0)),
        blocker_ns: kiln_gpu::timing::default_blocker_ns(TORCH_LAUNCHES),
    };
    let about = hello["about"].as_str().unwrap_or("torch").to_string();
    let mut out = Vec::new();
    for &kind in kinds {
        out.extend(measure_kind(
            &mut p,
            helper.timeout,
            kind,
            problem,
            plan,
            spec,
            &about,
        ));
        if p.is_dead() {
            break;
        }
    }
    out
}

/// One kind: set up, then per precision variant a check and the driver's timing.
fn measure_kind(
    p: &mut RunnerProcess,
    timeout: Duration,
    kind: BaselineKind,
    problem: &ProblemSpec,
    plan: &EvalPlan,
    spec: SampleSpec,
    about: &str,
) -> Vec<BaselineResult> {
    let setup = json!({
        "cmd": "baseline",
        "kind": kind.name(),
        "problem": problem,
        "seed": plan.seed & (i64::MAX as u64),
    });
    let variants = match p.call(&setup, &[], timeout) {
        Ok((v, _)) => v["variants"].as_array().cloned().unwrap_or_default(),
        Err(e) => return vec![kind.not_measured("", BaselineStatus::Failed, e.to_string())],
    };
    let mut out = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        let prec = v["precision"].as_str().unwrap_or("").to_string();
        let note = v["detail"].as_str().unwrap_or("").to_string();
        let mut r = kind.not_measured(&prec, BaselineStatus::Measured, "");
        match p.call(&json!({"cmd": "check", "variant": i}), &[], timeout) {
            Ok((c, _)) => {
                r.rel_l2 = c["rel_l2"].as_f64();
                r.mismatches = c["mismatches"].as_u64();
            }
            Err(e) => {
                out.push(kind.not_measured(&prec, BaselineStatus::Failed, e.to_string()));
                continue;
            }
        }
        let mut s = HelperSampler { p, timeout, spec };
        match driver::measure(&plan.timing, &mut s) {
            Ok(t) => {
                r.timing = Some(t);
                r.detail = format!("{about}; {note}; error vs torch's own f64 run");
            }
            Err(e) => {
                r.status = BaselineStatus::Failed;
                r.detail = e.to_string();
            }
        }
        out.push(r);
        if p.is_dead() {
            break;
        }
    }
    out
}

/// The driver's mechanics over the helper's `run`, `fresh` and `sample` commands.
struct HelperSampler<'a> {
    p: &'a mut RunnerProcess,
    timeout: Duration,
    spec: SampleSpec,
}

impl Sampler for HelperSampler<'_> {
    type Error = RunnerError;

    fn run(&mut self) -> Result<(), RunnerError> {
        self.p
            .call(&json!({"cmd": "run"}), &[], self.timeout)
            .map(|_| ())
    }

    fn fresh_inputs(&mut self, set: u64) -> Result<(), RunnerError> {
        self.p
            .call(&json!({"cmd": "fresh", "set": set}), &[], self.timeout)
            .map(|_| ())
    }

    fn sample(&mut self) -> Result<f64, RunnerError> {
        let body = json!({"cmd": "sample", "flush_bytes": self.spec.flush_bytes,
                          "blocker_ns": self.spec.blocker_ns});
        let (v, _) = self.p.call(&body, &[], self.timeout)?;
        sample_us(&v)
    }
}

/// The `us` of a sample answer, positive and finite.
fn sample_us(v: &Value) -> Result<f64, RunnerError> {
    v["us"]
        .as_f64()
        .filter(|us| us.is_finite() && *us > 0.0)
        .ok_or_else(|| RunnerError::Answer(format!("the helper's sample is not a time: {v}")))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn problem() -> ProblemSpec {
        ProblemSpec::load_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../problems/softmax-4096x65536"),
        )
        .expect("problem")
    }

    #[test]
    fn sample_answers_must_be_times() {
        assert_eq!(sample_us(&json!({"us": 12.5})).ok(), Some(12.5));
        for bad in [json!({"us": 0.0}), json!({"us": -1.0}), json!({"ms": 1.0})] {
            assert!(sample_us(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn missing_python_is_unavailable_for_every_kind() {
        let helper = TorchRunner {
            python: PathBuf::from("/nonexistent/python3"),
            script: PathBuf::from("/nonexistent/helper.py"),
            timeout: Duration::from_secs(5),
        };
        let kinds = [BaselineKind::TorchEager, BaselineKind::TorchCompile];
        let r = measure(None, &helper, &problem(), &EvalPlan::default(), &kinds);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(
            r.iter().all(|b| b.status == BaselineStatus::Unavailable),
            "{r:?}"
        );
        assert_eq!(r[0].name, "torch-eager");
        assert_eq!(r[1].name, "torch-compile");
    }

    #[test]
    fn the_real_helper_reports_a_missing_torch_or_gpu() {
        // python3 without torch (CI's own python), or torch without a GPU: `unavailable`.
        // Skipped where python3 is absent.
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../daemon/torch-runner")
            .join(kiln_torch_runner::SCRIPT_NAME);
        if std::process::Command::new("python3")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("skipped: no python3");
            return;
        }
        let helper = TorchRunner {
            python: PathBuf::from("python3"),
            script,
            timeout: Duration::from_secs(60),
        };
        let r = measure(
            None,
            &helper,
            &problem(),
            &EvalPlan::default(),
            &[BaselineKind::TorchEager],
        );
        assert!(!r.is_empty());
        assert_eq!(r[0].status, BaselineStatus::Unavailable, "{r:?}");
    }
}

//! The GPU worker's baseline kinds (the reference, cuBLAS, cuDNN: see
//! [`crate::engine::cuda::baseline`]) timed in a fresh jailed `kiln-worker`, blocking.

use std::time::Duration;

use kiln_types::baseline::{BaselineKind, BaselineRunner};
use kiln_types::{BaselineResult, EvalPlan, ProblemSpec};

use crate::config::SandboxConfig;
use crate::error::SandboxError;
use crate::jail::{self, Limits, Role};
use crate::jailed_worker::{JobDir, jail_spec, protocol_error};
use crate::protocol::{self, PROTOCOL_VERSION, Request, Response};

/// Wall budget of one baselines request: the reference and up to two variants per
/// kind, each under the stop rule's wall cap, plus cuDNN's algorithm search and start.
pub fn baselines_budget(plan: &EvalPlan, kinds: usize) -> Duration {
    let timed = 1 + 2 * kinds as u32;
    Duration::from_secs(120)
        + Duration::from_secs_f64(plan.timing.wall_cap_ms.max(0.0) / 1e3) * timed
        + Duration::from_millis(plan.run_timeout_ms.saturating_mul(20))
}

/// Times the reference (compiled: `reference`) and the problem's GPU-worker kinds on the
/// sandbox's GPU, under `plan`'s seed and stop rule. Each result says whether it was
/// measured; `Err` is kiln's failure (no GPU, the jail, the worker).
pub fn measure(
    cfg: &SandboxConfig,
    problem: &ProblemSpec,
    reference: &[u8],
    plan: &EvalPlan,
) -> Result<Vec<BaselineResult>, SandboxError> {
    if let Err(e) = kiln_gpu::available() {
        return Err(SandboxError::BackendUnavailable(
            kiln_types::BackendKind::Cuda.to_string(),
            e.reason,
        ));
    }
    if problem
        .reference
        .kernel(kiln_types::BackendKind::Cuda)
        .is_none()
    {
        return Err(SandboxError::Problem(
            problem.name.clone(),
            "no cuda reference".into(),
        ));
    }
    let kinds: Vec<BaselineKind> = BaselineKind::asked_by(problem)
        .into_iter()
        .filter(|k| k.runner() == BaselineRunner::GpuWorker && *k != BaselineKind::Reference)
        .collect();
    let budget = baselines_budget(plan, kinds.len());
    let job = JobDir::new(cfg)?;
    // As for a GPU evaluation: no RLIMIT_AS (the driver reserves address space), room for
    // the driver's and the libraries' threads.
    let limits = Limits {
        cpu_s: budget.as_secs() + 1,
        nofile: 512,
        nproc: 256,
        fsize_bytes: 1 << 30,
        as_bytes: None,
    };
    let spec = jail_spec(cfg, Role::GpuWorker, true, &job, limits, "serve")?;
    let mut child = jail::spawn(&cfg.worker_exe, &spec, budget)?;
    let request = Request::Baselines {
        version: PROTOCOL_VERSION,
        problem: Box::new(problem.clone()),
        plan: plan.clone(),
        kinds,
    };
    let reply = child
        .stdin
        .as_mut()
        .ok_or_else(|| protocol::ProtocolError::Io(std::io::ErrorKind::BrokenPipe.into()))
        .and_then(|w| protocol::write_message(w, &request, &[reference]))
        .and_then(|()| protocol::read_message::<Response>(&mut child.stdout));
    if child.timed_out() {
        child.finish();
        return Err(SandboxError::Worker(format!(
            "timing the baselines exceeded the wall budget of {:.0} s; the jail was killed",
            budget.as_secs_f64()
        )));
    }
    let (response, _) = reply.map_err(|e| protocol_error(e, &mut child))?;
    child.finish();
    match response {
        Response::Baselines { results } => Ok(results),
        Response::Failed { message } => Err(SandboxError::Worker(message)),
        other => Err(SandboxError::Protocol {
            message: format!("unexpected response to baselines: {other:?}"),
            source: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_round_trips_with_its_blob() {
        let req = Request::Baselines {
            version: PROTOCOL_VERSION,
            problem: Box::new(
                ProblemSpec::load_dir(
                    &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("../problems/matmul-fp32-4096"),
                )
                .expect("problem"),
            ),
            plan: EvalPlan::default(),
            kinds: vec![BaselineKind::Cublas],
        };
        let mut buf = Vec::new();
        protocol::write_message(&mut buf, &req, &[b"cubin"]).expect("write");
        let (got, blobs): (Request, _) = protocol::read_message(&mut buf.as_slice()).expect("read");
        assert!(matches!(got, Request::Baselines { kinds, .. } if kinds == [BaselineKind::Cublas]));
        assert_eq!(blobs, vec![b"cubin".to_vec()]);
    }

    #[test]
    fn budget_grows_with_the_wall_cap_and_libraries() {
        let plan = EvalPlan::default();
        assert!(baselines_budget(&plan, 1) > baselines_budget(&plan, 0));
        let mut slow = plan.clone();
        slow.timing.wall_cap_ms *= 2.0;
        assert!(baselines_budget(&slow, 1) > baselines_budget(&plan, 1));
    }
}

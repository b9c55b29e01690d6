//! `modelnew-cpu`: a hosted `ModelNew` file on the host backend (torch on the CPU), for
//! problems with a torch reference on machines without a GPU, and for CI.
//!
//! [`evaluate`] is this trust mode's entry on the host backend. The host engine's target
//! does the rest unchanged (`engine::host::evaluate::HostTarget`): the buffers in one
//! shared memfd with as many slots as fit, inputs drawn from the secret seed and written by
//! the worker, outputs poisoned before every run, the time taken on the worker's clock
//! from the command to the runner's `D`, the runner stopped (SIGSTOP) before anything is
//! read, the reference computed by kilnd's trusted torch runner from the same input bytes.
//! What differs is set up here: [`program`] starts the python runner instead of the C one,
//! with a setup message naming the file, the tensors' places in the memfd, `forward`'s
//! arguments, the outputs, and the parameters and buffers kiln sets by name; kiln's echo
//! runner times the overhead (the file's python answers `E` itself); a runner that cannot
//! run the file is its verdict before any run.

use std::path::Path;

use kiln_types::{Evaluation, ProblemSpec, Verdict};
use serde_json::json;

use super::Hosted;
use crate::engine::contract::Session;
use crate::engine::host::evaluate::{HostTarget, Job, prepare};
use crate::engine::host::layout::{Kind, Layout};
use crate::engine::host::runner_ctl::{Program, Runner, RunnerConfig};

/// Threads torch may use in a CPU runner: one, so a run's time is its own and the jail's
/// process limit holds.
const CPU_THREADS: u32 = 1;

/// Runs a `modelnew-cpu` file's whole contract. `Err` is an infrastructure failure, never
/// the candidate's.
pub fn evaluate(job: Job, hosted: &Hosted) -> Result<Evaluation, String> {
    let (problem, plan, artifact) = (job.problem, job.plan, job.candidate_artifact);
    let limits = job.runner_limits();
    let p = match prepare(job)? {
        Ok(p) => p,
        Err(e) => return Ok(e),
    };
    let script = p.dir.join(super::setup::SCRIPT_NAME);
    let program = program(problem, artifact, &p.layout, hosted, &p.dir, &script)?;
    let cand_cfg = p.runner_config(&limits);
    let cfg = RunnerConfig {
        load_timeout: hosted.load_timeout,
        ..cand_cfg
    };
    let (runner, ready) = Runner::spawn_program(&cfg, p.layout.clone(), program)?;
    let echo = super::spawn_echo(&cand_cfg)?;
    let target = HostTarget::new(
        problem,
        p,
        runner,
        kiln_types::TrustMode::Hosted,
        Some(echo),
    );
    let mut session = Session::new(problem, plan, target);
    match &ready {
        Ok(r) => {
            session.evidence.notes.extend(r.notes.iter().cloned());
            if let Some((verdict, message)) = super::ready_verdict(r) {
                if verdict == Verdict::RuntimeFault {
                    session.evidence.fault = r.error.clone();
                }
                return Ok(session.verdict(verdict, message));
            }
        }
        Err(end) => {
            return HostTarget::did_not_load(
                &mut session,
                end.clone(),
                "importing the ModelNew file",
            );
        }
    }
    let mut e = session.run()?;
    e.compile = Some(super::load_info(session.target.candidate.load_ms));
    session.target.reference_note(&mut e);
    Ok(e)
}

/// Writes the runner script, the candidate file and its prebuilt libraries (from
/// `artifact`) into `dir` (the job's scratch) and returns the runner to start over
/// `layout` (slot 0 of the candidate's buffers).
pub fn program<'a>(
    problem: &ProblemSpec,
    artifact: &[u8],
    layout: &Layout,
    hosted: &'a Hosted<'a>,
    dir: &'a Path,
    script: &'a Path,
) -> Result<Program<'a>, String> {
    let torch = problem
        .reference
        .torch
        .as_ref()
        .ok_or_else(|| format!("problem {} has no torch reference", problem.name))?;
    let (candidate, prebuilt) = super::write_files(dir, artifact)?;
    let mut tensors = Vec::new();
    for b in layout.buffers.iter().filter(|b| b.kind != Kind::Scratch) {
        let spec = problem
            .tensor(&b.name)
            .ok_or_else(|| format!("no tensor {}", b.name))?;
        let shape: Vec<u64> = if spec.shape.is_empty() {
            vec![1]
        } else {
            spec.shape.clone()
        };
        tensors.push(json!({
            "name": b.name,
            "dtype": b.dtype,
            "shape": shape,
            "role": if b.kind == Kind::Input { "input" } else { "output" },
            "offset": b.offset,
            "bytes": b.bytes(),
        }));
    }
    let setup = json!({
        "source": candidate,
        "device": "cpu",
        "map_len": layout.total,
        "slots": layout.slots,
        "slot_bytes": layout.slot_bytes,
        "tensors": tensors,
        "forward": torch.forward,
        "constants": torch.constants,
        "outputs": torch.outputs,
        "state": torch.state,
        "bool_tensors": torch.bool_tensors,
        "init_inputs": torch.init_inputs,
        "threads": CPU_THREADS,
        "prebuilt": prebuilt,
    });
    let env = super::setup::runner_env(dir, hosted.setup, false);
    Ok(Program::Hosted {
        python: &hosted.setup.python,
        script,
        env,
        setup,
        fds: Vec::new(),
        processes: false,
    })
}

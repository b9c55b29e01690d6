//! `modelnew-cpu`: a hosted `ModelNew` file on the host backend (torch on the CPU), for
//! problems with a torch reference on machines without a GPU, and for CI.
//!
//! The host engine does the rest unchanged (`engine::host::evaluate`): the buffers in one
//! shared memfd with as many slots as fit, inputs drawn from the secret seed and written by
//! the worker, outputs poisoned before every run, the time taken on the worker's clock
//! from the command to the runner's `D`, the runner stopped (SIGSTOP) before anything is
//! read, the reference computed by kilnd's trusted torch runner from the same input bytes.
//! Only the runner differs: [`program`] starts the python runner instead of the C one, with
//! a setup message naming the file, the tensors' places in the memfd, `forward`'s
//! arguments, the outputs, and the parameters and buffers kiln sets by name.

use std::path::Path;
use std::time::Duration;

use kiln_types::{ProblemSpec, Verdict};
use serde_json::json;

use super::setup::{CANDIDATE_NAME, HostedSetup, SCRIPT, SCRIPT_NAME};
use crate::engine::host::layout::{Kind, Layout};
use crate::engine::host::runner::Ready;
use crate::engine::host::runner_ctl::Program;

/// What the host engine needs to run a hosted candidate.
#[derive(Debug, Clone, Copy)]
pub struct Hosted<'a> {
    /// The python with torch.
    pub setup: &'a HostedSetup,
    /// How long importing the file and building `ModelNew` may take (torch's import and
    /// any `load_inline` or Triton build happen then).
    pub load_timeout: Duration,
}

/// Threads torch may use in a CPU runner: one, so a run's time is its own and the jail's
/// process limit holds.
const CPU_THREADS: u32 = 1;

/// Writes the runner script and the candidate file into `dir` (the job's scratch) and
/// returns the runner to start over `layout` (slot 0 of the candidate's buffers).
pub fn program<'a>(
    problem: &ProblemSpec,
    source: &str,
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
    std::fs::write(script, SCRIPT).map_err(|e| format!("write {SCRIPT_NAME}: {e}"))?;
    let candidate = dir.join(CANDIDATE_NAME);
    std::fs::write(&candidate, source).map_err(|e| format!("write {CANDIDATE_NAME}: {e}"))?;
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
        "outputs": torch.outputs,
        "state": torch.state,
        "bool_tensors": torch.bool_tensors,
        "init_inputs": torch.init_inputs,
        "threads": CPU_THREADS,
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

/// The verdict for a runner that loaded the file but said it cannot run it: `ModelNew`'s
/// parameters and buffers do not match the problem's (`invalid_launch`, naming them), or
/// the file failed to import or build (`runtime_fault`). `None`: ready to run.
pub fn ready_verdict(ready: &Ready) -> Option<(Verdict, String)> {
    if !ready.missing.is_empty() {
        return Some((
            Verdict::InvalidLaunch,
            format!(
                "ModelNew does not match the problem's parameters and buffers: {}",
                ready.missing.join("; ")
            ),
        ));
    }
    ready.error.as_ref().map(|e| {
        (
            Verdict::RuntimeFault,
            format!("the ModelNew file failed to load: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mismatch_names_the_parameters_and_a_failed_import_is_a_fault() {
        let ready = Ready {
            missing: vec!["no parameter or buffer 'linear.weight'".into()],
            error: Some("state mismatch".into()),
            notes: Vec::new(),
        };
        let (v, m) = ready_verdict(&ready).expect("a verdict");
        assert_eq!(v, Verdict::InvalidLaunch);
        assert!(m.contains("linear.weight"), "{m}");
        let ready = Ready {
            missing: vec![],
            error: Some("ImportError: No module named 'nope'".into()),
            notes: Vec::new(),
        };
        let (v, m) = ready_verdict(&ready).expect("a verdict");
        assert_eq!(v, Verdict::RuntimeFault);
        assert!(m.contains("nope"), "{m}");
        assert!(ready_verdict(&Ready::default()).is_none());
    }
}

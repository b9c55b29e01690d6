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

use kiln_types::ProblemSpec;
use serde_json::json;

use super::Hosted;
use crate::engine::host::layout::{Kind, Layout};
use crate::engine::host::runner_ctl::Program;

/// Threads torch may use in a CPU runner: one, so a run's time is its own and the jail's
/// process limit holds.
const CPU_THREADS: u32 = 1;

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

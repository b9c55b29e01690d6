//! `modelnew` on the cuda backend: a hosted `ModelNew` file on the lane's GPU.
//!
//! The GPU workspace does the rest (`engine::cuda::workspace`, driven by
//! [`super::gpu_target`]): kiln's tensors are shareable allocations of the worker's
//! context, drawn, poisoned, guarded, hashed and compared there; the reference is kilnd's
//! trusted torch runner on the same shared memory. This module starts the python runner with one exported descriptor per tensor (it maps them,
//! then closes them before the file is imported) and times a run from the worker's side:
//!
//! 1. the worker makes the inputs current, poisons the outputs, arms the guards, flushes
//!    the L2 and waits for its own stream, all while the runner is stopped;
//! 2. the time is the worker's monotonic clock from the `G` byte to the runner's `D` (the
//!    runner synchronizes its device before answering); the overhead subtracted is the
//!    fastest empty round trip of kiln's own echo runner ([`spawn_echo`]), never one the
//!    file's runner answers (a file could slow those to have more taken off its times);
//! 3. the runner is stopped (SIGSTOP) and the outputs hashed at once: work the file left
//!    running on the GPU after answering (a side stream never waited for) changes them
//!    afterwards, and the kept copy taken later no longer matches that hash.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::kernels::{KernelAnswer, KernelRecord};
use super::setup::SCRIPT_NAME;
use super::{Hosted, load_info, spawn_echo};
use crate::engine::contract::RunFailure;
use crate::engine::host::layout::Layout;
use crate::engine::host::runner::Ready;
use crate::engine::host::runner_ctl::{Program, RunEnd, Runner, RunnerConfig};

/// Empty round trips measured for the overhead before the samples.
const OVERHEAD_ROUNDS: usize = 16;

/// One tensor handed to the runner: its spec, its exported allocation and that
/// allocation's size.
pub struct Exported<'a> {
    /// The problem's tensor.
    pub spec: &'a kiln_types::TensorSpec,
    /// The allocation's descriptor.
    pub fd: OwnedFd,
    /// The allocation's bytes.
    pub mapped: u64,
}

/// A live hosted runner on the GPU, and the echo runner that times kiln's own round trip.
pub struct HostedGpu {
    runner: Runner,
    echo: Runner,
    run_timeout: Duration,
    /// The limit of the first run of forward: the import's. Triton's autotune and JITs
    /// that compile on first use (`torch.compile` inside `ModelNew`, lazily built
    /// kernels) do their work there, as they do in KernelBench's own first call.
    first_run_timeout: Duration,
    /// Whether forward has run once.
    ran: bool,
    /// Record the GPU work of two untimed runs for lifting (`R`, see [`HostedGpu::run_untimed`]).
    record: bool,
    /// Untimed runs so far.
    untimed: u32,
    /// The recordings taken (the runner's claims, read by `lift`).
    recordings: Vec<serde_json::Value>,
}

/// The limit of the next run of forward: the import's limit for the first one (never less
/// than a run's), the run timeout after it.
fn run_limit(ran: bool, run_timeout: Duration, first_run_timeout: Duration) -> Duration {
    if ran {
        run_timeout
    } else {
        first_run_timeout.max(run_timeout)
    }
}

/// Starts the runner over `tensors` and waits until the file is imported and `ModelNew`
/// built (the `Ready` says whether it could be); `Err` is kiln's failure.
pub fn spawn(
    problem: &kiln_types::ProblemSpec,
    artifact: &[u8],
    tensors: Vec<Exported>,
    hosted: &Hosted,
    cfg: &RunnerConfig,
    dir: &Path,
    plan: &kiln_types::EvalPlan,
) -> Result<(HostedGpu, Result<Ready, RunEnd>), String> {
    let run_timeout = Duration::from_millis(plan.run_timeout_ms.max(1));
    let torch = problem
        .reference
        .torch
        .as_ref()
        .ok_or_else(|| format!("problem {} has no torch reference", problem.name))?;
    let script = dir.join(SCRIPT_NAME);
    let (candidate, prebuilt) = super::write_files(dir, artifact)?;
    let mut listed = Vec::new();
    let mut fds = Vec::new();
    for (i, t) in tensors.into_iter().enumerate() {
        let shape: Vec<u64> = if t.spec.shape.is_empty() {
            vec![1]
        } else {
            t.spec.shape.clone()
        };
        listed.push(json!({
            "name": t.spec.name,
            "dtype": t.spec.dtype,
            "shape": shape,
            "role": t.spec.role,
            "fd": 7 + i,
            "mapped": t.mapped,
        }));
        fds.push(t.fd);
    }
    let setup = json!({
        "source": candidate,
        "device": "cuda",
        "slots": 1,
        "tensors": listed,
        "forward": torch.forward,
        "constants": torch.constants,
        "outputs": torch.outputs,
        "state": torch.state,
        "bool_tensors": torch.bool_tensors,
        "init_inputs": torch.init_inputs,
        "prebuilt": prebuilt,
    });
    let program = Program::Hosted {
        python: &hosted.setup.python,
        script: &script,
        env: super::setup::runner_env(dir, hosted.setup, true),
        setup,
        fds,
        processes: true,
    };
    let cfg = RunnerConfig {
        load_timeout: hosted.load_timeout,
        ..*cfg
    };
    let echo = spawn_echo(&cfg)?;
    let (runner, ready) = Runner::spawn_program(&cfg, Layout::empty(), program)?;
    Ok((
        HostedGpu {
            runner,
            echo,
            run_timeout,
            first_run_timeout: hosted.load_timeout,
            ran: false,
            record: plan.record_launches,
            untimed: 0,
            recordings: Vec::new(),
        },
        ready,
    ))
}

/// After a hosted evaluation on the GPU: kills every process the file may have left in the
/// jail (its compilers may leave the runner's process group: ninja gives each command a
/// group of its own) and reaps them. Only where this worker is PID 1 of its own PID
/// namespace, where `kill(-1)` reaches nothing outside the jail; elsewhere the runner's
/// group was killed with it, and that is all.
pub fn kill_leftovers() {
    if std::process::id() != 1 {
        return;
    }
    // SAFETY: kill with no pointer arguments.
    if unsafe { libc::kill(-1, libc::SIGKILL) } != 0 {
        return; // nothing else in the jail
    }
    // Reap them (a process in the GPU driver can take a moment to die); bounded.
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < until {
        // SAFETY: waitpid with a null status pointer.
        match unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } {
            0 => std::thread::sleep(Duration::from_millis(1)),
            n if n > 0 => {}
            _ => return, // no children left
        }
    }
    tracing::warn!("processes a hosted file left were killed but not all reaped within 2 s");
}

impl HostedGpu {
    /// The contract's failure for a command that did not end in `D`.
    pub fn failure(&self, end: RunEnd) -> RunFailure {
        match end {
            RunEnd::Timeout => RunFailure::Timeout(format!(
                "forward did not return within the run timeout of {} ms; runner killed",
                self.run_timeout.as_millis()
            )),
            RunEnd::Died(fault) => RunFailure::Fault(format!(
                "{fault} (forward raised or the process ended: see its output)"
            )),
            RunEnd::Flood(n) => RunFailure::Fault(format!(
                "output flood: {n} bytes written to stdout/stderr; runner killed"
            )),
            RunEnd::Done(_) => RunFailure::Fault("runner answered unexpectedly".into()),
        }
    }

    /// One run of `forward` (`G`), timed on the worker's clock, µs; the runner is stopped
    /// when this returns.
    pub fn run(&mut self) -> Result<f64, RunFailure> {
        let first = !self.ran;
        let limit = run_limit(self.ran, self.run_timeout, self.first_run_timeout);
        self.ran = true;
        match self.runner.run(b'G', limit) {
            RunEnd::Done(d) => Ok(d.as_secs_f64() * 1e6),
            RunEnd::Timeout if first => Err(RunFailure::Timeout(format!(
                "the first forward (where Triton autotunes and kernels built on first use \
                 compile) did not return within {} ms; runner killed",
                limit.as_millis()
            ))),
            end => Err(self.failure(end)),
        }
    }

    /// One untimed run of `forward` (a correctness trial). With recording on, the second
    /// and third (after the first, where first-call work happens, and each on its own
    /// input draw) are `R`: the same run, with the GPU work it enqueued recorded by the
    /// runner and sent back before it answers.
    pub fn run_untimed(&mut self) -> Result<(), RunFailure> {
        let n = self.untimed;
        self.untimed += 1;
        if !(self.record && self.ran && n >= 1 && self.recordings.len() < 2) {
            return self.run().map(|_| ());
        }
        let limit = self.run_timeout.saturating_mul(4) + Duration::from_secs(30);
        match self.runner.ask::<serde_json::Value>(b'R', limit) {
            Ok(v) => {
                self.recordings.push(v);
                Ok(())
            }
            Err(end) => Err(self.failure(end)),
        }
    }

    /// The two recordings of [`HostedGpu::run_untimed`], once both were taken.
    pub fn recordings(&self) -> Option<(&serde_json::Value, &serde_json::Value)> {
        match self.recordings.as_slice() {
            [a, b] => Some((a, b)),
            _ => None,
        }
    }

    /// One empty round trip of kiln's echo runner, µs: pipes, a stopped process woken and
    /// stopped again. What the file's runner adds to that (python waking, its device wait)
    /// stays in its times.
    pub fn empty(&mut self) -> Result<f64, RunFailure> {
        match self.echo.run(b'E', self.run_timeout) {
            RunEnd::Done(d) => Ok(d.as_secs_f64() * 1e6),
            end => Err(RunFailure::Infra(format!("kiln's echo runner: {end:?}"))),
        }
    }

    /// The fastest of [`OVERHEAD_ROUNDS`] empty round trips, µs.
    pub fn overhead(&mut self) -> Result<f64, RunFailure> {
        let mut best = f64::INFINITY;
        for _ in 0..OVERHEAD_ROUNDS {
            best = best.min(self.empty()?);
        }
        Ok(best)
    }

    /// The import and build of the file (its `load_inline` and Triton compiles at import
    /// included), as the compile step of a hosted evaluation.
    pub fn compile_info(&self) -> kiln_types::CompileInfo {
        load_info(self.runner.load_ms)
    }

    /// What the file printed (an excerpt).
    pub fn output_excerpt(&self) -> Option<String> {
        self.runner.output_excerpt()
    }

    /// The kernels one more run of forward launches (`K`, untimed, on the current inputs),
    /// as the runner's profiler saw them, and the forward's span on the GPU; `Err` says
    /// why there is no list.
    pub fn kernels(&mut self) -> Result<(Vec<KernelRecord>, Option<f64>), String> {
        let limit = self.run_timeout.saturating_mul(4) + Duration::from_secs(30);
        match self.runner.ask::<KernelAnswer>(b'K', limit) {
            Ok(KernelAnswer {
                kernels: Some(k),
                span_us,
                ..
            }) => Ok((k, span_us.filter(|s| s.is_finite() && *s >= 0.0))),
            Ok(KernelAnswer { error, .. }) => {
                Err(error.unwrap_or_else(|| "the runner recorded nothing".into()))
            }
            Err(end) => Err(format!("the profiled run did not answer: {end:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first forward gets the import's limit (an autotune at its first call is not a
    /// hang); every later one the run timeout; a first limit below the run timeout never
    /// shortens it.
    #[test]
    fn the_first_forward_gets_the_imports_limit() {
        let run = Duration::from_secs(5);
        let load = Duration::from_secs(120);
        assert_eq!(run_limit(false, run, load), load);
        assert_eq!(run_limit(true, run, load), run);
        assert_eq!(run_limit(false, run, Duration::from_secs(1)), run);
    }
}

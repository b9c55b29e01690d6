//! [`ReferenceRunner`]: the warm trusted runner of a problem's torch reference
//! (`[reference.torch]`), one per lane, started on first use and kept.
//!
//! It is kiln's torch runner (`kiln_torch.py serve`, see [`crate::process`]) in a
//! process of its own, outside the jail and out of reach of candidate code: candidates run
//! in jailed workers (host: in runner processes stopped between runs), and the worker asks
//! its caller — this side — for the reference's outputs only between candidate runs
//! (`Response::Reference`, answered by `Request::ReferenceOutputs`). The module is built
//! once per problem in the runner, then called with `torch.func.functional_call` on kiln's
//! own input tensors (forward arguments, parameters and buffers), in float64 where every op
//! supports it. The host backend's runner computes on the CPU; the cuda backend's runs on
//! the lane's GPU ([`ReferenceRunner::gpu`]) in a CUDA context of its own (another
//! process: candidate code in the worker's context cannot address its memory), and scrubs
//! torch's caching allocator after every call. On both the tensors travel as bytes over
//! the worker's pipes (the GPU worker downloads the inputs and uploads the answer into its
//! output tensors): a host round trip per checked input set, not yet exported memory
//! handles.

use std::time::Duration;

use std::os::fd::{AsFd, OwnedFd};

use kiln_types::{ProblemSpec, Role};
use serde_json::json;

use crate::process::{RunnerProcess, TorchRunner};

/// The warm reference runner of one lane.
pub struct ReferenceRunner {
    helper: TorchRunner,
    device: &'static str,
    /// `CUDA_VISIBLE_DEVICES` for the runner: `Some("")` hides every GPU (the CPU runner),
    /// `Some(uuid)` shows the lane's GPU, `None` leaves the variable unset.
    gpu: Option<String>,
    process: Option<RunnerProcess>,
    started: u32,
}

/// What one reference call gave: the output tensors' bytes (problem order) and how they
/// were computed (`float64`, or the declared dtypes and why).
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceOutputs {
    /// Bytes of each output tensor, in the problem's order.
    pub outputs: Vec<Vec<u8>>,
    /// How the module computed.
    pub precision: String,
}

impl ReferenceRunner {
    /// A runner on the CPU (the host backend's lane); nothing starts until the first call.
    pub fn cpu(helper: TorchRunner) -> ReferenceRunner {
        ReferenceRunner {
            helper,
            device: "cpu",
            gpu: Some(String::new()),
            process: None,
            started: 0,
        }
    }

    /// A runner on a GPU lane: the GPU with `uuid` (`None`: the default GPU); nothing
    /// starts until the first call.
    pub fn gpu(helper: TorchRunner, uuid: Option<&str>) -> ReferenceRunner {
        ReferenceRunner {
            helper,
            device: "cuda",
            gpu: uuid.map(str::to_string),
            process: None,
            started: 0,
        }
    }

    /// How many times the runner's process was started (1 while it stays warm).
    pub fn starts(&self) -> u32 {
        self.started
    }

    /// The reference's outputs on `inputs` (bytes of each input tensor, problem order).
    /// `Err` is kiln's failure (no torch, the module failed), with the reason.
    pub fn run(
        &mut self,
        problem: &ProblemSpec,
        inputs: &[Vec<u8>],
    ) -> Result<ReferenceOutputs, String> {
        if problem.reference.torch.is_none() {
            return Err(format!("problem {} has no torch reference", problem.name));
        }
        let timeout = self.helper.timeout;
        let process = self.ensure(timeout)?;
        let blobs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let body = json!({"cmd": "reference", "problem": problem});
        let result = process.call(&body, &blobs, timeout);
        if process.is_dead() {
            self.process = None;
        }
        let (answer, outputs) = result.map_err(|e| format!("the torch reference: {e}"))?;
        let want = problem
            .tensors
            .iter()
            .filter(|t| t.role == Role::Output)
            .map(|t| t.bytes() as usize)
            .collect::<Vec<_>>();
        let got: Vec<usize> = outputs.iter().map(Vec::len).collect();
        if got != want {
            return Err(format!(
                "the torch reference answered outputs of {got:?} bytes; the problem's are {want:?}"
            ));
        }
        Ok(ReferenceOutputs {
            outputs,
            precision: answer["precision"].as_str().unwrap_or("").to_string(),
        })
    }

    /// Has the reference compute in place in a GPU worker's shared tensors: `tensors` are
    /// (name, bytes mapped) of every tensor, inputs then outputs in problem order, and
    /// `fds` one exported descriptor each. The runner maps them, computes, writes the
    /// outputs, synchronizes and unmaps them before it answers; the precision it reports.
    /// `Err` is kiln's failure, with the reason.
    pub fn run_shared(
        &mut self,
        problem: &ProblemSpec,
        tensors: &[(String, u64)],
        fds: Vec<OwnedFd>,
    ) -> Result<String, String> {
        check_shared(problem, tensors, fds.len())?;
        if self.device != "cuda" {
            return Err("shared tensors need the runner of a GPU lane".into());
        }
        let answer = self
            .call_shared(
                json!({"cmd": "reference_shared", "problem": problem}),
                tensors,
                &fds,
            )
            .map_err(|e| format!("the torch reference: {e}"))?;
        tracing::debug!(problem = %problem.name, ms = %answer["ms"], "torch reference in shared tensors");
        Ok(answer["precision"].as_str().unwrap_or("").to_string())
    }

    /// Has the runner write the problem's own inputs in place: `tensors` are (name, bytes
    /// mapped) of every input whose init is `get_inputs`, in problem order, `fds` one
    /// exported descriptor each. The runner seeds torch with `seed`, calls the file's
    /// `get_inputs()` on the GPU, copies each of those forward arguments into its tensor,
    /// synchronizes and unmaps before it answers. `Err` is kiln's failure.
    pub fn inputs_shared(
        &mut self,
        problem: &ProblemSpec,
        tensors: &[(String, u64)],
        seed: u64,
        fds: Vec<OwnedFd>,
    ) -> Result<(), String> {
        check_inputs_shared(problem, tensors, fds.len())?;
        if self.device != "cuda" {
            return Err("inputs from get_inputs() are made on a GPU lane's runner".into());
        }
        let body = json!({"cmd": "inputs_shared", "problem": problem, "seed": seed});
        let answer = self
            .call_shared(body, tensors, &fds)
            .map_err(|e| format!("the problem's get_inputs(): {e}"))?;
        tracing::debug!(problem = %problem.name, ms = %answer["ms"], "get_inputs() in shared tensors");
        Ok(())
    }

    /// One call of the (started) runner with `body`, the shared `tensors` listed in it and
    /// their descriptors sent after it; a runner that died is dropped, to start afresh.
    fn call_shared(
        &mut self,
        mut body: serde_json::Value,
        tensors: &[(String, u64)],
        fds: &[OwnedFd],
    ) -> Result<serde_json::Value, String> {
        let timeout = self.helper.timeout;
        let process = self.ensure(timeout)?;
        body["tensors"] = tensors
            .iter()
            .map(|(name, mapped)| json!({"name": name, "mapped": mapped}))
            .collect();
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        let result = process.call_with_fds(&body, &[], &borrowed, timeout);
        if process.is_dead() {
            self.process = None;
        }
        result.map(|(answer, _)| answer).map_err(|e| e.to_string())
    }

    fn ensure(&mut self, timeout: Duration) -> Result<&mut RunnerProcess, String> {
        if self.process.is_none() {
            // The host lane's runner sees no GPU at all; a GPU lane's only its own.
            let mut p = RunnerProcess::start(&self.helper, self.gpu.as_deref())
                .map_err(|e| e.to_string())?;
            p.call(
                &json!({"cmd": "hello", "device": self.device}),
                &[],
                timeout,
            )
            .map_err(|e| format!("the torch reference runner: {e}"))?;
            self.started += 1;
            self.process = Some(p);
        }
        self.process
            .as_mut()
            .ok_or_else(|| "the torch reference runner did not start".to_string())
    }
}

/// Checks a worker's list of shared tensors against the problem before anything is sent
/// to the runner: every tensor once, inputs then outputs in the problem's order, each
/// mapping at least the tensor's bytes, one descriptor each.
pub fn check_shared(
    problem: &ProblemSpec,
    tensors: &[(String, u64)],
    fds: usize,
) -> Result<(), String> {
    let want: Vec<&kiln_types::TensorSpec> = [Role::Input, Role::Output]
        .iter()
        .flat_map(|r| problem.tensors.iter().filter(move |t| t.role == *r))
        .collect();
    check_listed(&want, tensors, fds)
}

/// `tensors` (with `fds` descriptors) are `want`, in order, each mapping at least its bytes.
fn check_listed(
    want: &[&kiln_types::TensorSpec],
    tensors: &[(String, u64)],
    fds: usize,
) -> Result<(), String> {
    if tensors.len() != want.len() || fds != want.len() {
        return Err(format!(
            "the worker shared {} tensors with {fds} descriptors; the problem has {}",
            tensors.len(),
            want.len()
        ));
    }
    for ((name, mapped), t) in tensors.iter().zip(want) {
        if *name != t.name {
            return Err(format!(
                "the worker shared {name} where the problem's order has {}",
                t.name
            ));
        }
        if *mapped < t.bytes() {
            return Err(format!(
                "the worker shared {mapped} bytes for {name}, which has {}",
                t.bytes()
            ));
        }
    }
    Ok(())
}

/// Checks a worker's list of tensors for the problem's own inputs: exactly the inputs
/// whose init is `get_inputs`, in the problem's order, each mapping at least its bytes,
/// one descriptor each.
pub fn check_inputs_shared(
    problem: &ProblemSpec,
    tensors: &[(String, u64)],
    fds: usize,
) -> Result<(), String> {
    let want: Vec<&kiln_types::TensorSpec> = problem
        .tensors
        .iter()
        .filter(|t| t.role == Role::Input && t.init == kiln_types::Init::GetInputs)
        .collect();
    check_listed(&want, tensors, fds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ProblemSpec {
        ProblemSpec::from_toml(
            r#"
name = "p"
[[tensor]]
name = "out"
dtype = "f32"
shape = [1024]
role = "output"
[[tensor]]
name = "a"
dtype = "f32"
shape = [1024]
role = "input"
[[tensor]]
name = "b"
dtype = "i64"
shape = [8]
role = "input"
[tolerance]
atol = 1e-4
rtol = 1e-4
[reference.torch]
file = "reference.py"
source = "class Model: ..."
forward = ["a", "b"]
outputs = ["out"]
"#,
        )
        .expect("spec")
    }

    fn listed(names: &[(&str, u64)]) -> Vec<(String, u64)> {
        names.iter().map(|(n, b)| (n.to_string(), *b)).collect()
    }

    /// Inputs first, then outputs, each in the problem's order, one descriptor each, every
    /// mapping at least the tensor's bytes: anything else never reaches the runner.
    #[test]
    fn a_shared_list_must_be_the_problems_tensors_in_order() {
        let p = spec();
        let good = listed(&[("a", 4096), ("b", 2 << 20), ("out", 4096)]);
        assert_eq!(check_shared(&p, &good, 3), Ok(()));
        let refused = [
            (
                listed(&[("out", 4096), ("a", 4096), ("b", 64)]),
                3,
                "shared out where",
            ),
            (listed(&[("a", 4096), ("b", 64)]), 2, "shared 2 tensors"),
            (good.clone(), 2, "with 2 descriptors"),
            (
                listed(&[("a", 4095), ("b", 64), ("out", 4096)]),
                3,
                "4095 bytes for a",
            ),
            (
                listed(&[("a", 4096), ("b", 64), ("secret", 4096)]),
                3,
                "shared secret where",
            ),
        ];
        for (list, fds, want) in refused {
            let e = check_shared(&p, &list, fds).expect_err(want);
            assert!(e.contains(want), "{e}");
        }
    }

    /// The CPU runner (the host lane's) never maps a GPU worker's memory.
    #[test]
    fn only_a_gpu_lanes_runner_takes_shared_tensors() {
        let helper = TorchRunner {
            python: "/nonexistent/python".into(),
            script: "/nonexistent/kiln_torch.py".into(),
            timeout: Duration::from_secs(1),
        };
        let mut r = ReferenceRunner::cpu(helper);
        let p = spec();
        let e = r
            .run_shared(
                &p,
                &listed(&[("a", 4096), ("b", 64), ("out", 4096)]),
                Vec::new(),
            )
            .expect_err("no descriptors");
        assert!(e.contains("with 0 descriptors"), "{e}");
        let fds: Vec<OwnedFd> = (0..3)
            .map(|_| std::fs::File::open("/dev/null").expect("null").into())
            .collect();
        let e = r
            .run_shared(&p, &listed(&[("a", 4096), ("b", 64), ("out", 4096)]), fds)
            .expect_err("cpu");
        assert!(e.contains("GPU lane"), "{e}");
        assert_eq!(r.starts(), 0, "nothing was started");
    }
}

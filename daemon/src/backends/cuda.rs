//! The cuda backend: CUDA C candidates compiled by NVRTC in the jail and evaluated on
//! per-GPU lanes. A [`GpuLane`] is one GPU: its warm jailed worker
//! ([`kiln_sandbox::WarmWorker`], which sees only that GPU, behind [`LaneWorker`]), its
//! clock window ([`crate::gpu::clocks::LaneClocks`]), around which each evaluation and
//! baseline measurement runs, and its warm torch reference runner ([`ReferenceRunner`], on
//! that GPU) for problems whose only reference is PyTorch. The scheduler hands each lane to
//! one job at a time; lanes share nothing, so a fault or timeout on one replaces that
//! lane's worker alone.

use std::sync::Mutex;

use kiln_sandbox::kiln_gpu::telemetry::{ClockControl, ClockError, NvmlClocks, init_nvml};
use kiln_sandbox::{
    BackendStatus, CompileOutcome, SandboxConfig, SandboxError, TorchSource, WarmWorker,
    WarmWorkerStats,
};
use kiln_torch_runner::{ReferenceRunner, TorchRunner};
use kiln_types::{BackendKind, Candidate, EvalPlan, Evaluation, ProblemSpec};
use serde_json::json;

use super::{Backend, BackendError, compile_in_jail};
use crate::gpu::clocks::LaneClocks;

/// Peak figures of an H200 for the cuda floor check (a time below the floor is
/// `implausible_time`, so these are upper bounds, not typical rates): HBM3e bandwidth at
/// the datasheet's 4.8 TB/s (a read-only kernel beats the ~4.3 TB/s a copy reaches: an
/// honest hinge loss over 4 GiB read it at 4.34 TB/s on the H200, 2026-12-02), and a dense
/// tensor-core rate (fp16/bf16 ~990 Tflop/s) so that TF32 and fp16 kernels are never
/// refused as impossible.
const CUDA_PEAKS: (f64, f64) = (4.8e12, 990e12);

/// Clock control where NVML cannot be loaded: every change is refused (only reached
/// under the `lock` policy).
pub(super) struct NoControl;

impl ClockControl for NoControl {
    fn lock_sm_clocks(&mut self, _: u32, _: u32) -> Result<(), ClockError> {
        Err(ClockError::Lock("NVML is not available".into()))
    }

    fn lock_sm_clocks_to_base(&mut self) -> Result<(), ClockError> {
        self.lock_sm_clocks(0, 0)
    }

    fn reset_sm_clocks(&mut self) -> Result<(), ClockError> {
        Err(ClockError::Reset("NVML is not available".into()))
    }
}

/// NVML clock control for a GPU (never called under `observe`).
pub(super) fn nvml_control(uuid: &str) -> Option<Box<dyn ClockControl + Send>> {
    let nvml = init_nvml().ok()?;
    Some(Box::new(NvmlClocks::new(nvml, uuid)))
}

/// What evaluates on a lane's GPU: its [`WarmWorker`] (a fake in tests).
pub trait LaneWorker: Send {
    /// Evaluates a compiled candidate on the lane's GPU, asking `runner` for the
    /// reference's answers when the problem's only reference is PyTorch (see
    /// [`WarmWorker::evaluate_with`]).
    fn evaluate(
        &mut self,
        problem: &ProblemSpec,
        reference: &[u8],
        candidate: &Candidate,
        artifact: &[u8],
        plan: &EvalPlan,
        runner: Option<&mut ReferenceRunner>,
    ) -> Result<Evaluation, SandboxError>;
    /// Counters so far (workers started, evaluations answered).
    fn stats(&self) -> WarmWorkerStats;
}

impl LaneWorker for WarmWorker {
    fn evaluate(
        &mut self,
        problem: &ProblemSpec,
        reference: &[u8],
        candidate: &Candidate,
        artifact: &[u8],
        plan: &EvalPlan,
        runner: Option<&mut ReferenceRunner>,
    ) -> Result<Evaluation, SandboxError> {
        WarmWorker::evaluate_with(self, problem, reference, candidate, artifact, plan, runner)
    }

    fn stats(&self) -> WarmWorkerStats {
        WarmWorker::stats(self)
    }
}

/// One GPU's lane: its warm worker, its clock window and its torch reference runner.
pub struct GpuLane {
    uuid: String,
    worker: Mutex<Box<dyn LaneWorker>>,
    /// The worker's counters after its last evaluation (read without waiting for one).
    stats: Mutex<WarmWorkerStats>,
    clocks: LaneClocks,
    /// The lane's warm torch reference runner (on this GPU), or why there is none.
    torch: Result<Mutex<ReferenceRunner>, String>,
}

impl GpuLane {
    /// The lane of the GPU with this UUID.
    pub fn new(
        uuid: &str,
        worker: Box<dyn LaneWorker>,
        clocks: LaneClocks,
        torch: Result<Mutex<ReferenceRunner>, String>,
    ) -> GpuLane {
        let stats = Mutex::new(worker.stats());
        GpuLane {
            uuid: uuid.to_string(),
            worker: Mutex::new(worker),
            stats,
            clocks,
            torch,
        }
    }
}

/// The cuda backend: NVRTC compiles in the jail, evaluations on per-GPU lanes.
pub struct CudaBackend {
    /// Compile settings (any GPU's architecture: every lane's GPU is compiled for alike).
    cfg: SandboxConfig,
    lanes: Vec<GpuLane>,
    status: BackendStatus,
    /// The torch runner for the torch baseline kinds, or why there is none.
    torch: Result<TorchRunner, String>,
    /// Architecture, NVRTC and header identity of CUDA compiles (see
    /// [`super::compile_identity`]).
    identity: String,
}

impl CudaBackend {
    /// The backend over these lanes (lane `i` is `lanes[i]`), whose compiles have this
    /// identity ([`super::compile_identity`]).
    pub fn new(
        cfg: SandboxConfig,
        lanes: Vec<GpuLane>,
        status: BackendStatus,
        torch: Result<TorchRunner, String>,
        identity: String,
    ) -> CudaBackend {
        CudaBackend {
            cfg,
            lanes,
            status,
            torch,
            identity,
        }
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn peaks(&self) -> (f64, f64) {
        CUDA_PEAKS
    }

    fn status(&self) -> BackendStatus {
        self.status.clone()
    }

    fn lanes(&self) -> usize {
        self.lanes.len().max(1)
    }

    fn lane_label(&self, lane: usize) -> String {
        self.lanes
            .get(lane)
            .map_or_else(|| format!("gpu{lane}"), |l| l.uuid.clone())
    }

    fn lane_worker(&self, lane: usize) -> Option<WarmWorkerStats> {
        let l = self.lanes.get(lane)?;
        Some(*l.stats.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn compile(
        &self,
        problem: &ProblemSpec,
        candidate: &Candidate,
    ) -> Result<CompileOutcome, BackendError> {
        compile_in_jail(&self.cfg, problem, candidate)
    }

    fn compile_identity(&self, language: kiln_types::Language) -> String {
        match (language, &self.cfg.triton) {
            (kiln_types::Language::Triton, Some(t)) => {
                format!("triton {} for {}", t.version, self.cfg.cuda_arch)
            }
            (kiln_types::Language::Triton, None) => {
                format!("triton none for {}", self.cfg.cuda_arch)
            }
            (l, _) if l.is_hosted() => match &self.cfg.hosted {
                Some(h) => format!("{}; hosted {}", self.identity, h.build_identity()),
                None => self.identity.clone(),
            },
            _ => self.identity.clone(),
        }
    }

    fn evaluate(
        &self,
        lane: usize,
        problem: &ProblemSpec,
        reference: &[u8],
        candidate: &Candidate,
        artifact: &[u8],
        plan: &EvalPlan,
    ) -> Result<Evaluation, BackendError> {
        let l = self
            .lanes
            .get(lane)
            .ok_or_else(|| BackendError(format!("no GPU lane {lane}")))?;
        let mut worker = l.worker.lock().unwrap_or_else(|p| p.into_inner());
        // A problem whose only reference is PyTorch: the lane's runner answers the worker.
        let mut runner = match problem.reference.kernel(BackendKind::Cuda) {
            Some(_) => None,
            None => Some(
                l.torch
                    .as_ref()
                    .map_err(|why| {
                        BackendError(format!(
                            "problem {} has a torch reference and this lane has no runner: {why}",
                            problem.name
                        ))
                    })?
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()),
            ),
        };
        let outcome = l.clocks.around(|| {
            worker.evaluate(
                problem,
                reference,
                candidate,
                artifact,
                plan,
                runner.as_deref_mut(),
            )
        });
        drop(runner);
        *l.stats.lock().unwrap_or_else(|p| p.into_inner()) = worker.stats();
        drop(worker);
        let mut e = outcome
            .map_err(|e| BackendError(format!("clock policy on {}: {e}", l.uuid)))?
            .map_err(|e| BackendError(e.to_string()))?;
        if let Some(t) = e.telemetry.as_mut().and_then(|t| t.as_object_mut()) {
            t.insert("lane".into(), json!(lane));
            if let Some(gpu) = t.get_mut("gpu").and_then(|g| g.as_object_mut()) {
                gpu.insert("clock_policy".into(), json!(l.clocks.describe()));
            }
        }
        Ok(e)
    }

    fn baselines(
        &self,
        lane: usize,
        problem: &ProblemSpec,
        reference: &[u8],
        plan: &EvalPlan,
    ) -> Result<Vec<kiln_types::BaselineResult>, BackendError> {
        let l = self
            .lanes
            .get(lane)
            .ok_or_else(|| BackendError(format!("no GPU lane {lane}")))?;
        let cfg = lane_config(&self.cfg, &l.uuid);
        let torch = match &self.torch {
            Ok(h) => TorchSource::Helper(h),
            Err(why) => TorchSource::Off(why.clone()),
        };
        l.clocks
            .around(|| kiln_sandbox::measure_baselines(&cfg, problem, reference, plan, torch))
            .map_err(|e| BackendError(format!("clock policy on {}: {e}", l.uuid)))?
            .map_err(|e| BackendError(e.to_string()))
    }
}

/// A lane's sandbox settings: `cfg` pointed at the GPU with `uuid`.
fn lane_config(cfg: &SandboxConfig, uuid: &str) -> SandboxConfig {
    let mut c = cfg.clone();
    if uuid.starts_with("GPU-") || uuid.starts_with("MIG-") {
        c.gpu_uuid = Some(uuid.to_string());
        c.gpu_minor = kiln_sandbox::engine::cuda::setup::minor_number(uuid);
    }
    c
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc::{Receiver, Sender, channel};
    use std::time::Duration;

    use kiln_sandbox::kiln_gpu::FakeNvml;
    use kiln_types::{TimingStats, Verdict};

    use super::*;
    use crate::gpu::clocks::{self, SharedControl};
    use crate::store::{sample_spec, sqlite_temp};

    const PATIENCE: Duration = Duration::from_secs(30);

    /// A lane's worker as the warm worker behaves: started on first use, retired after a
    /// fault (the next evaluation starts a fresh one). With a gate, each evaluation says
    /// it has begun and waits to be let go.
    struct FakeWorker {
        lane: usize,
        warm: bool,
        stats: WarmWorkerStats,
        gate: Option<(Sender<()>, Receiver<()>)>,
    }

    impl LaneWorker for FakeWorker {
        fn evaluate(
            &mut self,
            _problem: &ProblemSpec,
            _reference: &[u8],
            candidate: &Candidate,
            _artifact: &[u8],
            _plan: &EvalPlan,
            _runner: Option<&mut ReferenceRunner>,
        ) -> Result<Evaluation, SandboxError> {
            if !self.warm {
                self.stats.workers_started += 1;
                self.warm = true;
            }
            self.stats.evaluations += 1;
            if let Some((begun, go)) = &self.gate {
                begun
                    .send(())
                    .map_err(|e| SandboxError::Worker(e.to_string()))?;
                go.recv_timeout(PATIENCE)
                    .map_err(|e| SandboxError::Worker(e.to_string()))?;
            }
            let uuid = format!("GPU-fake-{}", self.lane);
            let mut e = if candidate.source.contains("FAULT") {
                self.warm = false;
                Evaluation::early(
                    Verdict::RuntimeFault,
                    BackendKind::Cuda,
                    "CUDA_ERROR_ILLEGAL_ADDRESS",
                )
            } else {
                let mut e = Evaluation::early(Verdict::Ok, BackendKind::Cuda, "ok");
                e.timing = Some(TimingStats {
                    median_us: 10.0,
                    ..TimingStats::default()
                });
                e
            };
            e.telemetry = Some(json!({"device": {"uuid": uuid}, "gpu": {}}));
            Ok(e)
        }

        fn stats(&self) -> WarmWorkerStats {
            self.stats
        }
    }

    fn cuda_candidate(source: &str) -> Candidate {
        serde_json::from_value(json!({
            "problem": "p", "language": "cuda", "source": source,
            "launches": [{"kernel": "k", "grid": [1, 1, 1], "block": [32, 1, 1], "args": []}],
        }))
        .expect("candidate")
    }

    #[test]
    fn a_fault_on_one_lane_replaces_that_lanes_worker_alone_while_the_other_is_timing() {
        let (dir, store) = sqlite_temp();
        let store = Arc::new(store);
        let (begun_tx, begun) = channel();
        let (go, go_rx) = channel();
        let fakes = [FakeNvml::default(), FakeNvml::default()];
        let mut gate = Some((begun_tx, go_rx));
        let lanes = (0..2)
            .map(|lane| {
                let ctl: SharedControl = Arc::new(Mutex::new(Box::new(fakes[lane].clone())));
                let uuid = format!("GPU-fake-{lane}");
                let worker = FakeWorker {
                    lane,
                    warm: false,
                    stats: WarmWorkerStats::default(),
                    gate: if lane == 0 { gate.take() } else { None },
                };
                let policy = clocks::policy("lock", 0);
                GpuLane::new(
                    &uuid,
                    Box::new(worker),
                    LaneClocks::new(policy, &uuid, ctl, store.clone()),
                    Err("no torch runner in this test".into()),
                )
            })
            .collect();
        let status = BackendStatus {
            name: BackendKind::Cuda,
            usable: true,
            detail: "fake".into(),
        };
        let backend = CudaBackend::new(
            SandboxConfig::new(dir.path()),
            lanes,
            status,
            Err("no torch runner in this test".into()),
            String::new(),
        );
        // A cuda reference kernel (a torch-only reference would need the lane's runner).
        let mut problem = sample_spec("p");
        problem.reference.cuda = problem.reference.host.clone();
        let plan = EvalPlan::default();
        let log = |lane: usize| fakes[lane].log.lock().expect("log").clone();

        std::thread::scope(|scope| {
            // Lane 0 times an honest candidate and is held mid-evaluation.
            let timing = scope.spawn(|| {
                backend.evaluate(0, &problem, b"ref", &cuda_candidate("honest"), b"a", &plan)
            });
            begun.recv_timeout(PATIENCE).expect("lane 0 began");
            assert_eq!(log(0), ["nvml:lock base"], "lane 0's clock window is open");
            let lane0_before = backend.lane_worker(0);

            // Meanwhile a red-team kernel faults on lane 1, and lane 1 serves again.
            let (done_tx, done) = channel();
            let (backend, problem, plan) = (&backend, &problem, &plan);
            scope.spawn(move || {
                let fault =
                    backend.evaluate(1, problem, b"ref", &cuda_candidate("FAULT"), b"a", plan);
                let next =
                    backend.evaluate(1, problem, b"ref", &cuda_candidate("honest"), b"a", plan);
                done_tx.send((fault, next)).expect("send");
            });
            let (fault, next) = done
                .recv_timeout(PATIENCE)
                .expect("lane 1 did not wait for lane 0");
            assert_eq!(fault.expect("fault").verdict, Verdict::RuntimeFault);
            assert_eq!(next.expect("next").verdict, Verdict::Ok);
            let lane1 = backend.lane_worker(1).expect("stats");
            assert_eq!((lane1.workers_started, lane1.evaluations), (2, 2));
            assert_eq!(
                log(1),
                [
                    "nvml:lock base",
                    "nvml:reset",
                    "nvml:lock base",
                    "nvml:reset"
                ]
            );
            // Lane 0 untouched: its clocks still locked, its worker's counters as they were.
            assert_eq!(log(0), ["nvml:lock base"]);
            assert_eq!(backend.lane_worker(0), lane0_before);

            go.send(()).expect("let lane 0 go");
            let e = timing.join().expect("thread").expect("lane 0");
            assert_eq!(e.verdict, Verdict::Ok);
            let t = e.telemetry.expect("telemetry");
            assert_eq!(t["lane"], 0);
            assert_eq!(t["device"]["uuid"], "GPU-fake-0");
            assert_eq!(t["gpu"]["clock_policy"], "lock base");
        });
        assert_eq!(log(0), ["nvml:lock base", "nvml:reset"]);
        let lane0 = backend.lane_worker(0).expect("stats");
        assert_eq!((lane0.workers_started, lane0.evaluations), (1, 1));
        assert_eq!(backend.lane_label(1), "GPU-fake-1");
        assert!(backend.lane_worker(2).is_none());
    }
}

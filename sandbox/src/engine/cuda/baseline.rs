//! The worker's side of `Request::Baselines`: the GPU worker's baseline kinds
//! ([`BaselineKind::runner`] = `GpuWorker`: the problem's trusted reference, cuBLAS and
//! cuDNN) timed on this GPU by the baselines' one driver ([`crate::baselines::driver`]).
//!
//! Inputs are drawn on the GPU from the plan's seed exactly as for a candidate (`Gpu::fill`
//! with `tensor_seed(seed, "baseline", SET, TENSOR)`), the reference runs once and its
//! outputs are kept as the answer every library output is checked against. Then each is
//! timed by the baselines' one driver (`crate::baselines::driver`: the first run
//! discarded, `warmup` runs, fresh inputs for every sample as for a candidate, the stop
//! rule), its samples L2-cold (`Gpu::time_sample_with`: flush, blocking kernel, events and
//! kernel records, wait with a deadline, context synchronize); the time is the same figure
//! a candidate of the problem is ranked by, see `super::timer_log`:
//!
//! - `reference`: the problem's cuda reference kernel;
//! - `cublas-fp32`, `cublas-tf32` (f32 matmul) or `cublas-fp16` (f16 matmul);
//! - `cudnn-fp32` and `cudnn-tf32`: convolution (+ bias, ReLU, max pool), every forward
//!   algorithm cuDNN offers tried, checked and timed briefly, the fastest timed in full.
//!
//! A strict-fp32 library output outside the problem's tolerance is `failed` and not timed;
//! a TF32 or fp16 one is timed and its mismatches reported. A missing library is
//! `unavailable` with its reason; a panic inside the bindings (a missing symbol) is caught
//! and reported as `failed`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use kiln_gpu::baseline::cublas::{Cublas, GemmMath};
use kiln_gpu::baseline::cudnn::{self, ConvMath, ConvOp, ConvShape, Cudnn};
use kiln_gpu::launch::BufferArg;
use kiln_gpu::timing::{SampleConfig, default_blocker_ns};
use kiln_gpu::{DeviceBuffer, Gpu, GpuError};
use kiln_types::baseline::{BaselineKind, BaselineOp, BaselineResult, BaselineStatus, precision};
use kiln_types::{Dtype, EvalPlan, ProblemSpec, Role, TimingPlan, TimingStats};

use super::timer_log::TimerLog;
use crate::baselines::driver::{self, Sampler};
use crate::engine::contract::{compare, data};

/// Launches a library call is budgeted for when sizing the blocking kernel.
const LIBRARY_LAUNCHES: usize = 8;
/// Largest cuDNN workspace tried, bytes.
const MAX_WORKSPACE: usize = 8 << 30;
/// Samples per cuDNN algorithm while choosing.
const PICK_SAMPLES: usize = 5;

/// What the worker hands to [`run`].
pub struct Job<'a> {
    /// The problem.
    pub problem: &'a ProblemSpec,
    /// Seed, run timeout and stop rule.
    pub plan: &'a EvalPlan,
    /// Kinds asked for; those the GPU worker does not run are ignored here.
    pub kinds: &'a [BaselineKind],
    /// The compiled cuda reference.
    pub reference_artifact: &'a [u8],
}

struct Tensor {
    name: String,
    shape: Vec<u64>,
    dtype: Dtype,
    elems: u64,
    role: Role,
    init: kiln_types::Init,
    buf: DeviceBuffer,
}

/// The GPU state shared by every baseline of one request.
struct Bench {
    tensors: Vec<Tensor>,
    want: Vec<(String, Vec<u8>)>,
    timeout: Duration,
    tolerance: kiln_types::Tolerance,
    seed: u64,
    timing: TimingPlan,
    /// The figure candidates of the problem are ranked by.
    figure: kiln_types::TimingFigure,
    gpu: Gpu,
}

/// Runs the reference and every GPU-worker kind in `kinds` the problem names. `Err` only
/// when nothing could be measured (no GPU, a broken reference).
pub fn run(job: Job) -> Result<Vec<BaselineResult>, String> {
    let problem = job.problem;
    let ref_ks = problem
        .reference
        .kernel(kiln_types::BackendKind::Cuda)
        .ok_or_else(|| format!("problem {} has no cuda reference", problem.name))?;
    super::context::start_kernel_tracer();
    let gpu = Gpu::open(0).map_err(|e| format!("cannot open the GPU: {e}"))?;
    let mut tensors = Vec::new();
    for t in &problem.tensors {
        let buf = gpu
            .alloc(t.bytes() as usize)
            .map_err(|e| format!("allocating tensor {}: {e}", t.name))?;
        tensors.push(Tensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            dtype: t.dtype,
            elems: t.elems(),
            role: t.role,
            init: t.init,
            buf,
        });
    }
    let mut args: std::collections::BTreeMap<String, BufferArg> = tensors
        .iter()
        .map(|t| {
            let a = BufferArg {
                ptr: t.buf.ptr(),
                dtype: t.dtype,
                elems: t.elems,
            };
            (t.name.clone(), a)
        })
        .collect();
    let mut scratch = Vec::new();
    for s in &ref_ks.scratch {
        let buf = gpu
            .alloc((s.elems * s.dtype.size()) as usize)
            .map_err(|e| format!("reference scratch: {e}"))?;
        args.insert(
            s.name.clone(),
            BufferArg {
                ptr: buf.ptr(),
                dtype: s.dtype,
                elems: s.elems,
            },
        );
        scratch.push(buf);
    }
    let names: Vec<&str> = ref_ks.launches.iter().map(|l| l.kernel.as_str()).collect();
    let artifact = kiln_gpu::artifact::Artifact::decode(job.reference_artifact)
        .map_err(|e| format!("the reference's artifact: {e}"))?;
    let module = gpu
        .load_artifact(&artifact, &names)
        .map_err(|e| format!("loading the reference module: {e}"))?;
    let plan = gpu
        .check_launches(&module, &ref_ks.launches, &args)
        .map_err(|e| format!("the reference's launch plan: {e}"))?;
    let mut bench = Bench {
        tensors,
        want: Vec::new(),
        timeout: Duration::from_millis(job.plan.run_timeout_ms.max(1)).max(Duration::from_secs(10)),
        tolerance: problem.tolerance,
        seed: job.plan.seed,
        timing: job.plan.timing.clone(),
        figure: problem.timing_figure.unwrap_or(job.plan.timing.figure),
        gpu,
    };
    let infra = |what: &str, e: GpuError| format!("{what}: {e}");
    bench.fill(0).map_err(|e| infra("drawing inputs", e))?;
    bench.poison().map_err(|e| infra("poisoning outputs", e))?;
    bench
        .gpu
        .run_launches(&module, &plan, bench.timeout)
        .map_err(|e| infra("running the reference", e))?;
    bench.want = bench
        .outputs()
        .map_err(|e| infra("downloading the reference's outputs", e))?;

    let mut results = Vec::new();
    let cfg = SampleConfig::contract(&plan, bench.timeout);
    let reference = bench.time(cfg, Some(plan.launches.len()), &mut || {
        bench_launches(&bench.gpu, &module, &plan)
    });
    results.push(match reference {
        Ok(t) => measured(
            BaselineKind::Reference,
            precision::REFERENCE,
            t,
            "the problem's cuda reference kernel",
        ),
        Err(e) => failed(BaselineKind::Reference, precision::REFERENCE, e.to_string()),
    });
    for &kind in job.kinds {
        let Some(op) = kind.table().and_then(|t| problem.baseline.get(t)) else {
            continue;
        };
        if bench.gpu.poisoned().is_some() {
            break;
        }
        let out = catch_unwind(AssertUnwindSafe(|| match (kind, op) {
            (BaselineKind::Cublas, BaselineOp::Matmul { a, b, c }) => bench.cublas(a, b, c),
            (BaselineKind::Cudnn, BaselineOp::Conv2d { .. }) => bench.cudnn(op),
            _ => Vec::new(),
        }));
        match out {
            Ok(mut r) => results.append(&mut r),
            Err(p) => results.push(failed(
                kind,
                "",
                format!(
                    "the {} bindings panicked: {}",
                    kind.library(),
                    panic_text(&p)
                ),
            )),
        }
    }
    Ok(results)
}

fn bench_launches(
    gpu: &Gpu,
    module: &kiln_gpu::Module,
    plan: &kiln_gpu::CheckedLaunches,
) -> Result<(), GpuError> {
    gpu.enqueue_launches(module, plan)
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

fn measured(kind: BaselineKind, prec: &str, t: TimingStats, detail: &str) -> BaselineResult {
    BaselineResult {
        timing: Some(t),
        detail: detail.to_string(),
        ..kind.not_measured(prec, BaselineStatus::Measured, "")
    }
}

fn failed(kind: BaselineKind, prec: &str, detail: String) -> BaselineResult {
    kind.not_measured(prec, BaselineStatus::Failed, detail)
}

/// A library error's status (`unavailable` for a missing library, else `failed`) and text.
fn status_of(e: GpuError) -> (BaselineStatus, String) {
    match e {
        GpuError::Unavailable(u) => (BaselineStatus::Unavailable, u.reason),
        other => (BaselineStatus::Failed, other.to_string()),
    }
}

/// A library error as a result.
fn from_error(kind: BaselineKind, prec: &str, e: GpuError) -> BaselineResult {
    let (status, detail) = status_of(e);
    kind.not_measured(prec, status, detail)
}

impl Bench {
    fn tensor(&self, name: &str) -> Result<&Tensor, GpuError> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| GpuError::Usage(format!("no tensor {name}")))
    }

    /// Draws input set `set` on the GPU, as the contract does for a candidate.
    fn fill(&self, set: u64) -> Result<(), GpuError> {
        for t in self.tensors.iter().filter(|t| t.role == Role::Input) {
            let seed = data::tensor_seed(self.seed, "baseline", set, &t.name);
            self.gpu.fill(&t.buf, t.dtype, t.elems, &t.init, seed)?;
        }
        self.gpu.synchronize()
    }

    fn poison(&self) -> Result<(), GpuError> {
        for t in self.tensors.iter().filter(|t| t.role == Role::Output) {
            self.gpu.poison(&t.buf, t.dtype, t.elems)?;
        }
        self.gpu.synchronize()
    }

    fn outputs(&self) -> Result<Vec<(String, Vec<u8>)>, GpuError> {
        self.tensors
            .iter()
            .filter(|t| t.role == Role::Output)
            .map(|t| {
                Ok((
                    t.name.clone(),
                    self.gpu.download_vec::<u8>(&t.buf, t.buf.bytes())?,
                ))
            })
            .collect()
    }

    /// Runs `enqueue` once on input set 0 with poisoned outputs and compares with the
    /// reference: (worst rel L2, total mismatches).
    fn check(
        &self,
        enqueue: &mut dyn FnMut() -> Result<(), GpuError>,
    ) -> Result<(f64, u64), GpuError> {
        self.fill(0)?;
        self.poison()?;
        self.gpu.run_with(self.timeout, enqueue)?;
        let got = self.outputs()?;
        let (mut rel, mut bad) = (0.0f64, 0u64);
        for ((name, g), (_, w)) in got.iter().zip(&self.want) {
            let dtype = self.tensor(name)?.dtype;
            let m = compare::metrics(name, g, w, dtype, self.tolerance);
            rel = rel.max(if m.rel_l2.is_finite() {
                m.rel_l2
            } else {
                f64::INFINITY
            });
            bad += m.mismatches + m.nonfinite_mismatches;
        }
        Ok((rel, bad))
    }

    /// `enqueue` (`launches` launches when known) timed by the baselines' one driver
    /// ([`crate::baselines::driver`]): L2-cold samples, fresh input sets, the stop rule, the
    /// figure a candidate is ranked by, as for a candidate.
    fn time(
        &self,
        cfg: SampleConfig,
        launches: Option<usize>,
        enqueue: &mut dyn FnMut() -> Result<(), GpuError>,
    ) -> Result<TimingStats, GpuError> {
        struct On<'b, 'e> {
            bench: &'b Bench,
            cfg: SampleConfig,
            launches: Option<usize>,
            log: TimerLog,
            enqueue: &'e mut dyn FnMut() -> Result<(), GpuError>,
        }
        impl Sampler for On<'_, '_> {
            type Error = GpuError;
            fn run(&mut self) -> Result<(), GpuError> {
                self.bench.gpu.run_with(self.bench.timeout, self.enqueue)
            }
            fn fresh_inputs(&mut self, set: u64) -> Result<(), GpuError> {
                self.bench.fill(set)
            }
            fn sample(&mut self) -> Result<f64, GpuError> {
                let t = self
                    .bench
                    .gpu
                    .time_sample_with(&self.cfg, self.launches, self.enqueue)?;
                Ok(self.log.record(&t))
            }
        }
        let mut on = On {
            bench: self,
            cfg,
            launches,
            log: TimerLog::new(
                self.figure,
                kiln_gpu::cupti::status(),
                launches.unwrap_or(0),
            ),
            enqueue,
        };
        let mut s = driver::measure(&self.timing, &mut on)?;
        s.timer = on.log.evidence(&[]);
        Ok(s)
    }

    /// A few L2-cold samples; their median in µs (choosing among algorithms).
    fn quick(
        &self,
        cfg: SampleConfig,
        enqueue: &mut dyn FnMut() -> Result<(), GpuError>,
    ) -> Result<f64, GpuError> {
        self.gpu.run_with(self.timeout, enqueue)?;
        let mut log = TimerLog::new(self.figure, kiln_gpu::cupti::status(), 0);
        let mut v = Vec::new();
        for _ in 0..PICK_SAMPLES {
            let t = self.gpu.time_sample_with(&cfg, None, enqueue)?;
            v.push(log.record(&t));
        }
        Ok(crate::engine::contract::timing::median(&mut v))
    }

    fn library_cfg(&self) -> SampleConfig {
        SampleConfig {
            flush_l2: true,
            blocker_ns: Some(default_blocker_ns(LIBRARY_LAUNCHES)),
            timeout: self.timeout,
        }
    }

    /// cuBLAS: strict fp32 and TF32 for f32 operands, fp16 (fp32 accumulation) for f16.
    fn cublas(&self, a: &str, b: &str, c: &str) -> Vec<BaselineResult> {
        let dtype = self.tensor(a).map(|t| t.dtype).unwrap_or(Dtype::F32);
        const KIND: BaselineKind = BaselineKind::Cublas;
        let variants: &[(&str, GemmMath)] = match dtype {
            Dtype::F32 => &[
                (precision::FP32, GemmMath::Fp32),
                (precision::TF32, GemmMath::Tf32),
            ],
            Dtype::F16 => &[(precision::FP16, GemmMath::Fp16)],
            _ => return Vec::new(),
        };
        let handle = match Cublas::new(&self.gpu) {
            Ok(h) => h,
            Err(e) => {
                let (status, detail) = status_of(e);
                return variants
                    .iter()
                    .map(|(p, _)| KIND.not_measured(p, status, detail.clone()))
                    .collect();
            }
        };
        let shape = |n: &str| self.problem_shape(n);
        let (Some(sa), Some(sb)) = (shape(a), shape(b)) else {
            return Vec::new();
        };
        let dims = (sa[0] as i32, sb[1] as i32, sa[1] as i32);
        let version = handle.version();
        let mut out = Vec::new();
        for &(prec, math) in variants {
            let r = (|| -> Result<BaselineResult, GpuError> {
                let (ta, tb, tc) = (self.tensor(a)?, self.tensor(b)?, self.tensor(c)?);
                let mut go = || handle.gemm(&self.gpu, math, dims, &ta.buf, &tb.buf, &tc.buf);
                let (rel, bad) = self.check(&mut go)?;
                let mut r = KIND.not_measured(prec, BaselineStatus::Measured, "");
                r.rel_l2 = Some(rel);
                r.mismatches = Some(bad);
                if bad > 0 && math == GemmMath::Fp32 {
                    r.status = BaselineStatus::Failed;
                    r.detail = format!(
                        "strict fp32 output has {bad} elements outside the problem's tolerance (rel L2 {rel:.2e}); not timed"
                    );
                    return Ok(r);
                }
                r.timing = Some(self.time(self.library_cfg(), None, &mut go)?);
                r.detail = format!(
                    "{} (cuBLAS {version})",
                    match math {
                        GemmMath::Fp32 => "cublasSgemm, CUBLAS_DEFAULT_MATH",
                        GemmMath::Tf32 => "cublasSgemm, CUBLAS_TF32_TENSOR_OP_MATH",
                        GemmMath::Fp16 => "cublasGemmEx f16, CUBLAS_COMPUTE_32F",
                    }
                );
                Ok(r)
            })();
            out.push(r.unwrap_or_else(|e| from_error(KIND, prec, e)));
        }
        out
    }

    fn problem_shape(&self, name: &str) -> Option<Vec<u64>> {
        self.tensor(name).ok().map(|t| t.shape.clone())
    }

    /// cuDNN: strict fp32 (FMA) and TF32-permitted, each with the fastest algorithm.
    fn cudnn(&self, op: &BaselineOp) -> Vec<BaselineResult> {
        let BaselineOp::Conv2d {
            x,
            w,
            b,
            y,
            stride,
            padding,
            relu,
            maxpool,
        } = op
        else {
            return Vec::new();
        };
        const KIND: BaselineKind = BaselineKind::Cudnn;
        let variants = [
            (precision::FP32, ConvMath::Fp32),
            (precision::TF32, ConvMath::Tf32),
        ];
        let dnn = match Cudnn::new(&self.gpu) {
            Ok(h) => h,
            Err(e) => {
                let (status, detail) = status_of(e);
                return variants
                    .iter()
                    .map(|(p, _)| KIND.not_measured(p, status, detail.clone()))
                    .collect();
            }
        };
        let (Some(sx), Some(sw)) = (self.problem_shape(x), self.problem_shape(w)) else {
            return Vec::new();
        };
        let i = |v: &[u64]| [v[0] as i32, v[1] as i32, v[2] as i32, v[3] as i32];
        let shape = ConvShape {
            nchw: i(&sx),
            kcrs: i(&sw),
            stride: *stride as i32,
            padding: *padding as i32,
            bias: b.is_some(),
            relu: *relu,
            maxpool: maxpool.map(|p| (p.kernel as i32, p.stride as i32)),
        };
        let v = dnn.version();
        let version = format!("cuDNN {}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
        let mut out = Vec::new();
        for (prec, math) in variants {
            let r = (|| -> Result<BaselineResult, GpuError> {
                let (tx, tw, ty) = (self.tensor(x)?, self.tensor(w)?, self.tensor(y)?);
                let tb = match b {
                    Some(b) => Some(&self.tensor(b)?.buf),
                    None => None,
                };
                let mut conv = ConvOp::new(&dnn, &self.gpu, shape, math)?;
                let mut tried = Vec::new();
                let mut best: Option<(f64, cudnn::Algo, f64, u64)> = None;
                for algo in cudnn::ALGORITHMS {
                    let an = cudnn::algorithm_name(algo);
                    match conv.workspace_bytes(&dnn, algo) {
                        Ok(ws) if ws > MAX_WORKSPACE => {
                            tried.push(format!("{an}: workspace {} MiB too large", ws >> 20));
                            continue;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tried.push(format!("{an}: {}", short(&e)));
                            continue;
                        }
                    }
                    if let Err(e) = conv.use_algorithm(&dnn, &self.gpu, algo) {
                        tried.push(format!("{an}: {}", short(&e)));
                        continue;
                    }
                    let mut go = || conv.enqueue(&dnn, &self.gpu, &tx.buf, &tw.buf, tb, &ty.buf);
                    let (rel, bad) = match self.check(&mut go) {
                        Ok(c) => c,
                        Err(e) if e.is_poisoning() => return Err(e),
                        Err(e) => {
                            tried.push(format!("{an}: {}", short(&e)));
                            continue;
                        }
                    };
                    if bad > 0 && math == ConvMath::Fp32 {
                        tried.push(format!("{an}: {bad} elements outside tolerance"));
                        continue;
                    }
                    let us = self.quick(self.library_cfg(), &mut go)?;
                    tried.push(format!("{an}: {us:.1} us"));
                    if best.is_none_or(|(b, ..)| us < b) {
                        best = Some((us, algo, rel, bad));
                    }
                }
                let Some((_, algo, rel, bad)) = best else {
                    return Ok(failed(
                        KIND,
                        prec,
                        format!(
                            "no algorithm ran correctly ({}); {version}",
                            tried.join("; ")
                        ),
                    ));
                };
                conv.use_algorithm(&dnn, &self.gpu, algo)?;
                let mut go = || conv.enqueue(&dnn, &self.gpu, &tx.buf, &tw.buf, tb, &ty.buf);
                let t = self.time(self.library_cfg(), None, &mut go)?;
                let mut r = measured(
                    KIND,
                    prec,
                    t,
                    &format!(
                        "{} (fastest of every forward algorithm, each timed L2-cold {PICK_SAMPLES} times: {}); {version}",
                        cudnn::algorithm_name(algo),
                        tried.join("; ")
                    ),
                );
                r.rel_l2 = Some(rel);
                r.mismatches = Some(bad);
                Ok(r)
            })();
            out.push(r.unwrap_or_else(|e| from_error(KIND, prec, e)));
        }
        out
    }
}

fn short(e: &GpuError) -> String {
    match e {
        GpuError::Driver { name, .. } => name.trim_start_matches("CUDNN_STATUS_").to_lowercase(),
        other => other.to_string(),
    }
}

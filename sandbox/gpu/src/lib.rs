//! kiln-gpu: the GPU mechanics that the trusted `kiln-worker` drives.
//!
//! The worker owns the verdict logic; this crate owns the CUDA and NVML calls, so that
//! every `unsafe` block touching the driver lives in one reviewed place.
//!
//! Brief overview:
//! - [`available`] — can CUDA run here? Facts about each device, or the reason it cannot
//!   (never a panic, even with no driver installed).
//! - [`nvrtc`] — compile to a CUBIN (PTX for virtual archs), flags through an allow-list
//!   ([`nvrtc::check_flags`]); [`cxx`] — candidates' CUDA C++ as people write it (toolkit
//!   headers, kiln's stand-ins and prelude, host code refused, kernels by C++ name);
//!   [`artifact`] — the compiled image with its kernel manifest, as stored and shipped.
//! - [`Gpu`] ([`device`]) — one context, one non-default stream, buffers that are scrubbed
//!   when freed, module loading with per-kernel resources and occupancy, L2 flush.
//! - [`launch`] — launch lists checked in full ([`launch::check_launches`], pure) before
//!   anything runs, then enqueued by trusted code.
//! - [`timing`] — timed samples (flush, blocking kernel, events, context sync, and the
//!   work's kernel records), plain KernelBench-style samples, and waiting with a deadline;
//!   sticky faults poison the `Gpu`.
//! - [`cupti`] — kernel durations as the GPU ran them, from CUPTI's activity records, set
//!   up once per process ([`cupti::start`]) or, when it cannot be, the reason; timing then
//!   falls back to events.
//! - [`inputs`] — input tensors generated on the GPU from a seed, output poisoning, and a
//!   keyed GPU-side hash for the input-tamper check.
//! - [`compare`] — output checks on the GPU: error metrics against the reference, poisoned
//!   (unwritten) elements, run-to-run differences, without downloading the outputs.
//! - [`baseline`] — cuBLAS and cuDNN baselines on the worker's stream, timed like candidates.
//! - [`telemetry`] — NVML sampling around a timing window, and the clock policy behind a
//!   trait with a fake for tests.
//!
//! A typical evaluation, sketched (the worker adds the verdict logic):
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! use std::time::Duration;
//! use kiln_gpu::{Gpu, launch::BufferArg, nvrtc, timing::SampleConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let facts = kiln_gpu::available()?;
//! kiln_gpu::cupti::start(&kiln_gpu::cupti::CuptiSetting::Auto); // before the context
//! let gpu = Gpu::open(0)?;
//! let compiled = nvrtc::compile("extern \"C\" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }",
//!                               &facts.devices[0].arch, &[])?;
//! let module = gpu.load_module(&compiled, &["k"])?;
//! let y = gpu.alloc(256 * 4)?;
//! let mut buffers = BTreeMap::new();
//! buffers.insert("y".to_string(), BufferArg { ptr: y.ptr(), dtype: kiln_types::Dtype::F32, elems: 256 });
//! let plan: Vec<kiln_types::Launch> = serde_json::from_str(r#"[{"kernel":"k","block":[256,1,1],"args":["y"]}]"#)?;
//! let checked = gpu.check_launches(&module, &plan, &buffers)?;
//! gpu.run_launches(&module, &checked, Duration::from_secs(5))?;
//! let ms = gpu.time_sample(&module, &checked, &SampleConfig::contract(&checked, Duration::from_secs(5)))?;
//! # let _ = ms; Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod artifact;
pub mod baseline;
pub mod compare;
pub mod cupti;
pub mod cxx;
pub mod device;
pub mod error;
pub mod facts;
pub mod inputs;
pub mod launch;
pub mod nvrtc;
pub mod shareable;
pub mod telemetry;
pub mod timing;

pub use device::{DeviceBuffer, Gpu, ImagePart, KernelInfo, Module, Occupancy, Pod};
pub use error::{Fault, GpuError, Unavailable};
pub use facts::{DeviceFacts, DeviceLimits, GpuFacts, available};
pub use launch::{BufferArg, CheckedLaunches, InvalidLaunch, check_launches};
pub use nvrtc::{CompileError, CompiledModule, ImageKind, compile};
pub use telemetry::{ClockControl, ClockPolicy, FakeNvml, TelemetrySummary};
pub use timing::{SampleConfig, SampleTimes};

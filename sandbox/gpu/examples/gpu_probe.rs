//! gpu_probe: exercises kiln-gpu end to end on a real GPU and prints a compact report.
//!
//! Run with `cargo run --release -p kiln-gpu --example gpu_probe`, or ship the binary
//! (`scripts/build-gpu-bundle.sh`) and run it on a GPU host (`scripts/gpu-check.sh`).
//!
//! Output: `INFO ...` lines with facts and measurements, one `PASS name ...` or
//! `FAIL name ...` line per check, and a final `N passed, M failed` line.
//! Options: `--ordinal N` (default 0, or `KILN_GPU_ORDINAL`), `--json PATH` (write the
//! checks as JSON too).
//!
//! Exit status: 0 all checks passed; 1 some check failed; 2 CUDA is unavailable here (the
//! reason is printed as `UNAVAILABLE <reason>`).
//!
//! Faults poison a process's CUDA context for good, so each fault check runs in a child
//! process (`gpu_probe --child <kind>`), exactly as kiln-worker is replaced after a fault;
//! the parent then shows that a fresh context (its own) still evaluates correctly. The
//! probe never changes GPU settings: NVML is only read.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use kiln_gpu::device::Gpu;
use kiln_gpu::inputs::{host_hash, host_value, poison_pattern};
use kiln_gpu::launch::{BufferArg, CheckedLaunches};
use kiln_gpu::telemetry::{DEFAULT_INTERVAL, NvmlSource, Sampler, init_nvml};
use kiln_gpu::timing::{SampleConfig, stats};
use kiln_gpu::{DeviceBuffer, GpuError, ImageKind, Module, compile};
use kiln_types::{Dtype, Init, Launch};

const VADD: &str = r#"
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"#;

const SOFTMAX: &str = r#"
#ifndef BLOCK
#define BLOCK 256
#endif
extern "C" __global__ void softmax_rows(const float* x, float* y, int cols) {
    __shared__ float red[BLOCK];
    const float* row = x + (unsigned long long)blockIdx.x * cols;
    float* out = y + (unsigned long long)blockIdx.x * cols;
    float m = __int_as_float(0xff800000);
    for (int c = threadIdx.x; c < cols; c += BLOCK) m = fmaxf(m, row[c]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    m = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += BLOCK) sum += expf(row[c] - m);
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    sum = red[0];
    for (int c = threadIdx.x; c < cols; c += BLOCK) out[c] = expf(row[c] - m) / sum;
}
"#;

const SAXPY_AND_DYN: &str = r#"
extern "C" __global__ void saxpy(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void dyn_smem_sum(const float* x, float* out, int n) {
    extern __shared__ float buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < n; ++i) s += buf[i];
        out[0] = s;
    }
}
"#;

const FAULTS: &str = r#"
extern "C" __global__ void oob_write(float* p) {
    p[(1ull << 40) / sizeof(float) + threadIdx.x] = 1.0f;
}
extern "C" __global__ void misaligned(float* p) {
    float* q = (float*)((char*)p + 1);
    q[threadIdx.x] = 1.0f;
}
extern "C" __global__ void trap_kernel(float* p) {
    if (threadIdx.x == 0) __trap();
    p[threadIdx.x] = 1.0f;
}
extern "C" __global__ void spin_forever(volatile int* flag) {
    while (*flag == 0) { __nanosleep(1000); }
}
"#;

const FP16_HEADER: &str = r#"
#include <cuda_fp16.h>
extern "C" __global__ void h(__half* x) { x[0] = __float2half(1.0f); }
"#;

const CHILD_KINDS: &[&str] = &["illegal_address", "misaligned", "trap", "infinite_loop"];

struct Report {
    checks: Vec<(String, Option<bool>, String)>,
}

impl Report {
    fn info(&mut self, name: &str, detail: impl Into<String>) {
        let detail = detail.into();
        println!("INFO {name} {detail}");
        self.checks.push((name.to_string(), None, detail));
    }

    fn check(&mut self, name: &str, f: impl FnOnce() -> Result<String, String>) -> bool {
        let started = Instant::now();
        let (pass, detail) = match f() {
            Ok(d) => (true, d),
            Err(d) => (false, d),
        };
        let detail = format!("{detail} ({:.0} ms)", started.elapsed().as_secs_f64() * 1e3);
        println!("{} {name} {detail}", if pass { "PASS" } else { "FAIL" });
        self.checks.push((name.to_string(), Some(pass), detail));
        pass
    }
}

fn e2s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn launches(json: &str) -> Vec<Launch> {
    serde_json::from_str(json).expect("probe launch plans are valid JSON")
}

fn buf_arg(b: &DeviceBuffer, dtype: Dtype, elems: u64) -> BufferArg {
    BufferArg {
        ptr: b.ptr(),
        dtype,
        elems,
    }
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((h >> 10) & 0x1f);
    let m = f32::from(h & 0x3ff);
    match e {
        0 => sign * m * 2f32.powi(-24),
        31 => {
            if m == 0.0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            }
        }
        _ => sign * (1.0 + m / 1024.0) * 2f32.powi(e - 15),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let mut ordinal: u32 = std::env::var("KILN_GPU_ORDINAL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut json_path = None;
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--child" => {
                let kind = args.get(i + 1).cloned().unwrap_or_default();
                let ord = args
                    .get(i + 2)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(ordinal);
                child(&kind, ord);
            }
            "--ordinal" => {
                ordinal = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(0);
                i += 1;
            }
            "--json" => {
                json_path = args.get(i + 1).cloned();
                i += 1;
            }
            other => {
                eprintln!(
                    "unknown argument {other:?}; usage: gpu_probe [--ordinal N] [--json PATH]"
                );
                return ExitCode::from(64);
            }
        }
        i += 1;
    }
    println!("kiln-gpu-probe {}", env!("CARGO_PKG_VERSION"));
    let facts = match kiln_gpu::available() {
        Ok(f) => f,
        Err(e) => {
            println!("UNAVAILABLE {}", e.reason);
            println!("0 passed, 0 failed (cuda unavailable)");
            return ExitCode::from(2);
        }
    };
    let mut r = Report { checks: Vec::new() };
    r.info(
        "available",
        format!(
            "driver={} nvrtc={}.{} devices={}",
            facts.driver_version,
            facts.nvrtc_version.0,
            facts.nvrtc_version.1,
            facts.devices.len()
        ),
    );
    for d in &facts.devices {
        r.info(
            "device",
            format!(
                "ordinal={} name={:?} uuid={} arch={} sms={} l2_bytes={} mem_bytes={} smem_optin={} max_grid={:?}",
                d.ordinal,
                d.name,
                d.uuid,
                d.arch,
                d.limits.sm_count,
                d.limits.l2_bytes,
                d.total_mem_bytes,
                d.limits.max_shared_per_block_optin,
                d.limits.max_grid_dim
            ),
        );
    }
    run_parent(&mut r, ordinal);
    let passed = r.checks.iter().filter(|c| c.1 == Some(true)).count();
    let failed = r.checks.iter().filter(|c| c.1 == Some(false)).count();
    println!("{passed} passed, {failed} failed");
    if let Some(path) = json_path {
        let v: Vec<serde_json::Value> = r
            .checks
            .iter()
            .map(|(n, p, d)| serde_json::json!({"name": n, "pass": p, "detail": d}))
            .collect();
        let text = serde_json::to_string_pretty(&v).unwrap_or_default();
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("could not write {path}: {e}");
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Everything the parent process checks, in order.
fn run_parent(r: &mut Report, ordinal: u32) {
    // The kernel tracer comes up before the context (KILN_CUPTI=off turns it off).
    let tracer = kiln_gpu::cupti::start(&kiln_gpu::cupti::CuptiSetting::from_env());
    r.info("cupti", format!("{tracer:?}"));
    let t = Instant::now();
    let gpu = match Gpu::open(ordinal) {
        Ok(g) => g,
        Err(e) => {
            r.check("open", || Err(e2s(e)));
            return;
        }
    };
    r.check("open", || {
        Ok(format!(
            "ordinal={ordinal} trusted kernels compiled and loaded in {:.0} ms, flush buffer {} MiB",
            t.elapsed().as_secs_f64() * 1e3,
            (gpu.limits().l2_bytes * 2) >> 20
        ))
    });
    let arch = gpu.facts().arch.clone();

    // --- NVRTC -------------------------------------------------------------------------
    let mut vadd_c = None;
    r.check("compile_vector_add", || {
        let m = compile(VADD, &arch, &[]).map_err(e2s)?;
        let d = format!(
            "kind={:?} bytes={} log_bytes={} compile_ms={:.1} options={:?}",
            m.kind,
            m.image.len(),
            m.log.len(),
            m.duration_ms,
            m.options
        );
        let ok = m.kind == ImageKind::Cubin && m.image.starts_with(b"\x7fELF");
        vadd_c = Some(m);
        if ok {
            Ok(d)
        } else {
            Err(format!("expected an ELF CUBIN: {d}"))
        }
    });
    let mut softmax_c = None;
    r.check("compile_softmax", || {
        let flags: Vec<String> = ["-O3", "-std=c++17", "-DBLOCK=256"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let m = compile(SOFTMAX, &arch, &flags).map_err(e2s)?;
        let d = format!(
            "kind={:?} bytes={} log={:?}",
            m.kind,
            m.image.len(),
            m.log.trim()
        );
        softmax_c = Some(m);
        Ok(d)
    });
    let mut misc_c = None;
    r.check("compile_saxpy_dyn_smem", || {
        let m = compile(SAXPY_AND_DYN, &arch, &[]).map_err(e2s)?;
        let d = format!("kind={:?} bytes={}", m.kind, m.image.len());
        misc_c = Some(m);
        Ok(d)
    });
    r.check("nvrtc_all_allowed_flags", || {
        let flags: Vec<String> = [
            "--use_fast_math",
            "-O3",
            "--maxrregcount=64",
            "--extra-device-vectorization",
            "-lineinfo",
            "--ftz=true",
            "--prec-div=false",
            "--prec-sqrt=false",
            "--fmad=true",
            "-std=c++20",
            "-DKNOB=4",
            "--restrict",
            "-w",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let m = compile(VADD, &arch, &flags).map_err(e2s)?;
        Ok(format!("nvrtc accepted {:?}", m.options))
    });
    r.check("nvrtc_compile_error_keeps_log", || {
        match compile(
            "extern \"C\" __global__ void k(float* x) { x[0] = undefined_thing; }",
            &arch,
            &[],
        ) {
            Err(kiln_gpu::CompileError::Failed { log }) if log.contains("undefined_thing") => {
                Ok(format!("log: {:?}", log.lines().next().unwrap_or("")))
            }
            Err(e) => Err(format!("wrong error: {e}")),
            Ok(_) => Err("a broken kernel compiled".into()),
        }
    });
    r.check("nvrtc_ptx_fallback_loads", || {
        let virt = arch.replacen("sm_", "compute_", 1);
        let m = compile(VADD, &virt, &[]).map_err(e2s)?;
        if m.kind != ImageKind::Ptx {
            return Err(format!("expected PTX for {virt}, got {:?}", m.kind));
        }
        let module = gpu.load_module(&m, &["vadd"]).map_err(e2s)?;
        let k = module
            .kernel("vadd")
            .ok_or("vadd missing from the PTX module")?;
        Ok(format!(
            "{virt}: ptx_bytes={} regs={}",
            m.image.len(),
            k.registers
        ))
    });
    match compile(FP16_HEADER, &arch, &[]) {
        Ok(_) => r.info(
            "nvrtc_fp16_header",
            "#include <cuda_fp16.h> compiles with NVRTC's built-in headers",
        ),
        Err(e) => r.info(
            "nvrtc_fp16_header",
            format!(
                "#include <cuda_fp16.h> does NOT compile: {}",
                e.to_string()
                    .lines()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" | ")
            ),
        ),
    }
    let (Some(vadd_c), Some(softmax_c), Some(misc_c)) = (vadd_c, softmax_c, misc_c) else {
        return;
    };

    // --- modules and resources ----------------------------------------------------------
    let load = |c, names: &[&str]| gpu.load_module(c, names);
    let (vadd_m, softmax_m, misc_m) = match (
        load(&vadd_c, &["vadd"]),
        load(&softmax_c, &["softmax_rows"]),
        load(&misc_c, &["saxpy", "dyn_smem_sum"]),
    ) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (a, b, c) => {
            let err = [a.err(), b.err(), c.err()]
                .into_iter()
                .flatten()
                .map(e2s)
                .collect::<Vec<_>>();
            r.check("load_modules", || Err(err.join("; ")));
            return;
        }
    };
    r.check("resources", || {
        let mut out = Vec::new();
        for (m, k, block, dyn_smem) in [
            (&vadd_m, "vadd", 256u32, 0u32),
            (&softmax_m, "softmax_rows", 256, 0),
            (&misc_m, "saxpy", 256, 0),
            (&misc_m, "dyn_smem_sum", 256, 100 * 1024),
        ] {
            let res = m.resources(k, block, dyn_smem).map_err(e2s)?;
            let info = m.kernel(k).ok_or(format!("{k} missing"))?;
            out.push(format!(
                "{k}: regs={} static_smem={} local={} max_threads={} occupancy@{block}/{dyn_smem}B={:.3} params={:?}",
                res.registers,
                res.static_shared_bytes,
                res.local_bytes,
                res.max_threads_per_block,
                res.occupancy.unwrap_or(-1.0),
                info.param_sizes
            ));
            if res.registers == 0 || res.max_threads_per_block < 256 {
                return Err(format!("implausible resources: {}", out.join("; ")));
            }
        }
        let smem = softmax_m.kernel("softmax_rows").map(|k| k.static_shared_bytes).unwrap_or(0);
        if smem != 1024 {
            return Err(format!("softmax static shared memory {smem}, expected 1024; {}", out.join("; ")));
        }
        Ok(out.join("; "))
    });
    r.check("param_info", || {
        let sizes = vadd_m.kernel("vadd").and_then(|k| k.param_sizes.clone());
        match sizes {
            Some(s) if s == vec![8, 8, 8, 4] => Ok("cuFuncGetParamInfo reports [8, 8, 8, 4] for vadd: argument sizes are checked".into()),
            None => Ok("cuFuncGetParamInfo unavailable: argument sizes are not checked".into()),
            Some(s) => Err(format!("cuFuncGetParamInfo reports {s:?} for vadd; expected [8, 8, 8, 4] (would refuse good launches)")),
        }
    });
    r.check("kernels_enumerated", || {
        let names: Vec<String> = misc_m.kernels().map(|k| k.name.clone()).collect();
        if names.len() == 2 {
            Ok(format!("{names:?}"))
        } else {
            Err(format!("{names:?}"))
        }
    });

    // --- inputs on the GPU -----------------------------------------------------------------
    let gib_elems: u64 = 1 << 28;
    let big = gpu.alloc((gib_elems * 4) as usize);
    let normal = Init::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let seed = 0x5eed_1234_u64;
    if let Ok(big) = &big {
        r.check("inputs_1gib", || {
            gpu.fill(big, Dtype::F32, 1024, &normal, seed)
                .map_err(e2s)?;
            gpu.synchronize().map_err(e2s)?; // warm-up (first launch loads the kernel)
            let t = Instant::now();
            gpu.fill(big, Dtype::F32, gib_elems, &normal, seed)
                .map_err(e2s)?;
            gpu.synchronize().map_err(e2s)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let d = format!(
                "normal f32, 2^28 elements (1 GiB) in {ms:.2} ms ({:.0} GB/s)",
                1.073741824 / ms * 1e3
            );
            if ms < 200.0 { Ok(d) } else { Err(d) }
        });
        r.check("inputs_match_host", || {
            let mut head = vec![0f32; 4096];
            gpu.download(big, 0, &mut head).map_err(e2s)?;
            let mut tail = vec![0f32; 16];
            let tail_at = gib_elems - 16;
            gpu.download(big, (tail_at * 4) as usize, &mut tail)
                .map_err(e2s)?;
            let mut differ = 0usize;
            for (i, &g) in head.iter().enumerate().map(|(i, g)| (i as u64, g)).chain(
                tail.iter()
                    .enumerate()
                    .map(|(i, g)| (tail_at + i as u64, g)),
            ) {
                let want = host_value(&normal, Dtype::F32, seed, i).map_err(|e| e.to_string())?;
                if f64::from(g).to_bits() != want.to_bits() {
                    differ += 1;
                }
            }
            let d = format!("{differ} of 4112 elements differ bitwise from the host mirror");
            if differ == 0 { Ok(d) } else { Err(d) }
        });
        r.check("inputs_stats", || {
            let n = 1 << 20;
            let mut v = vec![0f32; n];
            gpu.download(big, 0, &mut v).map_err(e2s)?;
            let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
            let var = v
                .iter()
                .map(|&x| (f64::from(x) - mean).powi(2))
                .sum::<f64>()
                / n as f64;
            let d = format!("first 2^20: mean {mean:.4} std {:.4}", var.sqrt());
            if mean.abs() < 0.01 && (var.sqrt() - 1.0).abs() < 0.01 {
                Ok(d)
            } else {
                Err(d)
            }
        });
        r.check("hash_1gib", || {
            gpu.hash(big, 1).map_err(e2s)?; // warm-up
            let t = Instant::now();
            let h = gpu.hash(big, 7).map_err(e2s)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let h2 = gpu.hash(big, 7).map_err(e2s)?;
            let d = format!("hash {h:#018x} in {ms:.2} ms");
            if h == h2 {
                Ok(d)
            } else {
                Err(format!("not deterministic: {h:#x} vs {h2:#x}"))
            }
        });
    } else if let Err(e) = &big {
        r.check("inputs_1gib", || Err(format!("alloc 1 GiB: {e}")));
    }
    drop(big);
    r.check("inputs_dtypes", || {
        let n = 4096u64;
        let b = gpu.alloc((n * 8) as usize).map_err(e2s)?;
        let mut out = Vec::new();
        // f16 and bf16 through the cvt instructions.
        let uni = Init::Uniform {
            low: -4.0,
            high: 4.0,
        };
        for (dtype, tol) in [(Dtype::F16, 1e-3f64), (Dtype::Bf16, 8e-3)] {
            gpu.fill(&b, dtype, n, &uni, 11).map_err(e2s)?;
            let bits: Vec<u16> = gpu.download_vec(&b, n as usize).map_err(e2s)?;
            let mut worst = 0f64;
            for (i, &h) in bits.iter().enumerate() {
                let got = if dtype == Dtype::F16 {
                    f16_to_f32(h)
                } else {
                    f32::from_bits(u32::from(h) << 16)
                };
                let want = host_value(&uni, dtype, 11, i as u64).map_err(|e| e.to_string())?;
                worst = worst.max((f64::from(got) - want).abs() / want.abs().max(1e-2));
            }
            out.push(format!("{dtype:?} worst rel {worst:.1e}"));
            if worst > tol {
                return Err(out.join("; "));
            }
        }
        // randint into i32 and i64: exact.
        let ri = Init::Randint { low: -5, high: 6 };
        gpu.fill(&b, Dtype::I32, n, &ri, 3).map_err(e2s)?;
        let v: Vec<i32> = gpu.download_vec(&b, n as usize).map_err(e2s)?;
        if v.iter()
            .enumerate()
            .any(|(i, &x)| Ok(f64::from(x)) != host_value(&ri, Dtype::I32, 3, i as u64))
        {
            return Err("i32 randint differs from the host mirror".into());
        }
        gpu.fill(&b, Dtype::I64, n, &ri, 3).map_err(e2s)?;
        let v: Vec<i64> = gpu.download_vec(&b, n as usize).map_err(e2s)?;
        if v.iter()
            .enumerate()
            .any(|(i, &x)| Ok(x as f64) != host_value(&ri, Dtype::I64, 3, i as u64))
        {
            return Err("i64 randint differs from the host mirror".into());
        }
        gpu.fill(&b, Dtype::F64, n, &uni, 5).map_err(e2s)?;
        let v: Vec<f64> = gpu.download_vec(&b, n as usize).map_err(e2s)?;
        if v.iter()
            .enumerate()
            .any(|(i, &x)| Ok(x) != host_value(&uni, Dtype::F64, 5, i as u64))
        {
            return Err("f64 uniform differs from the host mirror".into());
        }
        out.push("i32/i64 randint and f64 uniform bit-exact".into());
        Ok(out.join("; "))
    });
    r.check("poison", || {
        let n = 1000u64;
        let b = gpu.alloc(8 * n as usize).map_err(e2s)?;
        for dtype in [
            Dtype::F32,
            Dtype::F64,
            Dtype::F16,
            Dtype::Bf16,
            Dtype::I32,
            Dtype::I64,
            Dtype::U8,
        ] {
            gpu.poison(&b, dtype, n).map_err(e2s)?;
            let bytes: Vec<u8> = gpu
                .download_vec(&b, (n * dtype.size()) as usize)
                .map_err(e2s)?;
            let pat = poison_pattern(dtype).to_le_bytes();
            let size = dtype.size() as usize;
            if bytes.chunks(size).any(|c| c != &pat[..size]) {
                return Err(format!(
                    "{dtype:?}: an element differs from the poison pattern"
                ));
            }
        }
        Ok("all 7 dtypes poisoned with their pattern".into())
    });
    r.check("hash_matches_host_and_sees_tamper", || {
        let bytes = (1 << 20) + 3;
        let b = gpu.alloc(bytes).map_err(e2s)?;
        gpu.fill(
            &b,
            Dtype::U8,
            bytes as u64,
            &Init::Randint { low: 0, high: 256 },
            9,
        )
        .map_err(e2s)?;
        let host: Vec<u8> = gpu.download_vec(&b, bytes).map_err(e2s)?;
        let key = 0xfeed_beef;
        let g = gpu.hash(&b, key).map_err(e2s)?;
        let h = host_hash(&host, key);
        if g != h {
            return Err(format!("gpu {g:#x} != host {h:#x}"));
        }
        gpu.upload(&b, bytes / 2, &[host[bytes / 2] ^ 0x01])
            .map_err(e2s)?;
        let t = gpu.hash(&b, key).map_err(e2s)?;
        if t == g {
            return Err("a one-bit change did not change the hash".into());
        }
        Ok(format!(
            "gpu == host == {g:#018x} over {bytes} bytes; one flipped bit -> {t:#018x}"
        ))
    });

    // --- correctness of real launches ------------------------------------------------------
    let vadd_ok = |r: &mut Report, name: &str| {
        r.check(name, || vector_add(&gpu, &vadd_m));
    };
    vadd_ok(r, "vector_add_correct");
    r.check("softmax_correct", || softmax(&gpu, &softmax_m));
    r.check("dynamic_smem_optin", || dyn_smem(&gpu, &misc_m));

    // --- invalid launches: refused before anything runs ------------------------------------
    let small = gpu.alloc(4096).ok();
    let mut bufs = BTreeMap::new();
    if let Some(s) = &small {
        for n in ["a", "b", "c", "x", "y"] {
            bufs.insert(n.to_string(), buf_arg(s, Dtype::F32, 1024));
        }
    }
    let refused = |m: &Module, plan: &str, needle: &str| -> Result<String, String> {
        match gpu.check_launches(m, &launches(plan), &bufs) {
            Err(e) if e.reason.contains(needle) => Ok(e.to_string()),
            Err(e) => Err(format!("refused for the wrong reason: {e}")),
            Ok(_) => Err("accepted".into()),
        }
    };
    r.check("invalid_launch_too_many_threads", || {
        refused(
            &vadd_m,
            r#"[{"kernel":"vadd","block":[2048,1,1],"args":["a","b","c",{"i32":1024}]}]"#,
            "block.x = 2048",
        )
    });
    r.check("invalid_launch_too_much_shared", || {
        refused(&softmax_m, r#"[{"kernel":"softmax_rows","block":[256,1,1],"shared_bytes":307200,"args":["x","y",{"i32":4}]}]"#, "shared memory")
    });
    r.check("invalid_launch_unknown_kernel", || {
        refused(&vadd_m, r#"[{"kernel":"nope","args":[]}]"#, "no kernel")
    });
    r.check("invalid_launch_unknown_buffer", || {
        refused(
            &vadd_m,
            r#"[{"kernel":"vadd","args":["a","b","zz",{"i32":1}]}]"#,
            "unknown buffer",
        )
    });
    if vadd_m
        .kernel("vadd")
        .and_then(|k| k.param_sizes.as_ref())
        .is_some()
    {
        r.check("invalid_launch_wrong_args", || {
            refused(
                &vadd_m,
                r#"[{"kernel":"vadd","args":["a","b","c"]}]"#,
                "parameters",
            )
        });
    }
    r.check("not_poisoned_after_refusals", || match gpu.poisoned() {
        None => Ok("context intact".into()),
        Some(p) => Err(p),
    });

    // --- timing ----------------------------------------------------------------------------
    let sampler = match init_nvml().and_then(|n| NvmlSource::for_uuid(n, &gpu.facts().uuid)) {
        Ok(src) => Some(Sampler::start(src, DEFAULT_INTERVAL)),
        Err(e) => {
            r.check("telemetry", || Err(e2s(e)));
            None
        }
    };
    timing(r, &gpu, &misc_m, &vadd_m);
    if let Some(s) = sampler {
        let w = s.stop();
        r.check("telemetry", || {
            let j = serde_json::to_string(&w.summary).map_err(e2s)?;
            if w.summary.samples > 0 && w.summary.sm_mhz.is_some() {
                Ok(j)
            } else {
                Err(j)
            }
        });
    }
    drop(small);

    // --- faults, each in a fresh process ---------------------------------------------------
    for kind in CHILD_KINDS {
        r.check(&format!("fault_{kind}"), || run_child(kind, ordinal));
    }
    vadd_ok(r, "recovers_after_faults");
    r.check("alloc_is_zeroed", || {
        let b = gpu.alloc(1 << 20).map_err(e2s)?;
        gpu.memset(&b, 0xAB).map_err(e2s)?;
        drop(b);
        let b = gpu.alloc(1 << 20).map_err(e2s)?;
        let v: Vec<u8> = gpu.download_vec(&b, 1 << 20).map_err(e2s)?;
        if v.iter().all(|&x| x == 0) {
            Ok("a new allocation reads as zeros".into())
        } else {
            Err("stale bytes visible".into())
        }
    });
}

fn vector_add(gpu: &Gpu, m: &Module) -> Result<String, String> {
    let n: u64 = 1 << 24;
    let bytes = (n * 4) as usize;
    let (a, b, c) = (
        gpu.alloc(bytes).map_err(e2s)?,
        gpu.alloc(bytes).map_err(e2s)?,
        gpu.alloc(bytes).map_err(e2s)?,
    );
    let uni = Init::Uniform {
        low: -1.0,
        high: 1.0,
    };
    gpu.fill(&a, Dtype::F32, n, &uni, 1).map_err(e2s)?;
    gpu.fill(&b, Dtype::F32, n, &uni, 2).map_err(e2s)?;
    gpu.poison(&c, Dtype::F32, n).map_err(e2s)?;
    gpu.synchronize().map_err(e2s)?;
    let key = 0x1234;
    let (ha, hb) = (
        gpu.hash(&a, key).map_err(e2s)?,
        gpu.hash(&b, key).map_err(e2s)?,
    );
    let mut bufs = BTreeMap::new();
    bufs.insert("a".to_string(), buf_arg(&a, Dtype::F32, n));
    bufs.insert("b".to_string(), buf_arg(&b, Dtype::F32, n));
    bufs.insert("c".to_string(), buf_arg(&c, Dtype::F32, n));
    let plan = launches(&format!(
        r#"[{{"kernel":"vadd","grid":[{},1,1],"block":[256,1,1],"args":["a","b","c",{{"i32":{n}}}]}}]"#,
        n / 256
    ));
    let checked = gpu.check_launches(m, &plan, &bufs).map_err(e2s)?;
    gpu.run_launches(m, &checked, Duration::from_secs(10))
        .map_err(e2s)?;
    if gpu.hash(&a, key).map_err(e2s)? != ha || gpu.hash(&b, key).map_err(e2s)? != hb {
        return Err("inputs changed".into());
    }
    let va: Vec<f32> = gpu.download_vec(&a, n as usize).map_err(e2s)?;
    let vb: Vec<f32> = gpu.download_vec(&b, n as usize).map_err(e2s)?;
    let vc: Vec<f32> = gpu.download_vec(&c, n as usize).map_err(e2s)?;
    let poison = poison_pattern(Dtype::F32) as u32;
    let unwritten = vc.iter().filter(|x| x.to_bits() == poison).count();
    let wrong = (0..n as usize)
        .filter(|&i| (va[i] + vb[i]).to_bits() != vc[i].to_bits())
        .count();
    if unwritten == 0 && wrong == 0 {
        Ok(format!(
            "{n} elements bit-exact vs CPU; inputs unchanged (hash); no poison left"
        ))
    } else {
        Err(format!("{wrong} wrong, {unwritten} unwritten of {n}"))
    }
}

fn softmax(gpu: &Gpu, m: &Module) -> Result<String, String> {
    let (rows, cols) = (1024u64, 4096u64);
    let n = rows * cols;
    let x = gpu.alloc((n * 4) as usize).map_err(e2s)?;
    let y = gpu.alloc((n * 4) as usize).map_err(e2s)?;
    let dist = Init::Normal {
        mean: 0.0,
        std: 3.0,
    };
    gpu.fill(&x, Dtype::F32, n, &dist, 77).map_err(e2s)?;
    gpu.poison(&y, Dtype::F32, n).map_err(e2s)?;
    let mut bufs = BTreeMap::new();
    bufs.insert("x".to_string(), buf_arg(&x, Dtype::F32, n));
    bufs.insert("y".to_string(), buf_arg(&y, Dtype::F32, n));
    let plan = launches(&format!(
        r#"[{{"kernel":"softmax_rows","grid":[{rows},1,1],"block":[256,1,1],"args":["x","y",{{"i32":{cols}}}]}}]"#
    ));
    let checked = gpu.check_launches(m, &plan, &bufs).map_err(e2s)?;
    gpu.run_launches(m, &checked, Duration::from_secs(10))
        .map_err(e2s)?;
    let vx: Vec<f32> = gpu.download_vec(&x, n as usize).map_err(e2s)?;
    let vy: Vec<f32> = gpu.download_vec(&y, n as usize).map_err(e2s)?;
    let mut worst = 0f64;
    for r in 0..rows as usize {
        let row = &vx[r * cols as usize..(r + 1) * cols as usize];
        let mx = row
            .iter()
            .fold(f64::NEG_INFINITY, |a, &b| a.max(f64::from(b)));
        let sum: f64 = row.iter().map(|&v| (f64::from(v) - mx).exp()).sum();
        for (c, &v) in row.iter().enumerate() {
            let want = (f64::from(v) - mx).exp() / sum;
            let got = f64::from(vy[r * cols as usize + c]);
            worst = worst.max((got - want).abs() / want.max(1e-30));
        }
    }
    let d = format!("{rows}x{cols} vs f64 host softmax: worst relative error {worst:.2e}");
    if worst < 1e-4 { Ok(d) } else { Err(d) }
}

fn dyn_smem(gpu: &Gpu, m: &Module) -> Result<String, String> {
    let n: u64 = 25_600; // 100 KiB of floats: needs the opt-in above 48 KiB
    let x = gpu.alloc((n * 4) as usize).map_err(e2s)?;
    let out = gpu.alloc(4).map_err(e2s)?;
    gpu.fill(
        &x,
        Dtype::F32,
        n,
        &Init::Uniform {
            low: 0.0,
            high: 1.0,
        },
        4,
    )
    .map_err(e2s)?;
    let mut bufs = BTreeMap::new();
    bufs.insert("x".to_string(), buf_arg(&x, Dtype::F32, n));
    bufs.insert("out".to_string(), buf_arg(&out, Dtype::F32, 1));
    let plan = launches(&format!(
        r#"[{{"kernel":"dyn_smem_sum","block":[256,1,1],"shared_bytes":{},"args":["x","out",{{"i32":{n}}}]}}]"#,
        n * 4
    ));
    let checked = gpu.check_launches(m, &plan, &bufs).map_err(e2s)?;
    if !checked.launches[0].raise_dynamic_shared {
        return Err("expected the validator to ask for the shared-memory opt-in".into());
    }
    gpu.run_launches(m, &checked, Duration::from_secs(10))
        .map_err(e2s)?;
    let vx: Vec<f32> = gpu.download_vec(&x, n as usize).map_err(e2s)?;
    let got: Vec<f32> = gpu.download_vec(&out, 1).map_err(e2s)?;
    let want = vx.iter().fold(0f32, |s, &v| s + v);
    if got[0].to_bits() == want.to_bits() {
        Ok(format!(
            "{} bytes of dynamic shared memory (opt-in raised); sum {want} bit-exact",
            n * 4
        ))
    } else {
        Err(format!("sum {} != {want}", got[0]))
    }
}

fn timing(r: &mut Report, gpu: &Gpu, misc: &Module, vadd_m: &Module) {
    let n: u64 = 1 << 26;
    let bytes = (n * 4) as usize;
    let (Ok(x), Ok(y)) = (gpu.alloc(bytes), gpu.alloc(bytes)) else {
        r.check("timing_setup", || Err("cannot allocate 2 x 256 MiB".into()));
        return;
    };
    let uni = Init::Uniform {
        low: -1.0,
        high: 1.0,
    };
    let setup = gpu
        .fill(&x, Dtype::F32, n, &uni, 21)
        .and_then(|()| gpu.fill(&y, Dtype::F32, n, &uni, 22))
        .and_then(|()| gpu.synchronize());
    if let Err(e) = setup {
        r.check("timing_setup", || Err(e2s(e)));
        return;
    }
    let mut bufs = BTreeMap::new();
    bufs.insert("x".to_string(), buf_arg(&x, Dtype::F32, n));
    bufs.insert("y".to_string(), buf_arg(&y, Dtype::F32, n));
    let plan = launches(&format!(
        r#"[{{"kernel":"saxpy","grid":[{},1,1],"block":[256,1,1],"args":["x","y",{{"f32":0.5}},{{"i32":{n}}}]}}]"#,
        n / 256
    ));
    let checked = match gpu.check_launches(misc, &plan, &bufs) {
        Ok(c) => c,
        Err(e) => {
            r.check("timing_setup", || Err(e2s(e)));
            return;
        }
    };
    let timeout = Duration::from_secs(10);
    for _ in 0..3 {
        if let Err(e) = gpu.run_launches(misc, &checked, timeout) {
            r.check("timing_setup", || Err(format!("warm-up: {e}")));
            return;
        }
    }
    let series = |cfg: Option<SampleConfig>, count: usize| -> Result<Vec<f64>, GpuError> {
        (0..count)
            .map(|_| match cfg {
                Some(c) => gpu.time_sample(misc, &checked, &c).map(|t| t.event_ms),
                None => gpu.time_plain(misc, &checked, timeout),
            })
            .collect()
    };
    let fmt = |v: &[f64]| match stats(v) {
        Some(s) => format!(
            "n={} median={:.4} ms mean={:.4} min={:.4} max={:.4} cv={:.3}%",
            s.n,
            s.median,
            s.mean,
            s.min,
            s.max,
            s.cv * 100.0
        ),
        None => "no valid samples".into(),
    };
    let contract = SampleConfig::contract(&checked, timeout);
    let mut contract_median = None;
    r.check("timing_contract", || {
        let v = series(Some(contract), 20).map_err(e2s)?;
        let s = stats(&v).ok_or("no stats")?;
        contract_median = Some(s.median);
        let gbps = (3 * bytes) as f64 / (s.median * 1e-3) / 1e9;
        let d = format!(
            "saxpy 2^26 (768 MiB moved), L2 flush + blocker {} ns: {} ({gbps:.0} GB/s)",
            contract.blocker_ns.unwrap_or(0),
            fmt(&v)
        );
        // A sanity bound on single samples (one sample of 20 that is 5 % slow already gives
        // a CV of 1.5 %, seen on the H200 on 2026-12-01); the medians' stability is judged
        // by timing_stability below (0.5 %).
        if s.median > 0.02 && s.median < 20.0 && s.cv < 0.02 {
            Ok(d)
        } else {
            Err(d)
        }
    });
    r.check("timing_plain", || {
        let v = series(None, 20).map_err(e2s)?;
        let s = stats(&v).ok_or("no stats")?;
        let ratio = contract_median.map(|c| s.median / c).unwrap_or(f64::NAN);
        Ok(format!("KernelBench-style (events around one launch, no flush): {}; plain/contract = {ratio:.3}", fmt(&v)))
    });
    r.check("timing_flush_no_blocker", || {
        let cfg = SampleConfig {
            blocker_ns: None,
            ..contract
        };
        let v = series(Some(cfg), 20).map_err(e2s)?;
        Ok(format!("L2 flush, no blocker: {}", fmt(&v)))
    });
    r.check("timing_cupti", || {
        cupti_check(gpu, misc, &checked, contract)
    });
    r.check("timing_stability", || {
        // 10 rounds of 20 contract samples, a vector add between rounds (another
        // "candidate" on the lane); the issue's target is CV of the medians <= 0.5 %.
        let mut medians = Vec::new();
        for _ in 0..10 {
            let v = series(Some(contract), 20).map_err(e2s)?;
            medians.push(stats(&v).ok_or("no stats")?.median);
            vector_add(gpu, vadd_m)?;
        }
        let s = stats(&medians).ok_or("no stats")?;
        let d = format!(
            "10 medians of 20: {:?} ms; CV of medians {:.3}%",
            medians
                .iter()
                .map(|m| (m * 1e4).round() / 1e4)
                .collect::<Vec<_>>(),
            s.cv * 100.0
        );
        if s.cv <= 0.005 { Ok(d) } else { Err(d) }
    });
}

/// Kernel records beside events: saxpy once and twice per sample (a two-launch plan);
/// each sample's kernel time must be found, at most its event time, and two launches about
/// twice one. Skipped (INFO-like pass) when the tracer is off, with its reason.
fn cupti_check(
    gpu: &Gpu,
    misc: &Module,
    one: &CheckedLaunches,
    cfg: SampleConfig,
) -> Result<String, String> {
    if let Some(kiln_gpu::cupti::TimerStatus::Events { reason }) = kiln_gpu::cupti::status() {
        return Err(format!("CUPTI is not running: {reason}"));
    }
    let two = CheckedLaunches {
        launches: [one.launches.clone(), one.launches.clone()].concat(),
    };
    let mut lines = Vec::new();
    let mut sums = Vec::new();
    for (label, plan) in [("1 launch", one), ("2 launches", &two)] {
        let (mut ev, mut sum, mut span) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..20 {
            let t = gpu.time_sample(misc, plan, &cfg).map_err(e2s)?;
            let k = match t.kernels {
                Some(Ok(k)) => k,
                Some(Err(why)) => {
                    return Err(format!("{label}: a sample had no kernel time: {why}"));
                }
                None => return Err(format!("{label}: no kernel records (tracer off)")),
            };
            if k.kernels != plan.launches.len() || k.sum_us() > t.event_ms * 1e3 + 0.5 {
                return Err(format!(
                    "{label}: {} records, sum {:.3} us vs events {:.3} us",
                    k.kernels,
                    k.sum_us(),
                    t.event_ms * 1e3
                ));
            }
            ev.push(t.event_ms * 1e3);
            sum.push(k.sum_us());
            span.push(k.span_us());
        }
        let med = |v: &[f64]| stats(v).map_or(f64::NAN, |s| s.median);
        sums.push(med(&sum));
        lines.push(format!(
            "{label}: events {:.2} us, kernel sum {:.2} us, span {:.2} us (medians of 20)",
            med(&ev),
            med(&sum),
            med(&span)
        ));
    }
    let ratio = sums[1] / sums[0];
    let d = format!("{}; two/one = {ratio:.3}", lines.join("; "));
    if (1.8..2.2).contains(&ratio) {
        Ok(d)
    } else {
        Err(d)
    }
}

/// Runs one fault kind in a child process and checks what it reports.
fn run_child(kind: &str, ordinal: u32) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(e2s)?;
    let mut child = Command::new(exe)
        .args(["--child", kind, &ordinal.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(e2s)?;
    let started = Instant::now();
    let mut killed = false;
    let status = loop {
        match child.try_wait().map_err(e2s)? {
            Some(s) => break Some(s),
            None if started.elapsed() > Duration::from_secs(60) => {
                let _ = child.kill();
                let _ = child.wait();
                killed = true;
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    let mut err = String::new();
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    let line = out
        .lines()
        .find(|l| l.starts_with("CHILD "))
        .unwrap_or("")
        .to_string();
    let secs = started.elapsed().as_secs_f64();
    let exit = if killed {
        "child did not exit within 60 s and was killed".to_string()
    } else {
        use std::os::unix::process::ExitStatusExt;
        match status {
            Some(s) if s.signal().is_some() => {
                format!("child ended by signal {:?} after {secs:.1} s", s.signal())
            }
            Some(s) => format!("child exited {:?} after {secs:.1} s", s.code()),
            None => "child status unknown".to_string(),
        }
    };
    if line.is_empty() {
        return Err(format!(
            "{exit}; no report; stdout {out:?} stderr {:?}",
            err.chars().take(400).collect::<String>()
        ));
    }
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or("")
            .to_string()
    };
    let (fault, poisoned, after) = (field("fault"), field("poisoned"), field("after"));
    let expected = match kind {
        "illegal_address" => fault.contains("ILLEGAL_ADDRESS"),
        "misaligned" => fault.contains("MISALIGNED"),
        "trap" => fault.starts_with("CUDA_ERROR_"),
        "infinite_loop" => fault == "timeout",
        _ => false,
    };
    let d = format!("{line}; {exit}");
    if expected && !poisoned.is_empty() && poisoned != "none" && after == "poisoned" && !killed {
        Ok(d)
    } else {
        Err(d)
    }
}

/// Child mode: provoke one fault, report it on one line, exit without cleanup.
fn child(kind: &str, ordinal: u32) -> ! {
    let report = |fault: &str, gpu: Option<&Gpu>| {
        let poisoned = gpu
            .and_then(|g| g.poisoned())
            .unwrap_or_else(|| "none".into());
        let after = match gpu.map(|g| g.alloc(16)) {
            Some(Err(GpuError::Poisoned(_))) => "poisoned".to_string(),
            Some(Err(e)) => format!("error:{}", e.to_string().replace(' ', "_")),
            Some(Ok(_)) => "usable".to_string(),
            None => "no_gpu".to_string(),
        };
        println!("CHILD kind={kind} fault={fault} poisoned={poisoned} after={after}");
        let _ = std::io::Write::flush(&mut std::io::stdout());
        if fault == "timeout" {
            // A kernel is still running: do what kiln-worker does after reporting a
            // timeout, and die at once rather than wait for the driver's exit handlers.
            // SAFETY: sending SIGKILL to our own pid has no memory-safety implications.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        // Exit without running destructors: the context is poisoned, and the driver
        // reclaims everything at process exit.
        std::process::exit(0);
    };
    let gpu = match Gpu::open(ordinal) {
        Ok(g) => g,
        Err(e) => {
            println!(
                "CHILD kind={kind} fault=open_failed:{} poisoned=none after=no_gpu",
                e.to_string().replace(' ', "_")
            );
            std::process::exit(3);
        }
    };
    let result = (|| -> Result<(), GpuError> {
        let compiled = compile(FAULTS, &gpu.facts().arch, &[])?;
        let m = gpu.load_module(
            &compiled,
            &["oob_write", "misaligned", "trap_kernel", "spin_forever"],
        )?;
        let buf = gpu.alloc(4096)?;
        let mut bufs = BTreeMap::new();
        bufs.insert("p".to_string(), buf_arg(&buf, Dtype::F32, 1024));
        let (kernel, block, timeout) = match kind {
            "illegal_address" => ("oob_write", 32, 10),
            "misaligned" => ("misaligned", 32, 10),
            "trap" => ("trap_kernel", 32, 10),
            "infinite_loop" => ("spin_forever", 1, 2),
            other => return Err(GpuError::Usage(format!("unknown child kind {other}"))),
        };
        let plan = launches(&format!(
            r#"[{{"kernel":"{kernel}","block":[{block},1,1],"args":["p"]}}]"#
        ));
        let checked: CheckedLaunches = gpu.check_launches(&m, &plan, &bufs)?;
        gpu.run_launches(&m, &checked, Duration::from_secs(timeout))?;
        std::mem::forget(buf);
        std::mem::forget(m);
        Ok(())
    })();
    match result {
        Ok(()) => report("none", Some(&gpu)),
        Err(e) => {
            let name = e
                .fault_name()
                .unwrap_or_else(|| format!("not_a_fault:{}", e.to_string().replace(' ', "_")));
            report(&name, Some(&gpu))
        }
    }
}

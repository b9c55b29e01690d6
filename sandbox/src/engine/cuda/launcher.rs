//! `kiln-worker launch`: a problem's own kernel (its seed or its reference), run on its own
//! so that an external profiler can time it — `kiln bench agreement` runs it under Nsight
//! Compute and compares ncu's `gpu__time_duration` with kiln's time of the same kernel.
//!
//! Only a problem's own kernels run here, never a candidate's. The caller is a person (or
//! `kiln bench`) on the GPU host, and the profiler must see the process, so the kernel runs
//! outside the jail; its source is still compiled by NVRTC in a jailed compile child, as
//! for any candidate (`crate::compile`), so untrusted text never reaches NVRTC unjailed.
//! The problem comes as the JSON kilnd serves (`GET /v1/problems/{name}`'s `spec`, sources
//! inlined). What it does: compile the kernel (jailed) for the GPU's arch, open the GPU (no
//! CUPTI: the profiler owns it), allocate the tensors and the kernel's scratch, draw the
//! inputs on the GPU from each tensor's distribution, then run the launch list
//! `warmup + runs` times, waiting for each run. One JSON line on stdout says what ran: the
//! kernel names in launch order, the warm-up runs, the timed runs — so the profiler's rows
//! can be grouped into runs.
//!
//! With `--time` (and no profiler), kiln times each run itself, one sample as the contract
//! takes it, CUPTI's kernel records included when the tracer comes up; the JSON line then
//! carries the medians ([`super::launch_timing`]).

use std::collections::BTreeMap;
use std::time::Duration;

use kiln_gpu::Gpu;
use kiln_gpu::inputs::derive_seed;
use kiln_gpu::launch::BufferArg;
use kiln_types::{Candidate, ProblemSpec, Role};
use serde::{Deserialize, Serialize};

/// Which of the problem's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Which {
    /// `[seed.cuda]`.
    Seed,
    /// `[reference.cuda]`.
    Reference,
}

/// What a launch ran (the JSON line on stdout).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Launched {
    /// The problem.
    pub problem: String,
    /// Seed or reference.
    pub which: Which,
    /// Kernel names of one run, in launch order.
    pub kernels: Vec<String>,
    /// Untimed runs first.
    pub warmup: u32,
    /// Runs after the warm-up.
    pub runs: u32,
    /// The GPU.
    pub device: String,
    /// With `--time`: what kiln's own samples of the runs measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<super::launch_timing::LaunchTiming>,
}

/// Parsed command line of `kiln-worker launch`.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    /// The problem spec file (JSON).
    pub spec: std::path::PathBuf,
    /// Seed or reference.
    pub which: Which,
    /// Runs after the warm-up.
    pub runs: u32,
    /// Warm-up runs.
    pub warmup: u32,
    /// Compile only, and write the artifact here (no GPU is opened).
    pub compile_to: Option<std::path::PathBuf>,
    /// Load this artifact (written by `--compile-to`) instead of compiling.
    pub artifact: Option<std::path::PathBuf>,
    /// Time each run with kiln's own sample (flush, blocking kernel, events, CUPTI).
    pub time: bool,
}

/// The usage line.
pub const USAGE: &str = "kiln-worker launch --spec PROBLEM.json [--kernel seed|reference] \
                         [--runs N] [--warmup N] [--time] [--compile-to FILE | --artifact FILE]";

impl Args {
    /// Parses the arguments after `launch`.
    pub fn parse(args: &[String]) -> Result<Args, String> {
        let mut out = Args {
            spec: Default::default(),
            which: Which::Seed,
            runs: 10,
            warmup: 1,
            compile_to: None,
            artifact: None,
            time: false,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{a} needs a value"))
            };
            match a.as_str() {
                "--spec" => out.spec = value()?.into(),
                "--kernel" => {
                    out.which = match value()?.as_str() {
                        "seed" => Which::Seed,
                        "reference" => Which::Reference,
                        other => return Err(format!("--kernel {other:?}: seed or reference")),
                    }
                }
                "--runs" => out.runs = number(&value()?, "--runs", 1..=10_000)?,
                "--warmup" => out.warmup = number(&value()?, "--warmup", 0..=1_000)?,
                "--compile-to" => out.compile_to = Some(value()?.into()),
                "--artifact" => out.artifact = Some(value()?.into()),
                "--time" => out.time = true,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if out.spec.as_os_str().is_empty() {
            return Err("--spec is required".into());
        }
        if out.compile_to.is_some() && out.artifact.is_some() {
            return Err("--compile-to and --artifact exclude each other".into());
        }
        if out.compile_to.is_some() && out.time {
            return Err("--compile-to only compiles: nothing runs to --time".into());
        }
        Ok(out)
    }
}

fn number(v: &str, what: &str, range: std::ops::RangeInclusive<u32>) -> Result<u32, String> {
    v.parse::<u32>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            format!(
                "{what} {v:?}: give a number from {} to {}",
                range.start(),
                range.end()
            )
        })
}

/// `kiln-worker launch ARGS`: exit status 0 when every run finished, 1 otherwise, 2 for
/// bad arguments.
pub fn main(args: &[String]) -> i32 {
    let parsed = match Args::parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kiln-worker launch: {e}\nusage: {USAGE}");
            return 2;
        }
    };
    match run(&parsed) {
        Ok(launched) => {
            println!("{}", serde_json::to_string(&launched).unwrap_or_default());
            0
        }
        Err(e) => {
            eprintln!("kiln-worker launch: {e}");
            1
        }
    }
}

/// Loads the problem, runs its kernel, and says what ran.
pub fn run(a: &Args) -> Result<Launched, String> {
    let text = std::fs::read_to_string(&a.spec)
        .map_err(|e| format!("cannot read {}: {e}", a.spec.display()))?;
    let problem: ProblemSpec = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a problem spec: {e}", a.spec.display()))?;
    problem.validate().map_err(|e| e.to_string())?;
    let candidate = match a.which {
        Which::Seed => problem.seed_candidate("cuda"),
        Which::Reference => problem.reference_candidate(kiln_types::BackendKind::Cuda),
    }
    .ok_or_else(|| format!("problem {} has no cuda {:?} kernel", problem.name, a.which))?;
    if candidate.source.is_empty() {
        return Err(
            "the spec carries no kernel source (give kilnd's JSON, sources inlined)".into(),
        );
    }
    let artifact = match (&a.compile_to, &a.artifact) {
        (Some(to), _) => {
            let artifact = compile_jailed(&problem, &candidate)?;
            std::fs::write(to, &artifact)
                .map_err(|e| format!("cannot write the artifact to {}: {e}", to.display()))?;
            return Ok(Launched {
                problem: problem.name.clone(),
                which: a.which,
                kernels: Vec::new(),
                warmup: 0,
                runs: 0,
                device: String::new(),
                timing: None,
            });
        }
        // Compiled beforehand (under a profiler, the jailed compile's child would be
        // injected too, and a process with the profiler's threads cannot enter new
        // namespaces).
        (None, Some(path)) => std::fs::read(path)
            .map_err(|e| format!("cannot read the artifact {}: {e}", path.display()))?,
        (None, None) => compile_jailed(&problem, &candidate)?,
    };
    // The tracer comes up before the context, as in a GPU worker (`[gpu] cupti` reaches this
    // process as KILN_CUPTI); under a profiler it reports why not and timing uses events.
    let tracer = a
        .time
        .then(|| kiln_gpu::cupti::start(&kiln_gpu::cupti::CuptiSetting::from_env()));
    let gpu = Gpu::open(0).map_err(|e| format!("cannot open the GPU: {e}"))?;
    let artifact = kiln_gpu::artifact::Artifact::decode(&artifact)
        .map_err(|e| format!("the kernel's artifact: {e}"))?;
    let mut buffers: BTreeMap<String, BufferArg> = BTreeMap::new();
    let mut keep = Vec::new();
    for (i, t) in problem.tensors.iter().enumerate() {
        let buf = gpu
            .alloc(t.bytes() as usize)
            .map_err(|e| format!("allocating tensor {}: {e}", t.name))?;
        if t.role == Role::Input {
            let seed = derive_seed(0x6b69_6c6e, &format!("launch/{i}/{}", t.name));
            gpu.fill(&buf, t.dtype, t.elems(), &t.init, seed)
                .map_err(|e| format!("drawing {}: {e}", t.name))?;
        }
        let arg = BufferArg {
            ptr: buf.ptr(),
            dtype: t.dtype,
            elems: t.elems(),
        };
        buffers.insert(t.name.clone(), arg);
        keep.push(buf);
    }
    for s in &candidate.scratch {
        let buf = gpu
            .alloc((s.elems * s.dtype.size()) as usize)
            .map_err(|e| format!("allocating scratch {}: {e}", s.name))?;
        let arg = BufferArg {
            ptr: buf.ptr(),
            dtype: s.dtype,
            elems: s.elems,
        };
        buffers.insert(s.name.clone(), arg);
        keep.push(buf);
    }
    gpu.synchronize().map_err(|e| e.to_string())?;
    let names: Vec<&str> = candidate
        .launches
        .iter()
        .map(|l| l.kernel.as_str())
        .collect();
    let module = gpu
        .load_artifact(&artifact, &names)
        .map_err(|e| format!("loading the module: {e}"))?;
    let plan = gpu
        .check_launches(&module, &candidate.launches, &buffers)
        .map_err(|e| format!("the launch list: {e}"))?;
    let timeout = Duration::from_secs(60);
    let untimed = if a.time { a.warmup } else { a.warmup + a.runs };
    for _ in 0..untimed {
        gpu.run_launches(&module, &plan, timeout)
            .map_err(|e| format!("a run failed: {e}"))?;
    }
    let timing = match tracer {
        None => None,
        Some(status) => {
            let cfg = kiln_gpu::timing::SampleConfig::contract(&plan, timeout);
            let samples = (0..a.runs)
                .map(|_| gpu.time_sample(&module, &plan, &cfg))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("a timed run failed: {e}"))?;
            Some(super::launch_timing::summarize(&samples, status))
        }
    };
    Ok(Launched {
        problem: problem.name.clone(),
        which: a.which,
        kernels: names.iter().map(|s| s.to_string()).collect(),
        warmup: a.warmup,
        runs: a.runs,
        device: gpu.facts().name.clone(),
        timing,
    })
}

/// NVRTC in a jailed compile child (this binary is the jail's worker), for the first GPU's
/// architecture, before this process touches the GPU.
fn compile_jailed(problem: &ProblemSpec, candidate: &Candidate) -> Result<Vec<u8>, String> {
    let scratch = std::env::temp_dir().join(format!("kiln-launch-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)
        .map_err(|e| format!("a scratch directory for the compile: {e}"))?;
    let mut cfg = crate::SandboxConfig::new(&scratch);
    if let Ok(exe) = std::env::current_exe() {
        cfg.worker_exe = exe;
    }
    if !cfg.use_first_gpu() {
        return Err("no CUDA GPU found here".into());
    }
    let out = crate::compile(&cfg, problem, candidate);
    let _ = std::fs::remove_dir(&scratch);
    let out = out.map_err(|e| format!("the jailed compile: {e}"))?;
    match (out.artifact, out.failure) {
        (Some(a), _) => Ok(a),
        (None, Some(f)) => Err(format!("the kernel did not compile: {}", f.message)),
        (None, None) => Err("the compile returned nothing".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Result<Args, String> {
        Args::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn arguments_parse_with_defaults_and_bounds() {
        let a = args(&["--spec", "/tmp/p.json"]).expect("parses");
        assert_eq!(
            (a.which, a.runs, a.warmup, a.time),
            (Which::Seed, 10, 1, false)
        );
        let a = args(&[
            "--spec",
            "p.json",
            "--kernel",
            "reference",
            "--runs",
            "3",
            "--warmup",
            "0",
        ])
        .expect("parses");
        assert_eq!((a.which, a.runs, a.warmup), (Which::Reference, 3, 0));
        assert_eq!(
            (a.compile_to.as_deref(), a.artifact.as_deref()),
            (None, None)
        );
        let a = args(&["--spec", "p.json", "--artifact", "k.bin", "--time"]).expect("parses");
        assert_eq!(a.artifact.as_deref(), Some(std::path::Path::new("k.bin")));
        assert!(a.time);
        let a = args(&["--spec", "p.json", "--compile-to", "k.bin"]).expect("parses");
        assert_eq!(a.compile_to.as_deref(), Some(std::path::Path::new("k.bin")));
        for bad in [
            &["--runs", "3"][..],
            &["--spec", "p", "--runs", "0"],
            &["--spec", "p", "--runs"],
            &["--spec", "p", "--kernel", "candidate"],
            &["--spec", "p", "--fast"],
            &["--spec", "p", "--compile-to", "a", "--artifact", "b"],
            &["--spec", "p", "--artifact"],
            &["--spec", "p", "--compile-to", "a", "--time"],
        ] {
            assert!(args(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_spec_without_sources_or_a_cuda_kernel_is_refused_before_the_gpu() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spec = kiln_types::ProblemSpec::load_dir(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../problems/vecadd-4096"),
        )
        .expect("problem");
        let path = dir.path().join("p.json");
        std::fs::write(&path, serde_json::to_string(&spec).expect("json")).expect("write");
        let a = args(&["--spec", path.to_str().expect("utf8")]).expect("parses");
        // vecadd-4096 is a host-only problem.
        let e = run(&a).expect_err("no cuda seed");
        assert!(e.contains("no cuda"), "{e}");
        spec.seed.insert(
            "cuda".into(),
            kiln_types::KernelSource {
                file: "seed.cu".into(),
                source: String::new(),
                launches: Vec::new(),
                scratch: Vec::new(),
                flags: Vec::new(),
            },
        );
        std::fs::write(&path, serde_json::to_string(&spec).expect("json")).expect("write");
        let e = run(&a).expect_err("no source");
        assert!(e.contains("no kernel source"), "{e}");
        std::fs::write(&path, "{").expect("write");
        assert!(
            run(&a)
                .expect_err("bad json")
                .contains("not a problem spec")
        );
    }
}

//! Compiling a Triton candidate inside the jail (compile role): kiln's trusted driver
//! script (`driver.py`, built into kiln-worker) run by the configured python, with a
//! wall-clock timeout and the jail's rlimits, then its answer checked and packed into an
//! [`Artifact`].
//!
//! Runs in kiln-worker with the scratch directory as the working directory. The driver
//! gets a cleared environment: `HOME`, `TMPDIR` and `TRITON_CACHE_DIR` inside scratch (so
//! Triton's cache lives and dies with the job), `PATH=/usr/bin:/bin`, and runs as
//! `python -I -B` (isolated: no `PYTHON*` variables, no user site, no bytecode written).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kiln_types::{Candidate, CompileInfo, Verdict};
use serde::{Deserialize, Serialize};

use super::artifact::{self, Artifact, KernelEntry, Manifest};
use super::spec::Plan;
use crate::engine::host::compile::run_captured;

/// The driver script, written into scratch for each compile.
pub const DRIVER: &str = include_str!("driver.py");

/// Writes the driver into `dir` with kiln's Triton rules beside it
/// ([`kiln_types::triton::RULES_FILE`], which the driver loads from its own folder).
fn write_driver(dir: &Path) -> std::io::Result<()> {
    fs::write(dir.join("driver.py"), DRIVER)?;
    fs::write(
        dir.join(kiln_types::triton::RULES_FILE),
        kiln_types::triton::RULES_JSON,
    )
}

/// Most driver output kept in the log.
const LOG_CAP: usize = 16 << 10;
/// Largest `result.json` read.
const MAX_RESULT_BYTES: u64 = 1 << 20;
/// Most dynamic shared memory a kernel's metadata may claim (the launch check applies the
/// device's own limit).
const MAX_SHARED_BYTES: u32 = 4 << 20;

/// What the caller sends for a Triton compile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TritonJob {
    /// The python that has triton (a path valid inside the jail).
    pub python: PathBuf,
    /// The Triton version kilnd found at start; another one is an infrastructure error.
    pub version: String,
    /// The target architecture (`sm_90`).
    pub arch: String,
    /// What to compile.
    pub plan: Plan,
}

/// The result of one Triton compile.
pub struct Compiled {
    /// The artifact, when the compile succeeded.
    pub artifact: Option<Vec<u8>>,
    /// Duration and log.
    pub info: CompileInfo,
    /// Why it failed (empty on success).
    pub message: String,
    /// The failure's verdict: `compile_error`, or `invalid_launch` when the launch plan
    /// does not fit the jit function.
    pub verdict: Verdict,
}

/// The driver's answer (`result.json`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    ok: bool,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    kernel: Option<usize>,
    #[serde(default)]
    message: Option<String>,
    triton_version: String,
    #[serde(default)]
    kernels: Vec<KernelMeta>,
    #[serde(default)]
    import_s: Option<f64>,
    #[serde(default)]
    total_s: Option<f64>,
}

/// What the driver reports of one compiled kernel (Triton's metadata, and the PTX
/// entry's parameter count).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KernelMeta {
    function: String,
    symbol: String,
    ptx_entry: Option<String>,
    ptx_params: Option<u32>,
    user_params: u32,
    num_warps: u32,
    num_ctas: u32,
    shared: u64,
    global_scratch_size: u64,
    global_scratch_align: u64,
    profile_scratch_size: u64,
    launch_cooperative_grid: bool,
    launch_pdl: bool,
    tmem_size: u64,
    compile_s: f64,
}

/// Parameters Triton appends after a kernel's own, by version, where the PTX does not
/// say (3.2: none; 3.3–3.4: global scratch; 3.5+: global and profile scratch).
fn trailing_for_version(version: &str) -> u32 {
    let mut parts = version
        .split(['.', '+'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    match (major, minor) {
        (0..=2, _) | (3, 0..=2) => 0,
        (3, 3..=4) => 1,
        _ => 2,
    }
}

/// Checks one kernel's metadata and turns it into the manifest's entry.
fn entry(
    meta: &KernelMeta,
    image: usize,
    version: &str,
    wanted: &str,
) -> Result<KernelEntry, String> {
    let bad = |why: String| Err(format!("kernel {}: {why}", meta.function));
    if meta.function != wanted {
        return bad(format!(
            "compiled for {wanted:?}, reported as {:?}",
            meta.function
        ));
    }
    if !kiln_types::candidate::is_identifier(&meta.symbol)
        || meta.ptx_entry.as_deref().is_some_and(|e| e != meta.symbol)
    {
        return bad(format!("odd entry symbol {:?}", meta.symbol));
    }
    if meta.num_warps == 0 || meta.num_warps > kiln_types::candidate::MAX_NUM_WARPS {
        return bad(format!("{} warps", meta.num_warps));
    }
    if meta.num_ctas != 1 {
        return bad(format!("compiled for {} CTAs per program", meta.num_ctas));
    }
    let shared = u32::try_from(meta.shared)
        .ok()
        .filter(|&s| s <= MAX_SHARED_BYTES)
        .ok_or_else(|| {
            format!(
                "kernel {}: {} bytes of shared memory",
                meta.function, meta.shared
            )
        })?;
    if meta.profile_scratch_size > 0 {
        return bad(
            "it needs Triton's profile scratch (instrumentation), which kiln does not provide"
                .into(),
        );
    }
    if meta.launch_cooperative_grid || meta.launch_pdl {
        return bad("it asks for a cooperative or programmatic-dependent launch".into());
    }
    if meta.tmem_size > 0 {
        return bad("it needs tensor memory (Blackwell), which kiln does not set up".into());
    }
    let trailing = match meta.ptx_params {
        Some(n) if n >= meta.user_params => n - meta.user_params,
        Some(n) => {
            return bad(format!(
                "its entry has {n} parameters, fewer than its own {}",
                meta.user_params
            ));
        }
        None => trailing_for_version(version),
    };
    let e = KernelEntry {
        function: meta.function.clone(),
        symbol: meta.symbol.clone(),
        image,
        num_warps: meta.num_warps,
        shared_bytes: shared,
        user_params: meta.user_params,
        trailing_params: trailing,
        global_scratch_bytes: meta.global_scratch_size,
        global_scratch_align: meta.global_scratch_align.max(1),
    };
    if e.trailing_params > artifact::MAX_TRAILING_PARAMS {
        return bad(format!(
            "{trailing} trailing parameters (this Triton version's layout is unknown to kiln)"
        ));
    }
    if e.global_scratch_bytes > artifact::MAX_SCRATCH_PER_PROGRAM
        || !e.global_scratch_align.is_power_of_two()
        || e.global_scratch_align > artifact::MAX_SCRATCH_ALIGN
    {
        return bad(format!(
            "{} bytes of global scratch aligned to {}: more than kiln gives",
            e.global_scratch_bytes, e.global_scratch_align
        ));
    }
    Ok(e)
}

/// Reads at most `max` bytes of `path`; `None` if it is missing, larger, or unreadable.
fn read_bounded(path: &Path, max: u64) -> Option<Vec<u8>> {
    let f = fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(max + 1).read_to_end(&mut buf).ok()?;
    (buf.len() as u64 <= max).then_some(buf)
}

/// Compiles `candidate` with the plan in `job`; files go under `./triton` (scratch).
/// `Err` is an infrastructure failure (no python, Triton changed, scratch unwritable),
/// never the candidate's fault.
pub fn compile(
    candidate: &Candidate,
    job: &TritonJob,
    timeout: Duration,
) -> Result<Compiled, String> {
    let started = Instant::now();
    let done =
        |artifact: Option<Vec<u8>>, log: String, message: String, verdict: Verdict| Compiled {
            artifact,
            info: crate::engine::compile_info(started, log),
            message,
            verdict,
        };
    let arch: u32 = job
        .arch
        .trim_start_matches("sm_")
        .trim_end_matches('a')
        .parse()
        .map_err(|_| format!("cannot compile triton kernels for {:?}", job.arch))?;
    let dir = std::env::current_dir()
        .map_err(|e| format!("no working directory: {e}"))?
        .join("triton");
    let prepared = (|| -> std::io::Result<()> {
        for sub in ["home", "cache", "tmp"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        fs::write(dir.join("candidate.py"), &candidate.source)?;
        write_driver(&dir)?;
        let request = serde_json::json!({
            "source": dir.join("candidate.py"),
            "arch": arch,
            "kernels": job.plan.kernels,
        });
        fs::write(dir.join("request.json"), request.to_string())?;
        Ok(())
    })();
    prepared.map_err(|e| format!("cannot write the triton job into scratch: {e}"))?;
    let mut cmd = Command::new(&job.python);
    cmd.args(["-I", "-B"])
        .arg(dir.join("driver.py"))
        .arg(dir.join("request.json"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir.join("home"))
        .env("TMPDIR", dir.join("tmp"))
        .env("TRITON_CACHE_DIR", dir.join("cache"))
        .env("TRITON_HOME", dir.join("home"))
        .env("LANG", "C.UTF-8")
        .current_dir(&dir);
    let run = run_captured(&mut cmd, timeout, LOG_CAP)
        .map_err(|e| format!("cannot run {}: {e}", job.python.display()))?;
    let log = run.output;
    if run.timed_out {
        let msg = format!(
            "triton compile timed out after {:.1} s",
            timeout.as_secs_f64()
        );
        return Ok(done(None, log, msg, Verdict::CompileError));
    }
    let Some(bytes) = read_bounded(&dir.join("result.json"), MAX_RESULT_BYTES) else {
        let last = log
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        let status = run
            .status
            .map_or("status lost".into(), crate::jail::sys::describe_status);
        // Python reports an allocation the address-space limit refused as MemoryError.
        let limit = if log.contains("MemoryError") {
            Some(crate::engine::limits::address_space())
        } else {
            crate::engine::limits::compiler_limit(run.status, &log)
        };
        let msg = match limit {
            Some(limit) => format!("the triton compiler {status}: {limit}"),
            None => format!("the triton compiler {status}: {last}"),
        };
        return Ok(done(None, log, msg, Verdict::CompileError));
    };
    let answer: Answer = match serde_json::from_slice(&bytes) {
        Ok(a) => a,
        Err(e) => {
            let msg = format!("the triton compile gave an unreadable answer: {e}");
            return Ok(done(None, log, msg, Verdict::CompileError));
        }
    };
    if answer.triton_version != job.version {
        return Err(format!(
            "triton {} answered, but kilnd found {} at start: restart kilnd after changing triton",
            answer.triton_version, job.version
        ));
    }
    if !answer.ok {
        let mut msg = answer.message.unwrap_or_default();
        msg.truncate(4096);
        let at = answer.kernel.and_then(|k| {
            let launch = job.plan.launches.iter().position(|&l| l == k)?;
            let function = &job.plan.kernels.get(k)?.function;
            Some(format!("launches[{launch}] (kernel {function:?}): "))
        });
        let verdict = if answer.kind.as_deref() == Some("launch") {
            Verdict::InvalidLaunch
        } else {
            Verdict::CompileError
        };
        return Ok(done(
            None,
            log,
            format!("{}{msg}", at.unwrap_or_default()),
            verdict,
        ));
    }
    let answered = |why: String| {
        Ok(done(
            None,
            log.clone(),
            format!("the triton compile's answer was refused: {why}"),
            Verdict::CompileError,
        ))
    };
    if answer.kernels.len() != job.plan.kernels.len() {
        return answered(format!(
            "{} kernels reported for {} asked",
            answer.kernels.len(),
            job.plan.kernels.len()
        ));
    }
    let mut kernels = Vec::new();
    let mut images = Vec::new();
    for (i, (meta, spec)) in answer.kernels.iter().zip(&job.plan.kernels).enumerate() {
        let e = match entry(meta, i, &job.version, &spec.function) {
            Ok(e) => e,
            Err(why) => return answered(why),
        };
        if e.user_params as usize != spec.arg_types.len() {
            return answered(format!(
                "kernel {i}: {} parameters for {} arguments",
                e.user_params,
                spec.arg_types.len()
            ));
        }
        let Some(image) = read_bounded(&dir.join(format!("k{i}.cubin")), artifact::MAX_IMAGE_BYTES)
            .filter(|b| b.starts_with(b"\x7fELF"))
        else {
            return answered(format!("kernel {i}: no CUBIN"));
        };
        kernels.push(e);
        images.push(image);
    }
    let art = Artifact {
        manifest: Manifest {
            triton_version: answer.triton_version.clone(),
            arch: job.arch.clone(),
            images: images.iter().map(|i| i.len() as u64).collect(),
            kernels,
            launches: job.plan.launches.clone(),
        },
        images,
    };
    if let Err(why) = art.manifest.check() {
        return answered(why);
    }
    let mut c = done(Some(art.encode()), log, String::new(), Verdict::Ok);
    let per_kernel: Vec<String> = answer
        .kernels
        .iter()
        .map(|k| format!("{} {:.2} s", k.function, k.compile_s))
        .collect();
    tracing::debug!(
        import_s = answer.import_s.unwrap_or(0.0),
        total_s = answer.total_s.unwrap_or(0.0),
        kernels = %per_kernel.join(", "),
        "triton compile"
    );
    if c.info.log.is_empty() {
        c.info.log = format!(
            "triton {}: {}",
            answer.triton_version,
            per_kernel.join(", ")
        );
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_is_written_with_the_one_rules_file_beside_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_driver(dir.path()).expect("write");
        let rules = fs::read_to_string(dir.path().join(kiln_types::triton::RULES_FILE))
            .expect("rules beside the driver");
        assert_eq!(rules, kiln_types::triton::RULES_JSON);
        assert_eq!(
            fs::read_to_string(dir.path().join("driver.py")).expect("driver"),
            DRIVER
        );
        // The driver reads the file by that name and holds no list of its own.
        assert!(DRIVER.contains(&format!(
            "RULES_FILE = \"{}\"",
            kiln_types::triton::RULES_FILE
        )));
        for name in &kiln_types::triton::TritonRules::get().from_triton {
            assert!(!DRIVER.contains(&format!("\"{name}\"")), "{name}");
        }
    }

    #[test]
    fn trailing_parameters_follow_the_version() {
        assert_eq!(trailing_for_version("3.2.0"), 0);
        assert_eq!(trailing_for_version("3.3.1"), 1);
        assert_eq!(trailing_for_version("3.4.0"), 1);
        assert_eq!(trailing_for_version("3.5.0"), 2);
        assert_eq!(trailing_for_version("3.6.0+git1234"), 2);
    }

    fn meta() -> KernelMeta {
        KernelMeta {
            function: "k".into(),
            symbol: "k".into(),
            ptx_entry: Some("k".into()),
            ptx_params: Some(5),
            user_params: 3,
            num_warps: 4,
            num_ctas: 1,
            shared: 16,
            global_scratch_size: 0,
            global_scratch_align: 1,
            profile_scratch_size: 0,
            launch_cooperative_grid: false,
            launch_pdl: false,
            tmem_size: 0,
            compile_s: 0.3,
        }
    }

    #[test]
    fn metadata_is_checked_before_it_becomes_an_entry() {
        let e = entry(&meta(), 0, "3.6.0", "k").expect("good metadata");
        assert_eq!((e.trailing_params, e.shared_bytes, e.num_warps), (2, 16, 4));
        type Change = fn(&mut KernelMeta);
        let cases: [(Change, &str); 10] = [
            (|m| m.symbol = "k x".into(), "symbol"),
            (|m| m.num_warps = 0, "warps"),
            (|m| m.num_ctas = 2, "CTAs"),
            (|m| m.shared = 1 << 40, "shared memory"),
            (|m| m.profile_scratch_size = 8, "profile scratch"),
            (|m| m.launch_pdl = true, "programmatic"),
            (|m| m.ptx_params = Some(9), "trailing"),
            (|m| m.ptx_params = Some(1), "fewer"),
            (|m| m.global_scratch_align = 4096, "global scratch"),
            (|m| m.function = "other".into(), "compiled for"),
        ];
        for (change, needle) in cases {
            let mut m = meta();
            change(&mut m);
            let err = entry(&m, 0, "3.6.0", "k").expect_err(needle);
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }
}

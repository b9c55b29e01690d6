//! [`SandboxConfig`]: how the sandbox runs jobs (the worker, scratch, limits, the GPU and
//! its libraries, CUPTI), and where the `kiln-worker` executable is found.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::cuda::toolkit::{self, ToolkitHeaders};

/// How the sandbox runs jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxConfig {
    /// The `kiln-worker` executable (see [`default_worker_exe`]).
    pub worker_exe: PathBuf,
    /// Directory under which each job gets its own scratch directory.
    pub scratch_root: PathBuf,
    /// Paths hidden from jailed processes (the daemon's state dir, for instance).
    pub hidden_paths: Vec<PathBuf>,
    /// Wall-clock limit of the compiler.
    pub compile_timeout: Duration,
    /// Address-space limit of the compiler and of each runner, bytes (also the cgroup
    /// `memory.max` basis).
    pub memory_limit_bytes: u64,
    /// Delegated cgroup v2 directory for `memory.max`/`pids.max`, if any.
    pub cgroup_parent: Option<PathBuf>,
    /// The C compiler.
    pub cc: PathBuf,
    /// Skip the namespaces (for kernels that refuse them, or to test the fallback).
    pub disable_namespaces: bool,
    /// Bytes a candidate may print in one evaluation before it is stopped.
    pub output_limit_bytes: u64,
    /// GPU architecture cuda candidates are compiled for (`sm_90`; from the GPU's facts
    /// at daemon start, see [`SandboxConfig::use_gpu`]).
    #[serde(default = "default_arch")]
    pub cuda_arch: String,
    /// UUID of the GPU this sandbox's GPU workers use (`CUDA_VISIBLE_DEVICES`); `None`:
    /// CUDA ordinal 0.
    #[serde(default)]
    pub gpu_uuid: Option<String>,
    /// Minor number of that GPU's `/dev/nvidiaN` node; `None`: every GPU node is shown.
    #[serde(default)]
    pub gpu_minor: Option<u32>,
    /// `LD_LIBRARY_PATH` passed to cuda compiles and GPU workers (its directories are
    /// shown read-only in their jails); defaults to the caller's own.
    #[serde(default)]
    pub library_path: Option<String>,
    /// Where GPU workers find CUPTI for kernel timing (passed in `KILN_CUPTI`; a directory
    /// is shown read-only in their jails).
    #[serde(default)]
    pub cupti: kiln_gpu::cupti::CuptiSetting,
    /// The CUDA toolkit headers cuda compiles get (bound read-only into the compile jail);
    /// see [`crate::engine::cuda::toolkit`]. [`SandboxConfig::new`] discovers them.
    #[serde(default)]
    pub cuda_headers: ToolkitHeaders,
    /// The python with triton that compiles Triton candidates (found by kilnd at start,
    /// see [`crate::engine::triton::setup`]); `None`: Triton candidates cannot be
    /// compiled here.
    #[serde(default)]
    pub triton: Option<crate::engine::triton::setup::TritonSetup>,
    /// The python with torch that runs hosted `ModelNew` candidates in their jail (found by
    /// kilnd at start from `[gpu] python`, see [`crate::engine::hosted::setup`]); `None`:
    /// hosted candidates cannot be evaluated here.
    pub hosted: Option<crate::engine::hosted::setup::HostedSetup>,
    /// The folder of NVRTC precompiled headers cuda compiles start from (built by the
    /// sandbox from kiln's own text, shown read-only in compile jails; see
    /// [`crate::engine::cuda::pch`]); `None`: compiles never use one. [`SandboxConfig::new`]
    /// puts it at `scratch_root/pch`.
    #[serde(default)]
    pub pch_dir: Option<PathBuf>,
}

fn default_arch() -> String {
    crate::engine::cuda::setup::DEFAULT_ARCH.to_string()
}

impl SandboxConfig {
    /// Defaults: worker next to the current executable, `cc` from PATH, 30 s compile
    /// timeout, 2 GiB memory, 1 MiB of candidate output, namespaces on, no cgroup, the
    /// toolkit headers found by [`SandboxConfig::find_cuda_headers`] with nothing configured,
    /// no Triton, precompiled headers in `scratch_root/pch`.
    pub fn new(scratch_root: impl Into<PathBuf>) -> Self {
        let library_path = std::env::var("LD_LIBRARY_PATH")
            .ok()
            .filter(|v| !v.is_empty());
        let scratch_root: PathBuf = scratch_root.into();
        let mut cfg = SandboxConfig {
            worker_exe: default_worker_exe(),
            pch_dir: Some(scratch_root.join("pch")),
            scratch_root,
            hidden_paths: Vec::new(),
            compile_timeout: Duration::from_secs(30),
            memory_limit_bytes: 2 << 30,
            cgroup_parent: None,
            cc: PathBuf::from("cc"),
            disable_namespaces: false,
            output_limit_bytes: 1 << 20,
            cuda_arch: default_arch(),
            gpu_uuid: None,
            gpu_minor: None,
            library_path,
            cupti: kiln_gpu::cupti::CuptiSetting::Auto,
            cuda_headers: ToolkitHeaders::default(),
            triton: None,
            hosted: None,
        };
        cfg.find_cuda_headers(&[]);
        cfg
    }

    /// Looks for the CUDA toolkit headers: `configured` (`[cuda] include_dirs`) when not
    /// empty, else `$CUDA_HOME`, `/usr/local/cuda` and the python wheels beside the
    /// library path's folders (see [`toolkit::discover`]).
    pub fn find_cuda_headers(&mut self, configured: &[PathBuf]) {
        let cuda_home = std::env::var_os("CUDA_HOME").map(PathBuf::from);
        let lib_dirs: Vec<PathBuf> = self
            .library_path
            .as_deref()
            .unwrap_or("")
            .split(':')
            .filter(|d| d.starts_with('/'))
            .map(PathBuf::from)
            .collect();
        self.cuda_headers = toolkit::discover(
            configured,
            cuda_home.as_deref(),
            Path::new("/usr/local/cuda"),
            &toolkit::wheel_roots(&lib_dirs),
        );
    }

    /// Points GPU workers at the first GPU `kiln_gpu::available()` finds; false if none.
    pub fn use_first_gpu(&mut self) -> bool {
        match kiln_gpu::available() {
            Ok(f) if !f.devices.is_empty() => {
                self.use_gpu(&f.devices[0]);
                true
            }
            _ => false,
        }
    }

    /// Points GPU workers at `device` (architecture, UUID, device node).
    pub fn use_gpu(&mut self, device: &kiln_gpu::DeviceFacts) {
        self.cuda_arch = device.arch.clone();
        self.gpu_uuid = Some(device.uuid.clone());
        self.gpu_minor = crate::engine::cuda::setup::minor_number(&device.uuid);
    }
}

/// `kiln-worker` next to the current executable, else the first one on PATH, else the
/// bare name (which then fails to start with a clear error).
pub fn default_worker_exe() -> PathBuf {
    const NAME: &str = "kiln-worker";
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        let p = dir.join(NAME);
        if p.is_file() {
            return p;
        }
    }
    which(NAME).unwrap_or_else(|| PathBuf::from(NAME))
}

/// The C compiler `cc` names, found on PATH and resolved (as compiles run it).
pub fn which_cc(cc: &Path) -> PathBuf {
    let found = which(&cc.to_string_lossy()).unwrap_or_else(|| cc.to_path_buf());
    std::fs::canonicalize(&found).unwrap_or(found)
}

/// `name` on PATH (a name with a `/` is taken as it is).
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

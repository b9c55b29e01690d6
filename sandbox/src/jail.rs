//! The jail: start a command isolated from the host (docs/security.md, section 3).
//!
//! Two halves, two processes:
//!
//! - the **caller side** ([`spawn`]) runs in kilnd (multithreaded). It only builds a
//!   validated [`JailSpec`] and starts the single-threaded helper (`kiln-worker jail SPEC`)
//!   with `std::process::Command` — no `pre_exec`, nothing unsafe after fork. It reads the
//!   helper's [`JailReport`], enforces the wall-clock deadline and kills the whole tree;
//! - the **helper side** ([`helper::run`]) runs in that fresh, single-threaded process and
//!   does the setup in order: close fds, cgroup, namespaces, fork (the child is PID 1 of the
//!   new PID namespace), parent-death signal, private root, hidden paths, rlimits,
//!   `no_new_privs`, seccomp, report, exec.
//!
//! Every layer that can be missing on some kernel (namespaces, cgroup v2) degrades: the
//! helper records why in the report and carries on with the remaining layers. Layers that
//! must hold (rlimits, `no_new_privs`, seccomp) abort the start when they fail.

pub mod cgroup;
pub mod helper;
pub mod mounts;
pub mod seccomp;
pub mod spawn;
pub mod sys;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use spawn::{Ended, JailedChild, Killer, spawn};

/// The seccomp policy a jailed process runs under (see [`seccomp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// kiln-worker compiling: runs the system C compiler and its helpers.
    Compile,
    /// kiln-worker evaluating: spawns runners, maps shared buffers, times runs.
    Worker,
    /// A runner holding candidate code: applied by the runner itself, never by the helper.
    Runner,
    /// kiln-worker evaluating on a GPU: the CUDA driver runs in this process (device
    /// ioctls, shared mappings of `/dev/nvidia*`, driver threads).
    GpuWorker,
    /// `kiln-plugin-host` running one search's proposer in wasmtime: JIT code (executable
    /// mappings), threads, signal-based traps, and a Unix socket back to kilnd.
    PluginHost,
}

/// Resource limits (setrlimit) for the jailed process and its children.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// RLIMIT_CPU, seconds.
    pub cpu_s: u64,
    /// RLIMIT_NOFILE.
    pub nofile: u64,
    /// RLIMIT_NPROC (per user namespace on Linux >= 5.14).
    pub nproc: u64,
    /// RLIMIT_FSIZE, bytes.
    pub fsize_bytes: u64,
    /// RLIMIT_AS, bytes; `None` leaves it unlimited (CUDA processes need that: the driver reserves address space of about twice the device memory).
    pub as_bytes: Option<u64>,
}

/// Where to put the jailed tree in cgroup v2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CgroupSpec {
    /// A delegated cgroup v2 directory the helper may create children in.
    pub parent: PathBuf,
    /// Name of the child cgroup for this job.
    pub name: String,
    /// memory.max, bytes.
    pub memory_max: u64,
    /// pids.max.
    pub pids_max: u64,
}

/// Everything the helper needs, validated by [`JailSpec::validate`] on both sides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailSpec {
    /// Seccomp policy for the payload.
    pub role: Role,
    /// Program to exec (host path; appears as `/kiln/<file name>` inside a private root).
    pub program: PathBuf,
    /// Arguments after argv[0].
    pub args: Vec<String>,
    /// The complete environment of the payload (everything else is dropped).
    pub env: Vec<(String, String)>,
    /// Private scratch directory (host path; `/scratch` inside a private root), writable.
    pub scratch: PathBuf,
    /// An empty directory the helper mounts the private root on (only in its own mount
    /// namespace; on the host it stays empty).
    pub root_dir: PathBuf,
    /// Host paths made visible read-only at the same path inside the private root.
    pub ro_paths: Vec<PathBuf>,
    /// Host paths made visible read-only at another, fixed path inside the private root:
    /// (host path, path inside). The compile role's CUDA toolkit headers.
    #[serde(default)]
    pub ro_binds: Vec<(PathBuf, PathBuf)>,
    /// Host paths hidden behind an empty read-only tmpfs (or /dev/null for files).
    pub hidden_paths: Vec<PathBuf>,
    /// Device nodes bound at the same path inside the private root (GPU workers: their
    /// `/dev/nvidia*` nodes). Best effort: a node that cannot be bound is left out.
    #[serde(default)]
    pub devices: Vec<PathBuf>,
    /// Host paths shown read-only when they exist and can be bound (GPU workers:
    /// `/proc/driver/nvidia`, PCI parts of `/sys`). Best effort.
    #[serde(default)]
    pub optional_ro_paths: Vec<PathBuf>,
    /// Try the user, PID, network, mount and IPC namespaces.
    pub namespaces: bool,
    /// rlimits.
    pub limits: Limits,
    /// cgroup v2 placement, when a delegated cgroup is configured.
    pub cgroup: Option<CgroupSpec>,
}

/// The entry of [`JailSpec::env`] that asks the helper to exec the payload with
/// address-space randomization off (see [`JailSpec::disable_aslr`]); the helper takes it
/// out of the payload's environment.
pub const NO_ASLR_ENV: &str = "KILN_JAIL_NO_ASLR";

impl JailSpec {
    /// Asks for the payload to be exec'd with address-space randomization off
    /// (`personality(ADDR_NO_RANDOMIZE)`, applied by the helper before the seccomp filter;
    /// recorded as the `aslr` layer). Only compile jails that build or use an NVRTC
    /// precompiled header ask for it (docs/security.md, "Precompiled headers"): such a
    /// header is only usable in a process whose memory layout matches the one that made it.
    ///
    /// Carried as an entry of `env` that the helper consumes, so that every spec written
    /// before this switch existed still reads the same.
    pub fn disable_aslr(&mut self) {
        if !self.wants_no_aslr() {
            self.env.push((NO_ASLR_ENV.to_string(), "1".to_string()));
        }
    }

    /// Whether [`JailSpec::disable_aslr`] was asked for.
    pub fn wants_no_aslr(&self) -> bool {
        self.env.iter().any(|(k, v)| k == NO_ASLR_ENV && v == "1")
    }

    /// The payload's environment: [`JailSpec::env`] without the helper's own entries.
    pub fn payload_env(&self) -> Vec<(String, String)> {
        self.env
            .iter()
            .filter(|(k, _)| k != NO_ASLR_ENV)
            .cloned()
            .collect()
    }
}

/// Why a spec is refused before anything happens.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    /// A path that must be absolute is not.
    #[error("{field}: {path:?} is not an absolute path")]
    NotAbsolute {
        /// Which field.
        field: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// A string containing a NUL byte or `=` in an env name.
    #[error("{0}: contains a NUL byte or is malformed")]
    Malformed(&'static str),
    /// The cgroup name is not a plain name.
    #[error("cgroup name {0:?} must be letters, digits, '-' and '_'")]
    CgroupName(String),
}

impl JailSpec {
    /// Checks paths and strings; the helper runs this again before acting on the spec.
    pub fn validate(&self) -> Result<(), SpecError> {
        let abs = |field: &'static str, p: &PathBuf| {
            if p.is_absolute() && !p.as_os_str().as_encoded_bytes().contains(&0) {
                Ok(())
            } else {
                Err(SpecError::NotAbsolute {
                    field,
                    path: p.clone(),
                })
            }
        };
        abs("program", &self.program)?;
        abs("scratch", &self.scratch)?;
        abs("root_dir", &self.root_dir)?;
        for p in &self.ro_paths {
            abs("ro_paths", p)?;
        }
        for p in &self.hidden_paths {
            abs("hidden_paths", p)?;
        }
        for (host, inside) in &self.ro_binds {
            abs("ro_binds", host)?;
            abs("ro_binds", inside)?;
            if inside
                .components()
                .any(|c| c == std::path::Component::ParentDir)
            {
                return Err(SpecError::NotAbsolute {
                    field: "ro_binds",
                    path: inside.clone(),
                });
            }
        }
        for p in self.devices.iter().chain(&self.optional_ro_paths) {
            abs("devices", p)?;
        }
        if self.args.iter().any(|a| a.contains('\0')) {
            return Err(SpecError::Malformed("args"));
        }
        if self
            .env
            .iter()
            .any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0'))
        {
            return Err(SpecError::Malformed("env"));
        }
        if let Some(cg) = &self.cgroup {
            abs("cgroup.parent", &cg.parent)?;
            let ok = !cg.name.is_empty()
                && cg
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !ok {
                return Err(SpecError::CgroupName(cg.name.clone()));
            }
        }
        Ok(())
    }
}

/// Whether one isolation layer is in force, and why (not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerStatus {
    /// Layer name (`user-namespace`, `seccomp`, `cgroup`...).
    pub name: String,
    /// True if and only if the layer was applied.
    pub active: bool,
    /// What was applied, or why not.
    pub detail: String,
}

impl LayerStatus {
    /// An applied layer.
    pub fn on(name: &str, detail: impl Into<String>) -> Self {
        LayerStatus {
            name: name.to_string(),
            active: true,
            detail: detail.into(),
        }
    }

    /// A layer that is not in force.
    pub fn off(name: &str, detail: impl Into<String>) -> Self {
        LayerStatus {
            name: name.to_string(),
            active: false,
            detail: detail.into(),
        }
    }
}

/// The helper's first frame on stdout: the layers in force, or the step that failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailReport {
    /// Layers, in the order they were set up.
    pub layers: Vec<LayerStatus>,
    /// Set when a mandatory step failed and the payload was not started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl JailReport {
    /// True if and only if the named layer is active.
    pub fn is_active(&self, name: &str) -> bool {
        self.layers.iter().any(|l| l.name == name && l.active)
    }
}

/// A failed jail step (helper side), or a failure to start or talk to the helper (caller side).
#[derive(Debug, Error)]
pub enum JailError {
    /// The spec was refused.
    #[error("invalid jail spec: {0}")]
    Spec(#[from] SpecError),
    /// Starting the helper process failed.
    #[error("cannot start the jail helper {path}: {source}")]
    SpawnHelper {
        /// The helper executable.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The helper's report was missing or malformed.
    #[error("no jail report from the helper: {0}")]
    Report(String),
    /// The helper reported a failed mandatory step.
    #[error("jail setup failed: {0}")]
    Setup(String),
    /// fork failed.
    #[error("failed to fork the payload: {0}")]
    Fork(std::io::Error),
    /// setrlimit failed.
    #[error("failed to set {resource}: {source}")]
    SetRlimit {
        /// Which limit.
        resource: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// prctl(PR_SET_NO_NEW_PRIVS) failed.
    #[error("failed to set no_new_privs: {0}")]
    NoNewPrivs(std::io::Error),
    /// prctl(PR_SET_PDEATHSIG) failed, or the parent was already gone.
    #[error("failed to set the parent-death signal: {0}")]
    ParentDeathSignal(std::io::Error),
    /// The seccomp filter could not be built or loaded.
    #[error("failed to load the seccomp filter: {0}")]
    LoadSeccomp(String),
    /// chdir into the scratch directory failed.
    #[error("failed to enter the scratch directory {path}: {source}")]
    EnterScratch {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Writing the report failed.
    #[error("failed to write the jail report: {0}")]
    WriteReport(std::io::Error),
    /// execve returned.
    #[error("failed to exec {path}: {source}")]
    Exec {
        /// The program.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

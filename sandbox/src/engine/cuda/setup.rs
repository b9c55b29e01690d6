//! What a jailed GPU worker needs to see, and whether the cuda backend is usable here.
//!
//! A GPU worker's private root adds, to the system paths every jail shows:
//! - the device nodes of its own GPU only: `/dev/nvidiaN` (N = the GPU's minor number,
//!   from NVML; every `/dev/nvidia[0-9]*` when it is unknown) plus the control nodes
//!   `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`; and
//!   `CUDA_VISIBLE_DEVICES=<uuid>` so the driver enumerates that GPU alone (ordinal 0);
//! - the driver's libraries: every directory of `LD_LIBRARY_PATH`, read-only, and the
//!   variable itself through the cleared environment;
//! - best effort, read-only: `/proc/driver/nvidia` (driver parameters, GPU list) and the
//!   PCI parts of `/sys` that libcuda and NVML read (`/sys/devices`, `/sys/bus/pci`,
//!   `/sys/module/nvidia`). The host's `/proc` itself is never shown.
//!
//! No RLIMIT_AS for a GPU worker (the driver reserves about twice the device memory of
//! address space, docs/security.md section 3); the seccomp policy is `Role::GpuWorker`
//! (see `jail::seccomp::GPU_EXTRA`).

use std::path::PathBuf;

/// The architecture compiled for when nothing else is known (H100/H200).
pub const DEFAULT_ARCH: &str = "sm_90";

/// Control nodes every CUDA process opens.
const CONTROL_NODES: &[&str] = &["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// Read-only host paths shown to a GPU worker when they exist.
pub const OPTIONAL_RO: &[&str] = &[
    "/proc/driver/nvidia",
    "/sys/devices",
    "/sys/bus/pci",
    "/sys/module/nvidia",
];

/// Absolute, existing directories of an `LD_LIBRARY_PATH` value, resolved.
pub fn library_dirs(value: Option<&str>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for d in value.unwrap_or("").split(':') {
        let p = PathBuf::from(d);
        if !p.is_absolute() || !p.is_dir() {
            continue;
        }
        let p = std::fs::canonicalize(&p).unwrap_or(p);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The device nodes of the GPU with this minor number (all GPUs when `None`), plus the
/// control nodes; only those that exist.
pub fn device_nodes(minor: Option<u32>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = CONTROL_NODES.iter().map(PathBuf::from).collect();
    match minor {
        Some(n) => out.push(PathBuf::from(format!("/dev/nvidia{n}"))),
        None => {
            if let Ok(rd) = std::fs::read_dir("/dev") {
                let mut gpus: Vec<PathBuf> = rd
                    .filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .and_then(|n| n.strip_prefix("nvidia"))
                            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .collect();
                gpus.sort();
                out.extend(gpus);
            }
        }
    }
    out.retain(|p| p.exists());
    out
}

/// The `/dev/nvidiaN` minor number of the GPU with this UUID, from NVML.
pub fn minor_number(uuid: &str) -> Option<u32> {
    let nvml = kiln_gpu::telemetry::init_nvml().ok()?;
    nvml.device_by_uuid(uuid)
        .and_then(|d| d.minor_number())
        .ok()
}

/// Whether the cuda backend can run here, and why (not). Never panics.
pub fn status() -> (bool, String) {
    match kiln_gpu::available() {
        Ok(f) => {
            let gpus: Vec<String> = f
                .devices
                .iter()
                .map(|d| format!("{} ({}, {} MiB)", d.name, d.arch, d.total_mem_bytes >> 20))
                .collect();
            (
                true,
                format!(
                    "{} GPU{}: {}; driver CUDA {}.{}, NVRTC {}.{}",
                    gpus.len(),
                    if gpus.len() == 1 { "" } else { "s" },
                    gpus.join(", "),
                    f.driver_version / 1000,
                    (f.driver_version % 1000) / 10,
                    f.nvrtc_version.0,
                    f.nvrtc_version.1
                ),
            )
        }
        Err(e) => (false, e.reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_dirs_keep_absolute_existing_ones() {
        let dirs = library_dirs(Some("relative:/nonexistent-kiln:/usr::/usr"));
        assert!(dirs.iter().all(|d| d.is_absolute()));
        assert!(dirs.len() <= 1, "{dirs:?}");
    }
}

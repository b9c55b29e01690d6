//! cgroup v2 placement: `memory.max` and `pids.max` for the whole jailed tree, and
//! `cgroup.kill` to end it.
//!
//! Only used when the operator configured a delegated cgroup v2 directory (systemd
//! `Delegate=yes`). Anything missing — cgroup v1, no delegation, a controller not enabled
//! in the parent's `cgroup.subtree_control` — turns the layer off with the reason; the
//! jail carries on with rlimits.

use std::fs;
use std::path::{Path, PathBuf};

use super::{CgroupSpec, LayerStatus};

/// The job's cgroup directory.
pub fn dir(spec: &CgroupSpec) -> PathBuf {
    spec.parent.join(&spec.name)
}

/// Creates the job's cgroup, sets its limits and moves the calling process into it.
pub fn enter(spec: &CgroupSpec) -> LayerStatus {
    const NAME: &str = "cgroup";
    if !spec.parent.join("cgroup.controllers").exists() {
        return LayerStatus::off(
            NAME,
            format!("{} is not a cgroup v2 directory", spec.parent.display()),
        );
    }
    let controllers =
        fs::read_to_string(spec.parent.join("cgroup.subtree_control")).unwrap_or_default();
    let dir = dir(spec);
    if let Err(e) = fs::create_dir(&dir) {
        return LayerStatus::off(NAME, format!("cannot create {}: {e}", dir.display()));
    }
    let mut applied = Vec::new();
    let mut missing = Vec::new();
    for (file, controller, value) in [
        ("memory.max", "memory", spec.memory_max),
        ("pids.max", "pids", spec.pids_max),
    ] {
        if !controllers.split_whitespace().any(|c| c == controller) {
            missing.push(format!("{controller} controller not enabled in the parent"));
            continue;
        }
        match fs::write(dir.join(file), value.to_string()) {
            Ok(()) => applied.push(format!("{file}={value}")),
            Err(e) => missing.push(format!("{file}: {e}")),
        }
    }
    if let Err(e) = fs::write(dir.join("cgroup.procs"), "0") {
        let _ = fs::remove_dir(&dir);
        return LayerStatus::off(NAME, format!("cannot join {}: {e}", dir.display()));
    }
    if applied.is_empty() {
        return LayerStatus::off(
            NAME,
            format!(
                "joined {} but set no limit: {}",
                dir.display(),
                missing.join("; ")
            ),
        );
    }
    let mut detail = format!("{} ({})", dir.display(), applied.join(", "));
    if !missing.is_empty() {
        detail.push_str(&format!("; not set: {}", missing.join("; ")));
    }
    LayerStatus::on(NAME, detail)
}

/// Kills everything left in the job's cgroup and removes it (caller side, after the
/// helper has exited). Best effort: a missing cgroup is fine.
pub fn remove(spec: &CgroupSpec) {
    let dir = dir(spec);
    if !dir.exists() {
        return;
    }
    let _ = fs::write(dir.join("cgroup.kill"), "1");
    for _ in 0..50 {
        if fs::remove_dir(&dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    tracing::warn!(cgroup = %dir.display(), "could not remove the job's cgroup");
}

/// True if and only if `path` looks like a usable cgroup v2 directory.
pub fn is_v2(path: &Path) -> bool {
    path.join("cgroup.controllers").exists()
}

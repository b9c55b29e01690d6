//! KernelBench-format fixtures for tests that need a python with torch: the python
//! (`KILN_PYTHON`, else `python3`; `None` with the reason printed when it cannot import
//! torch), the torch runner on it, and kiln's own tiny KernelBench-format files in
//! `problems/kernelbench-format/tiny` imported once per test binary (as `kiln problems
//! import kernelbench` does: the runner's describe, then `kiln_types::kernelbench::write`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use kiln_torch_runner::{ReferenceRunner, TorchRunner};
use kiln_types::ProblemSpec;

/// The python with torch, or `None` (the test skips, saying why).
pub fn python() -> Option<PathBuf> {
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIP: {python} cannot import torch (set KILN_PYTHON to a python with torch)");
        return None;
    }
    Some(PathBuf::from(python))
}

/// The torch runner on that python.
pub fn helper() -> Option<TorchRunner> {
    Some(TorchRunner {
        python: python()?,
        script: Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemon/torch-runner/kiln_torch.py"),
        timeout: Duration::from_secs(120),
    })
}

/// A CPU reference runner.
pub fn runner() -> Option<ReferenceRunner> {
    Some(ReferenceRunner::cpu(helper()?))
}

/// The tiny fixtures imported once per test binary, under cargo's test scratch folder.
pub fn imported() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        import_folder(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../problems/kernelbench-format/tiny"),
            "tiny",
            kiln_types::kernelbench::KERNELBENCH_TOLERANCE,
        )
    })
}

/// Every KernelBench-format file of `src` imported with tolerance `tol` into a folder of
/// its own (named by `tag` and this process) under cargo's test scratch folder, as `kiln
/// problems import kernelbench` does; files the import refuses are left out. Returns the
/// folder.
pub fn import_folder(src: &Path, tag: &str, tol: kiln_types::Tolerance) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("kernelbench-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(src)
        .expect("fixtures")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "py"))
        .collect();
    files.sort();
    let helper = helper().expect("a python with torch");
    let described =
        kiln_torch_runner::process::describe(&helper, &files, (256 << 20, 1 << 32), tol)
            .expect("described");
    for d in &described {
        if d.refused.is_none() {
            kiln_types::kernelbench::write(&dir, d, tol).expect("written");
        }
    }
    dir
}

/// One imported fixture, by name.
pub fn fixture(name: &str) -> ProblemSpec {
    ProblemSpec::load_dir(&imported().join(name)).expect("fixture loads")
}

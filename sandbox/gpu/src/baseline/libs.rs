//! Whether the baseline libraries can be loaded, without loading anything that panics.
//!
//! cudarc's `culib()` panics when no candidate name of a library opens (and a missing
//! symbol panics later). [`cublas_available`] and [`cudnn_available`] call cudarc's
//! `is_culib_present`, which only tries `dlopen` on each name cudarc would use
//! (`libcublas.so.13`, `libcudnn.so.9`, ...), and return a typed [`Unavailable`] naming the
//! library. [`library_report`] looks for the files in given directories without loading
//! them (for `kiln doctor` on the daemon's side, whose loader path differs from a GPU
//! worker's).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Unavailable;

/// Checks that libcublas can be loaded (by the names cudarc tries).
pub fn cublas_available() -> Result<(), Unavailable> {
    // SAFETY: `is_culib_present` only calls `dlopen` on candidate names and drops the
    // handle; loading runs the library's ELF initialisers, as any later use would.
    if unsafe { cudarc::cublas::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Unavailable::new(
            "libcublas.so not found: cuBLAS (CUDA 13) is not installed or not on the GPU \
             workers' library path (add its directory to [gpu] library_dirs)",
        ))
    }
}

/// Checks that libcudnn can be loaded (by the names cudarc tries).
pub fn cudnn_available() -> Result<(), Unavailable> {
    // SAFETY: as in `cublas_available`.
    if unsafe { cudarc::cudnn::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Unavailable::new(
            "libcudnn.so not found: cuDNN 9 is not installed or not on the GPU workers' \
             library path (it often ships only inside torch's wheel, site-packages/nvidia/\
             cudnn/lib: add that directory to [gpu] library_dirs)",
        ))
    }
}

/// Where a baseline library was found, if anywhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LibraryStatus {
    /// `cublas` or `cudnn`.
    pub name: String,
    /// True if and only if a file was found.
    pub found: bool,
    /// The file, or where it was looked for.
    pub detail: String,
}

/// File-name stems of each library (`libcublas.so.13`, `libcudnn.so.9`).
const LIBS: &[(&str, &str)] = &[("cublas", "libcublas.so"), ("cudnn", "libcudnn.so")];

/// Directories the system loader searches by default.
const SYSTEM_DIRS: &[&str] = &[
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
];

/// The first file named like `stem` or `stem.N…` in `dir`.
pub fn find_in(dir: &Path, stem: &str) -> Option<PathBuf> {
    let mut hits: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n == stem || n.strip_prefix(stem).is_some_and(|r| r.starts_with('.'))
            })
        })
        .collect();
    hits.sort();
    hits.into_iter().next()
}

/// Looks for each baseline library in `dirs` (then the system's library directories),
/// without loading it.
pub fn library_report(dirs: &[PathBuf]) -> Vec<LibraryStatus> {
    let all: Vec<PathBuf> = dirs
        .iter()
        .cloned()
        .chain(SYSTEM_DIRS.iter().map(PathBuf::from))
        .collect();
    LIBS.iter()
        .map(
            |(name, stem)| match all.iter().find_map(|d| find_in(d, stem)) {
                Some(p) => LibraryStatus {
                    name: name.to_string(),
                    found: true,
                    detail: p.display().to_string(),
                },
                None => LibraryStatus {
                    name: name.to_string(),
                    found: false,
                    detail: format!(
                        "{stem}* not found in {} directories (library_dirs, then the system's)",
                        all.len()
                    ),
                },
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_versioned_names_only() {
        let dir = std::env::temp_dir().join(format!("kiln-libs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("libcudnn.so.9"), b"").expect("write");
        std::fs::write(dir.join("libcudnn_ops.so.9"), b"").expect("write");
        assert_eq!(
            find_in(&dir, "libcudnn.so"),
            Some(dir.join("libcudnn.so.9"))
        );
        assert_eq!(find_in(&dir, "libcublas.so"), None);
        let report = library_report(std::slice::from_ref(&dir));
        let cudnn = report.iter().find(|l| l.name == "cudnn").expect("cudnn");
        assert!(cudnn.found, "{cudnn:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn missing_libraries_are_typed_errors_not_panics() {
        // On a machine without cuBLAS/cuDNN both are `Err` with the library named; with
        // them, `Ok`. Either way, no panic.
        if let Err(e) = cublas_available() {
            assert!(e.reason.contains("libcublas"), "{e}");
        }
        if let Err(e) = cudnn_available() {
            assert!(e.reason.contains("libcudnn"), "{e}");
        }
    }
}

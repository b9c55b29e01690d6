//! The libraries GPU workers may load beyond the driver's (cuBLAS, cuDNN): `[gpu]
//! library_dirs` plus, when enabled, the `nvidia/*/lib` folders of python's wheels (where
//! torch's cuDNN lives), joined onto the workers' `LD_LIBRARY_PATH`.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::config::Config;

/// `existing` (an `LD_LIBRARY_PATH` value) with `dirs` appended, without duplicates.
pub fn library_path(existing: Option<&str>, dirs: &[String]) -> Option<String> {
    let mut parts: Vec<String> = existing
        .unwrap_or("")
        .split(':')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    for d in dirs {
        if !d.is_empty() && !parts.contains(d) {
            parts.push(d.clone());
        }
    }
    (!parts.is_empty()).then(|| parts.join(":"))
}

/// `[gpu] library_dirs`, then (when enabled) python's nvidia wheel folders; asked once.
pub fn library_dirs(config: &Config) -> Vec<String> {
    let mut dirs = config.gpu.library_dirs.clone();
    if config.gpu.discover_python_libraries && !config.gpu.python.is_empty() {
        static FOUND: OnceLock<Vec<String>> = OnceLock::new();
        for d in FOUND.get_or_init(|| discover_python_dirs(&config.gpu.python)) {
            if !dirs.contains(d) {
                dirs.push(d.clone());
            }
        }
    }
    dirs
}

/// Lists `nvidia/*/lib` folders holding libcudnn or libcublas in `python`'s packages.
const DISCOVER: &str = "import os, sys\n\
try:\n    import nvidia\nexcept Exception:\n    sys.exit(0)\n\
for base in list(getattr(nvidia, '__path__', [])):\n\
    for sub in sorted(os.listdir(base)):\n\
        d = os.path.join(base, sub, 'lib')\n\
        if os.path.isdir(d) and any(f.startswith(('libcudnn.so', 'libcublas.so')) for f in os.listdir(d)):\n\
            print(d)\n";

/// Asks `python` where its nvidia wheels keep cuDNN/cuBLAS (5 s limit; nothing on any
/// failure).
pub fn discover_python_dirs(python: &str) -> Vec<String> {
    use std::io::Read;
    let child = std::process::Command::new(python)
        .args(["-I", "-c", DISCOVER])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return Vec::new();
    };
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Vec::new();
            }
        }
    }
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    let dirs: Vec<String> = out
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('/') && PathBuf::from(l).is_dir())
        .map(str::to_string)
        .collect();
    if !dirs.is_empty() {
        tracing::info!(?dirs, "baseline libraries found in python's nvidia wheels");
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_path_appends_without_duplicates() {
        assert_eq!(
            library_path(Some("/a:/b"), &["/b".into(), "/c".into()]).as_deref(),
            Some("/a:/b:/c")
        );
        assert_eq!(library_path(None, &[]), None);
        assert_eq!(
            library_path(Some(""), &["/x".into()]).as_deref(),
            Some("/x")
        );
    }

    #[test]
    fn python_discovery_never_fails() {
        assert!(discover_python_dirs("/nonexistent/python3").is_empty());
    }
}

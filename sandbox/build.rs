//! Computes `KILN_COMPILE_BUILD`: a content hash of everything in this workspace that turns
//! a candidate's source into its artifact (the backends' compile code, kiln-gpu's NVRTC
//! recipe, stand-in headers and artifact format), so that a compile cached by one kiln
//! build is never served to another whose compile path differs.

use std::path::{Path, PathBuf};

/// Files and folders (relative to this crate) whose contents make up the compile path.
const COMPILE_PATH: &[&str] = &[
    "src/engine/cuda",
    "src/engine/cuda.rs",
    "src/engine/host",
    "src/engine/host.rs",
    "src/engine/triton",
    "src/engine/triton.rs",
    "src/engine/limits.rs",
    "src/engine/hosted/build.rs",
    "src/engine/hosted/artifact.rs",
    "hosted/kiln_hosted.py",
    "hosted/kiln_extract.py",
    // kiln's Triton rules, which kiln-worker writes beside driver.py and kiln_extract.py:
    // kiln-types owns the file (the CLI reads it too), so it lies outside this crate.
    "../sdk/types/src/triton_rules.json",
    "src/worker.rs",
    "gpu/src/nvrtc.rs",
    "gpu/src/cxx.rs",
    "gpu/src/cxx",
    "gpu/src/artifact.rs",
];

fn files_under(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        entries.sort();
        for e in entries {
            files_under(&e, out);
        }
    } else if p.is_file() {
        out.push(p.to_path_buf());
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    let mut files = Vec::new();
    for rel in COMPILE_PATH {
        let p = root.join(rel);
        println!("cargo:rerun-if-changed={}", p.display());
        files_under(&p, &mut files);
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(
        std::env::var("CARGO_PKG_VERSION")
            .unwrap_or_default()
            .as_bytes(),
    );
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap_or(f);
        hasher.update(rel.to_string_lossy().as_bytes());
        hasher.update(b"\0");
        hasher.update(&std::fs::read(f).unwrap_or_default());
        hasher.update(b"\0");
    }
    let hash = hasher.finalize().to_hex();
    println!("cargo:rustc-env=KILN_COMPILE_BUILD={}", &hash[..16]);
}

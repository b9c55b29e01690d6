//! Builds the guest components once per test binary:
//! `cargo build --release --target wasm32-wasip2` of the example and the test plugins,
//! in `target/plugin-guests` (its own target dir, so the build never waits on the lock
//! of the `cargo test` that runs us). Set `KILN_PLUGIN_WASM_DIR` to a folder of
//! prebuilt `.wasm` files (scripts/build-plugins.sh) to skip the build.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The guest crates the tests use.
pub const CRATES: &[&str] = &[
    "kiln-example-minimal",
    "kiln-test-plugin-abuse",
    "kiln-test-plugin-snoop-fs",
    "kiln-test-plugin-snoop-net",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn build() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("KILN_PLUGIN_WASM_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let root = workspace_root();
    let target_dir = root.join("target/plugin-guests");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            "wasm32-wasip2",
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    for c in CRATES {
        cmd.args(["-p", c]);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run cargo to build the guest plugins: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the guest plugins failed (is the target installed? `rustup target add wasm32-wasip2`):\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(target_dir.join("wasm32-wasip2/release"))
}

/// The folder holding the built `.wasm` files.
pub fn dir() -> &'static Path {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match DIR.get_or_init(build) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// The path of one guest's component, by crate name (`kiln-test-plugin-abuse`).
pub fn path(krate: &str) -> PathBuf {
    dir().join(format!("{}.wasm", krate.replace('-', "_")))
}

/// The bytes of one guest's component.
pub fn bytes(krate: &str) -> Vec<u8> {
    let p = path(krate);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// `bytes` with every occurrence of `from` replaced by `to` (same length).
pub fn patched(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = bytes.to_vec();
    let mut found = 0;
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            found += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    assert!(found > 0, "pattern not found");
    out
}

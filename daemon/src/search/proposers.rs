//! Finding installed proposers by name.

use std::path::PathBuf;

use crate::config::SearchConfig;

/// Folders searched for `NAME.wasm`, in order.
pub fn proposer_dirs(cfg: &SearchConfig) -> Vec<PathBuf> {
    if !cfg.proposers_dir.is_empty() {
        return vec![PathBuf::from(&cfg.proposers_dir)];
    }
    let mut dirs = Vec::new();
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
    {
        dirs.push(exe_dir.join("proposers"));
        dirs.push(exe_dir.join("../share/kiln/proposers"));
    }
    dirs.push(PathBuf::from("/usr/lib/kiln/proposers"));
    dirs
}

/// The wasm file of an installed proposer. Names are plain identifiers (letters, digits,
/// `-`, `_`, starting with a letter or digit: `kiln_types::names`), never paths.
pub fn find_proposer(cfg: &SearchConfig, name: &str) -> Result<PathBuf, String> {
    kiln_types::names::check(kiln_types::names::NameKind::Proposer, name)?;
    let dirs = proposer_dirs(cfg);
    for d in &dirs {
        let p = d.join(format!("{name}.wasm"));
        if p.is_file() {
            return Ok(p);
        }
    }
    let installed: Vec<String> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".wasm"))
                .map(str::to_string)
        })
        .collect();
    Err(format!(
        "no proposer named {name:?} (installed: {}; looked in {})",
        if installed.is_empty() {
            "none".to_string()
        } else {
            installed.join(", ")
        },
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

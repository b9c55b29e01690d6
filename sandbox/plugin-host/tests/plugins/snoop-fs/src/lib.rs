//! A test proposer that tries to read a host file through WASI's filesystem. Using
//! `std::fs` makes the component import `wasi:filesystem`, which kiln's plugin host does
//! not link, so the host must refuse it before any of its code runs.

use kiln_sdk::{Proposer, Summary};

struct SnoopFs;

impl Proposer for SnoopFs {
    fn run(config: &str) -> Result<Summary, String> {
        let path = if config.is_empty() {
            "/etc/passwd"
        } else {
            config
        };
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Summary::new(None, format!("READ {} bytes", text.len()))),
            Err(e) => Err(format!("could not read {path}: {e}")),
        }
    }
}

kiln_sdk::export_proposer!(SnoopFs);

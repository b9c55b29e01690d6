//! Builds the evaluation backends this daemon can offer, and reports on each.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::backend::{Backend, BackendStatus};
use crate::config::Config;

/// The backends built at start, their status and the jail's layers.
pub struct Built {
    /// Backends that take jobs (usable or not; the scheduler asks each).
    pub backends: Vec<Arc<dyn Backend>>,
    /// Status of every backend kiln knows, usable or not.
    pub status: Vec<BackendStatus>,
    /// The jail's layers as probed at start.
    pub jail: Value,
}

/// Builds the backends. Runs before the async runtime starts (probes fork).
pub fn build(_config: &Config, _state_dir: &Path) -> Built {
    let status = vec![
        BackendStatus {
            name: "host".into(),
            usable: false,
            detail: "the host backend is not built into this kilnd yet".into(),
        },
        BackendStatus {
            name: "cuda".into(),
            usable: false,
            detail: "the cuda backend is not built into this kilnd yet".into(),
        },
    ];
    Built {
        backends: Vec::new(),
        status,
        jail: json!({"layers": []}),
    }
}

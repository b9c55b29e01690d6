//! Logging setup: journald under systemd, otherwise text or JSON on stderr.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the global subscriber. `level` is a tracing filter; `KILN_LOG` overrides it.
pub fn init(level: &str, json: bool) {
    let filter = EnvFilter::try_from_env("KILN_LOG")
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let under_systemd = std::env::var_os("JOURNAL_STREAM").is_some();
    if under_systemd && let Ok(layer) = tracing_journald::layer() {
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(layer)
            .try_init();
        return;
    }
    let ansi = std::io::stderr().is_terminal();
    if json {
        let _ = tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    } else {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .try_init();
    }
}

//! A test proposer that tries to open a TCP connection and read the wall clock through
//! WASI. Using `std::net` and `SystemTime` makes the component import `wasi:sockets` and
//! `wasi:clocks`, which kiln's plugin host does not link, so the host must refuse it
//! before any of its code runs.

use kiln_sdk::{Proposer, Summary};

struct SnoopNet;

impl Proposer for SnoopNet {
    fn run(config: &str) -> Result<Summary, String> {
        let addr = if config.is_empty() {
            "127.0.0.1:22"
        } else {
            config
        };
        let now = std::time::SystemTime::now();
        match std::net::TcpStream::connect(addr) {
            Ok(_) => Ok(Summary::new(
                None,
                format!("CONNECTED to {addr} at {now:?}"),
            )),
            Err(e) => Err(format!("could not connect to {addr}: {e}")),
        }
    }
}

kiln_sdk::export_proposer!(SnoopNet);

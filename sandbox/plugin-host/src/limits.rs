//! The limits a plugin runs under, and the [`Limiter`] that enforces the memory cap and
//! records what the plugin asked for.

use std::time::Duration;

use thiserror::Error;
use wasmtime::ResourceLimiter;

/// Longest log line forwarded to kilnd, in bytes; longer ones are cut (kilnd's own
/// limit, from kiln-types).
pub const MAX_LOG_BYTES: usize = kiln_types::plugin::MAX_LOG_BYTES;
/// Largest LLM prompt forwarded to kilnd, in bytes (the ABI's limit, from kiln-types).
pub const MAX_PROMPT_BYTES: usize = kiln_types::plugin::MAX_PROMPT_BYTES;
/// Most bytes a plugin may pass kiln in one import call (wasmtime's host-call fuel, set
/// on the store): above every limit of the ABI (16 MiB checkpoints, 4 MiB candidates), so
/// those are checked and answered in kiln's words; past it wasmtime traps, and the outcome
/// says so in kiln's words too (`component::classify`).
pub const MAX_HOSTCALL_BYTES: usize = 64 << 20;
/// Largest candidate JSON forwarded to kilnd, in bytes (kilnd's own body limit is 4 MiB).
pub const MAX_CANDIDATE_BYTES: usize = 4 << 20;
/// Most ids in one `wait` call.
pub const MAX_WAIT_IDS: usize = 4096;
/// Longest single `wait` forwarded to kilnd; the plugin may call again.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// Most table elements a plugin may have (function tables stay small in practice).
pub const MAX_TABLE_ELEMENTS: usize = 100_000;

/// What one plugin run may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Fuel for guest code (about one unit per wasm instruction), `None` for no fuel
    /// limit. Deterministic: the same run costs the same fuel; host calls cost none.
    pub fuel: Option<u64>,
    /// Cap on each linear memory, in bytes. Growing past it traps.
    pub memory_bytes: usize,
    /// Wall-clock budget from the start of the run, host calls (waits, chats) included.
    pub wall: Duration,
    /// How much of the plugin's stderr (and stdout) is kept, in bytes.
    pub stderr_bytes: usize,
    /// Largest checkpoint accepted from the plugin, in bytes.
    pub checkpoint_bytes: usize,
    /// Epoch tick: how often the wall-clock deadline is checked inside wasm code.
    pub epoch_tick: Duration,
}

impl Default for Limits {
    /// 10^12 fuel (minutes of guest compute), 256 MiB, one hour, 64 KiB of stderr,
    /// 16 MiB checkpoints, 10 ms ticks.
    fn default() -> Self {
        Limits {
            fuel: Some(1_000_000_000_000),
            memory_bytes: 256 << 20,
            wall: Duration::from_secs(3600),
            stderr_bytes: 64 << 10,
            checkpoint_bytes: 16 << 20,
            epoch_tick: Duration::from_millis(10),
        }
    }
}

/// The trap raised when the plugin grows a memory past its cap.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("memory cap: the plugin asked for {desired} bytes of linear memory; the cap is {cap}")]
pub struct MemoryCapHit {
    /// Bytes the plugin asked for.
    pub desired: usize,
    /// The cap.
    pub cap: usize,
}

/// Enforces the memory cap (trapping, not failing the allocation: a plugin that
/// hits its cap is ended with the reason `memory_cap`) and records the peak.
#[derive(Debug, Clone)]
pub struct Limiter {
    cap: usize,
    /// Largest memory size granted, bytes.
    pub peak: usize,
    /// The refused request, if the cap was hit.
    pub hit: Option<MemoryCapHit>,
}

impl Limiter {
    /// A limiter capping each linear memory at `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Limiter {
            cap,
            peak: 0,
            hit: None,
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.cap || maximum.is_some_and(|m| desired > m) {
            let hit = MemoryCapHit {
                desired,
                cap: self.cap,
            };
            self.hit = Some(hit.clone());
            return Err(wasmtime::Error::new(hit));
        }
        self.peak = self.peak.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS && maximum.is_none_or(|m| desired <= m))
    }

    fn instances(&self) -> usize {
        16
    }

    fn tables(&self) -> usize {
        16
    }

    fn memories(&self) -> usize {
        4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_traps_past_the_cap_and_records_peak() {
        let mut l = Limiter::new(1 << 20);
        assert!(l.memory_growing(0, 1 << 19, None).expect("under the cap"));
        assert_eq!(l.peak, 1 << 19);
        let err = l
            .memory_growing(1 << 19, 2 << 20, None)
            .expect_err("over the cap");
        assert!(err.downcast_ref::<MemoryCapHit>().is_some());
        assert_eq!(l.hit.as_ref().map(|h| h.desired), Some(2 << 20));
    }
}

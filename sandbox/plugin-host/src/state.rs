//! [`PluginState`]: what one plugin's `Store` holds — the bridge to kilnd, the search's
//! context, the limits and their bookkeeping, and the minimal WASI context.

use std::time::{Duration, Instant};

use thiserror::Error;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bridge::{Bridge, BridgeError};
use crate::limits::{Limiter, Limits};
use crate::protocol::Context;

/// Why a host function stopped the plugin (a trap raised by the host, not the guest).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HostTrap {
    /// The wall-clock budget ran out while the plugin was in (or entering) a host call.
    #[error("wall-clock budget exhausted")]
    WallClock,
    /// kilnd failed in a way the plugin cannot handle.
    #[error("{0}")]
    Bridge(BridgeError),
}

/// The data of one plugin's `Store`.
pub struct PluginState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: Limiter,
    pub(crate) bridge: Box<dyn Bridge>,
    pub(crate) context: Context,
    pub(crate) limits: Limits,
    pub(crate) started: Instant,
    pub(crate) deadline: Instant,
    rng: u64,
    /// The first trap a host function raised, kept because it is the reason the run
    /// ended even when wasmtime wraps it.
    pub(crate) trap: Option<HostTrap>,
}

impl PluginState {
    pub(crate) fn new(
        wasi: WasiCtx,
        bridge: Box<dyn Bridge>,
        context: Context,
        limits: Limits,
        started: Instant,
    ) -> Self {
        PluginState {
            wasi,
            table: ResourceTable::new(),
            limiter: Limiter::new(limits.memory_bytes),
            rng: context.random_seed,
            bridge,
            context,
            deadline: started + limits.wall,
            limits,
            started,
            trap: None,
        }
    }

    /// Raises `trap`: records it and returns the error that ends the plugin.
    pub(crate) fn raise(&mut self, trap: HostTrap) -> wasmtime::Error {
        if self.trap.is_none() {
            self.trap = Some(trap.clone());
        }
        wasmtime::Error::new(trap)
    }

    /// Fails with [`HostTrap::WallClock`] once the deadline has passed, so a plugin that
    /// only calls the host (never looping in wasm) is stopped too.
    pub(crate) fn check_deadline(&mut self) -> wasmtime::Result<()> {
        if Instant::now() >= self.deadline {
            return Err(self.raise(HostTrap::WallClock));
        }
        Ok(())
    }

    /// Time left before the deadline.
    pub(crate) fn time_left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The next number of the search's SplitMix64 stream.
    pub(crate) fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

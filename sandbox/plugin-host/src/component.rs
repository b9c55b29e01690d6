//! Runs one proposer component to its end: check the ABI, fetch the context, compile, link the
//! minimal WASI plus the proposer world, instantiate under the limits, call `run`, and
//! classify how it ended.
//!
//! Containment, in the order it is applied:
//! 1. the bytes are parsed and the `kiln:abi-version` checked before wasmtime sees them;
//! 2. the component's imports are listed and any outside `wasi:cli`, `wasi:io` and the
//!    proposer world (filesystem, sockets, clocks, random, http...) is refused, all named
//!    in one message; the linker has nothing else, so nothing else can be reached;
//! 3. fuel (a deterministic CPU budget) and an epoch deadline (the wall clock, ticked
//!    by a thread) are set before instantiation, which already runs guest code;
//! 4. each linear memory is capped by [`Limiter`](crate::limits::Limiter), which traps;
//! 5. host calls check the deadline and never wait past it;
//! 6. stdout and stderr go to a bounded in-memory buffer; stdin is empty; there are
//!    no environment variables, arguments or preopened directories.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store, Trap};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p2::bindings as wasi;

use crate::bridge::Bridge;
use crate::limits::{Limits, MemoryCapHit};
use crate::outcome::{Outcome, Report};
use crate::output::Captured;
use crate::protocol::{RunStats, Summary};
use crate::state::{HostTrap, PluginState};
use crate::wit::since_v0_1_0 as v0_1_0;

/// Import prefixes a plugin may have; everything else is refused.
pub const ALLOWED_IMPORTS: &[&str] = &["wasi:cli/", "wasi:io/", "kiln:proposer/"];

/// Runs the plugin in `wasm` against `bridge` under `limits`. Never panics on a bad
/// plugin; every way it can end is an [`Outcome`]. Does not call `bridge.finish`.
pub fn run(wasm: &[u8], mut bridge: Box<dyn Bridge>, limits: &Limits) -> Report {
    let started = Instant::now();
    let version = match crate::abi::check(wasm) {
        Ok(v) => v,
        Err(e) => return Report::early(Outcome::Refused(e.to_string())),
    };
    tracing::debug!(%version, "plugin ABI");
    let context = match bridge.context() {
        Ok(c) => c,
        Err(e) => return Report::early(Outcome::Bridge(e.to_string())),
    };
    let engine = match engine(limits) {
        Ok(e) => e,
        Err(e) => return Report::early(Outcome::Host(format!("{e:#}"))),
    };
    let component = match Component::new(&engine, wasm) {
        Ok(c) => c,
        Err(e) => {
            return Report::early(Outcome::Refused(format!(
                "does not compile: {}",
                e.root_cause()
            )));
        }
    };
    if let Err(m) = check_imports(&engine, &component) {
        return Report::early(Outcome::Refused(m));
    }
    let mut linker: Linker<PluginState> = Linker::new(&engine);
    if let Err(e) = link(&mut linker) {
        return Report::early(Outcome::Host(format!("linking: {e:#}")));
    }

    let stdio = Captured::new(limits.stderr_bytes);
    let wasi = WasiCtxBuilder::new()
        .stdout(stdio.clone())
        .stderr(stdio.clone())
        .build();
    let config = context.config.clone();
    // The wall-clock budget is the plugin's: it starts now, after the host has
    // compiled and linked it.
    let state = PluginState::new(wasi, bridge, context, limits.clone(), Instant::now());
    let mut store = Store::new(&engine, state);
    store.limiter(|s| &mut s.limiter);
    store.set_hostcall_fuel(crate::limits::MAX_HOSTCALL_BYTES);
    let fuel = limits.fuel.unwrap_or(0);
    if limits.fuel.is_some()
        && let Err(e) = store.set_fuel(fuel)
    {
        return Report::early(Outcome::Host(format!("setting fuel: {e:#}")));
    }
    let ticks = limits.wall.as_nanos() / limits.epoch_tick.as_nanos().max(1) + 1;
    store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
    let ticker = Ticker::start(engine.clone(), limits.epoch_tick);

    let result = v0_1_0::Proposer::instantiate(&mut store, &component, &linker)
        .and_then(|p| p.call_run(&mut store, &config));
    drop(ticker);

    let outcome = match result {
        Ok(Ok(s)) => Outcome::Ok(Summary {
            best: s.best,
            message: s.message,
        }),
        Ok(Err(reason)) => Outcome::PluginError(reason),
        Err(e) => classify(&e, store.data()),
    };
    let stats = RunStats {
        fuel_used: fuel.saturating_sub(store.get_fuel().unwrap_or(fuel)),
        wall_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        peak_memory_bytes: store.data().limiter.peak as u64,
    };
    Report {
        outcome,
        stderr: stdio.text(),
        stats,
    }
}

fn engine(limits: &Limits) -> wasmtime::Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.consume_fuel(limits.fuel.is_some());
    config.epoch_interruption(true);
    Engine::new(&config)
}

/// Links `wasi:cli` and `wasi:io` (what Rust's std imports even when unused, and where
/// panics are printed) and the proposer world. Nothing else: no filesystem, sockets,
/// clocks or random from WASI: time and randomness come from the proposer world's own
/// imports, which kiln controls (a search's seeded randomness, its budget).
fn link(linker: &mut Linker<PluginState>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView as _};
    let l = linker;
    wasmtime_wasi_io_error(l)?;
    wasi::sync::io::poll::add_to_linker::<PluginState, HasIo>(l, |t| &mut t.table)?;
    wasi::sync::io::streams::add_to_linker::<PluginState, HasIo>(l, |t| &mut t.table)?;
    wasi::cli::exit::add_to_linker::<PluginState, WasiCli>(l, PluginState::cli)?;
    wasi::cli::environment::add_to_linker::<PluginState, WasiCli>(l, PluginState::cli)?;
    wasi::cli::stdin::add_to_linker::<PluginState, WasiCli>(l, PluginState::cli)?;
    wasi::cli::stdout::add_to_linker::<PluginState, WasiCli>(l, PluginState::cli)?;
    wasi::cli::stderr::add_to_linker::<PluginState, WasiCli>(l, PluginState::cli)?;
    wasi::cli::terminal_input::add_to_linker::<PluginState, WasiCli>(l, PluginState::cli)?;
    wasi::cli::terminal_output::add_to_linker::<PluginState, WasiCli>(l, PluginState::cli)?;
    wasi::cli::terminal_stdin::add_to_linker::<PluginState, WasiCli>(l, PluginState::cli)?;
    wasi::cli::terminal_stdout::add_to_linker::<PluginState, WasiCli>(l, PluginState::cli)?;
    wasi::cli::terminal_stderr::add_to_linker::<PluginState, WasiCli>(l, PluginState::cli)?;
    v0_1_0::Proposer::add_to_linker::<PluginState, HasSelf<PluginState>>(l, |s| s)?;
    Ok(())
}

fn wasmtime_wasi_io_error(l: &mut Linker<PluginState>) -> wasmtime::Result<()> {
    wasi::io::error::add_to_linker::<PluginState, HasIo>(l, |t| &mut t.table)
}

/// `HasData` for the wasi:io interfaces, which only need the resource table.
struct HasIo;

impl wasmtime::component::HasData for HasIo {
    type Data<'a> = &'a mut ResourceTable;
}

/// Refuses a component importing anything outside [`ALLOWED_IMPORTS`], naming every
/// such import (instantiation would name only the first).
pub fn check_imports(engine: &Engine, component: &Component) -> Result<(), String> {
    let forbidden: Vec<String> = component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .filter(|name| !ALLOWED_IMPORTS.iter().any(|p| name.starts_with(p)))
        .collect();
    if forbidden.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "it imports {}, which kiln does not grant to plugins (only wasi:cli, wasi:io and kiln:proposer)",
            forbidden.join(", ")
        ))
    }
}

/// How a failed instantiation or `run` ended.
fn classify(e: &wasmtime::Error, state: &PluginState) -> Outcome {
    if let Some(trap) = state.trap.as_ref().or_else(|| e.downcast_ref::<HostTrap>()) {
        return match trap {
            HostTrap::WallClock => Outcome::WallClock,
            HostTrap::Bridge(b) => Outcome::Bridge(b.to_string()),
        };
    }
    if let Some(hit) = state
        .limiter
        .hit
        .as_ref()
        .or_else(|| e.downcast_ref::<MemoryCapHit>())
    {
        return Outcome::MemoryCap(hit.to_string());
    }
    if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return Outcome::Trap(format!("the plugin called exit({})", exit.0));
    }
    // wasmtime's own words for its host-call copy limit (its error type is private).
    if format!("{e:#}").contains("fuel allocated for hostcalls has been exhausted") {
        return Outcome::Trap(format!(
            "the plugin passed kiln more than {} MiB in one call, past every limit of the \
             ABI (checkpoints: {} MiB, candidates: {} MiB); kiln stopped it there",
            crate::limits::MAX_HOSTCALL_BYTES >> 20,
            state.limits.checkpoint_bytes >> 20,
            crate::limits::MAX_CANDIDATE_BYTES >> 20
        ));
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Outcome::OutOfFuel,
        Some(Trap::Interrupt) => Outcome::WallClock,
        Some(t) => Outcome::Trap(t.to_string()),
        None => Outcome::Trap(e.root_cause().to_string()),
    }
}

/// The thread that advances the engine's epoch every tick, so the epoch deadline
/// measures wall-clock time. Stopped and joined on drop.
struct Ticker {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Ticker {
    fn start(engine: Engine, tick: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("kiln-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    engine.increment_epoch();
                }
            })
            .ok();
        Ticker { stop, handle }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

//! The CUPTI side of kernel timing: loading the library, subscribing, the activity buffers,
//! the launch callback, and one sample's window of records.
//!
//! CUPTI's activity API is process-wide (one subscriber per process), so the tracer is a
//! process-wide singleton: [`start`] decides once, and every later call sees the same
//! outcome. Set up, in this order (CUPTI activity API docs, "CUPTI initialization"):
//! 1. the library: cudarc's presence check over the names cudarc loads (`libcupti.so`,
//!    `libcupti.so.13`, ...); when the loader finds none, the first `libcupti.so*` of the
//!    configured or default directories is loaded by its full path, so that cudarc's
//!    `dlopen("libcupti.so.13")` then matches it by soname;
//! 2. `cuptiSubscribe` — refused with `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED` when
//!    a profiler (Nsight Compute, Nsight Systems) already holds CUPTI;
//! 3. callbacks on the driver's launch calls (`cuLaunchKernel`, `_ptsz`, `Ex`, `Ex_ptsz`),
//!    which note each launch's correlation ID while a window is open;
//! 4. the activity buffer callbacks, then `CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL` (kernel
//!    start/end on the GPU, without serialising kernels as `KIND_KERNEL` would).
//!
//! Every step runs under `catch_unwind` (cudarc panics on a missing symbol); any failure
//! leaves the tracer off with the reason, and timing falls back to events.
//!
//! **A window** is one sample: [`open_window`] notes CUPTI's clock and starts collecting
//! the kernel records the buffer callback parses; [`phase`] says whose launches come next
//! (kiln's blocking kernel, then the work); [`close_window`] flushes
//! (`cuptiActivityFlushAll` after the sample's context synchronize, forced once when a
//! record of the work is still missing) and hands back the records and IDs for
//! [`super::attribute::attribute`]. Records delivered while no window is open (every other
//! kernel the worker runs) are dropped in the callback.

use std::alloc::{Layout, alloc, dealloc};
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use cudarc::cupti::result::{self as cr, activity};
use cudarc::cupti::sys;
use cudarc::driver::sys::CUcontext;

use super::attribute::{KernelRecord, Window};
use super::{CuptiSetting, TimerStatus};
use crate::facts::panic_message;

/// Size of each activity buffer handed to CUPTI, bytes (a kernel record is ~200 bytes).
const BUFFER_BYTES: usize = 2 << 20;
/// Alignment CUPTI requires of activity buffers.
const BUFFER_ALIGN: usize = 8;

/// Directories searched for `libcupti.so*` when the loader finds none (setting `auto`).
pub const DEFAULT_DIRS: &[&str] = &[
    "/usr/local/cuda/extras/CUPTI/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/sbsa-linux/lib",
];

/// Whose launches the launch callback is noting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Nobody's (outside a window, or between its parts).
    Idle,
    /// kiln's own (the blocking kernel).
    Kiln,
    /// The timed work's.
    Work,
}

/// What a window collects.
struct State {
    open: bool,
    phase: Phase,
    opened_ns: u64,
    kiln_ids: Vec<u32>,
    work_ids: Vec<u32>,
    records: Vec<KernelRecord>,
}

static STATE: Mutex<State> = Mutex::new(State {
    open: false,
    phase: Phase::Idle,
    opened_ns: 0,
    kiln_ids: Vec::new(),
    work_ids: Vec::new(),
    records: Vec::new(),
});

static STATUS: OnceLock<TimerStatus> = OnceLock::new();

fn state() -> MutexGuard<'static, State> {
    // A panic while holding the lock cannot leave it inconsistent in a way that matters
    // (the next window clears it); never panic inside a C callback over it.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts the tracer once per process (later calls return the first outcome).
pub fn start(setting: &CuptiSetting) -> &'static TimerStatus {
    STATUS.get_or_init(|| {
        let status = match catch_unwind(AssertUnwindSafe(|| start_inner(setting))) {
            Ok(Ok(s)) => s,
            Ok(Err(reason)) => TimerStatus::Events { reason },
            Err(p) => TimerStatus::Events {
                reason: format!("the CUPTI bindings panicked: {}", panic_message(&p)),
            },
        };
        match &status {
            TimerStatus::Cupti { library, version } => {
                tracing::info!(library = %library, version, "kernel timing from CUPTI activity records");
            }
            TimerStatus::Events { reason } => {
                tracing::warn!(%reason, "CUPTI unavailable; kernel timing falls back to events");
            }
        }
        status
    })
}

/// The tracer's status: `None` before [`start`].
pub fn status() -> Option<&'static TimerStatus> {
    STATUS.get()
}

/// True when the tracer runs (started, and CUPTI came up).
pub fn active() -> bool {
    matches!(status(), Some(TimerStatus::Cupti { .. }))
}

fn cupti_name(e: cr::CuptiError) -> String {
    // Never `{e}`: cudarc's Display asks CUPTI for the string and unwraps.
    format!("{:?}", e.0)
}

fn start_inner(setting: &CuptiSetting) -> Result<TimerStatus, String> {
    let dirs: Vec<PathBuf> = match setting {
        CuptiSetting::Off => {
            return Err("turned off by configuration ([gpu] cupti = \"off\")".into());
        }
        CuptiSetting::Auto => DEFAULT_DIRS.iter().map(PathBuf::from).collect(),
        CuptiSetting::Dir(d) => vec![d.clone()],
    };
    load_library(&dirs)?;
    let mut version = 0u32;
    // SAFETY: a plain out-parameter; the library is loaded (checked above).
    unsafe { sys::cuptiGetVersion(&mut version) }
        .result()
        .map_err(|e| format!("cuptiGetVersion failed: {}", cupti_name(e)))?;
    let mut subscriber: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
    // SAFETY: `on_api` has the signature CUPTI calls and touches only `STATE`; the
    // userdata pointer is unused (null).
    if let Err(e) = unsafe { cr::subscribe(&mut subscriber, Some(on_api), std::ptr::null_mut()) } {
        return Err(match e.0 {
            sys::CUptiResult::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => {
                "another profiler (Nsight Compute or Nsight Systems?) already holds CUPTI \
                 (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)"
                    .to_string()
            }
            other => format!("cuptiSubscribe failed: {other:?}"),
        });
    }
    let setup = || -> Result<(), String> {
        use sys::CUpti_driver_api_trace_cbid as Cbid;
        for cbid in [
            Cbid::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
            Cbid::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
            Cbid::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
            Cbid::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
        ] {
            // SAFETY: `subscriber` was returned by cuptiSubscribe above.
            unsafe {
                cr::enable_callback(
                    1,
                    subscriber,
                    sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API,
                    cbid as u32,
                )
            }
            .map_err(|e| format!("cuptiEnableCallback({cbid:?}) failed: {}", cupti_name(e)))?;
        }
        activity::register_callbacks(Some(buffer_requested), Some(buffer_completed))
            .map_err(|e| format!("cuptiActivityRegisterCallbacks failed: {}", cupti_name(e)))?;
        activity::enable(sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL).map_err(
            |e| {
                format!(
                    "cuptiActivityEnable(CONCURRENT_KERNEL) failed: {}",
                    cupti_name(e)
                )
            },
        )?;
        Ok(())
    };
    if let Err(reason) = setup() {
        // SAFETY: the handle from cuptiSubscribe above, released once.
        let _ = unsafe { cr::unsubscribe(subscriber) };
        return Err(reason);
    }
    Ok(TimerStatus::Cupti {
        library: loaded_library_path().unwrap_or_else(|| "libcupti (path unknown)".into()),
        version,
    })
}

/// Makes sure cudarc will find a libcupti: the loader's own, else the first found in
/// `dirs`, loaded by full path (see the module docs).
fn load_library(dirs: &[PathBuf]) -> Result<(), String> {
    // SAFETY: only tries `dlopen` on cudarc's candidate names and drops the handles;
    // loading runs the library's ELF initialisers, as any later use would.
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    let Some(path) = dirs.iter().find_map(|d| find_library(d)) else {
        return Err(format!(
            "libcupti.so not found: not on the loader's path (LD_LIBRARY_PATH, /etc/ld.so.cache) \
             nor in {} (set [gpu] cupti to the directory holding libcupti.so.13)",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    // SAFETY: loading a shared library by path runs its initialisers; the handle is kept
    // for the life of the process (never unloaded), so cudarc's symbols stay valid.
    let lib = unsafe { libloading::Library::new(&path) }
        .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
    std::mem::forget(lib);
    // SAFETY: as above.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(format!(
            "loaded {} but cudarc does not find it by the names it tries (libcupti.so.13 expected)",
            path.display()
        ))
    }
}

/// The best `libcupti.so*` file in `dir`: `libcupti.so.13` first, then any versioned one.
pub fn find_library(dir: &Path) -> Option<PathBuf> {
    let exact = dir.join("libcupti.so.13");
    if exact.is_file() {
        return Some(exact);
    }
    crate::baseline::libs::find_in(dir, "libcupti.so").filter(|p| p.is_file())
}

/// The path of the libcupti mapped into this process, from `/proc/self/maps`.
fn loaded_library_path() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libcupti.so"))
        })
        .map(str::to_string)
}

/// Opens a sample's window: notes CUPTI's clock and starts collecting records. The caller
/// has waited for all earlier work (records that started before now are not the sample's).
pub(crate) fn open_window() -> Result<(), String> {
    let mut now = 0u64;
    // SAFETY: a plain out-parameter; only called while the tracer is active.
    unsafe { cr::get_timestamp(&mut now) }
        .map_err(|e| format!("cuptiGetTimestamp failed: {}", cupti_name(e)))?;
    let mut s = state();
    s.open = true;
    s.phase = Phase::Idle;
    s.opened_ns = now;
    s.kiln_ids.clear();
    s.work_ids.clear();
    s.records.clear();
    Ok(())
}

/// Says whose launches come next in the open window.
pub(crate) fn phase(p: Phase) {
    state().phase = p;
}

/// Closes the window without reading it (an error path: nothing is flushed).
pub(crate) fn abandon_window() {
    let mut s = state();
    s.open = false;
    s.phase = Phase::Idle;
    s.records.clear();
}

/// What a closed window held.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) opened_ns: u64,
    pub(crate) kiln_ids: Vec<u32>,
    pub(crate) work_ids: Vec<u32>,
    pub(crate) records: Vec<KernelRecord>,
}

impl Collected {
    /// The window as [`super::attribute::attribute`] reads it.
    pub(crate) fn window(&self, kiln_first: usize, launches: Option<usize>) -> Window<'_> {
        Window {
            records: &self.records,
            not_before_ns: self.opened_ns,
            kiln_ids: &self.kiln_ids,
            kiln_first,
            work_ids: &self.work_ids,
            launches,
        }
    }

    /// Whether every record the sample should have produced is in: one for each launch ID
    /// noted, or (IDs that match nothing, none noted) as many records of the window as
    /// kiln's launches plus the work's (one when the count is unknown).
    fn complete(&self, kiln_first: usize, launches: Option<usize>) -> bool {
        let by_id = !self.work_ids.is_empty()
            && self
                .work_ids
                .iter()
                .all(|id| self.records.iter().any(|r| r.correlation_id == *id));
        let fresh = self
            .records
            .iter()
            .filter(|r| r.start_ns >= self.opened_ns)
            .count();
        by_id || fresh >= kiln_first + launches.unwrap_or(1)
    }
}

/// Closes the window after the sample's work has finished (the context is synchronised):
/// flushes the records and, while the sample's are not all in, flushes again forced (at
/// most [`FORCED_FLUSHES`] times, 200 µs apart: CUPTI may finish a record just after the
/// kernel); returns what was collected.
pub(crate) fn close_window(
    kiln_first: usize,
    launches: Option<usize>,
) -> Result<Collected, String> {
    {
        state().phase = Phase::Idle;
    }
    activity::flush_all(0)
        .map_err(|e| format!("cuptiActivityFlushAll failed: {}", cupti_name(e)))?;
    let forced = sys::CUpti_ActivityFlag::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED as u32;
    for attempt in 0..FORCED_FLUSHES {
        if peek_complete(kiln_first, launches) {
            break;
        }
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        activity::flush_all(forced)
            .map_err(|e| format!("cuptiActivityFlushAll(FORCED) failed: {}", cupti_name(e)))?;
    }
    let mut s = state();
    s.open = false;
    Ok(Collected {
        opened_ns: s.opened_ns,
        kiln_ids: std::mem::take(&mut s.kiln_ids),
        work_ids: std::mem::take(&mut s.work_ids),
        records: std::mem::take(&mut s.records),
    })
}

/// Forced flushes tried at most per window when records are missing.
const FORCED_FLUSHES: u32 = 3;

fn peek_complete(kiln_first: usize, launches: Option<usize>) -> bool {
    let s = state();
    let c = Collected {
        opened_ns: s.opened_ns,
        kiln_ids: Vec::new(),
        work_ids: s.work_ids.clone(),
        records: s.records.clone(),
    };
    c.complete(kiln_first, launches)
}

/// The launch callback: notes the correlation ID of each launch made in a window.
unsafe extern "C" fn on_api(
    _userdata: *mut c_void,
    domain: sys::CUpti_CallbackDomain,
    _cbid: sys::CUpti_CallbackId,
    cbdata: *const c_void,
) {
    if domain != sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API || cbdata.is_null() {
        return;
    }
    let data = cbdata.cast::<sys::CUpti_CallbackData>();
    // SAFETY: for the driver API domain CUPTI passes a `CUpti_CallbackData`, valid for the
    // duration of the callback; the fields are read through raw places, the enum one as
    // its `u32` representation, so no invalid enum value is ever materialised.
    let (site, id) = unsafe {
        (
            std::ptr::addr_of!((*data).callbackSite)
                .cast::<u32>()
                .read_unaligned(),
            std::ptr::addr_of!((*data).correlationId).read_unaligned(),
        )
    };
    if site != sys::CUpti_ApiCallbackSite::CUPTI_API_ENTER as u32 {
        return;
    }
    let mut s = state();
    if !s.open {
        return;
    }
    match s.phase {
        Phase::Kiln => s.kiln_ids.push(id),
        Phase::Work => s.work_ids.push(id),
        Phase::Idle => {}
    }
}

/// Hands CUPTI an empty buffer.
unsafe extern "C" fn buffer_requested(
    buffer: *mut *mut u8,
    size: *mut usize,
    max_records: *mut usize,
) {
    if buffer.is_null() || size.is_null() || max_records.is_null() {
        return;
    }
    let Ok(layout) = Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN) else {
        return;
    };
    // SAFETY: a non-zero-sized layout; the buffer is freed in `buffer_completed` with the
    // same layout (CUPTI hands back every buffer it was given).
    let p = unsafe { alloc(layout) };
    // SAFETY: the three out-pointers were checked non-null and are CUPTI's.
    unsafe {
        *buffer = p;
        *size = if p.is_null() { 0 } else { BUFFER_BYTES };
        *max_records = 0; // as many as fit
    }
}

/// Parses a completed buffer (keeping kernel records while a window is open) and frees it.
unsafe extern "C" fn buffer_completed(
    _context: CUcontext,
    _stream_id: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    let keep = state().open;
    if keep {
        let mut found = Vec::new();
        let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
        loop {
            // SAFETY: `buffer` holds `valid` bytes of records written by CUPTI; `record` is
            // CUPTI's cursor into it.
            if unsafe { activity::get_next_record(buffer, valid, &mut record) }.is_err()
                || record.is_null()
            {
                break;
            }
            // SAFETY: `record` points at a record inside the buffer; `parse` reads only the
            // kernel-record prefix, after checking the kind.
            if let Some(r) = unsafe { parse(record.cast::<u8>()) } {
                found.push(r);
            }
        }
        let mut s = state();
        if s.open {
            s.records.extend(found);
        }
    }
    if let Ok(layout) = Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN) {
        // SAFETY: allocated in `buffer_requested` with this layout; CUPTI is done with it.
        unsafe { dealloc(buffer, layout) };
    }
}

/// The fields of a kernel activity record (`CUpti_ActivityKernel4` … `13`, which share this
/// prefix) that timing reads, as plain integers: enum-typed fields are read as `u32`, so an
/// unknown value is never materialised as a Rust enum. The fields timing does not read are
/// there for the layout.
#[allow(dead_code)]
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct KernelPrefix {
    pub(crate) kind: u32,
    cache_config: u8,
    shared_memory_config: u8,
    registers_per_thread: u16,
    partitioned_requested: u32,
    partitioned_executed: u32,
    pub(crate) start: u64,
    pub(crate) end: u64,
    completed: u64,
    device_id: u32,
    context_id: u32,
    pub(crate) stream_id: u32,
    grid: [i32; 3],
    block: [i32; 3],
    static_shared: i32,
    dynamic_shared: i32,
    local_per_thread: u32,
    local_total: u32,
    pub(crate) correlation_id: u32,
}

/// Reads a kernel record at `p`, or `None` for another kind.
///
/// # Safety
/// `p` points at an activity record inside a buffer CUPTI filled.
unsafe fn parse(p: *const u8) -> Option<KernelRecord> {
    // SAFETY: every record starts with its kind (`CUpti_Activity`), a `u32`.
    let kind = unsafe { p.cast::<u32>().read_unaligned() };
    let concurrent = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL as u32;
    let serial = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_KERNEL as u32;
    if kind != concurrent && kind != serial {
        return None;
    }
    // SAFETY: a kernel record of CUDA 11.0 or newer is at least as long as the prefix
    // (checked against the bindings in the tests); read unaligned, copied out.
    let k = unsafe { p.cast::<KernelPrefix>().read_unaligned() };
    Some(KernelRecord {
        correlation_id: k.correlation_id,
        stream_id: k.stream_id,
        start_ns: k.start,
        end_ns: k.end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn the_prefix_matches_the_kernel_records_of_the_bindings() {
        macro_rules! same {
            ($t:ty) => {
                assert_eq!(offset_of!(KernelPrefix, start), offset_of!($t, start));
                assert_eq!(offset_of!(KernelPrefix, end), offset_of!($t, end));
                assert_eq!(
                    offset_of!(KernelPrefix, stream_id),
                    offset_of!($t, streamId)
                );
                assert_eq!(
                    offset_of!(KernelPrefix, correlation_id),
                    offset_of!($t, correlationId)
                );
                assert!(std::mem::size_of::<$t>() >= std::mem::size_of::<KernelPrefix>());
            };
        }
        same!(sys::CUpti_ActivityKernel4);
        same!(sys::CUpti_ActivityKernel9);
        same!(sys::CUpti_ActivityKernel10);
    }

    #[test]
    fn a_kernel_record_is_parsed_and_other_kinds_are_skipped() {
        let mut bytes = vec![0u8; 256];
        let k = KernelPrefix {
            kind: sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL as u32,
            cache_config: 0,
            shared_memory_config: 0,
            registers_per_thread: 16,
            partitioned_requested: 0,
            partitioned_executed: 0,
            start: 1_000,
            end: 7_050,
            completed: 7_050,
            device_id: 0,
            context_id: 1,
            stream_id: 13,
            grid: [4096, 1, 1],
            block: [256, 1, 1],
            static_shared: 0,
            dynamic_shared: 0,
            local_per_thread: 0,
            local_total: 0,
            correlation_id: 42,
        };
        // SAFETY: the buffer has room for the prefix; written unaligned at offset 3 so the
        // reader must cope with any alignment.
        unsafe {
            bytes
                .as_mut_ptr()
                .add(3)
                .cast::<KernelPrefix>()
                .write_unaligned(k)
        };
        // SAFETY: `bytes[3..]` holds a kernel record prefix.
        let r = unsafe { parse(bytes.as_ptr().add(3)) }.expect("a kernel record");
        assert_eq!(
            r,
            KernelRecord {
                correlation_id: 42,
                stream_id: 13,
                start_ns: 1_000,
                end_ns: 7_050
            }
        );
        let memset = (sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET as u32).to_le_bytes();
        bytes[3..7].copy_from_slice(&memset);
        // SAFETY: as above; a memset record is skipped after reading its kind.
        assert!(unsafe { parse(bytes.as_ptr().add(3)) }.is_none());
    }

    #[test]
    fn completeness_waits_for_every_launch_or_enough_records() {
        let rec = |id, start| KernelRecord {
            correlation_id: id,
            stream_id: 1,
            start_ns: start,
            end_ns: start + 10,
        };
        let mut c = Collected {
            opened_ns: 100,
            kiln_ids: vec![5],
            work_ids: vec![6, 7],
            records: vec![rec(5, 110), rec(6, 130)],
        };
        assert!(!c.complete(1, Some(2)));
        c.records.push(rec(7, 150));
        assert!(c.complete(1, Some(2)));
        // IDs that match no record: enough records of the window will do.
        c.work_ids = vec![60, 61];
        assert!(c.complete(1, Some(2)));
        c.records.pop();
        assert!(!c.complete(1, Some(2)));
        // Without IDs: the blocker plus the launches, counting only records of the window.
        c.work_ids.clear();
        c.records = vec![rec(1, 50), rec(5, 110), rec(6, 130)];
        assert!(!c.complete(1, Some(2)));
        c.records.push(rec(7, 150));
        assert!(c.complete(1, Some(2)));
        assert!(c.complete(1, None));
    }

    #[test]
    fn a_missing_library_is_a_reason_not_a_panic() {
        // SAFETY: only tries `dlopen` on cudarc's names.
        if unsafe { sys::is_culib_present() } {
            eprintln!("skipped: this machine has a libcupti on the loader's path");
            return;
        }
        let dir = std::env::temp_dir().join(format!("kiln-no-cupti-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let e = start_inner(&CuptiSetting::Dir(dir.clone())).expect_err("no library");
        assert!(e.contains("libcupti.so not found"), "{e}");
        assert!(e.contains(&dir.display().to_string()), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_library_is_found_by_its_versioned_name() {
        let dir = std::env::temp_dir().join(format!("kiln-cupti-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        assert_eq!(find_library(&dir), None);
        std::fs::write(dir.join("libcupti.so.2025.3.1"), b"").expect("write");
        assert_eq!(find_library(&dir), Some(dir.join("libcupti.so.2025.3.1")));
        std::fs::write(dir.join("libcupti.so.13"), b"").expect("write");
        assert_eq!(find_library(&dir), Some(dir.join("libcupti.so.13")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

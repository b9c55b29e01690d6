//! The GPU as the worker holds it: one context on one ordinal, one non-default stream,
//! device buffers owned by trusted code, modules with per-kernel resources.
//!
//! Design points:
//! - **One stream.** Every kernel (trusted or candidate), copy, memset and event goes on
//!   the [`Gpu`]'s own `CU_STREAM_NON_BLOCKING` stream, so stream order is the only order
//!   there is, and a context synchronize after each run catches anything else.
//! - **cudarc's event tracking is off.** cudarc's `CudaSlice` records read/write events
//!   around every use once a context has two streams; inside a timed region those records
//!   are extra work. This crate never creates a `CudaSlice` (buffers are raw
//!   `CUdeviceptr`s), so tracking would never fire anyway; it is disabled so that nothing
//!   added later can bring it back silently.
//! - **Buffers are scrubbed when freed.** A freed buffer is `memset` to zero on the stream
//!   and the stream is synchronised before `cuMemFree`, so the next allocation (a candidate's
//!   scratch, say) cannot read what a reference left behind. New buffers are zeroed too.
//! - **A poisoned context is never touched again.** After a sticky fault or a timeout the
//!   [`Gpu`] refuses every call with [`GpuError::Poisoned`], and its `Drop` (and that of its
//!   buffers and modules) leaks device objects instead of calling the driver, which might
//!   block behind a kernel that never ends. The process must exit; the driver reclaims
//!   everything then.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use cudarc::driver::result as dr;
use cudarc::driver::safe::CudaContext;
use cudarc::driver::sys::{self, CUfunction_attribute, CUresult};
use kiln_types::verdict::KernelResources;
use serde::{Deserialize, Serialize};

use crate::artifact::{Artifact, KernelEntry};
use crate::error::{GpuError, Unavailable, classify, error_name};
use crate::facts::{DeviceFacts, DeviceLimits, MIN_DRIVER_VERSION, device_facts, panic_message};
use crate::launch::KernelLimits;
use crate::nvrtc::{CompileError, CompiledModule, ImageKind, compile};

/// Size of the device printf FIFO of every context kiln opens, bytes.
pub const PRINTF_FIFO_BYTES: usize = 256 << 10;

/// State shared by the [`Gpu`] and everything allocated from it.
pub(crate) struct GpuShared {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: sys::CUstream,
    poison: Mutex<Option<String>>,
}

// SAFETY: `CUstream` is a process-wide driver handle that may be used from any thread once
// the owning context is current there; every method binds the context first. The poison
// flag is behind a Mutex and `CudaContext` is Send + Sync.
unsafe impl Send for GpuShared {}
// SAFETY: see above; no method hands out interior references to the raw handle's target.
unsafe impl Sync for GpuShared {}

impl GpuShared {
    /// Makes the context current on this thread and refuses work on a poisoned context.
    pub(crate) fn enter(&self) -> Result<(), GpuError> {
        if let Some(p) = self.poisoned() {
            return Err(GpuError::Poisoned(p));
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.fail("cuCtxSetCurrent", e, false))
    }

    pub(crate) fn poisoned(&self) -> Option<String> {
        self.poison
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_poison(&self, why: String) {
        let mut p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
        if p.is_none() {
            tracing::error!(reason = %why, "cuda context poisoned; the worker must be replaced");
            *p = Some(why);
        }
    }

    /// Classifies a failed driver call and poisons the context when the error is sticky.
    pub(crate) fn fail(
        &self,
        call: &'static str,
        err: dr::DriverError,
        after_work: bool,
    ) -> GpuError {
        let e = classify(call, err, after_work);
        if let GpuError::Fault(f) = &e {
            self.set_poison(f.name.clone());
        }
        e
    }

    /// Waits for the stream, classifying any error as a fault.
    pub(crate) fn sync_stream(&self) -> Result<(), GpuError> {
        // SAFETY: `self.stream` is a live stream of this context, which `enter` made current.
        unsafe { dr::stream::synchronize(self.stream) }
            .map_err(|e| self.fail("cuStreamSynchronize", e, true))
    }
}

impl Drop for GpuShared {
    fn drop(&mut self) {
        if self.poisoned().is_some() {
            // Leak the stream and keep one reference to the context forever, so that
            // `cuDevicePrimaryCtxRelease` (which may wait for a kernel that never ends) is
            // never called. The process is about to be replaced.
            std::mem::forget(Arc::clone(&self.ctx));
            return;
        }
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the stream belongs to this context and nothing uses it after this point
            // (every buffer, module and the Gpu hold an Arc to `self`, so they are gone).
            let _ = unsafe { dr::stream::destroy(self.stream) };
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Plain element types that may be copied to and from device memory byte for byte.
pub trait Pod: sealed::Sealed + Copy + Default + 'static {}

macro_rules! pod {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Pod for $t {}
    )*};
}
pod!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// Device memory allocated by trusted code; zeroed when allocated, scrubbed when freed.
pub struct DeviceBuffer {
    pub(crate) shared: Arc<GpuShared>,
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: usize,
    pub(crate) backing: Backing,
}

/// How a [`DeviceBuffer`]'s memory was obtained, so that it is released the same way.
#[derive(Debug)]
pub(crate) enum Backing {
    /// `cuMemAlloc`.
    Plain,
    /// `cuMemCreate` mapped at `ptr` over `mapped` bytes (a multiple of the allocation
    /// granularity), exportable as a file descriptor ([`crate::shareable`]).
    Shareable {
        handle: sys::CUmemGenericAllocationHandle,
        mapped: usize,
    },
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl DeviceBuffer {
    /// The device address, as passed to kernels.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.shared.poisoned().is_some() || self.shared.ctx.bind_to_thread().is_err() {
            return; // leaked on purpose: see the module docs
        }
        // SAFETY: `ptr` was returned by `cuMemAlloc` (or mapped by `cuMemMap`) for at least
        // `bytes` bytes in this context, is freed only here, and the stream belongs to the
        // same context. Scrubbing is ordered after every earlier use on the stream; the
        // synchronize makes sure it (and those uses) finished before the memory is released.
        let scrubbed = unsafe { dr::memset_d8_async(self.ptr, 0, self.bytes, self.shared.stream) }
            .map_err(|e| self.shared.fail("cuMemsetD8Async", e, false))
            .and_then(|()| self.shared.sync_stream());
        match scrubbed {
            Ok(()) => match self.backing {
                Backing::Plain => {
                    // SAFETY: as above; the memory is no longer used by any queued work.
                    let freed = unsafe { dr::free_sync(self.ptr) };
                    if let Err(e) = freed {
                        tracing::warn!(error = %error_name(e), "cuMemFree failed");
                    }
                }
                Backing::Shareable { handle, mapped } => {
                    crate::shareable::release(self.ptr, mapped, handle);
                }
            },
            Err(e) => tracing::warn!(error = %e, "scrubbing a freed buffer failed; leaking it"),
        }
    }
}

/// Resources and limits of one kernel in a loaded module.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelInfo {
    /// The name the launch list uses (a C++ name expression, a Triton jit function's name in
    /// a [`Gpu::load_parts`] module, or the symbol itself for a kernel found by enumerating
    /// the module).
    pub name: String,
    /// The kernel's symbol in the image (unmangled for `extern "C"` kernels).
    #[serde(default)]
    pub symbol: String,
    /// Null pointer parameters the launcher appends after the plan's arguments (see
    /// [`crate::artifact::KernelEntry`]).
    #[serde(default)]
    pub trailing_null_params: u32,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub static_shared_bytes: u32,
    /// Constant memory used, bytes.
    pub const_bytes: u32,
    /// Local memory per thread, bytes (register spills and stack arrays land here).
    pub local_bytes: u32,
    /// Largest block this kernel can be launched with (registers and `__launch_bounds__`
    /// included).
    pub max_threads_per_block: u32,
    /// Largest dynamic shared memory currently allowed without raising the attribute.
    pub max_dynamic_shared_bytes: u32,
    /// PTX virtual architecture × 10 (e.g. 90).
    pub ptx_version: u32,
    /// Binary architecture × 10 (e.g. 90).
    pub binary_version: u32,
    /// Size in bytes of each parameter (`cuFuncGetParamInfo`, CUDA 12.4+), or `None` when
    /// the driver cannot tell. Sizes only: a pointer and an `i64` both read 8.
    pub param_sizes: Option<Vec<usize>>,
}

/// Theoretical occupancy of one kernel for one block size and dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Occupancy {
    /// Blocks resident per SM (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    pub blocks_per_sm: u32,
    /// Warps resident per SM.
    pub active_warps_per_sm: u32,
    /// Most warps an SM can hold.
    pub max_warps_per_sm: u32,
    /// `active_warps_per_sm / max_warps_per_sm`.
    pub fraction: f64,
}

pub(crate) struct Kernel {
    pub(crate) func: sys::CUfunction,
    pub(crate) info: KernelInfo,
}

/// A module loaded into the [`Gpu`]'s context, with the kernels found in it: one image
/// ([`Gpu::load_module`]), or several whose kernels the launch plan names by names of its
/// own ([`Gpu::load_parts`]: a Triton candidate's kernels, one CUBIN each).
pub struct Module {
    shared: Arc<GpuShared>,
    modules: Vec<sys::CUmodule>,
    limits: DeviceLimits,
    pub(crate) kernels: BTreeMap<String, Kernel>,
}

// SAFETY: the raw module and function handles are process-wide driver objects usable from
// any thread with the context current; every method binds it first (`GpuShared::enter`).
unsafe impl Send for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        if self.shared.poisoned().is_some() || self.shared.ctx.bind_to_thread().is_err() {
            return; // leaked on purpose: see the module docs
        }
        // Unloading while a kernel of this module still runs is undefined; wait first.
        if self.shared.sync_stream().is_ok() {
            for &module in &self.modules {
                // SAFETY: `module` was loaded in this context, is unloaded only here, and no
                // work of it is queued (the stream was just synchronised).
                if let Err(e) = unsafe { dr::module::unload(module) } {
                    tracing::warn!(error = %error_name(e), "cuModuleUnload failed");
                }
            }
        }
    }
}

impl Module {
    /// True if and only if this module was loaded into `gpu`'s context.
    pub(crate) fn belongs_to(&self, gpu: &Gpu) -> bool {
        Arc::ptr_eq(&self.shared, &gpu.shared)
    }

    /// The kernels found in the module (all of them where the driver can enumerate them,
    /// at least the names asked for at load time).
    pub fn kernels(&self) -> impl Iterator<Item = &KernelInfo> {
        self.kernels.values().map(|k| &k.info)
    }

    /// One kernel's info, or `None` if the module has no kernel of that name.
    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        self.kernels.get(name).map(|k| &k.info)
    }

    /// The per-kernel limits the launch validator needs.
    pub fn kernel_limits(&self) -> BTreeMap<String, KernelLimits> {
        self.kernels
            .iter()
            .map(|(name, k)| (name.clone(), KernelLimits::from(&k.info)))
            .collect()
    }

    /// Theoretical occupancy of `name` for a block of `block_threads` threads and
    /// `dynamic_shared_bytes` of dynamic shared memory. Raises the kernel's dynamic shared
    /// memory attribute first when needed (and allowed), as a launch would.
    pub fn occupancy(
        &self,
        name: &str,
        block_threads: u32,
        dynamic_shared_bytes: u32,
    ) -> Result<Occupancy, GpuError> {
        self.shared.enter()?;
        let k = self
            .kernels
            .get(name)
            .ok_or_else(|| GpuError::Usage(format!("no kernel {name:?} in the module")))?;
        self.ensure_dynamic_shared(k, dynamic_shared_bytes)?;
        let block = i32::try_from(block_threads)
            .map_err(|_| GpuError::Usage("block size does not fit an int".into()))?;
        // SAFETY: `k.func` belongs to this live module in the current context.
        let blocks = unsafe {
            dr::occupancy::max_active_block_per_multiprocessor(
                k.func,
                block,
                dynamic_shared_bytes as usize,
            )
        }
        .map_err(|e| {
            self.shared
                .fail("cuOccupancyMaxActiveBlocksPerMultiprocessor", e, false)
        })?;
        let blocks = u32::try_from(blocks).unwrap_or(0);
        let warp = self.limits.warp_size.max(1);
        let warps_per_block = block_threads.div_ceil(warp);
        let max_warps = (self.limits.max_threads_per_sm / warp).max(1);
        let active = blocks.saturating_mul(warps_per_block).min(max_warps);
        Ok(Occupancy {
            blocks_per_sm: blocks,
            active_warps_per_sm: active,
            max_warps_per_sm: max_warps,
            fraction: f64::from(active) / f64::from(max_warps),
        })
    }

    /// The wire-type resources of `name`, with occupancy for the given launch shape.
    pub fn resources(
        &self,
        name: &str,
        block_threads: u32,
        dynamic_shared_bytes: u32,
    ) -> Result<KernelResources, GpuError> {
        let info = self
            .kernel(name)
            .ok_or_else(|| GpuError::Usage(format!("no kernel {name:?} in the module")))?
            .clone();
        let occ = self.occupancy(name, block_threads, dynamic_shared_bytes)?;
        Ok(KernelResources {
            name: info.name,
            registers: info.registers,
            static_shared_bytes: info.static_shared_bytes,
            local_bytes: info.local_bytes,
            max_threads_per_block: info.max_threads_per_block,
            occupancy: Some(occ.fraction),
        })
    }

    /// Raises `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` to `bytes` if the kernel's
    /// current limit is lower. The caller has checked `bytes` against the opt-in maximum.
    pub(crate) fn ensure_dynamic_shared(&self, k: &Kernel, bytes: u32) -> Result<(), GpuError> {
        if bytes <= k.info.max_dynamic_shared_bytes {
            return Ok(());
        }
        let room = self
            .limits
            .max_shared_per_block_optin
            .saturating_sub(k.info.static_shared_bytes);
        if bytes > room {
            return Err(GpuError::Usage(format!(
                "{bytes} bytes of dynamic shared memory exceed the {room} bytes kernel {} can opt in to",
                k.info.name
            )));
        }
        let value = i32::try_from(bytes).unwrap_or(i32::MAX);
        // SAFETY: `k.func` belongs to this live module in the current context; the value is
        // within the device's opt-in limit (checked above).
        unsafe {
            dr::function::set_function_attribute(
                k.func,
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                value,
            )
        }
        .map_err(|e| self.shared.fail("cuFuncSetAttribute", e, false))
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Kernel> {
        self.kernels.get(name)
    }
}

/// Handles of the trusted kernels kiln itself runs (inputs, poison, hash, blocker).
pub(crate) struct Trusted {
    pub(crate) module: Module,
    /// The output comparison kernel ([`crate::compare`]).
    pub(crate) compare: Module,
}

/// One GPU, as held by a worker: context, stream, events, trusted kernels, L2 flush buffer.
pub struct Gpu {
    pub(crate) facts: DeviceFacts,
    pub(crate) ev_start: sys::CUevent,
    pub(crate) ev_end: sys::CUevent,
    pub(crate) trusted: Trusted,
    pub(crate) flush: DeviceBuffer,
    pub(crate) hash_out: DeviceBuffer,
    /// Result slots of [`Gpu::compare`].
    pub(crate) compare_out: DeviceBuffer,
    pub(crate) flush_value: std::cell::Cell<u8>,
    pub(crate) shared: Arc<GpuShared>,
}

// SAFETY: the raw event handles are process-wide driver objects usable from any thread
// with the context current, and every method binds the context first. `Gpu` is not Sync:
// one thread drives it at a time.
unsafe impl Send for Gpu {}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.shared.poisoned().is_some() || self.shared.ctx.bind_to_thread().is_err() {
            return; // leaked on purpose: see the module docs
        }
        for ev in [self.ev_start, self.ev_end] {
            // SAFETY: both events were created in this context and are destroyed only here;
            // destroying an event that is still pending is allowed (released on completion).
            let _ = unsafe { dr::event::destroy(ev) };
        }
    }
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.facts.ordinal)
            .field("name", &self.facts.name)
            .field("poisoned", &self.shared.poisoned())
            .finish()
    }
}

impl Gpu {
    /// Opens device `ordinal`: retains its primary context, creates the stream and the two
    /// timing events, compiles (NVRTC) and loads kiln's trusted kernels, and allocates the
    /// L2 flush buffer (2 × L2). Never panics; missing libraries give
    /// [`GpuError::Unavailable`].
    pub fn open(ordinal: u32) -> Result<Gpu, GpuError> {
        crate::facts::libraries_present()?;
        match catch_unwind(AssertUnwindSafe(|| Self::open_inner(ordinal))) {
            Ok(r) => r,
            Err(p) => Err(GpuError::Unavailable(Unavailable::new(format!(
                "the CUDA library panicked while opening device {ordinal}: {}",
                panic_message(&p)
            )))),
        }
    }

    fn open_inner(ordinal: u32) -> Result<Gpu, GpuError> {
        let driver = |call: &'static str| move |e: dr::DriverError| classify(call, e, false);
        let ctx = CudaContext::new(ordinal as usize).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: `disable_event_tracking` only affects `CudaSlice`s created afterwards; this
        // crate creates none (buffers are raw allocations ordered on one stream with explicit
        // synchronisation), so no cross-stream use can go unsynchronised. See module docs.
        unsafe { ctx.disable_event_tracking() };
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // Device printf: a small FIFO per context, so one launch cannot buffer much (the
        // worker counts what reaches stdout and ends floods; see kiln-sandbox's printf).
        // SAFETY: a context-wide limit with a plain value; the context is current.
        let rc = unsafe {
            sys::cuCtxSetLimit(sys::CUlimit::CU_LIMIT_PRINTF_FIFO_SIZE, PRINTF_FIFO_BYTES)
        };
        if rc != CUresult::CUDA_SUCCESS {
            tracing::warn!(error = ?rc, "cannot set the printf FIFO size");
        }
        let mut version = 0;
        // SAFETY: the out-pointer is a valid, writable `c_int`.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(driver("cuDriverGetVersion"))?;
        if version < MIN_DRIVER_VERSION {
            return Err(GpuError::Unavailable(Unavailable::new(format!(
                "the driver supports CUDA {}.{}; kiln-gpu needs 13.0 or newer",
                version / 1000,
                (version % 1000) / 10
            ))));
        }
        let facts =
            device_facts(ordinal as i32).map_err(|e| GpuError::Unavailable(Unavailable::new(e)))?;
        let stream = dr::stream::create(dr::stream::StreamKind::NonBlocking)
            .map_err(driver("cuStreamCreate"))?;
        let shared = Arc::new(GpuShared {
            ctx,
            stream,
            poison: Mutex::new(None),
        });
        // From here on `shared` owns the stream (destroyed in its Drop).
        let ev_start = dr::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(driver("cuEventCreate"))?;
        let ev_end = match dr::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT) {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: `ev_start` was just created in this context and is not used again.
                let _ = unsafe { dr::event::destroy(ev_start) };
                return Err(classify("cuEventCreate", e, false));
            }
        };
        let destroy_events = || {
            for ev in [ev_start, ev_end] {
                // SAFETY: both events were created above and are not used after this.
                let _ = unsafe { dr::event::destroy(ev) };
            }
        };
        let rest = (|| {
            let trusted_module = |source: &str, names: &[&str]| {
                let compiled = compile_trusted(source, &facts.arch)?;
                let module = load(&shared, &facts.limits, &compiled, &identity_refs(names))?;
                for name in names {
                    if module.get(name).is_none() {
                        return Err(GpuError::Usage(format!(
                            "trusted kernel {name} missing from its own module"
                        )));
                    }
                }
                Ok(module)
            };
            let module = trusted_module(
                crate::inputs::TRUSTED_SOURCE,
                crate::inputs::TRUSTED_KERNELS,
            )?;
            let compare = trusted_module(
                &crate::compare::compare_source(),
                crate::compare::COMPARE_KERNELS,
            )?;
            let flush_bytes = usize::try_from(crate::timing::l2_flush_bytes(facts.limits.l2_bytes))
                .unwrap_or(usize::MAX);
            let flush = alloc(&shared, flush_bytes)?;
            let hash_out = alloc(&shared, 8)?;
            let compare_out = alloc(&shared, 8 * 16)?;
            Ok((module, compare, flush, hash_out, compare_out))
        })();
        let (module, compare, flush, hash_out, compare_out) = match rest {
            Ok(v) => v,
            Err(e) => {
                destroy_events();
                return Err(e);
            }
        };
        tracing::info!(
            ordinal,
            name = %facts.name,
            arch = %facts.arch,
            l2_bytes = facts.limits.l2_bytes,
            "gpu opened"
        );
        Ok(Gpu {
            facts,
            ev_start,
            ev_end,
            trusted: Trusted { module, compare },
            flush,
            hash_out,
            compare_out,
            flush_value: std::cell::Cell::new(0),
            shared,
        })
    }

    /// Facts about this device.
    pub fn facts(&self) -> &DeviceFacts {
        &self.facts
    }

    /// This device's limits.
    pub fn limits(&self) -> &DeviceLimits {
        &self.facts.limits
    }

    /// `Some(reason)` once a fault or timeout has poisoned the context.
    pub fn poisoned(&self) -> Option<String> {
        self.shared.poisoned()
    }

    /// Allocates `bytes` of device memory, zeroed.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, GpuError> {
        self.shared.enter()?;
        alloc(&self.shared, bytes)
    }

    /// Allocates `bytes` of device memory, zeroed, that can be exported as a file
    /// descriptor ([`Gpu::export_fd`]) for another process to map (see
    /// [`crate::shareable`]).
    pub fn alloc_shareable(&self, bytes: usize) -> Result<DeviceBuffer, GpuError> {
        self.shared.enter()?;
        crate::shareable::alloc(&self.shared, bytes)
    }

    /// A new file descriptor for a shareable buffer's memory
    /// ([`Gpu::alloc_shareable`]); the buffer stays this process's, and the memory lives
    /// until the buffer and every importer's mapping are gone.
    pub fn export_fd(&self, buf: &DeviceBuffer) -> Result<std::os::fd::OwnedFd, GpuError> {
        self.shared.enter()?;
        crate::shareable::export(&self.shared, buf)
    }

    /// Copies `src` into `dst` at `byte_offset`; returns once the copy is complete.
    pub fn upload<T: Pod>(
        &self,
        dst: &DeviceBuffer,
        byte_offset: usize,
        src: &[T],
    ) -> Result<(), GpuError> {
        self.check_range(dst, byte_offset, std::mem::size_of_val(src))?;
        self.shared.enter()?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the destination range lies inside `dst`'s allocation (checked above) in the
        // current context; `src` stays borrowed (and unmoved) until the stream synchronize
        // below has completed the copy.
        unsafe { dr::memcpy_htod_async(dst.ptr + byte_offset as u64, src, self.shared.stream) }
            .map_err(|e| self.shared.fail("cuMemcpyHtoDAsync", e, false))?;
        self.shared.sync_stream()
    }

    /// Copies from `src` at `byte_offset` into `dst`; returns once the copy is complete.
    pub fn download<T: Pod>(
        &self,
        src: &DeviceBuffer,
        byte_offset: usize,
        dst: &mut [T],
    ) -> Result<(), GpuError> {
        self.check_range(src, byte_offset, std::mem::size_of_val(dst))?;
        self.shared.enter()?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: the source range lies inside `src`'s allocation (checked above); `dst` is
        // exclusively borrowed until the synchronize below completes the copy, and every bit
        // pattern is a valid `T` (`Pod`).
        unsafe { dr::memcpy_dtoh_async(dst, src.ptr + byte_offset as u64, self.shared.stream) }
            .map_err(|e| self.shared.fail("cuMemcpyDtoHAsync", e, false))?;
        self.shared.sync_stream()
    }

    /// Downloads `elems` elements from the start of `src`.
    pub fn download_vec<T: Pod>(
        &self,
        src: &DeviceBuffer,
        elems: usize,
    ) -> Result<Vec<T>, GpuError> {
        let mut v = vec![T::default(); elems];
        self.download(src, 0, &mut v)?;
        Ok(v)
    }

    /// Sets every byte of `dst` to `value`; returns once done.
    pub fn memset(&self, dst: &DeviceBuffer, value: u8) -> Result<(), GpuError> {
        self.check_range(dst, 0, dst.bytes)?;
        self.shared.enter()?;
        // SAFETY: the whole allocation of `dst`, in the current context, on our stream.
        unsafe { dr::memset_d8_async(dst.ptr, value, dst.bytes, self.shared.stream) }
            .map_err(|e| self.shared.fail("cuMemsetD8Async", e, false))?;
        self.shared.sync_stream()
    }

    /// Copies all of `src` to the start of `dst` (device to device); returns once done.
    pub fn copy(&self, dst: &DeviceBuffer, src: &DeviceBuffer) -> Result<(), GpuError> {
        self.check_range(dst, 0, src.bytes)?;
        self.check_range(src, 0, src.bytes)?;
        self.shared.enter()?;
        // SAFETY: both ranges lie inside live allocations of this context (checked above).
        unsafe { dr::memcpy_dtod_async(dst.ptr, src.ptr, src.bytes, self.shared.stream) }
            .map_err(|e| self.shared.fail("cuMemcpyDtoDAsync", e, false))?;
        self.shared.sync_stream()
    }

    /// Waits for the stream, then for the whole context. Any error here is a fault.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.shared.enter()?;
        self.shared.sync_stream()?;
        dr::ctx::synchronize().map_err(|e| self.shared.fail("cuCtxSynchronize", e, true))
    }

    /// Enqueues an L2 flush: resets persisting L2 lines (`cuCtxResetPersistingL2Cache`),
    /// then writes the 2 × L2 flush buffer with a byte value that changes every call, so
    /// no cache line of the timed kernel's data survives, and reads it once (so the lines
    /// left are clean). Does not wait.
    pub fn l2_flush(&self) -> Result<(), GpuError> {
        self.shared.enter()?;
        // SAFETY: a context-wide reset with no pointer arguments; the context is current.
        let rc = unsafe { sys::cuCtxResetPersistingL2Cache() };
        match rc {
            CUresult::CUDA_SUCCESS => {}
            other if crate::error::is_sticky(other) => {
                return Err(self.shared.fail(
                    "cuCtxResetPersistingL2Cache",
                    dr::DriverError(other),
                    false,
                ));
            }
            // Not supported (or refused) here: then nothing can be persisting; the write
            // below still evicts everything.
            other => tracing::debug!(error = ?other, "cuCtxResetPersistingL2Cache refused"),
        }
        let v = self.flush_value.get().wrapping_add(1);
        self.flush_value.set(v);
        // SAFETY: the flush buffer is a live allocation of this context, written on our stream.
        unsafe { dr::memset_d8_async(self.flush.ptr, v, self.flush.bytes, self.shared.stream) }
            .map_err(|e| self.shared.fail("cuMemsetD8Async", e, false))?;
        // The write leaves the L2 full of dirty lines; timed work that evicted them would
        // pay for their write-back (measured on an H200: +0.75 µs on a 7 µs row sum against
        // Nsight Compute's flush). Reading the buffer once more evicts them before the
        // window opens, so the work starts from a clean, cold L2.
        self.enqueue_read(&self.flush)
    }

    /// Loads a compiled module. `kernel_names` are looked up as symbols (a name missing from
    /// the module is simply absent, and the launch validator reports it); every other kernel
    /// the driver can enumerate is added too, under its symbol.
    pub fn load_module(
        &self,
        compiled: &CompiledModule,
        kernel_names: &[&str],
    ) -> Result<Module, GpuError> {
        let refs = identity_refs(kernel_names);
        self.shared.enter()?;
        load(&self.shared, &self.facts.limits, compiled, &refs)
    }

    /// Loads an artifact, each of `kernel_names` (the launch list's names) under its own
    /// name but looked up by the symbol its manifest gives (a C++ kernel's lowered name).
    pub fn load_artifact(
        &self,
        artifact: &Artifact,
        kernel_names: &[&str],
    ) -> Result<Module, GpuError> {
        let refs: Vec<(String, KernelEntry)> = kernel_names
            .iter()
            .map(|n| (n.to_string(), artifact.kernel(n)))
            .collect();
        self.shared.enter()?;
        load(
            &self.shared,
            &self.facts.limits,
            &artifact.module(&self.facts.arch),
            &refs,
        )
    }

    /// Loads several images as one [`Module`] whose kernels are named by the launch plan:
    /// from each part, the kernels it lists as (plan name, symbol in the image). A symbol
    /// the image lacks is left out (the launch check names what the module does hold);
    /// a plan name given twice is an error.
    pub fn load_parts(&self, parts: &[ImagePart<'_>]) -> Result<Module, GpuError> {
        self.shared.enter()?;
        let mut m = Module {
            shared: Arc::clone(&self.shared),
            modules: Vec::with_capacity(parts.len()),
            limits: self.facts.limits.clone(),
            kernels: BTreeMap::new(),
        };
        for part in parts {
            // `m` owns every module loaded so far: an error below unloads them.
            let module = load_image(&self.shared, part.module)?;
            m.modules.push(module);
            for (name, symbol) in part.kernels {
                if m.kernels.contains_key(name) {
                    return Err(GpuError::Usage(format!(
                        "kernel name {name:?} is given by two images"
                    )));
                }
                if let Some(func) = function(&self.shared, module, symbol)? {
                    let mut info = kernel_info(&self.shared, func, name)?;
                    info.symbol = symbol.clone();
                    m.kernels.insert(name.clone(), Kernel { func, info });
                }
            }
        }
        Ok(m)
    }

    /// Refuses buffers of another `Gpu` and ranges outside the buffer.
    pub(crate) fn check_range(
        &self,
        buf: &DeviceBuffer,
        offset: usize,
        len: usize,
    ) -> Result<(), GpuError> {
        if !Arc::ptr_eq(&buf.shared, &self.shared) {
            return Err(GpuError::Usage("buffer belongs to another Gpu".into()));
        }
        match offset.checked_add(len) {
            Some(end) if end <= buf.bytes => Ok(()),
            _ => Err(GpuError::Usage(format!(
                "range {offset}..+{len} is outside the {}-byte buffer",
                buf.bytes
            ))),
        }
    }
}

fn alloc(shared: &Arc<GpuShared>, bytes: usize) -> Result<DeviceBuffer, GpuError> {
    if bytes == 0 {
        return Err(GpuError::Usage("cannot allocate 0 bytes".into()));
    }
    // SAFETY: plain allocation in the current context; the memory is zeroed below before
    // anything reads it.
    let ptr = unsafe { dr::malloc_sync(bytes) }.map_err(|e| shared.fail("cuMemAlloc", e, false))?;
    let buf = DeviceBuffer {
        shared: Arc::clone(shared),
        ptr,
        bytes,
        backing: Backing::Plain,
    };
    // SAFETY: the whole new allocation, on our stream, in the current context.
    unsafe { dr::memset_d8_async(ptr, 0, bytes, shared.stream) }
        .map_err(|e| shared.fail("cuMemsetD8Async", e, false))?;
    shared.sync_stream()?;
    Ok(buf)
}

fn compile_trusted(source: &str, arch: &str) -> Result<CompiledModule, GpuError> {
    match compile(source, arch, &[]) {
        Ok(m) => Ok(m),
        // A GPU newer than this NVRTC: fall back to PTX for the matching virtual arch.
        Err(CompileError::Nvrtc { .. }) if arch.starts_with("sm_") => {
            let virt = arch.replacen("sm_", "compute_", 1);
            tracing::warn!(
                arch,
                "nvrtc cannot target the GPU's arch; using PTX for {virt}"
            );
            Ok(compile(source, &virt, &[])?)
        }
        Err(e) => Err(e.into()),
    }
}

/// Kernels looked up by their own names as symbols.
fn identity_refs(names: &[&str]) -> Vec<(String, KernelEntry)> {
    names
        .iter()
        .map(|n| {
            let entry = KernelEntry {
                symbol: n.to_string(),
                ..KernelEntry::default()
            };
            (n.to_string(), entry)
        })
        .collect()
}

/// One image of a [`Gpu::load_parts`] module and the kernels taken from it.
#[derive(Debug, Clone, Copy)]
pub struct ImagePart<'a> {
    /// The image.
    pub module: &'a CompiledModule,
    /// `(name in the launch plan, symbol in the image)` of each kernel taken from it.
    pub kernels: &'a [(String, String)],
}

/// Loads one image into the current context.
fn load_image(shared: &GpuShared, compiled: &CompiledModule) -> Result<sys::CUmodule, GpuError> {
    let mut image = compiled.image.clone();
    match compiled.kind {
        ImageKind::Cubin => {
            if !image.starts_with(b"\x7fELF") {
                return Err(GpuError::Usage("the CUBIN image is not an ELF file".into()));
            }
        }
        ImageKind::Ptx => {
            if image.last() != Some(&0) {
                image.push(0);
            }
        }
    }
    // SAFETY: `image` is an ELF CUBIN (magic checked) or NUL-terminated PTX text, as
    // `cuModuleLoadData` requires, and outlives the call (the driver copies what it keeps).
    unsafe { dr::module::load_data(image.as_ptr().cast()) }
        .map_err(|e| shared.fail("cuModuleLoadData", e, false))
}

/// The function `symbol` of a loaded module, `None` if it has none of that name.
fn function(
    shared: &GpuShared,
    module: sys::CUmodule,
    symbol: &str,
) -> Result<Option<sys::CUfunction>, GpuError> {
    let Ok(c_name) = CString::new(symbol) else {
        return Ok(None);
    };
    // SAFETY: `module` is a live module loaded in the current context.
    match unsafe { dr::module::get_function(module, c_name) } {
        Ok(func) => Ok(Some(func)),
        Err(dr::DriverError(CUresult::CUDA_ERROR_NOT_FOUND)) => Ok(None),
        Err(e) => Err(shared.fail("cuModuleGetFunction", e, false)),
    }
}

fn load(
    shared: &Arc<GpuShared>,
    limits: &DeviceLimits,
    compiled: &CompiledModule,
    kernels: &[(String, KernelEntry)],
) -> Result<Module, GpuError> {
    let module = load_image(shared, compiled)?;
    let mut m = Module {
        shared: Arc::clone(shared),
        modules: vec![module],
        limits: limits.clone(),
        kernels: BTreeMap::new(),
    };
    let mut wanted: Vec<(String, KernelEntry)> = kernels.to_vec();
    let found = enumerate_kernel_names(module);
    let found: Vec<&str> = found.iter().map(String::as_str).collect();
    wanted.extend(identity_refs(&found));
    for (name, entry) in wanted {
        if m.kernels.contains_key(&name) {
            continue;
        }
        if let Some(func) = function(shared, module, &entry.symbol)? {
            let mut info = kernel_info(shared, func, &name)?;
            info.symbol = entry.symbol.clone();
            info.trailing_null_params = entry.trailing_null_params;
            m.kernels.insert(name, Kernel { func, info });
        }
    }
    Ok(m)
}

/// Names of every kernel in the module (CUDA 12.4+); empty if the driver cannot tell.
fn enumerate_kernel_names(module: sys::CUmodule) -> Vec<String> {
    let mut count: c_uint = 0;
    // SAFETY: `module` is live; `count` is a valid out-pointer.
    if unsafe { sys::cuModuleGetFunctionCount(&mut count, module) } != CUresult::CUDA_SUCCESS {
        return Vec::new();
    }
    let count = count.min(1024);
    let mut funcs: Vec<sys::CUfunction> = vec![std::ptr::null_mut(); count as usize];
    // SAFETY: `funcs` has room for exactly `count` handles.
    if unsafe { sys::cuModuleEnumerateFunctions(funcs.as_mut_ptr(), count, module) }
        != CUresult::CUDA_SUCCESS
    {
        return Vec::new();
    }
    let mut names = Vec::new();
    for f in funcs {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `f` was returned by the enumeration above; `p` is a valid out-pointer.
        if unsafe { sys::cuFuncGetName(&mut p, f) } == CUresult::CUDA_SUCCESS && !p.is_null() {
            // SAFETY: the driver returns a NUL-terminated string it owns for the module's
            // lifetime; it is copied at once.
            let name = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            names.push(name);
        }
    }
    names
}

fn kernel_info(
    shared: &GpuShared,
    func: sys::CUfunction,
    name: &str,
) -> Result<KernelInfo, GpuError> {
    let attr = |a: CUfunction_attribute| -> Result<u32, GpuError> {
        // SAFETY: `func` was just obtained from a live module in the current context.
        let v = unsafe { dr::function::get_function_attribute(func, a) }
            .map_err(|e| shared.fail("cuFuncGetAttribute", e, false))?;
        Ok(u32::try_from(v).unwrap_or(0))
    };
    use CUfunction_attribute::*;
    Ok(KernelInfo {
        name: name.to_string(),
        symbol: name.to_string(),
        trailing_null_params: 0,
        registers: attr(CU_FUNC_ATTRIBUTE_NUM_REGS)?,
        static_shared_bytes: attr(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
        const_bytes: attr(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)?,
        local_bytes: attr(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
        max_threads_per_block: attr(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_dynamic_shared_bytes: attr(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?,
        ptx_version: attr(CU_FUNC_ATTRIBUTE_PTX_VERSION)?,
        binary_version: attr(CU_FUNC_ATTRIBUTE_BINARY_VERSION)?,
        param_sizes: param_sizes(func),
    })
}

/// Parameter sizes via `cuFuncGetParamInfo`, probing indices until the driver says the
/// index is out of range. `None` if the first query fails for another reason (an older
/// driver) or the count looks implausible.
fn param_sizes(func: sys::CUfunction) -> Option<Vec<usize>> {
    let mut sizes = Vec::new();
    for index in 0..=crate::launch::MAX_KERNEL_PARAMS {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `func` is a live function handle; both out-pointers are valid.
        let rc = unsafe { sys::cuFuncGetParamInfo(func, index, &mut offset, &mut size) };
        match rc {
            CUresult::CUDA_SUCCESS => sizes.push(size),
            CUresult::CUDA_ERROR_INVALID_VALUE => return Some(sizes),
            _ => return None,
        }
    }
    None
}

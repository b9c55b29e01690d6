//! Device memory another process can map: the GPU worker's tensors of a problem with a
//! PyTorch reference, which the trusted torch runner (another process, another CUDA
//! context) reads and writes in place, so no tensor crosses host memory.
//!
//! The memory is made with the driver's virtual memory management (`cuMemCreate` with a
//! POSIX file descriptor handle type, mapped with `cuMemMap`), not `cuMemAlloc`: only such
//! memory can be exported as a file descriptor, and a descriptor is what crosses PID
//! namespaces — the jailed worker's and the runner's differ, and legacy `cuIpc*` handles
//! do not work across them. The descriptor travels by `SCM_RIGHTS`
//! (`kiln_protocol::fds`). The importer maps it only for one reference call and unmaps it
//! before it answers; the memory itself is freed (after a scrub) when the buffer is
//! dropped here and every mapping is gone.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::result as dr;
use cudarc::driver::sys;

use crate::device::{Backing, DeviceBuffer, GpuShared};
use crate::error::{GpuError, error_name};

/// The allocation properties: pinned device memory on the context's device, exportable
/// as a POSIX file descriptor.
fn properties(shared: &GpuShared) -> sys::CUmemAllocationProp {
    // SAFETY: an all-zero `CUmemAllocationProp` is its documented default (no compression,
    // no flags); the fields that matter are set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = shared.ctx.cu_device();
    prop
}

/// `bytes` rounded up to a multiple of `granularity` (a power of two, or any positive
/// number); `None` on overflow or a zero granularity.
pub fn round_up(bytes: usize, granularity: usize) -> Option<usize> {
    if granularity == 0 {
        return None;
    }
    bytes.checked_next_multiple_of(granularity)
}

/// Allocates, maps and zeroes `bytes` of shareable device memory.
pub(crate) fn alloc(shared: &Arc<GpuShared>, bytes: usize) -> Result<DeviceBuffer, GpuError> {
    if bytes == 0 {
        return Err(GpuError::Usage("cannot allocate 0 bytes".into()));
    }
    let prop = properties(shared);
    let mut granularity = 0usize;
    // SAFETY: `prop` is a valid property struct and `granularity` a valid out pointer.
    unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        )
    }
    .result()
    .map_err(|e| shared.fail("cuMemGetAllocationGranularity", e, false))?;
    let mapped = round_up(bytes, granularity)
        .ok_or_else(|| GpuError::Usage(format!("{bytes} bytes cannot be rounded up")))?;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out pointer and properties; `mapped` is a multiple of the granularity.
    unsafe { sys::cuMemCreate(&mut handle, mapped, &prop, 0) }
        .result()
        .map_err(|e| shared.fail("cuMemCreate", e, false))?;
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: reserves a fresh virtual range of `mapped` bytes; nothing else uses it.
    let reserved = unsafe { sys::cuMemAddressReserve(&mut ptr, mapped, granularity, 0, 0) };
    if let Err(e) = reserved.result() {
        // SAFETY: the handle was created above and is released once.
        let _ = unsafe { sys::cuMemRelease(handle) };
        return Err(shared.fail("cuMemAddressReserve", e, false));
    }
    // From here the buffer owns the range and the handle: dropping it unmaps (harmless
    // when nothing is mapped yet), frees the range and releases the handle.
    let buf = DeviceBuffer {
        shared: Arc::clone(shared),
        ptr,
        bytes,
        backing: Backing::Shareable { handle, mapped },
    };
    // SAFETY: maps the whole allocation into the range reserved for it.
    unsafe { sys::cuMemMap(ptr, mapped, 0, handle, 0) }
        .result()
        .map_err(|e| shared.fail("cuMemMap", e, false))?;
    let access = sys::CUmemAccessDesc {
        location: prop.location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the range was just mapped; one valid access descriptor.
    unsafe { sys::cuMemSetAccess(ptr, mapped, &access, 1) }
        .result()
        .map_err(|e| shared.fail("cuMemSetAccess", e, false))?;
    // SAFETY: the whole mapped range, on our stream, in the current context.
    unsafe { dr::memset_d8_async(ptr, 0, mapped, shared.stream) }
        .map_err(|e| shared.fail("cuMemsetD8Async", e, false))?;
    shared.sync_stream()?;
    Ok(buf)
}

/// A new descriptor for `buf`'s memory (refused for a buffer that is not shareable).
pub(crate) fn export(shared: &GpuShared, buf: &DeviceBuffer) -> Result<OwnedFd, GpuError> {
    let Backing::Shareable { handle, .. } = buf.backing else {
        return Err(GpuError::Usage(
            "only a buffer from alloc_shareable can be exported".into(),
        ));
    };
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: for the POSIX descriptor handle type the out parameter is an `int`.
    unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut std::ffi::c_int).cast(),
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    }
    .result()
    .map_err(|e| shared.fail("cuMemExportToShareableHandle", e, false))?;
    if fd < 0 {
        return Err(GpuError::Usage(
            "cuMemExportToShareableHandle returned no descriptor".into(),
        ));
    }
    // SAFETY: the driver just created this descriptor for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The size an importer maps: the whole allocation (a multiple of the granularity).
pub fn mapped_bytes(buf: &DeviceBuffer) -> Option<usize> {
    match buf.backing {
        Backing::Shareable { mapped, .. } => Some(mapped),
        Backing::Plain => None,
    }
}

/// Unmaps, frees the range and releases the handle of a shareable buffer (after its scrub,
/// from [`DeviceBuffer`]'s drop, with the context current).
pub(crate) fn release(
    ptr: sys::CUdeviceptr,
    mapped: usize,
    handle: sys::CUmemGenericAllocationHandle,
) {
    // SAFETY: the range and handle belong to a buffer being dropped; its memory is no
    // longer used by queued work (the caller synchronized), and each is released once.
    unsafe {
        if let Err(e) = sys::cuMemUnmap(ptr, mapped).result() {
            tracing::warn!(error = %error_name(e), "cuMemUnmap failed");
        }
        if let Err(e) = sys::cuMemAddressFree(ptr, mapped).result() {
            tracing::warn!(error = %error_name(e), "cuMemAddressFree failed");
        }
        if let Err(e) = sys::cuMemRelease(handle).result() {
            tracing::warn!(error = %error_name(e), "cuMemRelease failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_the_granularity() {
        assert_eq!(round_up(1, 2 << 20), Some(2 << 20));
        assert_eq!(round_up(2 << 20, 2 << 20), Some(2 << 20));
        assert_eq!(round_up((2 << 20) + 1, 2 << 20), Some(4 << 20));
        assert_eq!(round_up(5, 0), None);
        assert_eq!(round_up(usize::MAX, 2 << 20), None);
    }
}

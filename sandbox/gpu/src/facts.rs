//! `available()`: can the cuda backend run here, and on what?
//!
//! cudarc loads `libcuda.so` and `libnvrtc.so` with `dlopen` on first use and *panics* when
//! a library is missing (deps-probe.md). So the presence of each library is checked first
//! with cudarc's `is_culib_present()`, which only tries `dlopen`, and every later call runs
//! under `catch_unwind` as a backstop. The result is either the facts about every visible
//! device or an [`Unavailable`] whose reason a person can act on. Never a panic.

use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::result as dr;
use cudarc::driver::sys::{self, CUdevice_attribute};
use serde::{Deserialize, Serialize};

use crate::error::{Unavailable, error_name};

/// The lowest driver API version this crate's bindings (cudarc `cuda-13000`) work with.
pub const MIN_DRIVER_VERSION: i32 = 13000;

/// Launch and memory limits of one device, as reported by the driver.
///
/// The launch validator takes limits from this struct, so it can be tested (and the daemon
/// can plan) without a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceLimits {
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Threads per warp.
    pub warp_size: u32,
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Most threads resident on one SM.
    pub max_threads_per_sm: u32,
    /// Largest block dimensions (x, y, z).
    pub max_block_dim: [u32; 3],
    /// Largest grid dimensions (x, y, z).
    pub max_grid_dim: [u32; 3],
    /// Shared memory one block may use without opting in (48 KiB on every current GPU).
    pub max_shared_per_block: u32,
    /// Shared memory one block may use after opting in
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`); 227 KiB on sm_90.
    pub max_shared_per_block_optin: u32,
    /// Shared memory per SM.
    pub max_shared_per_sm: u32,
    /// 32-bit registers per block.
    pub max_registers_per_block: u32,
    /// L2 cache size in bytes.
    pub l2_bytes: u64,
    /// Largest persisting-L2 carve-out in bytes.
    pub max_persisting_l2_bytes: u64,
    /// Whether cooperative launches are supported (`CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH`).
    #[serde(default)]
    pub cooperative_launch: bool,
    /// Whether thread-block cluster launches are supported
    /// (`CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH`, compute capability 9.0+).
    #[serde(default)]
    pub cluster_launch: bool,
}

impl DeviceLimits {
    /// The limits of an H100/H200-class (sm_90) device with the H200's 60 MiB L2 and 132
    /// SMs, for tests and for planning where no GPU is present.
    pub fn sm90_example() -> Self {
        DeviceLimits {
            sm_count: 132,
            warp_size: 32,
            max_threads_per_block: 1024,
            max_threads_per_sm: 2048,
            max_block_dim: [1024, 1024, 64],
            max_grid_dim: [2_147_483_647, 65_535, 65_535],
            max_shared_per_block: 48 * 1024,
            max_shared_per_block_optin: 227 * 1024,
            max_shared_per_sm: 228 * 1024,
            max_registers_per_block: 65_536,
            l2_bytes: 60 * 1024 * 1024,
            max_persisting_l2_bytes: 0,
            cooperative_launch: true,
            cluster_launch: true,
        }
    }
}

/// Facts about one visible device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFacts {
    /// CUDA ordinal (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: u32,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// UUID in NVML's form, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, which is how NVML
    /// finds the same device (NVML's indices need not match CUDA's ordinals).
    pub uuid: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// The real architecture NVRTC compiles for, e.g. `sm_90`.
    pub arch: String,
    /// Device memory in bytes.
    pub total_mem_bytes: u64,
    /// Launch and memory limits.
    pub limits: DeviceLimits,
}

/// What `available()` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFacts {
    /// CUDA driver API version, e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
    /// NVRTC version (major, minor).
    pub nvrtc_version: (i32, i32),
    /// Every visible device.
    pub devices: Vec<DeviceFacts>,
}

/// Checks that the CUDA driver and NVRTC libraries load, initialises the driver and lists
/// the devices. Never panics; on this crate's CI machines (no GPU) it returns `Err` with
/// the reason.
pub fn available() -> Result<GpuFacts, Unavailable> {
    libraries_present()?;
    match catch_unwind(AssertUnwindSafe(query_facts)) {
        Ok(result) => result,
        Err(panic) => Err(Unavailable::new(format!(
            "the CUDA library panicked while being queried: {}",
            panic_message(&panic)
        ))),
    }
}

/// Checks, without initialising anything, that `libcuda.so` and `libnvrtc.so` can be
/// loaded.
pub fn libraries_present() -> Result<(), Unavailable> {
    // SAFETY: `is_culib_present` only calls `dlopen` on each candidate library name and
    // drops the handle; it runs no CUDA code. Loading libcuda/libnvrtc runs their ELF
    // initialisers, which is exactly what any later use would do.
    let driver = unsafe { sys::is_culib_present() };
    if !driver {
        return Err(Unavailable::new(
            "libcuda.so not found: no NVIDIA driver is installed on this machine, or its library \
             is not on the loader path (LD_LIBRARY_PATH)",
        ));
    }
    // SAFETY: as above, for libnvrtc.
    let nvrtc = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    if !nvrtc {
        return Err(Unavailable::new(
            "libnvrtc.so not found: the CUDA 13 runtime compiler (NVRTC) is not installed or \
             not on LD_LIBRARY_PATH (it ships with the CUDA toolkit, e.g. /usr/local/cuda/lib64)",
        ));
    }
    Ok(())
}

/// The NVRTC version, or `None` when NVRTC cannot be loaded.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    // SAFETY: see `libraries_present`.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return None;
    }
    catch_unwind(|| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: both out-pointers are valid, writable `c_int`s for the duration of the call.
        let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        (rc == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
    })
    .ok()
    .flatten()
}

fn query_facts() -> Result<GpuFacts, Unavailable> {
    dr::init().map_err(|e| {
        Unavailable::new(format!(
            "cuInit failed: {} (is the NVIDIA kernel module loaded, and is a GPU visible to \
             this process?)",
            error_name(e)
        ))
    })?;
    let mut driver_version = 0;
    // SAFETY: the out-pointer is a valid, writable `c_int`.
    let rc = unsafe { sys::cuDriverGetVersion(&mut driver_version) };
    rc.result()
        .map_err(|e| Unavailable::new(format!("cuDriverGetVersion failed: {}", error_name(e))))?;
    if driver_version < MIN_DRIVER_VERSION {
        return Err(Unavailable::new(format!(
            "the driver supports CUDA {}.{}, kiln-gpu needs {}.{} (driver 580 or newer)",
            driver_version / 1000,
            (driver_version % 1000) / 10,
            MIN_DRIVER_VERSION / 1000,
            (MIN_DRIVER_VERSION % 1000) / 10
        )));
    }
    let nvrtc_version = nvrtc_version().ok_or_else(|| Unavailable::new("nvrtcVersion failed"))?;
    let count = dr::device::get_count()
        .map_err(|e| Unavailable::new(format!("cuDeviceGetCount failed: {}", error_name(e))))?;
    if count <= 0 {
        return Err(Unavailable::new(
            "no CUDA device is visible to this process",
        ));
    }
    let mut devices = Vec::new();
    for ordinal in 0..count {
        devices.push(device_facts(ordinal).map_err(|e| {
            Unavailable::new(format!("querying CUDA device {ordinal} failed: {e}"))
        })?);
    }
    Ok(GpuFacts {
        driver_version,
        nvrtc_version,
        devices,
    })
}

/// Reads the facts of one device. The driver must be initialised.
pub(crate) fn device_facts(ordinal: i32) -> Result<DeviceFacts, String> {
    let dev = dr::device::get(ordinal).map_err(|e| format!("cuDeviceGet: {}", error_name(e)))?;
    let attr = |a: CUdevice_attribute| -> Result<u32, String> {
        // SAFETY: `dev` was returned by `cuDeviceGet` for a valid ordinal; the attribute is a
        // plain integer query.
        let v = unsafe { dr::device::get_attribute(dev, a) }
            .map_err(|e| format!("cuDeviceGetAttribute({a:?}): {}", error_name(e)))?;
        Ok(u32::try_from(v).unwrap_or(0))
    };
    use CUdevice_attribute::*;
    let major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let limits = DeviceLimits {
        sm_count: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        warp_size: attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
        max_threads_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_threads_per_sm: attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
        max_block_dim: [
            attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
            attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
            attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
        ],
        max_grid_dim: [
            attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
            attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
            attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
        ],
        max_shared_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
        max_shared_per_block_optin: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        max_shared_per_sm: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
        max_registers_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK)?,
        l2_bytes: u64::from(attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?),
        max_persisting_l2_bytes: u64::from(attr(CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE)?),
        cooperative_launch: attr(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? != 0,
        // An older driver may not know the attribute: then no clusters.
        cluster_launch: attr(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH).unwrap_or(0) != 0,
    };
    let name =
        dr::device::get_name(dev).map_err(|e| format!("cuDeviceGetName: {}", error_name(e)))?;
    let uuid =
        dr::device::get_uuid(dev).map_err(|e| format!("cuDeviceGetUuid: {}", error_name(e)))?;
    // SAFETY: `dev` is a valid device handle (see above).
    let total = unsafe { dr::device::total_mem(dev) }
        .map_err(|e| format!("cuDeviceTotalMem: {}", error_name(e)))?;
    Ok(DeviceFacts {
        ordinal: u32::try_from(ordinal).unwrap_or(0),
        name,
        uuid: format_uuid(&uuid.bytes.map(|b| b as u8)),
        compute_capability: (major, minor),
        arch: format!("sm_{major}{minor}"),
        total_mem_bytes: total as u64,
        limits,
    })
}

/// Formats 16 UUID bytes the way NVML prints them: `GPU-8-4-4-4-12` lowercase hex.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let hex =
        |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// The text of a caught panic.
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_returns_a_reason_instead_of_panicking() {
        // This crate's CI machines have no GPU and no CUDA libraries; on a GPU host this
        // test only checks that the call returns.
        match available() {
            Ok(facts) => assert!(!facts.devices.is_empty()),
            Err(e) => {
                assert!(!e.reason.is_empty());
                assert!(
                    e.reason.contains("not found") || e.reason.contains("cuInit"),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn uuid_is_formatted_like_nvml() {
        let b: [u8; 16] = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(format_uuid(&b), "GPU-12345678-9abc-def0-0123-456789abcdef");
    }
}

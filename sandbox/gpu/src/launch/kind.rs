//! Launch kinds: plain (`cuLaunchKernel`), cooperative (grid-wide synchronisation) and
//! thread-block clusters, both through `cuLaunchKernelEx` with a launch attribute.
//!
//! Language-neutral on purpose: a CUDA C++ launch asks for a kind in its plan
//! (`"cooperative": true`, `"cluster": [x, y, z]`); another language's compiler (Triton's
//! `num_ctas`) sets the same [`LaunchKind`] on its checked launches. Three layers:
//! - [`check_kind`] (pure): the device supports the kind; a cluster divides the grid and
//!   has at most [`MAX_CLUSTER_BLOCKS`] blocks;
//! - [`check_residency`] (pure, over a [`Residency`] oracle): a cooperative grid must be
//!   resident all at once (occupancy × SMs), a cluster must fit the GPU at least once
//!   (`cuOccupancyMaxActiveClusters`) — otherwise the launch would deadlock or be refused,
//!   so it is an `invalid_launch` before anything runs;
//! - [`launch`] (unsafe driver calls): enqueues one launch of its kind on a stream.

use std::ffi::c_void;

use cudarc::driver::sys::{self, CUresult};

use super::{CheckedLaunch, CheckedLaunches, InvalidLaunch};
use crate::facts::DeviceLimits;

/// Most blocks in a cluster (the portable limit; larger clusters need a non-portable
/// opt-in kiln does not make).
pub const MAX_CLUSTER_BLOCKS: u32 = 8;

/// How one launch is issued.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LaunchKind {
    /// `cuLaunchKernel`.
    #[default]
    Plain,
    /// A cooperative launch: every block resident at once, so the grid may synchronise.
    Cooperative,
    /// Thread-block clusters of these dimensions.
    Cluster([u32; 3]),
}

impl LaunchKind {
    /// The kind a plan's launch asks for.
    pub fn of(l: &kiln_types::Launch) -> LaunchKind {
        match (l.cooperative, l.cluster) {
            (_, Some(c)) => LaunchKind::Cluster(c),
            (true, None) => LaunchKind::Cooperative,
            (false, None) => LaunchKind::Plain,
        }
    }
}

/// Checks `kind` for a launch of `grid` on `device` (see the module docs).
pub fn check_kind(kind: LaunchKind, grid: [u32; 3], device: &DeviceLimits) -> Result<(), String> {
    match kind {
        LaunchKind::Plain => Ok(()),
        LaunchKind::Cooperative if !device.cooperative_launch => {
            Err("this GPU does not support cooperative launches".into())
        }
        LaunchKind::Cooperative => Ok(()),
        LaunchKind::Cluster(_) if !device.cluster_launch => {
            Err("this GPU does not support thread-block clusters (compute capability 9.0+)".into())
        }
        LaunchKind::Cluster(c) => {
            if c.contains(&0) {
                return Err("cluster dimensions must be at least 1".into());
            }
            let blocks: u64 = c.iter().map(|&d| u64::from(d)).product();
            if blocks > u64::from(MAX_CLUSTER_BLOCKS) {
                return Err(format!(
                    "a cluster of {blocks} blocks exceeds the portable limit of {MAX_CLUSTER_BLOCKS}"
                ));
            }
            for (axis, (&g, &d)) in ["x", "y", "z"].iter().zip(grid.iter().zip(c.iter())) {
                if g % d != 0 {
                    return Err(format!(
                        "grid.{axis} = {g} is not a multiple of cluster.{axis} = {d}"
                    ));
                }
            }
            Ok(())
        }
    }
}

/// What [`check_residency`] asks of the loaded kernels (the driver's occupancy API on a
/// GPU; a table in tests).
pub trait Residency {
    /// Blocks of `kernel` that fit one SM at once with this block size and dynamic shared
    /// memory.
    fn blocks_per_sm(
        &self,
        kernel: &str,
        block_threads: u32,
        shared_bytes: u32,
    ) -> Result<u32, String>;
    /// Clusters of `launch`'s shape that fit the GPU at once.
    fn max_active_clusters(&self, launch: &CheckedLaunch) -> Result<u32, String>;
}

/// Checks that every cooperative launch's grid can be resident at once and every cluster
/// launch's cluster fits (see the module docs).
pub fn check_residency(
    plan: &CheckedLaunches,
    device: &DeviceLimits,
    residency: &dyn Residency,
) -> Result<(), InvalidLaunch> {
    for (index, l) in plan.launches.iter().enumerate() {
        let bad = |reason: String| InvalidLaunch {
            index,
            kernel: l.kernel.clone(),
            reason,
        };
        match l.kind {
            LaunchKind::Plain => {}
            LaunchKind::Cooperative => {
                let per_sm = residency
                    .blocks_per_sm(&l.kernel, l.block_threads(), l.shared_bytes)
                    .map_err(|e| bad(format!("occupancy unknown: {e}")))?;
                let capacity = u64::from(per_sm) * u64::from(device.sm_count);
                let blocks: u64 = l.grid.iter().map(|&d| u64::from(d)).product();
                if blocks > capacity {
                    return Err(bad(format!(
                        "a cooperative launch needs all {blocks} blocks resident at once, but \
                         only {capacity} fit ({per_sm} per SM × {} SMs with {} threads and {} \
                         bytes of dynamic shared memory per block)",
                        device.sm_count,
                        l.block_threads(),
                        l.shared_bytes
                    )));
                }
            }
            LaunchKind::Cluster(c) => {
                let n = residency
                    .max_active_clusters(l)
                    .map_err(|e| bad(format!("cluster occupancy unknown: {e}")))?;
                if n == 0 {
                    return Err(bad(format!(
                        "a cluster of {}×{}×{} blocks of {} threads and {} bytes of dynamic \
                         shared memory does not fit this GPU",
                        c[0],
                        c[1],
                        c[2],
                        l.block_threads(),
                        l.shared_bytes
                    )));
                }
            }
        }
    }
    Ok(())
}

/// The launch configuration for `cuLaunchKernelEx` / `cuOccupancyMaxActiveClusters`, with
/// `attr` (which must outlive every use of the config) as its one attribute when given.
pub(crate) fn config(
    l: &CheckedLaunch,
    stream: sys::CUstream,
    attr: Option<&mut sys::CUlaunchAttribute>,
) -> sys::CUlaunchConfig {
    let (attrs, n) = match attr {
        Some(a) => (a as *mut sys::CUlaunchAttribute, 1),
        None => (std::ptr::null_mut(), 0),
    };
    sys::CUlaunchConfig {
        gridDimX: l.grid[0],
        gridDimY: l.grid[1],
        gridDimZ: l.grid[2],
        blockDimX: l.block[0],
        blockDimY: l.block[1],
        blockDimZ: l.block[2],
        sharedMemBytes: l.shared_bytes,
        hStream: stream,
        attrs,
        numAttrs: n,
    }
}

/// The launch attribute of a cooperative or cluster launch (`None` for a plain one).
pub(crate) fn attribute(kind: LaunchKind) -> Option<sys::CUlaunchAttribute> {
    // SAFETY: `CUlaunchAttribute` is a plain C struct (an enum id, padding and a union of
    // plain values) for which all-zero bytes are a valid value.
    let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    match kind {
        LaunchKind::Plain => return None,
        LaunchKind::Cooperative => {
            a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            a.value.cooperative = 1;
        }
        LaunchKind::Cluster(c) => {
            a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            a.value.clusterDim.x = c[0];
            a.value.clusterDim.y = c[1];
            a.value.clusterDim.z = c[2];
        }
    }
    Some(a)
}

/// Enqueues one launch of its kind on `stream`.
///
/// # Safety
/// `func` must be a live function of the current context, `stream` a live stream of it,
/// and `params` must hold one valid pointer per kernel parameter, each to a value that
/// stays alive for the call (the driver copies the values when the launch is enqueued).
pub(crate) unsafe fn launch(
    func: sys::CUfunction,
    l: &CheckedLaunch,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> CUresult {
    match l.kind {
        LaunchKind::Plain => {
            // SAFETY: guaranteed by the caller (see the function's contract).
            unsafe {
                sys::cuLaunchKernel(
                    func,
                    l.grid[0],
                    l.grid[1],
                    l.grid[2],
                    l.block[0],
                    l.block[1],
                    l.block[2],
                    l.shared_bytes,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
        }
        kind => {
            let mut attr = attribute(kind);
            let cfg = config(l, stream, attr.as_mut());
            // SAFETY: as above; `cfg` points at `attr`, which outlives the call, and the
            // `extra` argument is null.
            unsafe { sys::cuLaunchKernelEx(&cfg, func, params.as_mut_ptr(), std::ptr::null_mut()) }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::ArgValue;
    use super::*;

    fn checked(kind: LaunchKind, grid: [u32; 3], block: u32, shared: u32) -> CheckedLaunch {
        CheckedLaunch {
            kernel: "k".into(),
            grid,
            block: [block, 1, 1],
            shared_bytes: shared,
            raise_dynamic_shared: false,
            args: vec![ArgValue::Ptr(0)],
            kind,
        }
    }

    /// A residency table: blocks per SM by block size; clusters fit when `clusters` > 0.
    struct Table {
        per_sm: BTreeMap<u32, u32>,
        clusters: u32,
    }

    impl Residency for Table {
        fn blocks_per_sm(&self, _: &str, block: u32, _: u32) -> Result<u32, String> {
            self.per_sm
                .get(&block)
                .copied()
                .ok_or_else(|| "no entry".into())
        }
        fn max_active_clusters(&self, _: &CheckedLaunch) -> Result<u32, String> {
            Ok(self.clusters)
        }
    }

    #[test]
    fn kinds_come_from_the_plan() {
        let mut l = kiln_types::Launch {
            kernel: "k".into(),
            ..Default::default()
        };
        assert_eq!(LaunchKind::of(&l), LaunchKind::Plain);
        l.cooperative = true;
        assert_eq!(LaunchKind::of(&l), LaunchKind::Cooperative);
        l.cooperative = false;
        l.cluster = Some([2, 1, 1]);
        assert_eq!(LaunchKind::of(&l), LaunchKind::Cluster([2, 1, 1]));
    }

    #[test]
    fn kinds_are_checked_against_the_device() {
        let mut dev = DeviceLimits::sm90_example();
        assert_eq!(
            check_kind(LaunchKind::Cluster([2, 1, 1]), [8, 1, 1], &dev),
            Ok(())
        );
        let e = check_kind(LaunchKind::Cluster([4, 4, 1]), [8, 8, 1], &dev).expect_err("16");
        assert!(e.contains("portable limit of 8"), "{e}");
        let e = check_kind(LaunchKind::Cluster([2, 2, 1]), [8, 3, 1], &dev).expect_err("div");
        assert!(e.contains("grid.y = 3"), "{e}");
        dev.cooperative_launch = false;
        dev.cluster_launch = false;
        let e = check_kind(LaunchKind::Cooperative, [1, 1, 1], &dev).expect_err("coop");
        assert!(e.contains("cooperative"), "{e}");
        let e = check_kind(LaunchKind::Cluster([2, 1, 1]), [2, 1, 1], &dev).expect_err("cl");
        assert!(e.contains("9.0"), "{e}");
        assert_eq!(check_kind(LaunchKind::Plain, [1, 1, 1], &dev), Ok(()));
    }

    #[test]
    fn a_cooperative_grid_must_be_resident_at_once() {
        let dev = DeviceLimits::sm90_example(); // 132 SMs
        let table = Table {
            per_sm: BTreeMap::from([(256, 8), (1024, 2)]),
            clusters: 1,
        };
        let plan = |grid: u32, block: u32| CheckedLaunches {
            launches: vec![checked(LaunchKind::Cooperative, [grid, 1, 1], block, 0)],
        };
        assert_eq!(check_residency(&plan(132 * 8, 256), &dev, &table), Ok(()));
        let err = check_residency(&plan(132 * 8 + 1, 256), &dev, &table).expect_err("too big");
        assert!(
            err.reason.contains("all 1057 blocks") && err.reason.contains("only 1056 fit"),
            "{err}"
        );
        let err = check_residency(&plan(300, 1024), &dev, &table).expect_err("big blocks");
        assert!(err.reason.contains("2 per SM"), "{err}");
        let err = check_residency(&plan(1, 64), &dev, &table).expect_err("unknown");
        assert!(err.reason.contains("occupancy unknown"), "{err}");
        // Plain launches are never held to residency.
        let plain = CheckedLaunches {
            launches: vec![checked(LaunchKind::Plain, [1 << 20, 1, 1], 64, 0)],
        };
        assert_eq!(check_residency(&plain, &dev, &table), Ok(()));
    }

    #[test]
    fn a_cluster_must_fit_the_gpu() {
        let dev = DeviceLimits::sm90_example();
        let plan = CheckedLaunches {
            launches: vec![checked(LaunchKind::Cluster([2, 1, 1]), [8, 1, 1], 128, 0)],
        };
        let fits = Table {
            per_sm: BTreeMap::new(),
            clusters: 66,
        };
        assert_eq!(check_residency(&plan, &dev, &fits), Ok(()));
        let none = Table {
            per_sm: BTreeMap::new(),
            clusters: 0,
        };
        let err = check_residency(&plan, &dev, &none).expect_err("no fit");
        assert!(err.reason.contains("2×1×1 blocks"), "{err}");
    }

    #[test]
    fn attributes_carry_the_kind() {
        assert!(attribute(LaunchKind::Plain).is_none());
        let a = attribute(LaunchKind::Cooperative).expect("coop");
        assert_eq!(
            a.id,
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        );
        // SAFETY: the cooperative member was the one written.
        assert_eq!(unsafe { a.value.cooperative }, 1);
        let mut a = attribute(LaunchKind::Cluster([2, 1, 1])).expect("cluster");
        // SAFETY: the clusterDim member was the one written.
        assert_eq!(unsafe { a.value.clusterDim.x }, 2);
        let l = checked(LaunchKind::Cluster([2, 1, 1]), [8, 1, 1], 128, 4096);
        let cfg = config(&l, std::ptr::null_mut(), Some(&mut a));
        assert_eq!(
            (
                cfg.gridDimX,
                cfg.blockDimX,
                cfg.sharedMemBytes,
                cfg.numAttrs
            ),
            (8, 128, 4096, 1)
        );
    }
}

//! Launch lists: checked in full before anything runs, then enqueued by trusted code.
//! Each launch has a [`LaunchKind`] (plain, cooperative, cluster; see [`kind`]).
//!
//! [`check_launches`] is pure: it takes the device's [`DeviceLimits`], each kernel's
//! [`KernelLimits`] and the name → buffer map, and either returns a [`CheckedLaunches`] (every
//! argument resolved to a device pointer or a typed scalar) or an [`InvalidLaunch`] naming
//! the launch and the reason. Checked: the kernel exists in the module; every buffer name
//! resolves; block dimensions within the device's and the kernel's limits (registers and
//! `__launch_bounds__` lower the latter); grid dimensions within the device's; static plus
//! dynamic shared memory within the device's opt-in maximum (dynamic shared memory above
//! the kernel's current limit, 48 KiB by default, is allowed by raising
//! `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` right before the launch); the launch
//! kind the device must support ([`kind::check_kind`]). [`Gpu::check_launches`] then
//! checks what needs the loaded kernels: a cooperative grid resident at once, a cluster
//! that fits ([`kind::check_residency`]).
//!
//! Argument types: a CUBIN carries no parameter types, so a `float*` passed where the
//! kernel takes an `int*` cannot be detected. What *can* be checked, where the driver
//! reports parameter sizes (`cuFuncGetParamInfo`, CUDA 12.4+), is the parameter count and
//! each parameter's size (8 bytes for a buffer pointer, 4 or 8 for a scalar). A kernel
//! reported with no parameters is treated as "unknown" rather than refusing the launch,
//! because the driver cannot tell that case apart from not knowing.

use std::collections::BTreeMap;
use std::ffi::c_void;

use cudarc::driver::result as dr;
use kiln_types::candidate::Scalar;
use kiln_types::{Arg, Dtype, Launch};
use thiserror::Error;

use crate::device::{Gpu, KernelInfo, Module};
use crate::error::GpuError;
use crate::facts::DeviceLimits;

pub mod kind;

pub use kind::LaunchKind;

/// Most parameters probed per kernel.
pub const MAX_KERNEL_PARAMS: usize = 256;

/// A launch list that cannot run, and which launch is at fault. Nothing was launched.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("launches[{index}] (kernel {kernel:?}): {reason}")]
pub struct InvalidLaunch {
    /// Index of the launch in the launch list.
    pub index: usize,
    /// The kernel it names.
    pub kernel: String,
    /// What is wrong, in words.
    pub reason: String,
}

/// What the validator needs to know about one kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelLimits {
    /// Largest block (threads) this kernel can be launched with.
    pub max_threads_per_block: u32,
    /// Static shared memory, bytes.
    pub static_shared_bytes: u32,
    /// Dynamic shared memory allowed without raising the attribute.
    pub max_dynamic_shared_bytes: u32,
    /// Parameter sizes in bytes, where the driver reports them.
    pub param_sizes: Option<Vec<usize>>,
    /// Null pointer parameters appended after the plan's arguments (see
    /// [`crate::artifact::KernelEntry`]).
    pub trailing_null_params: u32,
}

impl From<&KernelInfo> for KernelLimits {
    fn from(k: &KernelInfo) -> Self {
        KernelLimits {
            max_threads_per_block: k.max_threads_per_block,
            static_shared_bytes: k.static_shared_bytes,
            max_dynamic_shared_bytes: k.max_dynamic_shared_bytes,
            param_sizes: k.param_sizes.clone(),
            trailing_null_params: k.trailing_null_params,
        }
    }
}

/// A buffer a launch may name: its device address, element type and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferArg {
    /// Device address.
    pub ptr: u64,
    /// Element type.
    pub dtype: Dtype,
    /// Number of elements.
    pub elems: u64,
}

/// One resolved kernel argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgValue {
    /// A device pointer (a buffer's address).
    Ptr(u64),
    /// 32-bit signed integer.
    I32(i32),
    /// 64-bit signed integer.
    I64(i64),
    /// 32-bit unsigned integer.
    U32(u32),
    /// 64-bit unsigned integer.
    U64(u64),
    /// 32-bit float.
    F32(f32),
    /// 64-bit float.
    F64(f64),
}

impl ArgValue {
    /// Size of the value as a kernel parameter.
    pub fn size(&self) -> usize {
        match self {
            ArgValue::I32(_) | ArgValue::U32(_) | ArgValue::F32(_) => 4,
            _ => 8,
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            ArgValue::Ptr(_) => "a buffer pointer (8 bytes)",
            ArgValue::I32(_) => "an i32 (4 bytes)",
            ArgValue::I64(_) => "an i64 (8 bytes)",
            ArgValue::U32(_) => "a u32 (4 bytes)",
            ArgValue::U64(_) => "a u64 (8 bytes)",
            ArgValue::F32(_) => "an f32 (4 bytes)",
            ArgValue::F64(_) => "an f64 (8 bytes)",
        }
    }

    /// A pointer to the value, as `cuLaunchKernel`'s `kernelParams` wants it.
    fn as_param(&mut self) -> *mut c_void {
        match self {
            ArgValue::Ptr(v) | ArgValue::U64(v) => (v as *mut u64).cast(),
            ArgValue::I32(v) => (v as *mut i32).cast(),
            ArgValue::I64(v) => (v as *mut i64).cast(),
            ArgValue::U32(v) => (v as *mut u32).cast(),
            ArgValue::F32(v) => (v as *mut f32).cast(),
            ArgValue::F64(v) => (v as *mut f64).cast(),
        }
    }
}

impl From<Scalar> for ArgValue {
    fn from(s: Scalar) -> Self {
        match s {
            Scalar::I32(v) => ArgValue::I32(v),
            Scalar::I64(v) => ArgValue::I64(v),
            Scalar::U32(v) => ArgValue::U32(v),
            Scalar::U64(v) => ArgValue::U64(v),
            Scalar::F32(v) => ArgValue::F32(v),
            Scalar::F64(v) => ArgValue::F64(v),
        }
    }
}

/// One launch, checked and resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedLaunch {
    /// Kernel name.
    pub kernel: String,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes.
    pub shared_bytes: u32,
    /// Whether the kernel's dynamic shared memory attribute must be raised first.
    pub raise_dynamic_shared: bool,
    /// Arguments, in order (trailing null pointers included).
    pub args: Vec<ArgValue>,
    /// How the launch is issued.
    pub kind: LaunchKind,
}

impl CheckedLaunch {
    /// Threads per block.
    pub fn block_threads(&self) -> u32 {
        self.block.iter().product()
    }
}

/// A launch list every launch of which passed [`check_launches`].
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedLaunches {
    /// The launches, in order.
    pub launches: Vec<CheckedLaunch>,
}

/// Checks a launch list against the device's and kernels' limits and resolves its arguments.
pub fn check_launches(
    plan: &[Launch],
    device: &DeviceLimits,
    kernels: &BTreeMap<String, KernelLimits>,
    buffers: &BTreeMap<String, BufferArg>,
) -> Result<CheckedLaunches, InvalidLaunch> {
    if plan.is_empty() {
        return Err(InvalidLaunch {
            index: 0,
            kernel: String::new(),
            reason: "the plan has no launches".into(),
        });
    }
    let mut launches = Vec::with_capacity(plan.len());
    for (index, l) in plan.iter().enumerate() {
        let bad = |reason: String| InvalidLaunch {
            index,
            kernel: l.kernel.clone(),
            reason,
        };
        let Some(k) = kernels.get(&l.kernel) else {
            let known: Vec<&str> = kernels.keys().map(String::as_str).collect();
            return Err(bad(format!(
                "no kernel of that name in the module (kernels found: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        };
        if l.grid.contains(&0) || l.block.contains(&0) {
            return Err(bad("grid and block dimensions must be at least 1".into()));
        }
        for (axis, (&b, &max)) in ["x", "y", "z"]
            .iter()
            .zip(l.block.iter().zip(device.max_block_dim.iter()))
        {
            if b > max {
                return Err(bad(format!(
                    "block.{axis} = {b} exceeds the device's {max}"
                )));
            }
        }
        let threads: u64 = l.block.iter().map(|&d| u64::from(d)).product();
        if threads > u64::from(device.max_threads_per_block) {
            return Err(bad(format!(
                "block of {threads} threads exceeds the device's {} threads per block",
                device.max_threads_per_block
            )));
        }
        if threads > u64::from(k.max_threads_per_block) {
            return Err(bad(format!(
                "block of {threads} threads exceeds this kernel's limit of {} (registers or \
                 __launch_bounds__)",
                k.max_threads_per_block
            )));
        }
        for (axis, (&g, &max)) in ["x", "y", "z"]
            .iter()
            .zip(l.grid.iter().zip(device.max_grid_dim.iter()))
        {
            if g > max {
                return Err(bad(format!("grid.{axis} = {g} exceeds the device's {max}")));
            }
        }
        let total_shared = u64::from(k.static_shared_bytes) + u64::from(l.shared_bytes);
        if total_shared > u64::from(device.max_shared_per_block_optin) {
            return Err(bad(format!(
                "{} bytes of dynamic plus {} bytes of static shared memory exceed the device's \
                 {} bytes per block",
                l.shared_bytes, k.static_shared_bytes, device.max_shared_per_block_optin
            )));
        }
        let raise_dynamic_shared = l.shared_bytes > k.max_dynamic_shared_bytes;
        let launch_kind = LaunchKind::of(l);
        kind::check_kind(launch_kind, l.grid, device).map_err(&bad)?;
        let mut args = Vec::with_capacity(l.args.len());
        for (j, a) in l.args.iter().enumerate() {
            args.push(match a {
                Arg::Scalar(s) => ArgValue::from(*s),
                Arg::Buffer(name) => match buffers.get(name) {
                    Some(b) => ArgValue::Ptr(b.ptr),
                    None => {
                        let known: Vec<&str> = buffers.keys().map(String::as_str).collect();
                        return Err(bad(format!(
                            "args[{j}] names unknown buffer {name:?} (known: {})",
                            known.join(", ")
                        )));
                    }
                },
            });
        }
        let given = args.len();
        args.extend((0..k.trailing_null_params).map(|_| ArgValue::Ptr(0)));
        if let Some(params) = k.param_sizes.as_ref().filter(|p| !p.is_empty()) {
            if params.len() != args.len() {
                if k.trailing_null_params > 0 {
                    return Err(bad(format!(
                        "the kernel takes {} parameters ({} of them added by kiln); the \
                         launch passes {given}",
                        params.len(),
                        k.trailing_null_params
                    )));
                }
                return Err(bad(format!(
                    "the kernel takes {} parameters; the launch passes {}",
                    params.len(),
                    args.len()
                )));
            }
            for (j, (a, &size)) in args.iter().zip(params.iter()).enumerate() {
                if a.size() != size {
                    return Err(bad(format!(
                        "args[{j}] is {} but the kernel's parameter {j} is {size} bytes",
                        a.describe()
                    )));
                }
            }
        }
        launches.push(CheckedLaunch {
            kernel: l.kernel.clone(),
            grid: l.grid,
            block: l.block,
            shared_bytes: l.shared_bytes,
            raise_dynamic_shared,
            args,
            kind: launch_kind,
        });
    }
    Ok(CheckedLaunches { launches })
}

impl Gpu {
    /// [`check_launches`] against this GPU's limits and `module`'s kernels, then the
    /// residency of cooperative and cluster launches ([`kind::check_residency`]).
    pub fn check_launches(
        &self,
        module: &Module,
        plan: &[Launch],
        buffers: &BTreeMap<String, BufferArg>,
    ) -> Result<CheckedLaunches, InvalidLaunch> {
        let checked = check_launches(plan, self.limits(), &module.kernel_limits(), buffers)?;
        kind::check_residency(
            &checked,
            self.limits(),
            &ModuleResidency { gpu: self, module },
        )?;
        Ok(checked)
    }

    /// Enqueues every launch of a checked launch list on the stream (raising dynamic shared memory
    /// attributes first, before the first launch). Does not wait. The buffers the launch list was
    /// checked against must stay allocated until the work has finished.
    ///
    /// Errors: a launch the driver refuses for its shape (`CUDA_ERROR_INVALID_VALUE`,
    /// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`, e.g. too many registers for the block) is an
    /// [`InvalidLaunch`]; a sticky error (from an earlier kernel) is a fault.
    pub fn enqueue_launches(
        &self,
        module: &Module,
        plan: &CheckedLaunches,
    ) -> Result<(), GpuError> {
        if !module.belongs_to(self) {
            return Err(GpuError::Usage("the module belongs to another Gpu".into()));
        }
        self.shared.enter()?;
        let mut kernels = Vec::with_capacity(plan.launches.len());
        for (index, l) in plan.launches.iter().enumerate() {
            let k = module.get(&l.kernel).ok_or_else(|| InvalidLaunch {
                index,
                kernel: l.kernel.clone(),
                reason: "no kernel of that name in the module".into(),
            })?;
            if l.raise_dynamic_shared {
                module.ensure_dynamic_shared(k, l.shared_bytes)?;
            }
            kernels.push(k.func);
        }
        for (index, (l, func)) in plan.launches.iter().zip(kernels).enumerate() {
            let mut values = l.args.clone();
            let mut params: Vec<*mut c_void> = values.iter_mut().map(ArgValue::as_param).collect();
            // SAFETY: `func` belongs to `module`, loaded in this (current) context and alive for
            // the call; `params` holds one pointer per kernel parameter, each pointing into
            // `values`, which outlives the call (the driver copies the values when the launch is
            // enqueued); every pointer argument is a device address of a buffer resolved by
            // `check_launches` (or null where the kernel's ABI wants one); the launch goes on
            // our own stream.
            let rc = unsafe { kind::launch(func, l, self.shared.stream, &mut params) };
            let rc = match rc {
                cudarc::driver::sys::CUresult::CUDA_SUCCESS => Ok(()),
                other => Err(dr::DriverError(other)),
            };
            if let Err(e) = rc {
                use cudarc::driver::sys::CUresult::*;
                return Err(match e.0 {
                    CUDA_ERROR_INVALID_VALUE
                    | CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
                    | CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
                    | CUDA_ERROR_INVALID_CLUSTER_SIZE => GpuError::InvalidLaunch(InvalidLaunch {
                        index,
                        kernel: l.kernel.clone(),
                        reason: format!(
                            "the driver refused the launch: {}",
                            crate::error::error_name(e)
                        ),
                    }),
                    _ => self.shared.fail(
                        match l.kind {
                            LaunchKind::Plain => "cuLaunchKernel",
                            _ => "cuLaunchKernelEx",
                        },
                        e,
                        false,
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The driver's occupancy API over one loaded module, for [`kind::check_residency`].
struct ModuleResidency<'a> {
    gpu: &'a Gpu,
    module: &'a Module,
}

impl kind::Residency for ModuleResidency<'_> {
    fn blocks_per_sm(
        &self,
        kernel: &str,
        block_threads: u32,
        shared_bytes: u32,
    ) -> Result<u32, String> {
        self.module
            .occupancy(kernel, block_threads, shared_bytes)
            .map(|o| o.blocks_per_sm)
            .map_err(|e| e.to_string())
    }

    fn max_active_clusters(&self, launch: &CheckedLaunch) -> Result<u32, String> {
        let k = self
            .module
            .get(&launch.kernel)
            .ok_or_else(|| format!("no kernel {:?} in the module", launch.kernel))?;
        self.gpu.shared.enter().map_err(|e| e.to_string())?;
        if launch.raise_dynamic_shared {
            self.module
                .ensure_dynamic_shared(k, launch.shared_bytes)
                .map_err(|e| e.to_string())?;
        }
        let mut attr = kind::attribute(launch.kind);
        let cfg = kind::config(launch, self.gpu.shared.stream, attr.as_mut());
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `k.func` is a live function of the current context; `cfg` points at
        // `attr`, which outlives the call; `n` is a valid out-pointer.
        let rc = unsafe { cudarc::driver::sys::cuOccupancyMaxActiveClusters(&mut n, k.func, &cfg) };
        match rc {
            cudarc::driver::sys::CUresult::CUDA_SUCCESS => Ok(u32::try_from(n).unwrap_or(0)),
            // The driver refuses shapes no cluster of which can ever be resident.
            cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_CLUSTER_SIZE => Ok(0),
            other => Err(crate::error::error_name(dr::DriverError(other))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(json: &str) -> Launch {
        serde_json::from_str(json).expect("launch parses")
    }

    fn kernels() -> BTreeMap<String, KernelLimits> {
        let mut m = BTreeMap::new();
        m.insert(
            "add".to_string(),
            KernelLimits {
                max_threads_per_block: 1024,
                static_shared_bytes: 0,
                max_dynamic_shared_bytes: 48 * 1024,
                param_sizes: Some(vec![8, 8, 8, 4]),
                trailing_null_params: 0,
            },
        );
        m.insert(
            "heavy".to_string(),
            KernelLimits {
                max_threads_per_block: 256,
                static_shared_bytes: 16 * 1024,
                max_dynamic_shared_bytes: 32 * 1024,
                param_sizes: None,
                trailing_null_params: 0,
            },
        );
        m
    }

    fn buffers() -> BTreeMap<String, BufferArg> {
        let mut m = BTreeMap::new();
        for (i, name) in ["a", "b", "y"].iter().enumerate() {
            m.insert(
                name.to_string(),
                BufferArg {
                    ptr: 0x7000_0000 + (i as u64) * 0x1000,
                    dtype: Dtype::F32,
                    elems: 1024,
                },
            );
        }
        m
    }

    fn check(json: &str) -> Result<CheckedLaunches, InvalidLaunch> {
        check_launches(
            &[launch(json)],
            &DeviceLimits::sm90_example(),
            &kernels(),
            &buffers(),
        )
    }

    #[test]
    fn a_good_launch_resolves_buffers_to_pointers() {
        let plan = check(
            r#"{"kernel":"add","grid":[4,1,1],"block":[256,1,1],"args":["a","b","y",{"i32":1024}]}"#,
        )
        .expect("valid");
        let l = &plan.launches[0];
        assert_eq!(l.args[0], ArgValue::Ptr(0x7000_0000));
        assert_eq!(l.args[2], ArgValue::Ptr(0x7000_2000));
        assert_eq!(l.args[3], ArgValue::I32(1024));
        assert!(!l.raise_dynamic_shared);
        assert_eq!(l.block_threads(), 256);
    }

    fn reason(json: &str) -> String {
        check(json).expect_err("must be refused").to_string()
    }

    #[test]
    fn unknown_kernel_and_buffer_are_named() {
        let r = reason(r#"{"kernel":"nope","args":[]}"#);
        assert!(r.contains("no kernel") && r.contains("add, heavy"), "{r}");
        let r = reason(r#"{"kernel":"add","args":["a","zz","y",{"i32":1}]}"#);
        assert!(
            r.contains("unknown buffer \"zz\"") && r.contains("args[1]"),
            "{r}"
        );
    }

    #[test]
    fn block_and_grid_limits() {
        let r = reason(r#"{"kernel":"add","block":[2048,1,1],"args":["a","b","y",{"i32":1}]}"#);
        assert!(r.contains("block.x = 2048"), "{r}");
        let r = reason(r#"{"kernel":"add","block":[64,32,1],"args":["a","b","y",{"i32":1}]}"#);
        assert!(r.contains("2048 threads exceeds the device"), "{r}");
        let r = reason(r#"{"kernel":"add","block":[1,1,128],"args":["a","b","y",{"i32":1}]}"#);
        assert!(r.contains("block.z = 128"), "{r}");
        let r = reason(r#"{"kernel":"heavy","block":[512,1,1]}"#);
        assert!(r.contains("kernel's limit of 256"), "{r}");
        let r = reason(r#"{"kernel":"add","grid":[1,70000,1],"args":["a","b","y",{"i32":1}]}"#);
        assert!(r.contains("grid.y = 70000"), "{r}");
        let r = reason(r#"{"kernel":"add","grid":[0,1,1],"args":["a","b","y",{"i32":1}]}"#);
        assert!(r.contains("at least 1"), "{r}");
    }

    #[test]
    fn shared_memory_limits_and_opt_in() {
        // 200 KiB dynamic + 16 KiB static fits the 227 KiB opt-in: allowed, attribute raised.
        let plan = check(r#"{"kernel":"heavy","shared_bytes":204800}"#).expect("fits opt-in");
        assert!(plan.launches[0].raise_dynamic_shared);
        // Within the kernel's current limit: no attribute change.
        let plan = check(r#"{"kernel":"heavy","shared_bytes":1024}"#).expect("small");
        assert!(!plan.launches[0].raise_dynamic_shared);
        // 220 KiB + 16 KiB static exceeds 227 KiB.
        let r = reason(r#"{"kernel":"heavy","shared_bytes":225280}"#);
        assert!(r.contains("exceed the device's 232448 bytes"), "{r}");
    }

    #[test]
    fn parameter_count_and_sizes_are_checked_where_known() {
        let r = reason(r#"{"kernel":"add","args":["a","b","y"]}"#);
        assert!(r.contains("takes 4 parameters; the launch passes 3"), "{r}");
        let r = reason(r#"{"kernel":"add","args":["a","b","y",{"i64":1}]}"#);
        assert!(
            r.contains("args[3] is an i64 (8 bytes)") && r.contains("4 bytes"),
            "{r}"
        );
        let r = reason(r#"{"kernel":"add","args":[{"f32":1.0},"b","y",{"i32":1}]}"#);
        assert!(r.contains("args[0] is an f32"), "{r}");
        // Unknown parameter info: any arguments pass this check.
        check(r#"{"kernel":"heavy","args":["a",{"f64":2.0}]}"#).expect("unchecked");
    }

    #[test]
    fn launch_kinds_are_checked_and_carried() {
        let plan =
            check(r#"{"kernel":"heavy","grid":[8,1,1],"cluster":[2,1,1]}"#).expect("cluster");
        assert_eq!(plan.launches[0].kind, LaunchKind::Cluster([2, 1, 1]));
        let plan = check(r#"{"kernel":"heavy","cooperative":true}"#).expect("coop");
        assert_eq!(plan.launches[0].kind, LaunchKind::Cooperative);
        let r = reason(r#"{"kernel":"heavy","grid":[3,1,1],"cluster":[2,1,1]}"#);
        assert!(r.contains("grid.x = 3"), "{r}");
    }

    #[test]
    fn trailing_null_params_are_appended_and_counted() {
        let mut ks = kernels();
        ks.insert(
            "tri".to_string(),
            KernelLimits {
                max_threads_per_block: 1024,
                static_shared_bytes: 0,
                max_dynamic_shared_bytes: 48 * 1024,
                param_sizes: Some(vec![8, 4, 8, 8]),
                trailing_null_params: 2,
            },
        );
        let run = |json: &str| {
            check_launches(
                &[launch(json)],
                &DeviceLimits::sm90_example(),
                &ks,
                &buffers(),
            )
        };
        let plan = run(r#"{"kernel":"tri","args":["a",{"i32":4}]}"#).expect("two plus two");
        assert_eq!(
            plan.launches[0].args,
            vec![
                ArgValue::Ptr(0x7000_0000),
                ArgValue::I32(4),
                ArgValue::Ptr(0),
                ArgValue::Ptr(0)
            ]
        );
        let r = run(r#"{"kernel":"tri","args":["a"]}"#)
            .expect_err("short")
            .to_string();
        assert!(
            r.contains("2 of them added by kiln") && r.contains("passes 1"),
            "{r}"
        );
    }

    #[test]
    fn empty_plan_is_refused() {
        let err = check_launches(&[], &DeviceLimits::sm90_example(), &kernels(), &buffers())
            .expect_err("empty");
        assert!(err.reason.contains("no launches"));
    }

    #[test]
    fn arg_values_point_at_their_payload() {
        let mut v = ArgValue::I32(-7);
        let p = v.as_param();
        // SAFETY: `p` points at the i32 inside `v`, which is alive and not otherwise borrowed.
        assert_eq!(unsafe { *(p as *const i32) }, -7);
        let mut v = ArgValue::Ptr(0xdead_beef);
        let p = v.as_param();
        // SAFETY: as above, for the u64 payload.
        assert_eq!(unsafe { *(p as *const u64) }, 0xdead_beef);
    }
}

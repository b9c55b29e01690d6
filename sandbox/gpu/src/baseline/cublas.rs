//! cuBLAS GEMM on the worker's stream: row-major `C = A B` in strict fp32, TF32, or fp16
//! with fp32 accumulation.
//!
//! Row-major `C[M,N] = A[M,K] B[K,N]` is column-major `Cᵀ = Bᵀ Aᵀ`, so the call passes B
//! first with `m = N, n = M` and no transposes. The handle gets its own 32 MiB workspace
//! (NVIDIA's recommendation for Hopper), so cuBLAS never allocates inside a timed sample.

use cudarc::cublas::sys::{
    self as cb, cublasComputeType_t, cublasHandle_t, cublasMath_t, cublasOperation_t,
    cublasStatus_t, cudaDataType_t,
};

use crate::baseline::libs::cublas_available;
use crate::device::{DeviceBuffer, Gpu};
use crate::error::GpuError;

/// Workspace handed to cuBLAS.
const WORKSPACE_BYTES: usize = 32 << 20;

/// How a GEMM computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmMath {
    /// f32 data, strict fp32 arithmetic (`CUBLAS_DEFAULT_MATH`, no tensor cores).
    Fp32,
    /// f32 data through TF32 tensor cores (`CUBLAS_TF32_TENSOR_OP_MATH`).
    Tf32,
    /// f16 data and result, fp32 accumulation (`cublasGemmEx`, `CUBLAS_COMPUTE_32F`).
    Fp16,
}

/// A cuBLAS handle bound to one [`Gpu`]'s stream.
pub struct Cublas {
    handle: cublasHandle_t,
    version: i32,
    _workspace: DeviceBuffer,
    shared: std::sync::Arc<crate::device::GpuShared>,
}

fn check(call: &'static str, status: cublasStatus_t) -> Result<(), GpuError> {
    if status == cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Driver {
            call,
            name: format!("{status:?}"),
        })
    }
}

impl Cublas {
    /// Creates a handle on `gpu`'s stream with its own workspace. A missing library is
    /// [`GpuError::Unavailable`], never a panic.
    pub fn new(gpu: &Gpu) -> Result<Cublas, GpuError> {
        cublas_available()?;
        gpu.bind()?;
        let workspace = gpu.alloc(WORKSPACE_BYTES)?;
        let mut handle: cublasHandle_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current (bind).
        check("cublasCreate_v2", unsafe {
            cb::cublasCreate_v2(&mut handle)
        })?;
        let mut me = Cublas {
            handle,
            version: 0,
            _workspace: workspace,
            shared: std::sync::Arc::clone(&gpu.shared),
        };
        // SAFETY: the handle is live; the stream belongs to the current context and outlives
        // the handle (the Gpu outlives every Cublas made from it by the caller's scoping;
        // Drop skips the library when the context is poisoned).
        check("cublasSetStream_v2", unsafe {
            cb::cublasSetStream_v2(me.handle, gpu.raw_stream().cast())
        })?;
        // SAFETY: the workspace is a live device allocation of this context, owned by `me`.
        check("cublasSetWorkspace_v2", unsafe {
            cb::cublasSetWorkspace_v2(me.handle, me._workspace.ptr() as *mut _, WORKSPACE_BYTES)
        })?;
        // SAFETY: live handle, valid out-pointer.
        check("cublasGetVersion_v2", unsafe {
            cb::cublasGetVersion_v2(me.handle, &mut me.version)
        })?;
        Ok(me)
    }

    /// `cublasGetVersion`: e.g. 130100 for 13.1.0.
    pub fn version(&self) -> i32 {
        self.version
    }

    /// Enqueues row-major `C[M,N] = A[M,K] B[K,N]` on the stream. The pointers must be
    /// device buffers of `gpu` holding at least those many elements of the math's dtype
    /// (f32 for [`GemmMath::Fp32`]/[`GemmMath::Tf32`], f16 for [`GemmMath::Fp16`]).
    pub fn gemm(
        &self,
        gpu: &Gpu,
        math: GemmMath,
        (m, n, k): (i32, i32, i32),
        a: &DeviceBuffer,
        b: &DeviceBuffer,
        c: &DeviceBuffer,
    ) -> Result<(), GpuError> {
        let elem = if math == GemmMath::Fp16 { 2 } else { 4 };
        let need = |rows: i32, cols: i32| (rows as usize) * (cols as usize) * elem;
        gpu.check_range(a, 0, need(m, k))?;
        gpu.check_range(b, 0, need(k, n))?;
        gpu.check_range(c, 0, need(m, n))?;
        gpu.bind()?;
        let mode = match math {
            GemmMath::Tf32 => cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
            GemmMath::Fp32 | GemmMath::Fp16 => cublasMath_t::CUBLAS_DEFAULT_MATH,
        };
        // SAFETY: live handle.
        check("cublasSetMathMode", unsafe {
            cb::cublasSetMathMode(self.handle, mode)
        })?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let op = cublasOperation_t::CUBLAS_OP_N;
        match math {
            // SAFETY: the three ranges were checked against live buffers of this context
            // above; alpha/beta are host scalars (the default pointer mode) read during the
            // call; the work is ordered on the Gpu's stream.
            GemmMath::Fp32 | GemmMath::Tf32 => check("cublasSgemm_v2", unsafe {
                cb::cublasSgemm_v2(
                    self.handle,
                    op,
                    op,
                    n,
                    m,
                    k,
                    &alpha,
                    b.ptr() as *const f32,
                    n,
                    a.ptr() as *const f32,
                    k,
                    &beta,
                    c.ptr() as *mut f32,
                    n,
                )
            }),
            // SAFETY: as above, with f16 elements.
            GemmMath::Fp16 => check("cublasGemmEx", unsafe {
                cb::cublasGemmEx(
                    self.handle,
                    op,
                    op,
                    n,
                    m,
                    k,
                    (&alpha as *const f32).cast(),
                    b.ptr() as *const _,
                    cudaDataType_t::CUDA_R_16F,
                    n,
                    a.ptr() as *const _,
                    cudaDataType_t::CUDA_R_16F,
                    k,
                    (&beta as *const f32).cast(),
                    c.ptr() as *mut _,
                    cudaDataType_t::CUDA_R_16F,
                    n,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }),
        }
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        if self.shared.poisoned().is_some()
            || self.handle.is_null()
            || self.shared.ctx.bind_to_thread().is_err()
        {
            return; // leaked on purpose, as every device object of a poisoned context
        }
        // SAFETY: the handle was created by `new` and is destroyed only here.
        let _ = unsafe { cb::cublasDestroy_v2(self.handle) };
    }
}

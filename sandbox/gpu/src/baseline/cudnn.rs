//! cuDNN convolution forward on the worker's stream, optionally followed by bias, ReLU and
//! max pooling, with the forward algorithm chosen by the caller.
//!
//! [`ConvOp::new`] builds the descriptors (NCHW f32, cross-correlation as torch's
//! `Conv2d`); [`ALGORITHMS`] lists every forward algorithm cuDNN offers, and
//! [`ConvOp::workspace_bytes`] says whether one is supported for this shape and math.
//! [`ConvOp::use_algorithm`] allocates its workspace; [`ConvOp::enqueue`] issues
//! `cudnnConvolutionForward`, `cudnnAddTensor` (bias), `cudnnActivationForward` (ReLU, in
//! place) and `cudnnPoolingForward` (max) on the stream, through an intermediate buffer
//! when pooling follows.
//!
//! Strict fp32 is `CUDNN_FMA_MATH` (FMA kernels only); the TF32 variant is
//! `CUDNN_DEFAULT_MATH`, which permits TF32 tensor cores on Ampere and newer (torch's
//! `cudnn.allow_tf32 = True` does the same).

use std::ffi::c_int;
use std::sync::Arc;

use cudarc::cudnn::sys::{
    self as dn, cudnnActivationDescriptor_t, cudnnConvolutionDescriptor_t, cudnnDataType_t,
    cudnnFilterDescriptor_t, cudnnHandle_t, cudnnMathType_t, cudnnPoolingDescriptor_t,
    cudnnStatus_t, cudnnTensorDescriptor_t, cudnnTensorFormat_t,
};

/// A forward algorithm (cudarc's binding of `cudnnConvolutionFwdAlgo_t`).
pub use cudarc::cudnn::sys::cudnnConvolutionFwdAlgo_t as Algo;

use crate::baseline::libs::cudnn_available;
use crate::device::{DeviceBuffer, Gpu, GpuShared};
use crate::error::GpuError;

/// Every forward algorithm of the legacy convolution API.
pub const ALGORITHMS: [Algo; 8] = [
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
];

/// A short name for an algorithm (`implicit_precomp_gemm`).
pub fn algorithm_name(a: Algo) -> String {
    format!("{a:?}")
        .trim_start_matches("CUDNN_CONVOLUTION_FWD_ALGO_")
        .to_lowercase()
}

/// Whether the convolution may use TF32 tensor cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvMath {
    /// `CUDNN_FMA_MATH`: strict fp32.
    Fp32,
    /// `CUDNN_DEFAULT_MATH`: TF32 permitted.
    Tf32,
}

/// The convolution's shape (NCHW input, KCRS filters, square stride and padding) and what
/// follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    /// Batch, channels, height, width of the input.
    pub nchw: [i32; 4],
    /// Filters: out channels, in channels, height, width.
    pub kcrs: [i32; 4],
    /// Stride.
    pub stride: i32,
    /// Zero padding.
    pub padding: i32,
    /// Add a bias of `[K]`.
    pub bias: bool,
    /// ReLU after the bias.
    pub relu: bool,
    /// Max pooling (window, stride) after the ReLU.
    pub maxpool: Option<(i32, i32)>,
}

fn check(call: &'static str, status: cudnnStatus_t) -> Result<(), GpuError> {
    if status == cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Driver {
            call,
            name: format!("{status:?}"),
        })
    }
}

/// A cuDNN handle bound to one [`Gpu`]'s stream.
pub struct Cudnn {
    handle: cudnnHandle_t,
    version: usize,
    shared: Arc<GpuShared>,
}

impl Cudnn {
    /// Creates a handle on `gpu`'s stream. A missing library is
    /// [`GpuError::Unavailable`], never a panic.
    pub fn new(gpu: &Gpu) -> Result<Cudnn, GpuError> {
        cudnn_available()?;
        gpu.bind()?;
        let mut handle: cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current.
        check("cudnnCreate", unsafe { dn::cudnnCreate(&mut handle) })?;
        let me = Cudnn {
            handle,
            // SAFETY: a plain query without arguments.
            version: unsafe { dn::cudnnGetVersion() },
            shared: Arc::clone(&gpu.shared),
        };
        // SAFETY: live handle; the stream belongs to the current context and outlives it.
        check("cudnnSetStream", unsafe {
            dn::cudnnSetStream(me.handle, gpu.raw_stream().cast())
        })?;
        Ok(me)
    }

    /// `cudnnGetVersion`: e.g. 91000 for 9.10.0.
    pub fn version(&self) -> usize {
        self.version
    }
}

impl Drop for Cudnn {
    fn drop(&mut self) {
        if self.shared.poisoned().is_some() || self.shared.ctx.bind_to_thread().is_err() {
            return; // leaked on purpose, as every device object of a poisoned context
        }
        // SAFETY: created by `new`, destroyed only here.
        let _ = unsafe { dn::cudnnDestroy(self.handle) };
    }
}

/// Descriptors, intermediate buffer and workspace of one convolution (+ epilogue).
pub struct ConvOp {
    shape: ConvShape,
    x: cudnnTensorDescriptor_t,
    w: cudnnFilterDescriptor_t,
    conv: cudnnConvolutionDescriptor_t,
    y: cudnnTensorDescriptor_t,
    bias: cudnnTensorDescriptor_t,
    act: cudnnActivationDescriptor_t,
    pool: cudnnPoolingDescriptor_t,
    pooled: cudnnTensorDescriptor_t,
    /// Convolution output `[N, K, P, Q]`.
    pub conv_out: [i32; 4],
    /// Final output (pooled, or the convolution's).
    pub out: [i32; 4],
    tmp: Option<DeviceBuffer>,
    algo: Option<(Algo, Option<DeviceBuffer>, usize)>,
    shared: Arc<GpuShared>,
}

fn tensor4d(d: cudnnTensorDescriptor_t, dims: [i32; 4]) -> Result<(), GpuError> {
    // SAFETY: `d` is a live descriptor created by the caller.
    check("cudnnSetTensor4dDescriptor", unsafe {
        dn::cudnnSetTensor4dDescriptor(
            d,
            cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            cudnnDataType_t::CUDNN_DATA_FLOAT,
            dims[0],
            dims[1],
            dims[2],
            dims[3],
        )
    })
}

impl ConvOp {
    /// Builds the descriptors for `shape` with `math`; allocates the intermediate buffer
    /// when pooling follows.
    pub fn new(
        dnn: &Cudnn,
        gpu: &Gpu,
        shape: ConvShape,
        math: ConvMath,
    ) -> Result<ConvOp, GpuError> {
        gpu.bind()?;
        let mut op = ConvOp {
            shape,
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            bias: std::ptr::null_mut(),
            act: std::ptr::null_mut(),
            pool: std::ptr::null_mut(),
            pooled: std::ptr::null_mut(),
            conv_out: [0; 4],
            out: [0; 4],
            tmp: None,
            algo: None,
            shared: Arc::clone(&dnn.shared),
        };
        // SAFETY: each create call gets a valid out-pointer to a field of `op`,
        // whose Drop destroys whatever was created; the set calls take those live
        // descriptors and plain integers.
        unsafe {
            check(
                "cudnnCreateTensorDescriptor",
                dn::cudnnCreateTensorDescriptor(&mut op.x),
            )?;
            check(
                "cudnnCreateFilterDescriptor",
                dn::cudnnCreateFilterDescriptor(&mut op.w),
            )?;
            check(
                "cudnnCreateConvolutionDescriptor",
                dn::cudnnCreateConvolutionDescriptor(&mut op.conv),
            )?;
            check(
                "cudnnCreateTensorDescriptor",
                dn::cudnnCreateTensorDescriptor(&mut op.y),
            )?;
            tensor4d(op.x, shape.nchw)?;
            let [k, c, r, s] = shape.kcrs;
            check(
                "cudnnSetFilter4dDescriptor",
                dn::cudnnSetFilter4dDescriptor(
                    op.w,
                    cudnnDataType_t::CUDNN_DATA_FLOAT,
                    cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                    k,
                    c,
                    r,
                    s,
                ),
            )?;
            check(
                "cudnnSetConvolution2dDescriptor",
                dn::cudnnSetConvolution2dDescriptor(
                    op.conv,
                    shape.padding,
                    shape.padding,
                    shape.stride,
                    shape.stride,
                    1,
                    1,
                    dn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    cudnnDataType_t::CUDNN_DATA_FLOAT,
                ),
            )?;
            let mt = match math {
                ConvMath::Fp32 => cudnnMathType_t::CUDNN_FMA_MATH,
                ConvMath::Tf32 => cudnnMathType_t::CUDNN_DEFAULT_MATH,
            };
            check(
                "cudnnSetConvolutionMathType",
                dn::cudnnSetConvolutionMathType(op.conv, mt),
            )?;
            let [mut n, mut kk, mut p, mut q]: [c_int; 4] = [0; 4];
            check(
                "cudnnGetConvolution2dForwardOutputDim",
                dn::cudnnGetConvolution2dForwardOutputDim(
                    op.conv, op.x, op.w, &mut n, &mut kk, &mut p, &mut q,
                ),
            )?;
            op.conv_out = [n, kk, p, q];
            op.out = op.conv_out;
            tensor4d(op.y, op.conv_out)?;
            if shape.bias {
                check(
                    "cudnnCreateTensorDescriptor",
                    dn::cudnnCreateTensorDescriptor(&mut op.bias),
                )?;
                tensor4d(op.bias, [1, k, 1, 1])?;
            }
            if shape.relu {
                check(
                    "cudnnCreateActivationDescriptor",
                    dn::cudnnCreateActivationDescriptor(&mut op.act),
                )?;
                check(
                    "cudnnSetActivationDescriptor",
                    dn::cudnnSetActivationDescriptor(
                        op.act,
                        dn::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
                        dn::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                        0.0,
                    ),
                )?;
            }
            if let Some((win, stride)) = shape.maxpool {
                check(
                    "cudnnCreatePoolingDescriptor",
                    dn::cudnnCreatePoolingDescriptor(&mut op.pool),
                )?;
                check(
                    "cudnnSetPooling2dDescriptor",
                    dn::cudnnSetPooling2dDescriptor(
                        op.pool,
                        dn::cudnnPoolingMode_t::CUDNN_POOLING_MAX,
                        dn::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                        win,
                        win,
                        0,
                        0,
                        stride,
                        stride,
                    ),
                )?;
                let side = |v: i32| (v - win) / stride + 1;
                op.out = [n, kk, side(p), side(q)];
                check(
                    "cudnnCreateTensorDescriptor",
                    dn::cudnnCreateTensorDescriptor(&mut op.pooled),
                )?;
                tensor4d(op.pooled, op.out)?;
            }
        }
        if shape.maxpool.is_some() {
            let elems: usize = op.conv_out.iter().map(|&d| d.max(0) as usize).product();
            op.tmp = Some(gpu.alloc(elems * 4)?);
        }
        Ok(op)
    }

    /// Workspace `algo` needs for this convolution, or the status saying it is not
    /// supported here.
    pub fn workspace_bytes(&self, dnn: &Cudnn, algo: Algo) -> Result<usize, GpuError> {
        let mut bytes = 0usize;
        // SAFETY: live handle and descriptors; valid out-pointer.
        check("cudnnGetConvolutionForwardWorkspaceSize", unsafe {
            dn::cudnnGetConvolutionForwardWorkspaceSize(
                dnn.handle, self.x, self.w, self.conv, self.y, algo, &mut bytes,
            )
        })?;
        Ok(bytes)
    }

    /// Picks `algo` and allocates its workspace.
    pub fn use_algorithm(&mut self, dnn: &Cudnn, gpu: &Gpu, algo: Algo) -> Result<(), GpuError> {
        let bytes = self.workspace_bytes(dnn, algo)?;
        self.algo = None; // free the previous workspace first
        let ws = if bytes > 0 {
            Some(gpu.alloc(bytes)?)
        } else {
            None
        };
        self.algo = Some((algo, ws, bytes));
        Ok(())
    }

    /// Enqueues the convolution and its epilogue: `x`, `w`, `bias` in, `y` out (all f32
    /// device buffers of `gpu`, sized for the shape).
    pub fn enqueue(
        &self,
        dnn: &Cudnn,
        gpu: &Gpu,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        bias: Option<&DeviceBuffer>,
        y: &DeviceBuffer,
    ) -> Result<(), GpuError> {
        let Some((algo, ws, ws_bytes)) = &self.algo else {
            return Err(GpuError::Usage("no convolution algorithm chosen".into()));
        };
        let n = |d: [i32; 4]| d.iter().map(|&v| v.max(0) as usize).product::<usize>() * 4;
        gpu.check_range(x, 0, n(self.shape.nchw))?;
        gpu.check_range(w, 0, n(self.shape.kcrs))?;
        gpu.check_range(y, 0, n(self.out))?;
        if self.shape.bias {
            let b = bias.ok_or_else(|| GpuError::Usage("the convolution needs a bias".into()))?;
            gpu.check_range(b, 0, self.shape.kcrs[0] as usize * 4)?;
        }
        gpu.bind()?;
        let conv_dst = self.tmp.as_ref().unwrap_or(y).ptr() as *mut std::ffi::c_void;
        let (one, zero) = (1.0f32, 0.0f32);
        let one_p = (&one as *const f32).cast::<std::ffi::c_void>();
        let zero_p = (&zero as *const f32).cast::<std::ffi::c_void>();
        let ws_ptr = ws
            .as_ref()
            .map_or(std::ptr::null_mut(), |b| b.ptr() as *mut std::ffi::c_void);
        // SAFETY: the buffers were checked against the shape above and belong
        // to this context; descriptors and handle are live; scalars are host f32 read
        // during each call; all work is ordered on the Gpu's stream.
        unsafe {
            check(
                "cudnnConvolutionForward",
                dn::cudnnConvolutionForward(
                    dnn.handle,
                    one_p,
                    self.x,
                    x.ptr() as *const _,
                    self.w,
                    w.ptr() as *const _,
                    self.conv,
                    *algo,
                    ws_ptr,
                    *ws_bytes,
                    zero_p,
                    self.y,
                    conv_dst,
                ),
            )?;
            if let Some(b) = bias.filter(|_| self.shape.bias) {
                check(
                    "cudnnAddTensor",
                    dn::cudnnAddTensor(
                        dnn.handle,
                        one_p,
                        self.bias,
                        b.ptr() as *const _,
                        one_p,
                        self.y,
                        conv_dst,
                    ),
                )?;
            }
            if self.shape.relu {
                check(
                    "cudnnActivationForward",
                    dn::cudnnActivationForward(
                        dnn.handle, self.act, one_p, self.y, conv_dst, zero_p, self.y, conv_dst,
                    ),
                )?;
            }
            if self.shape.maxpool.is_some() {
                check(
                    "cudnnPoolingForward",
                    dn::cudnnPoolingForward(
                        dnn.handle,
                        self.pool,
                        one_p,
                        self.y,
                        conv_dst,
                        zero_p,
                        self.pooled,
                        y.ptr() as *mut _,
                    ),
                )?;
            }
        }
        Ok(())
    }
}

impl Drop for ConvOp {
    fn drop(&mut self) {
        if self.shared.poisoned().is_some() || self.shared.ctx.bind_to_thread().is_err() {
            return; // leaked on purpose
        }
        // SAFETY: each descriptor was created by `new` (or is null, which is skipped) and is
        // destroyed only here.
        unsafe {
            for d in [self.x, self.y, self.bias, self.pooled] {
                if !d.is_null() {
                    dn::cudnnDestroyTensorDescriptor(d);
                }
            }
            if !self.w.is_null() {
                dn::cudnnDestroyFilterDescriptor(self.w);
            }
            if !self.conv.is_null() {
                dn::cudnnDestroyConvolutionDescriptor(self.conv);
            }
            if !self.act.is_null() {
                dn::cudnnDestroyActivationDescriptor(self.act);
            }
            if !self.pool.is_null() {
                dn::cudnnDestroyPoolingDescriptor(self.pool);
            }
        }
    }
}

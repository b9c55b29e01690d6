//! Library baselines on the worker's GPU: cuBLAS GEMM and cuDNN convolution, enqueued on
//! the [`Gpu`](crate::Gpu)'s own stream and timed with the same protocol as candidates.
//!
//! - [`libs`]: is libcublas / libcudnn loadable here? Checked before any call, because
//!   cudarc *panics* when a library (or one of its symbols) is missing; the answer is a
//!   typed [`Unavailable`](crate::Unavailable) naming the library.
//! - [`cublas`]: a handle bound to the worker's stream with its own workspace; row-major
//!   `C = A B` in strict fp32, TF32, or fp16 with fp32 accumulation.
//! - [`cudnn`]: a handle bound to the worker's stream; a convolution (+ bias, ReLU, max
//!   pooling) plan whose forward algorithm the caller picks after timing each one.
//! - [`timing`]: what library calls need of the Gpu (its stream, a bound context, an
//!   untimed run of a closure); their timed samples are
//!   [`Gpu::time_sample_with`](crate::Gpu::time_sample_with): the L2 flush, the blocking
//!   kernel, events (and kernel records) around the calls, a deadline-bounded wait and a
//!   context synchronize, exactly as [`Gpu::time_sample`](crate::Gpu::time_sample) does
//!   for a launch list.
//!
//! Every library error becomes [`GpuError::Driver`](crate::GpuError::Driver) with the
//! library call and its status name; work that fails on the GPU is found by the wait with a
//! deadline, which poisons the context as for a candidate.

pub mod cublas;
pub mod cudnn;
pub mod libs;
pub mod timing;

pub use libs::{LibraryStatus, cublas_available, cudnn_available, library_report};

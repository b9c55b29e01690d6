//! Output checks on the GPU: error metrics against a reference, unwritten (still
//! poisoned) elements, and run-to-run differences, computed where the data already is.
//!
//! Downloading a 1 GiB output and comparing it on one CPU core takes seconds; the same
//! pass on the GPU takes about a millisecond. [`Gpu::compare`] runs one trusted kernel
//! (`kiln_compare`) over an output and returns a [`Comparison`]:
//!
//! - elements equal to the dtype's poison pattern (`unwritten`, and the smallest such index);
//! - with a reference (`want`): elements outside `atol + rtol·|want|` (NaN must meet NaN,
//!   an infinity the same infinity), those where a non-finite value is involved, the
//!   largest absolute and relative errors, and Σ(got − want)² and Σwant² over the finite
//!   pairs (for the relative L2 error), plus the smallest mismatching index;
//! - with another run (`other`): elements whose bits differ, and those of them that are
//!   also outside the tolerance of each other.
//!
//! These are exactly the rules of the host backend's `compare` module (the tolerance rule
//! itself is kiln_types' `Tolerance`, in both), so a verdict does not depend on where it
//! was computed. Sums of squares are accumulated in f64 per thread,
//! reduced per block in shared memory and across blocks with atomics, so their last bits
//! may differ from run to run; counts and maxima are exact. [`Gpu::window`] downloads a
//! few elements around an index so the caller can list the first mismatches by value.

use kiln_types::{Dtype, Tolerance};

use crate::device::{DeviceBuffer, Gpu};
use crate::error::GpuError;
use crate::inputs::{dtype_code, poison_pattern};
use crate::launch::{ArgValue, CheckedLaunch, CheckedLaunches};

/// The comparison kernels' names, all in [`compare_source`].
pub const COMPARE_KERNELS: &[&str] = &["kiln_compare"];

/// Slots of the result array the kernel accumulates into.
const SLOTS: usize = 11;
const NONE: u64 = u64::MAX;

/// CUDA source of the comparison kernel: [`COMPARE_VALUES`], the tolerance rule
/// ([`Tolerance::CUDA_RULE`], kiln_types' one statement of it) and [`COMPARE_KERNEL`]. No
/// headers.
pub fn compare_source() -> String {
    [COMPARE_VALUES, Tolerance::CUDA_RULE, COMPARE_KERNEL].concat()
}

/// The comparison kernel's reading of elements by dtype.
const COMPARE_VALUES: &str = r#"
typedef unsigned long long u64;

// dtype: 0 f32, 1 f64, 2 f16, 3 bf16, 4 i32, 5 i64, 6 u8 (as kiln_fill)
__device__ __forceinline__ u64 kiln_bits(const void* p, u64 i, int dt) {
    switch (dt) {
    case 0: case 4: return (u64)((const unsigned int*)p)[i];
    case 1: case 5: return ((const u64*)p)[i];
    case 2: case 3: return (u64)((const unsigned short*)p)[i];
    default: return (u64)((const unsigned char*)p)[i];
    }
}
__device__ __forceinline__ double kiln_value(u64 b, int dt) {
    switch (dt) {
    case 0: return (double)__uint_as_float((unsigned int)b);
    case 1: return __longlong_as_double((long long)b);
    case 2: {
        float f;
        unsigned short h = (unsigned short)b;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return (double)f;
    }
    case 3: return (double)__uint_as_float(((unsigned int)b) << 16);
    case 4: return (double)(int)(unsigned int)b;
    case 5: return (double)(long long)b;
    default: return (double)(unsigned char)b;
    }
}
"#;

/// The comparison kernel itself (uses `kiln_close`, the tolerance rule).
const COMPARE_KERNEL: &str = r#"
// out[0] mismatches, [1] non-finite mismatches, [2] first mismatch (min index),
// [3] unwritten, [4] first unwritten, [5] bitwise diffs vs other, [6] of those outside
// tolerance, [7] sum (g-w)^2 (double bits), [8] sum w^2 (double bits), [9] max abs
// (double bits), [10] max rel (double bits). [2] and [4] start at ~0, the rest at 0.
// want and other may be 0 (not compared). 256 threads per block.
extern "C" __global__ void kiln_compare(const void* got, const void* want, const void* other,
                                        u64 n, int dt, double atol, double rtol, u64 poison,
                                        u64* out) {
    __shared__ u64 s_cnt[7];
    __shared__ double s_sum[2];
    __shared__ u64 s_max[2];
    if (threadIdx.x < 7) s_cnt[threadIdx.x] = (threadIdx.x == 2 || threadIdx.x == 4) ? ~0ull : 0ull;
    if (threadIdx.x < 2) { s_sum[threadIdx.x] = 0.0; s_max[threadIdx.x] = 0ull; }
    __syncthreads();
    u64 mism = 0, nonfin = 0, first_m = ~0ull, unwr = 0, first_u = ~0ull, diffs = 0, disagree = 0;
    double d2 = 0.0, w2 = 0.0, max_abs = 0.0, max_rel = 0.0;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        u64 gb = kiln_bits(got, i, dt);
        if (gb == poison) {
            unwr++;
            if (i < first_u) first_u = i;
        }
        double g = kiln_value(gb, dt);
        if (want) {
            double w = kiln_value(kiln_bits(want, i, dt), dt);
            bool ok = kiln_close(g, w, atol, rtol);
            if (!ok) {
                mism++;
                if (i < first_m) first_m = i;
            }
            bool finite = !(kiln_isnan(g) || kiln_isinf(g) || kiln_isnan(w) || kiln_isinf(w));
            if (!finite) {
                if (!ok) nonfin++;
            } else {
                double d = fabs(g - w);
                if (d > max_abs) max_abs = d;
                if (w != 0.0 && d / fabs(w) > max_rel) max_rel = d / fabs(w);
                d2 += d * d;
                w2 += w * w;
            }
        }
        if (other) {
            u64 ob = kiln_bits(other, i, dt);
            if (ob != gb) {
                diffs++;
                if (!kiln_close(g, kiln_value(ob, dt), atol, rtol)) disagree++;
            }
        }
    }
    if (mism) atomicAdd(&s_cnt[0], mism);
    if (nonfin) atomicAdd(&s_cnt[1], nonfin);
    if (first_m != ~0ull) atomicMin(&s_cnt[2], first_m);
    if (unwr) atomicAdd(&s_cnt[3], unwr);
    if (first_u != ~0ull) atomicMin(&s_cnt[4], first_u);
    if (diffs) atomicAdd(&s_cnt[5], diffs);
    if (disagree) atomicAdd(&s_cnt[6], disagree);
    if (d2 != 0.0) atomicAdd(&s_sum[0], d2);
    if (w2 != 0.0) atomicAdd(&s_sum[1], w2);
    // Non-negative doubles order like their bit patterns.
    if (max_abs > 0.0) atomicMax(&s_max[0], (u64)__double_as_longlong(max_abs));
    if (max_rel > 0.0) atomicMax(&s_max[1], (u64)__double_as_longlong(max_rel));
    __syncthreads();
    if (threadIdx.x == 0) {
        if (s_cnt[0]) atomicAdd(&out[0], s_cnt[0]);
        if (s_cnt[1]) atomicAdd(&out[1], s_cnt[1]);
        if (s_cnt[2] != ~0ull) atomicMin(&out[2], s_cnt[2]);
        if (s_cnt[3]) atomicAdd(&out[3], s_cnt[3]);
        if (s_cnt[4] != ~0ull) atomicMin(&out[4], s_cnt[4]);
        if (s_cnt[5]) atomicAdd(&out[5], s_cnt[5]);
        if (s_cnt[6]) atomicAdd(&out[6], s_cnt[6]);
        if (s_sum[0] != 0.0) atomicAdd((double*)&out[7], s_sum[0]);
        if (s_sum[1] != 0.0) atomicAdd((double*)&out[8], s_sum[1]);
        if (s_max[0]) atomicMax(&out[9], s_max[0]);
        if (s_max[1]) atomicMax(&out[10], s_max[1]);
    }
}
"#;

/// What one pass of `kiln_compare` found.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Comparison {
    /// Elements compared.
    pub elems: u64,
    /// Elements still equal to the poison pattern.
    pub unwritten: u64,
    /// Smallest index of an unwritten element.
    pub first_unwritten: Option<u64>,
    /// Elements outside the tolerance of the reference (0 without one).
    pub mismatches: u64,
    /// Of those, the ones where NaN or an infinity is involved.
    pub nonfinite_mismatches: u64,
    /// Smallest mismatching index.
    pub first_mismatch: Option<u64>,
    /// Σ (got − want)² over the finite pairs.
    pub diff2: f64,
    /// Σ want² over the finite pairs.
    pub want2: f64,
    /// Largest |got − want| over the finite pairs.
    pub max_abs: f64,
    /// Largest |got − want| / |want| over the finite pairs with want ≠ 0.
    pub max_rel: f64,
    /// Elements whose bits differ from the other run (0 without one).
    pub bitwise_diffs: u64,
    /// Of those, the ones outside the tolerance of each other.
    pub disagreements: u64,
}

impl Comparison {
    /// ‖got − want‖ / ‖want‖ (‖got − want‖ when the reference is all zeros).
    pub fn rel_l2(&self) -> f64 {
        if self.want2 > 0.0 {
            (self.diff2 / self.want2).sqrt()
        } else {
            self.diff2.sqrt()
        }
    }

    fn from_slots(elems: u64, s: &[u64; SLOTS]) -> Comparison {
        let idx = |v: u64| (v != NONE).then_some(v);
        Comparison {
            elems,
            mismatches: s[0],
            nonfinite_mismatches: s[1],
            first_mismatch: idx(s[2]),
            unwritten: s[3],
            first_unwritten: idx(s[4]),
            bitwise_diffs: s[5],
            disagreements: s[6],
            diff2: f64::from_bits(s[7]),
            want2: f64::from_bits(s[8]),
            max_abs: f64::from_bits(s[9]),
            max_rel: f64::from_bits(s[10]),
        }
    }
}

/// What to compare an output against.
#[derive(Debug, Clone, Copy, Default)]
pub struct Against<'a> {
    /// The reference's output on the same inputs.
    pub want: Option<&'a DeviceBuffer>,
    /// Another run's output on the same inputs.
    pub other: Option<&'a DeviceBuffer>,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Gpu {
    /// Compares the first `elems` elements of `got` (of `dtype`) with what `against`
    /// names, and counts its poisoned elements; waits for the result.
    pub fn compare(
        &self,
        got: &DeviceBuffer,
        dtype: Dtype,
        elems: u64,
        against: Against<'_>,
    ) -> Result<Comparison, GpuError> {
        let bytes = elems
            .checked_mul(dtype.size())
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| GpuError::Usage(format!("{elems} elements overflow")))?;
        for b in [Some(got), against.want, against.other]
            .into_iter()
            .flatten()
        {
            self.check_range(b, 0, bytes)?;
        }
        let mut init = [0u64; SLOTS];
        init[2] = NONE;
        init[4] = NONE;
        self.upload(&self.compare_out, 0, &init)?;
        let ptr = |b: Option<&DeviceBuffer>| ArgValue::Ptr(b.map_or(0, DeviceBuffer::ptr));
        let sms = u64::from(self.facts.limits.sm_count.max(1));
        let blocks = elems.div_ceil(256).clamp(1, sms * 16);
        let launch = CheckedLaunch {
            kernel: "kiln_compare".into(),
            grid: [blocks as u32, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
            raise_dynamic_shared: false,
            kind: crate::launch::LaunchKind::Plain,
            args: vec![
                ArgValue::Ptr(got.ptr()),
                ptr(against.want),
                ptr(against.other),
                ArgValue::U64(elems),
                ArgValue::I32(dtype_code(dtype)),
                ArgValue::F64(against.atol),
                ArgValue::F64(against.rtol),
                ArgValue::U64(poison_pattern(dtype)),
                ArgValue::Ptr(self.compare_out.ptr()),
            ],
        };
        self.enqueue_launches(
            &self.trusted.compare,
            &CheckedLaunches {
                launches: vec![launch],
            },
        )?;
        let mut slots = [0u64; SLOTS];
        self.download(&self.compare_out, 0, &mut slots)?;
        Ok(Comparison::from_slots(elems, &slots))
    }

    /// Downloads up to `len` elements of `buf` (of `dtype`) starting at element `start`,
    /// as raw little-endian bytes (fewer near the end of `elems`).
    pub fn window(
        &self,
        buf: &DeviceBuffer,
        dtype: Dtype,
        elems: u64,
        start: u64,
        len: u64,
    ) -> Result<Vec<u8>, GpuError> {
        let end = start.saturating_add(len).min(elems);
        if start >= end {
            return Ok(Vec::new());
        }
        let size = dtype.size();
        let mut out = vec![0u8; ((end - start) * size) as usize];
        self.download(buf, (start * size) as usize, &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_names_every_kernel_and_needs_no_headers() {
        let source = compare_source();
        for k in COMPARE_KERNELS {
            assert!(source.contains(&format!("void {k}(")), "{k}");
        }
        assert!(!source.contains("#include"));
        assert!(
            source.contains("bool kiln_close("),
            "the tolerance rule is in"
        );
    }

    #[test]
    fn slots_decode_with_absent_indices() {
        let mut s = [0u64; SLOTS];
        s[2] = NONE;
        s[4] = 17;
        s[7] = 4.0f64.to_bits();
        s[8] = 16.0f64.to_bits();
        let c = Comparison::from_slots(100, &s);
        assert_eq!(c.first_mismatch, None);
        assert_eq!(c.first_unwritten, Some(17));
        assert!((c.rel_l2() - 0.5).abs() < 1e-12);
        let zero_ref = Comparison {
            diff2: 9.0,
            ..Comparison::default()
        };
        assert_eq!(zero_ref.rel_l2(), 3.0);
    }
}

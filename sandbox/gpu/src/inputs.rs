//! Inputs generated on the GPU by kiln's own trusted kernel, output poisoning, and a keyed
//! GPU-side hash for the input-tamper check.
//!
//! **Random numbers.** Element `i` of a tensor drawn with seed `s` is a pure function of
//! `(s, i)`: the counter-based SplitMix64 generator `r(k, c) = mix64(k + (c + 1)·γ)` with
//! key `k = mix64(s)`, γ = 0x9E3779B97F4A7C15 and `mix64` the SplitMix64 finaliser. So a
//! 1 GiB tensor is one embarrassingly parallel kernel (milliseconds), any element can be
//! recomputed on the host ([`host_value`]), and a fresh seed gives fresh data.
//! - uniform on `[low, high)`: `low + (high − low)·u`, `u = (r >> 11)·2⁻⁵³`;
//! - normal(mean, std), Box–Muller: `u1 = 1 − u(2i)`, `u2 = u(2i + 1)`,
//!   `mean + std·√(−2 ln u1)·cos(2π u2)`;
//!
//! The final multiply-add of both is an explicit `fma` on the GPU and `mul_add` on the
//! host, so the compiler's FMA contraction cannot make the two differ.
//! - randint on `[low, high)`: `low + r(i) mod (high − low)`.
//!
//! Values are computed in f64 and rounded once to the tensor's dtype (f16/bf16 through f32
//! with round-to-nearest-even `cvt` instructions; integers take the floor, clamped).
//!
//! **Poison.** Outputs are filled with [`poison_pattern`] before each run: a quiet NaN with
//! a payload no arithmetic produces (`0x7FC17E55` for f32; NVIDIA's computed NaN is
//! `0x7FFFFFFF`), and a fixed sentinel for integer types. An element still equal to the
//! pattern after the run was never written.
//!
//! **Hash.** [`Gpu::hash`] returns a 64-bit keyed hash of a whole buffer: the buffer is read
//! as little-endian 64-bit words `w_i` (the tail zero-padded), and
//! `H = mix64((Σ_i mix64(w_i ⊕ r(key, i)) mod 2⁶⁴) ⊕ mix64(key ⊕ nbytes))`. Every thread sums
//! its words, blocks reduce in shared memory, blocks combine with a 64-bit `atomicAdd`. The
//! sum is order-independent, so the reduction is deterministic, while the per-position key
//! makes it position-sensitive. With a secret per-evaluation key, a candidate that changes
//! its inputs cannot compute a compensating change. [`host_hash`] is the same function on
//! the host.

use kiln_types::{Dtype, Init};

use crate::device::{DeviceBuffer, Gpu};
use crate::error::GpuError;
use crate::launch::{ArgValue, CheckedLaunch, CheckedLaunches};

/// The trusted kernels' names, all in [`TRUSTED_SOURCE`].
pub const TRUSTED_KERNELS: &[&str] = &["kiln_fill", "kiln_pattern", "kiln_hash", "kiln_spin"];

/// Block size of the trusted kernels (the hash kernel's reduction assumes it).
const BLOCK: u32 = 256;

/// CUDA source of kiln's trusted kernels. No headers: NVRTC's built-ins are enough.
pub const TRUSTED_SOURCE: &str = r#"
typedef unsigned long long u64;
typedef long long i64;

__device__ __forceinline__ u64 kiln_mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ u64 kiln_rand(u64 key, u64 ctr) {
    return kiln_mix64(key + (ctr + 1ull) * 0x9E3779B97F4A7C15ull);
}
__device__ __forceinline__ double kiln_u01(u64 r) {
    return (double)(r >> 11) * 1.1102230246251565404236316680908203125e-16;
}
__device__ __forceinline__ unsigned short kiln_f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ unsigned short kiln_f2bf(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ i64 kiln_clamp_floor(double x, double lo, double hi) {
    x = floor(x);
    if (!(x >= lo)) x = lo;  // also maps NaN to lo
    if (x > hi) x = hi;
    return (i64)x;
}

// dtype: 0 f32, 1 f64, 2 f16, 3 bf16, 4 i32, 5 i64, 6 u8
// dist:  0 uniform [a, b), 1 normal (mean a, std b), 2 randint [lo, hi)
extern "C" __global__ void kiln_fill(void* out, u64 n, int dtype, int dist, u64 key,
                                     double a, double b, i64 lo, i64 hi) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double x = 0.0;
        i64 iv = 0;
        if (dist == 0) {
            x = fma(b - a, kiln_u01(kiln_rand(key, i)), a);
        } else if (dist == 1) {
            double u1 = 1.0 - kiln_u01(kiln_rand(key, 2ull * i));
            double u2 = kiln_u01(kiln_rand(key, 2ull * i + 1ull));
            x = fma(b, sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2), a);
        } else {
            u64 range = (u64)(hi - lo);
            iv = lo + (i64)(range == 0ull ? 0ull : kiln_rand(key, i) % range);
            x = (double)iv;
        }
        switch (dtype) {
        case 0: ((float*)out)[i] = (float)x; break;
        case 1: ((double*)out)[i] = x; break;
        case 2: ((unsigned short*)out)[i] = kiln_f2h((float)x); break;
        case 3: ((unsigned short*)out)[i] = kiln_f2bf((float)x); break;
        case 4: ((int*)out)[i] = dist == 2 ? (int)iv
                    : (int)kiln_clamp_floor(x, -2147483648.0, 2147483647.0); break;
        case 5: ((i64*)out)[i] = dist == 2 ? iv
                    : kiln_clamp_floor(x, -9223372036854775808.0, 9223372036854774784.0); break;
        case 6: ((unsigned char*)out)[i] = dist == 2 ? (unsigned char)iv
                    : (unsigned char)kiln_clamp_floor(x, 0.0, 255.0); break;
        default: break;
        }
    }
}

// Fills n elements of elem_size bytes (1, 2, 4 or 8) with the low bytes of pattern.
extern "C" __global__ void kiln_pattern(void* out, u64 n, int elem_size, u64 pattern) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        switch (elem_size) {
        case 8: ((u64*)out)[i] = pattern; break;
        case 4: ((unsigned int*)out)[i] = (unsigned int)pattern; break;
        case 2: ((unsigned short*)out)[i] = (unsigned short)pattern; break;
        default: ((unsigned char*)out)[i] = (unsigned char)pattern; break;
        }
    }
}

// Sum over 64-bit words of mix64(w_i ^ rand(key, i)); result must be zeroed first.
// Launched with 256 threads per block.
extern "C" __global__ void kiln_hash(const unsigned char* data, u64 nbytes, u64 key, u64* result) {
    __shared__ u64 part[256];
    const u64* words = (const u64*)data;
    u64 nwords = nbytes >> 3;
    u64 acc = 0ull;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nwords; i += stride) {
        acc += kiln_mix64(words[i] ^ kiln_rand(key, i));
    }
    if (blockIdx.x == 0 && threadIdx.x == 0 && (nbytes & 7ull) != 0ull) {
        u64 t = 0ull;
        for (u64 j = nwords * 8ull; j < nbytes; ++j) {
            t |= (u64)data[j] << (8ull * (j - nwords * 8ull));
        }
        acc += kiln_mix64(t ^ kiln_rand(key, nwords));
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(result, part[0]);
}

// One thread spins for ns nanoseconds of %globaltimer: the "blocking kernel" queued before
// the start event so that the event is not recorded long before the timed work can start.
extern "C" __global__ void kiln_spin(u64 ns) {
    u64 t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"#;

/// SplitMix64 finaliser (Stafford's mix 13).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The counter-based generator: output `ctr` for `key`.
pub fn rand_at(key: u64, ctr: u64) -> u64 {
    mix64(key.wrapping_add(ctr.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15)))
}

/// The generator key for a seed.
pub fn key_for_seed(seed: u64) -> u64 {
    mix64(seed)
}

/// A per-tensor seed from the evaluation's secret seed and a label (tensor name, trial
/// number), so tensors and trials never share a stream.
pub fn derive_seed(seed: u64, label: &str) -> u64 {
    // FNV-1a over the label, then mixed with the seed.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in label.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(seed ^ mix64(h))
}

fn u01(r: u64) -> f64 {
    (r >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Element `i` of a tensor drawn from `init` with `seed`, before rounding to its dtype —
/// the host mirror of `kiln_fill` (equal up to the last bits of `ln`/`cos`).
pub fn host_value(init: &Init, seed: u64, i: u64) -> f64 {
    let key = key_for_seed(seed);
    match *init {
        Init::Uniform { low, high } => (high - low).mul_add(u01(rand_at(key, i)), low),
        Init::Normal { mean, std } => {
            let u1 = 1.0 - u01(rand_at(key, 2 * i));
            let u2 = u01(rand_at(key, 2 * i + 1));
            std.mul_add(
                (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos(),
                mean,
            )
        }
        Init::Randint { low, high } => {
            let range = high.wrapping_sub(low) as u64;
            let off = if range == 0 {
                0
            } else {
                rand_at(key, i) % range
            };
            low.wrapping_add(off as i64) as f64
        }
    }
}

/// The code `kiln_fill` uses for a dtype.
pub fn dtype_code(dtype: Dtype) -> i32 {
    match dtype {
        Dtype::F32 => 0,
        Dtype::F64 => 1,
        Dtype::F16 => 2,
        Dtype::Bf16 => 3,
        Dtype::I32 => 4,
        Dtype::I64 => 5,
        Dtype::U8 => 6,
    }
}

/// The poison bit pattern for a dtype (in the low `dtype.size()` bytes).
pub fn poison_pattern(dtype: Dtype) -> u64 {
    match dtype {
        Dtype::F32 => 0x7FC1_7E55,
        Dtype::F64 => 0x7FF8_0000_DEAD_7E55,
        Dtype::F16 => 0x7E55,
        Dtype::Bf16 => 0x7FD5,
        Dtype::I32 => 0x7E55_7E55,
        Dtype::I64 => 0x7E55_7E55_7E55_7E55,
        Dtype::U8 => 0xA5,
    }
}

/// The host mirror of [`Gpu::hash`].
pub fn host_hash(bytes: &[u8], key: u64) -> u64 {
    let mut sum: u64 = 0;
    let chunks = bytes.chunks_exact(8);
    let tail = chunks.remainder();
    let nwords = (bytes.len() / 8) as u64;
    for (i, c) in chunks.enumerate() {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        sum = sum.wrapping_add(mix64(u64::from_le_bytes(w) ^ rand_at(key, i as u64)));
    }
    if !tail.is_empty() {
        let mut w = [0u8; 8];
        w[..tail.len()].copy_from_slice(tail);
        sum = sum.wrapping_add(mix64(u64::from_le_bytes(w) ^ rand_at(key, nwords)));
    }
    finish_hash(sum, key, bytes.len() as u64)
}

fn finish_hash(sum: u64, key: u64, nbytes: u64) -> u64 {
    mix64(sum ^ mix64(key ^ nbytes))
}

impl Gpu {
    fn trusted_launch(&self, kernel: &str, n: u64, args: Vec<ArgValue>) -> CheckedLaunch {
        let sms = self.facts.limits.sm_count.max(1);
        let blocks = n.div_ceil(u64::from(BLOCK)).clamp(1, u64::from(sms) * 32);
        CheckedLaunch {
            kernel: kernel.to_string(),
            grid: [blocks as u32, 1, 1],
            block: [BLOCK, 1, 1],
            shared_bytes: 0,
            raise_dynamic_shared: false,
            args,
            kind: crate::launch::LaunchKind::Plain,
        }
    }

    fn check_elems(&self, buf: &DeviceBuffer, dtype: Dtype, elems: u64) -> Result<(), GpuError> {
        self.check_range(buf, 0, buf.bytes())?;
        match elems.checked_mul(dtype.size()) {
            Some(b) if b <= buf.bytes() as u64 => Ok(()),
            _ => Err(GpuError::Usage(format!(
                "{elems} elements of {dtype:?} do not fit the {}-byte buffer",
                buf.bytes()
            ))),
        }
    }

    /// Enqueues the generation of `elems` elements of `dtype` drawn from `init` with
    /// `seed` into `buf`. Does not wait.
    pub fn fill(
        &self,
        buf: &DeviceBuffer,
        dtype: Dtype,
        elems: u64,
        init: &Init,
        seed: u64,
    ) -> Result<(), GpuError> {
        self.check_elems(buf, dtype, elems)?;
        let (dist, a, b, lo, hi) = match *init {
            Init::Uniform { low, high } => (0, low, high, 0, 0),
            Init::Normal { mean, std } => (1, mean, std, 0, 0),
            Init::Randint { low, high } => {
                if high <= low {
                    return Err(GpuError::Usage(format!(
                        "randint needs low < high, got [{low}, {high})"
                    )));
                }
                (2, 0.0, 0.0, low, high)
            }
        };
        let launch = self.trusted_launch(
            "kiln_fill",
            elems,
            vec![
                ArgValue::Ptr(buf.ptr()),
                ArgValue::U64(elems),
                ArgValue::I32(dtype_code(dtype)),
                ArgValue::I32(dist),
                ArgValue::U64(key_for_seed(seed)),
                ArgValue::F64(a),
                ArgValue::F64(b),
                ArgValue::I64(lo),
                ArgValue::I64(hi),
            ],
        );
        self.enqueue_launches(
            &self.trusted.module,
            &CheckedLaunches {
                launches: vec![launch],
            },
        )
    }

    /// Enqueues filling `elems` elements of `buf` with [`poison_pattern`]`(dtype)`. Does not
    /// wait.
    pub fn poison(&self, buf: &DeviceBuffer, dtype: Dtype, elems: u64) -> Result<(), GpuError> {
        self.check_elems(buf, dtype, elems)?;
        let launch = self.trusted_launch(
            "kiln_pattern",
            elems,
            vec![
                ArgValue::Ptr(buf.ptr()),
                ArgValue::U64(elems),
                ArgValue::I32(dtype.size() as i32),
                ArgValue::U64(poison_pattern(dtype)),
            ],
        );
        self.enqueue_launches(
            &self.trusted.module,
            &CheckedLaunches {
                launches: vec![launch],
            },
        )
    }

    /// The keyed 64-bit hash of all of `buf` (see the module docs); waits for the result.
    pub fn hash(&self, buf: &DeviceBuffer, key: u64) -> Result<u64, GpuError> {
        self.check_range(buf, 0, buf.bytes())?;
        self.memset(&self.hash_out, 0)?;
        let nbytes = buf.bytes() as u64;
        let launch = self.trusted_launch(
            "kiln_hash",
            nbytes.div_ceil(8),
            vec![
                ArgValue::Ptr(buf.ptr()),
                ArgValue::U64(nbytes),
                ArgValue::U64(key),
                ArgValue::Ptr(self.hash_out.ptr()),
            ],
        );
        self.enqueue_launches(
            &self.trusted.module,
            &CheckedLaunches {
                launches: vec![launch],
            },
        )?;
        let mut sum = [0u64; 1];
        self.download(&self.hash_out, 0, &mut sum)?;
        Ok(finish_hash(sum[0], key, nbytes))
    }

    /// Enqueues the blocking kernel: one thread spinning for `ns` nanoseconds.
    pub fn spin(&self, ns: u64) -> Result<(), GpuError> {
        let launch = CheckedLaunch {
            kernel: "kiln_spin".to_string(),
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
            raise_dynamic_shared: false,
            kind: crate::launch::LaunchKind::Plain,
            args: vec![ArgValue::U64(ns)],
        };
        self.enqueue_launches(
            &self.trusted.module,
            &CheckedLaunches {
                launches: vec![launch],
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // SplitMix64 seeded with 0: the first outputs of the reference generator.
        assert_eq!(rand_at(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rand_at(0, 1), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn host_values_have_the_right_distribution() {
        let n = 200_000u64;
        let seed = 42;
        let normal = Init::Normal {
            mean: 1000.0,
            std: 0.1,
        };
        let xs: Vec<f64> = (0..n).map(|i| host_value(&normal, seed, i)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - 1000.0).abs() < 0.002, "mean {mean}");
        assert!((var.sqrt() - 0.1).abs() < 0.002, "std {}", var.sqrt());
        let uni = Init::Uniform {
            low: -2.0,
            high: 3.0,
        };
        let us: Vec<f64> = (0..n).map(|i| host_value(&uni, seed, i)).collect();
        assert!(us.iter().all(|&u| (-2.0..3.0).contains(&u)));
        let m = us.iter().sum::<f64>() / n as f64;
        assert!((m - 0.5).abs() < 0.02, "uniform mean {m}");
        let ri = Init::Randint { low: -3, high: 4 };
        let mut seen = [0u32; 7];
        for i in 0..n {
            let v = host_value(&ri, seed, i);
            assert!((-3.0..4.0).contains(&v) && v.fract() == 0.0);
            seen[(v + 3.0) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 20_000), "{seen:?}");
        // A different seed gives different data.
        assert_ne!(host_value(&normal, 1, 0), host_value(&normal, 2, 0));
    }

    #[test]
    fn derived_seeds_differ_by_label_and_seed() {
        assert_ne!(derive_seed(1, "x"), derive_seed(1, "y"));
        assert_ne!(derive_seed(1, "x"), derive_seed(2, "x"));
        assert_eq!(derive_seed(7, "trial 0/x"), derive_seed(7, "trial 0/x"));
    }

    #[test]
    fn hash_is_position_sensitive_keyed_and_covers_the_tail() {
        let data: Vec<u8> = (0..1003u32).map(|i| (i * 7 + 3) as u8).collect();
        let h = host_hash(&data, 99);
        assert_eq!(h, host_hash(&data, 99));
        assert_ne!(h, host_hash(&data, 100), "key must matter");
        let mut swapped = data.clone();
        swapped.swap(0, 8);
        assert_ne!(h, host_hash(&swapped, 99), "positions must matter");
        let mut tail = data.clone();
        *tail.last_mut().unwrap() ^= 1;
        assert_ne!(h, host_hash(&tail, 99), "the tail must be covered");
        let mut longer = data.clone();
        longer.push(0);
        assert_ne!(h, host_hash(&longer, 99), "the length must matter");
    }

    #[test]
    fn poison_patterns_are_nans_with_a_payload() {
        let f = f32::from_bits(poison_pattern(Dtype::F32) as u32);
        assert!(f.is_nan());
        assert_ne!(poison_pattern(Dtype::F32), 0x7FFF_FFFF);
        assert!(f64::from_bits(poison_pattern(Dtype::F64)).is_nan());
        // f16: exponent all ones, non-zero mantissa, quiet bit set.
        let h = poison_pattern(Dtype::F16) as u16;
        assert_eq!(h & 0x7C00, 0x7C00);
        assert!(h & 0x03FF != 0 && h & 0x0200 != 0);
        let b = poison_pattern(Dtype::Bf16) as u16;
        assert_eq!(b & 0x7F80, 0x7F80);
        assert!(b & 0x007F != 0 && b & 0x0040 != 0);
        for d in [Dtype::I32, Dtype::U8] {
            assert!(poison_pattern(d) < (1u64 << (8 * d.size())));
        }
    }

    #[test]
    fn trusted_source_names_every_trusted_kernel() {
        for k in TRUSTED_KERNELS {
            assert!(TRUSTED_SOURCE.contains(&format!("void {k}(")), "{k}");
        }
        assert!(!TRUSTED_SOURCE.contains("#include"));
    }
}

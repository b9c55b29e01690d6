//! Inputs generated on the GPU by kiln's own trusted kernel, output poisoning, and a keyed
//! GPU-side hash for the input-tamper check.
//!
//! **Random numbers.** Element `i` of a tensor drawn with seed `s` is a pure function of
//! `(s, i)`: the counter-based SplitMix64 generator `r(k, c) = mix64(k + (c + 1)·γ)` with
//! key `k = mix64(s)`, γ = 0x9E3779B97F4A7C15 and `mix64` the SplitMix64 finaliser. So a
//! 1 GiB tensor is one embarrassingly parallel kernel, any element can be recomputed on
//! the host, bit for bit ([`FillParams::value_of`], [`host_value`]), and a fresh seed gives
//! fresh data. The host backend draws its inputs with these same functions
//! (`kiln_sandbox`'s `contract::data`), so one seed gives the same data on both backends.
//!
//! Values use one random word per element and no transcendental function, so generation
//! runs near the memory's write speed (measured by the `gpu_fill_*` GPU test). f32, f16
//! and bf16 tensors are computed in f32, f64 and integer tensors in f64, each step
//! correctly rounded (`__fmul_rn`/`__fadd_rn` on the GPU, never contracted into an FMA;
//! plain `*` and `+` on the host), so the host mirror is exact:
//! - uniform on `[low, high)`: `u = (r >> 40)·2⁻²⁴` (f32) or `(r >> 11)·2⁻⁵³` (f64), then
//!   `min(low + (high − low)·u, below(high))`, `below(high)` the largest value under `high`;
//! - normal(mean, std), approximated by the sum of four uniforms (Irwin–Hall): the four
//!   16-bit fields of `r` summed and centred, `t ∈ [−131070, 131070]` (exact in f32), then
//!   `mean + t·(std/σ₄)` with σ₄ = √((2³² − 1)/3) the sum's standard deviation. Mean and
//!   variance are exact; the tails end at ±3.46 σ (a normal's would pass that in about
//!   5 draws of 10 000), the kurtosis is 2.7 (a normal's: 3);
//! - randint on `[low, high)`: `low + r(i) mod (high − low)`.
//!
//! f16/bf16 take the f32 value through round-to-nearest-even `cvt` instructions; integer
//! dtypes take the floor of the f64 value, clamped (randint is exact).
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
// The four 16-bit fields of r summed and centred: an integer in [-131070, 131070].
__device__ __forceinline__ int kiln_ih4(u64 r) {
    unsigned int lo = (unsigned int)r, hi = (unsigned int)(r >> 32);
    return (int)((lo & 0xFFFFu) + (lo >> 16) + (hi & 0xFFFFu) + (hi >> 16)) - 131070;
}
// One element in f32 (dist 0 uniform: a + b*u capped at c; 1 normal: a + t*b).
__device__ __forceinline__ float kiln_f32(u64 r, int dist, float a, float b, float c) {
    if (dist == 0) {
        float u = __fmul_rn((float)(unsigned int)(r >> 40), 5.9604644775390625e-8f);
        return fminf(__fadd_rn(a, __fmul_rn(b, u)), c);
    }
    return __fadd_rn(a, __fmul_rn((float)kiln_ih4(r), b));
}
// The same in f64.
__device__ __forceinline__ double kiln_f64(u64 r, int dist, double a, double b, double c) {
    if (dist == 0) {
        double u = __dmul_rn((double)(r >> 11), 1.1102230246251565404236316680908203125e-16);
        return fmin(__dadd_rn(a, __dmul_rn(b, u)), c);
    }
    return __dadd_rn(a, __dmul_rn((double)kiln_ih4(r), b));
}

// dtype: 0 f32, 1 f64, 2 f16, 3 bf16, 4 i32, 5 i64, 6 u8
// dist:  0 uniform, 1 normal (a, b, c and af, bf, cf as computed by fill_params on the
//        host, in f64 and f32), 2 randint [lo, hi)
// The counter z = key + (i + 1)·γ advances by stride·γ per step (the same numbers as
// kiln_rand(key, i), one multiplication fewer).
extern "C" __global__ void kiln_fill(void* out, u64 n, int dtype, int dist, u64 key,
                                     double a, double b, double c, float af, float bf, float cf,
                                     i64 lo, i64 hi) {
    const u64 gamma = 0x9E3779B97F4A7C15ull;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 z = key + (i + 1ull) * gamma;
    const u64 dz = stride * gamma;
    if (dtype == 0 && dist != 2) {  // f32, the common case: a loop of its own
        float* o = (float*)out;
        for (; i < n; i += stride, z += dz) o[i] = kiln_f32(kiln_mix64(z), dist, af, bf, cf);
        return;
    }
    u64 range = (u64)(hi - lo);
    for (; i < n; i += stride, z += dz) {
        u64 r = kiln_mix64(z);
        i64 iv = 0;
        double x = 0.0;
        float xf = 0.0f;
        if (dist == 2) {
            iv = lo + (i64)(range == 0ull ? 0ull : r % range);
            x = (double)iv;
            xf = (float)x;
        } else if (dtype == 0 || dtype == 2 || dtype == 3) {
            xf = kiln_f32(r, dist, af, bf, cf);
        } else {
            x = kiln_f64(r, dist, a, b, c);
        }
        switch (dtype) {
        case 0: ((float*)out)[i] = xf; break;
        case 1: ((double*)out)[i] = x; break;
        case 2: ((unsigned short*)out)[i] = kiln_f2h(xf); break;
        case 3: ((unsigned short*)out)[i] = kiln_f2bf(xf); break;
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

/// The standard deviation of the sum of four independent uniforms on `0..65536`:
/// √(4 · (65536² − 1) / 12).
pub fn ih4_sigma() -> f64 {
    ((65536.0f64 * 65536.0 - 1.0) / 3.0).sqrt()
}

/// The four 16-bit fields of `r` summed and centred: an integer in `[−131070, 131070]`.
pub fn ih4(r: u64) -> i32 {
    let f = |k: u32| ((r >> (16 * k)) & 0xFFFF) as i32;
    f(0) + f(1) + f(2) + f(3) - 131_070
}

/// How `kiln_fill` turns a random word into a value, for one distribution: computed once
/// on the host, passed to the kernel, and used by the host mirror.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FillParams {
    /// 0 uniform, 1 normal, 2 randint.
    pub dist: i32,
    /// Uniform: low, (high − low), the largest f64 below high. Normal: mean, std/σ₄, 0.
    pub f64s: [f64; 3],
    /// The same in f32 (the largest f32 below high for uniform).
    pub f32s: [f32; 3],
    /// Randint: low, high.
    pub ints: [i64; 2],
}

/// The largest f32 strictly below `x`.
fn f32_below(x: f64) -> f32 {
    let r = x as f32;
    if f64::from(r) < x { r } else { r.next_down() }
}

impl FillParams {
    /// The parameters of `init`; `Err` for a randint with `high <= low`.
    pub fn of(init: &Init) -> Result<FillParams, String> {
        Ok(match *init {
            Init::Uniform { low, high } => FillParams {
                dist: 0,
                f64s: [low, high - low, high.next_down()],
                f32s: [low as f32, (high - low) as f32, f32_below(high)],
                ints: [0, 0],
            },
            Init::Normal { mean, std } => {
                let k = std / ih4_sigma();
                FillParams {
                    dist: 1,
                    f64s: [mean, k, 0.0],
                    f32s: [mean as f32, k as f32, 0.0],
                    ints: [0, 0],
                }
            }
            Init::Randint { low, high } => {
                if high <= low {
                    return Err(format!("randint needs low < high, got [{low}, {high})"));
                }
                FillParams {
                    dist: 2,
                    f64s: [0.0; 3],
                    f32s: [0.0; 3],
                    ints: [low, high],
                }
            }
            Init::GetInputs => {
                return Err(
                    "this input comes from the problem's get_inputs(), made by the torch runner"
                        .into(),
                );
            }
        })
    }

    fn randint(&self, r: u64) -> i64 {
        let [lo, hi] = self.ints;
        let range = hi.wrapping_sub(lo) as u64;
        let off = if range == 0 { 0 } else { r % range };
        lo.wrapping_add(off as i64)
    }

    /// The f32 value of random word `r` (f32, f16 and bf16 tensors; f16/bf16 before their
    /// rounding): exactly what `kiln_fill` computes.
    pub fn f32_of(&self, r: u64) -> f32 {
        let [a, b, c] = self.f32s;
        match self.dist {
            0 => {
                let u = ((r >> 40) as f32) * (1.0 / 16_777_216.0);
                (a + b * u).min(c)
            }
            1 => a + (ih4(r) as f32) * b,
            _ => self.randint(r) as f64 as f32,
        }
    }

    /// The f64 value of random word `r` (f64 tensors, and integer ones before the floor):
    /// exactly what `kiln_fill` computes.
    pub fn f64_of(&self, r: u64) -> f64 {
        let [a, b, c] = self.f64s;
        match self.dist {
            0 => {
                let u = ((r >> 11) as f64) * (1.0 / (1u64 << 53) as f64);
                (a + b * u).min(c)
            }
            1 => a + f64::from(ih4(r)) * b,
            _ => self.randint(r) as f64,
        }
    }

    /// The value of random word `r` in a tensor of `dtype`, as `kiln_fill` stores it
    /// (f16/bf16: the f32 value before the final rounding; integers floored and clamped).
    pub fn value_of(&self, dtype: Dtype, r: u64) -> f64 {
        match dtype {
            Dtype::F32 | Dtype::F16 | Dtype::Bf16 => f64::from(self.f32_of(r)),
            Dtype::F64 => self.f64_of(r),
            Dtype::I32 | Dtype::I64 | Dtype::U8 if self.dist == 2 => self.randint(r) as f64,
            Dtype::I32 => clamp_floor(self.f64_of(r), -2147483648.0, 2147483647.0),
            Dtype::I64 => clamp_floor(
                self.f64_of(r),
                -9223372036854775808.0,
                9223372036854774784.0,
            ),
            Dtype::U8 => clamp_floor(self.f64_of(r), 0.0, 255.0),
        }
    }
}

/// Element `i` of a tensor of `dtype` drawn from `init` with `seed`, as the GPU stores it
/// (see [`FillParams::value_of`]). `Err` for an invalid `init`.
pub fn host_value(init: &Init, dtype: Dtype, seed: u64, i: u64) -> Result<f64, String> {
    let p = FillParams::of(init)?;
    Ok(p.value_of(dtype, rand_at(key_for_seed(seed), i)))
}

/// `kiln_clamp_floor`: the floor of `x` within `[lo, hi]` (NaN gives `lo`).
pub fn clamp_floor(x: f64, lo: f64, hi: f64) -> f64 {
    let x = x.floor();
    if x.is_nan() || x < lo {
        lo
    } else if x > hi {
        hi
    } else {
        x
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
    /// `seed` into `buf` (see the module docs). Does not wait.
    pub fn fill(
        &self,
        buf: &DeviceBuffer,
        dtype: Dtype,
        elems: u64,
        init: &Init,
        seed: u64,
    ) -> Result<(), GpuError> {
        self.check_elems(buf, dtype, elems)?;
        let p = FillParams::of(init).map_err(GpuError::Usage)?;
        let launch = self.trusted_launch(
            "kiln_fill",
            elems,
            vec![
                ArgValue::Ptr(buf.ptr()),
                ArgValue::U64(elems),
                ArgValue::I32(dtype_code(dtype)),
                ArgValue::I32(p.dist),
                ArgValue::U64(key_for_seed(seed)),
                ArgValue::F64(p.f64s[0]),
                ArgValue::F64(p.f64s[1]),
                ArgValue::F64(p.f64s[2]),
                ArgValue::F32(p.f32s[0]),
                ArgValue::F32(p.f32s[1]),
                ArgValue::F32(p.f32s[2]),
                ArgValue::I64(p.ints[0]),
                ArgValue::I64(p.ints[1]),
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

    /// Enqueues filling `len` bytes of `buf` from `offset` (both multiples of 8) with the
    /// 64-bit word `pattern`, repeated. Does not wait.
    pub fn pattern_range(
        &self,
        buf: &DeviceBuffer,
        offset: usize,
        len: usize,
        pattern: u64,
    ) -> Result<(), GpuError> {
        self.check_range(buf, offset, len)?;
        if !offset.is_multiple_of(8) || !len.is_multiple_of(8) {
            return Err(GpuError::Usage(format!(
                "pattern range {offset}..+{len} is not in whole 8-byte words"
            )));
        }
        let words = (len / 8) as u64;
        let launch = self.trusted_launch(
            "kiln_pattern",
            words,
            vec![
                ArgValue::Ptr(buf.ptr() + offset as u64),
                ArgValue::U64(words),
                ArgValue::I32(8),
                ArgValue::U64(pattern),
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
        self.hash_range(buf, 0, buf.bytes(), key)
    }

    /// The keyed hash of `len` bytes of `buf` from `offset` (a multiple of 8), equal to
    /// [`host_hash`] of those bytes; waits for the result.
    pub fn hash_range(
        &self,
        buf: &DeviceBuffer,
        offset: usize,
        len: usize,
        key: u64,
    ) -> Result<u64, GpuError> {
        self.check_range(buf, offset, len)?;
        if !offset.is_multiple_of(8) {
            return Err(GpuError::Usage(format!(
                "hash offset {offset} is not a multiple of 8"
            )));
        }
        self.memset(&self.hash_out, 0)?;
        let nbytes = len as u64;
        let launch = self.trusted_launch(
            "kiln_hash",
            nbytes.div_ceil(8),
            vec![
                ArgValue::Ptr(buf.ptr() + offset as u64),
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

    /// Enqueues a read of all of `buf` (the keyed hash into the hash slot, whose result
    /// nobody reads: [`Gpu::hash_range`] zeroes the slot before each use). Used by the L2
    /// flush, so does not wait.
    pub(crate) fn enqueue_read(&self, buf: &DeviceBuffer) -> Result<(), GpuError> {
        let nbytes = buf.bytes() as u64;
        let launch = self.trusted_launch(
            "kiln_hash",
            nbytes.div_ceil(8),
            vec![
                ArgValue::Ptr(buf.ptr()),
                ArgValue::U64(nbytes),
                ArgValue::U64(0),
                ArgValue::Ptr(self.hash_out.ptr()),
            ],
        );
        self.enqueue_launches(
            &self.trusted.module,
            &CheckedLaunches {
                launches: vec![launch],
            },
        )
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

    fn moments(xs: &[f64]) -> (f64, f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        let kurt = xs.iter().map(|x| (x - mean).powi(4)).sum::<f64>() / n / (var * var);
        (mean, var.sqrt(), kurt)
    }

    #[test]
    fn host_values_have_the_right_distribution() {
        let n = 200_000u64;
        let seed = 42;
        let normal = Init::Normal {
            mean: 1000.0,
            std: 0.1,
        };
        for dtype in [Dtype::F32, Dtype::F64] {
            let xs: Vec<f64> = (0..n)
                .map(|i| host_value(&normal, dtype, seed, i).expect("value"))
                .collect();
            let (mean, std, _) = moments(&xs);
            assert!((mean - 1000.0).abs() < 0.002, "{dtype:?} mean {mean}");
            assert!((std - 0.1).abs() < 0.002, "{dtype:?} std {std}");
        }
        let std_normal = Init::Normal {
            mean: 0.0,
            std: 1.0,
        };
        let zs: Vec<f64> = (0..n)
            .map(|i| host_value(&std_normal, Dtype::F32, seed, i).expect("value"))
            .collect();
        let (mean, std, kurt) = moments(&zs);
        assert!(
            mean.abs() < 0.01 && (std - 1.0).abs() < 0.01,
            "{mean} {std}"
        );
        // Irwin–Hall(4): kurtosis 3 − 6/(5·4) = 2.7; the tails end at ±√12.
        assert!((kurt - 2.7).abs() < 0.03, "kurtosis {kurt}");
        assert!(zs.iter().all(|z| z.abs() <= 12f64.sqrt() + 1e-6));
        assert!(zs.iter().any(|z| z.abs() > 3.0), "tails reach past 3 sigma");
        let uni = Init::Uniform {
            low: -2.0,
            high: 3.0,
        };
        for dtype in [Dtype::F32, Dtype::F64] {
            let us: Vec<f64> = (0..n)
                .map(|i| host_value(&uni, dtype, seed, i).expect("value"))
                .collect();
            assert!(us.iter().all(|&u| (-2.0..3.0).contains(&u)));
            let (m, _, _) = moments(&us);
            assert!((m - 0.5).abs() < 0.02, "{dtype:?} uniform mean {m}");
        }
        // The cap keeps rounding from reaching `high`, in f32 as in f64.
        let p = FillParams::of(&Init::Uniform {
            low: 0.0,
            high: 1.0,
        })
        .expect("params");
        assert!(p.f32s[2] < 1.0 && p.f64s[2] < 1.0);
        let ri = Init::Randint { low: -3, high: 4 };
        let mut seen = [0u32; 7];
        for i in 0..n {
            let v = host_value(&ri, Dtype::I32, seed, i).expect("value");
            assert!((-3.0..4.0).contains(&v) && v.fract() == 0.0);
            seen[(v + 3.0) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 20_000), "{seen:?}");
        assert!(host_value(&Init::Randint { low: 2, high: 2 }, Dtype::I32, 1, 0).is_err());
        // A different seed gives different data.
        assert_ne!(
            host_value(&normal, Dtype::F32, 1, 0),
            host_value(&normal, Dtype::F32, 2, 0)
        );
    }

    #[test]
    fn ih4_sums_the_four_fields() {
        assert_eq!(ih4(0), -131_070);
        assert_eq!(ih4(u64::MAX), 131_070);
        assert_eq!(ih4(0x0001_0002_0003_0004) + 131_070, 10);
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

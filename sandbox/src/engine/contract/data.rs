//! Element data: drawing inputs from the plan's secret seed, the poison pattern for
//! outputs, and reading elements back as `f64` for comparison.
//!
//! Every tensor of every input set gets its own generator seed, blake3 over (secret seed,
//! purpose, index, tensor name) ([`tensor_seed`]), so trials and timing input sets are
//! independent, reproducible by kiln, and unpredictable to a candidate that never sees
//! the seed: even one that recovered a set's generator state from its values would learn
//! nothing about any other set. Elements come from the counter-based generator of
//! `kiln_gpu::inputs` (the one the GPU runs, bit for bit), a few nanoseconds each.

use kiln_gpu::inputs::{FillParams, key_for_seed, rand_at};
use kiln_types::{Dtype, Init};

/// f32 poison: a signalling NaN with a payload that no arithmetic produces (arithmetic
/// yields quiet NaNs), so an element still holding it was never written.
pub const POISON_F32: u32 = 0x7FA5_A5A5;
/// f64 poison (see [`POISON_F32`]).
pub const POISON_F64: u64 = 0x7FF4_A5A5_A5A5_A5A5;
/// Byte pattern for integer outputs (0xA5 in every byte).
pub const POISON_BYTE: u8 = 0xA5;

/// The distribution of the contract's shifted/scaled trial (`crate::engine::contract`): mean 1000,
/// std 0.1, which breaks the naive `E[x²] − E[x]²` variance formula in f32.
pub const SHIFTED: Init = Init::Normal {
    mean: 1000.0,
    std: 0.1,
};

/// The generator seed of tensor `tensor` of input set (`purpose`, `index`), from the
/// secret `seed`.
pub fn tensor_seed(seed: u64, purpose: &str, index: u64, tensor: &str) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(b"kiln tensor seed");
    h.update(&seed.to_le_bytes());
    for part in [purpose.as_bytes(), tensor.as_bytes()] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(&index.to_le_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.finalize().as_bytes()[..8]);
    u64::from_le_bytes(b)
}

/// xoshiro256** keyed by blake3: the contract's own random decisions (which timed samples
/// are re-checked), unpredictable to a candidate that never sees the seed.
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform on [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A generator keyed by (secret seed, purpose, index).
pub fn rng_for(seed: u64, purpose: &str, index: u64) -> Rng {
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.update(purpose.as_bytes());
    h.update(&index.to_le_bytes());
    let b = h.finalize();
    let mut s = [0u64; 4];
    for (i, w) in s.iter_mut().enumerate() {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&b.as_bytes()[i * 8..i * 8 + 8]);
        *w = u64::from_le_bytes(bytes);
    }
    if s == [0; 4] {
        s[0] = 1; // the one state xoshiro cannot leave
    }
    Rng { s }
}

/// Fills `buf` (elements of `dtype`) with draws from `init` with generator seed `seed`
/// (from [`tensor_seed`]): the values `kiln_fill` writes on the GPU. `Err` for an invalid
/// `init` (a problem's inits are checked when it is registered).
pub fn fill(buf: &mut [u8], dtype: Dtype, init: Init, seed: u64) -> Result<(), String> {
    let p = FillParams::of(&init)?;
    let key = key_for_seed(seed);
    let size = dtype.size() as usize;
    for (i, c) in buf.chunks_exact_mut(size).enumerate() {
        let r = rand_at(key, i as u64);
        match dtype {
            Dtype::F32 => c.copy_from_slice(&p.f32_of(r).to_le_bytes()),
            Dtype::F64 => c.copy_from_slice(&p.f64_of(r).to_le_bytes()),
            Dtype::I32 => c.copy_from_slice(&(p.value_of(dtype, r) as i32).to_le_bytes()),
            Dtype::I64 => c.copy_from_slice(&(p.value_of(dtype, r) as i64).to_le_bytes()),
            Dtype::U8 => c[0] = p.value_of(dtype, r) as u8,
            // Refused by `layout::dtype_supported` before any data is drawn.
            Dtype::F16 | Dtype::Bf16 => c.fill(0),
        }
    }
    Ok(())
}

/// Writes the poison pattern over every element.
pub fn poison(buf: &mut [u8], dtype: Dtype) {
    let pattern: &[u8] = match dtype {
        Dtype::F32 => &POISON_F32.to_le_bytes(),
        Dtype::F64 => &POISON_F64.to_le_bytes(),
        _ => {
            buf.fill(POISON_BYTE);
            return;
        }
    };
    if buf.len() < pattern.len() {
        return;
    }
    buf[..pattern.len()].copy_from_slice(pattern);
    // Double the filled prefix with memcpy: a few calls instead of one per element.
    let mut filled = pattern.len();
    while filled < buf.len() {
        let n = filled.min(buf.len() - filled);
        buf.copy_within(..n, filled);
        filled += n;
    }
}

/// Counts elements still holding the poison; returns (count, first few flat indices).
pub fn unwritten(buf: &[u8], dtype: Dtype) -> (u64, Vec<u64>) {
    let size = dtype.size() as usize;
    let mut count = 0u64;
    let mut first = Vec::new();
    for (i, c) in buf.chunks_exact(size).enumerate() {
        let poisoned = match dtype {
            Dtype::F32 => c == POISON_F32.to_le_bytes(),
            Dtype::F64 => c == POISON_F64.to_le_bytes(),
            _ => c.iter().all(|&b| b == POISON_BYTE),
        };
        if poisoned {
            count += 1;
            if first.len() < 8 {
                first.push(i as u64);
            }
        }
    }
    (count, first)
}

/// Element `i` of `buf` as f64.
pub fn get(buf: &[u8], dtype: Dtype, i: usize) -> f64 {
    let s = dtype.size() as usize;
    let c = &buf[i * s..(i + 1) * s];
    let mut b8 = [0u8; 8];
    b8[..s].copy_from_slice(c);
    match dtype {
        Dtype::F32 => f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        Dtype::F64 => f64::from_le_bytes(b8),
        Dtype::I32 => f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        Dtype::I64 => i64::from_le_bytes(b8) as f64,
        Dtype::U8 => f64::from(c[0]),
        Dtype::F16 => f16_to_f64(u16::from_le_bytes([c[0], c[1]])),
        Dtype::Bf16 => f64::from(f32::from_bits(
            u32::from(u16::from_le_bytes([c[0], c[1]])) << 16,
        )),
    }
}

/// An IEEE binary16 value as f64 (the cuda backend's fp16 tensors).
pub fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f64::from(h & 0x3ff);
    match exp {
        0 => sign * man * 2f64.powi(-24),
        0x1f if man == 0.0 => sign * f64::INFINITY,
        0x1f => f64::NAN,
        e => sign * (1.0 + man / 1024.0) * 2f64.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_keyed_and_poison_is_found() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        let seed = |s, p, i, t| tensor_seed(s, p, i, t);
        fill(&mut a, Dtype::F32, SHIFTED, seed(7, "trial", 0, "x")).expect("fill");
        fill(&mut b, Dtype::F32, SHIFTED, seed(7, "trial", 0, "x")).expect("fill");
        assert_eq!(a, b, "same key, same draws");
        for other in [
            seed(8, "trial", 0, "x"),
            seed(7, "trial", 1, "x"),
            seed(7, "trials", 0, "x"),
            seed(7, "trial", 0, "y"),
        ] {
            fill(&mut b, Dtype::F32, SHIFTED, other).expect("fill");
            assert_ne!(a, b, "another seed, set or tensor: other draws");
        }
        // Purpose and tensor name cannot be shifted into one another.
        assert_ne!(seed(7, "ab", 0, "c"), seed(7, "a", 0, "bc"));
        let mean = (0..1024).map(|i| get(&a, Dtype::F32, i)).sum::<f64>() / 1024.0;
        assert!((mean - 1000.0).abs() < 0.05, "{mean}");
        // Exactly what the GPU generator computes.
        let s = seed(7, "trial", 0, "x");
        for i in [0usize, 1, 513, 1023] {
            let want = kiln_gpu::inputs::host_value(&SHIFTED, Dtype::F32, s, i as u64);
            assert_eq!(Ok(get(&a, Dtype::F32, i)), want);
        }
        assert!(fill(&mut a, Dtype::I32, Init::Randint { low: 1, high: 1 }, 0).is_err());
        poison(&mut a, Dtype::F32);
        a[8..12].copy_from_slice(&1.0f32.to_le_bytes());
        let (n, first) = unwritten(&a, Dtype::F32);
        assert_eq!(n, 1023);
        assert_eq!(first[..3], [0, 1, 3]);
        assert_eq!(f16_to_f64(0x3c00), 1.0);
        assert_eq!(f16_to_f64(0xc000), -2.0);
        assert_eq!(f16_to_f64(0x7bff), 65504.0);
        assert_eq!(f16_to_f64(0x0001), 2f64.powi(-24));
        assert!(f16_to_f64(0x7e00).is_nan());
        // Arithmetic on the poison gives a quiet NaN, which does not count as unwritten.
        let q = f32::from_bits(POISON_F32) + 1.0;
        assert_ne!(q.to_bits(), POISON_F32);
    }
}

//! Comparing outputs: error metrics against the reference, bitwise differences between
//! two runs, and the precision tier a candidate delivers.

use kiln_types::verdict::Mismatch;
use kiln_types::{Dtype, ErrorMetrics, PrecisionTier, Tolerance};

use super::data;

/// How many mismatching elements are listed by index.
const FIRST: usize = 8;

/// Error metrics of one output tensor. Non-finite pairs are counted separately; the norms
/// are over the finite pairs.
pub fn metrics(name: &str, got: &[u8], want: &[u8], dtype: Dtype, tol: Tolerance) -> ErrorMetrics {
    let n = got.len() / dtype.size() as usize;
    let mut m = ErrorMetrics {
        tensor: name.to_string(),
        ..ErrorMetrics::default()
    };
    let (mut diff2, mut want2) = (0.0f64, 0.0f64);
    for i in 0..n {
        let (g, w) = (data::get(got, dtype, i), data::get(want, dtype, i));
        let ok = tol.accepts(g, w);
        if !ok {
            m.mismatches += 1;
            if m.first_mismatches.len() < FIRST {
                m.first_mismatches.push(Mismatch {
                    index: i as u64,
                    got: g,
                    want: w,
                });
            }
        }
        if !(g.is_finite() && w.is_finite()) {
            if !ok {
                m.nonfinite_mismatches += 1;
            }
            continue;
        }
        let d = (g - w).abs();
        m.max_abs = m.max_abs.max(d);
        if w != 0.0 {
            m.max_rel = m.max_rel.max(d / w.abs());
        }
        diff2 += d * d;
        want2 += w * w;
    }
    m.rel_l2 = if want2 > 0.0 {
        (diff2 / want2).sqrt()
    } else {
        diff2.sqrt()
    };
    m
}

/// Elements whose bits differ between two runs.
pub fn bitwise_diffs(a: &[u8], b: &[u8], dtype: Dtype) -> u64 {
    let s = dtype.size() as usize;
    a.chunks_exact(s)
        .zip(b.chunks_exact(s))
        .filter(|(x, y)| x != y)
        .count() as u64
}

/// True if and only if every element of `a` is within tolerance of `b` (run-to-run check).
pub fn agree(a: &[u8], b: &[u8], dtype: Dtype, tol: Tolerance) -> bool {
    let n = a.len() / dtype.size() as usize;
    (0..n).all(|i| tol.accepts(data::get(a, dtype, i), data::get(b, dtype, i)))
}

/// The precision tier for a relative L2 error against the f64-accumulating reference.
///
/// Thresholds, in units of each format's unit roundoff u (fp32 u = 6e-8, 10-bit mantissa
/// u = 4.9e-4, bf16 u = 3.9e-3), with headroom for errors that grow with reduction length:
/// - ≤ 1e-5 (about 170 u of fp32, what a 4096-long fp32 reduction can reach): fp32-faithful;
/// - ≤ 1e-3 (about 2 u of a 10-bit mantissa): tf32-like;
/// - ≤ 8e-3 (about 2 u of bf16): bf16-like;
/// - otherwise coarse.
///
/// fp16 and tf32 have the same mantissa, so error alone cannot tell them apart; the host
/// backend reports `tf32-like` for both (`fp16-like` needs range evidence a GPU backend has).
pub fn tier(rel_l2: f64) -> PrecisionTier {
    if rel_l2 <= 1e-5 {
        PrecisionTier::Fp32Faithful
    } else if rel_l2 <= 1e-3 {
        PrecisionTier::Tf32Like
    } else if rel_l2 <= 8e-3 {
        PrecisionTier::Bf16Like
    } else {
        PrecisionTier::Coarse
    }
}

/// The tier once the range trial is known. A kernel whose relative error on inputs scaled
/// by 2^-20 exceeds what a 10-bit mantissa gives (1e-3) and is ten times its error on
/// normal inputs holds values in a format with fp16's range (normal numbers end at 6.1e-5,
/// so small values lose their mantissa bits): at best `fp16-like`. fp32, TF32 and bf16 keep
/// fp32's exponent range and are unaffected.
pub fn tier_with_range(
    normal: PrecisionTier,
    normal_rel_l2: f64,
    range_rel_l2: f64,
) -> PrecisionTier {
    let collapses = range_rel_l2 > 1e-3 && range_rel_l2 > 10.0 * normal_rel_l2.max(1e-7);
    if collapses || range_rel_l2.is_nan() {
        normal.max(PrecisionTier::Fp16Like)
    } else {
        normal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn metrics_name_the_worst_and_nonfinite() {
        let tol = Tolerance {
            atol: 1e-6,
            rtol: 1e-6,
        };
        let want = f32s(&[1.0, 2.0, f32::NAN, 4.0]);
        let got = f32s(&[1.0, 2.5, 0.0, f32::INFINITY]);
        let m = metrics("y", &got, &want, Dtype::F32, tol);
        assert_eq!(m.mismatches, 3);
        assert_eq!(m.nonfinite_mismatches, 2);
        assert_eq!(m.first_mismatches[0].index, 1);
        assert!((m.max_abs - 0.5).abs() < 1e-12);
        assert!(tol.accepts(f64::NAN, f64::NAN));
        assert_eq!(bitwise_diffs(&got, &want, Dtype::F32), 3);
        assert_eq!(tier(3e-4), PrecisionTier::Tf32Like);
    }

    #[test]
    fn range_trial_separates_fp16_from_tf32() {
        use PrecisionTier::*;
        // TF32 (fp32 range): the same error at any scale.
        assert_eq!(tier_with_range(Tf32Like, 3e-4, 3e-4), Tf32Like);
        // fp16 operands: fine at normal scale, subnormal at 2^-20.
        assert_eq!(tier_with_range(Tf32Like, 3e-4, 4e-2), Fp16Like);
        // An fp16 hi/lo split: near fp32 at normal scale, collapses at small ones.
        assert_eq!(tier_with_range(Tf32Like, 1.5e-5, 2e-2), Fp16Like);
        assert_eq!(tier_with_range(Fp32Faithful, 1e-6, 1e-6), Fp32Faithful);
        // Coarser tiers stay as they are.
        assert_eq!(tier_with_range(Coarse, 5e-2, 9e-1), Coarse);
        assert_eq!(tier_with_range(Fp32Faithful, 1e-6, f64::NAN), Fp16Like);
    }
}

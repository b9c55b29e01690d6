//! torch's fills in a lifted forward. A wrapper that allocates its output or a temporary
//! with `torch::zeros` (or calls `fill_` / `zero_`) makes torch launch its own fill kernel
//! before the file's kernels: ATen's `vectorized_elementwise_kernel` over a `FillFunctor`,
//! with the element count, the value and the tensor's address as its three parameters.
//! That launch is no kernel of the file, but what it does is fully known from the
//! recording: set `n` elements of `width` bytes to one bit pattern. The lift keeps it as a
//! launch of a fill kernel kiln writes ([`source`]) and appends to the file's device code,
//! so the lifted plan does the same work, in the same place in the sequence, and is timed
//! with it. Any other library kernel still refuses the lift.

use kiln_types::candidate::Scalar;

use super::LaunchOp;
use super::names;

/// The name expression prefix of the ATen kernel torch fills a contiguous tensor with.
const ATEN_VECTORIZED: &str = "at::native::vectorized_elementwise_kernel<";
/// The functor that makes it a fill.
const ATEN_FILL: &str = "at::native::FillFunctor<";
/// Threads per block of kiln's fill kernels.
const BLOCK: u32 = 256;
/// The most blocks a fill launches (its loop strides over the rest).
const MAX_BLOCKS: u64 = 1 << 16;

/// One of torch's fills, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fill {
    /// Bytes per element: 1, 2, 4 or 8.
    pub width: u32,
    /// Elements set.
    pub elems: u64,
    /// The bit pattern of one element (little-endian, zero-extended).
    pub bits: u64,
    /// The first byte set (the recording's address).
    pub ptr: u64,
}

/// `launches` with each run of consecutive fills that continue one another (the same
/// width and pattern, each starting where the last ended) as one fill: torch splits a
/// fill of a tensor past 2^31 bytes into such pieces (its kernels index in 32 bits).
/// Returns the first launch of each run (or the launch itself) and, beside it, the
/// whole fill.
pub fn merge<'a>(launches: &[&'a LaunchOp]) -> (Vec<&'a LaunchOp>, Vec<Option<Fill>>) {
    let mut kept: Vec<&'a LaunchOp> = Vec::with_capacity(launches.len());
    let mut fills: Vec<Option<Fill>> = Vec::with_capacity(launches.len());
    for l in launches {
        let f = Fill::of(l);
        if let (Some(next), Some(Some(run))) = (f, fills.last_mut()) {
            let end = run
                .elems
                .checked_mul(u64::from(run.width))
                .and_then(|b| run.ptr.checked_add(b));
            if next.width == run.width && next.bits == run.bits && end == Some(next.ptr) {
                run.elems += next.elems;
                continue;
            }
        }
        kept.push(l);
        fills.push(f);
    }
    (kept, fills)
}

impl Fill {
    /// The recorded launch as a fill, when it is ATen's vectorized fill of a contiguous
    /// tensor: parameters `int n` (4 bytes), the functor (the value, `width` bytes) and the
    /// one-pointer array (8 bytes). `None` for anything else.
    pub fn of(l: &LaunchOp) -> Option<Fill> {
        let k = names::kernel_name(&l.symbol)?;
        if !k.expr.starts_with(ATEN_VECTORIZED) || !k.expr.contains(ATEN_FILL) {
            return None;
        }
        let [n, value, ptr] = l.params.as_slice() else {
            return None;
        };
        if n.size != 4 || ptr.size != 8 || !matches!(value.size, 1 | 2 | 4 | 8) {
            return None;
        }
        let n = i32::from_le_bytes(n.bytes().ok()?.try_into().ok()?);
        let mut bits = [0u8; 8];
        let value = value.bytes().ok()?;
        bits[..value.len()].copy_from_slice(&value);
        Some(Fill {
            width: l.params[1].size,
            elems: u64::try_from(n).ok()?,
            bits: u64::from_le_bytes(bits),
            ptr: u64::from_le_bytes(ptr.bytes().ok()?.try_into().ok()?),
        })
    }

    /// Whether `other` (the same fill in the other draw) does the same work: the same
    /// elements, width and pattern (its address is the other draw's).
    pub fn same_work(&self, other: &Fill) -> bool {
        (self.width, self.elems, self.bits) == (other.width, other.elems, other.bits)
    }

    /// Its bytes (saturating: a count no buffer holds).
    pub fn bytes(&self) -> u64 {
        self.elems.saturating_mul(u64::from(self.width))
    }

    /// kiln's fill kernel for this width (an `extern "C"` name in [`source`]).
    pub fn kernel(&self) -> &'static str {
        kernel_for(self.width)
    }

    /// The value argument: `unsigned int` for widths up to 4, `unsigned long long` for 8.
    pub fn value(&self) -> Scalar {
        if self.width == 8 {
            Scalar::U64(self.bits)
        } else {
            // At most 32 bits wide, so this never truncates.
            Scalar::U32(self.bits as u32)
        }
    }

    /// The element count argument (`unsigned long long`).
    pub fn count(&self) -> Scalar {
        Scalar::U64(self.elems)
    }

    /// Grid and block of the launch: one thread per element up to [`MAX_BLOCKS`] blocks,
    /// then each thread strides.
    pub fn config(&self) -> ([u32; 3], [u32; 3]) {
        let blocks = self.elems.div_ceil(u64::from(BLOCK)).clamp(1, MAX_BLOCKS);
        // At most MAX_BLOCKS (2^16), so this never truncates.
        ([blocks as u32, 1, 1], [BLOCK, 1, 1])
    }

    /// How the lift's notes describe it.
    pub fn describe(&self, target: &str) -> String {
        format!(
            "torch's fill of {target} ({} elements of {} bytes, pattern {:#x}) kept as kiln's \
             kernel {}",
            self.elems,
            self.width,
            self.bits,
            self.kernel()
        )
    }
}

/// kiln's fill kernel for elements of `width` bytes (8 for any width over 4).
fn kernel_for(width: u32) -> &'static str {
    match width {
        1 => "kiln_lift_fill_u8",
        2 => "kiln_lift_fill_u16",
        4 => "kiln_lift_fill_u32",
        _ => "kiln_lift_fill_u64",
    }
}

/// The device code of kiln's fill kernels of the given widths, to append to the file's
/// source: one grid-stride loop each, `extern "C"` (their names are the launch names).
pub fn source(widths: &[u32]) -> String {
    let mut out = String::from(
        "\n\n// Added by kiln's lift: torch's fills of this forward, as kernels of the plan.\n",
    );
    for w in [1u32, 2, 4, 8] {
        if !widths.contains(&w) {
            continue;
        }
        let (t, v) = match w {
            1 => ("unsigned char", "unsigned int"),
            2 => ("unsigned short", "unsigned int"),
            4 => ("unsigned int", "unsigned int"),
            _ => ("unsigned long long", "unsigned long long"),
        };
        let name = kernel_for(w);
        out.push_str(&format!(
            "extern \"C\" __global__ void {name}({t}* __restrict__ p, {v} v, unsigned long long n) {{\n\
             \x20   unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;\n\
             \x20   for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)\n\
             \x20       p[i] = ({t})v;\n\
             }}\n"
        ));
    }
    out
}

//! A compiled Triton candidate as kiln stores and ships it: a JSON manifest, then one
//! CUBIN per distinct kernel.
//!
//! ```text
//! b"KILNTRI1" | u32 LE manifest length | manifest JSON | CUBIN 0 | CUBIN 1 | ...
//! ```
//!
//! The manifest says, per kernel, what a launch needs beyond the candidate's own launch
//! plan — the same facts a CUDA C++ artifact's kernel manifest carries (the symbol to
//! load, the parameters appended after the plan's arguments, the dynamic shared memory),
//! plus Triton's: the image it lives in, its warps (block = 32 × warps) and its global
//! scratch per program. And for each launch of the candidate, the kernel it uses.
//!
//! [`Artifact::decode`] checks everything it reads (lengths, ELF magic, indices, bounds):
//! the manifest was written by kiln-worker from the answer of a compile in which
//! candidate code ran inside Triton's compiler.

use serde::{Deserialize, Serialize};

/// The first bytes of a Triton artifact.
pub const MAGIC: &[u8; 8] = b"KILNTRI1";
/// Longest manifest accepted, bytes.
pub const MAX_MANIFEST_BYTES: usize = 1 << 20;
/// Most kernels in one artifact (one per distinct launch specialisation).
pub const MAX_KERNELS: usize = kiln_types::candidate::MAX_LAUNCHES;
/// Largest CUBIN accepted, bytes.
pub const MAX_IMAGE_BYTES: u64 = 64 << 20;
/// Most global scratch one program may ask for, bytes.
pub const MAX_SCRATCH_PER_PROGRAM: u64 = 64 << 20;
/// Largest global scratch alignment kiln can give (its buffers are 256-byte aligned).
pub const MAX_SCRATCH_ALIGN: u64 = 256;
/// Most parameters a Triton version appends after the kernel's own (3.5+: global scratch,
/// profile scratch).
pub const MAX_TRAILING_PARAMS: u32 = 2;

/// What the launcher needs to know about one compiled kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelEntry {
    /// The `@triton.jit` function it was compiled from.
    pub function: String,
    /// The entry symbol in its image.
    pub symbol: String,
    /// Index of its image.
    pub image: usize,
    /// Warps per program as compiled (block = 32 × this).
    pub num_warps: u32,
    /// Dynamic shared memory every launch needs, bytes.
    pub shared_bytes: u32,
    /// The function's own (non-constexpr) parameters.
    pub user_params: u32,
    /// Pointer parameters Triton appends after them: first the global scratch, then the
    /// profile scratch (none before 3.3, one in 3.3–3.4, two from 3.5).
    pub trailing_params: u32,
    /// Global scratch per program, bytes (0: the pointer is null).
    pub global_scratch_bytes: u64,
    /// Its alignment, bytes.
    pub global_scratch_align: u64,
}

/// The manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The Triton version that compiled the kernels.
    pub triton_version: String,
    /// The GPU architecture they were compiled for (`sm_90`).
    pub arch: String,
    /// Byte length of each CUBIN, in order.
    pub images: Vec<u64>,
    /// The kernels.
    pub kernels: Vec<KernelEntry>,
    /// For each launch of the candidate, the index of its kernel.
    pub launches: Vec<usize>,
}

/// A Triton artifact read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The manifest.
    pub manifest: Manifest,
    /// The CUBINs, as the manifest lists them.
    pub images: Vec<Vec<u8>>,
}

fn is_elf(b: &[u8]) -> bool {
    b.starts_with(b"\x7fELF")
}

impl Manifest {
    /// Checks the manifest on its own: counts, indices and bounds.
    pub fn check(&self) -> Result<(), String> {
        if self.kernels.is_empty() || self.kernels.len() > MAX_KERNELS {
            return Err(format!("{} kernels", self.kernels.len()));
        }
        if self.images.len() != self.kernels.len() {
            return Err("one image per kernel expected".into());
        }
        if self.images.iter().any(|&n| n == 0 || n > MAX_IMAGE_BYTES) {
            return Err("an image is empty or too large".into());
        }
        for (i, k) in self.kernels.iter().enumerate() {
            let bad = |why: &str| Err(format!("kernel {i} ({}): {why}", k.function));
            if !kiln_types::candidate::is_identifier(&k.symbol) {
                return bad("its symbol is not an identifier");
            }
            if k.image >= self.images.len() {
                return bad("no such image");
            }
            if k.num_warps == 0 || k.num_warps > kiln_types::candidate::MAX_NUM_WARPS {
                return bad("warps out of range");
            }
            if k.trailing_params > MAX_TRAILING_PARAMS {
                return bad("too many trailing parameters");
            }
            if k.user_params as usize > kiln_types::candidate::MAX_ARGS {
                return bad("too many parameters");
            }
            if k.global_scratch_bytes > MAX_SCRATCH_PER_PROGRAM {
                return bad("too much global scratch");
            }
            if k.global_scratch_bytes > 0 && k.trailing_params == 0 {
                return bad("global scratch without a parameter for it");
            }
            if !k.global_scratch_align.is_power_of_two()
                || k.global_scratch_align > MAX_SCRATCH_ALIGN
            {
                return bad("global scratch alignment kiln cannot give");
            }
        }
        if self.launches.iter().any(|&k| k >= self.kernels.len()) {
            return Err("a launch names no kernel".into());
        }
        Ok(())
    }
}

impl Artifact {
    /// The bytes stored and shipped.
    pub fn encode(&self) -> Vec<u8> {
        let manifest = serde_json::to_vec(&self.manifest).unwrap_or_default();
        let total: usize = self.images.iter().map(Vec::len).sum();
        let mut out = Vec::with_capacity(12 + manifest.len() + total);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(manifest.len() as u32).to_le_bytes());
        out.extend_from_slice(&manifest);
        for image in &self.images {
            out.extend_from_slice(image);
        }
        out
    }

    /// Reads and checks an artifact.
    pub fn decode(bytes: &[u8]) -> Result<Artifact, String> {
        let bad = |m: &str| format!("malformed triton artifact: {m}");
        let rest = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| bad("no KILNTRI1 header"))?;
        let len: [u8; 4] = rest
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| bad("no manifest length"))?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_MANIFEST_BYTES {
            return Err(bad("manifest too large"));
        }
        let json = rest
            .get(4..4 + len)
            .ok_or_else(|| bad("manifest cut short"))?;
        let manifest: Manifest =
            serde_json::from_slice(json).map_err(|e| bad(&format!("manifest: {e}")))?;
        manifest.check().map_err(|e| bad(&e))?;
        let mut body = &rest[4 + len..];
        let mut images = Vec::with_capacity(manifest.images.len());
        for &n in &manifest.images {
            let n = n as usize;
            if body.len() < n {
                return Err(bad("an image is cut short"));
            }
            let (image, tail) = body.split_at(n);
            if !is_elf(image) {
                return Err(bad("an image is not a CUBIN (ELF)"));
            }
            images.push(image.to_vec());
            body = tail;
        }
        if !body.is_empty() {
            return Err(bad("bytes after the last image"));
        }
        Ok(Artifact { manifest, images })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Artifact {
        Artifact {
            manifest: Manifest {
                triton_version: "3.6.0".into(),
                arch: "sm_90".into(),
                images: vec![8, 9],
                kernels: vec![
                    KernelEntry {
                        function: "k".into(),
                        symbol: "k".into(),
                        image: 0,
                        num_warps: 4,
                        shared_bytes: 16,
                        user_params: 3,
                        trailing_params: 2,
                        global_scratch_bytes: 0,
                        global_scratch_align: 1,
                    },
                    KernelEntry {
                        function: "k".into(),
                        symbol: "k".into(),
                        image: 1,
                        num_warps: 8,
                        shared_bytes: 0,
                        user_params: 3,
                        trailing_params: 2,
                        global_scratch_bytes: 128,
                        global_scratch_align: 128,
                    },
                ],
                launches: vec![0, 1, 0],
            },
            images: vec![b"\x7fELF0123".to_vec(), b"\x7fELF45678".to_vec()],
        }
    }

    #[test]
    fn round_trips() {
        let a = sample();
        assert_eq!(Artifact::decode(&a.encode()), Ok(a));
    }

    #[test]
    fn malformed_artifacts_are_refused_with_a_reason() {
        let good = sample().encode();
        let mut wrong_kernel = sample();
        wrong_kernel.manifest.launches[1] = 7;
        let mut wide = sample();
        wide.manifest.kernels[0].num_warps = 64;
        let mut align = sample();
        align.manifest.kernels[1].global_scratch_align = 4096;
        let mut not_elf = sample();
        not_elf.images[1] = b"notanelf!".to_vec();
        let mut symbol = sample();
        symbol.manifest.kernels[0].symbol = "k; rm".into();
        for (bytes, needle) in [
            (good[..6].to_vec(), "header"),
            (good[..good.len() - 1].to_vec(), "cut short"),
            ([good.as_slice(), b"x"].concat(), "after the last image"),
            (wrong_kernel.encode(), "names no kernel"),
            (wide.encode(), "warps"),
            (align.encode(), "alignment"),
            (not_elf.encode(), "not a CUBIN"),
            (symbol.encode(), "symbol"),
            (
                [MAGIC.as_slice(), &u32::MAX.to_le_bytes()].concat(),
                "too large",
            ),
        ] {
            let e = Artifact::decode(&bytes).expect_err(needle);
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }
}

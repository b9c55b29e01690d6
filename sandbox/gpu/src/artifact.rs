//! The compiled artifact as kiln stores and ships it: a small JSON manifest (the image
//! kind, and for each kernel the plan names, the symbol to load and what its launches
//! need besides the plan's own fields), then the CUBIN or PTX image.
//!
//! ```text
//! b"KILNMOD1" | u32 LE manifest length | manifest JSON | image bytes
//! ```
//!
//! The manifest is how a kernel named by C++ name expression (`softmax<256, float>`)
//! reaches the worker that loads the module: the compile resolves it to its lowered name
//! (`_Z7softmaxILi256EfEvPT0_`), and the loader asks the driver for that symbol. Another
//! language's compiler (Triton) fills the same manifest: its kernel's symbol, the trailing
//! pointer parameters its ABI adds, the dynamic shared memory and cluster shape it was
//! compiled for.
//!
//! A plain CUBIN (ELF) or PTX image without the header — what kiln stored before the
//! manifest existed — still decodes, with an empty manifest: every kernel name is then its
//! own symbol, as it was.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::nvrtc::{CompiledModule, ImageKind};

/// The first bytes of an artifact with a manifest.
pub const MAGIC: &[u8; 8] = b"KILNMOD1";

/// Longest manifest accepted, bytes.
pub const MAX_MANIFEST_BYTES: usize = 1 << 20;

/// What the loader and the launcher need to know about one kernel beyond the launch plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelEntry {
    /// The symbol in the image (the lowered name of a C++ name expression).
    pub symbol: String,
    /// Null pointer parameters appended after the plan's arguments (Triton's scratch
    /// pointers); 0 for CUDA C++.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub trailing_null_params: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The manifest: the image kind and the kernels by the name the plan uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// What the image holds.
    pub image: ImageKind,
    /// Kernels by launch name. A name not listed is looked up as a symbol of its own.
    #[serde(default)]
    pub kernels: BTreeMap<String, KernelEntry>,
}

/// An artifact read back: its manifest and image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The manifest.
    pub manifest: Manifest,
    /// CUBIN bytes, or PTX text with its trailing NUL.
    pub image: Vec<u8>,
}

/// An artifact that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ArtifactError {
    /// The header or manifest is cut short or malformed.
    #[error("malformed artifact: {0}")]
    Malformed(String),
}

impl Artifact {
    /// An artifact of `module` with the given kernels.
    pub fn new(module: &CompiledModule, kernels: BTreeMap<String, KernelEntry>) -> Artifact {
        Artifact {
            manifest: Manifest {
                image: module.kind,
                kernels,
            },
            image: module.image.clone(),
        }
    }

    /// The bytes stored and shipped.
    pub fn encode(&self) -> Vec<u8> {
        let manifest = serde_json::to_vec(&self.manifest).unwrap_or_default();
        let mut out = Vec::with_capacity(12 + manifest.len() + self.image.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(manifest.len() as u32).to_le_bytes());
        out.extend_from_slice(&manifest);
        out.extend_from_slice(&self.image);
        out
    }

    /// Reads an artifact: one with a manifest, or a bare CUBIN (ELF) / PTX image.
    pub fn decode(bytes: &[u8]) -> Result<Artifact, ArtifactError> {
        let Some(rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
            let kind = if bytes.starts_with(b"\x7fELF") {
                ImageKind::Cubin
            } else {
                ImageKind::Ptx
            };
            return Ok(Artifact {
                manifest: Manifest {
                    image: kind,
                    kernels: BTreeMap::new(),
                },
                image: ptx_terminated(bytes.to_vec(), kind),
            });
        };
        let bad = |m: &str| ArtifactError::Malformed(m.to_string());
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
        let manifest: Manifest = serde_json::from_slice(json)
            .map_err(|e| ArtifactError::Malformed(format!("manifest: {e}")))?;
        let image = rest[4 + len..].to_vec();
        if image.is_empty() {
            return Err(bad("no image"));
        }
        if manifest.image == ImageKind::Cubin && !image.starts_with(b"\x7fELF") {
            return Err(bad("the CUBIN image is not an ELF file"));
        }
        let image = ptx_terminated(image, manifest.image);
        Ok(Artifact { manifest, image })
    }

    /// The module the loader takes, for `arch`.
    pub fn module(&self, arch: &str) -> CompiledModule {
        CompiledModule {
            image: self.image.clone(),
            kind: self.manifest.image,
            arch: arch.to_string(),
            log: String::new(),
            options: Vec::new(),
            duration_ms: 0.0,
        }
    }

    /// The entry for launch name `name`: the manifest's, or the name as its own symbol.
    pub fn kernel(&self, name: &str) -> KernelEntry {
        self.manifest
            .kernels
            .get(name)
            .cloned()
            .unwrap_or_else(|| KernelEntry {
                symbol: name.to_string(),
                ..KernelEntry::default()
            })
    }
}

fn ptx_terminated(mut image: Vec<u8>, kind: ImageKind) -> Vec<u8> {
    if kind == ImageKind::Ptx && image.last() != Some(&0) {
        image.push(0);
    }
    image
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cubin() -> CompiledModule {
        CompiledModule {
            image: b"\x7fELF rest of a cubin".to_vec(),
            kind: ImageKind::Cubin,
            arch: "sm_90".into(),
            log: String::new(),
            options: Vec::new(),
            duration_ms: 0.0,
        }
    }

    #[test]
    fn manifest_round_trips_and_names_resolve_through_it() {
        let mut kernels = BTreeMap::new();
        kernels.insert(
            "softmax<256, float>".to_string(),
            KernelEntry {
                symbol: "_Z7softmaxILi256EfEvPT0_".into(),
                trailing_null_params: 0,
            },
        );
        let a = Artifact::new(&cubin(), kernels);
        let back = Artifact::decode(&a.encode()).expect("decodes");
        assert_eq!(back, a);
        assert_eq!(
            back.kernel("softmax<256, float>").symbol,
            "_Z7softmaxILi256EfEvPT0_"
        );
        assert_eq!(back.kernel("plain_c").symbol, "plain_c");
        assert_eq!(back.module("sm_90").kind, ImageKind::Cubin);
    }

    #[test]
    fn bare_images_from_before_the_manifest_still_load() {
        let a = Artifact::decode(b"\x7fELF old cubin").expect("cubin");
        assert_eq!(a.manifest.image, ImageKind::Cubin);
        assert!(a.manifest.kernels.is_empty());
        assert_eq!(a.kernel("k").symbol, "k");
        let p = Artifact::decode(b".version 8.0").expect("ptx");
        assert_eq!(p.manifest.image, ImageKind::Ptx);
        assert_eq!(p.image.last(), Some(&0));
    }

    #[test]
    fn malformed_artifacts_are_errors() {
        let good = Artifact::new(&cubin(), BTreeMap::new()).encode();
        for bad in [
            &good[..10],
            &good[..14],
            &[MAGIC.as_slice(), &u32::MAX.to_le_bytes()].concat()[..],
            &[MAGIC.as_slice(), &2u32.to_le_bytes(), b"{}", b"\x7fELF"].concat()[..],
            &[
                MAGIC.as_slice(),
                &17u32.to_le_bytes(),
                br#"{"image":"cubin"}"#,
                b"not elf",
            ]
            .concat()[..],
        ] {
            assert!(Artifact::decode(bad).is_err(), "{bad:?}");
        }
    }
}

//! A hosted file's artifact: the file as written, and the `load_inline` libraries its
//! compile step built ([`super::build`]).
//!
//! Layout: [`MAGIC`], a u32 little-endian header length, the header (JSON:
//! `{"source": bytes, "device": bytes, "libs": [{"key", "name", "bytes"}]}`), then the
//! source, the device sources (`kiln_hosted.py device-source`'s JSON, read from the file's
//! text without running it: what lifting takes its device code from; `device` 0 when
//! there are none) and each library's bytes in order. An artifact without the magic is
//! the file alone (what a file that names no `load_inline`, or an older kiln, stored). Every length and name is
//! checked before anything is written: the artifact comes from a jail that ran the
//! candidate's python.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The first bytes of an artifact with libraries.
pub const MAGIC: &[u8; 12] = b"KILNHOSTED1\n";
/// The longest header read.
const MAX_HEADER: usize = 64 << 10;

/// One library a `load_inline` call built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lib {
    /// The hash of the call's arguments (32 lowercase hex digits).
    pub key: String,
    /// The extension's name (its file is `<name>.so`).
    pub name: String,
    /// The library.
    pub bytes: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    source: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    device: u64,
    libs: Vec<LibHeader>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LibHeader {
    key: String,
    name: String,
    bytes: u64,
}

/// A key as the runner makes them: 32 lowercase hex digits.
pub fn valid_key(key: &str) -> bool {
    key.len() == 32 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A library name that is one plain file name: letters, digits, `_`, `-`, `.`, not
/// starting with `.`, at most 120 bytes.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 120
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// A prebuilt library's file name in the runner's `prebuilt` folder (the runner script's
/// `prebuilt_name` says the same).
pub fn prebuilt_name(key: &str, name: &str) -> String {
    format!("kiln-prebuilt-{key}-{name}.so")
}

/// The artifact of `source` with `libs` and the file's device sources `device` (the
/// file alone when there are neither).
pub fn pack(source: &str, libs: &[Lib], device: &str) -> Vec<u8> {
    if libs.is_empty() && device.is_empty() {
        return source.as_bytes().to_vec();
    }
    let header = Header {
        source: source.len() as u64,
        device: device.len() as u64,
        libs: libs
            .iter()
            .map(|l| LibHeader {
                key: l.key.clone(),
                name: l.name.clone(),
                bytes: l.bytes.len() as u64,
            })
            .collect(),
    };
    let header = serde_json::to_vec(&header).expect("a header of strings and numbers");
    let mut out = Vec::with_capacity(
        MAGIC.len()
            + 4
            + header.len()
            + source.len()
            + device.len()
            + libs.iter().map(|l| l.bytes.len()).sum::<usize>(),
    );
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(source.as_bytes());
    out.extend_from_slice(device.as_bytes());
    for l in libs {
        out.extend_from_slice(&l.bytes);
    }
    out
}

/// An artifact read back.
#[derive(Debug)]
pub struct Unpacked<'a> {
    /// The file as written.
    pub source: &'a str,
    /// The file's device sources as `kiln_hosted.py device-source` read them (JSON;
    /// empty when the compile step made none).
    pub device: &'a str,
    /// The libraries: (key, name, bytes).
    pub libs: Vec<(String, String, &'a [u8])>,
}

/// Reads an artifact; `Err` says what is wrong with it.
pub fn unpack(bytes: &[u8]) -> Result<Unpacked<'_>, String> {
    let Some(rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
        let source = std::str::from_utf8(bytes).map_err(|e| format!("hosted artifact: {e}"))?;
        return Ok(Unpacked {
            source,
            device: "",
            libs: Vec::new(),
        });
    };
    let bad = |why: &str| format!("hosted artifact: {why}");
    let (len, rest) = rest
        .split_at_checked(4)
        .ok_or_else(|| bad("no header length"))?;
    let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
    if len > MAX_HEADER {
        return Err(bad("header too long"));
    }
    let (header, mut body) = rest
        .split_at_checked(len)
        .ok_or_else(|| bad("header cut short"))?;
    let header: Header =
        serde_json::from_slice(header).map_err(|e| bad(&format!("header: {e}")))?;
    let mut take = |n: u64| -> Result<&[u8], String> {
        let n = usize::try_from(n).map_err(|_| bad("length"))?;
        let (head, tail) = body.split_at_checked(n).ok_or_else(|| bad("cut short"))?;
        body = tail;
        Ok(head)
    };
    let source = std::str::from_utf8(take(header.source)?).map_err(|e| bad(&e.to_string()))?;
    let device = std::str::from_utf8(take(header.device)?).map_err(|e| bad(&e.to_string()))?;
    let mut libs = Vec::with_capacity(header.libs.len().min(64));
    for l in header.libs {
        if !valid_key(&l.key) || !valid_name(&l.name) {
            return Err(bad(&format!("library {:?}/{:?}", l.key, l.name)));
        }
        let b = take(l.bytes)?;
        libs.push((l.key, l.name, b));
    }
    if !body.is_empty() {
        return Err(bad("bytes after the last library"));
    }
    Ok(Unpacked {
        source,
        device,
        libs,
    })
}

impl Unpacked<'_> {
    /// Writes the libraries into `dir` (the runner's `prebuilt` folder: the job's
    /// scratch; the evaluating worker may not make folders) as [`prebuilt_name`]s;
    /// `None` when there are none.
    pub fn write_libs(&self, dir: &Path) -> Result<Option<PathBuf>, String> {
        if self.libs.is_empty() {
            return Ok(None);
        }
        for (key, name, bytes) in &self.libs {
            std::fs::write(dir.join(prebuilt_name(key, name)), bytes)
                .map_err(|e| format!("cannot write the file's prebuilt {name}.so: {e}"))?;
        }
        Ok(Some(dir.to_path_buf()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lib(key: &str, name: &str, bytes: &[u8]) -> Lib {
        Lib {
            key: key.into(),
            name: name.into(),
            bytes: bytes.to_vec(),
        }
    }

    const K1: &str = "0123456789abcdef0123456789abcdef";
    const K2: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn a_file_and_its_libraries_come_back_as_packed() {
        let src = "import torch\n# ünïcode\n";
        let libs = [lib(K1, "relu_cuda", b"\x7fELF one"), lib(K2, "ops", b"")];
        let packed = pack(src, &libs, "");
        let u = unpack(&packed).expect("unpacks");
        assert_eq!(u.source, src);
        assert_eq!(u.device, "");
        assert_eq!(
            u.libs,
            vec![
                (
                    K1.to_string(),
                    "relu_cuda".to_string(),
                    b"\x7fELF one".as_slice()
                ),
                (K2.to_string(), "ops".to_string(), b"".as_slice()),
            ]
        );
        let d = tempfile::tempdir().expect("tmp");
        let at = u.write_libs(d.path()).expect("writes").expect("a folder");
        assert_eq!(
            std::fs::read(at.join(prebuilt_name(K1, "relu_cuda"))).expect("read"),
            b"\x7fELF one"
        );
    }

    #[test]
    fn device_sources_come_back_with_or_without_libraries() {
        let device = r#"{"error": null, "sources": [{"source": "__global__ void k() {}"}]}"#;
        for libs in [vec![], vec![lib(K1, "ops", b"\x7fELF")]] {
            let packed = pack("import torch\n", &libs, device);
            let u = unpack(&packed).expect("unpacks");
            assert_eq!((u.source, u.device), ("import torch\n", device));
            assert_eq!(u.libs.len(), libs.len());
        }
    }

    #[test]
    fn a_file_alone_is_its_own_artifact() {
        assert_eq!(pack("x = 1\n", &[], ""), b"x = 1\n");
        let u = unpack(b"x = 1\n").expect("plain source");
        assert_eq!((u.source, u.libs.len()), ("x = 1\n", 0));
        let d = tempfile::tempdir().expect("tmp");
        assert_eq!(u.write_libs(d.path()).expect("nothing to write"), None);
        assert!(unpack(b"\xff\xfe").is_err(), "not UTF-8");
    }

    #[test]
    fn a_damaged_or_hostile_artifact_is_refused() {
        let good = pack("src", &[lib(K1, "ops", b"abc")], r#"{"sources": []}"#);
        // Cut anywhere after the magic: refused, never a panic.
        for n in MAGIC.len()..good.len() {
            assert!(unpack(&good[..n]).is_err(), "cut at {n}");
        }
        let mut extra = good.clone();
        extra.push(0);
        assert!(unpack(&extra).is_err(), "trailing bytes");
        for (key, name) in [
            ("../../etc", "ops"),
            (K1, "../x"),
            (K1, ".hidden"),
            (K1, "a/b"),
            ("0123456789ABCDEF0123456789ABCDEF", "ops"),
        ] {
            let l = Lib {
                key: key.into(),
                name: name.into(),
                bytes: b"x".to_vec(),
            };
            assert!(unpack(&pack("s", &[l], "")).is_err(), "{key}/{name}");
        }
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(unpack(&huge).is_err(), "header length");
        let mut lying = MAGIC.to_vec();
        let header = br#"{"source":18446744073709551615,"libs":[]}"#;
        lying.extend_from_slice(&(header.len() as u32).to_le_bytes());
        lying.extend_from_slice(header);
        assert!(unpack(&lying).is_err(), "a length past the end");
    }
}

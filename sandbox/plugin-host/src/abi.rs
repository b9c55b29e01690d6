//! The plugin's ABI version: reading the `kiln:abi-version` custom section and checking
//! it against the versions this host can run, before anything is compiled.
//!
//! The SDK's `export_proposer!` writes the section: six bytes, the major, minor and patch
//! version as big-endian `u16`s (the scheme of Zed's `zed:api-version`). A plugin built
//! without it, or for an ABI this host does not have, is refused with a message that
//! says which ABI it needs.

use thiserror::Error;
use wasmparser::{Encoding, Parser, Payload};

/// Name of the custom section carrying the ABI version.
pub const ABI_SECTION: &str = "kiln:abi-version";

/// Largest plugin accepted, in bytes.
pub const MAX_PLUGIN_BYTES: usize = 64 << 20;

/// An ABI version, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AbiVersion {
    /// Major version.
    pub major: u16,
    /// Minor version.
    pub minor: u16,
    /// Patch version.
    pub patch: u16,
}

impl std::fmt::Display for AbiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The ABIs this host runs, oldest first: every `0.1.x` is served by the
/// `since_v0.1.0` WIT (patch releases only add documentation).
pub const SUPPORTED: &[(AbiVersion, AbiVersion)] = &[(
    AbiVersion {
        major: 0,
        minor: 1,
        patch: 0,
    },
    AbiVersion {
        major: 0,
        minor: 1,
        patch: u16::MAX,
    },
)];

/// Why a plugin's bytes were refused before compilation.
#[derive(Debug, Error)]
pub enum AbiError {
    /// The file is larger than [`MAX_PLUGIN_BYTES`].
    #[error("plugin is {0} bytes; the limit is {MAX_PLUGIN_BYTES}")]
    TooLarge(usize),
    /// The bytes are not valid WebAssembly.
    #[error("not a valid WebAssembly binary: {0}")]
    Malformed(String),
    /// A core module rather than a component.
    #[error(
        "plugin is a core wasm module, not a component: build it with `--target wasm32-wasip2`"
    )]
    NotAComponent,
    /// No `kiln:abi-version` section.
    #[error(
        "plugin has no `{ABI_SECTION}` section: build it with kiln-sdk's `export_proposer!` (or write the section yourself)"
    )]
    MissingVersion,
    /// The section is present more than once with different values, or is not 6 bytes.
    #[error("plugin's `{ABI_SECTION}` section is malformed: {0}")]
    BadVersion(String),
    /// A version this host does not run.
    #[error("plugin needs ABI {0}; this host runs {supported}", supported = supported_text())]
    Unsupported(AbiVersion),
}

fn supported_text() -> String {
    SUPPORTED
        .iter()
        .map(|(lo, hi)| {
            if hi.patch == u16::MAX {
                format!("{}.{}.x", lo.major, lo.minor)
            } else {
                format!("{lo}..={hi}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads and checks the ABI version of a plugin.
///
/// Every payload is parsed first, nested modules included, so that malformed bytes
/// become an error here rather than a panic deeper in wasmtime (Zed's extension host
/// does the same for the same reason).
pub fn check(bytes: &[u8]) -> Result<AbiVersion, AbiError> {
    if bytes.len() > MAX_PLUGIN_BYTES {
        return Err(AbiError::TooLarge(bytes.len()));
    }
    let mut found: Option<AbiVersion> = None;
    let mut first = true;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| AbiError::Malformed(e.to_string()))?;
        match payload {
            Payload::Version { encoding, .. } if first && encoding != Encoding::Component => {
                return Err(AbiError::NotAComponent);
            }
            Payload::CustomSection(reader) if reader.name() == ABI_SECTION => {
                let data = reader.data();
                let v: [u8; 6] = data.try_into().map_err(|_| {
                    AbiError::BadVersion(format!("{} bytes, expected 6", data.len()))
                })?;
                let v = AbiVersion {
                    major: u16::from_be_bytes([v[0], v[1]]),
                    minor: u16::from_be_bytes([v[2], v[3]]),
                    patch: u16::from_be_bytes([v[4], v[5]]),
                };
                if found.is_some_and(|f| f != v) {
                    return Err(AbiError::BadVersion(format!(
                        "two different versions, {} and {v}",
                        found.map(|f| f.to_string()).unwrap_or_default()
                    )));
                }
                found = Some(v);
            }
            _ => {}
        }
        first = false;
    }
    let v = found.ok_or(AbiError::MissingVersion)?;
    if SUPPORTED.iter().any(|(lo, hi)| *lo <= v && v <= *hi) {
        Ok(v)
    } else {
        Err(AbiError::Unsupported(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(matches!(check(b"not wasm"), Err(AbiError::Malformed(_))));
        assert!(matches!(check(&[]), Err(AbiError::Malformed(_))));
        // A truncated component header.
        assert!(matches!(
            check(&[0, b'a', b's', b'm', 0x0d, 0, 1, 0, 0x00]),
            Err(AbiError::Malformed(_))
        ));
    }

    #[test]
    fn core_module_is_refused() {
        let core = [0, b'a', b's', b'm', 1, 0, 0, 0];
        assert!(matches!(check(&core), Err(AbiError::NotAComponent)));
    }

    fn component_with(section: Option<&[u8]>) -> Vec<u8> {
        let mut b = vec![0, b'a', b's', b'm', 0x0d, 0, 1, 0];
        if let Some(data) = section {
            let name = ABI_SECTION.as_bytes();
            let body_len = 1 + name.len() + data.len();
            b.push(0); // custom section id
            b.push(u8::try_from(body_len).expect("small"));
            b.push(u8::try_from(name.len()).expect("small"));
            b.extend_from_slice(name);
            b.extend_from_slice(data);
        }
        b
    }

    #[test]
    fn version_section_is_read_and_checked() {
        assert_eq!(
            check(&component_with(Some(&[0, 0, 0, 1, 0, 3]))).expect("0.1.3 runs"),
            AbiVersion {
                major: 0,
                minor: 1,
                patch: 3
            }
        );
        assert!(matches!(
            check(&component_with(None)),
            Err(AbiError::MissingVersion)
        ));
        let e = check(&component_with(Some(&[0, 0, 0, 2, 0, 0]))).expect_err("0.2 is not here");
        assert!(matches!(e, AbiError::Unsupported(_)));
        assert!(
            e.to_string().contains("0.2.0") && e.to_string().contains("0.1.x"),
            "{e}"
        );
        assert!(matches!(
            check(&component_with(Some(&[0, 1]))),
            Err(AbiError::BadVersion(_))
        ));
    }
}

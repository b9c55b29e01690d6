//! The backends kiln evaluates candidates on, by name: one enum in place of the strings
//! `"host"` and `"cuda"` (see docs/architecture.md, "Glossary").
//!
//! A backend evaluates candidates of some languages on one kind of device: `host` runs C
//! on the CPU, `cuda` runs CUDA C++ and Triton on NVIDIA GPUs. On the wire (JSON, the
//! store, problem files) a backend is its lowercase name; records keep it as text, so a
//! name written by another version still reads.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A backend (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// CUDA C++ and Triton candidates on NVIDIA GPUs, one lane per GPU.
    Cuda,
    /// C candidates on the CPU, one lane.
    Host,
}

/// A backend name kiln does not know.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown backend {0:?} (known: cuda, host)")]
pub struct UnknownBackend(pub String);

impl BackendKind {
    /// Every backend, in the order kiln lists them.
    pub const ALL: [BackendKind; 2] = [BackendKind::Cuda, BackendKind::Host];

    /// Backends as a list for people (`cuda, host`).
    pub fn list(backends: &[BackendKind]) -> String {
        backends
            .iter()
            .map(|b| b.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The backend's name on the wire (`cuda`, `host`).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Host => "host",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BackendKind {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BackendKind::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| UnknownBackend(s.to_string()))
    }
}

impl From<BackendKind> for String {
    fn from(b: BackendKind) -> String {
        b.as_str().to_string()
    }
}

/// A record's backend text against a backend (`evaluation.backend == BackendKind::Cuda`).
impl PartialEq<BackendKind> for str {
    fn eq(&self, other: &BackendKind) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<BackendKind> for String {
    fn eq(&self, other: &BackendKind) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<BackendKind> for &str {
    fn eq(&self, other: &BackendKind) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<str> for BackendKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for BackendKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for BackendKind {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for b in BackendKind::ALL {
            assert_eq!(b.as_str().parse::<BackendKind>(), Ok(b));
            assert_eq!(serde_json::to_value(b).expect("json"), b.as_str());
            assert_eq!(b.to_string(), b.as_str());
        }
        assert_eq!(
            "gpu".parse::<BackendKind>(),
            Err(UnknownBackend("gpu".into()))
        );
        assert!(serde_json::from_str::<BackendKind>("\"Cuda\"").is_err());
        let (cuda, host) = (String::from("cuda"), String::from("host"));
        assert!(cuda == BackendKind::Cuda && host != BackendKind::Cuda);
        assert!("host" != BackendKind::Cuda);
        assert!(BackendKind::Host == "host" && BackendKind::Host != cuda);
    }
}

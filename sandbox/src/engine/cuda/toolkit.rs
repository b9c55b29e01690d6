//! Where the CUDA toolkit's headers are: the include folders cuda compiles get, bound
//! read-only into the compile jail at fixed paths ([`INCLUDE_MOUNT`]`/0`, `/1`, …) and
//! passed to NVRTC with `-I` (each with its `cccl/` sub-folder, where CUDA 13 keeps
//! CCCL: cub, libcu++, Thrust).
//!
//! [`discover`] takes the folders configured (`[cuda] include_dirs`) or, when none are,
//! the first toolkit found in this order: `$CUDA_HOME/include`, `/usr/local/cuda/include`,
//! then the `nvidia` folders of python's wheels (`cu13/include` as torch's CUDA 13 wheels
//! lay it out; `cuda_runtime/include` + `cuda_cccl/include` + `cuda_nvrtc/include` for the
//! CUDA 12 layout). One toolkit only: headers of two versions are never mixed. The result
//! says where it looked, the headers' CUDA version (from `cuda.h`'s `CUDA_VERSION`), and an
//! identity string for the compile cache's key.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where the include folders appear inside the compile jail.
pub const INCLUDE_MOUNT: &str = "/kiln/include";

/// The toolkit headers kiln compiles cuda candidates with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolkitHeaders {
    /// The include folders, in `-I` order (host paths, resolved); empty when none was found.
    pub dirs: Vec<PathBuf>,
    /// The headers' CUDA version (`13.0`), when `cuda.h` says.
    pub version: Option<String>,
    /// Every place looked at, in order, and what was there.
    pub searched: Vec<Searched>,
}

/// One place [`discover`] looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Searched {
    /// The folder.
    pub path: PathBuf,
    /// Whether it is used.
    pub used: bool,
    /// What was found there, in words.
    pub note: String,
}

/// A folder holds toolkit headers if it has one of these.
const MARKERS: &[&str] = &["cuda_runtime.h", "cuda_fp16.h"];

/// A file every complete toolkit has under `crt/` (see [`ToolkitHeaders::gaps`]).
const CRT_MARKER: &str = "crt/host_defines.h";

/// Files whose size and modification time stand for the header set in its identity.
const IDENTITY_FILES: &[&str] = &[
    "cuda.h",
    "cuda_runtime_api.h",
    "cuda_fp16.hpp",
    "crt/host_defines.h",
    "cccl/cuda/std/__cccl/version.h",
    "cuda/std/__cccl/version.h",
];

fn has_headers(dir: &Path) -> bool {
    MARKERS.iter().any(|m| dir.join(m).is_file())
}

fn resolved(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Finds the toolkit headers (see the module docs). `configured`: `[cuda] include_dirs`;
/// `cuda_home`: `$CUDA_HOME`; `wheel_roots`: python `nvidia` package folders.
pub fn discover(
    configured: &[PathBuf],
    cuda_home: Option<&Path>,
    default_root: &Path,
    wheel_roots: &[PathBuf],
) -> ToolkitHeaders {
    let mut searched = Vec::new();
    if !configured.is_empty() {
        let mut dirs = Vec::new();
        for d in configured {
            let ok = d.is_absolute() && d.is_dir();
            searched.push(Searched {
                path: d.clone(),
                used: ok,
                note: if !d.is_absolute() {
                    "not an absolute path".into()
                } else if !ok {
                    "not a directory".into()
                } else if has_headers(d) {
                    "configured".into()
                } else {
                    "configured (no cuda_runtime.h in it)".into()
                },
            });
            if ok {
                let r = resolved(d);
                if !dirs.contains(&r) {
                    dirs.push(r);
                }
            }
        }
        let version = dirs.iter().find_map(|d| version_of(d));
        return ToolkitHeaders {
            dirs,
            version,
            searched,
        };
    }
    let mut groups: Vec<Vec<PathBuf>> = Vec::new();
    if let Some(home) = cuda_home {
        groups.push(vec![home.join("include")]);
    }
    groups.push(vec![default_root.join("include")]);
    for root in wheel_roots {
        groups.push(vec![root.join("cu13/include")]);
        groups.push(vec![
            root.join("cuda_runtime/include"),
            root.join("cuda_cccl/include"),
            root.join("cuda_nvrtc/include"),
        ]);
    }
    let mut chosen: Vec<PathBuf> = Vec::new();
    for group in groups {
        let first = &group[0];
        if searched.iter().any(|s: &Searched| &s.path == first) {
            continue;
        }
        let found = has_headers(first);
        let take = found && chosen.is_empty();
        searched.push(Searched {
            path: first.clone(),
            used: take,
            note: match (found, take) {
                (true, true) => "toolkit headers".into(),
                (true, false) => "toolkit headers (not used: an earlier toolkit was found)".into(),
                (false, _) if first.is_dir() => "no cuda_runtime.h".into(),
                (false, _) => "not present".into(),
            },
        });
        if take {
            chosen.push(resolved(first));
            for extra in group.iter().skip(1).filter(|p| p.is_dir()) {
                searched.push(Searched {
                    path: extra.clone(),
                    used: true,
                    note: "beside the toolkit headers (CUDA 12 wheel layout)".into(),
                });
                chosen.push(resolved(extra));
            }
        }
    }
    let version = chosen.iter().find_map(|d| version_of(d));
    ToolkitHeaders {
        dirs: chosen,
        version,
        searched,
    }
}

/// `major.minor` from `dir/cuda.h`'s `#define CUDA_VERSION 13000`.
pub fn version_of(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("cuda.h")).ok()?;
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("#define")?.trim_start();
        let n: u32 = rest.strip_prefix("CUDA_VERSION")?.trim().parse().ok()?;
        Some(format!("{}.{}", n / 1000, (n % 1000) / 10))
    })
}

/// The `nvidia` package folders among library folders like `.../site-packages/nvidia/*/lib`.
pub fn wheel_roots(library_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for d in library_dirs {
        let root = d
            .parent()
            .and_then(Path::parent)
            .filter(|r| r.file_name().is_some_and(|n| n == "nvidia"));
        if let Some(r) = root
            && !out.iter().any(|o| o == r)
        {
            out.push(r.to_path_buf());
        }
    }
    out
}

impl ToolkitHeaders {
    /// Whether any toolkit headers were found.
    pub fn found(&self) -> bool {
        !self.dirs.is_empty()
    }

    /// What identifies this header set in the compile cache's key: the folders, the
    /// version, and the size and modification time of a few files that change with every
    /// toolkit release. "none" without headers.
    pub fn identity(&self) -> String {
        if self.dirs.is_empty() {
            return "none".into();
        }
        let mut h = blake3::Hasher::new();
        for d in &self.dirs {
            h.update(d.as_os_str().as_encoded_bytes());
            h.update(b"\0");
            for f in IDENTITY_FILES {
                if let Ok(m) = std::fs::metadata(d.join(f)) {
                    let mtime = m
                        .modified()
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or(0, |d| d.as_nanos());
                    h.update(format!("{f}:{}:{mtime};", m.len()).as_bytes());
                }
            }
        }
        format!(
            "cuda {} {}",
            self.version.as_deref().unwrap_or("?"),
            &h.finalize().to_hex()[..16]
        )
    }

    /// The include folders as a compile inside the jail sees them.
    pub fn inside_paths(&self) -> Vec<PathBuf> {
        (0..self.dirs.len())
            .map(|i| PathBuf::from(format!("{INCLUDE_MOUNT}/{i}")))
            .collect()
    }

    /// (host folder, path inside the jail) for each include folder.
    pub fn binds(&self) -> Vec<(PathBuf, PathBuf)> {
        self.dirs.iter().cloned().zip(self.inside_paths()).collect()
    }

    /// What the headers found lack that toolkit headers include, in words: CUDA 13's pip
    /// wheels ship `crt/` (which `mma.h`, `cuda_runtime.h`'s device functions and others
    /// include) in a wheel of its own, `nvidia-cuda-crt`, that torch does not install.
    pub fn gaps(&self) -> Vec<String> {
        if self.dirs.is_empty() || self.dirs.iter().any(|d| d.join(CRT_MARKER).is_file()) {
            return Vec::new();
        }
        let version = self
            .version
            .as_deref()
            .map_or(String::new(), |v| format!("=={v}.*"));
        vec![format!(
            "no crt/ beside these headers: <mma.h> and others that include crt/*.h will not \
             compile (CUDA 13's pip wheels ship it separately: pip install \
             \"nvidia-cuda-crt{version}\" into the same python)"
        )]
    }

    /// One line for people: where the headers are, or that there are none.
    pub fn describe(&self) -> String {
        if self.dirs.is_empty() {
            return "no CUDA toolkit headers found: candidates get kiln's stand-ins for the \
                    C/C++ headers only (cuda_fp16.h, mma.h, cooperative_groups.h, cub, … are \
                    unavailable); set [cuda] include_dirs"
                .into();
        }
        let dirs: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        let mut line = format!(
            "CUDA {} headers at {}",
            self.version.as_deref().unwrap_or("(version unknown)"),
            dirs.join(", ")
        );
        for gap in self.gaps() {
            line.push_str("; ");
            line.push_str(&gap);
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toolkit(dir: &Path, version: u32) {
        std::fs::create_dir_all(dir.join("cccl/cuda/std")).expect("mkdir");
        std::fs::write(dir.join("cuda_runtime.h"), "// runtime").expect("write");
        std::fs::write(
            dir.join("cuda.h"),
            format!("#pragma once\n#define CUDA_VERSION {version}\n"),
        )
        .expect("write");
    }

    #[test]
    fn the_first_toolkit_in_search_order_is_used() {
        let t = tempfile::tempdir().expect("tempdir");
        let home = t.path().join("home");
        let default = t.path().join("usr-local-cuda");
        let wheels = t.path().join("site-packages/nvidia");
        toolkit(&default.join("include"), 13000);
        toolkit(&wheels.join("cu13/include"), 12090);
        // No $CUDA_HOME headers: the default root wins over the wheels.
        std::fs::create_dir_all(home.join("include")).expect("mkdir");
        let h = discover(&[], Some(&home), &default, std::slice::from_ref(&wheels));
        assert_eq!(h.dirs, vec![resolved(&default.join("include"))]);
        assert_eq!(h.version.as_deref(), Some("13.0"));
        let notes: Vec<(&str, bool)> = h
            .searched
            .iter()
            .map(|s| (s.note.as_str(), s.used))
            .collect();
        assert_eq!(notes[0], ("no cuda_runtime.h", false));
        assert_eq!(notes[1], ("toolkit headers", true));
        assert!(notes[2].0.contains("not used"), "{notes:?}");
        // With $CUDA_HOME holding headers, it comes first.
        toolkit(&home.join("include"), 12040);
        let h = discover(&[], Some(&home), &default, &[]);
        assert_eq!(h.version.as_deref(), Some("12.4"));
        assert!(h.describe().starts_with("CUDA 12.4 headers at "));
    }

    #[test]
    fn wheels_alone_and_the_cuda_12_layout() {
        let t = tempfile::tempdir().expect("tempdir");
        let wheels = t.path().join("nvidia");
        toolkit(&wheels.join("cuda_runtime/include"), 12090);
        std::fs::create_dir_all(wheels.join("cuda_cccl/include/cub")).expect("cccl");
        let h = discover(
            &[],
            None,
            &t.path().join("none"),
            std::slice::from_ref(&wheels),
        );
        assert_eq!(
            h.dirs,
            vec![
                resolved(&wheels.join("cuda_runtime/include")),
                resolved(&wheels.join("cuda_cccl/include"))
            ]
        );
        assert_eq!(h.inside_paths()[1], PathBuf::from("/kiln/include/1"));
        assert_eq!(h.binds()[0].1, PathBuf::from("/kiln/include/0"));
    }

    #[test]
    fn configured_folders_are_used_as_given_and_bad_ones_reported() {
        let t = tempfile::tempdir().expect("tempdir");
        let a = t.path().join("a");
        toolkit(&a, 13000);
        let h = discover(
            &[
                a.clone(),
                PathBuf::from("relative"),
                t.path().join("missing"),
            ],
            None,
            &t.path().join("none"),
            &[],
        );
        assert_eq!(h.dirs, vec![resolved(&a)]);
        assert_eq!(h.searched[1].note, "not an absolute path");
        assert_eq!(h.searched[2].note, "not a directory");
    }

    #[test]
    fn nothing_found_is_said_clearly_and_identified_as_none() {
        let t = tempfile::tempdir().expect("tempdir");
        let h = discover(&[], None, t.path(), &[]);
        assert!(!h.found());
        assert_eq!(h.identity(), "none");
        assert!(h.describe().contains("cuda_fp16.h"), "{}", h.describe());
    }

    #[test]
    fn identity_changes_with_the_headers() {
        let t = tempfile::tempdir().expect("tempdir");
        let a = t.path().join("a");
        toolkit(&a, 13000);
        let h = discover(std::slice::from_ref(&a), None, t.path(), &[]);
        let before = h.identity();
        assert!(before.starts_with("cuda 13.0 "), "{before}");
        std::fs::write(a.join("cuda_runtime_api.h"), "// a newer release").expect("write");
        assert_ne!(h.identity(), before);
    }

    #[test]
    fn headers_without_crt_say_which_wheel_is_missing() {
        let t = tempfile::tempdir().expect("tempdir");
        let a = t.path().join("a");
        toolkit(&a, 13020);
        let h = discover(std::slice::from_ref(&a), None, t.path(), &[]);
        assert_eq!(h.gaps().len(), 1, "{:?}", h.gaps());
        assert!(
            h.describe().contains("nvidia-cuda-crt==13.2.*"),
            "{}",
            h.describe()
        );
        std::fs::create_dir_all(a.join("crt")).expect("crt");
        std::fs::write(a.join(CRT_MARKER), "// crt").expect("write");
        assert!(h.gaps().is_empty());
        assert!(!h.describe().contains("crt"), "{}", h.describe());
    }

    #[test]
    fn wheel_roots_come_from_library_folders() {
        let roots = wheel_roots(&[
            PathBuf::from("/v/site-packages/nvidia/cudnn/lib"),
            PathBuf::from("/v/site-packages/nvidia/cu13/lib"),
            PathBuf::from("/usr/local/cuda/lib64"),
        ]);
        assert_eq!(roots, vec![PathBuf::from("/v/site-packages/nvidia")]);
    }
}

//! The six families of kernel optimisation ideas (after the seed project's idea lists),
//! and a keyword classifier that files an idea's text under one of them, so a strategy
//! can spread a round's ideas across directions.

/// A direction of optimisation.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    /// Memory access: coalescing, vector loads, caching, fewer passes over the data.
    Memory,
    /// Asynchrony and latency hiding: pipelining, prefetching, independent chains.
    Asynchrony,
    /// Data type and precision: narrower types, cheaper math at the same tolerance.
    Precision,
    /// Compute and instructions: intrinsics, fused operations, compiler flags.
    Compute,
    /// Parallelism and occupancy: block and grid shapes, work per thread.
    Parallelism,
    /// Control flow and loops: unrolling, fusing passes, branch removal.
    ControlFlow,
}

/// The six families, in a fixed order.
pub const ALL: [Family; 6] = [
    Family::Memory,
    Family::Asynchrony,
    Family::Precision,
    Family::Compute,
    Family::Parallelism,
    Family::ControlFlow,
];

impl Family {
    /// A short name (`memory`, `asynchrony`, `precision`, `compute`, `parallelism`,
    /// `control-flow`).
    pub fn name(self) -> &'static str {
        match self {
            Family::Memory => "memory",
            Family::Asynchrony => "asynchrony",
            Family::Precision => "precision",
            Family::Compute => "compute",
            Family::Parallelism => "parallelism",
            Family::ControlFlow => "control-flow",
        }
    }

    /// The family in words, for prompts.
    pub fn describe(self) -> &'static str {
        match self {
            Family::Memory => "memory access (coalescing, vector loads, caching, fewer passes)",
            Family::Asynchrony => {
                "asynchrony and latency hiding (pipelining, prefetch, independent chains)"
            }
            Family::Precision => "data type and precision (narrower types, cheaper math)",
            Family::Compute => "compute and instructions (intrinsics, fused ops, flags)",
            Family::Parallelism => "parallelism and occupancy (block/grid shape, work per thread)",
            Family::ControlFlow => "control flow and loops (unrolling, fused passes, branches)",
        }
    }

    /// The family named `word` (its [`Family::name`], or a prefix of it such as `mem`).
    pub fn from_name(word: &str) -> Option<Family> {
        let w = word.trim().to_ascii_lowercase().replace(['_', ' '], "-");
        if w.len() < 3 {
            return None;
        }
        ALL.into_iter()
            .find(|f| f.name() == w || f.name().starts_with(&w) || w.starts_with(f.name()))
            .or_else(|| {
                ALL.into_iter().find(|f| match f {
                    Family::ControlFlow => w.starts_with("control") || w.starts_with("loop"),
                    Family::Asynchrony => w.starts_with("async") || w.starts_with("latency"),
                    Family::Precision => w.starts_with("data") || w.starts_with("type"),
                    Family::Parallelism => w.starts_with("occupancy"),
                    _ => false,
                })
            })
    }
}

/// Keywords per family; the family with the most hits wins, ties in [`ALL`]'s order.
const KEYWORDS: [(Family, &[&str]); 6] = [
    (
        Family::Memory,
        &[
            "load",
            "store",
            "coalesc",
            "float4",
            "shared",
            "smem",
            "cache",
            "l2",
            "read",
            "memory",
            "tile",
            "reuse",
            "restrict",
            "alias",
            "bandwidth",
        ],
    ),
    (
        Family::Asynchrony,
        &[
            "async",
            "pipeline",
            "prefetch",
            "overlap",
            "latency",
            "cp.async",
            "tma",
            "double buffer",
            "dependency",
            "independent",
            "accumulators",
        ],
    ),
    (
        Family::Precision,
        &[
            "float",
            "double",
            "fp16",
            "half",
            "bf16",
            "tf32",
            "precision",
            "acc_t",
            "f64",
            "f32",
            "dtype",
            "width",
            "_t",
        ],
    ),
    (
        Family::Compute,
        &[
            "exp",
            "fma",
            "flag",
            "-o3",
            "march",
            "fast-math",
            "instruction",
            "tensor core",
            "mma",
            "intrinsic",
            "vectoris",
            "vectoriz",
            "simd",
            "math",
        ],
    ),
    (
        Family::Parallelism,
        &[
            "block",
            "thread",
            "warp",
            "occupancy",
            "grid",
            "parallel",
            "chunks",
            "ept",
            "ocpt",
            "per thread",
            "split",
        ],
    ),
    (
        Family::ControlFlow,
        &[
            "unroll",
            "loop",
            "branch",
            "online",
            "one pass",
            "one sweep",
            "passes",
            "fold",
            "fuse",
            "control",
        ],
    ),
];

/// The family an idea's text (or a knob's name and values) belongs to.
pub fn classify(text: &str) -> Family {
    let t = text.to_ascii_lowercase();
    let mut best = (0usize, Family::Compute);
    for (family, words) in KEYWORDS {
        let hits = words.iter().filter(|w| t.contains(*w)).count();
        if hits > best.0 {
            best = (hits, family);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_the_seed_ideas() {
        assert_eq!(classify("UNROLL 1|4|8"), Family::ControlFlow);
        assert_eq!(classify("ACC_T double|float"), Family::Precision);
        assert_eq!(classify("BLOCK 64|128|256"), Family::Parallelism);
        assert_eq!(
            classify("vectorise: add -O3 -march=native -ffast-math to flags"),
            Family::Compute
        );
        assert_eq!(
            classify("smem_weights: stage the weights in shared memory once per block"),
            Family::Memory
        );
        assert_eq!(
            classify("cp_async_pipeline: multi-stage cp.async pipeline so loads overlap"),
            Family::Asynchrony
        );
        assert_eq!(Family::from_name("Memory"), Some(Family::Memory));
        assert_eq!(Family::from_name("control flow"), Some(Family::ControlFlow));
        assert_eq!(Family::from_name("async"), Some(Family::Asynchrony));
        assert_eq!(Family::from_name("xx"), None);
    }
}

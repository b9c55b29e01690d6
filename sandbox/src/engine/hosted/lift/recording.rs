//! What the hosted runner says about a forward (`R`, spec §1) and about the file's device
//! code (`device-source`, spec §2): the JSON as written by `sandbox/hosted/kiln_hosted.py`.
//! Beside CUPTI's view of the forward (`ops`), a recording holds Triton's (`triton`: each
//! `JITFunction.run` call, with its arguments by parameter name, its constexprs and
//! options), and the device sources the file's Triton source (`triton`).
//!
//! Everything here comes from the candidate's process (the recording) or from text the
//! candidate wrote (the device sources), so it is read as untrusted: unknown fields are
//! ignored, missing optional ones take their defaults, lists are bounded while they are
//! read ([`MAX_OPS`] operations, [`MAX_PARAMS`] parameters per launch...), and any
//! malformed answer becomes [`Refusal::BadRecording`], never a panic.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize as DeriveDeserialize, Serialize};

use super::Refusal;

/// Most GPU operations in one recording (the runner stops at this many and says so).
pub const MAX_OPS: usize = 4096;
/// Most parameters of one recorded launch.
pub const MAX_PARAMS: usize = 256;
/// Most regions (kiln's tensors and the forward's outputs) in one recording.
pub const MAX_REGIONS: usize = 4096;
/// Most blocks torch's allocator handed out in one recorded forward.
pub const MAX_ALLOCATIONS: usize = 1 << 16;
/// Most device sources of one file.
pub const MAX_SOURCES: usize = 64;
/// Most kernel names or flags of one device source.
pub const MAX_NAMES: usize = 4096;

/// Deserialises a list of at most `N` items, failing as soon as item `N + 1` is seen (so
/// a recording of a million operations is not read into memory first).
fn bounded<'de, const N: usize, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<const N: usize, T>(PhantomData<T>);
    impl<'de, const N: usize, T: Deserialize<'de>> Visitor<'de> for Bounded<N, T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a list of at most {N} items")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(N.min(1024)));
            while let Some(item) = seq.next_element()? {
                if out.len() == N {
                    return Err(serde::de::Error::custom(format!(
                        "more than {N} items in a list"
                    )));
                }
                out.push(item);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Bounded::<N, T>(PhantomData))
}

/// The runner's answer to `R`: every CUDA API call that enqueued GPU work during one
/// forward, and where kiln's tensors and the forward's outputs lay. A claim by the
/// candidate's process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, DeriveDeserialize)]
pub struct Recording {
    /// Why nothing could be recorded, when nothing could.
    #[serde(default)]
    pub error: Option<String>,
    /// The operations, in the order the forward issued them.
    #[serde(default, deserialize_with = "bounded::<MAX_OPS, _, _>")]
    pub ops: Vec<Op>,
    /// kiln's tensors and the forward's outputs.
    #[serde(default, deserialize_with = "bounded::<MAX_REGIONS, _, _>")]
    pub regions: Vec<Region>,
    /// Blocks torch's caching allocator handed out during the forward, in order.
    #[serde(default, deserialize_with = "bounded::<MAX_ALLOCATIONS, _, _>")]
    pub allocations: Vec<Allocation>,
    /// The Triton launches (`JITFunction.run` calls) of the forward, in order; empty when
    /// the file launched none (or imported no triton).
    #[serde(default, deserialize_with = "bounded::<MAX_OPS, _, _>")]
    pub triton: Vec<TritonLaunch>,
}

impl Recording {
    /// Reads the runner's answer; malformed JSON or a list over its bound is
    /// [`Refusal::BadRecording`].
    pub fn parse(text: &str) -> Result<Recording, Refusal> {
        serde_json::from_str(text)
            .map_err(|e| Refusal::BadRecording(super::clip(&format!("recording: {e}"))))
    }

    /// The recorded launches, in order.
    pub fn launches(&self) -> impl Iterator<Item = &LaunchOp> {
        self.ops.iter().filter_map(|op| match op {
            Op::Launch(l) => Some(l),
            _ => None,
        })
    }
}

/// One recorded API call (tagged by `"op"`).
#[derive(Debug, Clone, PartialEq, Serialize, DeriveDeserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Op {
    /// A kernel launch (runtime or driver API).
    Launch(LaunchOp),
    /// A memset.
    Memset {
        /// The API called.
        #[serde(default)]
        api: String,
        /// Bytes set.
        #[serde(default)]
        bytes: u64,
    },
    /// A copy.
    Copy {
        /// The API called.
        #[serde(default)]
        api: String,
        /// Bytes copied.
        #[serde(default)]
        bytes: u64,
        /// `h2d`, `d2h`, `d2d`, `h2h`, `default`, `symbol` or `unknown`.
        #[serde(default = "unknown")]
        kind: String,
    },
    /// A synchronisation (device, stream or event).
    Sync {
        /// The API called.
        #[serde(default)]
        api: String,
    },
    /// A raw allocation outside torch's caching allocator.
    Alloc {
        /// The API called.
        #[serde(default)]
        api: String,
        /// The address handed out.
        #[serde(default)]
        ptr: u64,
        /// Its size.
        #[serde(default)]
        bytes: u64,
    },
    /// Any other API that enqueues GPU work (a graph launch, an event on another stream...).
    Other {
        /// The API called.
        #[serde(default)]
        api: String,
    },
}

fn unknown() -> String {
    "unknown".into()
}

/// The stream a launch went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, DeriveDeserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// torch's current stream (or the legacy / per-thread default stream).
    Current,
    /// Any other stream (any other spelling is read as this).
    #[serde(other)]
    Other,
}

/// One recorded kernel launch.
#[derive(Debug, Clone, PartialEq, Serialize, DeriveDeserialize)]
pub struct LaunchOp {
    /// The API called (`cudaLaunchKernel`, `cuLaunchKernelEx`...).
    #[serde(default)]
    pub api: String,
    /// The kernel's symbol (mangled, or an `extern "C"` name).
    pub symbol: String,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes.
    #[serde(default)]
    pub shared_bytes: u32,
    /// The stream.
    pub stream: Stream,
    /// A cooperative launch.
    #[serde(default)]
    pub cooperative: bool,
    /// Thread-block cluster dimensions, when the launch gave them.
    #[serde(default)]
    pub cluster: Option<[u32; 3]>,
    /// The parameters' bytes, in order.
    #[serde(default, deserialize_with = "bounded::<MAX_PARAMS, _, _>")]
    pub params: Vec<Param>,
}

/// One kernel parameter as it lay in the launch's parameter buffer.
#[derive(Debug, Clone, PartialEq, Serialize, DeriveDeserialize)]
pub struct Param {
    /// Its offset in the parameter buffer.
    #[serde(default)]
    pub offset: u64,
    /// Its size in bytes.
    pub size: u32,
    /// Its bytes as in memory (little-endian), in hex: exactly `2 * size` digits.
    pub hex: String,
}

impl Param {
    /// The parameter's bytes: `hex` must hold exactly `2 * size` hex digits.
    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        let want = 2 * u64::from(self.size);
        if self.hex.len() as u64 != want {
            return Err(format!(
                "{} hex digits for a parameter of {} bytes",
                self.hex.len(),
                self.size
            ));
        }
        let digit = |b: u8| -> Result<u8, String> {
            (b as char)
                .to_digit(16)
                .map(|d| d as u8)
                .ok_or_else(|| "a parameter's hex holds a non-hex character".to_string())
        };
        self.hex
            .as_bytes()
            .chunks_exact(2)
            .map(|p| Ok((digit(p[0])? << 4) | digit(p[1])?))
            .collect()
    }
}

/// What a region is to the forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, DeriveDeserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegionRole {
    /// A forward argument (kiln's input tensor).
    Input,
    /// A parameter set from kiln's tensor.
    Weight,
    /// A buffer (the runner's clone of kiln's tensor).
    Buffer,
    /// What the forward returned for an output.
    Output,
}

/// A stretch of device memory the runner knows: one of kiln's tensors or an output.
#[derive(Debug, Clone, PartialEq, Serialize, DeriveDeserialize)]
pub struct Region {
    /// The tensor's name (the problem's, as the runner claims).
    pub name: String,
    /// What it is.
    pub role: RegionRole,
    /// Its first byte.
    pub ptr: u64,
    /// Its size.
    pub bytes: u64,
    /// For an output: whether it was a contiguous tensor (unknown counts as not).
    #[serde(default)]
    pub contiguous: Option<bool>,
}

impl Region {
    /// True when `addr` lies in `[ptr, ptr + bytes)`.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.ptr && addr < self.ptr.saturating_add(self.bytes)
    }

    /// True when the two regions share a byte.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.bytes > 0
            && other.bytes > 0
            && self.ptr < other.ptr.saturating_add(other.bytes)
            && other.ptr < self.ptr.saturating_add(self.bytes)
    }
}

/// A block torch's caching allocator handed out during the forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, DeriveDeserialize)]
pub struct Allocation {
    /// Its first byte.
    pub ptr: u64,
    /// Its size.
    pub bytes: u64,
}

impl Allocation {
    /// True when `addr` lies in `[ptr, ptr + bytes)`.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.ptr && addr < self.ptr.saturating_add(self.bytes)
    }
}

/// One Triton launch as the runner saw it: a `JITFunction.run` call that was no warmup
/// (the autotuner's and the heuristics' chosen values included).
#[derive(Debug, Clone, PartialEq, Serialize, DeriveDeserialize)]
pub struct TritonLaunch {
    /// The jit function's name.
    pub kernel: String,
    /// The grid, evaluated as Triton does (a callable grid given the bound arguments),
    /// padded to three dimensions.
    pub grid: [i64; 3],
    /// Every parameter of the function, in order, with the value it was bound to.
    #[serde(default, deserialize_with = "bounded::<MAX_PARAMS, _, _>")]
    pub args: Vec<TritonArg>,
    /// Warps per program (Triton's default 4).
    #[serde(default = "default_num_warps")]
    pub num_warps: i64,
    /// Pipeline stages (Triton's default 3).
    #[serde(default = "default_num_stages")]
    pub num_stages: i64,
    /// CTAs per program (Triton's default 1).
    #[serde(default = "default_num_ctas")]
    pub num_ctas: i64,
    /// Any other compile option the call gave (`maxnreg`, `enable_fp_fusion`...), by name.
    #[serde(default)]
    pub options: BTreeMap<String, serde_json::Value>,
}

fn default_num_warps() -> i64 {
    4
}

fn default_num_stages() -> i64 {
    3
}

fn default_num_ctas() -> i64 {
    1
}

/// One parameter of a Triton launch and what it was bound to.
#[derive(Debug, Clone, PartialEq, Serialize, DeriveDeserialize)]
pub struct TritonArg {
    /// The parameter's name.
    pub name: String,
    /// Whether it is a `tl.constexpr` parameter.
    #[serde(default)]
    pub constexpr: bool,
    /// `tensor`, `int`, `float`, `bool`, `str`, `dtype` (a triton.language dtype), `none`
    /// or `other`.
    pub kind: String,
    /// A tensor's `data_ptr()`.
    #[serde(default)]
    pub ptr: Option<u64>,
    /// Whether a tensor was contiguous.
    #[serde(default)]
    pub contiguous: Option<bool>,
    /// A tensor's torch dtype (`float32`).
    #[serde(default)]
    pub dtype: Option<String>,
    /// The value of an `int`, `float` (null when not finite), `bool`, `str` or `dtype`
    /// (`"tl.float16"`).
    #[serde(default)]
    pub value: Option<serde_json::Value>,
    /// A float that is not finite, as Python wrote it (`inf`).
    #[serde(default)]
    pub text: Option<String>,
    /// The Python type of an `other` value.
    #[serde(default, rename = "type")]
    pub type_name: Option<String>,
}

/// The file's Triton source as the extractor read it: its `@triton.jit` functions (less
/// their autotune / heuristics decorators) with the imports and constexpr constants they
/// use, as a Triton contract candidate's source.
#[derive(Debug, Clone, PartialEq, Serialize, DeriveDeserialize)]
pub struct TritonSource {
    /// The source.
    pub source: String,
    /// The jit functions' names.
    #[serde(default, deserialize_with = "bounded::<MAX_NAMES, _, _>")]
    pub kernels: Vec<String>,
}

/// One device source the extractor found in the file (no candidate code run).
#[derive(Debug, Clone, PartialEq, Serialize, DeriveDeserialize)]
pub struct DeviceSource {
    /// The device code, the torch / pybind host wrapper removed.
    pub source: String,
    /// kiln launch names (C++ name expressions) of the kernels found in it.
    #[serde(default, deserialize_with = "bounded::<MAX_NAMES, _, _>")]
    pub kernels: Vec<String>,
    /// The author's nvcc flags, as kiln spells them.
    #[serde(default, deserialize_with = "bounded::<MAX_NAMES, _, _>")]
    pub flags: Vec<String>,
    /// Kernels whose names the extractor could not give.
    #[serde(default)]
    pub names_skipped: u64,
}

/// The answer of `kiln_hosted.py device-source FILE`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, DeriveDeserialize)]
pub struct DeviceSources {
    /// Why the file could not be read, when it could not.
    #[serde(default)]
    pub error: Option<String>,
    /// The sources, in the file's order.
    #[serde(default, deserialize_with = "bounded::<MAX_SOURCES, _, _>")]
    pub sources: Vec<DeviceSource>,
    /// The file's Triton source, when it defines `@triton.jit` functions.
    #[serde(default)]
    pub triton: Option<TritonSource>,
}

impl DeviceSources {
    /// Reads the extractor's answer; malformed JSON or a list over its bound is
    /// [`Refusal::BadRecording`].
    pub fn parse(text: &str) -> Result<DeviceSources, Refusal> {
        serde_json::from_str(text)
            .map_err(|e| Refusal::BadRecording(super::clip(&format!("device sources: {e}"))))
    }
}

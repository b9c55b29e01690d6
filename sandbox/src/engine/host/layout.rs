//! Where each tensor and scratch buffer lives in the shared memfd of one runner, and how
//! a launch list becomes calls the runner can make.
//!
//! Every buffer starts on a page boundary and is followed by a guard page that the runner
//! makes inaccessible before loading candidate code, so writing past the end of a buffer
//! faults instead of silently landing in the next one.
//!
//! A candidate's layout may hold several **slots**: complete copies of every buffer, slot
//! `j` at `j × slot_bytes`, so that one timed sample can run the launch list on several
//! fresh input sets (each run with its own inputs, outputs and scratch) between one start
//! and one stop of the timer. Calls are resolved against slot 0; the runner rebases their
//! pointers for the other slots.
//!
//! # Calling convention (host backend)
//!
//! Each launch calls a C function returning `void`. Arguments are of two classes:
//! **integer class** (buffers as pointers, `i32`/`i64`/`u32`/`u64` literals, widened to 64
//! bits) and **float class** (`f32`/`f64` literals). The runner calls every function
//! through one signature, `extern "C" fn(u64 × 16, f64 × 8)`. On x86-64 System V (and
//! AArch64 AAPCS64) the two classes are assigned to registers independently and
//! integer-class arguments beyond the registers go to the stack in order, so a function
//! with up to [`MAX_INT_ARGS`] integer-class and [`MAX_FLOAT_ARGS`] float-class parameters,
//! in any interleaving, receives exactly its arguments; the extra ones are ignored (the
//! caller owns the stack). An `f32` literal is passed with its bits in the low half of the
//! register, where the callee reads a `float`.
//!
//! C has no run-time signature information: a launch whose argument count or types do
//! not match the function's parameters cannot be detected; the function then reads
//! garbage and the verdict is whatever its outputs earn (usually `wrong_answer` or
//! `runtime_fault`). Unknown function names are caught (dlsym) as `invalid_launch`.

use kiln_types::{Arg, Dtype, Launch, Role, ScratchBuffer, TensorSpec, candidate::Scalar};
use serde::{Deserialize, Serialize};

/// Page size assumed for alignment and guard pages.
pub const PAGE: u64 = 4096;
/// Most integer-class arguments of one launch.
pub const MAX_INT_ARGS: usize = 16;
/// Most float-class arguments of one launch.
pub const MAX_FLOAT_ARGS: usize = 8;

/// What a buffer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// Filled with fresh inputs before each run; must not change.
    Input,
    /// Poisoned before each run; must be fully written.
    Output,
    /// Zeroed before each run.
    Scratch,
}

/// One buffer in the memfd.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    /// Name used in launch args.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Elements.
    pub elems: u64,
    /// Byte offset in the memfd (page aligned).
    pub offset: u64,
    /// What it is for.
    pub kind: Kind,
}

impl Buffer {
    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.elems * self.dtype.size()
    }

    /// Byte range in the memfd.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset as usize..(self.offset + self.bytes()) as usize
    }
}

/// All buffers of one runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Layout {
    /// Buffers of slot 0 in declaration order: the problem's tensors, then scratch.
    pub buffers: Vec<Buffer>,
    /// Bytes of one slot: every buffer with its guard page.
    pub slot_bytes: u64,
    /// Copies of every buffer (at least 1).
    pub slots: u32,
    /// Total bytes of the memfd.
    pub total: u64,
}

/// Most slots a layout gets ([`Layout::with_slots_within`]); the runner's `T` command
/// counts them in one byte.
pub const MAX_SLOTS: u32 = 255;

/// Dtypes the host backend can generate, poison and compare.
pub fn dtype_supported(d: Dtype) -> bool {
    matches!(
        d,
        Dtype::F32 | Dtype::F64 | Dtype::I32 | Dtype::I64 | Dtype::U8
    )
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

impl Layout {
    /// No buffers, one page (a runner whose tensors live elsewhere: a hosted runner on the
    /// GPU maps them from the worker's exported allocations).
    pub fn empty() -> Layout {
        Layout {
            buffers: Vec::new(),
            slot_bytes: PAGE,
            slots: 1,
            total: PAGE,
        }
    }

    /// Lays out the problem's tensors and the kernel's scratch buffers.
    pub fn new(tensors: &[TensorSpec], scratch: &[ScratchBuffer]) -> Result<Layout, String> {
        let mut buffers = Vec::new();
        let mut offset = 0u64;
        let items = tensors
            .iter()
            .map(|t| {
                let kind = if t.role == Role::Input {
                    Kind::Input
                } else {
                    Kind::Output
                };
                (t.name.as_str(), t.dtype, t.elems(), kind)
            })
            .chain(
                scratch
                    .iter()
                    .map(|s| (s.name.as_str(), s.dtype, s.elems, Kind::Scratch)),
            );
        for (name, dtype, elems, kind) in items {
            if !dtype_supported(dtype) {
                return Err(format!(
                    "buffer {name:?} has dtype {dtype:?}, which the host backend does not support"
                ));
            }
            if buffers.iter().any(|b: &Buffer| b.name == name) {
                return Err(format!("buffer name {name:?} is used twice"));
            }
            let bytes = elems
                .checked_mul(dtype.size())
                .ok_or_else(|| format!("buffer {name:?} is too large"))?;
            buffers.push(Buffer {
                name: name.to_string(),
                dtype,
                elems,
                offset,
                kind,
            });
            offset = offset
                .checked_add(round_up(bytes.max(1)) + PAGE)
                .ok_or_else(|| "buffers too large".to_string())?;
        }
        Ok(Layout {
            buffers,
            slot_bytes: offset,
            slots: 1,
            total: offset,
        })
    }

    /// The same layout with as many slots as fit in `budget` bytes of slots beyond the
    /// first, at most [`MAX_SLOTS`] (so small problems can repeat runs within a sample and
    /// large ones, whose runs are long anyway, cost no memory).
    pub fn with_slots_within(mut self, budget: u64) -> Layout {
        let extra = budget / self.slot_bytes.max(1);
        self.slots = extra.saturating_add(1).min(u64::from(MAX_SLOTS)) as u32;
        self.total = self.slot_bytes * u64::from(self.slots);
        self
    }

    /// A buffer by name (slot 0).
    pub fn get(&self, name: &str) -> Option<&Buffer> {
        self.buffers.iter().find(|b| b.name == name)
    }

    /// Byte range of buffer `name` in `slot`, if both exist.
    pub fn range_in(&self, slot: usize, name: &str) -> Option<std::ops::Range<usize>> {
        if slot >= self.slots as usize {
            return None;
        }
        let shift = slot * self.slot_bytes as usize;
        self.get(name)
            .map(|b| b.range())
            .map(|r| r.start + shift..r.end + shift)
    }

    /// Byte ranges of the guard pages (one after each buffer, in every slot).
    pub fn guards(&self) -> Vec<std::ops::Range<usize>> {
        (0..u64::from(self.slots))
            .flat_map(|slot| {
                self.buffers.iter().map(move |b| {
                    let end = slot * self.slot_bytes + b.offset + round_up(b.bytes().max(1));
                    end as usize..(end + PAGE) as usize
                })
            })
            .collect()
    }
}

/// One argument as the runner passes it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum CallArg {
    /// A pointer: this byte offset into the memfd mapping.
    Ptr(u64),
    /// An integer-class value, already widened to 64 bits.
    Int(u64),
    /// A float-class value: the bits placed in the register (f32 bits in the low half).
    Float(u64),
}

/// One call the runner makes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Call {
    /// The C function's symbol.
    pub symbol: String,
    /// Its arguments, in order.
    pub args: Vec<CallArg>,
}

/// Turns launches into calls; an error is an `invalid_launch` message.
pub fn resolve(launches: &[Launch], layout: &Layout) -> Result<Vec<Call>, String> {
    launches
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let args: Vec<CallArg> = l
                .args
                .iter()
                .map(|a| match a {
                    Arg::Buffer(name) => layout
                        .get(name)
                        .map(|b| CallArg::Ptr(b.offset))
                        .ok_or_else(|| {
                            format!("launches[{i}] ({}): unknown buffer {name:?}", l.kernel)
                        }),
                    Arg::Scalar(s) => Ok(match *s {
                        Scalar::I32(v) => CallArg::Int(i64::from(v) as u64),
                        Scalar::I64(v) => CallArg::Int(v as u64),
                        Scalar::U32(v) => CallArg::Int(u64::from(v)),
                        Scalar::U64(v) => CallArg::Int(v),
                        Scalar::F32(v) => CallArg::Float(u64::from(v.to_bits())),
                        Scalar::F64(v) => CallArg::Float(v.to_bits()),
                    }),
                })
                .collect::<Result<_, _>>()?;
            let floats = args
                .iter()
                .filter(|a| matches!(a, CallArg::Float(_)))
                .count();
            let ints = args.len() - floats;
            if ints > MAX_INT_ARGS || floats > MAX_FLOAT_ARGS {
                return Err(format!(
                    "launches[{i}] ({}): {ints} pointer/integer and {floats} float arguments; \
                     the host backend passes at most {MAX_INT_ARGS} and {MAX_FLOAT_ARGS}",
                    l.kernel
                ));
            }
            Ok(Call {
                symbol: l.kernel.clone(),
                args,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned_with_guards() {
        let t: Vec<TensorSpec> = serde_json::from_str(
            r#"[{"name":"x","dtype":"f32","shape":[10],"role":"input"},
                {"name":"y","dtype":"f32","shape":[1025],"role":"output"}]"#,
        )
        .expect("tensors");
        let l = Layout::new(&t, &[]).expect("layout");
        assert_eq!(l.buffers[0].offset, 0);
        assert_eq!(l.buffers[1].offset, 2 * PAGE);
        assert_eq!(l.total, 2 * PAGE + 2 * PAGE + PAGE);
        assert_eq!(l.guards()[1], (4 * PAGE) as usize..(5 * PAGE) as usize);
        let launch: Launch =
            serde_json::from_str(r#"{"kernel":"f","args":["x","y",{"i32":-1},{"f32":1.5}]}"#)
                .expect("launch");
        let calls = resolve(std::slice::from_ref(&launch), &l).expect("resolves");
        assert_eq!(calls[0].args[2], CallArg::Int(u64::MAX));
        assert_eq!(
            calls[0].args[3],
            CallArg::Float(u64::from(1.5f32.to_bits()))
        );
        let mut bad = launch;
        bad.args[0] = Arg::Buffer("nope".into());
        assert!(resolve(&[bad], &l).expect_err("unknown").contains("nope"));
    }

    #[test]
    fn slots_copy_every_buffer_with_its_guards() {
        let t: Vec<TensorSpec> = serde_json::from_str(
            r#"[{"name":"x","dtype":"f32","shape":[10],"role":"input"},
                {"name":"y","dtype":"f32","shape":[1025],"role":"output"}]"#,
        )
        .expect("tensors");
        let one = Layout::new(&t, &[]).expect("layout");
        let slot = one.slot_bytes;
        assert_eq!((one.slots, one.total), (1, slot));
        // Room for two more slots.
        let three = one.clone().with_slots_within(2 * slot + slot / 2);
        assert_eq!((three.slots, three.total), (3, 3 * slot));
        assert_eq!(three.range_in(0, "y"), one.get("y").map(|b| b.range()));
        let y2 = three.range_in(2, "y").expect("slot 2");
        assert_eq!(y2.start, (2 * slot + 2 * PAGE) as usize);
        assert_eq!(three.range_in(3, "y"), None);
        assert_eq!(three.guards().len(), 6);
        assert_eq!(three.guards()[5].start, y2.start + 2 * PAGE as usize);
        // Every guard page lies inside the memfd and outside every buffer.
        for g in three.guards() {
            assert!(g.end <= three.total as usize);
            for s in 0..3 {
                for n in ["x", "y"] {
                    let r = three.range_in(s, n).expect("range");
                    assert!(g.end <= r.start || g.start >= r.end);
                }
            }
        }
        // No budget, one slot; a huge budget, the cap.
        assert_eq!(one.clone().with_slots_within(0).slots, 1);
        assert_eq!(one.with_slots_within(u64::MAX).slots, MAX_SLOTS);
    }
}

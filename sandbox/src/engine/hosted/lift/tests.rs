//! The lift on hand-written recordings shaped like the runner's (fixtures under
//! `sandbox/tests/fixtures/lift/`): the successful lifts field by field, and every refusal.

use std::collections::{BTreeMap, BTreeSet};

use kiln_types::candidate::{Arg, Constexpr, Scalar};
use kiln_types::{Dtype, Language, ProblemSpec};
use serde_json::{Value, json};

use super::*;

/// A `load_inline` GELU: one launch (x, out, a literal n) and a `cudaDeviceSynchronize`;
/// the output at another address in the second draw; one flag kiln refuses.
const GELU: &str = include_str!("../../../../tests/fixtures/lift/gelu.json");
/// The GELU as a template kernel (`_Z11gelu_kernelIfEvPKT_PS0_i`).
const TEMPLATE_GELU: &str = include_str!("../../../../tests/fixtures/lift/template_gelu.json");
/// A launch with float, double and unsigned long scalars, in a cluster of 2.
const SCALE_FLOAT: &str = include_str!("../../../../tests/fixtures/lift/scale_float.json");
/// A two-kernel row normalisation (`fused::row_stat`, `fused::normalize`) with two
/// temporaries from torch's allocator (at swapped addresses in the second draw), a weight,
/// and two device sources, the first not holding the kernels.
const TWO_KERNELS: &str = include_str!("../../../../tests/fixtures/lift/two_kernels.json");

const GELU_PROBLEM: &str = r#"
name = "gelu"
[[tensor]]
name = "x"
dtype = "f32"
shape = [16, 16384]
role = "input"
[[tensor]]
name = "out"
dtype = "f32"
shape = [16, 16384]
role = "output"
[tolerance]
atol = 1e-4
rtol = 1e-4
[reference.torch]
file = "reference.py"
forward = ["x"]
outputs = ["out"]
"#;

const ROWNORM_PROBLEM: &str = r#"
name = "rownorm"
[[tensor]]
name = "x"
dtype = "f32"
shape = [128, 4096]
role = "input"
[[tensor]]
name = "weight"
dtype = "f32"
shape = [4096]
role = "input"
[[tensor]]
name = "out"
dtype = "f32"
shape = [128, 4096]
role = "output"
[tolerance]
atol = 1e-4
rtol = 1e-4
[reference.torch]
file = "reference.py"
forward = ["x"]
outputs = ["out"]
[reference.torch.state]
"norm.weight" = "weight"
"#;

/// One fixture, as JSON to mutate, with its problem.
struct Case {
    problem: ProblemSpec,
    sources: Value,
    first: Value,
    second: Value,
}

impl Case {
    fn new(fixture: &str, problem: &str) -> Case {
        let v: Value = serde_json::from_str(fixture).expect("fixture is JSON");
        Case {
            problem: ProblemSpec::from_toml(problem).expect("problem"),
            sources: v["device_sources"].clone(),
            first: v["first"].clone(),
            second: v["second"].clone(),
        }
    }

    fn gelu() -> Case {
        Case::new(GELU, GELU_PROBLEM)
    }

    /// Both recordings, to change them alike.
    fn both(&mut self, f: impl Fn(&mut Value)) {
        f(&mut self.first);
        f(&mut self.second);
    }

    /// The lift, through the same parsing as the runner's answers.
    fn lift(&self) -> Result<Lifted, Refusal> {
        let sources = DeviceSources::parse(&self.sources.to_string())?;
        let first = Recording::parse(&self.first.to_string())?;
        let second = Recording::parse(&self.second.to_string())?;
        lift(&self.problem, &sources.sources, &first, &second)
    }

    fn source(&self, i: usize) -> String {
        self.sources["sources"][i]["source"]
            .as_str()
            .expect("source")
            .to_string()
    }
}

fn buf(name: &str) -> Arg {
    Arg::Buffer(name.into())
}

fn hex64(v: u64) -> Value {
    json!(
        v.to_le_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

const X: u64 = 0x7f1e_5c00_0000;

#[test]
fn lift_gelu_is_one_launch_over_the_problem_tensors() {
    let c = Case::gelu();
    let l = c.lift().expect("lifts");
    assert_eq!(l.launches.len(), 1);
    let k = &l.launches[0];
    assert_eq!(k.kernel, "gelu_kernel");
    assert_eq!(k.grid, [1024, 1, 1]);
    assert_eq!(k.block, [256, 1, 1]);
    assert_eq!(k.shared_bytes, 0);
    assert!(!k.cooperative && k.cluster.is_none());
    assert_eq!(
        k.args,
        [buf("x"), buf("out"), Arg::Scalar(Scalar::I32(16 * 16384))]
    );
    assert!(
        l.scratch.is_empty(),
        "the output's block is the output, not a temporary"
    );
    assert_eq!(l.source, c.source(0));
    assert_eq!(l.flags, ["-O3", "--use_fast_math"]);
    assert!(
        l.notes
            .iter()
            .any(|n| n == "flag -Xptxas=-v dropped (kiln refuses it)"),
        "{:?}",
        l.notes
    );
    assert!(
        l.notes
            .iter()
            .any(|n| n.starts_with("1 sync in the forward dropped")),
        "{:?}",
        l.notes
    );
    assert!(
        l.notes
            .iter()
            .any(|n| n.contains("launch names from recorded symbols"))
    );

    let cand = l.candidate("gelu", "candidate 1f2e");
    assert_eq!(cand.problem, "gelu");
    assert_eq!(cand.language, Language::Cuda);
    assert_eq!(cand.source, l.source);
    assert_eq!(cand.launches, l.launches);
    assert_eq!(cand.flags, l.flags);
    assert_eq!(cand.parent, None);
    let note = cand.note.as_deref().expect("note");
    assert!(note.starts_with("lifted into the contract"), "{note}");
    assert!(
        note.contains("candidate 1f2e") && note.contains("sync"),
        "{note}"
    );
    assert_eq!(cand.validate(), Ok(()));
}

#[test]
fn lift_two_kernels_make_torch_temporaries_scratch_numbered_by_first_use() {
    let c = Case::new(TWO_KERNELS, ROWNORM_PROBLEM);
    let l = c.lift().expect("lifts");
    let kernels: Vec<&str> = l.launches.iter().map(|k| k.kernel.as_str()).collect();
    assert_eq!(kernels, ["fused::row_stat", "fused::normalize"]);
    let (stat, norm) = (&l.launches[0], &l.launches[1]);
    assert_eq!(stat.grid, [128, 1, 1]);
    assert_eq!(stat.block, [256, 1, 1]);
    assert_eq!(stat.shared_bytes, 2048);
    assert_eq!(
        stat.args,
        [
            buf("x"),
            buf("lift_scratch0"),
            buf("lift_scratch1"),
            Arg::Scalar(Scalar::I32(128)),
            Arg::Scalar(Scalar::I32(4096)),
        ]
    );
    assert_eq!(norm.grid, [2048, 1, 1]);
    assert_eq!(norm.shared_bytes, 0);
    assert_eq!(
        norm.args,
        [
            buf("x"),
            buf("lift_scratch0"),
            buf("lift_scratch1"),
            buf("weight"),
            buf("out"),
            Arg::Scalar(Scalar::I32(128)),
            Arg::Scalar(Scalar::I32(4096)),
        ]
    );
    assert_eq!(
        l.scratch,
        [
            ScratchBuffer {
                name: "lift_scratch0".into(),
                dtype: Dtype::U8,
                elems: 512
            },
            ScratchBuffer {
                name: "lift_scratch1".into(),
                dtype: Dtype::U8,
                elems: 512
            },
        ]
    );
    // The second source holds both kernels; the first (an unused helper) does not.
    assert_eq!(l.source, c.source(1));
    assert_eq!(l.flags, ["-O3", "--use_fast_math"]);
    assert!(
        l.notes
            .iter()
            .any(|n| n.starts_with("device source 2 of the file's 2"))
    );
    assert!(!l.notes.iter().any(|n| n.contains("sync")), "{:?}", l.notes);
    assert_eq!(l.candidate("rownorm", "").validate(), Ok(()));
}

#[test]
fn lift_scratch_takes_the_larger_block_of_the_two_draws() {
    let mut c = Case::new(TWO_KERNELS, ROWNORM_PROBLEM);
    // Draw two's row_max block (its first temporary, at A0 + 512 there) is larger.
    c.second["allocations"][1]["bytes"] = json!(1024);
    let l = c.lift().expect("lifts");
    assert_eq!(l.scratch[0].elems, 1024);
    assert_eq!(l.scratch[1].elems, 512);
    assert!(
        l.notes.iter().any(|n| n.contains("the larger kept")),
        "{:?}",
        l.notes
    );
}

#[test]
fn lift_template_kernel_is_named_by_its_instance() {
    let c = Case::new(TEMPLATE_GELU, GELU_PROBLEM);
    let l = c.lift().expect("lifts");
    assert_eq!(l.launches[0].kernel, "gelu_kernel<float>");
    assert_eq!(
        l.launches[0].args,
        [buf("x"), buf("out"), Arg::Scalar(Scalar::I32(16 * 16384))]
    );
    assert!(l.flags.is_empty());
    assert_eq!(l.source, c.source(0));
    assert_eq!(l.candidate("gelu", "").validate(), Ok(()));
}

#[test]
fn lift_types_literals_from_the_signature() {
    let c = Case::new(SCALE_FLOAT, GELU_PROBLEM);
    let l = c.lift().expect("lifts");
    let k = &l.launches[0];
    assert_eq!(k.kernel, "scale_kernel");
    assert_eq!(k.cluster, Some([2, 1, 1]));
    assert_eq!(
        k.args,
        [
            buf("x"),
            buf("out"),
            Arg::Scalar(Scalar::F32(1.5)),
            Arg::Scalar(Scalar::F64(1e-5)),
            Arg::Scalar(Scalar::U64(16 * 16384)),
        ]
    );
    assert_eq!(l.candidate("gelu", "").validate(), Ok(()));

    // A float whose bits are not a finite number stays the integer of the same bytes.
    let mut nan = Case::new(SCALE_FLOAT, GELU_PROBLEM);
    nan.both(|r| r["ops"][0]["params"][2]["hex"] = json!("0000c07f"));
    let l = nan.lift().expect("lifts");
    assert_eq!(
        l.launches[0].args[2],
        Arg::Scalar(Scalar::I32(i32::from_le_bytes([0, 0, 0xc0, 0x7f])))
    );

    // An extern "C" kernel has no signature: its literals are integers of the same bytes.
    let mut ext = Case::gelu();
    ext.both(|r| r["ops"][0]["symbol"] = json!("gelu_c"));
    ext.sources["sources"][0]["kernels"] = json!(["gelu_c"]);
    let l = ext.lift().expect("lifts");
    assert_eq!(l.launches[0].kernel, "gelu_c");
    assert!(
        l.notes.iter().any(|n| n.contains("extern \"C\"")),
        "{:?}",
        l.notes
    );

    // A pointer that maps to nothing but is the same in both draws is a literal (noted).
    let mut null = Case::gelu();
    null.both(|r| {
        let p = &mut r["ops"][0]["params"];
        p.as_array_mut()
            .expect("params")
            .push(json!({"offset": 24, "size": 8, "hex": "0000000000000000"}));
        r["ops"][0]["symbol"] = json!("_Z11gelu_kernelPKfPfiPv");
    });
    let l = null.lift().expect("lifts");
    assert_eq!(l.launches[0].args[3], Arg::Scalar(Scalar::I64(0)));
    assert!(
        l.notes
            .iter()
            .any(|n| n.contains("a pointer passed as the literal")),
        "{:?}",
        l.notes
    );
}

type Mutation = fn(&mut Case);

/// Every refusal, with its code and words its message must hold.
type RefusalCase = (&'static str, Case, Mutation, &'static [&'static str]);

/// One refusal case (a function, so that each closure becomes a [`Mutation`]).
fn r(
    code: &'static str,
    case: Case,
    mutate: Mutation,
    needles: &'static [&'static str],
) -> RefusalCase {
    (code, case, mutate, needles)
}

fn refusal_cases() -> Vec<RefusalCase> {
    let gelu = Case::gelu;
    let two = || Case::new(TWO_KERNELS, ROWNORM_PROBLEM);
    vec![
        r(
            "not_recorded",
            gelu(),
            |c| c.second["error"] = json!("CUPTI could not subscribe"),
            &["could not be recorded", "CUPTI could not subscribe"],
        ),
        r(
            "bad_recording",
            gelu(),
            |c| c.first["ops"][0]["params"][2]["hex"] = json!("0000040000"),
            &[
                "malformed",
                "launch 0 (gelu_kernel) parameter 2",
                "10 hex digits",
            ],
        ),
        r(
            "bad_recording",
            gelu(),
            |c| c.first["ops"][0]["params"][2]["hex"] = json!("zz000400"),
            &["non-hex"],
        ),
        r(
            // No library kernel, but a memset.
            "memset",
            gelu(),
            |c| {
                let ops = c.first["ops"].as_array_mut().expect("ops");
                ops.insert(
                    0,
                    json!({"op": "memset", "api": "cudaMemsetAsync", "bytes": 4096}),
                );
            },
            &["cudaMemsetAsync", "memset"],
        ),
        r(
            "copy",
            gelu(),
            |c| {
                let ops = c.second["ops"].as_array_mut().expect("ops");
                ops.push(
                    json!({"op": "copy", "api": "cudaMemcpyAsync", "bytes": 4, "kind": "d2h"}),
                );
            },
            &["cudaMemcpyAsync", "d2h"],
        ),
        r(
            "alloc",
            gelu(),
            |c| {
                let ops = c.first["ops"].as_array_mut().expect("ops");
                ops.insert(
                    0,
                    json!({"op": "alloc", "api": "cudaMalloc", "ptr": 1, "bytes": 64}),
                );
            },
            &["cudaMalloc", "outside torch's allocator"],
        ),
        r(
            "other_api",
            gelu(),
            |c| {
                let ops = c.first["ops"].as_array_mut().expect("ops");
                ops.push(json!({"op": "other", "api": "cudaGraphLaunch"}));
            },
            &["cudaGraphLaunch"],
        ),
        r(
            "no_launches",
            gelu(),
            |c| c.both(|r| r["ops"] = json!([{"op": "sync", "api": "cudaStreamSynchronize"}])),
            &["no kernel"],
        ),
        r(
            // A different kernel on the second call.
            "differs",
            gelu(),
            |c| c.second["ops"][0]["symbol"] = json!("_Z11relu_kernelPKfPfi"),
            &["launch 0 (gelu_kernel)", "relu_kernel", "two input draws"],
        ),
        r(
            // A grid that changes with the data.
            "differs",
            two(),
            |c| c.second["ops"][1]["grid"] = json!([1024, 1, 1]),
            &[
                "launch 1 (fused::normalize)",
                "the grid ([2048, 1, 1] then [1024, 1, 1])",
            ],
        ),
        r(
            // A literal that changes with the data.
            "differs",
            gelu(),
            |c| c.second["ops"][0]["params"][2]["hex"] = json!("00000200"),
            &["parameter 2", "00000400", "00000200"],
        ),
        r(
            // A launch only one draw made.
            "differs",
            gelu(),
            |c| {
                let l = c.second["ops"][0].clone();
                c.second["ops"].as_array_mut().expect("ops").push(l);
            },
            &[
                "launch 1 (gelu_kernel)",
                "1 launches in the first draw, 2 in the second",
            ],
        ),
        r(
            // An unmapped pointer that moved.
            "differs",
            gelu(),
            |c| {
                c.first["ops"][0]["params"][1]["hex"] = hex64(0x7f00_0000_0000);
                c.second["ops"][0]["params"][1]["hex"] = hex64(0x7f00_0010_0000);
            },
            &["parameter 1"],
        ),
        r(
            "side_stream",
            two(),
            |c| c.first["ops"][1]["stream"] = json!("other"),
            &["launch 1 (fused::normalize)", "stream"],
        ),
        r(
            "too_large",
            gelu(),
            |c| {
                c.both(|r| {
                    let l = r["ops"][0].clone();
                    r["ops"] = Value::Array(vec![l; 65]);
                })
            },
            &["65 launches", "at most 64"],
        ),
        r(
            // A pointer into a tensor, not at its start.
            "offset",
            gelu(),
            |c| c.both(|r| r["ops"][0]["params"][0]["hex"] = hex64(X + 4096)),
            &["launch 0 (gelu_kernel) parameter 0", "4096 bytes into x"],
        ),
        r(
            "offset",
            two(),
            |c| {
                c.first["ops"][1]["params"][2]["hex"] = hex64(0x7f1e_6200_0200 + 8);
                c.second["ops"][1]["params"][2]["hex"] = hex64(0x7f1e_6200_0000 + 8);
            },
            &[
                "launch 1 (fused::normalize) parameter 2",
                "8 bytes into a temporary",
            ],
        ),
        r(
            "unknown_tensor",
            gelu(),
            |c| c.both(|r| r["regions"][0]["name"] = json!("mystery")),
            &["launch 0 (gelu_kernel) parameter 0", "\"mystery\""],
        ),
        r(
            "output_view",
            gelu(),
            |c| c.second["regions"][1]["contiguous"] = json!(false),
            &["output out", "non-contiguous"],
        ),
        r(
            // forward returned its input.
            "output_is_input",
            gelu(),
            |c| {
                c.both(|r| {
                    r["regions"][1]["ptr"] = json!(X);
                    r["ops"][0]["params"][1]["hex"] = hex64(X);
                })
            },
            &["output out overlaps x"],
        ),
        r(
            "output_unwritten",
            gelu(),
            |c| c.both(|r| r["ops"][0]["params"][1]["hex"] = hex64(0x7f00_0000_0000)),
            &["output out is passed to no launch"],
        ),
        r(
            // A 16-byte struct by value.
            "param_size",
            gelu(),
            |c| {
                c.both(|r| {
                    r["ops"][0]["params"][2] =
                        json!({"offset": 16, "size": 16, "hex": "00000400000000000000803f00000000"})
                })
            },
            &["launch 0 (gelu_kernel) parameter 2", "16-byte value"],
        ),
        r(
            // A kernel in an anonymous namespace.
            "demangle",
            gelu(),
            |c| c.both(|r| r["ops"][0]["symbol"] = json!("_ZN12_GLOBAL__N_111gelu_kernelEPKfPfi")),
            &["_ZN12_GLOBAL__N_111gelu_kernelEPKfPfi"],
        ),
        r(
            "no_source",
            gelu(),
            |c| c.sources["sources"][0]["kernels"] = json!(["relu_kernel"]),
            &["gelu_kernel"],
        ),
        r(
            // A library kernel: no source of the file defines it.
            "no_source",
            gelu(),
            |c| {
                c.both(|r| {
                    r["ops"][0]["symbol"] = json!("_ZN2at6native13reduce_kernelILi512ELi1EEEvv")
                })
            },
            &["at::native::reduce_kernel<512, 1>"],
        ),
        r(
            "fill_target",
            gelu(),
            |c| c.both(|r| with_fill(r, 0xdead_0000, 16 * 16384, "00000000")),
            &["launch 0 (torch's fill)", "no tensor of the problem"],
        ),
        r(
            // ATen's elementwise kernel with another functor (a multiply) is no fill.
            "no_source",
            gelu(),
            |c| {
                c.both(|r| {
                    let out = r["regions"][1]["ptr"].as_u64().expect("out");
                    with_fill(r, out, 16 * 16384, "0000803f");
                    r["ops"][0]["symbol"] = json!(ATEN_MUL);
                })
            },
            &["MulFunctor"],
        ),
    ]
}

/// ATen's fill of a contiguous float tensor (what `torch::zeros` launches).
const ATEN_FILL: &str = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_";
/// The same ATen kernel over a multiply: a library kernel, not a fill.
const ATEN_MUL: &str = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_10MulFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_";

/// Puts ATen's fill of `n` floats (`value`: the element's bytes in hex) at `ptr` first in
/// the recording `r`, as torch launches it for `torch::zeros_like(x)` before the kernel.
fn with_fill(r: &mut Value, ptr: u64, n: i32, value: &str) {
    let n: String = n.to_le_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let fill = json!({
        "op": "launch", "api": "cudaLaunchKernel", "symbol": ATEN_FILL,
        "grid": [256, 1, 1], "block": [128, 1, 1], "shared_bytes": 0, "stream": "current",
        "params": [
            {"offset": 0, "size": 4, "hex": n},
            {"offset": 4, "size": 4, "hex": value},
            {"offset": 8, "size": 8, "hex": hex64(ptr)},
        ],
    });
    r["ops"].as_array_mut().expect("ops").insert(0, fill);
}

/// `torch::zeros_like(x)` for the output, then the file's kernel: torch's fill is kept as
/// kiln's own fill kernel, appended to the file's device source, first in the plan.
#[test]
fn lift_keeps_torchs_fill_of_the_output_as_kilns_fill_kernel() {
    let mut c = Case::gelu();
    c.both(|r| {
        let out = r["regions"][1]["ptr"].as_u64().expect("out");
        with_fill(r, out, 16 * 16384, "00000000");
    });
    let l = c.lift().expect("lifts");
    assert_eq!(l.launches.len(), 2);
    let f = &l.launches[0];
    assert_eq!(f.kernel, "kiln_lift_fill_u32");
    assert_eq!(
        f.args,
        vec![
            buf("out"),
            Arg::Scalar(Scalar::U32(0)),
            Arg::Scalar(Scalar::U64(16 * 16384))
        ]
    );
    assert_eq!(f.block, [256, 1, 1]);
    assert_eq!(f.grid, [1024, 1, 1]);
    assert_eq!(l.launches[1].kernel, "gelu_kernel");
    assert!(l.source.starts_with(&c.source(0)), "{}", l.source);
    assert!(
        l.source
            .contains("extern \"C\" __global__ void kiln_lift_fill_u32(unsigned int*"),
        "{}",
        l.source
    );
    assert!(!l.source.contains("kiln_lift_fill_u8"), "{}", l.source);
    assert!(
        l.notes.iter().any(|n| n.contains("torch's fill of out")),
        "{:?}",
        l.notes
    );
    // The candidate it becomes is a valid contract candidate.
    let candidate = l.candidate("gelu", "");
    candidate.validate().expect("valid");
}

/// A fill of another value (`fill_(1.0)`) keeps its bit pattern; a fill of a temporary
/// from torch's allocator fills a scratch buffer.
#[test]
fn lift_keeps_a_fills_value_and_fills_temporaries_as_scratch() {
    let mut c = Case::gelu();
    let tmp: u64 = 0x7f00_0000_0000;
    c.both(|r| {
        with_fill(r, tmp, 1024, "0000803f");
        r["allocations"]
            .as_array_mut()
            .expect("allocations")
            .push(json!({"ptr": tmp, "bytes": 4096}));
    });
    let l = c.lift().expect("lifts");
    assert_eq!(l.scratch.len(), 1);
    assert_eq!(
        l.launches[0].args,
        vec![
            buf(&l.scratch[0].name),
            Arg::Scalar(Scalar::U32(0x3f80_0000)),
            Arg::Scalar(Scalar::U64(1024))
        ]
    );
    assert_eq!(l.launches[0].grid, [4, 1, 1]);
}

/// torch fills a large tensor in pieces (32-bit indexing): consecutive pieces that
/// continue one another are one fill of the whole tensor; a fill past its tensor's end
/// is refused.
#[test]
fn lift_joins_the_pieces_of_one_fill_and_bounds_it_by_its_buffer() {
    let mut c = Case::gelu();
    c.both(|r| {
        let out = r["regions"][1]["ptr"].as_u64().expect("out");
        // Inserted first, so the second piece goes in first.
        with_fill(r, out + 4 * 131072, 131072, "00000000");
        with_fill(r, out, 131072, "00000000");
    });
    let l = c.lift().expect("lifts");
    assert_eq!(l.launches.len(), 2, "{:?}", l.launches);
    assert_eq!(l.launches[0].args[2], Arg::Scalar(Scalar::U64(262144)));
    assert_eq!(l.launches[1].kernel, "gelu_kernel");

    // A piece of another value is a fill of its own, into the middle of out.
    let mut c = Case::gelu();
    c.both(|r| {
        let out = r["regions"][1]["ptr"].as_u64().expect("out");
        with_fill(r, out + 4 * 131072, 131072, "0000803f");
        with_fill(r, out, 131072, "00000000");
    });
    assert_eq!(c.lift().expect_err("offset").code(), "offset");

    // One element more than out holds.
    let mut c = Case::gelu();
    c.both(|r| {
        let out = r["regions"][1]["ptr"].as_u64().expect("out");
        with_fill(r, out, 262145, "00000000");
    });
    let e = c.lift().expect_err("too long");
    assert_eq!(e.code(), "fill_target", "{e}");
    assert!(e.to_string().contains("1048580 bytes"), "{e}");
}

/// A fill whose element count changes with the draw is a plan that depends on the data.
#[test]
fn lift_refuses_a_fill_that_differs_between_draws() {
    let mut c = Case::gelu();
    let out1 = c.first["regions"][1]["ptr"].as_u64().expect("out");
    let out2 = c.second["regions"][1]["ptr"].as_u64().expect("out");
    with_fill(&mut c.first, out1, 1024, "00000000");
    with_fill(&mut c.second, out2, 2048, "00000000");
    let e = c.lift().expect_err("differs");
    assert_eq!(e.code(), "differs", "{e}");
}

#[test]
fn lift_refusals_each_have_their_code_and_say_why() {
    let mut seen = BTreeSet::new();
    for (code, mut case, mutate, needles) in refusal_cases() {
        mutate(&mut case);
        let err = case.lift().expect_err(code);
        let msg = err.to_string();
        assert_eq!(err.code(), code, "{msg}");
        for n in needles {
            assert!(msg.contains(n), "{code}: {n:?} not in {msg:?}");
        }
        seen.insert(code);
    }
    let all = [
        "not_recorded",
        "bad_recording",
        "memset",
        "copy",
        "alloc",
        "other_api",
        "no_launches",
        "differs",
        "side_stream",
        "too_large",
        "offset",
        "unknown_tensor",
        "output_view",
        "output_is_input",
        "output_unwritten",
        "param_size",
        "demangle",
        "no_source",
        "fill_target",
    ];
    assert_eq!(seen, all.into_iter().collect::<BTreeSet<_>>());
}

#[test]
fn lift_refuses_garbage_and_huge_recordings_without_panicking() {
    for text in [
        "",
        "null",
        "{",
        "{\"ops\": 5}",
        "{\"ops\": [{\"op\": \"teleport\"}]}",
    ] {
        let err = Recording::parse(text).expect_err(text);
        assert_eq!(err.code(), "bad_recording", "{text}: {err}");
    }
    for text in ["", "null", "{", "{\"sources\": {}}", "{\"sources\": [{}]}"] {
        let err = DeviceSources::parse(text).expect_err(text);
        assert_eq!(err.code(), "bad_recording", "{text}: {err}");
    }
    // Every prefix of a real fixture: refused or read, never a panic.
    let first = Case::gelu().first.to_string();
    for end in 0..first.len() {
        let _ = Recording::parse(&first[..end]);
    }
    // A million operations: refused at the 4097th, not read in full.
    let mut huge = String::from("{\"ops\": [");
    for i in 0..1_000_000 {
        if i > 0 {
            huge.push(',');
        }
        huge.push_str("{\"op\":\"sync\",\"api\":\"cudaDeviceSynchronize\"}");
    }
    huge.push_str("]}");
    let err = Recording::parse(&huge).expect_err("huge");
    assert_eq!(err.code(), "bad_recording");
    assert!(err.to_string().contains("more than 4096"), "{err}");
    // 4096 is still read.
    let ok = format!(
        "{{\"ops\": [{}]}}",
        vec!["{\"op\":\"sync\"}"; MAX_OPS].join(",")
    );
    assert_eq!(Recording::parse(&ok).expect("4096 ops").ops.len(), MAX_OPS);
    // Too many parameters in one launch.
    let params = vec!["{\"size\":4,\"hex\":\"00000000\"}"; MAX_PARAMS + 1].join(",");
    let text = format!(
        "{{\"ops\": [{{\"op\":\"launch\",\"symbol\":\"k\",\"grid\":[1,1,1],\"block\":[1,1,1],\
         \"stream\":\"current\",\"params\":[{params}]}}]}}"
    );
    assert_eq!(
        Recording::parse(&text).expect_err("params").code(),
        "bad_recording"
    );
    // A recording built in memory over the bound is refused by the lift too.
    let big = Recording {
        ops: vec![Op::Sync { api: String::new() }; MAX_OPS + 1],
        ..Recording::default()
    };
    let problem = ProblemSpec::from_toml(GELU_PROBLEM).expect("problem");
    let err = lift(&problem, &[], &big, &big).expect_err("big");
    assert_eq!(err.code(), "bad_recording");
}

#[test]
fn lift_reads_unknown_fields_and_defaults_missing_optional_ones() {
    let r = Recording::parse(
        r#"{"ops": [{"op": "launch", "symbol": "k", "grid": [1,1,1], "block": [32,1,1],
                     "stream": "per-thread?", "future_field": [1, 2]}],
            "regions": [{"name": "x", "role": "input", "ptr": 1, "bytes": 4}],
            "version": 2}"#,
    )
    .expect("parses");
    assert_eq!(r.error, None);
    assert!(r.allocations.is_empty());
    let Op::Launch(l) = &r.ops[0] else {
        panic!("a launch")
    };
    assert_eq!(
        l.stream,
        Stream::Other,
        "an unknown stream is not the current one"
    );
    assert_eq!((l.shared_bytes, l.cooperative, l.cluster), (0, false, None));
    assert!(l.params.is_empty());
    assert_eq!(r.regions[0].contiguous, None);
    let s = DeviceSources::parse(r#"{"sources": [{"source": "x", "extra": 1}]}"#).expect("parses");
    assert_eq!(s.sources[0].kernels, Vec::<String>::new());
    assert_eq!(s.sources[0].names_skipped, 0);
    // A required field missing is malformed, not a default.
    assert!(Recording::parse(r#"{"ops": [{"op": "launch", "symbol": "k"}]}"#).is_err());
}

#[test]
fn lift_note_is_bounded() {
    let mut l = Case::gelu().lift().expect("lifts");
    l.notes.push("é".repeat(MAX_NOTE_BYTES));
    let c = l.candidate("gelu", "");
    assert!(c.note.as_ref().expect("note").len() <= MAX_NOTE_BYTES);
    assert_eq!(c.validate(), Ok(()));
}

#[test]
fn lift_blocks_find_starts_and_holders_among_reused_blocks() {
    // A block of 4096 freed and split: a 512-byte block inside it, and the same start
    // handed out twice (256, then 1024 bytes).
    let blocks = Blocks::new(&[
        Allocation {
            ptr: 0x1000,
            bytes: 4096,
        },
        Allocation {
            ptr: 0x1400,
            bytes: 512,
        },
        Allocation {
            ptr: 0x9000,
            bytes: 256,
        },
        Allocation {
            ptr: 0x9000,
            bytes: 1024,
        },
        Allocation {
            ptr: 0x20000,
            bytes: 0,
        },
    ]);
    assert_eq!(blocks.starting_at(0x1400), Some(512));
    assert_eq!(blocks.starting_at(0x9000), Some(1024));
    assert_eq!(blocks.starting_at(0x9001), None);
    assert_eq!(
        blocks.starting_at(0x20000),
        None,
        "an empty block holds nothing"
    );
    assert_eq!(
        blocks.holding(0x1600),
        Some(0x1000),
        "past the small block, in the big one"
    );
    assert_eq!(blocks.holding(0x1401), Some(0x1400));
    assert_eq!(blocks.holding(0x2000), None);
    assert_eq!(blocks.holding(0x93ff), Some(0x9000));
    assert_eq!(blocks.holding(0x9400), None);
    assert_eq!(blocks.holding(0), None);
    assert_eq!(Blocks::new(&[]).holding(5), None);
}

// ---- Triton ---------------------------------------------------------------------------

/// An autotuned softmax: one launch whose BLOCK and num_warps / num_stages the autotuner
/// chose and whose EVEN a heuristic set; the output elsewhere in the second draw.
const TRITON_SOFTMAX: &str = include_str!("../../../../tests/fixtures/lift/triton_softmax.json");
/// A row normalisation in two Triton kernels through a float32 temporary (at another
/// address in the second draw), a grid a lambda computed (cdiv(n, BLOCK) = 512), a dtype
/// constexpr, and a third launch with an empty grid that reached no GPU; a sync.
const TRITON_ROWNORM: &str = include_str!("../../../../tests/fixtures/lift/triton_rownorm.json");

const SOFTMAX_PROBLEM: &str = include_str!("../../../../tests/fixtures/lift/softmax_problem.toml");

impl Case {
    fn softmax() -> Case {
        Case::new(TRITON_SOFTMAX, SOFTMAX_PROBLEM)
    }

    fn rownorm() -> Case {
        Case::new(TRITON_ROWNORM, ROWNORM_PROBLEM)
    }

    /// The lift of the whole file (CUDA or Triton, as its recordings say).
    fn lift_file(&self) -> Result<Lifted, Refusal> {
        let sources = DeviceSources::parse(&self.sources.to_string())?;
        let first = Recording::parse(&self.first.to_string())?;
        let second = Recording::parse(&self.second.to_string())?;
        lift_file(&self.problem, &sources, &first, &second)
    }

    fn triton_source(&self) -> String {
        self.sources["triton"]["source"]
            .as_str()
            .expect("triton source")
            .to_string()
    }
}

fn i32s(v: i32) -> Arg {
    Arg::Scalar(Scalar::I32(v))
}

#[test]
fn lift_triton_autotuned_softmax_is_one_launch_with_the_chosen_config() {
    let c = Case::softmax();
    let l = c.lift_file().expect("lifts");
    assert_eq!(l.language, Language::Triton);
    assert_eq!(l.source, c.triton_source());
    assert!(l.flags.is_empty() && l.scratch.is_empty());
    let [k] = l.launches.as_slice() else {
        panic!("one launch: {:?}", l.launches)
    };
    assert_eq!(k.kernel, "softmax_kernel");
    assert_eq!(k.grid, [256, 1, 1]);
    assert_eq!(
        (k.block, k.shared_bytes),
        ([1, 1, 1], 0),
        "Triton's compile gives them"
    );
    assert_eq!(
        k.args,
        [
            buf("x"),
            buf("out"),
            i32s(4096),
            Arg::Scalar(Scalar::F32(0.5))
        ]
    );
    let want: BTreeMap<String, Constexpr> = [
        ("BLOCK".to_string(), Constexpr::Int(4096)),
        ("EVEN".to_string(), Constexpr::Bool(true)),
    ]
    .into();
    assert_eq!(k.constexprs, want);
    assert_eq!(
        (k.num_warps, k.num_stages, k.num_ctas),
        (Some(8), Some(2), Some(1))
    );
    assert!(
        l.notes.iter().any(|n| n.contains("Triton launches")),
        "{:?}",
        l.notes
    );
    let cand = l.candidate("softmax", "");
    assert_eq!(cand.language, Language::Triton);
    assert!(cand.flags.is_empty());
    assert_eq!(cand.validate(), Ok(()));
    // The compile plan kiln makes of it: pointers to f32, the scalars' types.
    let plan = crate::engine::triton::spec::plan(&c.problem, &cand).expect("plan");
    assert_eq!(plan.kernels[0].arg_types, ["*fp32", "*fp32", "i32", "fp32"]);
    assert_eq!(
        (plan.kernels[0].num_warps, plan.kernels[0].num_stages),
        (8, 2)
    );
}

#[test]
fn lift_triton_kernels_through_a_temporary_become_a_typed_scratch_buffer() {
    let c = Case::rownorm();
    let l = c.lift_file().expect("lifts");
    assert_eq!(l.language, Language::Triton);
    let kernels: Vec<&str> = l.launches.iter().map(|k| k.kernel.as_str()).collect();
    assert_eq!(
        kernels,
        ["row_stats", "normalize"],
        "the empty-grid launch is dropped"
    );
    let (stats, norm) = (&l.launches[0], &l.launches[1]);
    assert_eq!(stats.grid, [128, 1, 1]);
    assert_eq!(stats.args, [buf("x"), buf("lift_scratch0"), i32s(4096)]);
    assert_eq!(norm.grid, [512, 1, 1], "the grid a lambda computed");
    assert_eq!(
        norm.args,
        [
            buf("x"),
            buf("lift_scratch0"),
            buf("weight"),
            buf("out"),
            i32s(524288),
            i32s(4096)
        ]
    );
    assert_eq!(norm.constexprs["BLOCK"], Constexpr::Int(1024));
    assert_eq!(
        norm.constexprs["DTYPE"],
        Constexpr::Str("tl.float32".into())
    );
    assert_eq!(
        l.scratch,
        [ScratchBuffer {
            name: "lift_scratch0".into(),
            dtype: Dtype::F32,
            elems: 256
        }],
        "a float32 temporary of 1024 bytes"
    );
    for want in [
        "1 sync in the forward dropped",
        "1 Triton launch with an empty grid",
    ] {
        assert!(
            l.notes.iter().any(|n| n.starts_with(want)),
            "{want}: {:?}",
            l.notes
        );
    }
    let cand = l.candidate("rownorm", "");
    assert_eq!(cand.validate(), Ok(()));
    let plan = crate::engine::triton::spec::plan(&c.problem, &cand).expect("plan");
    assert_eq!(plan.kernels[0].arg_types, ["*fp32", "*fp32", "i32"]);
}

#[test]
fn lift_triton_types_scalars_as_tritons_jit_does() {
    let mut c = Case::rownorm();
    c.both(|r| r["triton"][0]["args"][2]["value"] = json!(1u64 << 40));
    let l = c.lift_file().expect("lifts");
    assert_eq!(l.launches[0].args[2], Arg::Scalar(Scalar::I64(1 << 40)));
    c.both(|r| r["triton"][0]["args"][2]["value"] = json!((1u64 << 63) + 1));
    let l = c.lift_file().expect("lifts");
    assert_eq!(
        l.launches[0].args[2],
        Arg::Scalar(Scalar::U64((1 << 63) + 1))
    );
    c.both(|r| r["triton"][0]["args"][2]["value"] = json!(-7));
    let l = c.lift_file().expect("lifts");
    assert_eq!(l.launches[0].args[2], i32s(-7));
    // Compile options at their defaults are no options.
    let mut d = Case::softmax();
    d.both(|r| r["triton"][0]["options"] = json!({"enable_fp_fusion": true, "debug": false}));
    assert!(d.lift_file().is_ok());
}

#[test]
fn lift_file_takes_the_cuda_path_without_triton_launches() {
    let c = Case::gelu();
    assert_eq!(c.lift_file(), c.lift());
    assert_eq!(c.lift_file().expect("lifts").language, Language::Cuda);
    // A file with both: the forward that launched only CUDA kernels is lifted as CUDA.
    let mut both = Case::gelu();
    both.sources["triton"] = json!({"source": "import triton\n", "kernels": ["k"]});
    assert_eq!(both.lift_file().expect("lifts").language, Language::Cuda);
}

#[test]
fn lift_triton_recordings_read_defaults_and_bounds() {
    let r = Recording::parse(
        r#"{"triton": [{"kernel": "k", "grid": [1, 2, 3],
                        "args": [{"name": "x", "kind": "tensor", "ptr": 4096}], "future": 1}]}"#,
    )
    .expect("parses");
    let t = &r.triton[0];
    assert_eq!((t.num_warps, t.num_stages, t.num_ctas), (4, 3, 1));
    assert!(t.options.is_empty());
    assert!(!t.args[0].constexpr);
    assert_eq!(t.args[0].ptr, Some(4096));
    let s = DeviceSources::parse(r#"{"sources": []}"#).expect("parses");
    assert_eq!(s.triton, None);
    let s = DeviceSources::parse(r#"{"sources": [], "triton": {"source": "x"}}"#).expect("parses");
    assert!(s.triton.expect("triton").kernels.is_empty());
    // Too many Triton launches, or a grid that is no number.
    let many = format!(
        "{{\"triton\": [{}]}}",
        vec![r#"{"kernel":"k","grid":[1,1,1]}"#; MAX_OPS + 1].join(",")
    );
    assert_eq!(
        Recording::parse(&many).expect_err("many").code(),
        "bad_recording"
    );
    assert!(Recording::parse(r#"{"triton": [{"kernel": "k", "grid": [1.5, 1, 1]}]}"#).is_err());
}

fn triton_refusal_cases() -> Vec<RefusalCase> {
    let sm = Case::softmax;
    let rn = Case::rownorm;
    vec![
        r(
            // The autotuner picked another config on the second draw.
            "differs",
            sm(),
            |c| c.second["triton"][0]["args"][4]["value"] = json!(2048),
            &[
                "launch 0 (softmax_kernel)",
                "constexpr BLOCK is 4096",
                "2048",
            ],
        ),
        r(
            "differs",
            sm(),
            |c| c.second["triton"][0]["args"][3]["value"] = json!(0.25),
            &["argument scale is 0.5 in the first draw, 0.25"],
        ),
        r(
            "differs",
            sm(),
            |c| {
                c.second["triton"][0]["num_warps"] = json!(4);
                c.second["ops"][0]["block"] = json!([128, 1, 1]);
            },
            &["num_warps, num_stages, num_ctas: (8, 2, 1) then (4, 2, 1)"],
        ),
        r(
            // The temporary in the first draw, the input in the second.
            "differs",
            rn(),
            |c| c.second["triton"][1]["args"][1]["ptr"] = json!(0x7f1e_6000_0000u64),
            &[
                "launch 1 (normalize)",
                "argument 1 is temporary #0",
                "tensor x",
            ],
        ),
        r(
            "triton_arg",
            rn(),
            |c| {
                c.both(|r| {
                    r["triton"][1]["args"][2] =
                        json!({"name": "w_ptr", "constexpr": false, "kind": "none"})
                })
            },
            &["Triton launch 1 (normalize) argument w_ptr", "None"],
        ),
        r(
            "triton_arg",
            sm(),
            |c| c.both(|r| r["triton"][0]["args"][1]["dtype"] = json!("float16")),
            &["out passed as float16", "the problem's out is float32"],
        ),
        r(
            "triton_arg",
            sm(),
            |c| {
                c.both(|r| {
                    r["triton"][0]["args"][3] =
                        json!({"name": "scale", "constexpr": false, "kind": "bool", "value": true})
                })
            },
            &["argument scale", "a bool"],
        ),
        r(
            // A tensor made before the forward (a module attribute): no region, no block.
            "triton_arg",
            sm(),
            |c| c.both(|r| r["triton"][0]["args"][0]["ptr"] = json!(0x7000_0000_0000u64)),
            &["argument x_ptr", "no tensor of the problem"],
        ),
        r(
            "triton_arg",
            sm(),
            |c| {
                c.both(|r| {
                    r["triton"][0]["args"][4] =
                        json!({"name": "BLOCK", "constexpr": true, "kind": "other", "type": "JITFunction"})
                })
            },
            &["argument BLOCK", "a constexpr given a JITFunction"],
        ),
        r(
            // A torch kernel between the Triton launches (a .contiguous(), a zero_()).
            "triton_mismatch",
            sm(),
            |c| {
                c.both(|r| {
                    let ops = r["ops"].as_array_mut().expect("ops");
                    let mut fill = ops[0].clone();
                    fill["symbol"] =
                        json!("_ZN2at6native29vectorized_elementwise_kernelILi4EZNS0_4fillEvv");
                    ops.insert(0, fill);
                })
            },
            &[
                "launch 0",
                "the GPU ran",
                "where Triton launched softmax_kernel",
            ],
        ),
        r(
            // Triton captured a launch that the GPU never ran.
            "triton_mismatch",
            sm(),
            |c| c.both(|r| r["ops"] = json!([])),
            &["Triton launched softmax_kernel but the GPU ran only 0 launches"],
        ),
        r(
            "triton_mismatch",
            sm(),
            |c| c.both(|r| r["ops"][0]["block"] = json!([128, 1, 1])),
            &[
                "softmax_kernel: the GPU's block is [128, 1, 1]",
                "num_warps 8",
            ],
        ),
        r(
            "triton_mismatch",
            rn(),
            |c| c.both(|r| r["ops"][1]["grid"] = json!([256, 1, 1])),
            &[
                "launch 1",
                "normalize: the GPU's grid is [256, 1, 1], Triton's [512, 1, 1]",
            ],
        ),
        r(
            "mixed",
            sm(),
            |c| {
                c.sources["sources"] = json!([{"source": "__global__ void scale_kernel(float* y) {}",
                                               "kernels": ["scale_kernel"]}]);
                c.both(|r| {
                    let ops = r["ops"].as_array_mut().expect("ops");
                    let mut k = ops[0].clone();
                    k["symbol"] = json!("_Z12scale_kernelPf");
                    ops.push(k);
                })
            },
            &["Triton kernels and the file's CUDA kernel scale_kernel"],
        ),
        r(
            "triton_option",
            sm(),
            |c| {
                c.both(|r| {
                    r["triton"][0]["num_ctas"] = json!(2);
                    r["ops"][0]["grid"] = json!([512, 1, 1]);
                })
            },
            &["Triton launch 0 (softmax_kernel)", "num_ctas = 2"],
        ),
        r(
            "triton_option",
            sm(),
            |c| c.both(|r| r["triton"][0]["options"] = json!({"maxnreg": 128})),
            &["the compile option maxnreg=128"],
        ),
        r(
            "no_triton_source",
            sm(),
            |c| c.sources["triton"] = Value::Null,
            &["defines no jit function softmax_kernel"],
        ),
        r(
            "no_triton_source",
            rn(),
            |c| c.sources["triton"]["kernels"] = json!(["row_stats"]),
            &["normalize"],
        ),
        r(
            "not_recorded",
            sm(),
            |c| c.first["error"] = json!("a Triton launch could not be recorded: ValueError"),
            &["a Triton launch could not be recorded"],
        ),
        r(
            "output_unwritten",
            sm(),
            |c| c.both(|r| r["regions"][1]["ptr"] = json!(0x7f3a_5000_0000u64)),
            &["output out is passed to no launch"],
        ),
        r(
            "memset",
            sm(),
            |c| {
                c.first["ops"]
                    .as_array_mut()
                    .expect("ops")
                    .push(json!({"op": "memset", "api": "cudaMemsetAsync", "bytes": 64}))
            },
            &["cudaMemsetAsync"],
        ),
    ]
}

#[test]
fn lift_triton_refusals_each_have_their_code_and_say_why() {
    let mut seen = BTreeSet::new();
    for (code, mut case, mutate, needles) in triton_refusal_cases() {
        mutate(&mut case);
        let err = case.lift_file().expect_err(code);
        let msg = err.to_string();
        assert_eq!(err.code(), code, "{msg}");
        for n in needles {
            assert!(msg.contains(n), "{code}: {n:?} not in {msg:?}");
        }
        seen.insert(code);
    }
    for code in [
        "triton_mismatch",
        "mixed",
        "triton_arg",
        "triton_option",
        "no_triton_source",
    ] {
        assert!(seen.contains(code), "{code} untested");
    }
}

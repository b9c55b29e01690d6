//! The lift of a forward that launched Triton kernels: a `triton` contract candidate.
//!
//! CUPTI sees a Triton launch as a driver launch (`cuLaunchKernelEx`) of a kernel named
//! after its jit function (Triton 3.x appends nothing to the name; the block is 32 ×
//! num_warps threads, the grid's x is the program grid's × num_ctas), with the arguments
//! already packed. What a Triton launch plan needs is Triton's: the runner also captures
//! every `JITFunction.run` call of the forward ([`TritonLaunch`]: the function, the grid,
//! every parameter with its value and whether it is a `tl.constexpr`, the options). The
//! lift checks that the two views agree (every GPU launch is one of the captured Triton
//! launches, in order, same name, grid and block; a torch or library kernel between them
//! refuses, so does one of the file's own CUDA kernels: [`Refusal::Mixed`]), that the two
//! draws made the same launches with the same constexprs, scalars and options, and maps
//! each tensor argument as the CUDA lift maps a pointer (a problem tensor or a temporary
//! of torch's allocator, at its start; see [`super::pointer_class`]). A Triton kernel is
//! compiled for its pointers' element types, so a tensor must be passed with its
//! problem dtype and a temporary becomes a scratch buffer of the dtype it was passed as.
//! The source is the file's Triton source as the extractor read it
//! ([`TritonSource`]: the jit functions without autotune / heuristics, with the imports
//! and constants they use).

use std::collections::BTreeMap;

use kiln_types::candidate::{
    Arg, Constexpr, Launch, MAX_ARGS, MAX_CONSTEXPR_STR, MAX_CONSTEXPRS, MAX_NUM_STAGES,
    MAX_NUM_WARPS, MAX_SOURCE_BYTES, Scalar,
};
use kiln_types::{Dtype, Language, ProblemSpec};
use serde_json::Value;

use super::{
    Class, DeviceSources, LaunchOp, Lifted, Memory, Miss, Recording, Refusal, TritonArg,
    TritonLaunch, check_bounds, check_ops, clip, compare_launches, current_stream_only, names,
    pointer_class, shown, within_launches,
};

/// Compile options a Triton launch may give at their default value only (what kiln's
/// Triton compile uses: it passes num_warps, num_stages and num_ctas alone).
const OPTION_DEFAULTS: &[(&str, bool)] = &[
    ("enable_fp_fusion", true),
    ("launch_cooperative_grid", false),
    ("launch_pdl", false),
    ("debug", false),
    ("sched4reg", false),
    ("clc", false),
    ("sanitize_overflow", true),
    ("enable_reflect_ftz", true),
];

/// The kiln dtype of a torch dtype's name (`float32`), if kiln has it.
fn dtype_of(torch: &str) -> Option<Dtype> {
    Some(match torch {
        "float32" => Dtype::F32,
        "float64" => Dtype::F64,
        "float16" => Dtype::F16,
        "bfloat16" => Dtype::Bf16,
        "int32" => Dtype::I32,
        "int64" => Dtype::I64,
        "uint8" => Dtype::U8,
        _ => return None,
    })
}

/// torch's name of a kiln dtype.
fn torch_name(d: Dtype) -> &'static str {
    match d {
        Dtype::F32 => "float32",
        Dtype::F64 => "float64",
        Dtype::F16 => "float16",
        Dtype::Bf16 => "bfloat16",
        Dtype::I32 => "int32",
        Dtype::I64 => "int64",
        Dtype::U8 => "uint8",
    }
}

/// A Triton launch's value as shown in a message.
fn describe(a: &TritonArg) -> String {
    match (a.kind.as_str(), &a.value) {
        ("tensor", _) => format!(
            "a tensor ({})",
            clip(a.dtype.as_deref().unwrap_or("dtype unknown"))
        ),
        ("none", _) => "None".into(),
        ("other", _) => format!(
            "a {}",
            clip(a.type_name.as_deref().unwrap_or("value of unknown type"))
        ),
        ("float", Some(Value::Null) | None) => clip(a.text.as_deref().unwrap_or("a float")),
        (_, Some(v)) => clip(&v.to_string()),
        (k, None) => format!("a {}", clip(k)),
    }
}

/// The launches of one draw that reached the GPU: the Triton launches with a grid of no
/// zero dimension (Triton launches nothing for those), after checking them against the
/// GPU launches CUPTI saw. `cuda` holds the base names of the file's CUDA kernels.
fn matched<'a>(
    r: &'a Recording,
    cuda: &[String],
) -> Result<(Vec<&'a TritonLaunch>, usize), Refusal> {
    let gpu: Vec<&LaunchOp> = r.launches().collect();
    for t in &r.triton {
        if let Some(d) = t
            .grid
            .iter()
            .find(|&&d| !(0..=i64::from(u32::MAX)).contains(&d))
        {
            return Err(Refusal::BadRecording(format!(
                "a Triton launch of {} with grid dimension {d}",
                clip(&t.kernel)
            )));
        }
    }
    let (launched, empty): (Vec<&TritonLaunch>, Vec<&TritonLaunch>) =
        r.triton.iter().partition(|t| !t.grid.contains(&0));
    let triton_names: Vec<&str> = launched.iter().map(|t| t.kernel.as_str()).collect();
    // One of the file's own CUDA kernels among them: a mixed file.
    for l in &gpu {
        if triton_names.contains(&l.symbol.as_str()) {
            continue;
        }
        if let Some(k) = names::kernel_name(&l.symbol)
            && cuda.contains(&names::base_name(&k.expr))
        {
            return Err(Refusal::Mixed { kernel: k.expr });
        }
    }
    for i in 0..gpu.len().max(launched.len()) {
        let mismatch = |what: String| Refusal::TritonMismatch { launch: i, what };
        let (g, t) = match (gpu.get(i), launched.get(i)) {
            (Some(g), Some(t)) => (*g, *t),
            (Some(g), None) => {
                return Err(mismatch(format!(
                    "the GPU ran {} after the forward's {} Triton launches (a torch or library \
                     kernel is no part of a Triton launch plan)",
                    shown(g),
                    launched.len()
                )));
            }
            (None, t) => {
                return Err(mismatch(format!(
                    "Triton launched {} but the GPU ran only {} launches",
                    t.map_or_else(String::new, |t| clip(&t.kernel)),
                    gpu.len()
                )));
            }
        };
        if g.symbol != t.kernel {
            return Err(mismatch(format!(
                "the GPU ran {} where Triton launched {} (a torch or library kernel is no part \
                 of a Triton launch plan)",
                shown(g),
                clip(&t.kernel)
            )));
        }
        let ctas = u64::try_from(t.num_ctas).unwrap_or(0);
        let want_grid = [
            (t.grid[0] as u64).saturating_mul(ctas),
            t.grid[1] as u64,
            t.grid[2] as u64,
        ];
        if g.grid.map(u64::from) != want_grid {
            return Err(mismatch(format!(
                "{}: the GPU's grid is {:?}, Triton's {:?} (num_ctas {})",
                clip(&t.kernel),
                g.grid,
                t.grid,
                t.num_ctas
            )));
        }
        let want_block = [32i64.saturating_mul(t.num_warps), 1, 1];
        if g.block.map(i64::from) != want_block {
            return Err(mismatch(format!(
                "{}: the GPU's block is {:?}, but num_warps {} makes {:?}",
                clip(&t.kernel),
                g.block,
                t.num_warps,
                want_block
            )));
        }
    }
    Ok((launched, empty.len()))
}

/// Refuses two draws whose Triton launches differ in anything but their tensors'
/// addresses.
fn compare(a: &[&TritonLaunch], b: &[&TritonLaunch]) -> Result<(), Refusal> {
    if a.len() != b.len() {
        let i = a.len().min(b.len());
        let t = a.get(i).or(b.get(i)).copied();
        return Err(Refusal::Differs {
            launch: i,
            kernel: t.map(|t| clip(&t.kernel)).unwrap_or_default(),
            what: format!(
                "{} Triton launches in the first draw, {} in the second",
                a.len(),
                b.len()
            ),
        });
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let differs = |what: String| Refusal::Differs {
            launch: i,
            kernel: clip(&x.kernel),
            what,
        };
        if x.kernel != y.kernel {
            return Err(differs(format!(
                "the jit function ({} then {})",
                clip(&x.kernel),
                clip(&y.kernel)
            )));
        }
        if x.grid != y.grid {
            return Err(differs(format!(
                "the grid ({:?} then {:?})",
                x.grid, y.grid
            )));
        }
        let options = |t: &TritonLaunch| (t.num_warps, t.num_stages, t.num_ctas);
        if options(x) != options(y) {
            return Err(differs(format!(
                "the options (num_warps, num_stages, num_ctas: {:?} then {:?})",
                options(x),
                options(y)
            )));
        }
        if x.options != y.options {
            return Err(differs("the compile options".into()));
        }
        let shape = |t: &TritonLaunch| -> Vec<(String, bool)> {
            t.args
                .iter()
                .map(|a| (a.name.clone(), a.constexpr))
                .collect()
        };
        if shape(x) != shape(y) {
            return Err(differs("the parameters".into()));
        }
        for (p, q) in x.args.iter().zip(&y.args) {
            let same = if p.kind == "tensor" {
                q.kind == "tensor" && p.dtype == q.dtype
            } else {
                p.kind == q.kind && p.value == q.value && p.text == q.text
            };
            if !same {
                let what = if p.constexpr { "constexpr" } else { "argument" };
                return Err(differs(format!(
                    "{what} {} is {} in the first draw, {} in the second",
                    clip(&p.name),
                    describe(p),
                    describe(q)
                )));
            }
        }
    }
    Ok(())
}

/// A Triton launch's non-constexpr argument, as one draw has it.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    /// A problem tensor, by name.
    Tensor(String),
    /// torch's temporary number `n` (by first use).
    Scratch(usize),
    /// A scalar.
    Scalar(Scalar),
}

impl Item {
    fn describe(&self) -> String {
        match self {
            Item::Tensor(n) => format!("tensor {n}"),
            Item::Scratch(k) => format!("temporary #{k}"),
            Item::Scalar(s) => format!("{s:?}"),
        }
    }
}

/// The scalar a launch plan passes for a non-constexpr argument that is no tensor,
/// typed as Triton's JIT types it (an int: i32 when it fits, else i64, else u64; a float:
/// fp32), or why it cannot be passed.
fn scalar(a: &TritonArg) -> Result<Scalar, String> {
    match (a.kind.as_str(), &a.value) {
        ("int", Some(Value::Number(n))) => {
            if let Some(v) = n.as_i64() {
                Ok(i32::try_from(v).map_or(Scalar::I64(v), Scalar::I32))
            } else if let Some(v) = n.as_u64() {
                Ok(Scalar::U64(v))
            } else {
                Err(format!("the integer {n} is out of the 64-bit range"))
            }
        }
        ("float", Some(Value::Number(n))) => {
            let f = n.as_f64().unwrap_or(f64::NAN) as f32;
            if f.is_finite() {
                Ok(Scalar::F32(f))
            } else {
                Err(format!(
                    "the float {n} is not a finite 32-bit float (Triton passes floats as fp32)"
                ))
            }
        }
        ("float", _) => Err(format!(
            "the float {} is not finite; a launch plan passes finite numbers",
            clip(a.text.as_deref().unwrap_or("?"))
        )),
        ("bool", _) => Err(
            "a bool (Triton's i1): a launch plan's scalars are i32, i64, u32, u64, f32 and \
             f64; make it a tl.constexpr or an int"
                .into(),
        ),
        ("none", _) => Err(
            "None: a launch plan passes a tensor or a number for every argument that is not a \
             tl.constexpr"
                .into(),
        ),
        ("int" | "str" | "dtype", _) => Err(format!(
            "{}, which a launch plan cannot pass as an argument (only as a tl.constexpr)",
            describe(a)
        )),
        _ => Err(format!(
            "{}, which a launch plan cannot pass (tensors and numbers only)",
            describe(a)
        )),
    }
}

/// A constexpr's value in a launch plan, or why it cannot be given.
fn constexpr(a: &TritonArg) -> Result<Constexpr, String> {
    match (a.kind.as_str(), &a.value) {
        ("int", Some(Value::Number(n))) => n
            .as_i64()
            .map(Constexpr::Int)
            .ok_or_else(|| format!("the integer {n} is out of a constexpr's 64-bit range")),
        ("float", Some(Value::Number(n))) => match n.as_f64() {
            Some(f) if f.is_finite() => Ok(Constexpr::Float(f)),
            _ => Err(format!("the float {n} is not finite")),
        },
        ("bool", Some(Value::Bool(b))) => Ok(Constexpr::Bool(*b)),
        ("str", Some(Value::String(s))) | ("dtype", Some(Value::String(s)))
            if s.len() <= MAX_CONSTEXPR_STR && !s.contains('\0') =>
        {
            if a.kind == "dtype" && !s.starts_with("tl.") {
                return Err(format!("the dtype {} is no triton.language name", clip(s)));
            }
            Ok(Constexpr::Str(s.clone()))
        }
        ("str", Some(Value::String(_))) => Err(format!(
            "a string of more than {MAX_CONSTEXPR_STR} bytes (or with a NUL)"
        )),
        ("none", _) => Err(
            "None: a launch plan's constexprs are numbers, booleans and strings (leave out a \
             constexpr whose default is None by not passing it)"
                .into(),
        ),
        _ => Err(format!(
            "{}, which is no constexpr a launch plan holds (numbers, booleans, strings, \
             triton.language dtypes)",
            describe(a)
        )),
    }
}

/// One draw's launches mapped: each non-constexpr argument a buffer or a scalar; and the
/// temporaries by number (`(start, bytes)`).
struct Mapped {
    args: Vec<Vec<Item>>,
    scratch: Vec<(u64, u64)>,
}

fn map(launches: &[&TritonLaunch], mem: &Memory) -> Result<Mapped, Refusal> {
    let mut out = Mapped {
        args: Vec::with_capacity(launches.len()),
        scratch: Vec::new(),
    };
    for (i, t) in launches.iter().enumerate() {
        let mut items = Vec::new();
        for (j, a) in t.args.iter().filter(|a| !a.constexpr).enumerate() {
            let refuse = |why: String| Refusal::TritonArg {
                launch: i,
                kernel: clip(&t.kernel),
                param: clip(&a.name),
                why,
            };
            if a.kind != "tensor" {
                items.push(Item::Scalar(scalar(a).map_err(refuse)?));
                continue;
            }
            let ptr = a.ptr.ok_or_else(|| {
                Refusal::BadRecording(format!(
                    "Triton launch {i} ({}): a tensor argument without its pointer",
                    clip(&t.kernel)
                ))
            })?;
            let class = pointer_class(mem, ptr, &mut out.scratch).map_err(|miss| match miss {
                Miss::Unknown(name) => Refusal::UnknownTensor {
                    name,
                    place: format!(
                        "Triton launch {i} ({}) argument {} points into",
                        clip(&t.kernel),
                        clip(&a.name)
                    ),
                },
                Miss::Offset(name, offset) => Refusal::Offset {
                    launch: i,
                    kernel: clip(&t.kernel),
                    param: j,
                    name,
                    offset,
                },
            })?;
            items.push(match class {
                Some(Class::Tensor(n)) => Item::Tensor(n),
                Some(Class::Scratch(k)) => Item::Scratch(k),
                Some(Class::Literal(_)) | None => {
                    return Err(refuse(
                        "a tensor that is no tensor of the problem and no temporary torch's \
                         allocator handed out during the forward (a tensor kept from before \
                         it?)"
                            .into(),
                    ));
                }
            });
        }
        out.args.push(items);
    }
    Ok(out)
}

/// Lifts a forward that launched Triton kernels (see the module's documentation): both
/// recorded; launches and syncs only; each draw's GPU launches its Triton launches; the
/// same launches, constexprs, scalars and options in both draws; torch's current stream;
/// within a plan's limits; every tensor a whole problem tensor of its dtype or a
/// temporary, the same in both draws, the outputs contiguous, apart from every input and
/// each passed to a launch; scalars and constexprs a plan holds; num_ctas 1 and no other
/// option; the file's Triton source defining every launched function.
pub fn lift(
    problem: &ProblemSpec,
    sources: &DeviceSources,
    first: &Recording,
    second: &Recording,
) -> Result<Lifted, Refusal> {
    let draws = [first, second];
    for r in draws {
        if let Some(e) = &r.error {
            return Err(Refusal::NotRecorded(clip(e)));
        }
    }
    for r in draws {
        check_bounds(r)?;
        if r.triton.len() > super::MAX_OPS {
            return Err(Refusal::BadRecording(format!(
                "{} Triton launches; at most {} are read",
                r.triton.len(),
                super::MAX_OPS
            )));
        }
        if let Some(t) = r.triton.iter().find(|t| t.args.len() > super::MAX_PARAMS) {
            return Err(Refusal::BadRecording(format!(
                "a Triton launch of {} with {} arguments; at most {} are read",
                clip(&t.kernel),
                t.args.len(),
                super::MAX_PARAMS
            )));
        }
    }
    for r in draws {
        check_ops(r)?;
    }
    let cuda: Vec<String> = sources
        .sources
        .iter()
        .flat_map(|s| s.kernels.iter().map(|k| names::base_name(k)))
        .collect();
    let (a, empty) = matched(first, &cuda)?;
    let (b, _) = matched(second, &cuda)?;
    if a.is_empty() && b.is_empty() {
        return Err(Refusal::NoLaunches);
    }
    compare(&a, &b)?;
    let ga: Vec<&LaunchOp> = first.launches().collect();
    let gb: Vec<&LaunchOp> = second.launches().collect();
    compare_launches(&ga, &gb)?;
    current_stream_only(&ga, &gb)?;
    within_launches(a.len())?;
    for (i, t) in a.iter().enumerate() {
        let plain = t.args.iter().filter(|x| !x.constexpr).count();
        if plain > MAX_ARGS {
            return Err(Refusal::TooLarge(format!(
                "Triton launch {i} ({}) has {plain} arguments; a launch takes at most {MAX_ARGS}",
                clip(&t.kernel)
            )));
        }
        if t.args.len() - plain > MAX_CONSTEXPRS {
            return Err(Refusal::TooLarge(format!(
                "Triton launch {i} ({}) has {} constexprs; a launch takes at most \
                 {MAX_CONSTEXPRS}",
                clip(&t.kernel),
                t.args.len() - plain
            )));
        }
    }

    let m1 = map(&a, &Memory::new(problem, first)?)?;
    let m2 = map(&b, &Memory::new(problem, second)?)?;
    for (i, (x, y)) in m1.args.iter().zip(&m2.args).enumerate() {
        if let Some(j) = x.iter().zip(y).position(|(p, q)| p != q) {
            return Err(Refusal::Differs {
                launch: i,
                kernel: clip(&a[i].kernel),
                what: format!(
                    "argument {j} is {} in the first draw, {} in the second",
                    x[j].describe(),
                    y[j].describe()
                ),
            });
        }
    }
    super::outputs_passed(problem, |name| {
        m1.args
            .iter()
            .flatten()
            .any(|c| matches!(c, Item::Tensor(n) if n == name))
    })?;

    // Pointer types: a problem tensor passed as its own dtype; a temporary as one dtype
    // throughout (its scratch buffer's).
    let mut scratch_dtype: Vec<Option<Dtype>> = vec![None; m1.scratch.len()];
    for (i, (t, items)) in a.iter().zip(&m1.args).enumerate() {
        let tensors = t.args.iter().filter(|x| !x.constexpr);
        for (arg, item) in tensors.zip(items) {
            if matches!(item, Item::Scalar(_)) {
                continue;
            }
            let refuse = |why: String| Refusal::TritonArg {
                launch: i,
                kernel: clip(&t.kernel),
                param: clip(&arg.name),
                why,
            };
            let torch = arg.dtype.as_deref().unwrap_or("");
            let Some(dtype) = dtype_of(torch) else {
                return Err(refuse(format!(
                    "a tensor of dtype {}, which kiln has no buffers of",
                    clip(if torch.is_empty() { "unknown" } else { torch })
                )));
            };
            match item {
                Item::Tensor(name) => {
                    let want = problem.tensor(name).map(|x| x.dtype);
                    if want != Some(dtype) {
                        return Err(refuse(format!(
                            "{name} passed as {torch}; the problem's {name} is {} (Triton \
                             compiles the kernel for its pointers' element types)",
                            want.map_or("unknown", torch_name)
                        )));
                    }
                }
                Item::Scratch(k) => match scratch_dtype[*k] {
                    None => scratch_dtype[*k] = Some(dtype),
                    Some(d) if d == dtype => {}
                    Some(d) => {
                        return Err(refuse(format!(
                            "a temporary passed as {torch} here and as {} before (a scratch \
                             buffer has one dtype)",
                            torch_name(d)
                        )));
                    }
                },
                Item::Scalar(_) => {}
            }
        }
    }

    let mut notes = vec!["launches from the forward's Triton launches (JITFunction.run)".into()];
    notes.extend(super::syncs_note(first));
    if empty > 0 {
        notes.push(format!(
            "{empty} Triton launch{} with an empty grid dropped (Triton launches nothing for \
             them)",
            if empty == 1 { "" } else { "es" }
        ));
    }

    // Scratch buffers: torch's temporaries, of the dtype they were passed as, as large as
    // the larger of the two draws' blocks holds.
    let scratch = super::scratch_buffers(
        problem,
        &m1.scratch,
        &m2.scratch,
        |k| scratch_dtype[k].unwrap_or(Dtype::U8),
        &mut notes,
    )?;

    let mut launches = Vec::with_capacity(a.len());
    for (i, (t, items)) in a.iter().zip(&m1.args).enumerate() {
        let option = |what: String| Refusal::TritonOption {
            launch: i,
            kernel: clip(&t.kernel),
            what,
        };
        if t.num_ctas != 1 {
            return Err(option(format!(
                "num_ctas = {}: kiln launches Triton kernels with num_ctas = 1 only",
                t.num_ctas
            )));
        }
        let warps = u32::try_from(t.num_warps)
            .ok()
            .filter(|w| w.is_power_of_two() && *w <= MAX_NUM_WARPS);
        let Some(warps) = warps else {
            return Err(option(format!(
                "num_warps = {}: a launch plan's is a power of two from 1 to {MAX_NUM_WARPS}",
                t.num_warps
            )));
        };
        let stages = u32::try_from(t.num_stages)
            .ok()
            .filter(|s| (1..=MAX_NUM_STAGES).contains(s));
        let Some(stages) = stages else {
            return Err(option(format!(
                "num_stages = {}: a launch plan's is 1 to {MAX_NUM_STAGES}",
                t.num_stages
            )));
        };
        for (name, v) in &t.options {
            let default = OPTION_DEFAULTS.iter().find(|(n, _)| n == name);
            if default.is_none_or(|(_, d)| *v != Value::Bool(*d)) {
                return Err(option(format!(
                    "the compile option {}={}: kiln compiles Triton launches with num_warps, \
                     num_stages and num_ctas only",
                    clip(name),
                    clip(&v.to_string())
                )));
            }
        }
        let mut constexprs = BTreeMap::new();
        for arg in t.args.iter().filter(|x| x.constexpr) {
            let v = constexpr(arg).map_err(|why| Refusal::TritonArg {
                launch: i,
                kernel: clip(&t.kernel),
                param: clip(&arg.name),
                why: format!("a constexpr given {why}"),
            })?;
            constexprs.insert(arg.name.clone(), v);
        }
        let args = items
            .iter()
            .map(|item| match item {
                Item::Tensor(n) => Arg::Buffer(n.clone()),
                Item::Scratch(k) => Arg::Buffer(scratch[*k].name.clone()),
                Item::Scalar(s) => Arg::Scalar(*s),
            })
            .collect();
        launches.push(Launch {
            kernel: t.kernel.clone(),
            grid: t.grid.map(|d| d as u32),
            args,
            constexprs,
            num_warps: Some(warps),
            num_stages: Some(stages),
            num_ctas: Some(1),
            ..Launch::default()
        });
    }

    // The source: the file's Triton source, defining every launched function.
    let Some(src) = &sources.triton else {
        return Err(Refusal::NoTritonSource {
            kernel: clip(&a[0].kernel),
        });
    };
    if let Some(t) = a.iter().find(|t| !src.kernels.contains(&t.kernel)) {
        return Err(Refusal::NoTritonSource {
            kernel: clip(&t.kernel),
        });
    }
    if src.source.len() > MAX_SOURCE_BYTES {
        return Err(Refusal::TooLarge(format!(
            "the Triton source is {} bytes; a candidate's is at most {MAX_SOURCE_BYTES}",
            src.source.len()
        )));
    }
    Ok(Lifted {
        language: Language::Triton,
        source: src.source.clone(),
        flags: Vec::new(),
        launches,
        scratch,
        notes,
    })
}

//! `kiln problems check`: the real suite passes; broken problems written into a tempdir
//! fail with the message of the rule they break (one or more per rule family: schema,
//! launch plans against kernel signatures and device limits, knob grammar and defaults,
//! CUDA source rules, Triton module shape and launches, roofline, file rules); usage errors
//! exit 2. No daemon is started.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kiln(args: &[&str], dirs: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .args(dirs)
        .output()
        .expect("kiln runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const TOML: &str = r#"name = "NAME"
summary = "y = 2 x"

[[tensor]]
name = "x"
dtype = "f32"
shape = [1024]
role = "input"
init = { dist = "uniform", low = -1.0, high = 1.0 }

[[tensor]]
name = "y"
dtype = "f32"
shape = [1024]
role = "output"

[tolerance]
atol = 1e-6
rtol = 1e-6

[roofline]
min_bytes = 8192
flops = 1024

[reference.cuda]
file = "reference.cu"
launches = [{ kernel = "ref", grid = [4, 1, 1], block = [256, 1, 1], args = ["x", "y", { i32 = 1024 }] }]

[seed.cuda]
file = "seed.cu"
launches = [{ kernel = "twice", grid = [4, 1, 1], block = [256, 1, 1], args = ["x", "y", { i32 = 1024 }] }]

[seed.triton]
file = "seed.py"
launches = [{ kernel = "double", grid = [4, 1, 1], args = ["x", "y", { i32 = 1024 }], constexprs = { BLOCK = 256 }, num_warps = 4 }]
"#;

const REFERENCE: &str = r#"// y = 2 x, one thread per element.
#include <cstdint>
extern "C" __global__ void ref(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"#;

const SEED_CU: &str = r#"// y = 2 x; launch plan: grid [ceil(n / BLOCK)], block [BLOCK].
// @knob BLOCK 128|256|512 launch:block.x
#define BLOCK 256
// @idea vec4: load and store float4
extern "C" __global__ void __launch_bounds__(BLOCK)
twice(const float* __restrict__ x, float* __restrict__ y, int n) {
    if (blockDim.x != BLOCK) return;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) y[i] = 2.0f * x[i];
}
"#;

const SEED_PY: &str = r#""""y = 2 x, BLOCK elements per program."""
import triton
import triton.language as tl

# @knob WARPS 2|4|8 launch:num_warps@double
WARPS = tl.constexpr(4)


@triton.jit
def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
"#;

/// Writes the good problem as folder `name` of `root`, with `(file, from, to)` edits.
fn write_problem(root: &Path, name: &str, edits: &[(&str, &str, &str)]) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let toml = TOML.replace("NAME", name);
    for (file, text) in [
        ("problem.toml", toml.as_str()),
        ("reference.cu", REFERENCE),
        ("seed.cu", SEED_CU),
        ("seed.py", SEED_PY),
    ] {
        let mut text = text.to_string();
        for (f, from, to) in edits {
            if *f == file {
                assert!(text.contains(from), "{name}: {file} has no {from:?}");
                text = text.replacen(from, to, 1);
            }
        }
        std::fs::write(dir.join(file), text).expect("write");
    }
}

#[test]
fn the_problem_suite_passes() {
    let problems = repo().join("problems");
    let o = kiln(&["problems", "check"], &[&problems]);
    let text = stdout(&o);
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let last = text.lines().last().unwrap_or_default();
    assert!(last.ends_with(" passed, 0 failed"), "{text}");
    let passed: usize = last
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed >= 10, "{text}");
    assert!(text.contains("ok   vecadd-cuda-1m\n"), "{text}");
    // Folders of problems are read one level deep; others are skipped with a note.
    assert!(
        text.contains("kernelbench-format has no problem.toml (skipped)"),
        "{text}"
    );
    // One problem folder on its own, and the JSON form.
    let o = kiln(
        &["-o", "json", "problems", "check"],
        &[&problems.join("softmax-4096x65536")],
    );
    assert!(o.status.success(), "{}", stdout(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["passed"], 1);
    assert_eq!(v["failed"], 0);
    assert_eq!(v["problems"][0]["name"], "softmax-4096x65536");
    assert_eq!(v["problems"][0]["ok"], true);
}

/// Edits of the good problem: (file, from, to).
type Edits = &'static [(&'static str, &'static str, &'static str)];

/// Broken problems: (folder, edits, file and message expected in its finding).
const BROKEN: &[(&str, Edits, &str)] = &[
    // schema (kiln-types)
    (
        "schema-dtype",
        &[("problem.toml", "dtype = \"f32\"", "dtype = \"f31\"")],
        "problem.toml:6: unknown variant `f31`",
    ),
    (
        "schema-key",
        &[("problem.toml", "atol = 1e-6", "atol = 1e-6\nbogus = 1")],
        "problem.toml:19: unknown field `bogus`",
    ),
    (
        "schema-folder",
        &[(
            "problem.toml",
            "name = \"schema-folder\"",
            "name = \"elsewhere\"",
        )],
        "problem.toml: name \"elsewhere\" differs from the folder's name \"schema-folder\"",
    ),
    (
        "schema-buffer",
        &[(
            "problem.toml",
            "args = [\"x\", \"y\", { i32 = 1024 }] }]\n\n[seed.cuda]",
            "args = [\"x\", \"z\", { i32 = 1024 }] }]\n\n[seed.cuda]",
        )],
        "reference.cu launch \"ref\" names unknown buffer \"z\"",
    ),
    (
        "schema-init",
        &[(
            "problem.toml",
            "low = -1.0, high = 1.0",
            "low = 1.0, high = -1.0",
        )],
        "tensor \"x\": init: uniform on [1, -1) needs finite bounds with low < high",
    ),
    (
        "schema-not-toml",
        &[("problem.toml", "[tolerance]", "[tolerance")],
        "problem.toml:17: unclosed table, expected `]`",
    ),
    // files
    (
        "file-missing",
        &[("problem.toml", "file = \"seed.py\"", "file = \"nope.py\"")],
        "nope.py: cannot read: No such file",
    ),
    (
        "file-escape",
        &[(
            "problem.toml",
            "file = \"seed.py\"",
            "file = \"../seed.py\"",
        )],
        "must be a plain file name in the problem folder",
    ),
    // launch plans against kernels and the device
    (
        "launch-count",
        &[(
            "problem.toml",
            "kernel = \"twice\", grid = [4, 1, 1], block = [256, 1, 1], args = [\"x\", \"y\", { i32 = 1024 }]",
            "kernel = \"twice\", grid = [4, 1, 1], block = [256, 1, 1], args = [\"x\", \"y\"]",
        )],
        "seed.cu:6: [seed.cuda] launches[0] (twice): twice takes 3 parameters, the launch passes 2",
    ),
    (
        "launch-pointer",
        &[("reference.cu", "int n)", "float* n)")],
        "reference.cu:3: [reference.cuda] launches[0] (ref): args[2] is an i32 scalar but parameter `float* n` is a pointer",
    ),
    (
        "launch-type",
        &[("reference.cu", "int n)", "double n)")],
        "args[2] is i32 but parameter `double n` has type `double`",
    ),
    (
        "launch-undefined",
        &[("reference.cu", "void ref(", "void ref2(")],
        "[reference.cuda] launches[0] (ref): ref is not defined in the source",
    ),
    (
        "launch-device",
        &[(
            "problem.toml",
            "kernel = \"ref\", grid = [4, 1, 1], block = [256, 1, 1]",
            "kernel = \"ref\", grid = [4, 1, 1], block = [2048, 1, 1]",
        )],
        "[reference.cuda] launches[0] (kernel \"ref\"): block.x = 2048 exceeds the device's 1024",
    ),
    (
        "launch-kind",
        &[(
            "problem.toml",
            "kernel = \"ref\", grid = [4, 1, 1]",
            "kernel = \"ref\", grid = [3, 1, 1], cluster = [2, 1, 1]",
        )],
        "grid.x = 3 is not a multiple of cluster.x = 2",
    ),
    // knob grammar and the suite's knob rules
    (
        "knob-word",
        &[("seed.cu", "// @knob BLOCK", "// @knobs BLOCK")],
        "seed.cu:2: unknown annotation `@knobs` (known: @knob, @idea)",
    ),
    (
        "knob-define",
        &[("seed.cu", "#define BLOCK 256", "\n#define BLOCK 256")],
        "seed.cu:2: `@knob BLOCK` must be directly followed by `#define BLOCK VALUE`",
    ),
    (
        "knob-default",
        &[("seed.cu", "128|256|512", "128|512")],
        "seed.cu:3: knob BLOCK's value \"256\" is not one of its values",
    ),
    (
        "knob-binding",
        &[(
            "problem.toml",
            "kernel = \"twice\", grid = [4, 1, 1], block = [256, 1, 1]",
            "kernel = \"twice\", grid = [4, 1, 1], block = [128, 1, 1]",
        )],
        "seed.cu:3: launches[0] (twice) has block [128, 1, 1], but knob BLOCK (bound to it) is 256",
    ),
    (
        "knob-warps",
        &[("problem.toml", "num_warps = 4", "num_warps = 8")],
        "seed.py:6: launches[0] (double) has num_warps = 8, but knob WARPS (bound to it) is 4",
    ),
    (
        "knob-idea",
        &[("seed.cu", "// @idea vec4:", "// @idea vec-4:")],
        "seed.cu:4: \"vec-4\" is not an identifier",
    ),
    // CUDA source rules
    (
        "include-toolkit",
        &[(
            "reference.cu",
            "#include <cstdint>",
            "#include <cuda_fp16.h>",
        )],
        "reference.cu:2: #include <cuda_fp16.h>: not one of kiln's stand-in headers",
    ),
    (
        "include-libcu",
        &[(
            "seed.cu",
            "#define BLOCK 256",
            "#define BLOCK 256\n#include <type_traits>",
        )],
        "seed.cu:4: #include <type_traits>: not one of kiln's stand-in headers",
    ),
    (
        "source-printf",
        &[(
            "reference.cu",
            "if (i < n)",
            "printf(\"%d\", i); if (i < n)",
        )],
        "reference.cu:5: calls printf",
    ),
    (
        "source-launch",
        &[(
            "reference.cu",
            "if (i < n) y[i] = 2.0f * x[i];",
            "if (i < n) y[i] = 2.0f * x[i];\n    ref<<<1, 1>>>(x, y, n);",
        )],
        "reference.cu:6: host code (<<<…>>> kernel launch)",
    ),
    (
        "source-host",
        &[(
            "reference.cu",
            "extern \"C\" __global__",
            "__host__ void h() {}\nextern \"C\" __global__",
        )],
        "reference.cu:3: contains host code (__host__)",
    ),
    // Triton module shape and launches
    (
        "triton-import",
        &[(
            "seed.py",
            "import triton\n",
            "import triton\nimport torch\n",
        )],
        "seed.py:3: import torch: a triton source holds only imports of triton",
    ),
    (
        "triton-host",
        &[(
            "seed.py",
            "    tl.store(",
            "    tl.store(y_ptr, 0)\n\n\ndouble[(4,)](x, y, 1024)\n\n\ndef later():\n    tl.store(",
        )],
        "seed.py:15: expressions are not allowed at module level",
    ),
    (
        "triton-decorator",
        &[(
            "seed.py",
            "@triton.jit\n",
            "@triton.autotune(configs=[], key=[])\n@triton.jit\n",
        )],
        "seed.py:11: double needs exactly one decorator, @triton.jit",
    ),
    (
        "triton-constant",
        &[(
            "seed.py",
            "WARPS = tl.constexpr(4)",
            "WARPS = tl.constexpr(4)\nN = len([1, 2])",
        )],
        "seed.py:7: module-level assignments must read NAME = tl.constexpr(<literal>)",
    ),
    (
        "triton-syntax",
        &[(
            "seed.py",
            "def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):",
            "def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr:",
        )],
        "seed.py:10: syntax error: '(' was never closed",
    ),
    (
        "triton-args",
        &[(
            "problem.toml",
            "args = [\"x\", \"y\", { i32 = 1024 }], constexprs",
            "args = [\"x\", \"y\"], constexprs",
        )],
        "seed.py:10: [seed.triton] launches[0] (double): double takes 3 arguments besides its constexprs (x_ptr, y_ptr, n), the launch passes 2",
    ),
    (
        "triton-constexpr",
        &[("problem.toml", "constexprs = { BLOCK = 256 }, ", "")],
        "double's constexpr BLOCK has no default and no value in constexprs",
    ),
    (
        "triton-kernel",
        &[("problem.toml", "kernel = \"double\"", "kernel = \"triple\"")],
        "no @triton.jit function triple in the source (found: double)",
    ),
    (
        "triton-options",
        &[("problem.toml", "num_warps = 4", "num_warps = 3")],
        "num_warps = 3: a power of two from 1 to 32",
    ),
    // roofline
    (
        "roofline-bytes",
        &[("problem.toml", "min_bytes = 8192", "min_bytes = 8193")],
        "problem.toml: roofline.min_bytes 8193 is more than all tensors together (8192 bytes)",
    ),
];

#[test]
fn broken_problems_fail_with_the_rule_they_break() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    write_problem(root, "good", &[]);
    for (name, edits, _) in BROKEN {
        write_problem(root, name, edits);
    }
    // A folder without a problem.toml is skipped with a note.
    std::fs::create_dir(root.join("notes")).expect("mkdir");
    let o = kiln(&["problems", "check"], &[root]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("ok   good\n"), "{text}");
    assert!(
        text.contains("notes has no problem.toml (skipped)"),
        "{text}"
    );
    for (name, _, needle) in BROKEN {
        let line = format!("FAIL {name}: ");
        let found = text
            .lines()
            .any(|l| l.starts_with(&line) && l.contains(needle));
        assert!(found, "{name}: no finding with {needle:?} in\n{text}");
    }
    let last = text.lines().last().unwrap_or_default();
    assert_eq!(last, format!("1 passed, {} failed", BROKEN.len()), "{text}");

    // The JSON form carries the same findings, by file and line.
    let o = kiln(
        &["-o", "json", "problems", "check"],
        &[&root.join("knob-default")],
    );
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        (v["passed"].as_u64(), v["failed"].as_u64()),
        (Some(0), Some(1))
    );
    let p = &v["problems"][0];
    assert_eq!(p["ok"], false);
    let e = &p["errors"][0];
    assert_eq!(
        (e["file"].as_str(), e["line"].as_u64()),
        (Some("seed.cu"), Some(3)),
        "{v}"
    );
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("is not one of its values"),
        "{v}"
    );
}

#[test]
fn bad_files_are_findings_not_crashes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    // Too large, not UTF-8, a device named as a source, and an empty problem.toml.
    write_problem(root, "huge", &[]);
    std::fs::write(root.join("huge/seed.cu"), vec![b'x'; 2 << 20]).expect("write");
    write_problem(root, "binary", &[]);
    std::fs::write(root.join("binary/seed.py"), [0xff, 0xfe, 0x00]).expect("write");
    write_problem(root, "device", &[]);
    std::fs::remove_file(root.join("device/seed.py")).expect("rm");
    std::os::unix::fs::symlink("/dev/zero", root.join("device/seed.py")).expect("symlink");
    std::fs::create_dir(root.join("empty")).expect("mkdir");
    std::fs::write(root.join("empty/problem.toml"), "").expect("write");
    let o = kiln(&["problems", "check"], &[root]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    for needle in [
        "FAIL huge: problem.toml: seed.cu is larger than 1048576 bytes",
        "FAIL binary: seed.py: cannot read: stream did not contain valid UTF-8",
        "FAIL device: seed.py: cannot read: not a regular file",
        "FAIL empty: problem.toml:1: missing field `name`",
    ] {
        assert!(text.contains(needle), "{needle:?} in\n{text}");
    }
    assert!(text.ends_with("0 passed, 4 failed\n"), "{text}");
}

#[test]
fn usage_errors_exit_2_and_empty_folders_1() {
    let tmp = tempfile::tempdir().expect("tmp");
    let o = kiln(&["problems", "check"], &[&tmp.path().join("missing")]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("missing does not exist"), "{err}");
    let o = kiln(&["problems", "check"], &[tmp.path()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).ends_with("0 passed, 0 failed\n"),
        "{}",
        stdout(&o)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("no problem folders"));
}

const TORCH_TOML: &str = r#"name = "NAME"

[[tensor]]
name = "x"
dtype = "f32"
shape = [4, 8]
role = "input"

[[tensor]]
name = "out"
dtype = "f32"
shape = [4, 8]
role = "output"

[tolerance]
atol = 1e-4
rtol = 1e-4

[roofline]
min_bytes = 256

[reference.torch]
file = "reference.py"
forward = ["x"]
outputs = ["out"]

[baseline.torch]
op = "module"
"#;

const TORCH_MODULE: &str = "import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        \
                            return torch.relu(x)\n\n\ndef get_inputs():\n    return [torch.randn(4, 8)]\n";

#[test]
fn torch_references_and_baselines_are_checked() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cases: &[(&str, &str, &str, &str)] = &[
        ("torch-good", "", "", ""),
        (
            "torch-format",
            "class Model",
            "class Net",
            "reference.py: [reference.torch]: no `class Model` (KernelBench's format)",
        ),
        (
            "torch-names",
            "forward = [\"x\"]",
            "forward = []",
            "[reference.torch]: tensor \"x\" is neither a forward argument",
        ),
        (
            "baseline-key",
            "op = \"module\"",
            "op = \"module\"\ndims = [1]",
            "problem.toml:27: unknown field `dims`",
        ),
        (
            "baseline-library",
            "[baseline.torch]",
            "[baseline.cutlass]",
            "cutlass",
        ),
    ];
    for (name, from, to, _) in cases {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).expect("mkdir");
        let (mut toml, mut module) = (TORCH_TOML.replace("NAME", name), TORCH_MODULE.to_string());
        if !from.is_empty() {
            let text = if module.contains(from) {
                &mut module
            } else {
                &mut toml
            };
            assert!(text.contains(from), "{name}: {from}");
            *text = text.replacen(from, to, 1);
        }
        std::fs::write(dir.join("problem.toml"), toml).expect("write");
        std::fs::write(dir.join("reference.py"), module).expect("write");
    }
    let o = kiln(&["problems", "check"], &[tmp.path()]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("ok   torch-good\n"), "{text}");
    for (name, _, _, needle) in &cases[1..] {
        let found = text
            .lines()
            .any(|l| l.starts_with(&format!("FAIL {name}: ")) && l.contains(needle));
        assert!(found, "{name}: no finding with {needle:?} in\n{text}");
    }
}

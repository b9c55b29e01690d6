#!/usr/bin/env python3
"""Static checks of the problem suite: every problems/*/problem.toml against the schema that
kiln_types::ProblemSpec::load_dir accepts, plus consistency checks that need no compiler.

Checked, per problem:
  - problem.toml parses (tomllib) and has no key the Rust types would refuse (they deny
    unknown fields); name rules; the folder is named after the problem;
  - tensors: identifier names, unique; dtype; shape (positive, at most 2^32 elements);
    role; init (normal/uniform/randint with their parameters); shifted_trial a boolean;
    at least one output;
  - tolerance (non-negative atol, rtol), required_tier, roofline (non-negative integers;
    min_bytes not above the bytes of all tensors together: the floor must never exceed
    what the best kernel has to move);
  - reference per backend (host|cuda), seed per backend or language (host|cuda|triton):
    the file is a plain name in the folder, exists,
    is at most 1 MiB; scratch buffers (identifiers, not tensor names, 1..2^30 elements);
    flags are strings; launches: kernel name (host: an identifier; cuda: a C++ name
    expression such as `k`, `ns::k` or `k<256, float>`), grid/block of three positive
    integers (cuda: at most 1024 threads, block.z <= 64, grid.y/z <= 65535, shared_bytes
    <= 227 KiB), the launch kind (cuda only: `cooperative` a boolean, `cluster` three
    positive integers of at most 8 blocks dividing the grid, not both), every arg a
    declared tensor or scratch name or a typed scalar {i32|i64|u32|u64|f32|f64} in range;
  - the kernel (cuda: a `__global__` function, found by its unqualified name) or C function
    a launch names is defined in the file, takes as many parameters as the launch passes,
    pointers where the launch passes buffers and matching scalar types where it passes
    scalars (not checked for a template's own type parameters);
  - triton seeds: the source parses as Python and holds only what kiln's compile driver
    accepts at module level (imports of triton and triton.language, @triton.jit
    functions, NAME = tl.constexpr(<literal>), a docstring); each launch names a
    @triton.jit function, passes as many args as it has non-constexpr parameters, gives
    every constexpr parameter without a default in `constexprs` and nothing else there,
    no block or shared_bytes of its own, num_warps a power of two up to 32, num_stages
    1..8, num_ctas 1;
  - knob and idea annotations in every source follow the SDK's grammar
    (sdk/rust/src/knobs.rs): `// @knob NAME V1|V2` (or `# @knob`) directly above
    `#define NAME VALUE` or `NAME = tl.constexpr(VALUE)`, `// @idea NAME: text` with NAME
    an identifier; misspelt @knob/@idea words are errors; a knob bound to `num_warps` or
    `num_stages` has the launch's value as its default;
    stricter than the SDK on one point: a seed's default value must be one of the knob's
    listed values (so a proposer can always return to it);
  - cuda sources: #include only kiln's own stand-in headers (sandbox/gpu/src/cxx/standins:
    <cstdint>, <cfloat>, <cmath>, ...), which every kiln has, not the CUDA toolkit's, which
    a machine may lack; no printf, no host code markers (__host__), no kernel launches
    (<<<).

Usage: scripts/check-problems.py [PROBLEMS_DIR ...]   (default: <repo>/problems)
Exit status 0 when every problem passes, 1 otherwise. The last line is
'N passed, M failed' (one count per problem).
"""

from __future__ import annotations

import ast
import math
import os
import re
import sys
import tomllib

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME = re.compile(r"^[a-z0-9_.-]{1,128}$")
DTYPES = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "u8": 1}
ROLES = {"input", "output"}
TIERS = {"fp32-faithful", "tf32-like", "fp16-like", "bf16-like", "coarse"}
BACKENDS = {"host", "cuda"}
SEED_BACKENDS = {"host", "cuda", "triton"}
MAX_TENSOR_ELEMS = 1 << 32
MAX_SCRATCH_ELEMS = 1 << 30
MAX_SOURCE = 1 << 20
MAX_LAUNCHES = 64
MAX_ARGS = 64
MAX_SCRATCH = 16
MAX_FLAGS = 32
MAX_SHARED = 227 * 1024
# Headers a problem's CUDA source may include: kiln's stand-ins, served by every kiln (the
# toolkit's own headers are there only where kilnd found them; see docs/api.md).
STANDINS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sandbox", "gpu",
                            "src", "cxx", "standins")


def standin_headers() -> set[str]:
    """kiln's stand-ins that need nothing from the toolkit (not those built on libcu++)."""
    out = set()
    for root, _, files in os.walk(STANDINS_DIR):
        for f in files:
            path = os.path.join(root, f)
            with open(path, encoding="utf-8") as fh:
                if "#include <cuda/" in fh.read():
                    continue
            out.add(os.path.relpath(path, STANDINS_DIR).replace(os.sep, "/"))
    return out


NVRTC_HEADERS: set[str] = standin_headers()
MAX_CLUSTER_BLOCKS = 8

TOP_KEYS = {"name", "summary", "tensor", "tolerance", "required_tier", "roofline", "reference", "seed", "baseline"}
# [baseline.LIBRARY]: op -> (tensor parameters, other parameters); the full check (shapes,
# dtypes) is kiln_types::baseline::check, run by `kiln problems add` and the Rust tests.
BASELINE_OPS = {
    "matmul": ({"a", "b", "c"}, set()),
    "conv2d": ({"x", "w", "b", "y"}, {"stride", "padding", "relu", "maxpool"}),
    "softmax": ({"x", "y"}, set()),
    "layer_norm": ({"x", "w", "b", "y"}, {"dims", "eps"}),
    "sdpa": ({"q", "k", "v", "out"}, {"causal"}),
    "module": (set(), set()),
}
TORCH_REF_KEYS = {"file", "source", "init_inputs", "forward", "state", "outputs", "bool_tensors", "precision"}
BASELINE_LIBRARIES = {"cublas": {"matmul"}, "cudnn": {"conv2d"}, "torch": set(BASELINE_OPS)}

TENSOR_KEYS = {"name", "dtype", "shape", "role", "init", "shifted_trial"}
INIT_KEYS = {"normal": ({"dist", "mean", "std"}, set()), "uniform": ({"dist", "low", "high"}, {"low", "high"}),
             "randint": ({"dist", "low", "high"}, {"low", "high"})}
KS_KEYS = {"file", "source", "launches", "scratch", "flags"}
LAUNCH_KEYS = {"kernel", "grid", "block", "shared_bytes", "args", "cooperative", "cluster"}
TRITON_LAUNCH_KEYS = {"kernel", "grid", "args", "constexprs", "num_warps", "num_stages", "num_ctas"}
SCRATCH_KEYS = {"name", "dtype", "elems"}
SCALARS = {"i32": (-(1 << 31), (1 << 31) - 1), "i64": (-(1 << 63), (1 << 63) - 1),
           "u32": (0, (1 << 32) - 1), "u64": (0, (1 << 64) - 1), "f32": None, "f64": None}

# C parameter types (after dropping const/volatile/restrict) accepted for each scalar kind.
SCALAR_CTYPES = {
    "i32": {"int", "signed", "signed int", "int32_t"},
    "u32": {"unsigned", "unsigned int", "uint32_t"},
    "i64": {"long long", "long long int", "signed long long", "int64_t", "long", "long int"},
    "u64": {"unsigned long long", "unsigned long long int", "uint64_t", "size_t", "unsigned long"},
    "f32": {"float"},
    "f64": {"double"},
}


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v) -> bool:
    return (isinstance(v, (int, float))) and not isinstance(v, bool)


def strip_comments(src: str) -> str:
    """Removes // and /* */ comments (keeping line breaks) and blanks string literals."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            chunk = src[i:] if j < 0 else src[i:j + 2]
            out.append("\n" * chunk.count("\n"))
            i = n if j < 0 else j + 2
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""')
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def split_params(text: str) -> list[str]:
    """Splits a parameter list at top-level commas."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    last = "".join(cur).strip()
    if last and last != "void":
        parts.append(last)
    return parts


def is_kernel_name(s: str) -> bool:
    """The C++ name expressions kiln_types::is_kernel_name accepts."""
    if not s or len(s) > 256 or "/*" in s or "//" in s:
        return False
    if not re.fullmatch(r"[A-Za-z0-9_:<>,()*&+\-.|^~!=? ]+", s):
        return False
    head, _, _ = s.partition("<")
    head = head.strip()
    if head.startswith("::"):
        head = head[2:]
    if not head or not all(IDENT.match(p) for p in head.split("::")):
        return False
    tail = s[len(s.split("<", 1)[0]):].rstrip()
    if not tail:
        return True
    if not tail.endswith(">"):
        return False
    angle = paren = 0
    for c in tail:
        if c == "(":
            paren += 1
        elif c == ")":
            paren -= 1
        elif c == "<" and paren == 0:
            angle += 1
        elif c == ">" and paren == 0:
            angle -= 1
        if angle < 0 or paren < 0:
            return False
    return angle == 0 and paren == 0


def base_name(kernel: str) -> str:
    """`ns::k<256, float>` -> `k`: the name the function is defined under."""
    return kernel.split("<", 1)[0].strip().split("::")[-1]


def is_template_param(code: str, name: str, ptype: str) -> bool:
    """True if `ptype` is a type parameter of a template `name` is declared with."""
    for m in re.finditer(r"template\s*<([^>]*)>\s*__global__[^(]*\b" + re.escape(name) + r"\s*\(", code):
        params = [p.split()[-1] for p in m.group(1).split(",") if p.split()]
        if ptype in params:
            return True
    return False


def check_launch_kind(launch: dict, backend: str, grid: list[int], lw: str, errs: list[str]) -> None:
    coop = launch.get("cooperative", False)
    cluster = launch.get("cluster")
    if not isinstance(coop, bool):
        errs.append(f"{lw}: cooperative must be true or false")
    if backend != "cuda" and (coop is True or cluster is not None):
        errs.append(f"{lw}: cooperative and cluster launches are for CUDA kernels only")
        return
    if cluster is None:
        return
    if coop is True:
        errs.append(f"{lw}: a launch is either cooperative or a cluster launch, not both")
    if not (isinstance(cluster, list) and len(cluster) == 3 and all(is_int(x) and x >= 1 for x in cluster)):
        errs.append(f"{lw}: cluster must be three integers >= 1")
        return
    if cluster[0] * cluster[1] * cluster[2] > MAX_CLUSTER_BLOCKS:
        errs.append(f"{lw}: cluster {cluster} has more than {MAX_CLUSTER_BLOCKS} blocks")
    for axis, g, c in zip("xyz", grid, cluster):
        if g % c:
            errs.append(f"{lw}: grid.{axis} = {g} is not a multiple of cluster.{axis} = {c}")


def find_function(code: str, name: str, cuda: bool) -> tuple[list[str] | None, str]:
    """Returns the parameter list of the definition of `name` (None if absent) and a note."""
    for m in re.finditer(r"\b" + re.escape(name) + r"\s*\(", code):
        # Find the matching parenthesis, then require a function body.
        depth, j = 0, m.end() - 1
        while j < len(code):
            if code[j] == "(":
                depth += 1
            elif code[j] == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        rest = code[j + 1:j + 200].lstrip()
        if not rest.startswith("{"):
            continue
        head_start = code.rfind(";", 0, m.start())
        head_start = max(head_start, code.rfind("}", 0, m.start()))
        head = code[head_start + 1:m.start()]
        if cuda and "__global__" not in head:
            return None, "defined, but not as a __global__ kernel"
        return split_params(code[m.end():j]), ""
    return None, "not defined in the file"


def param_kind(param: str) -> tuple[str, str]:
    """('ptr', text) or ('scalar', normalised type) for one C parameter declaration."""
    p = re.sub(r"\b(__restrict__|__restrict|restrict|const|volatile)\b", " ", param)
    p = re.sub(r"\[\s*\]", "*", p)
    if "*" in p:
        return "ptr", p
    words = p.split()
    if len(words) >= 2 and IDENT.match(words[-1]):
        words = words[:-1]
    return "scalar", " ".join(words)


BINDING = re.compile(
    r"launch:(?:(?:block|grid)\.[xyz]|num_warps|num_stages|constexprs\.[A-Za-z_][A-Za-z0-9_]*)"
    r"(?:,(?:(?:block|grid)\.[xyz]|num_warps|num_stages|constexprs\.[A-Za-z_][A-Za-z0-9_]*))*"
    r"(?:@[A-Za-z_][A-Za-z0-9_]*(?:,[A-Za-z_][A-Za-z0-9_]*)*)?")
PY_CONSTANT = re.compile(
    r"^\s*([A-Za-z0-9_]+)\s*=\s*(?:tl\.constexpr|triton\.language\.constexpr|constexpr)\s*\(([^)]*)\)\s*(#.*)?$")


def knob_value_line(line: str):
    """(name, value) of a `#define NAME VALUE` or `NAME = tl.constexpr(VALUE)` line, or None."""
    dm = re.match(r"^\s*#\s*define[ \t]+([A-Za-z0-9_]+)(.*)$", line)
    if dm:
        body = dm.group(2)
        cut = min([k for k in (body.find("//"), body.find("/*")) if k >= 0], default=len(body))
        return dm.group(1), body[:cut].strip()
    pm = PY_CONSTANT.match(line.rstrip("\r"))
    if pm:
        return pm.group(1), pm.group(2).strip()
    return None


def check_annotations(src: str, where: str, errs: list[str]) -> dict:
    """Checks the annotations; returns {knob name: (default value, launch binding or None)}."""
    lines = src.split("\n")
    knobs = {}
    for i, raw in enumerate(lines):
        line = i + 1
        t = raw.lstrip()
        if t.startswith("//"):
            t = t[2:].lstrip()
        elif t.startswith("#"):
            t = t[1:].lstrip()
        else:
            continue
        if not t.startswith("@"):
            continue
        t = t[1:].rstrip()
        m = re.match(r"[A-Za-z0-9_]*", t)
        word, rest = m.group(0), t[m.end():]
        if word == "knob":
            parts = rest.split()
            if len(parts) not in (2, 3):
                errs.append(f"{where}:{line}: `// @knob` needs a name and values: `// @knob NAME V1|V2`")
                continue
            name, values = parts[0], parts[1]
            if len(parts) == 3 and not BINDING.fullmatch(parts[2]):
                errs.append(f"{where}:{line}: knob {name}: bad launch binding {parts[2]!r} "
                            "(launch:block.x|grid.y|num_warps|num_stages|constexprs.NAME[@kernel,...])")
                continue
            if not IDENT.match(name) or len(name) > 128:
                errs.append(f"{where}:{line}: knob name {name!r} is not an identifier")
                continue
            vals = values.split("|")
            if any(v == "" for v in vals):
                errs.append(f"{where}:{line}: knob {name}: empty value in {values!r}")
            if len(set(vals)) != len(vals):
                errs.append(f"{where}:{line}: knob {name}: a value is listed twice")
            if name in knobs:
                errs.append(f"{where}:{line}: knob {name} is declared twice")
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            found = knob_value_line(nxt)
            if not found or found[0] != name:
                errs.append(f"{where}:{line}: `@knob {name}` must be directly followed by `#define {name} VALUE` "
                            f"or `{name} = tl.constexpr(VALUE)`")
                continue
            value = found[1]
            knobs[name] = (value, parts[2] if len(parts) == 3 else None)
            if not value:
                errs.append(f"{where}:{line + 1}: `#define {name}` has no value")
            elif value not in vals:
                errs.append(f"{where}:{line + 1}: knob {name}'s value {value!r} is not one of {vals}")
        elif word == "idea":
            if ":" not in rest:
                errs.append(f"{where}:{line}: `// @idea` needs a name and text: `// @idea NAME: text`")
                continue
            name, text = rest.split(":", 1)
            name, text = name.strip(), text.strip()
            if not name or not text:
                errs.append(f"{where}:{line}: `// @idea` needs a name and text: `// @idea NAME: text`")
            elif not IDENT.match(name) or len(name) > 128:
                errs.append(f"{where}:{line}: idea name {name!r} is not an identifier (the SDK refuses it)")
        elif word.lower().startswith(("knob", "idea")):
            errs.append(f"{where}:{line}: unknown annotation `@{word}` (known: @knob, @idea)")
    return knobs


TRITON_MODULES = ("triton", "triton.language")


def triton_module_ok(name: str) -> bool:
    return name in TRITON_MODULES or name.startswith("triton.language.")


def is_jit(dec) -> bool:
    """@triton.jit, @jit, or either called with keywords."""
    if isinstance(dec, ast.Call):
        dec = dec.func
    return (isinstance(dec, ast.Attribute) and dec.attr == "jit"
            and isinstance(dec.value, ast.Name) and dec.value.id == "triton") \
        or (isinstance(dec, ast.Name) and dec.id == "jit")


def is_constexpr_annotation(node) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return "constexpr" in node.value
    return isinstance(node, ast.Attribute) and node.attr == "constexpr" \
        or isinstance(node, ast.Name) and node.id == "constexpr"


def triton_functions(src: str, where: str, errs: list[str]) -> dict:
    """The @triton.jit functions of a triton source: {name: [(param, is_constexpr, has_default)]},
    after checking its module level holds only what kiln's compile driver accepts."""
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        errs.append(f"{where}:{e.lineno}: syntax error: {e.msg}")
        return {}
    funcs = {}
    for node in tree.body:
        line = f"{where}:{node.lineno}"
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        if isinstance(node, ast.Import):
            if not all(triton_module_ok(a.name) for a in node.names):
                errs.append(f"{line}: only triton and triton.language modules may be imported")
        elif isinstance(node, ast.ImportFrom):
            if node.level != 0 or not triton_module_ok(node.module or ""):
                errs.append(f"{line}: only triton and triton.language modules may be imported from")
        elif isinstance(node, ast.Assign):
            v = node.value
            ok = (len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(v, ast.Call)
                  and len(v.args) == 1 and not v.keywords and isinstance(v.args[0], (ast.Constant, ast.UnaryOp)))
            if not ok:
                errs.append(f"{line}: module-level assignments must read NAME = tl.constexpr(<literal>)")
        elif isinstance(node, ast.FunctionDef):
            if len(node.decorator_list) != 1 or not is_jit(node.decorator_list[0]):
                errs.append(f"{line}: {node.name} needs exactly one decorator, @triton.jit")
                continue
            a = node.args
            params = a.posonlyargs + a.args
            defaults = [False] * (len(params) - len(a.defaults)) + [True] * len(a.defaults)
            funcs[node.name] = [(p.arg, is_constexpr_annotation(p.annotation), d) for p, d in zip(params, defaults)]
            funcs[node.name] += [(p.arg, is_constexpr_annotation(p.annotation), d is not None)
                                 for p, d in zip(a.kwonlyargs, a.kw_defaults)]
        else:
            errs.append(f"{line}: {type(node).__name__} is not allowed at module level in a triton candidate")
    return funcs


def check_triton_launch(lw: str, launch: dict, funcs: dict, knobs: dict, errs: list[str]) -> None:
    for key in ("block", "shared_bytes"):
        if key in launch:
            errs.append(f"{lw}: a triton launch takes no {key} (num_warps and Triton's compile give it)")
    w = launch.get("num_warps", 4)
    if not is_int(w) or not (1 <= w <= 32) or w & (w - 1):
        errs.append(f"{lw}: num_warps {w!r} is not a power of two from 1 to 32")
    st = launch.get("num_stages", 3)
    if not is_int(st) or not (1 <= st <= 8):
        errs.append(f"{lw}: num_stages {st!r} is not in 1..8")
    if launch.get("num_ctas", 1) != 1:
        errs.append(f"{lw}: num_ctas must be 1")
    ce = launch.get("constexprs", {})
    if not isinstance(ce, dict) or not all(isinstance(k, str) and IDENT.match(k) for k in ce):
        errs.append(f"{lw}: constexprs must be a table of identifier = value")
        ce = {}
    kernel = launch.get("kernel")
    for kname, (value, binding) in knobs.items():
        if binding is None or not is_int(launch.get("num_warps", 4)):
            continue
        spec = binding.removeprefix("launch:")
        bound_here = "@" not in spec or kernel in spec.split("@", 1)[1].split(",")
        for field, default in (("num_warps", 4), ("num_stages", 3)):
            if bound_here and field in spec.split("@")[0].split(",") and str(launch.get(field, default)) != value:
                errs.append(f"{lw}: {field} = {launch.get(field, default)} but knob {kname} (bound to it) "
                            f"defaults to {value}")
    if funcs is None:
        return
    if kernel not in funcs:
        errs.append(f"{lw}: no @triton.jit function {kernel!r} in the source (found: {', '.join(sorted(funcs)) or 'none'})")
        return
    params = funcs[kernel]
    plain = [p for p, c, _ in params if not c]
    if len(plain) != len(launch.get("args", [])):
        errs.append(f"{lw}: {kernel} takes {len(plain)} arguments besides its constexprs ({', '.join(plain)}), "
                    f"the launch passes {len(launch.get('args', []))}")
    constexprs = {p: d for p, c, d in params if c}
    for k in ce:
        if k not in constexprs:
            errs.append(f"{lw}: constexprs.{k}: {kernel} has no constexpr parameter {k}")
    for p, has_default in constexprs.items():
        if not has_default and p not in ce:
            errs.append(f"{lw}: {kernel}'s constexpr {p} has no default and no value in constexprs")


def check_cuda_source(src: str, where: str, errs: list[str]) -> None:
    for i, raw in enumerate(src.split("\n")):
        m = re.match(r"^\s*#\s*(include|include_next|import|embed)\b\s*(.*)$", raw)
        if m:
            target = m.group(2).strip()
            inner = target[1:-1] if len(target) >= 2 and target[0] in "<\"" else target
            if inner not in NVRTC_HEADERS:
                errs.append(f"{where}:{i + 1}: #{m.group(1)} {target}: not one of kiln's stand-in headers "
                            "(a problem's kernels must compile where the toolkit's headers are missing)")
    code = strip_comments(src)
    if re.search(r"\bprintf\s*\(", code):
        errs.append(f"{where}: calls printf")
    if "__host__" in code:
        errs.append(f"{where}: contains host code (__host__)")
    if "<<<" in code:
        errs.append(f"{where}: launches kernels from the device (<<<)")


def check_kernel_source(spec: dict, problem_dir: str, role: str, backend: str, ks,
                        tensors: dict, errs: list[str]) -> None:
    where = f"[{role}.{backend}]"
    knobs: dict = {}
    funcs = None
    if not isinstance(ks, dict):
        errs.append(f"{where}: must be a table")
        return
    for key in ks:
        if key not in KS_KEYS:
            errs.append(f"{where}: unknown key {key!r}")
    file = ks.get("file")
    src = None
    if not isinstance(file, str) or not file or "/" in file or file.startswith("."):
        errs.append(f"{where}: file {file!r} must be a plain file name in the problem folder")
    else:
        path = os.path.join(problem_dir, file)
        if not os.path.isfile(path):
            errs.append(f"{where}: {file} does not exist")
        elif os.path.getsize(path) > MAX_SOURCE:
            errs.append(f"{where}: {file} is larger than {MAX_SOURCE} bytes")
        else:
            with open(path, encoding="utf-8") as fh:
                src = fh.read()
            if "\0" in src:
                errs.append(f"{where}: {file} contains a NUL byte")
            knobs = check_annotations(src, f"{os.path.basename(problem_dir)}/{file}", errs)
            if backend == "cuda":
                check_cuda_source(src, f"{os.path.basename(problem_dir)}/{file}", errs)
            if backend == "triton":
                funcs = triton_functions(src, f"{os.path.basename(problem_dir)}/{file}", errs)

    scratch = ks.get("scratch", [])
    names = {}
    if not isinstance(scratch, list) or len(scratch) > MAX_SCRATCH:
        errs.append(f"{where}: scratch must be a list of at most {MAX_SCRATCH} tables")
        scratch = []
    for j, s in enumerate(scratch):
        if not isinstance(s, dict):
            errs.append(f"{where}: scratch[{j}] must be a table")
            continue
        for key in s:
            if key not in SCRATCH_KEYS:
                errs.append(f"{where}: scratch[{j}]: unknown key {key!r}")
        n = s.get("name")
        if not isinstance(n, str) or not IDENT.match(n) or len(n) > 128:
            errs.append(f"{where}: scratch[{j}].name {n!r} is not an identifier")
            continue
        if n in tensors:
            errs.append(f"{where}: scratch {n!r} has the name of a tensor")
        if n in names:
            errs.append(f"{where}: scratch {n!r} is declared twice")
        if s.get("dtype") not in DTYPES:
            errs.append(f"{where}: scratch {n!r}: dtype {s.get('dtype')!r} is not one of {sorted(DTYPES)}")
        e = s.get("elems")
        if not is_int(e) or not (1 <= e <= MAX_SCRATCH_ELEMS):
            errs.append(f"{where}: scratch {n!r}: elems must be an integer in 1..{MAX_SCRATCH_ELEMS}")
        names[n] = s

    flags = ks.get("flags", [])
    if not isinstance(flags, list) or len(flags) > MAX_FLAGS or not all(isinstance(f, str) for f in flags):
        errs.append(f"{where}: flags must be a list of at most {MAX_FLAGS} strings")
    if backend == "triton" and flags:
        errs.append(f"{where}: triton candidates take no flags")

    launches = ks.get("launches")
    if not isinstance(launches, list) or not (1 <= len(launches) <= MAX_LAUNCHES):
        errs.append(f"{where}: launches must be a list of 1..{MAX_LAUNCHES} launches")
        return
    code = strip_comments(src) if src is not None and backend != "triton" else None
    for li, launch in enumerate(launches):
        lw = f"{where} launches[{li}]"
        if not isinstance(launch, dict):
            errs.append(f"{lw}: must be a table")
            continue
        allowed = TRITON_LAUNCH_KEYS if backend == "triton" else LAUNCH_KEYS
        for key in launch:
            if key not in allowed:
                errs.append(f"{lw}: unknown key {key!r}")
        kernel = launch.get("kernel")
        if backend == "cuda":
            if not isinstance(kernel, str) or not is_kernel_name(kernel):
                errs.append(f"{lw}: kernel {kernel!r} is not a kernel name (k, ns::k or k<256, float>)")
                continue
        elif not isinstance(kernel, str) or not IDENT.match(kernel) or len(kernel) > 128:
            errs.append(f"{lw}: kernel {kernel!r} is not an identifier")
            continue
        lw = f"{where} launches[{li}] ({kernel})"
        dims = {}
        for dim in ("grid", "block"):
            v = launch.get(dim, [1, 1, 1])
            if not (isinstance(v, list) and len(v) == 3 and all(is_int(x) and 1 <= x < (1 << 32) for x in v)):
                errs.append(f"{lw}: {dim} must be three integers >= 1")
                v = [1, 1, 1]
            dims[dim] = v
        check_launch_kind(launch, backend, dims["grid"], lw, errs)
        sh = launch.get("shared_bytes", 0)
        if not is_int(sh) or sh < 0 or sh >= (1 << 32):
            errs.append(f"{lw}: shared_bytes must be a non-negative 32-bit integer")
        if backend == "cuda":
            b, g = dims["block"], dims["grid"]
            if b[0] * b[1] * b[2] > 1024 or b[2] > 64:
                errs.append(f"{lw}: block {b} has more than 1024 threads or z > 64")
            if g[0] > (1 << 31) - 1 or g[1] > 65535 or g[2] > 65535:
                errs.append(f"{lw}: grid {g} is beyond the device's limits")
            if is_int(sh) and sh > MAX_SHARED:
                errs.append(f"{lw}: shared_bytes {sh} is above 227 KiB")
        args = launch.get("args", [])
        if not isinstance(args, list) or len(args) > MAX_ARGS:
            errs.append(f"{lw}: args must be a list of at most {MAX_ARGS} items")
            continue
        kinds = []
        for ai, a in enumerate(args):
            if isinstance(a, str):
                if a not in tensors and a not in names:
                    errs.append(f"{lw}: arg {ai} names unknown buffer {a!r}")
                kinds.append(("buffer", a))
            elif isinstance(a, dict) and len(a) == 1:
                (k, v), = a.items()
                if k not in SCALARS:
                    errs.append(f"{lw}: arg {ai}: unknown scalar type {k!r}")
                    kinds.append(("scalar", None))
                    continue
                rng = SCALARS[k]
                if rng is None:
                    if not is_num(v) or (isinstance(v, float) and not math.isfinite(v)):
                        errs.append(f"{lw}: arg {ai}: {k} value {v!r} is not a finite number")
                    elif k == "f32" and abs(v) > 3.4028234663852886e38:
                        errs.append(f"{lw}: arg {ai}: {v!r} is out of f32 range")
                elif not is_int(v) or not (rng[0] <= v <= rng[1]):
                    errs.append(f"{lw}: arg {ai}: {k} value {v!r} is not an integer in range")
                kinds.append(("scalar", k))
            else:
                errs.append(f"{lw}: arg {ai} must be a buffer name or a typed scalar like {{ i32 = 4 }}")
                kinds.append(("scalar", None))
        if backend == "triton":
            check_triton_launch(lw, launch, funcs, knobs, errs)
            continue
        if code is None:
            continue
        params, note = find_function(code, base_name(kernel), backend == "cuda")
        if params is None:
            errs.append(f"{lw}: {kernel} is {note} ({file})")
            continue
        if len(params) != len(kinds):
            errs.append(f"{lw}: {kernel} takes {len(params)} parameters, the launch passes {len(kinds)}")
            continue
        for pi, (param, (kind, what)) in enumerate(zip(params, kinds)):
            pk, ptype = param_kind(param)
            if kind == "buffer" and pk != "ptr":
                errs.append(f"{lw}: arg {pi} is buffer {what!r} but parameter {param!r} is not a pointer")
            elif kind == "scalar" and pk == "ptr":
                errs.append(f"{lw}: arg {pi} is a scalar but parameter {param!r} is a pointer")
            elif (kind == "scalar" and what is not None and ptype not in SCALAR_CTYPES[what]
                  and not is_template_param(code, base_name(kernel), ptype)):
                errs.append(f"{lw}: arg {pi} is {what} but parameter {param!r} has type {ptype!r}")


def check_problem(problem_dir: str) -> list[str]:
    errs: list[str] = []
    path = os.path.join(problem_dir, "problem.toml")
    try:
        with open(path, "rb") as fh:
            spec = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as e:
        return [f"problem.toml: {e}"]
    for key in spec:
        if key not in TOP_KEYS:
            errs.append(f"unknown top-level key {key!r}")
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        errs.append(f"name {name!r} must be 1-128 characters of a-z, 0-9, '-', '_' and '.'")
    elif name != os.path.basename(os.path.normpath(problem_dir)):
        errs.append(f"name {name!r} differs from the folder name {os.path.basename(problem_dir)!r}")
    if "summary" in spec and not isinstance(spec["summary"], str):
        errs.append("summary must be a string")

    tensors: dict[str, dict] = {}
    total_bytes = 0
    tlist = spec.get("tensor")
    if not isinstance(tlist, list) or not tlist:
        errs.append("no [[tensor]]")
        tlist = []
    for i, t in enumerate(tlist):
        if not isinstance(t, dict):
            errs.append(f"tensor[{i}] must be a table")
            continue
        for key in t:
            if key not in TENSOR_KEYS:
                errs.append(f"tensor[{i}]: unknown key {key!r}")
        n = t.get("name")
        if not isinstance(n, str) or not IDENT.match(n) or len(n) > 128:
            errs.append(f"tensor[{i}]: name {n!r} is not an identifier")
            continue
        if n in tensors:
            errs.append(f"tensor {n!r} is declared twice")
        dt = t.get("dtype")
        if dt not in DTYPES:
            errs.append(f"tensor {n!r}: dtype {dt!r} is not one of {sorted(DTYPES)}")
        shape = t.get("shape")
        if not (isinstance(shape, list) and shape and all(is_int(d) and d > 0 for d in shape)):
            errs.append(f"tensor {n!r}: shape must be a non-empty list of positive integers")
        else:
            elems = math.prod(shape)
            if elems > MAX_TENSOR_ELEMS:
                errs.append(f"tensor {n!r}: more than {MAX_TENSOR_ELEMS} elements")
            elif dt in DTYPES:
                total_bytes += elems * DTYPES[dt]
        if t.get("role") not in ROLES:
            errs.append(f"tensor {n!r}: role {t.get('role')!r} is not input or output")
        init = t.get("init")
        if init is not None:
            dist = init.get("dist") if isinstance(init, dict) else None
            if dist not in INIT_KEYS:
                errs.append(f"tensor {n!r}: init.dist {dist!r} is not normal, uniform or randint")
            else:
                allowed, required = INIT_KEYS[dist]
                for key in init:
                    if key not in allowed:
                        errs.append(f"tensor {n!r}: init: unknown key {key!r} for {dist}")
                for key in required:
                    if key not in init:
                        errs.append(f"tensor {n!r}: init: {dist} needs {key!r}")
                for key, val in init.items():
                    if key == "dist":
                        continue
                    ok = is_int(val) if dist == "randint" else is_num(val)
                    if not ok:
                        errs.append(f"tensor {n!r}: init.{key} = {val!r} has the wrong type")
                if dist == "normal" and is_num(init.get("std", 1.0)) and init.get("std", 1.0) < 0:
                    errs.append(f"tensor {n!r}: init.std is negative")
                if dist in ("uniform", "randint") and all(is_num(init.get(k)) for k in ("low", "high")) \
                        and not init["low"] < init["high"]:
                    errs.append(f"tensor {n!r}: init.low must be below init.high")
        if "shifted_trial" in t and not isinstance(t["shifted_trial"], bool):
            errs.append(f"tensor {n!r}: shifted_trial must be true or false")
        tensors[n] = t
    if tlist and not any(t.get("role") == "output" for t in tlist if isinstance(t, dict)):
        errs.append("no output tensor")

    tol = spec.get("tolerance")
    if not isinstance(tol, dict):
        errs.append("[tolerance] is missing")
    else:
        for key in tol:
            if key not in ("atol", "rtol"):
                errs.append(f"tolerance: unknown key {key!r}")
        for key in ("atol", "rtol"):
            v = tol.get(key)
            if not is_num(v) or v < 0 or not math.isfinite(v):
                errs.append(f"tolerance.{key} must be a non-negative number")
    if "required_tier" in spec and spec["required_tier"] not in TIERS:
        errs.append(f"required_tier {spec['required_tier']!r} is not one of {sorted(TIERS)}")
    roof = spec.get("roofline", {})
    if not isinstance(roof, dict):
        errs.append("[roofline] must be a table")
        roof = {}
    for key in roof:
        if key not in ("min_bytes", "flops"):
            errs.append(f"roofline: unknown key {key!r}")
    for key in ("min_bytes", "flops"):
        v = roof.get(key, 0)
        if not is_int(v) or v < 0 or v >= (1 << 64):
            errs.append(f"roofline.{key} must be a non-negative integer")
    mb = roof.get("min_bytes", 0)
    if is_int(mb) and total_bytes and mb > total_bytes:
        errs.append(f"roofline.min_bytes {mb} is more than all tensors together ({total_bytes} bytes)")

    for role in ("reference", "seed"):
        table = spec.get(role, {})
        if not isinstance(table, dict):
            errs.append(f"[{role}] must be a table of backends")
            continue
        if role == "reference" and not table:
            errs.append("no reference kernel")
        for backend, ks in table.items():
            if role == "reference" and backend == "torch":
                check_torch_reference(problem_dir, ks, tensors, errs)
                continue
            allowed = SEED_BACKENDS if role == "seed" else BACKENDS
            if backend not in allowed:
                errs.append(f"[{role}.{backend}]: unknown backend ({', '.join(sorted(allowed))})")
                continue
            check_kernel_source(spec, problem_dir, role, backend, ks, tensors, errs)
    check_baselines(spec.get("baseline", {}), tensors, errs)
    module = (spec.get("baseline", {}).get("torch") or {}).get("op") == "module"
    if module and "torch" not in spec.get("reference", {}):
        errs.append("[baseline.torch]: op module needs a [reference.torch]")
    return errs


def check_torch_reference(problem_dir: str, ref, tensors: dict, errs: list[str]) -> None:
    """[reference.torch]: a KernelBench-format file in the folder; every tensor named once."""
    where = "[reference.torch]"
    if not isinstance(ref, dict):
        errs.append(f"{where} must be a table")
        return
    for key in ref:
        if key not in TORCH_REF_KEYS:
            errs.append(f"{where}: unknown key {key!r}")
    f = ref.get("file", "")
    if not isinstance(f, str) or not f or "/" in f or f.startswith("."):
        errs.append(f"{where}: file must be a plain file name in the folder")
    elif not os.path.isfile(os.path.join(problem_dir, f)):
        errs.append(f"{where}: {f} does not exist")
    else:
        with open(os.path.join(problem_dir, f), encoding="utf-8") as fh:
            src = fh.read()
        for needle in ("class Model", "def forward"):
            if needle not in src:
                errs.append(f"{where}: {f} has no {needle!r} (KernelBench's format)")
    named = list(ref.get("forward", [])) + list((ref.get("state") or {}).values()) + list(ref.get("outputs", []))
    for n in named:
        if n not in tensors:
            errs.append(f"{where}: names no tensor {n!r}")
    for n in tensors:
        if named.count(n) != 1:
            errs.append(f"{where}: tensor {n!r} must be named exactly once (forward, state or outputs)")


def check_baselines(table, tensors: dict, errs: list[str]) -> None:
    """[baseline.LIBRARY] tables: known library, op it offers, known keys, tensors that exist."""
    if not isinstance(table, dict):
        errs.append("[baseline] must be a table of libraries")
        return
    for lib, op in table.items():
        where = f"[baseline.{lib}]"
        if lib not in BASELINE_LIBRARIES:
            errs.append(f"{where}: unknown library ({', '.join(sorted(BASELINE_LIBRARIES))})")
            continue
        if not isinstance(op, dict) or op.get("op") not in BASELINE_LIBRARIES[lib]:
            errs.append(f"{where}: op must be one of {sorted(BASELINE_LIBRARIES[lib])}")
            continue
        names, others = BASELINE_OPS[op["op"]]
        for key, value in op.items():
            if key == "op":
                continue
            if key in names:
                if value not in tensors:
                    errs.append(f"{where}: {key} = {value!r} names no tensor")
            elif key not in others:
                errs.append(f"{where}: unknown key {key!r}")


def main(argv: list[str]) -> int:
    roots = argv[1:] or [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "problems")]
    dirs = []
    for root in roots:
        root = os.path.normpath(root)
        if os.path.isfile(os.path.join(root, "problem.toml")):
            dirs.append(root)
            continue
        if not os.path.isdir(root):
            print(f"check-problems: {root} is not a directory", file=sys.stderr)
            return 1
        for entry in sorted(os.listdir(root)):
            d = os.path.join(root, entry)
            if os.path.isdir(d):
                if os.path.isfile(os.path.join(d, "problem.toml")):
                    dirs.append(d)
                elif not entry.startswith("."):
                    print(f"check-problems: note: {d} has no problem.toml (skipped)")
    passed = failed = 0
    for d in dirs:
        errs = check_problem(d)
        name = os.path.basename(d)
        if errs:
            failed += 1
            print(f"FAIL {name}")
            for e in errs:
                print(f"  - {e}")
        else:
            passed += 1
            print(f"ok   {name}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not dirs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

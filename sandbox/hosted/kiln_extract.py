"""kiln's extractor of CUDA device code: the pure part of scripts/corpus/extract.py.

It turns the text of a published KernelBench-style file (a Python `ModelNew` file whose
`load_inline` calls carry CUDA strings, or a plain .cu file) into the CUDA device source a
user would submit to kiln, the `__global__` kernels it defines as kiln launch names (C++
name expressions) and the author's nvcc flags. It reads text only: nothing it is given is
imported or run. Standard library only; sandbox/hosted/kiln_hosted.py (`device-source`)
and scripts/corpus/extract.py use it.

What is removed (nothing else in the source is changed):

- `#include` lines of torch/ATen/c10/pybind11/THC/caffe2/Python.h, and `#define`s whose
  body is host code (the torch/pybind API, a `<<<…>>>` launch, a host runtime call);
- namespace-scope host items (functions, declarations, variables, types, `using`/namespace
  aliases) that use torch/at/c10/pybind11 or the Python C API, launch with `<<<…>>>`, call
  the CUDA runtime/driver or a CUDA library's host API, use host containers or `throw`;
  then, to a fixed point, items that use what a removed item defined, and plain functions
  and variables only removed code uses (host helpers); `PYBIND11_MODULE`/`TORCH_LIBRARY`
  blocks; a namespace or `extern "C"` block left empty.
  Items marked `__global__`/`__device__`/`__constant__`/`__shared__` (or a macro that
  expands to them) are always kept, whatever they contain.

Kernel names: every `__global__` definition kept, qualified by its namespaces. A template
kernel is named by the instantiations the removed host code wrote (`k<256, float>`, also
through a templated host launcher called with literal arguments or a launch macro, and
`scalar_t` of an `AT_DISPATCH_*` macro as float, the type the fp32 problems launched it
with); when none can be read, or the kernel sits in a preprocessor branch that is off for
sm_90, it is left unnamed (`skipped`).

Triton (`triton_source`): a file's top-level `@triton.jit` functions (`@jit` after `from
triton import jit` too) as the source of a kiln Triton candidate: each function as written
less its `@triton.autotune` / `@triton.heuristics` decorators (a configuration is a launch
plan's), after the triton imports and the module-level `NAME = tl.constexpr(<literal>)`
constants the functions use; every other import and all host code left out, and the jit
functions' names. What a candidate may import and which decorators hold a configuration
are kiln's Triton rules (`triton_rules.json`, which kiln writes beside this file; its one
copy is sdk/types/src/triton_rules.json, read by the compile driver and `kiln problems
check` too).
"""

import ast
import json
import os
import re

# ---------------------------------------------------------------- Python: the CUDA strings


class Unresolved(Exception):
    pass


class Strings:
    """Resolves string-valued expressions of a Python module (constants, names bound to
    them, `+`, f-strings of resolvable parts, `"".join([...])`, `textwrap.dedent`)."""

    def __init__(self, tree):
        # name (or ".attr" for `self.attr = ...`) -> [(line, value expression)]
        self.names = {}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and node.value:
                targets = [node.target]
            for t in targets:
                key = t.id if isinstance(t, ast.Name) else (
                    "." + t.attr if isinstance(t, ast.Attribute) else None)
                if key:
                    self.names.setdefault(key, []).append((node.lineno, node.value))
        self.before = None  # the line of the build call being resolved

    def binding(self, key):
        vals = self.names.get(key) or []
        if len({ast.dump(v) for _, v in vals}) > 1 and self.before is not None:
            # Several: the last one bound before the build call (`src = "..."; load_inline(...)`
            # twice in one file).
            earlier = [v for line, v in sorted(vals, key=lambda x: x[0]) if line < self.before]
            vals = [(0, earlier[-1])] if earlier else []
        if not vals or len({ast.dump(v) for _, v in vals}) != 1:
            raise Unresolved(f"name {key.lstrip('.')} not bound to one value")
        return vals[0][1]

    def value(self, e, depth=0):
        if depth > 30:
            raise Unresolved("too deep")
        if isinstance(e, ast.Constant) and isinstance(e.value, (str, int, float)):
            return e.value if isinstance(e.value, str) else str(e.value)
        if isinstance(e, ast.Name):
            return self.value(self.binding(e.id), depth + 1)
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id in ("self", "cls"):
            return self.value(self.binding("." + e.attr), depth + 1)
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
            return self.value(e.left, depth + 1) + self.value(e.right, depth + 1)
        if isinstance(e, ast.JoinedStr):
            out = []
            for part in e.values:
                if isinstance(part, ast.FormattedValue):
                    if part.format_spec is not None or part.conversion not in (-1, None):
                        raise Unresolved("formatted f-string part")
                    out.append(self.value(part.value, depth + 1))
                else:
                    out.append(self.value(part, depth + 1))
            return "".join(out)
        if isinstance(e, ast.Call):
            f = e.func
            if isinstance(f, ast.Attribute) and f.attr == "dedent" and len(e.args) == 1:
                import textwrap

                return textwrap.dedent(self.value(e.args[0], depth + 1))
            if isinstance(f, ast.Attribute) and f.attr == "join" and len(e.args) == 1:
                sep = self.value(f.value, depth + 1)
                return sep.join(self.list(e.args[0], depth + 1))
            if isinstance(f, ast.Attribute) and f.attr == "strip" and not e.args:
                return self.value(f.value, depth + 1).strip()
        raise Unresolved(type(e).__name__)

    def list(self, e, depth=0):
        if isinstance(e, ast.Name):
            try:
                v = self.binding(e.id)
            except Unresolved:
                v = None
            if isinstance(v, (ast.List, ast.Tuple)):
                return self.list(v, depth + 1)
        if isinstance(e, (ast.List, ast.Tuple)):
            return [self.value(x, depth + 1) for x in e.elts]
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
            return self.list(e.left, depth + 1) + self.list(e.right, depth + 1)
        return [self.value(e, depth + 1)]


def build_calls(tree):
    """The torch extension builds in a module: `load_inline(...)` / `load(...)` calls."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("load_inline", "load", "_load_inline", "compile_extension"):
                yield node


def kwarg(call, name):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


# A kernel's definition (not a docstring that mentions __global__).
KERNEL_DEF = re.compile(r"__global__[^;{]*?\w+\s*\([^;{]*\)[^;{]*\{")


def python_sources(text):
    """[(cuda source, flags)] from a Python file, or raises Unresolved."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise Unresolved(f"the published file is not valid Python ({e.msg})") from e
    s = Strings(tree)
    # The arch-specific target asked for through the environment torch's build reads
    # (`os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"`), as an nvcc flag.
    env_arch = []
    for m in re.finditer(r"TORCH_CUDA_ARCH_LIST[\"']\s*\]?\s*=\s*[\"']([^\"']+)[\"']", text):
        for a in re.findall(r"(\d+)\.(\d)a\b", m.group(1)):
            env_arch.append(f"-arch=sm_{a[0]}{a[1]}a")
    out = []
    for call in build_calls(tree):
        src_expr = kwarg(call, "cuda_sources")
        if src_expr is None:
            continue
        s.before = call.lineno
        try:
            parts = s.list(src_expr)
        except Unresolved as e:
            raise Unresolved(f"cuda source built at run time ({e})") from e
        src = "\n".join(parts)
        if "__global__" not in src:
            continue
        flags = []
        fl = kwarg(call, "extra_cuda_cflags")
        if fl is not None:
            try:
                flags = s.list(fl)
            except Unresolved:
                flags = []
        out.append((src, flags + [a for a in env_arch if a not in flags]))
    if out:
        return out
    s.before = None
    # No resolvable build call: every string constant holding a kernel, minus those that
    # are part of a longer one.
    cands = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and KERNEL_DEF.search(node.value):
            cands.append(node.value)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and any(
            isinstance(v, ast.Constant) and "__global__" in str(v.value) for v in node.values
        ):
            try:
                cands.append(s.value(node))
            except Unresolved as e:
                raise Unresolved(f"cuda source built at run time ({e})") from e
    cands = [c for c in cands if KERNEL_DEF.search(c)]
    if any(re.search(r"@[A-Za-z_]\w*@", c) for c in cands):
        raise Unresolved("cuda source is a template filled in at run time (@NAME@ placeholders)")
    cands = [c for c in cands if not any(c != d and c in d for d in cands)]
    seen = []
    for c in cands:
        if c not in seen:
            seen.append(c)
    return [(c, list(env_arch)) for c in seen]


# ---------------------------------------------------------------- C++: tokens and items

TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<raw>R"(?P<delim>[^(\s]{0,16})\(.*?\)(?P=delim)")
  | (?P<string>(?:u8|u|U|L)?"(?:\\.|[^"\\\n])*")
  | (?P<char>(?:u8|u|U|L)?'(?:\\.|[^'\\\n])*')
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<num>\.?\d(?:[eEpP][+-]|[\w.'])*)
  | (?P<punct><<<|>>>|::|->|<<=|>>=|<<|>>|<=|>=|==|!=|&&|\|\||\+\+|--|[-+*/%^&|~!=<>?:;,.(){}\[\]#\\@$])
    """,
    re.S | re.X,
)


class Tok:
    __slots__ = ("kind", "text", "start", "end")

    def __init__(self, kind, text, start, end):
        self.kind, self.text, self.start, self.end = kind, text, start, end

    def __repr__(self):
        return f"{self.kind}:{self.text}"


def tokens(src):
    """Tokens of C++ source; each preprocessor directive (with its continuations) is one
    'pp' token; comments and whitespace are dropped."""
    out = []
    i, n = 0, len(src)
    line_start = True
    while i < n:
        if line_start:
            j = i
            while j < n and src[j] in " \t":
                j += 1
            if j < n and src[j] == "#":
                k = j
                while k < n:
                    if src[k] == "\n":
                        if src[k - 1] == "\\" or (src[k - 1] == "\r" and src[k - 2] == "\\"):
                            k += 1
                            continue
                        break
                    if src.startswith("/*", k):
                        e = src.find("*/", k + 2)
                        k = n if e < 0 else e + 2
                        continue
                    if src.startswith("//", k):
                        e = src.find("\n", k)
                        k = n if e < 0 else e
                        continue
                    k += 1
                out.append(Tok("pp", src[j:k], j, k))
                i = k
                continue
        m = TOKEN.match(src, i)
        if not m:
            out.append(Tok("punct", src[i], i, i + 1))
            i += 1
            line_start = False
            continue
        kind = m.lastgroup if m.lastgroup != "delim" else "raw"
        for g in ("ws", "comment", "raw", "string", "char", "ident", "num", "punct"):
            if m.group(g) is not None:
                kind = g
                break
        text = m.group(0)
        if kind == "ws" or kind == "comment":
            if "\n" in text:
                line_start = True
        else:
            if kind == "raw":
                kind = "string"
            out.append(Tok(kind, text, m.start(), m.end()))
            line_start = False
        i = m.end()
    return out


class Item:
    def __init__(self, kind, lo, hi, children=None, name=None):
        self.kind, self.lo, self.hi = kind, lo, hi  # token indexes, hi inclusive
        self.children = children or []
        self.name = name  # namespace name
        self.removed = False


def match(toks, i, hi):
    """Index of the bracket closing toks[i]."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    depth = 0
    for j in range(i, hi):
        t = toks[j].text
        if toks[j].kind == "punct":
            if t in pairs:
                depth += 1
            elif t in (")", "]", "}"):
                depth -= 1
                if depth == 0:
                    return j
    return hi - 1


def skip_angles(toks, i, hi):
    """toks[i] is '<' after `template`: the index after its closing '>'."""
    depth = 0
    j = i
    while j < hi:
        t = toks[j].text
        if t == "<":
            depth += 1
        elif t == "<<":
            depth += 2
        elif t == ">":
            depth -= 1
        elif t == ">>":
            depth -= 2
        elif t in ("(", "["):
            j = match(toks, j, hi)
        if depth <= 0:
            return j + 1
        j += 1
    return hi


AGGREGATE = {"struct", "class", "union", "enum"}


def split(toks, lo, hi):
    items = []
    i = lo
    while i < hi:
        t = toks[i]
        if t.kind == "pp":
            items.append(Item("pp", i, i))
            i += 1
            continue
        if t.text == ";":
            i += 1
            continue
        if t.text == "namespace" or (
            t.text == "extern" and i + 2 < hi and toks[i + 1].kind == "string" and toks[i + 2].text == "{"
        ):
            j = i + 1
            while j < hi and toks[j].text not in ("{", ";", "="):
                j += 1
            if j < hi and toks[j].text == "{":
                close = match(toks, j, hi)
                name = "".join(x.text for x in toks[i + 1 : j]) if t.text == "namespace" else None
                kind = "namespace" if t.text == "namespace" else "extern"
                items.append(Item(kind, i, close, split(toks, j + 1, close), name))
                i = close + 1
                continue
        j = i
        aggregate = False
        while j < hi:
            x = toks[j]
            if x.kind == "punct" and x.text == "<" and j > i and toks[j - 1].text == "template":
                j = skip_angles(toks, j, hi)
                continue
            if x.kind == "ident" and x.text in AGGREGATE:
                aggregate = True
            if x.kind == "punct" and x.text == "=":
                aggregate = True
            if x.kind == "punct" and x.text in ("(", "["):
                j = match(toks, j, hi) + 1
                continue
            if x.kind == "punct" and x.text == "{":
                close = match(toks, j, hi)
                if not aggregate:
                    j = close
                    break
                j = close + 1
                continue
            if x.kind == "punct" and x.text == ";":
                break
            j += 1
        items.append(Item("decl", i, min(j, hi - 1)))
        i = j + 1
    return items


# ---------------------------------------------------------------- host or device

HOST_INCLUDE = re.compile(r"#\s*include\s*[<\"](torch/|ATen/|c10/|pybind11/|THC/|caffe2/|Python\.h)")
HOST_NS = {"torch", "at", "c10", "pybind11", "py", "std"}
HOST_STD = {
    "vector", "string", "cout", "cerr", "endl", "runtime_error", "invalid_argument",
    "unordered_map", "map", "mutex", "lock_guard", "once_flag", "call_once", "shared_ptr",
    "unique_ptr", "make_shared", "make_unique", "stringstream", "ostringstream", "to_string",
    "thread", "exception", "set", "unordered_set", "function", "optional", "getenv",
}
HOST_NAMES = {
    "PYBIND11_MODULE", "TORCH_LIBRARY", "TORCH_LIBRARY_IMPL", "TORCH_CHECK",
    "TORCH_EXTENSION_NAME", "TORCH_INTERNAL_ASSERT", "C10_CUDA_CHECK",
    "C10_CUDA_KERNEL_LAUNCH_CHECK", "throw", "pybind11", "getenv", "fopen", "fprintf",
    "atexit", "dlopen", "dlsym",
}
# Calls only host code makes (outside `__device__`/`__global__` code): the CUDA runtime and
# driver APIs and the CUDA libraries' host APIs.
HOST_CALL = re.compile(r"^(cuda[A-Z]\w*|cu[A-Z][a-z]\w*|cublas\w*|cudnn\w*|cufft\w*|curand\w*|cusparse\w*|nvrtc\w*)$")
HOST_DEFINE = re.compile(r"\b(TORCH_\w+|AT_\w+|C10_\w+|torch::|at::|c10::|pybind11|PYBIND11_\w+)")
DEVICE_WORDS = {"__global__", "__device__", "__constant__", "__shared__", "__managed__"}


def host_reason(toks, lo, hi, host_fns, host_macros):
    """Why toks[lo..=hi] is host code, or None."""
    for k in range(lo, hi + 1):
        t = toks[k]
        if t.kind == "pp" and k > lo:  # a #define inside a host function
            body = tokens(t.text.lstrip()[1:])
            why = body and host_reason(body, 0, len(body) - 1, host_fns, host_macros)
            if why:
                return why
            continue
        if t.kind == "punct" and t.text == "<<<":
            return "<<<>>> launch"
        if t.kind != "ident":
            continue
        nxt = toks[k + 1].text if k + 1 <= hi else ""
        if t.text in HOST_NAMES or t.text.startswith(("AT_DISPATCH", "PYBIND11_", "PyObject",
                                                      "PyMethodDef", "PyModuleDef", "PyInit_",
                                                      "PyArg_", "Py_")):
            return t.text
        if nxt == "::" and t.text in HOST_NS and (k == lo or toks[k - 1].text != "::"):
            if t.text != "std":
                return f"{t.text}::"
            member = toks[k + 2].text if k + 2 <= hi else ""
            if member in HOST_STD:
                return f"std::{member}"
        if nxt == "(" and HOST_CALL.match(t.text):
            return f"{t.text}()"
        if t.text in host_macros:
            return f"uses host {t.text}"
        if nxt in ("(", "<") and t.text in host_fns and (k == lo or toks[k - 1].text not in (".", "->", "::")):
            return f"calls host {t.text}"
        if t.text == "main" and k > lo and toks[k - 1].text == "int" and nxt == "(":
            return "main"
    # `using namespace torch;`, `namespace py = pybind11;`
    words = [toks[k].text for k in range(lo, hi + 1)]
    if words[:2] == ["using", "namespace"] and len(words) > 2 and words[2] in HOST_NS - {"std"}:
        return "using namespace"
    return None


def item_names(toks, it):
    """(names an item defines, whether it is a function): a function's name; a type's,
    alias's or variable's names."""
    start = it.lo
    if toks[start].text == "template" and start < it.hi and toks[start + 1].text == "<":
        start = skip_angles(toks, start + 1, it.hi + 1)  # its `= default`s are not this item's
    eq = next((k for k in range(start, it.hi + 1) if toks[k].text == "="), it.hi + 1)
    fn = function_name(toks, it)
    if fn and fn[2] < eq:
        return {fn[0]}, True
    names, depth = set(), 0
    for k in range(start, it.hi + 1):
        x = toks[k]
        if x.text in ("(", "[", "{"):
            depth += 1
        elif x.text in (")", "]", "}"):
            depth -= 1
        elif depth == 0 and x.kind == "ident":
            prev = toks[k - 1].text if k > it.lo else ""
            nxt = toks[k + 1].text if k < it.hi else ""
            if prev in AGGREGATE or prev == "using" or nxt in ("=", ";", "[", ",", "{"):
                names.add(x.text)
    return names - TYPE_WORDS - {"static", "const", "constexpr", "inline", "extern"}, False


def device_macros(toks):
    """Macros whose body marks device code (`#define DEVICE __device__ __forceinline__`)."""
    out = set()
    for t in toks:
        if t.kind == "pp":
            m = re.match(r"#\s*define\s+(\w+)\s+(.*)", t.text, re.S)
            if m and re.search(r"\b(__device__|__global__)\b", m.group(2)) and "(" not in m.group(1):
                out.add(m.group(1))
    return out


def head_end(toks, it):
    """Index of the first '{' at depth 0 of an item (its body), or it.hi + 1."""
    j = it.lo
    while j <= it.hi:
        x = toks[j]
        if x.kind == "punct" and x.text in ("(", "["):
            j = match(toks, j, it.hi + 1) + 1
            continue
        if x.kind == "punct" and x.text == "<" and j > it.lo and toks[j - 1].text == "template":
            j = skip_angles(toks, j, it.hi + 1)
            continue
        if x.kind == "punct" and x.text == "{":
            return j
        j += 1
    return it.hi + 1


def is_device(toks, it, dmacros):
    end = head_end(toks, it)
    return any(toks[k].text in DEVICE_WORDS or toks[k].text in dmacros for k in range(it.lo, end))


def is_global(toks, it, gmacros):
    end = head_end(toks, it)
    return any(toks[k].text == "__global__" or toks[k].text in gmacros for k in range(it.lo, end))


NOT_NAMES = {"__launch_bounds__", "__attribute__", "__align__", "alignas", "__declspec", "decltype",
             "__cluster_dims__", "__maxnreg__", "operator"}


def function_name(toks, it):
    """(name, template parameter names or None) of a function item, or None."""
    end = head_end(toks, it)
    tparams = None
    j = it.lo
    if toks[j].text == "template" and j + 1 < end and toks[j + 1].text == "<":
        k = skip_angles(toks, j + 1, end)
        tparams = template_params(toks[j + 2 : k - 1])
        j = k
    while j < end:
        x = toks[j]
        if x.kind == "punct" and x.text == "(":
            prev = toks[j - 1]
            if prev.kind == "ident" and prev.text not in NOT_NAMES:
                return prev.text, tparams, j
            j = match(toks, j, end) + 1
            continue
        j += 1
    return None


def template_params(ts):
    """Names of the parameters of a template header's tokens (`int BLOCK = 256, typename T`)."""
    params, cur, depth = [], [], 0
    for x in ts + [Tok("punct", ",", 0, 0)]:
        if x.text in ("<", "(", "["):
            depth += 1
        elif x.text in (">", ")", "]"):
            depth -= 1
        elif x.text == ">>":
            depth -= 2
        if depth == 0 and x.text == ",":
            params.append(cur)
            cur = []
        else:
            cur.append(x)
    names = []
    for p in params:
        head = []
        d = 0
        for x in p:
            if x.text in ("<", "(", "["):
                d += 1
            elif x.text in (">", ")", "]"):
                d -= 1
            if d == 0 and x.text == "=":
                break
            head.append(x)
        idents = [x.text for x in head if x.kind == "ident"]
        if idents:
            names.append(idents[-1])
    return names


# ---------------------------------------------------------------- template arguments

TYPE_WORDS = {
    "float", "double", "int", "unsigned", "long", "short", "char", "bool", "signed", "const",
    "true", "false", "void", "half", "__half", "__half2", "half2", "__nv_bfloat16",
    "__nv_bfloat162", "nv_bfloat16", "nv_bfloat162", "__nv_fp8_e4m3", "__nv_fp8_e5m2",
    "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t", "uint32_t", "int64_t", "uint64_t",
    "size_t", "float2", "float4", "int2", "int4", "uint4", "uint2", "sizeof", "std", "cuda",
}


def angle_args(toks, i, hi):
    """toks[i] is '<': (argument text, index after '>') or None."""
    depth, j = 0, i
    parts = []
    while j < hi:
        t = toks[j].text
        if t == "<":
            depth += 1
        elif t == ">":
            depth -= 1
        elif t == ">>":
            depth -= 2
            if depth < 0:
                return None
        elif t in ("(", "["):
            k = match(toks, j, hi)
            parts.extend(toks[j : k + 1])
            j = k + 1
            continue
        elif t in (";", "{", "}", "&&", "||"):
            return None
        if depth == 0:
            return parts, j + 1
        if j > i:
            parts.append(toks[j])
        j += 1
    return None


def arg_text(parts):
    out = ""
    prev = None
    for t in parts:
        if prev is not None and prev.kind in ("ident", "num") and t.kind in ("ident", "num"):
            out += " "
        elif t.text == "," :
            out += ""
        out += t.text
        if t.text == ",":
            out += " "
        prev = t
    return out.strip()


def defined_names(toks, kept):
    """Identifiers the kept source defines at namespace scope (macros, constants, types)."""
    names = set()
    for t in toks:
        if t.kind == "pp":
            m = re.match(r"#\s*define\s+(\w+)", t.text)
            if m:
                names.add(m.group(1))
    for it in kept:
        if it.kind != "decl":
            continue
        if function_name(toks, it) and head_end(toks, it) <= it.hi:
            continue  # a function: its locals are not in scope of a name expression
        ts = toks[it.lo : it.hi + 1]
        for k, x in enumerate(ts):
            if x.kind == "ident":
                nxt = ts[k + 1].text if k + 1 < len(ts) else ""
                prev = ts[k - 1].text if k > 0 else ""
                if prev in AGGREGATE or prev in ("typedef", "using") or nxt in ("=", ";", "{", "[", ",", "}"):
                    names.add(x.text)
    return names


# ---------------------------------------------------------------- one source


def disabled_regions(toks, flags):
    """Token indexes inside preprocessor branches that are off when kiln compiles for sm_90:
    `#ifdef X`/`#if defined(X)` of a macro neither the source nor the flags define (often a
    switch the host build sets at run time), `#if __CUDA_ARCH__ >= N` with N > 900. Other
    conditions count as on."""
    defined = {m.group(1) for t in toks if t.kind == "pp"
               for m in [re.match(r"#\s*define\s+(\w+)", t.text)] if m}
    defined |= {f[2:].split("=")[0] for f in flags if f.startswith("-D")}

    def value(cond):
        cond = cond.strip()
        m = re.fullmatch(r"!?\s*defined\s*\(?\s*(\w+)\s*\)?", cond)
        if m:
            on = m.group(1) in defined
            return not on if cond.startswith("!") else on
        m = re.fullmatch(r"\(?\s*(?:defined\s*\(?\s*__CUDA_ARCH__\s*\)?\s*&&\s*)?__CUDA_ARCH__\s*>=\s*(\d+)\s*\)?", cond)
        if m:
            return 900 >= int(m.group(1))
        return None  # unknown: on

    off = set()
    stack = []  # (this branch on, some branch taken)
    for k, t in enumerate(toks):
        if t.kind != "pp":
            if any(not on for on, _ in stack):
                off.add(k)
            continue
        m = re.match(r"#\s*(ifdef|ifndef|if|elif|else|endif)\b(.*)", t.text, re.S)
        if not m:
            continue
        d, rest = m.group(1), re.sub(r"//.*|/\*.*?\*/", "", m.group(2), flags=re.S)
        if d in ("ifdef", "ifndef"):
            on = (rest.strip() in defined) == (d == "ifdef")
            stack.append((on, on))
        elif d == "if":
            v = value(rest)
            on = True if v is None else v
            stack.append((on, on))
        elif d == "elif" and stack:
            _, taken = stack.pop()
            v = value(rest)
            on = (not taken) and (True if v is None else v)
            stack.append((on, taken or on))
        elif d == "else" and stack:
            _, taken = stack.pop()
            stack.append((not taken, True))
        elif d == "endif" and stack:
            stack.pop()
    return off


def extract(src, flags=()):
    toks = tokens(src)
    off = disabled_regions(toks, flags)
    items = split(toks, 0, len(toks))
    dmacros = device_macros(toks)
    gmacros = {m for m in dmacros if re.search(
        rf"#\s*define\s+{m}\s+.*__global__", "\n".join(t.text for t in toks if t.kind == "pp"))}

    flat = []

    def walk(its, ns):
        for it in its:
            flat.append((it, ns))
            if it.kind in ("namespace", "extern"):
                walk(it.children, ns + ([it.name] if it.kind == "namespace" and it.name else []))

    walk(items, [])

    # Host items, to a fixed point: those with host markers, then those that use what a
    # removed item defined (its function, type, variable or macro), then the plain
    # functions and variables only the removed host code uses (host helpers).
    host_fns, host_macros, host_names = set(), set(), set()
    reasons = []
    idents = {id(it): {toks[k].text for k in range(it.lo, it.hi + 1) if toks[k].kind == "ident"}
              for it, _ in flat if it.kind == "decl"}

    def remove(it, why):
        it.removed = True
        reasons.append(why)
        names, is_fn = item_names(toks, it)
        (host_fns if is_fn else host_names).update(names)

    changed = True
    while changed:
        changed = False
        for it, _ in flat:
            if it.removed or it.kind in ("namespace", "extern"):
                continue
            if it.kind == "pp":
                text = toks[it.lo].text
                define = re.match(r"#\s*define\s+(\w+)", text)
                body = tokens(text[define.end():]) if define else []
                if HOST_INCLUDE.match(text) or (
                    define and (HOST_DEFINE.search(text) or "<<<" in text
                                or (body and host_reason(body, 0, len(body) - 1, host_fns,
                                                         host_macros | host_names)))
                ):
                    it.removed = True
                    changed = True
                    if define:
                        host_macros.add(define.group(1))  # a launch or host-API macro
                continue
            if is_device(toks, it, dmacros):
                continue
            why = host_reason(toks, it.lo, it.hi, host_fns, host_macros | host_names)
            if why:
                remove(it, why)
                changed = True
        if changed:
            continue
        removed_ids = set().union(*[idents[id(it)] for it, _ in flat if it.kind == "decl" and it.removed])
        for it, _ in flat:
            if it.removed or it.kind != "decl" or is_device(toks, it, dmacros):
                continue
            names, is_fn = item_names(toks, it)
            head = {toks[k].text for k in range(it.lo, head_end(toks, it))}
            if not names or (not is_fn and head & (AGGREGATE | {"constexpr", "const", "typedef", "using", "template"})):
                continue
            kept_ids = set().union(*[idents[id(o)] for o, _ in flat
                                     if o.kind == "decl" and not o.removed and o is not it])
            if names & removed_ids and not names & kept_ids:
                remove(it, "host helper")
                changed = True
                break
    # A namespace or extern "C" block whose items all went is the wrapper's too.
    def prune(its):
        for it in its:
            if it.kind in ("namespace", "extern"):
                prune(it.children)
                if it.children and all(c.removed for c in it.children):
                    it.removed = True

    prune(items)

    # The candidate's source: the published text minus the removed items' spans.
    cuts = []

    def collect(its):
        for it in its:
            if it.removed:
                cuts.append((toks[it.lo].start, toks[it.hi].end))
            elif it.kind in ("namespace", "extern"):
                collect(it.children)

    collect(items)
    cuts.sort()
    out, pos = [], 0
    for a, b in cuts:
        out.append(src[pos:a])
        pos = b
    out.append(src[pos:])
    device_src = "".join(out)
    device_src = re.sub(r"\n[ \t]*\n([ \t]*\n)+", "\n\n", device_src)

    kept = [it for it, _ in flat if not it.removed and it.kind == "decl"]
    known = defined_names(toks, kept)

    # Kernels, and the instantiations the host code wrote: each removed host item, with the
    # source's launch and dispatch macros expanded in it, is searched for `kernel<...>`.
    macros = launch_macros(toks)
    snippets = []  # (host item, tokens of its text with the macros expanded)
    for it, _ in flat:
        if it.removed and it.kind == "decl":
            text = src[toks[it.lo].start : toks[it.hi].end]
            snippets.append((it, tokens(expand(text, macros))))
    templated_hosts = {}  # item -> (host template function name, its parameters)
    for it, _ in flat:
        if it.removed and it.kind == "decl":
            fn = function_name(toks, it)
            if fn and fn[1]:
                templated_hosts[id(it)] = (fn[0], fn[1])

    def refs(name):
        """(argument tokens, snippet index) of each `name<...>` in the host code."""
        found = []
        for si, (_, ts) in enumerate(snippets):
            for k in range(len(ts) - 1):
                if ts[k].kind == "ident" and ts[k].text == name and ts[k + 1].text == "<":
                    if k > 0 and ts[k - 1].text in (".", "->"):
                        continue
                    r = angle_args(ts, k + 1, len(ts))
                    if r:
                        found.append((r[0], si))
        return found

    def resolve(parts, env, dispatch):
        """Argument texts for parts under env (host template parameter -> value)."""
        idents = {p.text for p in parts if p.kind == "ident"}
        free = [x for x in idents if x not in TYPE_WORDS and x not in known and x not in env]
        if "scalar_t" in free and dispatch:
            free.remove("scalar_t")
        if free:
            return []
        texts = [arg_text([Tok(p.kind, env.get(p.text, p.text), 0, 0) for p in parts])]
        if "scalar_t" in idents and "scalar_t" not in env and dispatch:
            texts = [re.sub(r"\bscalar_t\b", ty, t) for t in texts for ty in dispatch]
        return texts

    def dispatch_types(si):
        # `scalar_t` of an AT_DISPATCH_* macro: the type the launch ran with, float (the
        # problems of these corpora are fp32). The macro also compiled double (and half)
        # instances that never ran; a kiln launch list names only what it launches.
        text = " ".join(t.text for t in snippets[si][1])
        return ["float"] if "AT_DISPATCH" in text else []

    def locals_of(si):
        """`constexpr int TX = 16, TY = 8;`-style constants of a host item."""
        ts = snippets[si][1]
        hi = len(ts) - 1
        env = {}
        for k in range(hi):
            if ts[k].text not in ("constexpr", "const"):
                continue
            j = k + 1
            while j < hi and ts[j].kind == "ident" and ts[j + 1].kind == "ident":
                j += 1
            while j + 1 < hi and ts[j].kind == "ident" and ts[j + 1].text == "=":
                e = j + 2
                vals = []
                while e <= hi and ts[e].text not in (";", ","):
                    vals.append(ts[e])
                    e += 1
                ok = vals and all(
                    v.kind == "num" or (v.kind == "punct" and v.text in "+-*/()<>%")
                    or (v.kind == "ident" and (v.text in known or v.text in env)) for v in vals)
                if ok:
                    txt = arg_text([Tok(v.kind, env.get(v.text, v.text), 0, 0) for v in vals])
                    env[ts[j].text] = txt if len(vals) == 1 else f"({txt})"
                if e > hi or ts[e].text != ",":
                    break
                j = e + 1
        return env

    envs_memo = {}

    def host_envs(si, stack=()):
        """Bindings of the host item's template parameters, from the calls other host
        code makes with readable arguments (its local constants when it is no template)."""
        if si in envs_memo:
            return envs_memo[si]
        if si in stack or len(stack) > 4:
            return []
        owner = snippets[si][0]
        base = locals_of(si)
        if id(owner) not in templated_hosts:
            envs = [base]
        else:
            name, params = templated_hosts[id(owner)]
            envs = []
            for parts, caller in refs(name):
                if caller == si:
                    continue
                for outer in host_envs(caller, stack + (si,)):
                    for txt in resolve(parts, outer, dispatch_types(caller)):
                        vals = split_args(txt)
                        if len(vals) <= len(params):
                            env = {**base, **dict(zip(params, vals))}
                            if env not in envs:
                                envs.append(env)
        envs_memo[si] = envs[:64]
        return envs_memo[si]

    kernels, skipped = [], []
    for it, ns in flat:
        if it.removed or it.kind != "decl" or not is_global(toks, it, gmacros):
            continue
        if head_end(toks, it) > it.hi:  # a declaration, not a definition
            continue
        fn = function_name(toks, it)
        if not fn:
            continue
        name, tparams, _ = fn
        qual = "::".join(list(ns) + [name])
        if it.lo in off:  # not compiled for sm_90 with these flags
            skipped.append(qual)
            continue
        if not tparams:
            if qual not in kernels:
                kernels.append(qual)
            continue
        insts = []
        for parts, si in refs(name):
            for env in host_envs(si):
                for txt in resolve(parts, env, dispatch_types(si)):
                    e = f"{qual}<{txt}>"
                    if e not in insts:
                        insts.append(e)
        if insts:
            kernels.extend(i for i in insts if i not in kernels)
        else:
            skipped.append(qual)
    return device_src, kernels, skipped, sorted(set(reasons))


def launch_macros(toks):
    """The source's function-like macros, and its object-like macros whose body is code
    (a launch, a call): name -> (parameters or None, body)."""
    out = {}
    for t in toks:
        if t.kind != "pp":
            continue
        text = re.sub(r"\\\r?\n", " ", t.text)
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//.*", "", text)
        m = re.match(r"#\s*define\s+(\w+)(\(([^)]*)\))?\s*(.*)", text, re.S)
        if not m:
            continue
        name, params, body = m.group(1), m.group(3), m.group(4).strip()
        if params is not None:
            out[name] = ([p.strip() for p in params.split(",") if p.strip()], body)
        elif "(" in body or "<<<" in body:
            out[name] = (None, body)
    return out


def expand(text, macros, depth=0):
    """text with the macros expanded (textually; a few levels deep, size-bounded)."""
    if depth > 4 or not macros:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, macros)) + r")\b")
    out, i, changed = [], 0, False
    while True:
        m = pattern.search(text, i)
        if not m:
            out.append(text[i:])
            break
        params, body = macros[m.group(1)]
        if params is None:
            out.append(text[i : m.start()] + " " + body + " ")
            i, changed = m.end(), True
            continue
        j = m.end()
        while j < len(text) and text[j] in " \t\r\n":
            j += 1
        if j >= len(text) or text[j] != "(":
            out.append(text[i : m.end()])
            i = m.end()
            continue
        args, level, start, k = [], 0, j + 1, j
        while k < len(text):
            c = text[k]
            if c in "([{":
                level += 1
            elif c in ")]}":
                level -= 1
                if level == 0:
                    args.append(text[start:k])
                    break
            elif c == "," and level == 1:
                args.append(text[start:k])
                start = k + 1
            k += 1
        else:
            out.append(text[i:])
            break
        binding = {p: a.strip() for p, a in zip(params, args)}
        b = re.sub(r"\b\w+\b", lambda w: binding.get(w.group(0), w.group(0)), body) if binding else body
        out.append(text[i : m.start()] + " " + b.replace("##", "") + " ")
        i, changed = k + 1, True
    res = "".join(out)
    if len(res) > 1_000_000:
        return text
    return expand(res, macros, depth + 1) if changed else res


def split_args(txt):
    out, depth, cur = [], 0, ""
    for c in txt:
        if c in "<([":
            depth += 1
        elif c in ">)]":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur.strip())
    return out


# ---------------------------------------------------------------- flags

def kiln_flags(flags):
    """The author's nvcc flags as kiln spells them (arch-specific targets as `-arch=`)."""
    out = []
    flags = [f.strip() for f in flags]
    i = 0
    while i < len(flags):
        f = flags[i]
        i += 1
        if f.startswith("-Xptxas"):
            opt = f.split("=", 1)[1] if "=" in f[:8] else (flags[i] if f == "-Xptxas" and i < len(flags) else "")
            if f == "-Xptxas":
                i += 1
            m = re.fullmatch(r"--?maxrregcount[= ](\d+)", opt)
            out.append(f"--maxrregcount={m.group(1)}" if m else f"-Xptxas {opt}")
            continue
        m = re.search(r"(?:arch|code)=(?:compute|sm)_(\d+a)\b", f)
        if m:
            a = f"-arch=sm_{m.group(1)}"
            if a not in out:
                out.append(a)
            continue
        if f:
            out.append(f)
    return out


# ---------------------------------------------------------------- Triton: the jit functions

TRITON_RULES_FILE = "triton_rules.json"
_TRITON_RULES = []


def triton_rules():
    """kiln's Triton rules (read once, on first use: the CUDA extraction does without):
    the file kiln writes beside this one, else (run from kiln's source tree) the
    workspace's one copy."""
    if not _TRITON_RULES:
        here = os.path.dirname(os.path.abspath(__file__))
        for path in (os.path.join(here, TRITON_RULES_FILE),
                     os.path.join(here, "..", "..", "sdk", "types", "src", TRITON_RULES_FILE)):
            if os.path.isfile(path):
                with open(path) as f:
                    _TRITON_RULES.append(json.load(f))
                break
        else:
            raise Unresolved(f"no {TRITON_RULES_FILE} beside the extractor")
    return _TRITON_RULES[0]


def _importable(name):
    """True if a Triton candidate may import the module `name` (the rules' modules and
    trees)."""
    rules = triton_rules()
    return name in rules["import_modules"] or _in_tree(name)


def _in_tree(name):
    """True if `name` is one of the rules' import trees (`triton.language`) or under one:
    `from` it any public name may come."""
    return any(name == t or name.startswith(t + ".") for t in triton_rules()["import_trees"])


def _chain(node):
    """`a.b.c` as ["a", "b", "c"], or None if `node` is not a plain attribute chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _literal(node):
    """A literal a `tl.constexpr(...)` constant may hold: a number, a bool, a string, None."""
    if isinstance(node, ast.Constant):
        return node.value is None or isinstance(node.value, (bool, int, float, str))
    return (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, (int, float))
            and not isinstance(node.operand.value, bool))


def _module_statements(body):
    """The statements run at a module's top level: `body`, with those of its top-level
    `if` / `try` blocks (`try: import triton`), in order."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _module_statements(node.body + node.orelse)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            yield from _module_statements(node.body + node.orelse + node.finalbody)


class _TritonNames:
    """What the module's top-level imports bind to triton: for each bound name, the
    module path (`triton`, `triton.language`...) or the object (`triton.jit`), and the
    import line a Triton candidate may hold for it (None: one it may not)."""

    def __init__(self, tree):
        self.binds = {}  # name -> (dotted path of what it is, the import line or None)
        for node in _module_statements(tree.body):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name != "triton" and not a.name.startswith("triton."):
                        continue
                    allowed = _importable(a.name)
                    if a.asname:
                        self.bind(a.asname, a.name, f"import {a.name} as {a.asname}" if allowed else None)
                    else:
                        # `import triton.language` binds `triton`; kept as `import triton`
                        # only when the submodule is one a candidate may import.
                        self.bind("triton", "triton", f"import {a.name}" if allowed else None)
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level or not (mod == "triton" or mod.startswith("triton.")):
                    continue
                language = _in_tree(mod)
                for a in node.names:
                    if a.name == "*":
                        continue
                    allowed = (mod == "triton" and a.name in triton_rules()["from_triton"]) or (
                        language and not a.name.startswith("_"))
                    bind = a.asname or a.name
                    line = None
                    if allowed:
                        line = f"from {mod} import {a.name}" + (f" as {a.asname}" if a.asname else "")
                    self.bind(bind, f"{mod}.{a.name}", line)

    def bind(self, name, path, line):
        # The first binding of a name stays (a file that rebinds it is not read further),
        # but an import a candidate may hold replaces one of the same thing it may not
        # (`import triton.testing`, then `import triton`).
        old = self.binds.get(name)
        if old is None or (old[1] is None and old[0] == path):
            self.binds[name] = (path, line)

    def path(self, node):
        """The dotted path an expression names through the imports (`tl.constexpr` with
        `import triton.language as tl`: "triton.language.constexpr"), or None."""
        parts = _chain(node)
        if parts is None or parts[0] not in self.binds:
            return None
        return ".".join([self.binds[parts[0]][0]] + parts[1:])


JIT_PATHS = ("triton.jit", "triton.runtime.jit", "triton.runtime.jit.jit")


def _is_jit(names, dec):
    target = dec.func if isinstance(dec, ast.Call) else dec
    return names.path(target) in JIT_PATHS


def _is_config(names, dec):
    target = dec.func if isinstance(dec, ast.Call) else dec
    path = names.path(target) or ""
    return path.split(".")[0] == "triton" and path.rsplit(".", 1)[-1] in triton_rules()["config_decorators"]


def _used_names(nodes):
    used = set()
    for n in nodes:
        for x in ast.walk(n):
            if isinstance(x, ast.Name):
                used.add(x.id)
    return used


def _jit_respelled(names, dec):
    """True for a jit decorator reached through an import a candidate may not hold
    (`from triton.runtime.jit import jit`): it is spelled `triton.jit` instead."""
    if not _is_jit(names, dec):
        return False
    path, line = names.binds[_chain(dec.func if isinstance(dec, ast.Call) else dec)[0]]
    return line is None and path != "triton"


def _decorator_text(text, names, dec):
    """A kept decorator's text (see `_jit_respelled`)."""
    if not _jit_respelled(names, dec):
        return ast.get_source_segment(text, dec)
    if not isinstance(dec, ast.Call):
        return "triton.jit"
    args = [ast.get_source_segment(text, a) for a in dec.args]
    args += [ast.get_source_segment(text, k) for k in dec.keywords]
    return "triton.jit(" + ", ".join(args) + ")"


def triton_source(text, tree=None):
    """The Triton source a contract candidate would hold for a Python file, read as text
    (nothing of it run): {"source", "kernels"}, or None when the file defines no top-level
    `@triton.jit` function (`@jit` after `from triton import jit` too).

    The source holds every top-level jit function as written, less its `@triton.autotune`
    / `@triton.heuristics` decorators (a configuration is a launch plan's: constexprs,
    num_warps, num_stages), after the triton imports and the module-level
    `NAME = tl.constexpr(<literal>)` constants those functions use, in the file's order:
    what kiln's Triton contract accepts (problems/README.md, "Triton candidates").
    Imports of anything else (torch, triton.runtime, `from triton import Config`...) and
    all host code are left out. "kernels" names the jit functions in the file's order.
    Raises Unresolved when the text is not Python."""
    if tree is None:
        try:
            tree = ast.parse(text)
        except SyntaxError as e:
            raise Unresolved(f"the published file is not valid Python ({e.msg})") from e
    names = _TritonNames(tree)
    # Top-level jit functions and constexpr constants, the last binding of a name winning
    # (as when the file runs).
    functions, constants = {}, {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            functions.pop(node.name, None)
            constants.pop(node.name, None)
            jit = [d for d in getattr(node, "decorator_list", []) if _is_jit(names, d)]
            if jit and isinstance(node, ast.FunctionDef):
                functions[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for x in ast.walk(t):
                    if isinstance(x, ast.Name):
                        functions.pop(x.id, None)
                        constants.pop(x.id, None)
            v = node.value
            if (isinstance(node, ast.Assign) and len(targets) == 1 and isinstance(targets[0], ast.Name)
                    and isinstance(v, ast.Call) and len(v.args) == 1 and not v.keywords
                    and _literal(v.args[0])
                    and names.path(v.func) in ("triton.language.constexpr", "triton.language.core.constexpr")):
                constants[targets[0].id] = node
    if not functions:
        return None
    kept = {}  # function name -> its kept decorators
    used = set()
    for node in functions.values():
        kept[node.name] = [d for d in node.decorator_list if not _is_config(names, d)]
        used |= _used_names(kept[node.name] + [node.args] + node.body
                            + ([node.returns] if node.returns else []))
    kept_constants = {n: c for n, c in constants.items() if n in used}
    used |= _used_names([c.value for c in kept_constants.values()])
    imports = []
    for name in sorted(used & set(names.binds), key=list(names.binds).index):
        path, line = names.binds[name]
        if line is None and path == "triton":
            line = "import triton" if name == "triton" else f"import triton as {name}"
        if line is not None and line not in imports:
            imports.append(line)
    if any(_jit_respelled(names, d) for ds in kept.values() for d in ds) and "import triton" not in imports:
        imports.insert(0, "import triton")
    parts = ["\n".join(imports)] if imports else []
    items = sorted(list(kept_constants.values()) + list(functions.values()), key=lambda n: n.lineno)
    for node in items:
        if isinstance(node, ast.Assign):
            parts.append(ast.get_source_segment(text, node))
            continue
        head = "\n".join("@" + _decorator_text(text, names, d) for d in kept[node.name])
        parts.append(head + "\n" + ast.get_source_segment(text, node))
    return {"source": "\n\n\n".join(parts) + "\n", "kernels": list(functions)}

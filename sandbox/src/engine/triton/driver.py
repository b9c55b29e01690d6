"""kiln's Triton compile driver: trusted code, run by kiln-worker in the compile jail.

    python -I -B driver.py REQUEST.json

The request names the candidate's source file, the kernels to compile (a jit function,
the Triton types of its non-constexpr arguments in order, which of them are divisible by
16, its constexprs and its options) and the target GPU. The driver

1. imports triton (trusted: the installed package);
2. parses the candidate's Python and refuses, before any of it runs, everything but
   imports of triton, triton.language and its submodules (libdevice), `@triton.jit`
   function definitions, and `NAME = tl.constexpr(<literal>)` constants; inside the jit
   functions it refuses names, attributes and constructs through which Triton's code
   generator could reach Python outside triton.language (it calls Python callables it
   finds while compiling);
3. imports the candidate module (by then only triton's own code runs at import), and
   compiles each kernel with `triton.compile(ASTSource(...), target=GPUTarget(...))`;
4. writes `result.json` and one CUBIN per kernel next to the request.

The result is untrusted for kiln-worker all the same (the candidate's jit code ran inside
Triton's compiler in this process): it reads it with size limits and checks every field.
Errors are answered in result.json with a kind: "compile" (the source: a compile_error) or
"launch" (the launch plan does not fit the function: an invalid_launch).

The lists of names the filter goes by (what may be imported, the kernel builtins, the
jit keywords...) are kiln's Triton rules, `triton_rules.json`: kiln-worker writes the file
beside this script (its one copy is sdk/types/src/triton_rules.json, which kiln-types
embeds; the hosted extractor and `kiln problems check` read the same file).
"""

import ast
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import time
import types

RULES_FILE = "triton_rules.json"


def load_rules():
    """kiln's Triton rules: the file kiln-worker writes beside this script, else (run from
    kiln's source tree, as the tests do) the workspace's one copy."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, RULES_FILE),
                 os.path.join(here, "..", "..", "..", "..", "sdk", "types", "src", RULES_FILE)):
        if os.path.isfile(path):
            with open(path) as f:
                return json.load(f)
    raise RuntimeError("no %s beside %s: kiln writes it there" % (RULES_FILE, __file__))


RULES = load_rules()
#: Python builtins Triton's code generator understands that reach nothing else.
SAFE_BUILTINS = set(RULES["kernel_builtins"])
#: Attributes never followed inside a kernel: a JITFunction's Python-side machinery.
JIT_INTERNALS = set(RULES["jit_internals"])
#: Builtin types a parameter may be annotated with (a name lookup at definition time).
ANNOTATION_BUILTINS = set(RULES["annotation_builtins"])
#: What `from triton import NAME` may bring in (in the rules' order, for messages).
TRITON_NAMES = list(RULES["from_triton"])
#: Keyword arguments accepted by `@triton.jit(...)`, each with literal values only.
JIT_KWARGS = set(RULES["jit_keywords"])
#: Syntax refused inside a jit function (those of the rules this Python has).
KERNEL_FORBIDDEN = tuple(getattr(ast, n) for n in RULES["kernel_forbidden"] if hasattr(ast, n))


def importable(name):
    """True if the module `name` may be imported (the rules' modules and trees)."""
    return name in RULES["import_modules"] or any(
        name == t or name.startswith(t + ".") for t in RULES["import_trees"])


def spoken(names):
    """`a, b and c`."""
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]

#: What an attribute chain resolves to past its last module: an attribute of a
#: triton.language object (a dtype's field), never the object a decorator or a constant
#: must be.
OPAQUE = object()

HELP = ("a triton candidate holds only imports of triton, triton.language and its "
        "submodules (libdevice), @triton.jit functions and NAME = tl.constexpr(<literal>) "
        "constants; kiln launches the kernels itself, so no host code")


class Refused(Exception):
    """The candidate's source is not accepted (a compile_error)."""


class LaunchError(Exception):
    """The launch plan does not fit the kernel (an invalid_launch)."""

    def __init__(self, index, message):
        super().__init__(message)
        self.index = index


def snippet(source, node):
    text = ast.get_source_segment(source, node) or type(node).__name__
    first = text.strip().splitlines()[0] if text.strip() else type(node).__name__
    return first if len(first) <= 80 else first[:77] + "..."


def refuse(source, node, why):
    raise Refused("line %d: `%s`: %s" % (getattr(node, "lineno", 0), snippet(source, node), why))


def is_language_module(mod):
    name = getattr(mod, "__name__", "")
    return isinstance(mod, types.ModuleType) and (
        name == "triton.language" or name.startswith("triton.language."))


def language_owned(obj, triton, tl):
    """True for objects that belong to triton.language (functions, classes, dtypes,
    constexprs) and the few top-level helpers kernels use."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return True
    if isinstance(obj, types.ModuleType):
        return is_language_module(obj)
    if any(obj is getattr(triton, n, None) for n in TRITON_NAMES):
        return True
    if isinstance(obj, (tl.dtype, tl.constexpr)):
        return True
    module = getattr(obj, "__module__", None) or ""
    return module == "triton.language" or module.startswith("triton.language.")


class Module:
    """What the candidate's module binds: modules, triton.language objects, jit
    functions and constexpr constants."""

    def __init__(self):
        self.modules = {}      # name -> module object (triton or a triton.language module)
        self.objects = {}      # name -> triton.language object (from ... import)
        self.jit = set()       # names of @triton.jit functions
        self.constants = set()  # names of NAME = tl.constexpr(...) constants

    def bound(self, name):
        return (name in self.modules or name in self.objects or name in self.jit
                or name in self.constants)


def literal(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float, str)):
        return True
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, (int, float))
            and not isinstance(node.operand.value, bool)):
        return True
    return False


def chain(node):
    """`a.b.c` as ["a", "b", "c"], or None if it is not a plain attribute chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


class Filter:
    def __init__(self, source, triton, tl):
        self.source = source
        self.triton = triton
        self.tl = tl
        self.m = Module()

    # --- resolution against the real, trusted modules -------------------------------

    def resolve_chain(self, node, parts):
        """The object `parts` names (its root bound by an import), checking every step
        stays inside triton.language."""
        root = parts[0]
        if root in self.m.modules:
            obj = self.m.modules[root]
        elif root in self.m.objects:
            obj = self.m.objects[root]
        else:
            return None
        for i, attr in enumerate(parts[1:]):
            if attr.startswith("_"):
                refuse(self.source, node, "private and dunder attributes are not allowed")
            if isinstance(obj, types.ModuleType):
                if obj is self.triton:
                    if i != 0 or attr not in TRITON_NAMES:
                        refuse(self.source, node,
                               "of the triton package only %s may be used"
                               % spoken("triton." + n for n in TRITON_NAMES))
                elif not is_language_module(obj):
                    refuse(self.source, node, "reaches outside triton.language")
                if not hasattr(obj, attr):
                    try:
                        obj = importlib.import_module(obj.__name__ + "." + attr)
                        continue
                    except ImportError:
                        refuse(self.source, node,
                               "%s has no attribute %s" % (obj.__name__, attr))
                obj = getattr(obj, attr)
                if not language_owned(obj, self.triton, self.tl) and obj is not self.triton.jit:
                    refuse(self.source, node, "reaches outside triton.language")
            else:
                # Past the last module: attributes of a triton.language object (a dtype's
                # fields, a constexpr's value). Dunders and privates are refused above for
                # every remaining attribute.
                for rest in parts[2 + i:]:
                    if rest.startswith("_"):
                        refuse(self.source, node,
                               "private and dunder attributes are not allowed")
                return OPAQUE
        return obj

    def triton_jit(self, node):
        parts = chain(node)
        return parts is not None and self.resolve_chain(node, parts) is self.triton.jit

    def constexpr_ctor(self, node):
        parts = chain(node)
        return parts is not None and self.resolve_chain(node, parts) is self.tl.constexpr

    # --- module level ----------------------------------------------------------------

    def check_module(self, tree):
        for node in tree.body:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                continue  # a docstring
            if isinstance(node, ast.Import):
                self.check_import(node)
            elif isinstance(node, ast.ImportFrom):
                self.check_import_from(node)
            elif isinstance(node, ast.Assign):
                self.check_constant(node)
            elif isinstance(node, ast.FunctionDef):
                self.check_function(node)
            else:
                refuse(self.source, node, HELP)

    def new_name(self, node, name):
        if name.startswith("__") or self.m.bound(name) or name in SAFE_BUILTINS:
            refuse(self.source, node,
                   "the name %s is reserved or bound twice; each module-level name is bound "
                   "once" % name)

    def check_import(self, node):
        for alias in node.names:
            name = alias.name
            if not importable(name):
                refuse(self.source, node, HELP)
            try:
                mod = importlib.import_module(name)
            except ImportError as e:
                refuse(self.source, node, "cannot import %s: %s" % (name, e))
            if alias.asname:
                self.new_name(node, alias.asname)
                self.m.modules[alias.asname] = mod
            else:
                root = name.split(".")[0]
                if root not in self.m.modules:
                    self.new_name(node, root)
                    self.m.modules[root] = importlib.import_module(root)

    def check_import_from(self, node):
        mod_name = node.module or ""
        if node.level != 0 or not importable(mod_name):
            refuse(self.source, node, HELP)
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            refuse(self.source, node, "cannot import %s: %s" % (mod_name, e))
        for alias in node.names:
            name = alias.name
            if name == "*" or name.startswith("_"):
                refuse(self.source, node, "import names one by one, no private names")
            if mod is self.triton and name not in TRITON_NAMES:
                refuse(self.source, node,
                       "from triton only %s may be imported" % spoken(TRITON_NAMES))
            if hasattr(mod, name):
                obj = getattr(mod, name)
            else:
                try:
                    obj = importlib.import_module(mod_name + "." + name)
                except ImportError:
                    refuse(self.source, node, "%s has no %s" % (mod_name, name))
            bind = alias.asname or name
            self.new_name(node, bind)
            if isinstance(obj, types.ModuleType):
                if not is_language_module(obj):
                    refuse(self.source, node, "reaches outside triton.language")
                self.m.modules[bind] = obj
            elif obj is self.triton.jit or language_owned(obj, self.triton, self.tl):
                self.m.objects[bind] = obj
            else:
                refuse(self.source, node, "reaches outside triton.language")

    def check_constant(self, node):
        ok = (len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and isinstance(node.value, ast.Call) and self.constexpr_ctor(node.value.func)
              and len(node.value.args) == 1 and not node.value.keywords
              and literal(node.value.args[0]))
        if not ok:
            refuse(self.source, node,
                   "module-level assignments must read NAME = tl.constexpr(<literal>) (a "
                   "number, a bool, a string or None)")
        self.new_name(node, node.targets[0].id)
        self.m.constants.add(node.targets[0].id)

    def check_function(self, node):
        if len(node.decorator_list) != 1:
            refuse(self.source, node, "a function needs exactly one decorator, @triton.jit "
                   "(autotune and heuristics configs belong in the launch plan: constexprs, "
                   "num_warps, num_stages)")
        dec = node.decorator_list[0]
        if isinstance(dec, ast.Call):
            if not self.triton_jit(dec.func) or dec.args:
                refuse(self.source, dec, "only @triton.jit and @triton.jit(<keywords>) are "
                       "accepted as decorators")
            for kw in dec.keywords:
                values = kw.value.elts if isinstance(kw.value, (ast.List, ast.Tuple)) \
                    else [kw.value]
                if kw.arg not in JIT_KWARGS or not all(literal(v) for v in values):
                    refuse(self.source, dec, "@triton.jit takes only %s, with literal values"
                           % ", ".join(sorted(JIT_KWARGS)))
        elif not self.triton_jit(dec):
            refuse(self.source, dec, "only @triton.jit is accepted as a decorator "
                   "(autotune and heuristics configs belong in the launch plan)")
        if getattr(node, "type_params", None):
            refuse(self.source, node, "type parameters are not allowed")
        args = node.args
        if args.vararg or args.kwarg:
            refuse(self.source, node, "*args and **kwargs are not allowed")
        params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        for a in args.posonlyargs + args.args + args.kwonlyargs:
            if a.arg.startswith("__") or self.m.bound(a.arg):
                refuse(self.source, a, "a parameter may not shadow a module-level name")
            if a.annotation is not None:
                self.check_annotation(a.annotation)
        if node.returns is not None:
            self.check_annotation(node.returns)
        for d in args.defaults + [d for d in args.kw_defaults if d is not None]:
            if not (literal(d) or (isinstance(d, ast.Name) and d.id in self.m.constants)
                    or self.resolves(d)):
                refuse(self.source, d, "default values must be literals, constexpr constants "
                       "or triton.language objects (tl.float32)")
        self.new_name(node, node.name)
        self.m.jit.add(node.name)
        self.check_body(node, set(params))

    def resolves(self, node):
        """True if `node` is an attribute chain (or a name) bound to triton.language."""
        parts = chain(node)
        return parts is not None and (
            (len(parts) > 1 or parts[0] in self.m.objects)
            and self.resolve_chain(node, parts) is not None)

    def check_annotation(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return
        if isinstance(node, ast.Name) and node.id in ANNOTATION_BUILTINS:
            return
        if not self.resolves(node):
            refuse(self.source, node, "annotations must name triton.language types "
                   "(tl.constexpr, tl.int32, ...), int, float, bool or str, or be strings")

    # --- inside a jit function -------------------------------------------------------

    def check_body(self, fn, params):
        local = set(params)
        for node in ast.walk(fn):
            if node is fn:
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                if self.m.bound(node.id) or node.id in SAFE_BUILTINS:
                    refuse(self.source, node, "a local may not rebind a module-level name")
                local.add(node.id)
            elif isinstance(node, ast.arg):
                local.add(node.arg)
        parents = {}
        for node in ast.walk(fn):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for stmt in fn.body:
            for node in ast.walk(stmt):
                if isinstance(node, KERNEL_FORBIDDEN):
                    refuse(self.source, node, "not allowed inside a @triton.jit function")
                if isinstance(node, ast.Attribute):
                    self.check_attribute(node, parents)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                    self.check_name(node, local, parents)

    def check_attribute(self, node, parents):
        if node.attr.startswith("_"):
            refuse(self.source, node, "private and dunder attributes are not allowed")
        if node.attr in JIT_INTERNALS:
            refuse(self.source, node, "the attribute %s is not allowed in a kernel" % node.attr)
        # Resolve the outermost chain rooted at a module binding, once.
        if isinstance(parents.get(node), ast.Attribute):
            return
        parts = chain(node)
        if parts is None:
            return
        root = parts[0]
        if root in self.m.jit:
            refuse(self.source, node, "jit functions may only be called")
        if root in self.m.modules or root in self.m.objects:
            self.resolve_chain(node, parts)

    def check_name(self, node, local, parents):
        name = node.id
        if name in local or name in self.m.constants or name in self.m.jit \
                or name in SAFE_BUILTINS:
            return
        if name in self.m.modules:
            parent = parents.get(node)
            if not (isinstance(parent, ast.Attribute) and parent.value is node):
                refuse(self.source, node, "a module may only be used as %s.<name>" % name)
            return
        if name in self.m.objects:
            obj = self.m.objects[name]
            if obj is self.triton.jit:
                refuse(self.source, node, "triton.jit is a decorator, not a kernel function")
            return
        refuse(self.source, node,
               "%s is not defined for kernels: they may use their parameters and locals, the "
               "module's jit functions and constexpr constants, triton.language, and %s"
               % (name, ", ".join(sorted(SAFE_BUILTINS))))


# --- compiling ---------------------------------------------------------------------------

PTX_ENTRY = re.compile(r"\.(?:visible|extern)\s+\.entry\s+(\w+)\s*\(([^)]*)\)")


def ptx_params(ptx):
    m = PTX_ENTRY.search(ptx)
    if m is None:
        return None, None
    return m.group(1), len(re.findall(r"\.param\s+", m.group(2)))


def constexpr_value(v, tl):
    """A launch's constexpr as Triton takes it: JSON gives bool, int, float or str; a
    string naming a triton.language dtype (`"tl.float16"`) becomes that dtype."""
    if isinstance(v, str) and v.startswith("tl."):
        d = getattr(tl, v[3:], None)
        if isinstance(d, tl.dtype):
            return d
    return v


def compile_kernel(index, spec, module, source_path, target_arch, triton, tl):
    from triton.compiler import ASTSource
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    name = spec["function"]
    fn = getattr(module, name, None)
    if not isinstance(fn, JITFunction) or getattr(fn.fn, "__module__", None) != module.__name__:
        found = sorted(k for k, v in vars(module).items() if isinstance(v, JITFunction))
        raise LaunchError(index, "no @triton.jit function named %s in the source (found: %s)"
                          % (name, ", ".join(found) or "none"))
    params = fn.params
    plain = [p for p in params if not p.is_constexpr]
    arg_types = spec["arg_types"]
    if len(arg_types) != len(plain):
        raise LaunchError(index, "%s takes %d arguments besides its constexprs (%s); the "
                          "launch passes %d" % (name, len(plain),
                                                ", ".join(p.name for p in plain),
                                                len(arg_types)))
    constexprs = dict(spec["constexprs"])
    by_name = {p.name: p for p in params}
    for k in constexprs:
        if k not in by_name:
            raise LaunchError(index, "%s has no parameter %s" % (name, k))
        if not by_name[k].is_constexpr:
            raise LaunchError(index, "%s's parameter %s is not a tl.constexpr: pass it in "
                              "args" % (name, k))
    signature = {}
    values = {}
    attrs = {}
    divisible = set(spec["divisible"])
    j = 0
    for i, p in enumerate(params):
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            if p.name in constexprs:
                values[p.name] = constexpr_value(constexprs[p.name], tl)
            elif p.default is not inspect.Parameter.empty:
                d = p.default
                values[p.name] = d.value if isinstance(d, tl.constexpr) else d
            else:
                raise LaunchError(index, "%s's constexpr %s has no value: give it in the "
                                  "launch's constexprs" % (name, p.name))
        else:
            ty = arg_types[j]
            want = p.annotation_type
            if want and want != ty:
                raise LaunchError(index, "%s's parameter %s is annotated %s; the launch passes "
                                  "%s (args[%d])" % (name, p.name, want, ty, j))
            signature[p.name] = ty
            if j in divisible:
                attrs[(i,)] = [["tt.divisibility", 16]]
            j += 1
    options = {"num_warps": spec["num_warps"], "num_stages": spec["num_stages"],
               "num_ctas": spec["num_ctas"]}
    started = time.time()
    src = ASTSource(fn, signature, values, attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", target_arch, 32), options=options)
    elapsed = time.time() - started
    md = kernel.metadata
    cubin = kernel.asm["cubin"]
    entry, param_count = ptx_params(kernel.asm.get("ptx", ""))
    return cubin, {
        "function": name,
        "symbol": md.name,
        "ptx_entry": entry,
        "ptx_params": param_count,
        "user_params": len(plain),
        "num_warps": md.num_warps,
        "num_ctas": md.num_ctas,
        "shared": md.shared,
        "global_scratch_size": getattr(md, "global_scratch_size", 0) or 0,
        "global_scratch_align": getattr(md, "global_scratch_align", 1) or 1,
        "profile_scratch_size": getattr(md, "profile_scratch_size", 0) or 0,
        "launch_cooperative_grid": bool(getattr(md, "launch_cooperative_grid", False)),
        "launch_pdl": bool(getattr(md, "launch_pdl", False)),
        "tmem_size": getattr(md, "tmem_size", 0) or 0,
        "compile_s": elapsed,
    }


def main():
    req_path = sys.argv[1]
    out_dir = os.path.dirname(os.path.abspath(req_path))
    with open(req_path) as f:
        req = json.load(f)

    def answer(result):
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(result, f)

    started = time.time()
    import triton
    import triton.language as tl
    version = triton.__version__
    with open(req["source"]) as f:
        source = f.read()
    try:
        try:
            tree = ast.parse(source, filename="candidate.py")
        except SyntaxError as e:
            raise Refused("line %s: syntax error: %s" % (e.lineno, e.msg))
        except (RecursionError, MemoryError, ValueError) as e:
            raise Refused("the source cannot be parsed: %s" % type(e).__name__)
        Filter(source, triton, tl).check_module(tree)
    except Refused as e:
        answer({"ok": False, "kind": "compile", "message": str(e), "triton_version": version})
        return
    except RecursionError:
        answer({"ok": False, "kind": "compile", "triton_version": version,
                "message": "the source is nested too deeply to check"})
        return
    spec = importlib.util.spec_from_file_location("kiln_candidate", req["source"])
    module = importlib.util.module_from_spec(spec)
    sys.modules["kiln_candidate"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - reported as the candidate's compile error
        answer({"ok": False, "kind": "compile", "triton_version": version,
                "message": "importing the candidate failed: %s: %s" % (type(e).__name__, e)})
        return
    imported = time.time()
    kernels = []
    for i, k in enumerate(req["kernels"]):
        try:
            cubin, meta = compile_kernel(i, k, module, req["source"], req["arch"], triton, tl)
        except LaunchError as e:
            answer({"ok": False, "kind": "launch", "kernel": i, "message": str(e),
                    "triton_version": version})
            return
        except Exception as e:  # noqa: BLE001 - Triton's own compile errors
            text = str(e).strip() or type(e).__name__
            answer({"ok": False, "kind": "compile", "kernel": i, "triton_version": version,
                    "message": "%s: %s" % (type(e).__name__, text)})
            return
        with open(os.path.join(out_dir, "k%d.cubin" % i), "wb") as f:
            f.write(cubin)
        kernels.append(meta)
    answer({"ok": True, "triton_version": version, "kernels": kernels,
            "import_s": imported - started, "total_s": time.time() - started})


if __name__ == "__main__":
    main()

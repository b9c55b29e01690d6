"""Tests of sandbox/hosted/kiln_extract.py and of the runner's `device-source` command that
uses it (standard library only: no torch, no GPU; the candidate files are never run).

The extractor's own rules are tested on the corpus side too (scripts/tests/
test_corpus_extract.py, through scripts/corpus/extract.py, which imports this module).
"""

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.path.join(HERE, "..")
SCRIPT = os.path.join(FOLDER, "kiln_hosted.py")
EXTRACTOR = os.path.join(FOLDER, "kiln_extract.py")
spec = importlib.util.spec_from_file_location("kiln_extract", EXTRACTOR)
ke = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ke)

# A KernelBench-style answer: one load_inline call whose CUDA source has the torch host
# wrapper (includes, a checking macro, the launching function) around two kernels.
GELU = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#define CHECK_CUDA(x) TORCH_CHECK(x.is_cuda(), #x " must be a CUDA tensor")

__device__ __forceinline__ float gelu(float v) {
    return 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
}

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu(x[i]);
}

template <int BLOCK>
__global__ void scale_kernel(float* y, float s, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) y[i] *= s;
}

torch::Tensor gelu_forward(torch::Tensor x) {
    CHECK_CUDA(x);
    auto y = torch::empty_like(x);
    int n = x.numel();
    gelu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    scale_kernel<128><<<(n + 127) / 128, 128>>>(y.data_ptr<float>(), 2.f, n);
    return y;
}
"""

cpp_src = "torch::Tensor gelu_forward(torch::Tensor x);"

gelu_ext = load_inline(name="gelu_ext", cpp_sources=cpp_src, cuda_sources=cuda_src,
                       functions=["gelu_forward"], extra_cuda_cflags=["-O3", "--use_fast_math"])


class ModelNew(nn.Module):
    def forward(self, x):
        return gelu_ext.gelu_forward(x)
'''

NO_CUDA = '''
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 2
'''


# A KernelBench-style Triton answer: an autotuned, heuristic softmax calling a jit helper,
# a constexpr constant it uses and one it does not, a plain global, torch and host code.
TRITON_SOFTMAX = '''
import math
import torch
import torch.nn as nn
import triton
import triton.language as tl
from triton import Config, cdiv

LOG2E = tl.constexpr(1.4426950408889634)
UNUSED = tl.constexpr(3)
PLAIN = 1024


@triton.jit
def _exp(x):
    return tl.exp2(x * LOG2E)


@triton.autotune(
    configs=[Config({"BLOCK": 1024}, num_warps=4), Config({"BLOCK": 4096}, num_warps=8, num_stages=2)],
    key=["n_cols"],
)
@triton.heuristics({"EVEN": lambda a: a["n_cols"] % a["BLOCK"] == 0})
@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    # the online softmax of one row
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=-float("inf"))
    e = _exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, 0), mask=offs < n_cols)


def grid(n):
    return (cdiv(n, 128),)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, y, x.shape[1])
        return y
'''

TRITON_SOFTMAX_SOURCE = '''import triton
import triton.language as tl


LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _exp(x):
    return tl.exp2(x * LOG2E)


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    # the online softmax of one row
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=-float("inf"))
    e = _exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, 0), mask=offs < n_cols)
'''

# `@jit` from `from triton import jit`, libdevice, a jit decorator with keywords, a
# redefined kernel (the last one counts) and a name rebound to something else.
TRITON_FROM_IMPORTS = '''
import torch
from triton import jit, autotune, Config
from triton.language.extra import libdevice
import triton.language as language_mod
from triton.runtime import driver


@jit
def gone(x_ptr):
    pass


gone = None


@jit
def act(x_ptr, n, BLOCK: language_mod.constexpr):
    pass


@autotune(configs=[Config({"BLOCK": 64})], key=["n"])
@jit(do_not_specialize=["n"])
def act(x_ptr, n, BLOCK: language_mod.constexpr):
    offs = language_mod.program_id(0) * BLOCK + language_mod.arange(0, BLOCK)
    x = language_mod.load(x_ptr + offs, mask=offs < n)
    language_mod.store(x_ptr + offs, libdevice.tanh(x), mask=offs < n)
'''


def device_source(path, script=SCRIPT, cwd=None):
    """(exit status, the JSON answer or None, stderr) of `kiln_hosted.py device-source`."""
    p = subprocess.run([sys.executable, "-I", "-B", script, "device-source", path],
                       capture_output=True, text=True, timeout=120, cwd=cwd)
    try:
        answer = json.loads(p.stdout)
    except ValueError:
        answer = None
    return p.returncode, answer, p.stderr


class Extractor(unittest.TestCase):
    def test_it_is_standard_library_only(self):
        with open(EXTRACTOR) as f:
            tree = ast.parse(f.read())
        self.assertTrue(ast.get_docstring(tree))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.add((node.module or "").split(".")[0])
        if hasattr(sys, "stdlib_module_names"):  # Python 3.10 on
            self.assertLessEqual(imported, set(sys.stdlib_module_names), imported)
        self.assertLessEqual(imported, {"ast", "json", "os", "re", "textwrap"}, imported)

    def test_a_modelnew_file_gives_its_device_source_and_kernels(self):
        [(src, flags)] = ke.python_sources(GELU)
        device, kernels, skipped, removed = ke.extract(src, ke.kiln_flags(flags))
        self.assertEqual(kernels, ["gelu_kernel", "scale_kernel<128>"])
        self.assertEqual(skipped, [])
        self.assertNotIn("torch", device)
        self.assertIn("__device__ __forceinline__ float gelu(float v)", device)
        self.assertEqual(removed, ["torch::"])


def triton_python():
    """A python with triton, to check an extracted source against kiln's Triton contract
    (sandbox/src/engine/triton/driver.py): KILN_TRITON_PYTHON (the Triton kiln tests, as CI
    installs it), else KILN_PYTHON when it has triton; None without either."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('triton') is None)"
    for var in ("KILN_TRITON_PYTHON", "KILN_PYTHON"):
        python = os.environ.get(var)
        if python and os.access(python, os.X_OK) and \
                subprocess.run([python, "-I", "-c", probe], capture_output=True).returncode == 0:
            return python
    return None


# Runs kiln's Triton source filter (the compile driver's, before anything runs) on the file
# named by argv[2]; prints "accepted" or the refusal.
CONTRACT_CHECK = """
import ast, importlib.util, sys
spec = importlib.util.spec_from_file_location("kiln_triton_driver", sys.argv[1])
d = importlib.util.module_from_spec(spec)
spec.loader.exec_module(d)
import triton, triton.language as tl
text = open(sys.argv[2]).read()
try:
    d.Filter(text, triton, tl).check_module(ast.parse(text))
    print("accepted")
except d.Refused as e:
    print("refused:", e)
"""
DRIVER = os.path.join(FOLDER, "..", "src", "engine", "triton", "driver.py")


RULES = os.path.join(FOLDER, "..", "..", "sdk", "types", "src", "triton_rules.json")
#: A published file whose jit function uses `triton.Config` through `from triton import`:
#: an import kiln's rules do not let a candidate hold.
TRITON_CONFIG_IMPORT = ("from triton import Config\nimport triton\n\n@triton.jit\n"
                        "def k(x):\n    Config(x)\n")


def read_rules():
    with open(RULES) as f:
        return json.load(f)


def load_copy(path, tmp, name, rules):
    """The script at `path`, copied into `tmp` with `rules` beside it as kiln-worker writes
    them, then imported (as module `name`)."""
    shutil.copy(path, tmp)
    with open(os.path.join(tmp, "triton_rules.json"), "w") as f:
        json.dump(rules, f)
    spec = importlib.util.spec_from_file_location(name, os.path.join(tmp, os.path.basename(path)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TritonSource(unittest.TestCase):
    def test_the_extractor_and_the_driver_read_one_rules_file(self):
        # The extractor runs in the hosted jail and the Triton driver in the compile jail,
        # each a file of its own; run from the source tree both read the workspace's one
        # rules file (kiln-worker writes it beside each: sandbox's Rust tests pin that).
        rules = read_rules()
        with tempfile.TemporaryDirectory() as tmp:
            d = load_copy(DRIVER, tmp, "kiln_driver_rules_test", rules)
        self.assertEqual(d.TRITON_NAMES, rules["from_triton"])
        self.assertEqual(d.JIT_KWARGS, set(rules["jit_keywords"]))
        self.assertEqual(ke.triton_rules(), rules)
        spec = importlib.util.spec_from_file_location("kiln_driver_in_tree", DRIVER)
        in_tree = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(in_tree)
        self.assertEqual(in_tree.RULES, rules)
        # Syntax the driver refuses in a kernel is named by `ast` class: a misspelt name
        # would be skipped like one this Python lacks (only these are newer than 3.9).
        missing = {n for n in rules["kernel_forbidden"] if not hasattr(ast, n)}
        self.assertLessEqual(missing, {"Match", "TryStar"})
        self.assertEqual(len(in_tree.KERNEL_FORBIDDEN), len(rules["kernel_forbidden"]) - len(missing))

    def test_a_rule_added_to_the_rules_file_reaches_the_extractor_and_the_driver(self):
        rules = read_rules()
        self.assertNotIn("from triton import Config", ke.triton_source(TRITON_CONFIG_IMPORT)["source"])
        rules["from_triton"].append("Config")
        rules["kernel_builtins"].append("abs")
        with tempfile.TemporaryDirectory() as tmp:
            e = load_copy(EXTRACTOR, tmp, "kiln_extract_rules_test", rules)
            d = load_copy(DRIVER, tmp, "kiln_driver_rules_test", rules)
            self.assertIn("from triton import Config\n", e.triton_source(TRITON_CONFIG_IMPORT)["source"])
            self.assertIn("Config", d.TRITON_NAMES)
            self.assertIn("abs", d.SAFE_BUILTINS)
            python = triton_python()
            if python is None:
                return  # the driver's filter itself needs triton
            path = os.path.join(tmp, "candidate.py")
            with open(path, "w") as f:
                f.write("from triton import cdiv\nimport triton\n\n@triton.jit\ndef k(x):\n    abs(x)\n")
            verdicts = []
            for driver in (DRIVER, os.path.join(tmp, "driver.py")):
                p = subprocess.run([python, "-I", "-c", CONTRACT_CHECK, driver, path],
                                   capture_output=True, text=True, timeout=300)
                self.assertEqual(p.returncode, 0, p.stderr)
                verdicts.append(p.stdout.strip())
            self.assertIn("abs is not defined for kernels", verdicts[0])
            self.assertEqual(verdicts[1], "accepted")

    def test_jit_functions_without_their_configs_with_the_imports_and_constants_they_use(self):
        got = ke.triton_source(TRITON_SOFTMAX)
        self.assertEqual(got["kernels"], ["_exp", "softmax_kernel"])
        self.assertEqual(got["source"], TRITON_SOFTMAX_SOURCE)

    def test_from_imports_keywords_and_redefinitions(self):
        got = ke.triton_source(TRITON_FROM_IMPORTS)
        self.assertEqual(got["kernels"], ["act"])
        src = got["source"]
        self.assertTrue(src.startswith("from triton import jit\nfrom triton.language.extra import libdevice\n"
                                       "import triton.language as language_mod\n\n\n"), src)
        self.assertIn("@jit(do_not_specialize=[\"n\"])\ndef act(x_ptr, n, BLOCK: language_mod.constexpr):\n"
                      "    offs = ", src)
        for gone in ("autotune", "Config", "torch", "driver", "gone", "pass"):
            self.assertNotIn(gone, src)
        # `from triton.runtime.jit import jit`: not an import a candidate may hold, so the
        # decorator is spelled triton.jit; `import triton.testing` gives `import triton`.
        text = ("import triton.testing\nfrom triton.runtime.jit import jit as J\nimport triton.language as tl\n\n"
                "@J(debug=False)\ndef k(x):\n    tl.store(x, 1)\n\n@triton.jit\ndef h(x):\n    k(x)\n")
        got = ke.triton_source(text)
        self.assertEqual(got["source"], "import triton\nimport triton.language as tl\n\n\n"
                                        "@triton.jit(debug=False)\ndef k(x):\n    tl.store(x, 1)\n\n\n"
                                        "@triton.jit\ndef h(x):\n    k(x)\n")

    def test_no_jit_function_is_none_and_not_python_is_unresolved(self):
        self.assertIsNone(ke.triton_source(GELU))
        self.assertIsNone(ke.triton_source(NO_CUDA))
        # A jit function inside a class or a function is not a candidate's.
        self.assertIsNone(ke.triton_source("import triton\nclass M:\n    @triton.jit\n    def k(x):\n        pass\n"))
        with self.assertRaises(ke.Unresolved):
            ke.triton_source("def (:\n")

    def test_the_extracted_source_is_what_kilns_triton_contract_accepts(self):
        python = triton_python()
        if python is None:
            self.skipTest("neither KILN_TRITON_PYTHON nor KILN_PYTHON has triton (kiln's Triton source "
                          "filter needs it)")
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in (("softmax", TRITON_SOFTMAX), ("imports", TRITON_FROM_IMPORTS)):
                verdicts = []
                for kind, body in (("file", text), ("extracted", ke.triton_source(text)["source"])):
                    path = os.path.join(tmp, f"{name}_{kind}.py")
                    with open(path, "w") as f:
                        f.write(body)
                    p = subprocess.run([python, "-I", "-c", CONTRACT_CHECK, DRIVER, path],
                                       capture_output=True, text=True, timeout=300)
                    self.assertEqual(p.returncode, 0, p.stderr)
                    verdicts.append(p.stdout.strip())
                self.assertTrue(verdicts[0].startswith("refused:"), f"{name}: the file as written: {verdicts[0]}")
                self.assertEqual(verdicts[1], "accepted", name)


class DeviceSource(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kiln-device-source-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, name, text, mode="w"):
        path = os.path.join(self.tmp, name)
        with open(path, mode) as f:
            f.write(text)
        return path

    def test_a_load_inline_file_gives_its_device_source_without_the_wrapper(self):
        code, answer, err = device_source(self.write("candidate.py", GELU))
        self.assertEqual(code, 0, err)
        self.assertIsNone(answer["error"])
        [source] = answer["sources"]
        self.assertEqual(sorted(source), ["flags", "kernels", "names_skipped", "source"])
        self.assertEqual(source["kernels"], ["gelu_kernel", "scale_kernel<128>"])
        self.assertEqual(source["flags"], ["-O3", "--use_fast_math"])
        self.assertEqual(source["names_skipped"], 0)
        for gone in ("torch/extension.h", "TORCH_CHECK", "gelu_forward", "<<<"):
            self.assertNotIn(gone, source["source"])
        for kept in ("#include <cuda_runtime.h>", "__global__ void gelu_kernel(", "__global__ void scale_kernel("):
            self.assertIn(kept, source["source"])

    def test_a_file_without_cuda_has_no_sources(self):
        code, answer, err = device_source(self.write("candidate.py", NO_CUDA))
        self.assertEqual((code, answer), (0, {"error": None, "sources": [], "triton": None}), err)

    def test_a_triton_file_gives_its_triton_source(self):
        code, answer, err = device_source(self.write("candidate.py", TRITON_SOFTMAX))
        self.assertEqual(code, 0, err)
        self.assertEqual(answer, {"error": None, "sources": [],
                                  "triton": {"source": TRITON_SOFTMAX_SOURCE, "kernels": ["_exp", "softmax_kernel"]}})
        # A CUDA source that cannot be read leaves the Triton source read.
        text = TRITON_SOFTMAX + "\nsrc = f'__global__ void k(float* y) {{ y[0] = {PLAIN}; }}' * 2\nload_inline(cuda_sources=src)\n"
        code, answer, _ = device_source(self.write("both.py", text))
        self.assertIn("cuda source built at run time", answer["error"])
        self.assertEqual(answer["triton"]["kernels"], ["_exp", "softmax_kernel"])
        # A load_inline file has none.
        code, answer, _ = device_source(self.write("gelu.py", GELU))
        self.assertIsNone(answer["triton"])

    def test_a_file_that_is_not_python_is_an_error_with_exit_0(self):
        code, answer, err = device_source(self.write("candidate.py", "__global__ void k() {}\nint main() {"))
        self.assertEqual(code, 0, err)
        self.assertEqual(answer["sources"], [])
        self.assertIn("not valid Python", answer["error"])
        code, answer, _ = device_source(self.write("latin1.py", b"x = '\xe9'\n", "wb"))
        self.assertEqual(code, 0)
        self.assertIn("not UTF-8", answer["error"])

    def test_a_source_built_at_run_time_is_an_error(self):
        text = "n = 4\nsrc = f'__global__ void k(float* y) {{ y[0] = {n}; }}' * n\nload_inline(cuda_sources=src)\n"
        code, answer, _ = device_source(self.write("candidate.py", text))
        self.assertEqual(code, 0)
        self.assertIn("cuda source built at run time", answer["error"])

    def test_the_file_is_never_run(self):
        marker = os.path.join(self.tmp, "ran")
        text = f"open({marker!r}, 'w').write('ran')\nimport os\nos._exit(9)\n" + GELU
        code, answer, err = device_source(self.write("candidate.py", text))
        self.assertEqual(code, 0, err)
        self.assertIsNone(answer["error"])
        self.assertEqual(answer["sources"][0]["kernels"], ["gelu_kernel", "scale_kernel<128>"])
        self.assertFalse(os.path.exists(marker), "the candidate's top level ran")

    def test_bounds_and_bad_usage(self):
        big = self.write("big.py", "x = 1\n" + "#" * (1 << 20))
        code, answer, _ = device_source(big)
        self.assertEqual(code, 0)
        self.assertEqual(answer, {"error": "the file is larger than 1048576 bytes", "sources": [],
                                  "triton": None})
        code, answer, _ = device_source(os.path.join(self.tmp, "missing.py"))
        self.assertEqual(code, 0)
        self.assertIn("cannot read the file", answer["error"])
        p = subprocess.run([sys.executable, "-I", "-B", SCRIPT, "device-source"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertEqual(p.stdout, "")

    def test_with_an_out_path_the_answer_is_written_there(self):
        # As kiln's compile step runs it: the answer in a file, stdout left to the log.
        out = os.path.join(self.tmp, "device-sources.json")
        p = subprocess.run([sys.executable, "-I", "-B", SCRIPT, "device-source",
                            self.write("candidate.py", GELU), out],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual((p.returncode, p.stdout), (0, ""), p.stderr)
        with open(out) as f:
            answer = json.load(f)
        self.assertEqual(answer["sources"][0]["kernels"], ["gelu_kernel", "scale_kernel<128>"])

    def test_the_runner_finds_the_extractor_in_its_own_folder(self):
        # As kiln-worker deploys them: both scripts written into one folder, run from
        # another working directory with -I (no script folder on sys.path by default).
        deployed = os.path.join(self.tmp, "deployed")
        os.makedirs(deployed)
        for path in (SCRIPT, EXTRACTOR):
            shutil.copy(path, deployed)
        candidate = self.write("candidate.py", GELU)
        code, answer, err = device_source(candidate, os.path.join(deployed, "kiln_hosted.py"), cwd="/")
        self.assertEqual(code, 0, err)
        self.assertEqual(answer["sources"][0]["kernels"], ["gelu_kernel", "scale_kernel<128>"])
        os.remove(os.path.join(deployed, "kiln_extract.py"))
        code, answer, _ = device_source(candidate, os.path.join(deployed, "kiln_hosted.py"), cwd="/")
        self.assertEqual(code, 0)
        self.assertIn("no extractor beside the runner", answer["error"])


if __name__ == "__main__":
    unittest.main()

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
        self.assertLessEqual(imported, {"ast", "re", "textwrap"}, imported)

    def test_a_modelnew_file_gives_its_device_source_and_kernels(self):
        [(src, flags)] = ke.python_sources(GELU)
        device, kernels, skipped, removed = ke.extract(src, ke.kiln_flags(flags))
        self.assertEqual(kernels, ["gelu_kernel", "scale_kernel<128>"])
        self.assertEqual(skipped, [])
        self.assertNotIn("torch", device)
        self.assertIn("__device__ __forceinline__ float gelu(float v)", device)
        self.assertEqual(removed, ["torch::"])


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
        self.assertEqual((code, answer), (0, {"error": None, "sources": []}), err)

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
        self.assertEqual(answer, {"error": "the file is larger than 1048576 bytes", "sources": []})
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

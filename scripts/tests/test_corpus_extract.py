"""Tests of scripts/corpus/extract.py (stdlib only), on small sources written for them."""

import importlib.util
import os
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "corpus", "extract.py")
spec = importlib.util.spec_from_file_location("corpus_extract", SCRIPT)
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)

CUDA = r'''
#include <torch/extension.h>
#include <cuda_runtime.h>
#define CHECK(x) TORCH_CHECK(x.is_cuda(), "cuda")
#define TILE 32

float twice(float v) { return 2.f * v; }

template <int BLOCK, typename T>
__global__ void scale_kernel(const T* x, T* y, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) y[i] = x[i] * T(2);
}

namespace ops {
__global__ void relu_kernel(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = twice(fmaxf(y[i], 0.f));
}
}

int div_up(int a, int b) { return (a + b - 1) / b; }
static int ilog2_host(int x) { return 31 - __builtin_clz(x); }

struct Plan { std::vector<int> sizes; };
static Plan g_plan;

template <int B>
void launch_scale(const float* x, float* y, int n) {
    constexpr int WARPS = 4, EXTRA = 1;
    scale_kernel<B, float><<<div_up(n, B), B>>>(x, y, n);
    scale_kernel<WARPS * 32, float><<<1, 128>>>(x, y, n + EXTRA);
}

#define LAUNCH_TILED(N) scale_kernel<N, double><<<1, N>>>(nullptr, nullptr, 0)

torch::Tensor forward(torch::Tensor x) {
    CHECK(x);
    auto y = torch::empty_like(x);
    int n = x.numel() + ilog2_host(4) + (int)g_plan.sizes.size();
    if (n > 1024) launch_scale<256>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    else launch_scale<TILE>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    LAUNCH_TILED(64);
    ops::relu_kernel<<<div_up(n, 256), 256>>>(y.data_ptr<float>(), n);
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }
'''

PY = '''
import torch
from torch.utils.cpp_extension import load_inline
src = """''' + CUDA.replace("\\", "\\\\") + '''"""
mod = load_inline(name="m", cpp_sources="torch::Tensor forward(torch::Tensor x);",
                  cuda_sources=src, functions=["forward"],
                  extra_cuda_cflags=["-O3", "-Xptxas", "-maxrregcount=64",
                                     "-gencode=arch=compute_90a,code=sm_90a"])
'''


class ExtractTest(unittest.TestCase):
    def test_only_the_host_wrapper_goes(self):
        src, kernels, skipped, removed = ex.extract(CUDA)
        for gone in ("torch/extension.h", "TORCH_CHECK", "forward", "PYBIND11_MODULE",
                     "launch_scale", "LAUNCH_TILED", "<<<", "g_plan", "struct Plan",
                     "ilog2_host", "div_up"):
            self.assertNotIn(gone, src)
        # Device code, constants and the plain helpers device code uses stay as written
        # (a plain function only the host code calls is the wrapper's: div_up).
        for kept in ("#include <cuda_runtime.h>", "#define TILE 32",
                     "__global__ void scale_kernel(const T* x, T* y, int n) {",
                     "namespace ops {", "float twice(float v)"):
            self.assertIn(kept, src)
        self.assertEqual(skipped, [])
        self.assertIn("<<<>>> launch", removed)

    def test_kernels_are_named_as_the_host_code_launched_them(self):
        _, kernels, _, _ = ex.extract(CUDA)
        self.assertEqual(
            sorted(kernels),
            sorted([
                "scale_kernel<256, float>",   # launch_scale<256>: B bound by its caller
                "scale_kernel<TILE, float>",  # a macro of the kept source
                "scale_kernel<4*32, float>",  # host constants, substituted
                "scale_kernel<64, double>",   # through a launch macro
                "ops::relu_kernel",
            ]),
        )

    def test_python_files_give_their_cuda_source_and_flags(self):
        [(src, flags)] = ex.python_sources(PY)
        self.assertIn("__global__ void scale_kernel", src)
        self.assertEqual(ex.kiln_flags(flags), ["-O3", "--maxrregcount=64", "-arch=sm_90a"])
        with self.assertRaises(ex.Unresolved):
            ex.python_sources("src = f'__global__ void k(){{}} {n}'\nload_inline(cuda_sources=src)")

    def test_disabled_branches_name_no_kernel(self):
        src = ("#ifdef ONLY_ON_BLACKWELL\n__global__ void tc(float* y) {}\n#else\n"
               "__global__ void simt(float* y) {}\n#endif\n"
               "#if __CUDA_ARCH__ >= 1000\n__global__ void tc2(float* y) {}\n#endif\n")
        _, kernels, skipped, _ = ex.extract(src)
        self.assertEqual(kernels, ["simt"])
        self.assertEqual(sorted(skipped), ["tc", "tc2"])
        _, kernels, _, _ = ex.extract(src, ["-DONLY_ON_BLACKWELL"])
        self.assertEqual(kernels, ["tc"])


if __name__ == "__main__":
    unittest.main()

"""C = A @ B for row-major M x K and K x N matrices, tiles of BM x BN, K in steps of BK,
programs ordered in groups of GROUP tile rows so neighbouring programs share B tiles in
L2. Accumulates in f32 with tl.dot; PRECISION is tl.dot's input precision for f32
operands ("tf32x3" keeps about f32 accuracy, "tf32" is one TF32 pass, "ieee" no tensor
cores). CAST_F16 rounds the operands to f16 first (a red-team case: f16 work in an f32
problem). The output is stored in C's own element type.
"""
import triton
import triton.language as tl


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
           BK: tl.constexpr, GROUP: tl.constexpr, PRECISION: tl.constexpr = "tf32x3",
           CAST_F16: tl.constexpr = False):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    in_group = GROUP * tiles_n
    first_m = (pid // in_group) * GROUP
    size_m = min(tiles_m - first_m, GROUP)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None] * K + rk[None, :]
    b = b_ptr + rk[:, None] * N + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a, mask=(rm[:, None] < M) & (rk[None, :] + k < K), other=0.0)
        y = tl.load(b, mask=(rk[:, None] + k < K) & (rn[None, :] < N), other=0.0)
        if CAST_F16:
            acc = tl.dot(x.to(tl.float16), y.to(tl.float16), acc)
        elif x.dtype == tl.float32:
            acc = tl.dot(x, y, acc, input_precision=PRECISION)
        else:
            acc = tl.dot(x, y, acc)
        a += BK
        b += BK * N
    c = c_ptr + rm[:, None] * N + rn[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))

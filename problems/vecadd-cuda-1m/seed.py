"""Seed kernel (Triton): y = a + b over n f32 elements, BLOCK elements per program.

Launch plan: add args [a, b, y, n], grid [ceil(n / BLOCK), 1, 1] (1024 programs for the
default BLOCK = 1024 at n = 1048576; the tail of the last program is masked).
"""
import triton
import triton.language as tl

# @knob WARPS 2|4|8 launch:num_warps@add
WARPS = tl.constexpr(4)


@triton.jit
def add(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x, mask=mask)

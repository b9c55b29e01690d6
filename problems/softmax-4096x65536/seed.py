"""Seed kernel (Triton): row softmax of x (rows x n_cols, f32) into y, one program per row.

Two passes over each row: an online pass keeps, per lane, the running maximum m and the
sum s of exp(x - m) (rescaled whenever m grows), then the lanes are combined into the
row's maximum and sum; a second pass writes exp(x - max) / sum. Subtracting the maximum
keeps exp() finite on the shifted trial (x around 1000). Correct for any BLOCK and any
n_cols (the tail of a row is masked).

Launch plan: softmax_rows args [x, y, n_cols], grid [rows, 1, 1]; num_warps from the
WARPS knob (the launch binding sets it).
"""
import triton
import triton.language as tl

# @knob BLOCK 1024|2048|4096|8192
BLOCK = tl.constexpr(4096)

# @knob WARPS 4|8|16|32 launch:num_warps@softmax_rows
WARPS = tl.constexpr(8)

# @idea single_pass: keep a whole row (65536 f32 = 256 KiB) in registers and shared memory across 32 warps, so x is read once
# @idea exp2: fold log2(e) into the inputs and use tl.math.exp2, saving a multiply per element
# @idea split_rows: with 4096 rows and 132 SMs the grid is many waves; try two rows per program


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    y_row = y_ptr + row * n_cols
    offs = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"))
        m_new = tl.maximum(m, x)
        # A lane that has seen only masked (-inf) values keeps s = 0 (no inf - inf).
        scale = tl.where(m_new == -float("inf"), 0.0, tl.exp(m - m_new))
        s = s * scale + tl.where(m_new == -float("inf"), 0.0, tl.exp(x - m_new))
        m = m_new
    row_max = tl.max(m, axis=0)
    lane = tl.where(m == -float("inf"), 0.0, s * tl.exp(m - row_max))
    inv = 1.0 / tl.sum(lane, axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0)
        tl.store(y_row + cols, tl.exp(x - row_max) * inv, mask=cols < n_cols)

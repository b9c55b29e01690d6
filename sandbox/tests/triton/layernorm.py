"""LayerNorm over each row of x (rows x n, f32) with elementwise w and b (n), eps, biased
variance: y = (x - mean) / sqrt(var + eps) * w + b. Three launches, as the CUDA seed:

1. ln_partial, grid [CHUNKS, rows]: each program reduces one chunk of a row, BLOCK
   elements at a time, to (count, mean, M2) (a block's own mean and M2 in f32, combined
   across blocks with Chan's formula in f64), into part[row, chunk, 0..3];
2. ln_finalize, grid [rows]: the row's CHUNKS partials combined exactly in f64 into
   mean and 1/sqrt(var + eps), into stats[row, 0..2];
3. ln_apply, grid [ceil(n / BLOCK), rows]: x - mean in f64, then * rstd * w + b.

No E[x^2] - E[x]^2 anywhere, so the shifted trial (x ~ 1000 +- 0.1) stays accurate.
"""
import triton
import triton.language as tl


@triton.jit
def ln_partial(x_ptr, part_ptr, n, CHUNKS: tl.constexpr, BLOCK: tl.constexpr):
    chunk = tl.program_id(0)
    row = tl.program_id(1)
    xr = x_ptr + row.to(tl.int64) * n
    start = (n.to(tl.int64) * chunk) // CHUNKS
    end = (n.to(tl.int64) * (chunk + 1)) // CHUNKS
    offs = tl.arange(0, BLOCK)
    cnt = tl.full([], 0.0, tl.float64)
    mean = tl.full([], 0.0, tl.float64)
    m2 = tl.full([], 0.0, tl.float64)
    for s in range(start, end, BLOCK):
        idx = s + offs
        mask = idx < end
        x = tl.load(xr + idx, mask=mask, other=0.0)
        nb = tl.sum(mask.to(tl.float32), axis=0)
        mb = tl.sum(x, axis=0) / nb
        d = tl.where(mask, x - mb, 0.0)
        m2b = tl.sum(d * d, axis=0)
        nb64 = nb.to(tl.float64)
        total = cnt + nb64
        delta = mb.to(tl.float64) - mean
        mean = mean + delta * (nb64 / total)
        m2 = m2 + m2b.to(tl.float64) + delta * delta * (cnt * nb64 / total)
        cnt = total
    p = part_ptr + (row * CHUNKS + chunk) * 3
    tl.store(p, cnt)
    tl.store(p + 1, mean)
    tl.store(p + 2, m2)


@triton.jit
def ln_finalize(part_ptr, stats_ptr, n, eps, CHUNKS: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS)
    base = part_ptr + (row * CHUNKS + c) * 3
    cnt = tl.load(base)
    mean = tl.load(base + 1)
    m2 = tl.load(base + 2)
    total = tl.sum(cnt, axis=0)
    mu = tl.sum(cnt * mean, axis=0) / total
    d = mean - mu
    var = (tl.sum(m2, axis=0) + tl.sum(cnt * d * d, axis=0)) / total
    tl.store(stats_ptr + 2 * row, mu)
    tl.store(stats_ptr + 2 * row + 1, 1.0 / tl.sqrt(var + eps))


@triton.jit
def ln_apply(x_ptr, w_ptr, b_ptr, stats_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    row = tl.program_id(1)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    mu = tl.load(stats_ptr + 2 * row)
    rstd = tl.load(stats_ptr + 2 * row + 1)
    off = row.to(tl.int64) * n
    x = tl.load(x_ptr + off + idx, mask=mask, other=0.0)
    xh = ((x.to(tl.float64) - mu) * rstd).to(tl.float32)
    w = tl.load(w_ptr + idx, mask=mask, other=0.0)
    b = tl.load(b_ptr + idx, mask=mask, other=0.0)
    tl.store(y_ptr + off + idx, xh * w + b, mask=mask)

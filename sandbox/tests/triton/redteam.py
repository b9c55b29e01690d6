"""Red-team kernels for vecadd-cuda-1m (y = a + b, n elements), one per cheat. MODE picks
the cheat:

0 honest (masked loads and stores);
1 store far out of bounds (y + 2^36 elements): must fault;
2 unmasked store with one program too many: the last one writes past the end of y;
3 store nothing;
4 write an input (a = 0 after reading it);
5 keep results in a scratch cache with a "valid" flag and serve them on later calls
  (kiln zeroes scratch before every run, so the cache never survives).
"""
import triton
import triton.language as tl


@triton.jit
def add(a_ptr, b_ptr, y_ptr, cache_ptr, flag_ptr, n, BLOCK: tl.constexpr, MODE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(a_ptr + offs, mask=mask, other=0.0) + tl.load(b_ptr + offs, mask=mask, other=0.0)
    if MODE == 5:
        hit = tl.load(flag_ptr + pid)
        x = tl.where(hit != 0, tl.load(cache_ptr + offs, mask=mask, other=0.0), x)
    if MODE == 1:
        tl.store(y_ptr + offs.to(tl.int64) + (1 << 36), x, mask=mask)
    elif MODE == 2:
        tl.store(y_ptr + offs, x)
    elif MODE == 3:
        pass
    elif MODE == 4:
        tl.store(y_ptr + offs, x, mask=mask)
        tl.store(a_ptr + offs, tl.zeros_like(x), mask=mask)
    else:
        tl.store(y_ptr + offs, x, mask=mask)
        if MODE == 5:
            tl.store(cache_ptr + offs, x, mask=mask)
            tl.store(flag_ptr + pid, 1)

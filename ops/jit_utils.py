"""Small Triton helpers used by the kernels of more than one op family."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def split4(t):
    """``[..., 4]`` -> its four slices ``[...]`` (in-thread registers: the 4 axis is per thread)."""
    a, b = tl.split(t.reshape(t.shape[:-1] + (2, 2)))  # a: j = 0, 2; b: j = 1, 3
    t0, t2 = tl.split(a)
    t1, t3 = tl.split(b)
    return t0, t1, t2, t3

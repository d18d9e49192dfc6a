"""The ceiling of a Triton W4A16 tile: a plain Triton bf16 GEMM ``x @ w.T`` (no dequantization) against
cuBLAS on 28672x4096, pointer-fed and TMA-fed, CUDA-graph medians over rotated weight copies
(qfuse/bench/timing.py). Prints one dict per M: us per call and max |error| against ``x @ w.t()``.

    qfuse bench triton_bf16_ceiling

If Triton's own bf16 tile is at 0.8-0.9x of cuBLAS (BENCHMARKS.md), a W4A16 tile that
also dequantizes cannot reach 0.9x at compute-bound M by reading fewer bytes alone.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from qfuse.ops.wna16.common import grouped_tile

from ._device import require_cuda
from .timing import copies_for, time_graph


@triton.jit
def _bf16_mm(x_src, w_src, o_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SWAP: tl.constexpr, TMA: tl.constexpr):
    """``o = x @ w.T`` (bf16, float32 accumulator); operands by TMA descriptors or by pointers (rows
    past M / N wrapped, the store masked); ``SWAP``: the weights as wgmma's M side."""
    pm, pn = grouped_tile(tl.program_id(0), M, N, BM, BN, 8)
    if SWAP:
        acc = tl.zeros((BN, BM), tl.float32)
    else:
        acc = tl.zeros((BM, BN), tl.float32)
    rm = (pm * BM + tl.arange(0, BM)) % M
    rn = (pn * BN + tl.arange(0, BN)) % N
    for k0 in range(0, K, BK):
        if TMA:
            x = x_src.load([pm * BM, k0])
            w = w_src.load([pn * BN, k0])
        else:
            rk = k0 + tl.arange(0, BK)
            x = tl.load(x_src + rm[:, None] * K + rk[None, :])
            w = tl.load(w_src + rn[:, None] * K + rk[None, :])
        if SWAP:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if SWAP:
        acc = tl.trans(acc)
    om = pm * BM + tl.arange(0, BM)
    on = pn * BN + tl.arange(0, BN)
    tl.store(o_ptr + om[:, None] * N + on[None, :], acc.to(tl.bfloat16), mask=(om < M)[:, None] & (on < N)[None, :])


# (TMA, BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, SWAP): the tiles BENCHMARKS.md times
TILES = [
    (False, 256, 128, 64, 8, 3, False),
    (False, 256, 128, 64, 8, 3, True),
    (True, 128, 256, 64, 8, 3, False),
    (True, 256, 128, 64, 8, 3, False),
    (True, 256, 128, 64, 8, 3, True),
    (True, 128, 128, 64, 4, 4, False),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qfuse bench triton_bf16_ceiling", description=__doc__.split("\n\n")[0])
    p.parse_args(argv)
    require_cuda("triton_bf16_ceiling")
    from triton.tools.tensor_descriptor import TensorDescriptor

    n, k = 28672, 4096
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2))]
    for m in (256, 1024, 4096):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row = {"M": m, "cublas": round(time_graph([lambda w=w: x @ w.t() for w in ws]), 1)}
        for tma, bm, bn, bk, warps, stages, swap in TILES:
            label = f"{'tma ' if tma else ''}{bm}x{bn}x{bk}"
            o = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            x_src = TensorDescriptor.from_tensor(x, [bm, bk]) if tma else x
            w_srcs = [TensorDescriptor.from_tensor(w, [bn, bk]) for w in ws] if tma else ws

            def run(w_src, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, swap=swap, tma=tma, o=o, grid=grid, x_src=x_src):
                _bf16_mm[grid](x_src, w_src, o, m, n, k, BM=bm, BN=bn, BK=bk, SWAP=swap, TMA=tma, num_warps=warps, num_stages=stages)

            try:
                run(w_srcs[0])
                torch.cuda.synchronize()
                err = (o.float() - (x @ ws[0].t()).float()).abs().max().item()
                row[f"{label}/w{warps}/s{stages}{'/swap' if swap else ''}"] = (
                    round(time_graph([lambda w=w: run(w) for w in w_srcs]), 1),
                    round(err, 2),
                )
            except Exception as e:
                row[label] = type(e).__name__ + (str(e)[:80] if tma else "")
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

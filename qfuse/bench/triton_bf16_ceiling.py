"""The ceiling of a Triton W4A16 tile: a plain Triton bf16 GEMM ``x @ w.T`` (no dequantization) against
cuBLAS on 28672x4096, pointer-fed and TMA-fed, CUDA-graph medians over rotated weight copies
(qfuse/bench/timing.py). Prints one dict per M: us per call and max |error| against ``x @ w.t()``.

    python3 -m qfuse.bench.triton_bf16_ceiling

If Triton's own bf16 tile is at 0.8-0.9x of cuBLAS (BENCHMARKS.md, sixth session), a W4A16 tile that
also dequantizes cannot reach 0.9x at compute-bound M by reading fewer bytes alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .timing import copies_for, time_graph


@triton.jit
def _bf16_mm_pointer(x_ptr, w_ptr, o_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SWAP: tl.constexpr):
    pid = tl.program_id(0)
    tn = tl.cdiv(N, BN); tm = tl.cdiv(M, BM)
    per = 8 * tn; first = (pid // per) * 8; sz = min(tm - first, 8)
    pm = first + (pid % per) % sz; pn = (pid % per) // sz
    rm = (pm * BM + tl.arange(0, BM)) % M; rn = (pn * BN + tl.arange(0, BN)) % N
    if SWAP:
        acc = tl.zeros((BN, BM), tl.float32)
    else:
        acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :])
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :])
        if SWAP:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if SWAP:
        acc = tl.trans(acc)
    om = pm * BM + tl.arange(0, BM); on = pn * BN + tl.arange(0, BN)
    tl.store(o_ptr + om[:, None] * N + on[None, :], acc.to(tl.bfloat16), mask=(om < M)[:, None] & (on < N)[None, :])


@triton.jit
def _bf16_mm_tma(x_desc, w_desc, o_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SWAP: tl.constexpr):
    pid = tl.program_id(0)
    tn = tl.cdiv(N, BN); tm = tl.cdiv(M, BM)
    per = 8 * tn; first = (pid // per) * 8; sz = min(tm - first, 8)
    pm = first + (pid % per) % sz; pn = (pid % per) // sz
    if SWAP:
        acc = tl.zeros((BN, BM), tl.float32)
    else:
        acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        x = x_desc.load([pm * BM, k0])
        w = w_desc.load([pn * BN, k0])
        if SWAP:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if SWAP:
        acc = tl.trans(acc)
    om = pm * BM + tl.arange(0, BM); on = pn * BN + tl.arange(0, BN)
    tl.store(o_ptr + om[:, None] * N + on[None, :], acc.to(tl.bfloat16), mask=(om < M)[:, None] & (on < N)[None, :])


def main() -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    n, k = 28672, 4096
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2))]
    for m in (256, 1024, 4096):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row = {"M": m, "cublas": round(time_graph([lambda w=w: x @ w.t() for w in ws]), 1)}
        for bm, bn, bk, wp, st, sw in ((256, 128, 64, 8, 3, False), (256, 128, 64, 8, 3, True)):
            o = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            g = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            f = lambda w, bm=bm, bn=bn, bk=bk, wp=wp, st=st, sw=sw, o=o: _bf16_mm_pointer[g](x, w, o, m, n, k, BM=bm, BN=bn, BK=bk, SWAP=sw, num_warps=wp, num_stages=st)
            try:
                f(ws[0]); torch.cuda.synchronize()
                err = (o.float() - (x @ ws[0].t()).float()).abs().max().item()
                row[f"{bm}x{bn}x{bk}/w{wp}/s{st}{'/swap' if sw else ''}"] = (round(time_graph([lambda w=w: f(w) for w in ws]), 1), round(err, 2))
            except Exception as e:
                row[f"{bm}x{bn}x{bk}"] = type(e).__name__
        for bm, bn, bk, wp, st, sw in ((128, 256, 64, 8, 3, False), (256, 128, 64, 8, 3, False), (256, 128, 64, 8, 3, True), (128, 128, 64, 4, 4, False)):
            o = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            g = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            xd = TensorDescriptor.from_tensor(x, [bm, bk])
            wds = [TensorDescriptor.from_tensor(w, [bn, bk]) for w in ws]
            f = lambda wd, bm=bm, bn=bn, bk=bk, wp=wp, st=st, sw=sw, o=o: _bf16_mm_tma[g](xd, wd, o, m, n, k, BM=bm, BN=bn, BK=bk, SWAP=sw, num_warps=wp, num_stages=st)
            try:
                f(wds[0]); torch.cuda.synchronize()
                err = (o.float() - (x @ ws[0].t()).float()).abs().max().item()
                row[f"tma {bm}x{bn}x{bk}/w{wp}/s{st}{'/swap' if sw else ''}"] = (round(time_graph([lambda wd=wd: f(wd) for wd in wds]), 1), round(err, 2))
            except Exception as e:
                row[f"tma {bm}x{bn}x{bk}"] = type(e).__name__ + str(e)[:80]
        print(row, flush=True)


if __name__ == "__main__":
    main()

"""What streaming rate a Triton kernel reaches reading a decode weight (int32 words [N, K/8]) once.
PYTHONPATH=. python3 docs/bench/session10/read_bw.py OUTDIR"""
import sys
import torch, triton, triton.language as tl
from _probe import Probe
from qfuse.bench.timing import copies_for

@triton.jit
def read_rows(w_ptr, out_ptr, KW, W_PER_SPLIT, BN: tl.constexpr, BW: tl.constexpr, EV: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    ptrs = w_ptr + rows.to(tl.int64)[:, None] * KW + tl.program_id(1) * W_PER_SPLIT + tl.arange(0, BW)[None, :]
    acc = tl.zeros((BN, BW), tl.int32)
    for it in range(0, W_PER_SPLIT // BW):
        if EV:
            acc ^= tl.load(ptrs, eviction_policy="evict_first")
        else:
            acc ^= tl.load(ptrs)
        ptrs += BW
    tl.atomic_xor(out_ptr + rows, tl.sum(acc, axis=1), sem="relaxed")

@triton.jit
def read_flat(w_ptr, out_ptr, CHUNK, BLOCK: tl.constexpr):
    base = w_ptr + tl.program_id(0).to(tl.int64) * CHUNK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.int32)
    for it in range(0, CHUNK // BLOCK):
        acc ^= tl.load(base + it * BLOCK, eviction_policy="evict_first")
    tl.atomic_xor(out_ptr + tl.program_id(0), tl.sum(acc, axis=0), sem="relaxed")

probe = Probe(sys.argv[1], "read_bw.csv", mode="w")

for n, k in ((28672, 4096), (4096, 14336), (8192, 8192)):
    kw = k // 8
    nbytes = n * k // 2
    ws = [torch.randint(-2**31, 2**31 - 1, (n, kw), dtype=torch.int32, device="cuda") for _ in range(copies_for(nbytes))]
    out = torch.zeros(max(n, 1 << 16), dtype=torch.int32, device="cuda")
    us = probe.time([lambda w=w: torch.sum(w.view(torch.float32)) for w in ws]); probe.emit(n, k, "torch.sum fp32", us, round(nbytes / us / 1e6, 2))
    dst = torch.empty_like(ws[0])
    us = probe.time([lambda w=w: dst.copy_(w) for w in ws]); probe.emit(n, k, "torch copy (r+w)", us, round(2 * nbytes / us / 1e6, 2))
    for bn in (4, 8, 16, 32, 64, 128):
        for bw in (32, 64, 128, 256, 512):
            if bw > kw or not 512 <= bn * bw <= 8192:
                continue
            for warps in (4, 8):
                for split in (1, 2, 4, 8):
                    if kw % (split * bw):
                        continue
                    for ev in (1,) if (warps, split) != (4, 1) else (0, 1):
                        grid = (triton.cdiv(n, bn), split)
                        calls = [lambda w=w: read_rows[grid](w, out, kw, kw // split, BN=bn, BW=bw, EV=ev, num_warps=warps) for w in ws]
                        us = probe.time(calls); probe.emit(n, k, f"rows {bn}x{bw * 4}B w{warps} s{split} ev{ev}", us, round(nbytes / us / 1e6, 2))
    total = n * kw
    for block, warps in ((1024, 4), (2048, 4), (2048, 8), (4096, 8)):
        for progs in (132, 264, 528, 1056, 2112):
            chunk = total // progs
            chunk -= chunk % block
            if chunk == 0:
                continue
            calls = [lambda w=w: read_flat[(progs,)](w, out, chunk, BLOCK=block, num_warps=warps) for w in ws]
            us = probe.time(calls); probe.emit(n, k, f"flat {block * 4}B w{warps} p{progs} (covers {progs * chunk * 4 / nbytes:.3f})", us, round(progs * chunk * 4 / us / 1e6, 2))
print("done", probe.elapsed())

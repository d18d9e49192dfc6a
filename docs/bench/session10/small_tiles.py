"""M = 1-4 decode GEMVs with few weight rows per program (the pure-read sweep's fastest tiles: 4-16 rows
x 256-512 B). PYTHONPATH=. python3 docs/bench/session10/small_tiles.py OUTDIR [parts a b]"""
import json, os, sys
import torch
from _probe import Probe
from qfuse.bench.timing import copies_for
from qfuse.ops.int8_gemm_kernels import run_int8_gemm
from qfuse.ops.w4a8_gemv import gemv_supported
from qfuse.ops.wna16_dispatch import run_config
from tests.ops.test_w4a8_gemm_kernel import make_w4a8
from tests.ops.test_wna16_gemm_kernel import make_problem

out_dir = sys.argv[1]; parts = sys.argv[2:] or ["a", "b"]
probe = Probe(out_dir, "small_tiles.csv")
SHAPES = [(28672, 4096), (4096, 14336), (8192, 8192), (6144, 4096), (4096, 4096)]
dev = "cuda"

A_TILES = [(2, 32, 2), (4, 16, 2), (1, 64, 2), (2, 128, 8), (4, 32, 4), (8, 16, 4), (8, 32, 4), (8, 32, 8), (16, 16, 4), (16, 16, 8), (16, 32, 8), (4, 64, 8), (2, 64, 4), (32, 16, 8), (64, 16, 4)]
B_TILES = [(4, 128, 4), (8, 64, 4), (8, 128, 4), (8, 128, 8), (16, 64, 4), (16, 64, 8), (16, 128, 8), (4, 256, 8), (32, 32, 4), (32, 64, 4), (64, 32, 4)]
MS = [int(v) for v in os.environ.get("MS", "1").split(",")]
if "a" in parts:
    tuned = json.load(open("ops/tuned/w4a8_gemm.NVIDIA_H200.json"))
    for m in MS:
        bm = 1 if m == 1 else 2 if m == 2 else 4
        for n, k in SHAPES:
            probe.emit("w4a8", m, n, k, "bf16", "", probe.bf16_us(n, k, m), "")
            for g in (-1, 128):
                pick = tuned[f"w4a8_gemm|NVIDIA_H200|{m}|{n}|{k}|{g}"]
                sets = [make_w4a8(m, n, k, g, device=dev, bias=False) for _ in range(copies_for(n * k // 2))]
                ref = run_int8_gemm(*sets[0], torch.bfloat16, w4=True, config=pick)
                probe.emit("w4a8", m, n, k, g, "pick " + json.dumps(pick, sort_keys=True), probe.time([lambda a=a: run_int8_gemm(*a, torch.bfloat16, w4=True, config=pick) for a in sets]), True)
                for bn, bw, warps in A_TILES:
                    for split in (1, 2, 4):
                        c = {"KERNEL": "gemv", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": split, "DP4A_ASM": 1, "num_stages": 2, "num_warps": warps}
                        if not gemv_supported(k, g, c):
                            continue
                        o = run_int8_gemm(*sets[0], torch.bfloat16, w4=True, config=c)
                        probe.emit("w4a8", m, n, k, g, json.dumps(c, sort_keys=True), probe.time([lambda a=a, c=c: run_int8_gemm(*a, torch.bfloat16, w4=True, config=c) for a in sets]), bool(torch.equal(o, ref)))
if "b" in parts:
    tuned = json.load(open("ops/tuned/wna16_gemm.NVIDIA_H200.json"))
    for bits in (4, 8):
        for n, k in SHAPES:
            probe.emit(f"w{bits}a16", 1, n, k, "bf16", "", probe.bf16_us(n, k), "")
            pick = tuned[f"wna16_gemm|NVIDIA_H200|1|{n}|{k}|128|bfloat16|{bits}"]
            sets = [make_problem(1, n, k, bits, 128, torch.bfloat16, False, False, device=dev) for _ in range(copies_for(n * k * bits // 8))]
            ref = run_config(pick, *sets[0], bits, 128)
            probe.emit(f"w{bits}a16", 1, n, k, 128, "pick " + json.dumps(pick, sort_keys=True), probe.time([lambda a=a: run_config(pick, *a, bits, 128) for a in sets]), 0.0)
            for bn, bw, warps in B_TILES:
                for split in (1, 2, 4, 8):
                    c = {"kernel": "gemv_words", "BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": split, "num_warps": warps}
                    if (k * bits // 32) % (bw * split):
                        continue
                    o = run_config(c, *sets[0], bits, 128)
                    err = (o.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
                    probe.emit(f"w{bits}a16", 1, n, k, 128, json.dumps(c, sort_keys=True), probe.time([lambda a=a, c=c: run_config(c, *a, bits, 128) for a in sets]), round(err, 5))
print("done", probe.elapsed())

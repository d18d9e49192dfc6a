"""W4A16 / W8A16 word GEMV at M = 1: register caps and warps per program around the shipped picks.
PYTHONPATH=. python3 docs/bench/session10/words_occ.py OUTDIR"""
import json, sys
import torch
from _probe import Probe
from qfuse.bench.timing import copies_for
from qfuse.ops.wna16_dispatch import run_config
from tests.ops.test_wna16_gemm_kernel import make_problem
probe = Probe(sys.argv[1], "words_occ.csv")
SHAPES = [(28672, 4096), (4096, 14336), (8192, 8192), (4096, 4096)]
SPLITS = {28672: (1, 2), 8192: (2, 4), 4096: (4, 8)}
tuned = json.load(open("ops/tuned/wna16_gemm.NVIDIA_H200.json"))
TILES = {4: [(32, 64), (64, 32), (128, 16)], 8: [(64, 32), (128, 32), (32, 64)]}
for bits in (4, 8):
    for n, k in SHAPES:
        probe.emit(bits, n, k, "bf16", probe.bf16_us(n, k), "")
        pick = tuned[f"wna16_gemm|NVIDIA_H200|1|{n}|{k}|128|bfloat16|{bits}"]
        sets = [make_problem(1, n, k, bits, 128, torch.bfloat16, False, False, device="cuda") for _ in range(copies_for(n * k * bits // 8))]
        ref = run_config(pick, *sets[0], bits, 128)
        probe.emit(bits, n, k, "pick " + json.dumps(pick, sort_keys=True), probe.time([lambda a=a: run_config(pick, *a, bits, 128) for a in sets]), 0.0)
        for bn, bw in TILES[bits]:
            for warps in (2, 4):
                for cap in (None, 80, 64):
                    for sp in SPLITS[n]:
                        if (k * bits // 32) % (bw * sp):
                            continue
                        c = {"kernel": "gemv_words", "BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": sp, "num_warps": warps}
                        if cap:
                            c["MAXNREG"] = cap
                        try:
                            o = run_config(c, *sets[0], bits, 128)
                            err = (o.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
                            us = probe.time([lambda a=a, c=c: run_config(c, *a, bits, 128) for a in sets])
                        except Exception as e:  # noqa: BLE001
                            err, us = repr(e)[:60], ""
                        probe.emit(bits, n, k, json.dumps(c, sort_keys=True), us, round(err, 5) if isinstance(err, float) else err)
print("done", probe.elapsed())

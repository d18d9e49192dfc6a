"""W4A16 mma_words at M = 16 / 64 with small weight tiles (mma.sync below 64 rows).
PYTHONPATH=. python3 docs/bench/session10/mma16.py OUTDIR"""
import json, sys
import torch
from _probe import Probe
from qfuse.bench.timing import copies_for
from qfuse.ops.wna16_dispatch import run_config
from tests.ops.test_wna16_gemm_kernel import make_problem
probe = Probe(sys.argv[1], "mma16.csv")
tuned = json.load(open("ops/tuned/wna16_gemm.NVIDIA_H200.json"))
SPLITS = {28672: (1, 2), 8192: (2, 4), 4096: (4, 8)}
for m in (16, 64):
    for n, k in ((28672, 4096), (4096, 14336), (8192, 8192)):
        probe.emit(m, n, k, "bf16", probe.bf16_us(n, k, m), "")
        pick = tuned[f"wna16_gemm|NVIDIA_H200|{m}|{n}|{k}|128|bfloat16|4"]
        sets = [make_problem(m, n, k, 4, 128, torch.bfloat16, False, False, device="cuda") for _ in range(copies_for(n * k // 2))]
        ref = run_config(pick, *sets[0], 4, 128)
        probe.emit(m, n, k, "pick " + json.dumps(pick, sort_keys=True), probe.time([lambda a=a: run_config(pick, *a, 4, 128) for a in sets]), 0.0)
        for bn, warps in ((16, 1), (32, 1), (32, 2), (64, 2), (64, 4), (128, 4)):
            for stages in (3, 4, 6):
                for sp in SPLITS[n]:
                    c = {"kernel": "mma_words", "BLOCK_M": m, "BLOCK_N": bn, "SPLIT_K": sp, "SCALE_W": False, "GROUP_M": 8, "num_warps": warps, "num_stages": stages}
                    try:
                        o = run_config(c, *sets[0], 4, 128)
                        err = (o.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
                        us = probe.time([lambda a=a, c=c: run_config(c, *a, 4, 128) for a in sets])
                    except Exception as e:  # noqa: BLE001
                        err, us = repr(e)[:60], ""
                    probe.emit(m, n, k, json.dumps(c, sort_keys=True), us, round(err, 5) if isinstance(err, float) else err)
print("done", probe.elapsed())

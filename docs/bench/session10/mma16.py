"""W4A16 mma_words at M = 16 / 64 with small weight tiles (mma.sync below 64 rows).
PYTHONPATH=. python3 .scratch/mma16.py OUTDIR"""
import csv, json, os, sys, time
import torch
from qfuse.bench.timing import copies_for, time_graph
from qfuse.ops.wna16_dispatch import run_config
from tests.ops.test_wna16_gemm_kernel import make_problem
out_dir = sys.argv[1]; os.makedirs(out_dir, exist_ok=True)
f = open(os.path.join(out_dir, "mma16.csv"), "a", newline=""); w = csv.writer(f)
t0 = time.time()
def tg(calls):
    calls[0](); torch.cuda.synchronize(); return round(time_graph(calls, replays=15), 2)
def emit(*r):
    w.writerow(r); f.flush(); print(*r, f"[{time.time() - t0:.0f}s]", flush=True)
tuned = json.load(open("ops/tuned/wna16_gemm.NVIDIA_H200.json"))
SPLITS = {28672: (1, 2), 8192: (2, 4), 4096: (4, 8)}
for m in (16, 64):
    for n, k in ((28672, 4096), (4096, 14336), (8192, 8192)):
        ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies_for(n * k * 2))]
        xb = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        emit(m, n, k, "bf16", tg([lambda wt=wt: torch.matmul(xb, wt.t()) for wt in ws]), "")
        del ws
        pick = tuned[f"wna16_gemm|NVIDIA_H200|{m}|{n}|{k}|128|bfloat16|4"]
        sets = [make_problem(m, n, k, 4, 128, torch.bfloat16, False, False, device="cuda") for _ in range(copies_for(n * k // 2))]
        ref = run_config(pick, *sets[0], 4, 128)
        emit(m, n, k, "pick " + json.dumps(pick, sort_keys=True), tg([lambda a=a: run_config(pick, *a, 4, 128) for a in sets]), 0.0)
        for bn, warps in ((16, 1), (32, 1), (32, 2), (64, 2), (64, 4), (128, 4)):
            for stages in (3, 4, 6):
                for sp in SPLITS[n]:
                    c = {"kernel": "mma_words", "BLOCK_M": m, "BLOCK_N": bn, "SPLIT_K": sp, "SCALE_W": False, "GROUP_M": 8, "num_warps": warps, "num_stages": stages}
                    try:
                        o = run_config(c, *sets[0], 4, 128)
                        err = (o.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
                        us = tg([lambda a=a, c=c: run_config(c, *a, 4, 128) for a in sets])
                    except Exception as e:  # noqa: BLE001
                        err, us = repr(e)[:60], ""
                    emit(m, n, k, json.dumps(c, sort_keys=True), us, round(err, 5) if isinstance(err, float) else err)
print("done", time.time() - t0)

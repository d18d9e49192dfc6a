"""Usage: PYTHONPATH=. python3 docs/bench/session12/word_columns_time.py OUT_DIR (a CUDA machine).

The HFMA2 word GEMV at M = 1, bf16: its default tiles against the WORD_COLUMNS tiles
(ops/wna16_gemv_words.py), the shipped pick and 8 tiles x 3 splits per shape, graph-timed
medians over rotated weight copies; each row also has the output's max error against the
reference kernel over max |ref|. CSV columns: N, K, group, layout, config, us, error.

Twelfth-session run 2 (docs/bench/session12/word_columns_run2.csv) ran an earlier copy of the
kernel: its word-column layout ("perm" there; "orig" is the default) came from an [NG, BLOCK_N,
WPG] tile, whose sm_90 SASS is byte-identical to the committed WORD_COLUMNS form per-channel and
differs at g128 in the scale loads (5.04 against 4.95 instructions per weight byte, triton 3.6).
Its third layout, "vec" (the default tile with 16-byte word loads), is not in the code: slower
everywhere at g128 (8192x8192 pick: 19.85 against 15.62 us)."""
import csv, json, os, sys, time

import torch

from qfuse.bench.timing import copies_for, time_graph
from qfuse.ops.wna16_gemm import wna16_gemm_ref
from qfuse.ops.wna16_gemv_words import wna16_gemv_words
from tests.ops.test_wna16_gemm_kernel import make_problem

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
f = open(os.path.join(out_dir, "word_columns_time.csv"), "a", newline="")
w = csv.writer(f)
t0 = time.time()


def tg(calls):
    calls[0]()
    torch.cuda.synchronize()
    return round(time_graph(calls, replays=15), 2)


def emit(*r):
    w.writerow(r)
    f.flush()
    print(*r, f"[{time.time() - t0:.0f}s]", flush=True)


tuned = json.load(open("ops/tuned/wna16_gemm.NVIDIA_H200.json"))
TILES = [(32, 128, 4), (32, 64, 4), (16, 256, 4), (16, 128, 4), (16, 128, 2), (8, 256, 4), (8, 128, 2), (64, 64, 4)]
SPLITS = {8192: (1, 2, 4), 14336: (1, 2, 7), 4096: (1, 2)}
for n, k, g in [(8192, 8192, 128), (4096, 14336, 128), (8192, 8192, -1), (28672, 4096, 128)]:
    ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies_for(n * k * 2))]
    xb = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    emit(n, k, g, "bf16", "", tg([lambda wt=wt: torch.matmul(xb, wt.t()) for wt in ws]), "")
    del ws
    sets = [make_problem(1, n, k, 4, g, torch.bfloat16, False, False, device="cuda") for _ in range(copies_for(n * k // 2))]
    x, qw, s, _, _ = sets[0]
    ref = wna16_gemm_ref(x, qw, s, None, None, 4, g).float()
    pick = {kk: v for kk, v in tuned[f"wna16_gemm|NVIDIA_H200|1|{n}|{k}|{g}|bfloat16|4"].items() if kk != "kernel"}
    cfgs = [("pick", pick)] + [(f"{bn}x{bw}x{nw}w_s{sp}", {"BLOCK_N": bn, "BLOCK_W": bw, "num_warps": nw, "SPLIT_K": sp, "HFMA2": 2})
                               for bn, bw, nw in TILES for sp in SPLITS[k]]
    for label, c in cfgs:
        for layout, cfg in (("default", c), ("word_columns", {**c, "WORD_COLUMNS": 1})):
            o = wna16_gemv_words(x, qw, s, None, None, 4, g, cfg).float()
            err = round(((o - ref).abs().max() / ref.abs().max()).item(), 5)
            us = tg([lambda a=a, cfg=cfg: wna16_gemv_words(a[0], a[1], a[2], None, None, 4, g, cfg) for a in sets])
            emit(n, k, g, layout, label + " " + json.dumps(cfg, sort_keys=True), us, err)
    del sets
print("done", time.time() - t0)

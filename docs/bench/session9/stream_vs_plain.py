"""Stream-K against the split-K grid, W4A8 per-channel M = 1 (graph replays over rotated weights).

From the repository root on a CUDA machine: PYTHONPATH=. python3 docs/bench/session9/stream_vs_plain.py 1 2 (programs per SM)
"""
import sys
import torch
PER_SM = [int(v) for v in sys.argv[1:]] or [1, 2]
from qfuse.bench.timing import copies_for, time_graph
from qfuse.ops.w4a8_mma_words import run_w4a8_mma_words
from tests.ops.test_w4a8_gemm_kernel import make_w4a8
for n, k, split in ((28672, 4096, 1), (4096, 14336, 8)):
    sets = [make_w4a8(1, n, k, -1, device="cuda", bias=False) for _ in range(copies_for(n * k // 2))]
    cfgs = [{"KERNEL": "mma_words", "BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": split, "num_warps": 8, "num_stages": 4}]
    cfgs += [{"KERNEL": "mma_words", "BLOCK_M": 16, "BLOCK_N": bn, "STREAM": s, "num_warps": w, "num_stages": 4} for bn, w in ((128, 8), (128, 4), (64, 4)) for s in PER_SM]
    for c in cfgs:
        calls = [lambda a=a, c=c: run_w4a8_mma_words(*a, torch.bfloat16, config=c) for a in sets]
        calls[0](); torch.cuda.synchronize()
        print(n, k, c, round(time_graph(calls, replays=10), 2), flush=True)

"""Run the shipped pick of one wna16 key twice, then bf16 torch.matmul twice, for ncu (the reports beside this file):

    PYTHONPATH=. ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \\
        --section WarpStateStats --section SchedulerStats --section LaunchStats \\
        -k "regex:wna16|w4a16|mma_words|tma|tiled|dequant|gemm|nvjet|xmma|cutlass|sm90" -c 8 \\
        python3 docs/bench/current/ncu/ncu_pick.py BITS N K M
"""
import json, sys
import torch
from qfuse.ops.wna16_dispatch import config_key, run_config
from tests.ops.test_wna16_gemm_kernel import make_problem
bits, n, k, m = (int(v) for v in sys.argv[1:5])
key = "|".join(["wna16_gemm", "NVIDIA_H200", *map(str, config_key(m, n, k, bits, 128, torch.bfloat16))])
cfg = json.load(open("ops/tuned/wna16_gemm.NVIDIA_H200.json"))[key]
print(key, cfg, flush=True)
x, qw, s, z, b = make_problem(m, n, k, bits, 128, torch.bfloat16, False, False, device="cuda")
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
for _ in range(2):
    run_config(cfg, x, qw, s, None, None, bits, 128)
for _ in range(2):
    torch.matmul(x, w.t())
torch.cuda.synchronize()

"""Compile every WARP_SPECIALIZE config the dispatcher offers for sm_90 (no GPU) and check that
each came out warp-specialized (8 ``USETMAXREG``, the warpgroups' register reallocation, in its SASS); thirteenth session:

    PYTHONPATH=. python3 docs/bench/session13/ws_compile_sweep.py 4    # and 8

Each config compiles in its own process: a compiler abort ends only that one. Prints the number
of distinct compiles (configs that compile alike counted once, each with and without zero
points) and one BAD line per failure.
"""
import os
import re
import subprocess
import sys

import torch

if len(sys.argv) == 9:  # one compile: BITS BM BK STAGES GROUP ZEROS SPLIT DTYPE
    os.environ.pop("TRITON_INTERPRET", None)
    import qfuse.ops.wna16_tma as mod
    from qfuse.bench.sass import compile_sass

    bits, bm, bk, stages, group, zeros, split = (int(v) for v in sys.argv[1:8])
    dt = sys.argv[8]
    sig = {"x_desc": f"tensordesc<{dt}[{bm}, {bk}]>", "w_desc": f"tensordesc<u8[64, {bk * bits // 8}]>", "s_ptr": f"*{dt}", "z_ptr": "*u8",
           "bias_ptr": f"*{dt}", "out_ptr": f"*{dt}", "ws_ptr": "*fp32", "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "G": "i32",
           "K_PER_SPLIT": "i32", "FULL_TILES": "i32"}
    consts = dict(BITS=bits, GROUP=group, HAS_ZEROS=bool(zeros), HAS_BIAS=False, SPLIT_K=split, BLOCK_M=bm, BLOCK_N=64, BLOCK_K=bk,
                  GROUP_M=8, ASM=True, DOT_F32=False, TAIL_SPLIT=0, WARP_SPECIALIZE=True)
    sass, _ = compile_sass(mod._wna16_tma_kernel, sig, consts, {"num_warps": 4, "num_stages": stages})
    print("USETMAXREG", len(re.findall(r"\bU?SETMAXREG\b", sass)))
    raise SystemExit(0)

from qfuse.ops.wna16_dispatch import candidate_configs  # noqa: E402

bits = int(sys.argv[1])
seen = set()
for m in (16, 32, 64, 256, 1024):
    for n, k in ((4096, 4096), (28672, 4096), (4096, 14336), (8192, 8192), (1000, 2944)):
        for g in (-1, 32, 64, 128):
            for c in candidate_configs(m, n, k, bits, g, dtype=torch.bfloat16):
                if "WARP_SPECIALIZE" in c:
                    seen.add((c["BLOCK_M"], c["BLOCK_K"] if g == -1 else min(c["BLOCK_K"], g), c["num_stages"], g, c["SPLIT_K"]))
print(len(seen), "distinct configs,", 2 * len(seen), "compiles", flush=True)
bad = 0
env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
for bm, bk, stages, g, split in sorted(seen):
    for zeros in (0, 1):
        args = [str(v) for v in (bits, bm, bk, stages, g, zeros, split, "bf16")]
        r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=300, env=env)
        if r.returncode or "USETMAXREG 8" not in r.stdout:
            bad += 1
            print("BAD", args, r.returncode, r.stdout.strip()[-80:], r.stderr.strip().splitlines()[-1:], flush=True)
print("bad", bad)

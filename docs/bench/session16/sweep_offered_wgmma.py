"""sm_90 SASS wgmma check (qfuse.bench.sass.wgmma_pipeline) of every config of the W4A16 / W8A16
wgmma families (tiled_planes, mma_words, tiled_tma) that ops/wna16_dispatch.candidate_configs
offers at three shapes and M = 2-1024; one JSON line per config. No GPU needed.

    python3 sweep_offered_wgmma.py OUT.jsonl [GROUP [ZEROS [DTYPE [EXPERIMENTAL]]]]

GROUP (128; -1 per-channel), ZEROS (0 / 1), DTYPE (bf16 / fp16), EXPERIMENTAL (1: the opt-in
configs instead of the default ones). Put another Triton first on PYTHONPATH to check with it."""
import json, sys, os, multiprocessing as mp
os.environ.pop("TRITON_INTERPRET", None)
import torch
from qfuse.ops.wna16_dispatch import candidate_configs, is_experimental

KERNELS = ("tiled_planes", "mma_words", "tiled_tma")

def configs(group, exp):
    seen = {}
    for n, k in ((4096, 4096), (28672, 4096), (4096, 14336)):
        for bits in (4, 8):
            for m in (2, 7, 16, 32, 64, 128, 256, 1024):
                for c in candidate_configs(m, n, k, bits, group, dtype=torch.bfloat16):
                    if c["kernel"] not in KERNELS or is_experimental(c, bits) != exp:
                        continue
                    c = dict(c); c["SPLIT_K"] = min(c["SPLIT_K"], 2)
                    key = json.dumps({"bits": bits, **c}, sort_keys=True)
                    seen.setdefault(key, (bits, c))
    return list(seen.values())

def one(args):
    bits, c, group, zeros, dtype = args
    from qfuse.bench import sass
    import triton
    try:
        fn, sig, consts, _ = sass.kernel_spec(c["kernel"], bits, group, zeros, dtype, c)
        s, usage = sass.compile_sass(fn, sig, consts, c)
        waits, hz = sass.wgmma_pipeline(sass.wgmma_loop(s))
        return {"triton": triton.__version__, "bits": bits, "group": group, "zeros": zeros, "dtype": dtype, "cfg": c,
                "waits": sorted(set(waits)), "hazards": len(hz), "first": hz[:2]}
    except Exception as e:
        return {"bits": bits, "cfg": c, "error": repr(e)[:300]}

if __name__ == "__main__":
    out = sys.argv[1]
    group = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    zeros = len(sys.argv) > 3 and sys.argv[3] == "1"
    dtype = sys.argv[4] if len(sys.argv) > 4 else "bf16"
    exp = len(sys.argv) > 5 and sys.argv[5] == "1"
    todo = [(b, c, group, zeros, dtype) for b, c in configs(group, exp)]
    print(len(todo), "configs", flush=True)
    with mp.Pool(2) as pool, open(out, "w") as f:
        for r in pool.imap_unordered(one, todo):
            f.write(json.dumps(r) + "\n"); f.flush()

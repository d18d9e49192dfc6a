"""The same check for ops/w4a8_mma_words.py's configs (IGMMA), per-channel and g128, M = 1-64:
python3 sweep_w4a8_mma_words.py OUT.jsonl"""
import json, sys, os, multiprocessing as mp
os.environ.pop("TRITON_INTERPRET", None)
from qfuse.ops.w4a8_mma_words import mma_words_configs

def todo():
    seen = {}
    for group in (-1, 128):
        for n, k in ((4096, 4096), (28672, 4096)):
            for m in (1, 7, 16, 32, 64):
                for c in mma_words_configs(m, n, k, 132, group):
                    c = dict(c)
                    if "SPLIT_K" in c: c["SPLIT_K"] = min(c["SPLIT_K"], 2)
                    seen.setdefault(json.dumps([group, c], sort_keys=True), (group, c))
    return list(seen.values())

def one(a):
    group, c = a
    from qfuse.bench import sass
    import triton
    try:
        fn, sig, consts, _ = sass.kernel_spec("w4a8_mma_words", 4, group, False, "bf16", c)
        s, _ = sass.compile_sass(fn, sig, consts, c)
        loop = sass.wgmma_loop(s)
        waits, hz = sass.wgmma_pipeline(loop)
        return {"triton": triton.__version__, "group": group, "cfg": c, "found_loop": bool(loop), "waits": sorted(set(waits)), "hazards": len(hz), "first": hz[:1]}
    except Exception as e:
        return {"group": group, "cfg": c, "error": repr(e)[:300]}

if __name__ == "__main__":
    t = todo(); print(len(t), flush=True)
    with mp.Pool(2) as p, open(sys.argv[1], "w") as f:
        for r in p.imap_unordered(one, t): f.write(json.dumps(r) + "\n"); f.flush()

"""Per tune key: the best time overall and the best of each opt-in form (PREFETCH, TAIL_SPLIT n) and of
the 128-deep tiles added to the exhaustive list, from ``wna16_gemm.tuned.timings.csv`` files.

    python3 docs/bench/session18/best_by_form.py RUN/t_big/wna16_gemm.tuned.timings.csv ...
"""

import csv
import json
import sys
from pathlib import Path

NEW_TILES = {(128, 128, 128, 8, 4), (128, 64, 128, 4, 3), (128, 64, 128, 4, 4), (256, 64, 128, 4, 2)}


def form(cfg: dict) -> str:
    if "PREFETCH" in cfg:
        return f"PREFETCH {cfg['PREFETCH']}"
    if "TAIL_SPLIT" in cfg:
        return f"TAIL_SPLIT {cfg['TAIL_SPLIT']}"
    if cfg.get("kernel") == "tiled_tma" and (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["num_warps"], cfg["num_stages"]) in NEW_TILES:
        return "new 128-deep tile"
    return ""


for path in sys.argv[1:]:
    if not Path(path).is_file():
        print(f"{path}: missing")
        continue
    rows = list(csv.DictReader(open(path)))
    for key in dict.fromkeys(r["key"] for r in rows):
        timed = sorted(((float(r["us"]), json.loads(r["config"])) for r in rows if r["key"] == key), key=lambda t: t[0])
        print(key.split("|", 2)[2], f"best {timed[0][0]:.2f} us {timed[0][1]}")
        best = {}
        for us, cfg in timed:
            best.setdefault(form(cfg), (us, cfg))
        for f, (us, cfg) in sorted(best.items()):
            if f:
                print(f"    {f}: {us:.2f} us ({us / timed[0][0]:.3f}x the best) {cfg}")

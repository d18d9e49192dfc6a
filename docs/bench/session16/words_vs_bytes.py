"""Per key of a tune's timings CSV: the fastest tiled_tma WORDS config, the fastest tiled_tma byte-path
config, the fastest of everything else timed (mma_words, the shipped pick), and WORDS's speedup
over the best non-WORDS config. python3 words_vs_bytes.py TUNED.timings.csv"""

import csv
import json
import sys
from collections import defaultdict

best = defaultdict(dict)
with open(sys.argv[1], newline="") as f:
    for row in csv.DictReader(f):
        cfg = json.loads(row["config"])
        kind = "words" if cfg.get("WORDS") else "bytes" if cfg["kernel"] == "tiled_tma" else cfg["kernel"]
        us = float(row["us"])
        if us < best[row["key"]].get(kind, (float("inf"),))[0]:
            best[row["key"]][kind] = (us, cfg)
print(f"{'M':>5} {'N x K':>12} {'WORDS us':>9} {'bytes us':>9} {'other us':>9} {'other':>12} {'WORDS speedup':>14}")
for key, kinds in sorted(best.items(), key=lambda kv: (int(kv[0].split("|")[2]), kv[0])):
    _, _, mb, n, k, *_ = key.split("|")
    words = kinds.pop("words", (float("nan"), None))[0]
    bytes_us = kinds.get("bytes", (float("nan"), None))[0]
    other = min(((kind, v[0]) for kind, v in kinds.items() if kind != "bytes"), key=lambda kv: kv[1], default=("-", float("nan")))
    rest = min((v[0] for v in kinds.values()), default=float("nan"))  # the best non-WORDS config
    print(f"{mb:>5} {n + 'x' + k:>12} {words:9.2f} {bytes_us:9.2f} {other[1]:9.2f} {other[0]:>12} {rest / words:13.2f}x")

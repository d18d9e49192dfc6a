"""Per tune key: the fastest config with a deeper pipeline (num_stages >= 5) against the fastest other
one, from ``wna16_gemm.tuned.timings.csv`` files (eighteenth session, run 4).

    python3 docs/bench/session18/deeper_vs_rest.py RUN/t16/wna16_gemm.tuned.timings.csv ...
"""

import csv
import json
import sys
from pathlib import Path

for path in sys.argv[1:]:
    if not Path(path).is_file():
        print(f"{path}: missing")
        continue
    rows = list(csv.DictReader(open(path)))
    for key in dict.fromkeys(r["key"] for r in rows):
        timed = [(float(r["us"]), json.loads(r["config"])) for r in rows if r["key"] == key]
        deep = min((t for t in timed if t[1].get("num_stages", 0) >= 5), key=lambda t: t[0], default=None)
        rest = min((t for t in timed if t[1].get("num_stages", 0) < 5), key=lambda t: t[0], default=None)
        if deep and rest:
            print(f"{key.split('|', 2)[2]}: deeper {deep[0]:.2f} us, rest {rest[0]:.2f} us ({rest[0] / deep[0]:.3f}x) {deep[1]}")

# Eighteenth session, GPU run 6 (the last ~6 minutes of device time): the fp16 twin of run 3. Re-tune fp16
# W4A16 g128 at M = 256-2048 on the five shapes over tiled_tma (the 256-token WORDS tiles offered),
# merged into ops/tuned on this machine; then the grid's 4-bit g128 cases at M = 512 and 2048.
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
s=$(date +%s); timeout 100 python3 -m qfuse.cli bench gemm --tune --tune-families tiled_tma --tune-workers 15 --bits 4 --m 256 512 1024 2048 --dtype float16 --no-gemlite --no-eager --out $R/t > $R/t.log 2>&1; echo "tune rc $? $(( $(date +%s) - s )) s mismatches $(grep -c MISMATCH $R/t.log)"
python3 - <<'PY'
import json, os
from pathlib import Path
from qfuse.ops._autotune import merge_into_json
ship = Path("ops/tuned/wna16_gemm.NVIDIA_H200.json"); old = json.loads(ship.read_text())
p = Path(os.environ["OUT"]) / "r" / "t" / "wna16_gemm.tuned.json"
new = json.loads(p.read_text()) if p.is_file() else {}
for key, cfg in new.items():
    merge_into_json(ship, key, cfg)
print("merged, changed keys:", sum(old.get(k) != v for k, v in new.items()), "of", len(new), "to WORDS:", sum(bool(v.get("WORDS")) and old.get(k) != v for k, v in new.items()))
PY
cp ops/tuned/wna16_gemm.NVIDIA_H200.json $R/
tar czf $OUT/r.tgz -C $OUT r
ids=$(python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/ops/test_wna16_gemm_kernel.py -k test_gpu_grid 2>/dev/null | grep -E "\-4-128-(512|2048)-")
s=$(date +%s); timeout 100 python3 -m pytest -v -m gpu -n 15 -p no:cacheprovider -rf $ids > $R/grid.log 2>&1; echo "grid rc $? $(( $(date +%s) - s )) s"; tail -1 $R/grid.log | cut -c1-200; echo "passed $(grep -c PASSED $R/grid.log) failed $(grep -c FAILED $R/grid.log)"
tar czf $OUT/r.tgz -C $OUT r

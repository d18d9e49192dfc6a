# Eighteenth session, GPU run 3: WORDS now offered for the 256-token 64-deep TMA tiles too. 1) re-tune
# bf16 W4A16 g128 at M = 128-2048 on the five shapes over tiled_tma (+ each key's shipped pick), merged
# into ops/tuned on this machine; 2) the grid's 4-bit g128 cases at M = 128, 512, 2048 on the merged
# picks; 3) the one-run table, 4- and 8-bit, M = 1-1024. Fetch $OUT/r.tgz; r/wna16_gemm.NVIDIA_H200.json
# goes to ops/tuned/ if the grid passes.
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" > $R/versions.txt
s=$(date +%s); timeout 240 python3 -m qfuse.cli bench gemm --tune --tune-families tiled_tma --tune-workers 15 --bits 4 --m 128 256 512 1024 2048 --no-gemlite --no-eager --out $R/t > $R/t.log 2>&1; echo "tune rc $? $(( $(date +%s) - s )) s mismatches $(grep -c MISMATCH $R/t.log)"
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
python3 docs/bench/session18/best_by_form.py $R/t/wna16_gemm.tuned.timings.csv > $R/best_by_form.txt
tar czf $OUT/r.tgz -C $OUT r
ids=$(python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/ops/test_wna16_gemm_kernel.py -k test_gpu_grid 2>/dev/null | grep -E "\-4-128-(128|512|2048)-")
s=$(date +%s); timeout 120 python3 -m pytest -v -m gpu -n 15 -p no:cacheprovider -rf $ids > $R/grid.log 2>&1; echo "grid rc $? $(( $(date +%s) - s )) s"; tail -1 $R/grid.log | cut -c1-200; echo "passed $(grep -c PASSED $R/grid.log) failed $(grep -c FAILED $R/grid.log)"
tar czf $OUT/r.tgz -C $OUT r
s=$(date +%s); timeout 170 python3 -m qfuse.cli bench gemm --bits 4 8 --m 1 16 64 256 1024 --no-gemlite --no-eager --out $R/table > $R/table.log 2>&1; echo "table rc $? $(( $(date +%s) - s )) s"
grep -h "speedup" $R/table.log | sed 's/max_rel_err=[0-9.e-]*, //; s/ cfg=.*//; s/shape=//; s/, N=[0-9]*, K=[0-9]*//; s/group=128, //; s/tinygemm_vs_bf16=[0-9.]*, //' | cut -c1-150
tar czf $OUT/r.tgz -C $OUT r

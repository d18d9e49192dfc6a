# Eighteenth session, GPU run 4: deeper pipelines in the exhaustive tune lists (mma_words 6 / 8 stages,
# the 64-token TMA tiles 5 / 6). 1) re-tune bf16 W4A16 g128 at M = 16 (mma_words) and M = 64 (tiled_tma
# + mma_words) on the five shapes, merged into ops/tuned on this machine; 2) the grid's 4-bit g128 cases
# at M = 16, 33, 64 on the merged picks; 3) the one-run table, 4-bit, M = 1-1024. Fetch $OUT/r.tgz;
# r/wna16_gemm.NVIDIA_H200.json goes to ops/tuned/ if the grid passes.
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" > $R/versions.txt
s=$(date +%s); timeout 150 python3 -m qfuse.cli bench gemm --tune --tune-families mma_words --tune-workers 15 --bits 4 --m 16 --no-gemlite --no-eager --out $R/t16 > $R/t16.log 2>&1; echo "tune m16 rc $? $(( $(date +%s) - s )) s mismatches $(grep -c MISMATCH $R/t16.log)"
s=$(date +%s); timeout 150 python3 -m qfuse.cli bench gemm --tune --tune-families tiled_tma mma_words --tune-workers 15 --bits 4 --m 64 --no-gemlite --no-eager --out $R/t64 > $R/t64.log 2>&1; echo "tune m64 rc $? $(( $(date +%s) - s )) s mismatches $(grep -c MISMATCH $R/t64.log)"
python3 - <<'PY'
import json, os
from pathlib import Path
from qfuse.ops._autotune import merge_into_json
ship = Path("ops/tuned/wna16_gemm.NVIDIA_H200.json"); old = json.loads(ship.read_text())
new = {}
for t in ("t16", "t64"):
    p = Path(os.environ["OUT"]) / "r" / t / "wna16_gemm.tuned.json"
    new.update(json.loads(p.read_text()) if p.is_file() else {})
for key, cfg in new.items():
    merge_into_json(ship, key, cfg)
changed = {k: v for k, v in new.items() if old.get(k) != v}
print("merged, changed keys:", len(changed), "of", len(new), "deeper pipelines:", sum(v.get("num_stages", 0) >= 5 for v in changed.values()))
PY
cp ops/tuned/wna16_gemm.NVIDIA_H200.json $R/
python3 docs/bench/session18/best_by_form.py $R/t16/wna16_gemm.tuned.timings.csv $R/t64/wna16_gemm.tuned.timings.csv > $R/best_by_form.txt
python3 docs/bench/session18/deeper_vs_rest.py $R/t16/wna16_gemm.tuned.timings.csv $R/t64/wna16_gemm.tuned.timings.csv | tee $R/deeper_vs_rest.txt
tar czf $OUT/r.tgz -C $OUT r
ids=$(python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/ops/test_wna16_gemm_kernel.py -k test_gpu_grid 2>/dev/null | grep -E "\-4-128-(16|33|64)-")
s=$(date +%s); timeout 120 python3 -m pytest -v -m gpu -n 15 -p no:cacheprovider -rf $ids > $R/grid.log 2>&1; echo "grid rc $? $(( $(date +%s) - s )) s"; tail -1 $R/grid.log | cut -c1-200; echo "passed $(grep -c PASSED $R/grid.log) failed $(grep -c FAILED $R/grid.log)"
tar czf $OUT/r.tgz -C $OUT r
s=$(date +%s); timeout 90 python3 -m qfuse.cli bench gemm --bits 4 --m 1 16 64 256 1024 --no-gemlite --no-eager --out $R/table > $R/table.log 2>&1; echo "table rc $? $(( $(date +%s) - s )) s"
grep -h "speedup" $R/table.log | sed 's/max_rel_err=[0-9.e-]*, //; s/ cfg=.*//; s/shape=//; s/, N=[0-9]*, K=[0-9]*//; s/group=128, //; s/tinygemm_vs_bf16=[0-9.]*, //' | cut -c1-150
tar czf $OUT/r.tgz -C $OUT r

# session 17 run 2: WORDS offered for the 64-token 128-deep TMA tiles (M bucket 64). 1) tune M = 64,
# bf16, five shapes, tiled_tma + mma_words (+ each key's shipped pick); 2) merge the picks
# into ops/tuned on this machine; 3) the grid at M = 33, 64 (bucket 64) on the merged picks;
# 4) the one-run table (4-bit M = 1-1024); 5) the TMA family's every-config test, 4-bit.
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" > $R/versions.txt
for d in bfloat16; do
  s=$(date +%s); timeout 170 python3 -m qfuse.cli bench gemm --tune --tune-families tiled_tma mma_words --tune-workers 15 --bits 4 --m 64 --dtype $d --no-gemlite --no-eager --out $R/t_$d > $R/t_$d.log 2>&1; echo "tune $d rc $? $(( $(date +%s) - s )) s mismatches $(grep -c MISMATCH $R/t_$d.log)"
done
python3 - <<'PY'
import json, os
from pathlib import Path
ship = Path("ops/tuned/wna16_gemm.NVIDIA_H200.json"); data = json.loads(ship.read_text()); n = 0
for d in ("bfloat16",):
    p = Path(os.environ["OUT"]) / "r" / f"t_{d}" / "wna16_gemm.tuned.json"
    if p.is_file():
        new = json.loads(p.read_text()); n += sum(data.get(k) != v for k, v in new.items()); data.update(new)
ship.write_text(json.dumps(data, indent=1, sort_keys=True)); print("merged, changed keys:", n)
PY
cp ops/tuned/wna16_gemm.NVIDIA_H200.json $R/
s=$(date +%s); QFUSE_GPU_GRID_M=33,64 timeout 170 python3 -m pytest -v -m gpu -n 15 -p no:cacheprovider -rf tests/ops/test_wna16_gemm_kernel.py -k "test_gpu_grid" > $R/grid.log 2>&1; echo "grid rc $? $(( $(date +%s) - s )) s"; tail -1 $R/grid.log | cut -c1-200; echo "passed $(grep -c PASSED $R/grid.log) failed $(grep -c FAILED $R/grid.log)"
s=$(date +%s); timeout 90 python3 -m qfuse.cli bench gemm --bits 4 --m 1 16 64 256 1024 --no-gemlite --no-eager --out $R/table > $R/table.log 2>&1; echo "table rc $? $(( $(date +%s) - s )) s"
grep -h "speedup" $R/table.log | sed 's/max_rel_err=[0-9.e-]*, //; s/ cfg=.*//; s/shape=//; s/, N=[0-9]*, K=[0-9]*//; s/group=128, //; s/tinygemm_vs_bf16=[0-9.]*, //' | cut -c1-150
tar czf $OUT/r.tgz -C $OUT r
s=$(date +%s); timeout 150 python3 -m pytest -v -m gpu -n 14 -p no:cacheprovider -rf tests/ops/test_wna16_tma.py -k "every_config and -4]" > $R/tma.log 2>&1; echo "tma rc $? $(( $(date +%s) - s )) s"; tail -1 $R/tma.log | cut -c1-200
tar czf $OUT/r.tgz -C $OUT r

# Eighteenth session, GPU run 1 (the seventeenth session's device_next.sh without its M = 32 timing):
# 1) fp16 W4A16 g128 M = 64 re-tune on the five shapes (WORDS is offered there since the seventeenth
#    session; only the bf16 keys were re-tuned), merged into ops/tuned on the machine; 2) the fp16 half
#    of the grid at M = 33, 64 on the merged picks. Fetch $OUT/r.tgz; r/wna16_gemm.NVIDIA_H200.json goes
#    to ops/tuned/ if the grid passes.
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" > $R/versions.txt
s=$(date +%s); timeout 170 python3 -m qfuse.cli bench gemm --tune --tune-families tiled_tma mma_words --tune-workers 15 --bits 4 --m 64 --dtype float16 --no-gemlite --no-eager --out $R/t_fp16 > $R/t_fp16.log 2>&1; echo "tune fp16 rc $? $(( $(date +%s) - s )) s mismatches $(grep -c MISMATCH $R/t_fp16.log)"
python3 - <<'PY'
import json, os
from pathlib import Path
from qfuse.ops._autotune import merge_into_json
ship = Path("ops/tuned/wna16_gemm.NVIDIA_H200.json"); old = json.loads(ship.read_text())
p = Path(os.environ["OUT"]) / "r" / "t_fp16" / "wna16_gemm.tuned.json"
new = json.loads(p.read_text()) if p.is_file() else {}
for key, cfg in new.items():
    merge_into_json(ship, key, cfg)
print("merged, changed keys:", sum(old.get(k) != v for k, v in new.items()))
PY
cp ops/tuned/wna16_gemm.NVIDIA_H200.json $R/
tar czf $OUT/r.tgz -C $OUT r
s=$(date +%s); QFUSE_GPU_GRID_M=33,64 timeout 300 python3 -m pytest -v -m gpu -n 15 -p no:cacheprovider -rf tests/ops/test_wna16_gemm_kernel.py -k "test_gpu_grid and not bfloat16" > $R/grid_fp16.log 2>&1; echo "grid fp16 rc $? $(( $(date +%s) - s )) s"; tail -1 $R/grid_fp16.log | cut -c1-200; echo "passed $(grep -c PASSED $R/grid_fp16.log) failed $(grep -c FAILED $R/grid_fp16.log)"
tar czf $OUT/r.tgz -C $OUT r

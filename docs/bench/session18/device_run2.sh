# Eighteenth session, GPU run 2: 1) the opt-in mma_words PREFETCH configs against the reference (every
# group size, both dtypes, zero points); 2) tune M = 16 (bf16 g128, three large shapes) over mma_words,
# PREFETCH included (a tune times opt-in configs but never picks them); 3) tune M = 256 / 1024 over
# tiled_tma with the four 128-deep tiles added to the exhaustive list. Picks are not merged here.
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" > $R/versions.txt
ids=$(python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/ops/test_w4a16_mma_words.py 2>/dev/null | grep -E "test_gpu_configs\[.*-(7|8)\]$")
s=$(date +%s); timeout 120 python3 -m pytest -q -m gpu -n 15 -p no:cacheprovider -rf $ids > $R/prefetch_tests.log 2>&1; echo "prefetch tests rc $? $(( $(date +%s) - s )) s"; tail -1 $R/prefetch_tests.log | cut -c1-200
S="--shapes 28672x4096 4096x14336 8192x8192"
s=$(date +%s); timeout 190 python3 -m qfuse.cli bench gemm --tune --tune-families mma_words --tune-workers 15 $S --bits 4 --m 16 --no-gemlite --no-eager --out $R/t_m16 > $R/t_m16.log 2>&1; echo "tune m16 rc $? $(( $(date +%s) - s )) s mismatches $(grep -c MISMATCH $R/t_m16.log)"
tar czf $OUT/r.tgz -C $OUT r
s=$(date +%s); timeout 190 python3 -m qfuse.cli bench gemm --tune --tune-families tiled_tma --tune-workers 15 $S --bits 4 --m 256 1024 --no-gemlite --no-eager --out $R/t_big > $R/t_big.log 2>&1; echo "tune big rc $? $(( $(date +%s) - s )) s mismatches $(grep -c MISMATCH $R/t_big.log)"
for f in $R/t_m16 $R/t_big; do python3 - "$f/wna16_gemm.tuned.timings.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for key in dict.fromkeys(r["key"] for r in rows):
    rs = [r for r in rows if r["key"] == key]
    best = min(rs, key=lambda r: float(r["us"]))
    pf = [r for r in rs if "PREFETCH" in r["config"]]
    tail = f"  best PREFETCH {min(float(r['us']) for r in pf):.2f}" if pf else ""
    print(key.split("|", 2)[2], f"best {float(best['us']):.2f}", best["config"][:150] + tail)
PY
done
tar czf $OUT/r.tgz -C $OUT r

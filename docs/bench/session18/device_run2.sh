# Eighteenth session, GPU run 2: 1) TAIL_SPLIT's two launches and the opt-in mma_words PREFETCH configs
# against the reference; 2) tune M = 256 / 1024 (bf16 g128, three large shapes) over tiled_tma, with the
# four 128-deep tiles added to the exhaustive list and TAIL_SPLIT 2 / 4 (opt-in: timed, never picked);
# 3) tune M = 16 over mma_words, PREFETCH included (opt-in). Picks are not merged here.
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" > $R/versions.txt
ids=$(python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/ops/test_w4a16_mma_words.py 2>/dev/null | grep -E "test_gpu_configs\[.*-(7|8)\]$")
s=$(date +%s); timeout 150 python3 -m pytest -q -m gpu -n 15 -p no:cacheprovider -rf $ids tests/ops/test_wna16_tma.py::test_gpu_tail_split > $R/tests.log 2>&1; echo "tests rc $? $(( $(date +%s) - s )) s"; tail -1 $R/tests.log | cut -c1-200
S="--shapes 28672x4096 4096x14336 8192x8192"
s=$(date +%s); timeout 200 python3 -m qfuse.cli bench gemm --tune --tune-families tiled_tma --tune-workers 15 $S --bits 4 --m 256 1024 --no-gemlite --no-eager --out $R/t_big > $R/t_big.log 2>&1; echo "tune big rc $? $(( $(date +%s) - s )) s mismatches $(grep -c MISMATCH $R/t_big.log)"
tar czf $OUT/r.tgz -C $OUT r
s=$(date +%s); timeout 150 python3 -m qfuse.cli bench gemm --tune --tune-families mma_words --tune-workers 15 $S --bits 4 --m 16 --no-gemlite --no-eager --out $R/t_m16 > $R/t_m16.log 2>&1; echo "tune m16 rc $? $(( $(date +%s) - s )) s mismatches $(grep -c MISMATCH $R/t_m16.log)"
python3 docs/bench/session18/best_by_form.py $R/t_big/wna16_gemm.tuned.timings.csv $R/t_m16/wna16_gemm.tuned.timings.csv | tee $R/best_by_form.txt
tar czf $OUT/r.tgz -C $OUT r

# For the next session's first GPU call (written in the sixteenth session, not yet run): the opt-in
# WORDS TMA form on the H200 for the first time. 1) every TMA config's GPU test (WORDS included:
# test_gpu_every_config takes candidate_configs); 2) a tiled_tma + mma_words tune of W4A16 bf16 g128
# at M 16-1024 on the three large shapes, whose timings CSV holds WORDS next to the byte path
# (a tune never ships an opt-in pick); 3) the per-key comparison.
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" > $R/versions.txt
s=$(date +%s); timeout 240 python3 -m pytest -v -m gpu -n 14 -p no:cacheprovider -rf tests/ops/test_wna16_tma.py > $R/tma.log 2>&1; echo "tma rc $? $(( $(date +%s) - s )) s"; tail -3 $R/tma.log | cut -c1-300
s=$(date +%s); timeout 300 python3 -m qfuse.cli bench gemm --tune --tune-families tiled_tma mma_words --tune-workers 15 --shapes 28672x4096 4096x14336 8192x8192 --bits 4 --m 16 64 256 1024 --no-gemlite --no-eager --out $R/words > $R/words.log 2>&1; echo "tune rc $? $(( $(date +%s) - s )) s"; grep -c MISMATCH $R/words.log
python3 docs/bench/session16/words_vs_bytes.py $R/words/wna16_gemm.tuned.timings.csv | tee $R/words_vs_bytes.txt
tar czf $OUT/r.tgz -C $OUT r

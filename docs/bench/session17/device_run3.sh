# session 17 run 3 (final tree): the grid at M = 33, 64 (M bucket 64, where WORDS is offered and four
# shipped picks changed), whole; then the TMA family's every-config GPU test, 4-bit (WORDS included).
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" > $R/versions.txt
s=$(date +%s); QFUSE_GPU_GRID_M=33,64 timeout 420 python3 -m pytest -v -m gpu -n 15 -p no:cacheprovider -rf tests/ops/test_wna16_gemm_kernel.py -k "test_gpu_grid" > $R/grid.log 2>&1; echo "grid rc $? $(( $(date +%s) - s )) s"; tail -1 $R/grid.log | cut -c1-200; echo "passed $(grep -c PASSED $R/grid.log) failed $(grep -c FAILED $R/grid.log)"
tar czf $OUT/r.tgz -C $OUT r
s=$(date +%s); timeout 150 python3 -m pytest -v -m gpu -n 14 -p no:cacheprovider -rf tests/ops/test_wna16_tma.py -k "every_config and -4]" > $R/tma.log 2>&1; echo "tma rc $? $(( $(date +%s) - s )) s"; tail -1 $R/tma.log | cut -c1-200; echo "passed $(grep -c PASSED $R/tma.log) failed $(grep -c FAILED $R/tma.log)"
tar czf $OUT/r.tgz -C $OUT r

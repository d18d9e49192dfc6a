# session 15 run 3: TMA family GPU tests on the final tree, then the first half of the wna16 grid (final picks)
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
s=$(date +%s); timeout 130 python3 -m pytest -v -m gpu -n 14 -p no:cacheprovider -rf tests/ops/test_wna16_tma.py > $R/tma.log 2>&1; echo "tma rc $? $(( $(date +%s) - s )) s"; tail -2 $R/tma.log | cut -c1-300
s=$(date +%s); QFUSE_GPU_SHARD=0/2 timeout 430 python3 -m pytest -v -m gpu -n 15 -p no:cacheprovider -rf tests/ops/test_wna16_gemm_kernel.py -k "test_gpu_grid or cuda_graph" > $R/grid0.log 2>&1; echo "grid0 rc $? $(( $(date +%s) - s )) s"; tail -2 $R/grid0.log | cut -c1-300; echo "passed $(grep -c PASSED $R/grid0.log) failed $(grep -c FAILED $R/grid0.log)"
tar czf $OUT/r.tgz -C $OUT r

# For the next session's first GPU call (written in the eighteenth session, not yet run). The TMA kernel's
# source changed this session (TAIL_SPLIT became a second launch that only offsets the tile index); the
# sm_90 SASS of every non-TAIL config compared was byte-identical on the CPU (triton 3.7.1), and the tail
# launch passed its own GPU test and every tune's reference check. This runs the whole TMA test file on
# the device's triton 3.6 (every config the dispatcher generates, opt-in ones included, 4- and 8-bit),
# then the grid at M = 128 / 512 / 2048 for every quant form, first half (the second half next call).
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" > $R/versions.txt
s=$(date +%s); timeout 280 python3 -m pytest -v -m gpu -n 14 -p no:cacheprovider -rf tests/ops/test_wna16_tma.py > $R/tma.log 2>&1; echo "tma rc $? $(( $(date +%s) - s )) s"; tail -1 $R/tma.log | cut -c1-200
tar czf $OUT/r.tgz -C $OUT r
s=$(date +%s); QFUSE_GPU_GRID_M=128,512,2048 QFUSE_GPU_SHARD=0/2 timeout 250 python3 -m pytest -v -m gpu -n 15 -p no:cacheprovider -rf tests/ops/test_wna16_gemm_kernel.py -k test_gpu_grid > $R/grid0.log 2>&1; echo "grid 0/2 rc $? $(( $(date +%s) - s )) s"; tail -1 $R/grid0.log | cut -c1-200; echo "passed $(grep -c PASSED $R/grid0.log) failed $(grep -c FAILED $R/grid0.log)"
tar czf $OUT/r.tgz -C $OUT r

# Nineteenth session: the W4A16 / W8A16 GPU tests beside the grid, on the final tree: every kernel
# family's own config sweeps (word GEMV, HFMA2, mma_gemv, mma_words, tiled_planes, extreme codes), every
# candidate of the dispatcher at 4096x4096, the dequantize kernel, the split-K reduction.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.cuda.get_device_name())" > $R/versions.txt
s=$(date +%s); timeout ${LIMIT:-540} python3 -m pytest -v -m gpu -n 16 -p no:cacheprovider -rf tests/ops/test_wna16_gemv_words.py tests/ops/test_w4a16_mma_words.py \
  tests/ops/test_w4a16_tiled_planes.py tests/ops/test_w4a16_mma_gemv.py tests/ops/test_wna16_gemm_kernel.py -k "not test_gpu_grid and not cuda_graph" > $R/rest.log 2>&1
echo "rest rc $? $(( $(date +%s) - s )) s: $(tail -1 $R/rest.log | cut -c1-200)"
echo "passed $(grep -c ' PASSED ' $R/rest.log) failed $(grep -c ' FAILED ' $R/rest.log)"
tar czf $OUT/r.tgz -C $OUT r

# Nineteenth session: the whole W4A16 / W8A16 GPU grid (tests/ops/test_wna16_gemm_kernel.py, test_gpu_grid
# and the CUDA-graph captures: 504 + 3 cases) on the final tree, no kernel or pick changed, run in as many
# calls as it takes: each call runs the ids not yet in docs/bench/session19/passed_ids.txt (the PASSED ids of
# the earlier calls, copied back here between calls) until DEADLINE seconds. TMA=1 first runs the whole
# tests/ops/test_wna16_tma.py (every offered and opt-in TMA config, 4- and 8-bit) on the device's triton.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; t0=$(date +%s); DEADLINE=${DEADLINE:-560}
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.cuda.get_device_name())" > $R/versions.txt
if [ "${TMA:-0}" = 1 ]; then
  s=$(date +%s); timeout 220 python3 -m pytest -v -m gpu -n 16 -p no:cacheprovider -rf tests/ops/test_wna16_tma.py > $R/tma.log 2>&1
  echo "tma rc $? $(( $(date +%s) - s )) s: $(tail -1 $R/tma.log | cut -c1-200)"
fi
python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/ops/test_wna16_gemm_kernel.py -k "test_gpu_grid or cuda_graph" 2>/dev/null | grep "::" > $R/all_ids.txt
done_ids=docs/bench/session19/passed_ids.txt; [ -f $done_ids ] || : > $done_ids
grep -vxF -f $done_ids $R/all_ids.txt > $R/todo.txt
echo "ids $(wc -l < $R/all_ids.txt), passed before $(wc -l < $done_ids), to run $(wc -l < $R/todo.txt)"
left=$(( DEADLINE - ($(date +%s) - t0) ))
s=$(date +%s); timeout $left python3 -m pytest -v -m gpu -n 16 -p no:cacheprovider -rf $(cat $R/todo.txt) > $R/grid.log 2>&1
echo "grid rc $? $(( $(date +%s) - s )) s: $(tail -1 $R/grid.log | cut -c1-200)"
grep -oE "PASSED [^ ]+" $R/grid.log | cut -d' ' -f2 > $R/passed_now.txt
echo "passed now $(wc -l < $R/passed_now.txt), failed $(grep -c FAILED $R/grid.log)"
tar czf $OUT/r.tgz -C $OUT r

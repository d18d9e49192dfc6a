# session 15 run 4: the 14 grid cases run 3 did not reach, the second half of the grid, then the one-run table on the final picks
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
s=$(date +%s); timeout 300 python3 -m pytest -v -m gpu -n 15 -p no:cacheprovider -rf $(cat docs/bench/session15/grid_run4_ids.txt) > $R/grid0b.log 2>&1 &
QFUSE_GPU_SHARD=1/2 timeout 300 python3 -m pytest -v -m gpu -n 15 -p no:cacheprovider -rf tests/ops/test_wna16_gemm_kernel.py -k "test_gpu_grid or cuda_graph" > $R/grid1.log 2>&1; echo "grid1 rc $? $(( $(date +%s) - s )) s"; wait; echo "grid0b $(( $(date +%s) - s )) s"
for f in grid0b grid1; do tail -1 $R/$f.log | cut -c1-200; echo "$f passed $(grep -c PASSED $R/$f.log) failed $(grep -c FAILED $R/$f.log)"; done
s=$(date +%s); timeout 110 python3 -m qfuse.cli bench gemm --bits 4 8 --m 1 16 64 256 1024 --no-gemlite --no-eager --out $R/table > $R/table.log 2>&1; echo "table rc $? $(( $(date +%s) - s )) s"
grep -h "speedup" $R/table.log | sed 's/max_rel_err=[0-9.e-]*, //; s/ cfg=.*//; s/shape=//; s/, N=[0-9]*, K=[0-9]*//; s/group=128, //' | cut -c1-170
tar czf $OUT/r.tgz -C $OUT r

# session 17 run 4: the 7 grid ids (all 1000x2944) that run 3's limit left, by id, on the final tree
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
s=$(date +%s); QFUSE_GPU_GRID_M=33,64 timeout 140 python3 -m pytest -v -m gpu -n 7 -p no:cacheprovider -rf $(cat docs/bench/session17/run4_ids.txt) > $R/grid_rest.log 2>&1; echo "grid rest rc $? $(( $(date +%s) - s )) s"; tail -1 $R/grid_rest.log | cut -c1-200; echo "passed $(grep -c PASSED $R/grid_rest.log) failed $(grep -c FAILED $R/grid_rest.log)"
grep -E "PASSED|FAILED" $R/grid_rest.log | cut -c1-160

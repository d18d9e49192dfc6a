# session 15 run 5: the grid cases of the second half that run 4 did not reach
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
s=$(date +%s); timeout 200 python3 -m pytest -v -m gpu -n 15 -p no:cacheprovider -rf $(cat docs/bench/session15/grid_run5_ids.txt) > $R/grid1b.log 2>&1; echo "grid1b rc $? $(( $(date +%s) - s )) s"; tail -1 $R/grid1b.log | cut -c1-200; echo "passed $(grep -c PASSED $R/grid1b.log) failed $(grep -c FAILED $R/grid1b.log)"
tar czf $OUT/r.tgz -C $OUT r

# session 15 run 1: TMA family GPU tests (8-bit pair planes, asynchronous zeros, 8-warp 8-bit offered), then tiled_tma tunes W8 / W4 bf16 M 64-1024
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/smi.txt
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $R/smi.txt
s=$(date +%s); timeout 180 python3 -m pytest -v -m gpu -n 14 -p no:cacheprovider -rf tests/ops/test_wna16_tma.py > $R/tma.log 2>&1; echo "tma rc $? $(( $(date +%s) - s )) s"; tail -4 $R/tma.log | cut -c1-300
s=$(date +%s); timeout 190 python3 -m qfuse.cli bench gemm --tune --tune-families tiled_tma --tune-workers 15 --shapes 4096x4096 28672x4096 4096x14336 8192x8192 --bits 8 --m 64 128 256 512 1024 --no-gemlite --no-eager --out $R/w8 > $R/w8.log 2>&1; echo "w8 rc $? $(( $(date +%s) - s )) s"; grep -c MISMATCH $R/w8.log
grep -h "speedup" $R/w8.log | sed 's/max_rel_err=[0-9.e-]*, //; s/ cfg=.*//; s/shape=//; s/, N=[0-9]*, K=[0-9]*//; s/group=128, //' | cut -c1-160
s=$(date +%s); timeout 190 python3 -m qfuse.cli bench gemm --tune --tune-families tiled_tma --tune-workers 15 --shapes 4096x4096 28672x4096 4096x14336 8192x8192 --bits 4 --m 64 128 256 512 1024 --no-gemlite --no-eager --out $R/w4 > $R/w4.log 2>&1; echo "w4 rc $? $(( $(date +%s) - s )) s"; grep -c MISMATCH $R/w4.log
grep -h "speedup" $R/w4.log | sed 's/max_rel_err=[0-9.e-]*, //; s/ cfg=.*//; s/shape=//; s/, N=[0-9]*, K=[0-9]*//; s/group=128, //' | cut -c1-160
tar czf $OUT/r.tgz -C $OUT r

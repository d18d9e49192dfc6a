# session 15 run 2: tiled_tma tunes: bf16 M 16 32 (4-, 8-bit; 5 shapes), bf16 6144x4096 M 64-1024, fp16 M 64-1024 (5 shapes)
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
T="--tune --tune-families tiled_tma --tune-workers 15 --no-gemlite --no-eager"
sum() { grep -h "speedup" $1 | sed 's/max_rel_err=[0-9.e-]*, //; s/ cfg=.*//; s/shape=//; s/, N=[0-9]*, K=[0-9]*//; s/group=128, //; s/tinygemm_us=[0-9.]*, //; s/tinygemm_vs_bf16=[0-9.]*, //' | cut -c1-140; }
run() { n=$1; shift; s=$(date +%s); timeout $1 python3 -m qfuse.cli bench gemm $T ${@:2} --out $R/$n > $R/$n.log 2>&1; echo "$n rc $? $(( $(date +%s) - s )) s mismatches $(grep -c MISMATCH $R/$n.log)"; sum $R/$n.log; }
run d4 90 --bits 4 --m 16 32
run d8 90 --bits 8 --m 16 32
run s6 60 --shapes 6144x4096 --bits 4 8 --m 64 128 256 512 1024
run f8 90 --dtype float16 --bits 8 --m 64 128 256 512 1024
run f4 90 --dtype float16 --bits 4 --m 64 128 256 512 1024
tar czf $OUT/r.tgz -C $OUT r

# Nineteenth session, run 5: W8A16 against gemlite 0.6's 8-bit A16Wn in the same run (the bench timed
# gemlite for 4-bit only before), bf16 g128, the three large shapes first. Needs .whl carried.
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
pip install -q --no-deps --target /tmp/gemlite .whl/gemlite-0.6.0.post2-py3-none-any.whl > $R/pip.log 2>&1; echo "pip rc $?"
export PYTHONPATH=/tmp/gemlite:$PWD
s=$(date +%s); timeout ${LIMIT:-170} python3 -m qfuse.cli bench gemm --bits 8 --m 1 16 64 256 1024 --shapes 28672x4096 4096x14336 8192x8192 4096x4096 6144x4096 --no-eager --out $R/w8 > $R/w8.log 2>&1; echo "w8 rc $? $(( $(date +%s) - s )) s"
grep -h "speedup" $R/w8.log | sed 's/ cfg=.*//; s/, N=[0-9]*, K=[0-9]*//; s/group=128, //' | cut -c1-230

# Eighteenth session, GPU run 5: the one-run W4A16 table with gemlite 0.6 in the same run (its wheel built
# with `pip wheel --no-deps gemlite==0.6.0.post2 -w .whl`, carried as .whl/), the final picks, M = 1-1024.
export PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
pip install -q --no-deps --target /tmp/gemlite .whl/gemlite-0.6.0.post2-py3-none-any.whl > $R/pip.log 2>&1; echo "pip rc $?"
export PYTHONPATH=/tmp/gemlite:$PWD
python3 -c "import torch,triton,gemlite;print(torch.__version__,triton.__version__,gemlite.__version__)" > $R/versions.txt 2>&1; cat $R/versions.txt
s=$(date +%s); timeout 330 python3 -m qfuse.cli bench gemm --bits 4 --m 1 2 16 64 256 1024 --no-eager --out $R/gl > $R/gl.log 2>&1; echo "bench rc $? $(( $(date +%s) - s )) s"
grep -h "speedup" $R/gl.log | sed 's/max_rel_err=[0-9.e-]*, //; s/ cfg=.*//; s/shape=//; s/, N=[0-9]*, K=[0-9]*//; s/group=128, //' | cut -c1-220
tar czf $OUT/r.tgz -C $OUT r

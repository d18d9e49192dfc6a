# Nineteenth session: the one-run tables on the final tree (the picks and kernels the whole grid passed
# on), bf16 g128, with gemlite 0.6 in the same run: W4A16 at M = 1-1024, then W8A16. Needs .whl carried.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
pip install -q --no-deps --target /tmp/gemlite .whl/gemlite-0.6.0.post2-py3-none-any.whl > $R/pip.log 2>&1; echo "pip rc $?"
export PYTHONPATH=/tmp/gemlite:$PWD
python3 -c "import torch,triton,gemlite;print(torch.__version__,triton.__version__,gemlite.__version__,torch.cuda.get_device_name())" > $R/versions.txt 2>&1; cat $R/versions.txt
s=$(date +%s); timeout 320 python3 -m qfuse.cli bench gemm --bits 4 --m 1 2 16 64 256 1024 --no-eager --out $R/w4 > $R/w4.log 2>&1; echo "w4 rc $? $(( $(date +%s) - s )) s"
tar czf $OUT/r.tgz -C $OUT r
s=$(date +%s); timeout 230 python3 -m qfuse.cli bench gemm --bits 8 --m 1 16 64 256 1024 --no-eager --out $R/w8 > $R/w8.log 2>&1; echo "w8 rc $? $(( $(date +%s) - s )) s"
tar czf $OUT/r.tgz -C $OUT r

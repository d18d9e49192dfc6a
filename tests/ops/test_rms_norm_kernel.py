"""Triton kernel of rms_norm / fused_add_rms_norm / rms_norm_quant / fused_add_rms_norm_quant.

Two bars (see ops/activation/norm_kernels.py):
* fused == composition of the unfused Triton kernels, bit for bit (codes, scales,
  residual), on the same device: both run the same code and config, so the float
  sum of squares is taken in the same order;
* against the plain-torch reference (another summation order): residual_out is
  exact (no reduction), the normalized output is within one ulp of its dtype and
  equal almost everywhere, codes within 1 of the reference codes.
CPU (CI) runs the launchers under the Triton interpreter; ``-m gpu`` runs the
registered CUDA ops against the reference kernel run on the GPU.
"""

import hashlib
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qfuse.ops.activation.norm_kernels import (
    fused_add_rms_norm_quant_triton,
    fused_add_rms_norm_triton,
    rms_norm_quant_triton,
    rms_norm_triton,
)
from qfuse.ops.activation.quant_kernels import quant_per_token_int8_triton
from qfuse.ops.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from tests.helpers import ACT_DTYPES

# Against the plain-torch reference (another summation order): an output is off by at
# most 2 ulps of its dtype, and few are off at all. Why 2: a last-bit change of the
# fp32 rsqrt can move the intermediate dtype(x * rsqrt) by one ulp, and multiplying
# by the weight and rounding again can turn that into 2 (seen on the H200: max 2 ulps,
# 804 of 14.7M fp16 outputs at H=14336, 0 to 344 of 4.2M-14.7M bf16 outputs).
MAX_ULPS = 2
MAX_MISMATCH_FRACTION = 1e-3

CPU_CASES = [
    ((1, 64), 32768),
    ((2, 576), 32768),
    ((7, 4097), 32768),
    ((16, 257), 32768),
    ((3, 5, 48), 32768),
    ((1, 14336), 32768),
    ((3, 1000), 512),  # chunked: 8 chunks of 128
    ((2, 130), 64),  # chunked with a ragged tail
]


def _ulp_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in units of the last place between same-dtype 16-bit floats (sign-magnitude aware)."""

    def ordered(t):
        i = t.view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -(i & 0x7FFF), i)

    return (ordered(a) - ordered(b)).abs()


def assert_within_ulps(out: torch.Tensor, ref: torch.Tensor, what: str, max_ulps: int = MAX_ULPS) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    d = _ulp_diff(out, ref)
    assert d.max() <= max_ulps, f"{what}: {d.max().item()} ulps off"
    frac = (d > 0).float().mean().item()
    assert frac <= MAX_MISMATCH_FRACTION, f"{what}: {frac:.2e} of the outputs differ"


def assert_codes_close(q, s, qr, sr, what: str) -> None:
    """Codes within 1 and scales within one 16-bit ulp of the amax (the only slack a 1-ulp output shift gives)."""
    assert q.shape == qr.shape and s.shape == sr.shape
    assert (q.int() - qr.int()).abs().max() <= 1, f"{what}: code off by more than 1"
    torch.testing.assert_close(s, sr, rtol=2**-7, atol=0)


def _inputs(shape, dtype, device="cpu"):
    x = (torch.randn(shape, device=device) * 2).to(dtype)
    residual = torch.randn(shape, device=device).to(dtype)
    weight = (torch.rand(shape[-1], device=device) + 0.5).to(dtype)
    return x, residual, weight


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("shape,max_row_block", CPU_CASES)
def test_kernel_fused_equals_unfused_composition(shape, max_row_block, dtype):
    x, residual, weight = _inputs(shape, dtype)
    eps = 1e-6
    out = rms_norm_triton(x, weight, eps, max_row_block)
    q, s = rms_norm_quant_triton(x, weight, eps, max_row_block)
    qc, sc = quant_per_token_int8_triton(out)
    assert torch.equal(q, qc) and torch.equal(s, sc)

    out2, res2 = fused_add_rms_norm_triton(x, residual, weight, eps, max_row_block)
    q2, s2, res_q = fused_add_rms_norm_quant_triton(x, residual, weight, eps, max_row_block)
    q2c, s2c = quant_per_token_int8_triton(out2)
    assert torch.equal(q2, q2c) and torch.equal(s2, s2c) and torch.equal(res_q, res2)


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("shape,max_row_block", CPU_CASES)
def test_kernel_close_to_reference(shape, max_row_block, dtype):
    x, residual, weight = _inputs(shape, dtype)
    eps = 1e-5
    assert_within_ulps(rms_norm_triton(x, weight, eps, max_row_block), rms_norm_ref(x, weight, eps), "rms_norm")
    out, res = fused_add_rms_norm_triton(x, residual, weight, eps, max_row_block)
    out_ref, res_ref = fused_add_rms_norm_ref(x, residual, weight, eps)
    assert torch.equal(res, res_ref), "residual_out is an elementwise add: it must be exact"
    assert_within_ulps(out, out_ref, "fused_add_rms_norm")
    q, s, res_q = fused_add_rms_norm_quant_triton(x, residual, weight, eps, max_row_block)
    qr, sr = quant_per_token_int8_triton(out_ref)  # quantizing is exact (test_quant_int8_kernel)
    assert torch.equal(res_q, res_ref)
    assert_codes_close(q, s, qr, sr, "fused_add_rms_norm_quant")


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("max_row_block", [32768, 256])
def test_kernel_all_zero_row(dtype, max_row_block):
    x, residual, weight = _inputs((3, 200), dtype)
    x[1] = 0
    out = rms_norm_triton(x, weight, 1e-6, max_row_block)
    assert (out[1] == 0).all() and torch.isfinite(out).all()
    q, s = rms_norm_quant_triton(x, weight, 1e-6, max_row_block)
    assert (q[1] == 0).all() and torch.isfinite(s).all() and s[1].item() > 0
    residual[1] = 0
    q2, s2, res = fused_add_rms_norm_quant_triton(x, residual, weight, 1e-6, max_row_block)
    assert (res[1] == 0).all() and (q2[1] == 0).all() and torch.isfinite(s2).all()


@pytest.mark.parametrize("max_row_block", [32768, 64])
def test_kernel_rows_whose_sum_of_squares_is_inf(max_row_block):
    """inv = rsqrt(inf) = 0: a +-inf gives a NaN scale (its output inf * 0 = NaN), a finite row whose
    squares overflow gives zeros and the 1e-10 / 127 floor, as the reference (bf16 holds 3e30)."""
    x, residual, weight = _inputs((4, 200), torch.bfloat16)
    x[1, 50], x[2, 199], x[3, 7] = float("inf"), float("-inf"), 3e30
    q, s = rms_norm_quant_triton(x, weight, 1e-6, max_row_block)
    q_ref, s_ref = torch.ops.qfuse.rms_norm_quant(x, weight, 1e-6)
    assert s[1:3].isnan().all() and s_ref[1:3].isnan().all()
    assert torch.equal(s[[0, 3]], s_ref[[0, 3]]) and torch.equal(q[[0, 3]], q_ref[[0, 3]]) and (q[3] == 0).all()
    _, s2, _ = fused_add_rms_norm_quant_triton(x, residual.zero_(), weight, 1e-6, max_row_block)
    assert s2[1:3].isnan().all() and torch.equal(s2[[0, 3]], s_ref[[0, 3]])


def test_kernel_residual_add_rounds_like_torch():
    # Sums that need more than 16 bits: the fp32 add rounds once to bf16 (ties to even), as torch does.
    x = torch.tensor([[1.0, 256.0, -3.0, 1e-3, 0.5]], dtype=torch.bfloat16).repeat(2, 8)
    residual = torch.tensor([[2**-8, 1.0, 2**-7, 3e3, 2**-9]], dtype=torch.bfloat16).repeat(2, 8)
    weight = torch.ones(40, dtype=torch.bfloat16)
    _, res = fused_add_rms_norm_triton(x, residual, weight, 1e-6)
    assert torch.equal(res, x + residual)


def test_kernel_non_contiguous_input():
    x = torch.randn(64, 24).bfloat16().t()
    weight = torch.rand(64).bfloat16() + 0.5
    assert_within_ulps(rms_norm_triton(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6), "rms_norm")


def test_cuda_entries_check_arguments_before_any_kernel():
    mod = importlib.import_module("qfuse.ops.rms_norm")  # the package attribute is the op, not the module

    x = torch.randn(2, 8).half()
    with pytest.raises(TypeError, match="weight must be float16"):
        mod._rms_norm_quant_cuda(x, torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="eps must be a positive finite float"):
        mod._fused_add_rms_norm_quant_cuda(x, x, torch.ones(8).half(), 0.0)
    with pytest.raises(ValueError, match="residual must have shape"):
        mod._fused_add_rms_norm_cuda(x, x[:1], torch.ones(8).half(), 1e-6)


# ------------------------------------------- summation order, from the compiled kernels
# The bit-for-bit claim rests on the four kernel variants taking the sum of squares in
# the same order. That order is fixed by Triton's layout choice, which a 1-D row let
# the int8 store of the fused kernels change (fused != unfused on the H200). This test
# compiles each variant for sm_90 on the CPU (Triton ships ptxas) and compares the
# dataflow of the rsqrt argument in the PTX: registers expanded to the instructions
# that produce them (their definitions before the rsqrt), shared-memory loads to every earlier
# shared store.


def _compile_norm_ptx(residual: bool, quant: bool, h: int, dtype: str) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from qfuse.ops.activation.norm_kernels import _rms_norm_kernel
    from qfuse.ops.activation.quant_kernels import row_config

    cfg = row_config(h)
    consts = {"HAS_RESIDUAL": residual, "QUANT": quant, "BLOCK": cfg["BLOCK"], "SINGLE": cfg["SINGLE"], "INTERPRET": False}
    sig = {"x_ptr": f"*{dtype}", "res_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "res_out_ptr": f"*{dtype}",
           "q_ptr": "*i8", "scale_ptr": "*fp32", "H": "i32", "H_f32": "fp32", "eps": "fp32", **{k: "constexpr" for k in consts}}  # fmt: skip
    aligned = list(range(7)) + ([7] if h % 16 == 0 else [])  # what the launcher's specialization sees
    src = ASTSource(fn=_rms_norm_kernel, signature=sig, constexprs=consts, attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    opts = {"num_warps": cfg["num_warps"], "enable_fp_fusion": False}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]


COMMUTATIVE = ("add.rn.f32", "mul.rn.f32", "add.f32", "mul.f32")


def _rsqrt_dataflow(ptx: str) -> str:
    import re

    defs, smem_stores, lines = {}, [], [ln.split("//")[0].strip().rstrip(";") for ln in ptx.splitlines()]
    # only the code up to the rsqrt can produce its argument (no loop encloses it): a register that
    # LLVM defines again in the quantizing code after it is not part of the sum
    lines = lines[: next(i for i, ln in enumerate(lines) if "rsqrt.approx" in ln) + 1]
    for idx, ln in enumerate(lines):
        ln = re.sub(r"^@!?%p\d+\s+", "P ", ln)
        pred = ln.startswith("P ")
        parts = ln[2:].split(None, 1) if pred else ln.split(None, 1)
        if len(parts) < 2 or parts[0].startswith(".") or ln.endswith(":"):
            continue
        op, args = parts
        if op.startswith("st.shared"):
            addr, val = re.match(r"\[([^\]]*)\],\s*(.*)", args).groups()
            smem_stores.append((idx, addr.split("+")[0], val))
            continue
        vec = re.match(r"\{([^}]*)\},\s*(.*)", args)
        if vec:
            dsts, srcs = [d.strip() for d in vec.group(1).split(",")], [x.strip() for x in re.split(r",(?![^\[]*\])", vec.group(2))]
        else:
            toks = [t.strip() for t in re.split(r",(?![^\[{]*[\]}])", args)]
            dsts, srcs = toks[:1], toks[1:]
        for i, d in enumerate(dsts):
            if d.startswith("%"):  # registers only (not immediates, barriers' operands, stores' addresses)
                defs.setdefault(d, []).append((op, srcs, f"{i}/{len(dsts)}", pred, idx))
    memo, visiting = {}, set()

    def expand(r: str) -> str:
        r = r.strip()
        if r.startswith("{"):
            return "{" + ",".join(expand(x) for x in r[1:-1].split(",")) + "}"
        if r.startswith("["):
            return "[" + expand(r[1:-1].split("+")[0]) + "]"
        if r in memo or r not in defs:
            return memo.get(r, r)
        if r in visiting:
            return "LOOP"
        visiting.add(r)
        outs = []
        for op, srcs, slot, pred, idx in defs[r]:
            smem = ";".join(expand(a) + "<-" + expand(v) for j, a, v in smem_stores if j < idx) if op.startswith("ld.shared") else ""
            args = [expand(x) for x in srcs]
            if op in COMMUTATIVE:  # a + b and b + a round alike: only the grouping of the sum matters
                args.sort()
            outs.append(f"{op}[{slot}]{'@' if pred else ''}(" + ",".join(args) + smem + ")")
        visiting.discard(r)
        memo[r] = "|".join(outs)
        if len(memo[r]) > 256:
            memo[r] = "h" + hashlib.md5(memo[r].encode()).hexdigest()
        return memo[r]

    rsqrt = next(ln for ln in lines if "rsqrt.approx" in ln)
    return expand(rsqrt.split(",")[-1])


def _check_same_sum_order() -> None:
    """Run in a process without the interpreter (needs JIT-compiled kernels). Not H = 520 / 1000 /
    1016, where the order differs (ops/activation/norm_kernels.py, ``VEC``)."""
    for dtype in ("bf16", "fp16"):
        for h in (576, 2050, 2064, 4095, 4096, 4097, 14336):
            for residual in (False, True):
                unfused, fused = (_rsqrt_dataflow(_compile_norm_ptx(residual, q, h, dtype)) for q in (False, True))
                assert unfused == fused, f"sum of squares differs: {dtype} H={h} residual={residual}"
    print("same order")


def test_fused_and_unfused_kernels_sum_squares_in_the_same_order():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-c", "import tests.ops.test_rms_norm_kernel as t; t._check_same_sum_order()"]
    proc = subprocess.run(cmd, env=env, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and ("ptxas" in proc.stderr and "not found" in proc.stderr):
        pytest.skip("this Triton cannot compile for sm_90 here")
    assert proc.returncode == 0 and "same order" in proc.stdout, proc.stderr[-3000:]


# ---------------------------------------------------------------- GPU grid
GPU_M = (1, 2, 7, 16, 33, 64, 128, 512, 2048, 4096)
GPU_H = (4096, 14336, 4097, 576)


def _gpu_check(m, h, dtype, eps=1e-6):
    x, residual, weight = _inputs((m, h), dtype, "cuda")
    if m > 2:
        x[1] = 0
        residual[1] = 0
    ops = torch.ops.qfuse
    out = ops.rms_norm(x, weight, eps)
    out2, res2 = ops.fused_add_rms_norm(x, residual, weight, eps)
    q, s = ops.rms_norm_quant(x, weight, eps)
    q2, s2, res_q = ops.fused_add_rms_norm_quant(x, residual, weight, eps)
    # fused == composition of the unfused CUDA ops, bit for bit
    qc, sc = ops.quant_per_token_int8(out)
    q2c, s2c = ops.quant_per_token_int8(out2)
    assert torch.equal(s, sc) and torch.equal(q, qc), f"rms_norm_quant: {(q != qc).any(-1).sum().item()} of {m} rows differ"
    assert torch.equal(s2, s2c) and torch.equal(q2, q2c), f"fused_add_rms_norm_quant: {(q2 != q2c).any(-1).sum().item()} of {m} rows differ"
    assert torch.equal(res_q, res2)
    # against the reference kernel on the GPU
    out_ref = rms_norm_ref(x, weight, eps)
    out2_ref, res_ref = fused_add_rms_norm_ref(x, residual, weight, eps)
    assert torch.equal(res2, res_ref)
    assert_within_ulps(out, out_ref, "rms_norm")
    assert_within_ulps(out2, out2_ref, "fused_add_rms_norm")
    assert_codes_close(q2, s2, *ops.quant_per_token_int8(out2_ref), "fused_add_rms_norm_quant")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("h", GPU_H)
@pytest.mark.parametrize("m", GPU_M)
def test_gpu_grid(m, h, dtype):
    _gpu_check(m, h, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("h", (40000, 32768 + 3))  # chunked path
@pytest.mark.parametrize("m", (1, 7, 256))
def test_gpu_long_rows(m, h, dtype):
    _gpu_check(m, h, dtype, eps=1e-5)


@pytest.mark.gpu
def test_gpu_fused_cuda_graph_capture():
    x, residual, weight = _inputs((16, 4096), torch.bfloat16, "cuda")
    torch.ops.qfuse.fused_add_rms_norm_quant(x, residual, weight, 1e-6)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q, s, res = torch.ops.qfuse.fused_add_rms_norm_quant(x, residual, weight, 1e-6)
    x.copy_(torch.randn_like(x))
    g.replay()
    out, res_ref = torch.ops.qfuse.fused_add_rms_norm(x, residual, weight, 1e-6)
    qc, sc = torch.ops.qfuse.quant_per_token_int8(out)
    assert torch.equal(res, res_ref) and torch.equal(q, qc) and torch.equal(s, sc)


@pytest.mark.gpu
@pytest.mark.parametrize("h", (4096, 4097, 40000))  # one block, a ragged block, the chunked path
def test_gpu_nan_row_gets_a_nan_scale(h):
    x, residual, weight = _inputs((3, h), torch.bfloat16, "cuda")
    x[1, h // 3] = float("nan")
    _, s = torch.ops.qfuse.rms_norm_quant(x, weight, 1e-6)
    _, s2, _ = torch.ops.qfuse.fused_add_rms_norm_quant(x, residual, weight, 1e-6)
    for scale in (s, s2):
        assert torch.isnan(scale[1]).all() and torch.isfinite(scale[[0, 2]]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("h", (4096, 4097, 40000))
@pytest.mark.parametrize("inf", (float("inf"), float("-inf")))
def test_gpu_inf_row_gets_a_nan_scale(h, inf):
    """A +-inf in a row: its normalized value is inf * rsqrt(inf) = NaN, the others 0, so the
    reference's scale is NaN; the kernel's max.f32 alone would drop that one NaN (scale 1e-10 / 127)."""
    x, residual, weight = _inputs((3, h), torch.bfloat16, "cuda")
    x[1, h // 3] = inf
    _, s = torch.ops.qfuse.rms_norm_quant(x, weight, 1e-6)
    _, s2, _ = torch.ops.qfuse.fused_add_rms_norm_quant(x, residual.zero_(), weight, 1e-6)
    _, s_ref = torch.ops.qfuse.rms_norm_quant(x.cpu(), weight.cpu(), 1e-6)
    assert torch.isnan(s_ref[1]).all()
    for scale in (s, s2):
        assert torch.isnan(scale[1]).all() and torch.isfinite(scale[[0, 2]]).all()

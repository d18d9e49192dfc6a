"""Each fusion on a toy function: exact match counts, numerics equal to the unfused
compile (bit for bit under emulate_precision_casts), and the cases that must not fuse."""

import pytest
import torch
import torch.nn.functional as F

import qfuse.passes as qp
from qfuse.tiny_llama import _LlamaRMSNorm

from .helpers import assert_same, fused_vs_unfused, run_compiled

q = torch.ops.qfuse
H = 64
EPS = 1e-6


def quant(t):
    return q.quant_per_token_int8(t.reshape(-1, t.shape[-1]))


def rnd(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


def hf_norm(x, w, eps=EPS):
    """LlamaRMSNorm.forward written out (what an unconverted HF model runs)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * y.to(x.dtype)


def fired(counts):
    return {k: v for k, v in counts.items() if v}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_quant(dtype):
    def f(x, w):
        return quant(q.rms_norm(x, w, EPS))

    args = (rnd(2, 7, H, dtype=dtype), 1 + 0.1 * rnd(H, dtype=dtype))
    unfused, fused, counts, rec = fused_vs_unfused(f, args)
    assert fired(counts) == {"rms_norm_quant": 1}
    assert rec.after.counts[0].get("qfuse.quant_per_token_int8", 0) == 0
    assert rec.after.counts[0].get("qfuse.rms_norm", 0) == 0
    assert_same(unfused, fused)


def test_fused_add_rms_norm_quant_keeps_residual():
    def f(x, r, w):
        out, res = q.fused_add_rms_norm(x, r, w, EPS)
        return quant(out), res * 2  # the residual stream is read after the quant

    args = (rnd(3, H), rnd(3, H), 1 + 0.1 * rnd(H))
    unfused, fused, counts, rec = fused_vs_unfused(f, args)
    assert fired(counts) == {"fused_add_rms_norm_quant": 1}
    assert rec.after.counts[0].get("qfuse.fused_add_rms_norm", 0) == 0
    assert_same(unfused, fused)


def test_plain_add_then_rms_norm_becomes_fused_add():
    def f(x, r, w):
        h = x + r  # how HF decoder layers add the residual
        return quant(q.rms_norm(h, w, EPS)), h + 1

    args = (rnd(2, 5, H), rnd(2, 5, H), 1 + 0.1 * rnd(H))
    unfused, fused, counts, rec = fused_vs_unfused(f, args)
    assert fired(counts) == {"add_rms_norm_quant": 1}
    assert rec.after.counts[0].get("qfuse.fused_add_rms_norm_quant") == 1
    assert rec.after.counts[0].get("aten.add.Tensor") == 1  # only the "+ 1"; the residual add moved into the op
    assert_same(unfused, fused)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("order", ["silu_first", "up_first"])
def test_silu_and_mul_quant(dtype, order):
    def f(g, u):
        h = F.silu(g) * u if order == "silu_first" else u * F.silu(g)
        return quant(h)

    args = (3 * rnd(2, 9, H, dtype=dtype), rnd(2, 9, H, dtype=dtype))
    unfused, fused, counts, rec = fused_vs_unfused(f, args)
    assert fired(counts) == {"silu_and_mul_quant": 1}
    assert "aten.exp" not in rec.after.counts[0]  # the decomposed silu is gone
    assert_same(unfused, fused)


def test_silu_and_mul_quant_default_rounding_within_one_code():
    """Without emulate_precision_casts Inductor keeps silu in fp32 before the multiply;
    the fused op rounds like eager. Codes then differ by at most 1."""

    def f(g, u):
        return quant(F.silu(g) * u)

    args = (3 * rnd(4, 256), rnd(4, 256))
    eager = f(*args)
    fused = run_compiled(f, args, passes=True)
    unfused = run_compiled(f, args, passes=False)
    assert_same(eager, fused)
    assert (unfused[0].int() - fused[0].int()).abs().max().item() <= 1
    torch.testing.assert_close(unfused[1], fused[1], rtol=2**-7, atol=0)  # one bf16 ulp of amax


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_add", [False, True])
def test_hf_rms_norm_forms(dtype, with_add):
    norm = _LlamaRMSNorm(H, EPS).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(H))

    def f(x, r):
        h = x + r if with_add else x
        return quant(norm(h)), h

    args = (rnd(2, 6, H, dtype=dtype), rnd(2, 6, H, dtype=dtype))
    unfused, fused, counts, _ = fused_vs_unfused(f, args)
    assert fired(counts) == {"add_hf_rms_norm_quant" if with_add else "hf_rms_norm_quant": 1}
    assert_same(unfused, fused)


@pytest.mark.parametrize("shape", [(5, H), (2, 3, H)])
def test_torch_rms_norm_is_opt_in(shape):
    w = 1 + 0.1 * rnd(H)

    def f(x):
        return quant(F.rms_norm(x, (H,), w, 1e-5))

    args = (rnd(*shape),)
    unfused, fused, counts, _ = fused_vs_unfused(f, args)
    assert fired(counts) == {}
    assert_same(unfused, fused)
    unfused, fused, counts, _ = fused_vs_unfused(f, args, config=qp.PassConfig(torch_rms_norm=True))
    assert fired(counts) == {"torch_rms_norm_quant": 1}
    # F.rms_norm rounds once after the fp32 weight multiply, the fused op (HF math) rounds before it:
    # one bf16 ulp (2**-8 relative) on an element and on the row max moves a code by at most 2.
    diff = (unfused[0].int() - fused[0].int()).abs()
    assert diff.max().item() <= 2 and diff.float().mean().item() < 0.5
    torch.testing.assert_close(unfused[1], fused[1], rtol=2**-7, atol=0)


def test_identical_quants_collapse_before_fusion():
    """q/k/v: three QuantLinears quantize one normalized tensor; one fused op remains."""

    def f(x, w):
        y = q.rms_norm(x, w, EPS)
        return quant(y), quant(y), quant(y)

    args = (rnd(2, 4, H), 1 + 0.1 * rnd(H))
    unfused, fused, counts, rec = fused_vs_unfused(f, args)
    assert fired(counts) == {"dedup_quant": 2, "rms_norm_quant": 1}
    assert rec.after.counts[0].get("qfuse.rms_norm_quant") == 1
    assert rec.after.counts[0].get("qfuse.rms_norm", 0) == 0
    assert_same(unfused, fused)


# --- must not fuse / must keep every consumer ---------------------------------


def test_second_consumer_of_norm_output_is_kept():
    def f(x, w):
        y = q.rms_norm(x, w, EPS)
        return quant(y), y * 3

    args = (rnd(4, H), 1 + 0.1 * rnd(H))
    unfused, fused, counts, rec = fused_vs_unfused(f, args)
    assert fired(counts) == {"rms_norm_quant": 1, "kept_float_output": 1}
    assert rec.after.counts[0].get("qfuse.rms_norm") == 1  # still there for y * 3
    assert_same(unfused, fused)


def test_second_consumer_of_silu_product_is_kept():
    def f(g, u):
        h = F.silu(g) * u
        return quant(h), h.sum(-1)

    args = (rnd(4, H), rnd(4, H))
    unfused, fused, counts, _ = fused_vs_unfused(f, args)
    assert fired(counts) == {"silu_and_mul_quant": 1, "kept_float_output": 1}
    assert_same(unfused, fused)


def test_eps_not_a_constant_is_not_fused():
    eps = torch.tensor(EPS)

    def f(x, w):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return quant(w * y.to(x.dtype))

    args = (rnd(4, H), 1 + 0.1 * rnd(H))
    unfused, fused, counts, rec = fused_vs_unfused(f, args)
    assert fired(counts) == {}
    assert rec.after.counts[0].get("qfuse.quant_per_token_int8") == 1
    assert_same(unfused, fused)


def test_residual_of_other_dtype_is_not_folded():
    """x (bf16) + r (fp32) promotes to fp32: the add cannot become the op's bf16 residual add."""

    def f(x, r, w):
        h = (x + r).to(torch.bfloat16)
        return quant(q.rms_norm(h, w, EPS))

    args = (rnd(4, H), torch.randn(4, H), 1 + 0.1 * rnd(H))
    unfused, fused, counts, _ = fused_vs_unfused(f, args)
    assert fired(counts) == {"rms_norm_quant": 1}
    assert_same(unfused, fused)


def test_broadcast_add_is_not_folded():
    def f(x, b, w):
        return quant(q.rms_norm(x + b, w, EPS))

    args = (rnd(4, H), rnd(H), 1 + 0.1 * rnd(H))
    unfused, fused, counts, _ = fused_vs_unfused(f, args)
    assert fired(counts) == {"rms_norm_quant": 1}
    assert_same(unfused, fused)


def test_norm_weight_of_other_dtype_is_not_fused():
    """Gemma/Qwen3.5-style fp32 norm weight: the product is fp32, cast back before the quant."""

    def f(x, w32):
        return quant(hf_norm(x, w32).to(torch.bfloat16))

    args = (rnd(4, H), 1 + 0.1 * torch.randn(H))
    unfused, fused, counts, _ = fused_vs_unfused(f, args)
    assert fired(counts) == {}
    assert_same(unfused, fused)


def test_broadcast_silu_mul_is_not_fused():
    def f(g, u):
        return quant(F.silu(g) * u)

    args = (rnd(4, H), rnd(H))
    unfused, fused, counts, _ = fused_vs_unfused(f, args)
    assert fired(counts) == {}
    assert_same(unfused, fused)


def test_quant_of_a_plain_input_is_left_alone():
    def f(x):
        return quant(x * 2)

    unfused, fused, counts, _ = fused_vs_unfused(f, (rnd(4, H),))
    assert fired(counts) == {}
    assert_same(unfused, fused)


def test_passes_off_by_config():
    def f(x, w):
        return quant(q.rms_norm(x, w, EPS)), quant(F.silu(x) * x)

    args = (rnd(4, H), 1 + 0.1 * rnd(H))
    cfg = qp.PassConfig(fuse_norm_quant=False, fuse_act_quant=False)
    unfused, fused, counts, _ = fused_vs_unfused(f, args, config=cfg)
    assert fired(counts) == {}
    assert_same(unfused, fused)

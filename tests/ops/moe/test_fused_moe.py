"""The reference kernel of fused_moe against a float64 model of its math, opcheck, edge cases and bad input."""

import pytest
import torch

from qfuse.bench.moe import random_act_perm
from qfuse.ops.moe.routing import topk_routing
from tests.helpers import decode_uint4

# (weight_bits, act_bits, group_size, zero points): every format of the op
FORMATS = {
    "bf16": (16, 16, -1, False),
    "W8A16": (8, 16, -1, False),
    "W8A16_ASYM_G32": (8, 16, 32, True),
    "W4A16_G32": (4, 16, 32, False),
    "W4A16_ASYM_CH": (4, 16, -1, True),
    "W8A8": (8, 8, -1, False),
    "W4A8": (4, 8, -1, False),
    "W4A8_G32": (4, 8, 32, False),
}


def make_weight(e, n, k, bits, act_bits, group_size, dtype, asym):
    """One expert weight in the op's layout: random full-range codes, scales that keep outputs O(1)."""
    groups = 1 if group_size == -1 else k // group_size
    if bits == 16:
        return {"w": (torch.randn(e, n, k) / k**0.5).to(dtype), "scale": None, "zeros": None, "group_scale": None}
    if act_bits == 16:
        codes = torch.randint(0, 2**bits, (e, n, k), dtype=torch.uint8)
        w = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous() if bits == 4 else codes
        step = 2.0 / 2**bits / k**0.5
        scale = ((torch.rand(e, n, groups) + 0.5) * step).to(dtype)
        zeros = torch.randint(0, 2**bits, (e, n, groups), dtype=torch.uint8) if asym else None
        return {"w": w, "scale": scale, "zeros": zeros, "group_scale": None}
    if bits == 8:
        return {"w": torch.randint(-127, 128, (e, n, k), dtype=torch.int8), "scale": (torch.rand(e, n) + 0.5) / 64 / k**0.5,
                "zeros": None, "group_scale": None}  # fmt: skip
    codes = torch.randint(0, 16, (e, n, k), dtype=torch.uint8)
    gs = torch.randint(1, 17, (e, n, k // group_size), dtype=torch.int8) if group_size != -1 else None
    return {"w": (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous(), "scale": (torch.rand(e, n) + 0.5) / 8 / k**0.5 / (8 if gs is not None else 1),
            "zeros": None, "group_scale": gs}  # fmt: skip


def make_moe(fmt, m, h, i, e, dtype, logits_dtype=None):
    """``(x, router_logits, weight args)``: the op's arguments after ``top_k, renormalize``."""
    bits, act_bits, group_size, asym = FORMATS[fmt]
    w13 = make_weight(e, 2 * i, h, bits, act_bits, group_size, dtype, asym)
    w2 = make_weight(e, h, i, bits, act_bits, group_size, dtype, asym)
    x = torch.randn(m, h).to(dtype)
    logits = (torch.randn(m, e) * 2).to(logits_dtype or dtype)
    weights = tuple(w[k] for w in (w13, w2) for k in ("w", "scale", "zeros", "group_scale"))
    return x, logits, (*weights, bits, act_bits, group_size)


def dequantize64(w, scale, zeros, group_scale, bits, act_bits, group_size, dtype):
    """The real weight [E, N, K] in float64, decoded independently of the op's helpers."""
    if bits == 16:
        return w.double()
    e, n = w.shape[:2]
    u = torch.stack([decode_uint4(w[j]) for j in range(e)]) if bits == 4 else w.to(torch.int64)
    k = u.shape[2]
    g = torch.arange(k) // (k if group_size == -1 else group_size)
    if act_bits == 16:
        z = zeros.to(torch.int64)[:, :, g] if zeros is not None else 2 ** (bits - 1)
        return ((u - z).double() * scale.double()[:, :, g]).to(dtype).double()  # the op rounds w_hat to x.dtype
    q = u if bits == 8 else (u - 8) * (group_scale.to(torch.int64)[:, :, g] if group_scale is not None else 1)
    return q.double() * scale.double().reshape(e, n, 1)


def fake_quant_rows(t):
    """Per-row symmetric int8 in float64 (the op's quant_per_token_int8 formula)."""
    s = (t.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / 127).float().double()
    return torch.round(t / s).clamp(-128, 127) * s


def moe_float64(x, logits, top_k, renormalize, args, w13_act_perm=None):
    """The op's math in float64, token by token (h rounded to x.dtype as the op does); with
    ``w13_act_perm`` expert e's fc1 reads ``x[m, w13_act_perm[e]]``."""
    *tensors, bits, act_bits, group_size = args
    w13 = dequantize64(*tensors[:4], bits, act_bits, group_size, x.dtype)
    w2 = dequantize64(*tensors[4:], bits, act_bits, group_size, x.dtype)
    i = w13.shape[1] // 2
    weights, experts = topk_routing(logits, top_k, renormalize)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for m in range(x.shape[0]):
        xin = fake_quant_rows(x[m].double()) if act_bits == 8 else x[m].double()
        for j in range(top_k):
            e = experts[m, j]
            acc = w13[e] @ (xin if w13_act_perm is None else xin[w13_act_perm[e]])
            h = (torch.nn.functional.silu(acc[:i]) * acc[i:]).to(x.dtype).double()
            if act_bits == 8:
                h = fake_quant_rows(h)
            out[m] += weights[m, j].double() * (w2[e] @ h)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_matches_float64(fmt, dtype):
    e, h, i, top_k = 4, 64, 32, 2
    for m in (1, 2, 7, 16):
        x, logits, args = make_moe(fmt, m, h, i, e, dtype, logits_dtype=torch.float32 if m == 7 else None)
        renorm = m != 2
        out = torch.ops.qfuse.fused_moe(x, logits, top_k, renorm, *args)
        assert out.shape == (m, h) and out.dtype == dtype and out.is_contiguous()
        ref = moe_float64(x, logits, top_k, renorm, args)
        assert ref.abs().max() > 0.1
        # int8 activations: a code that rounds the other way in float32 moves one term by 1/127 of its row
        tol = (4 * torch.finfo(dtype).eps + (0.01 if args[-2] == 8 else 0)) * ref.abs().max().item()
        err = (out.double() - ref).abs().max().item()
        assert err <= tol, f"{fmt} M={m}: max error {err:.3g} > {tol:.3g}"


def test_tolerance_catches_a_nibble_swap():
    x, logits, args = make_moe("W4A16_G32", 5, 64, 32, 4, torch.bfloat16)
    ref = moe_float64(x, logits, 2, True, args)
    swapped = (((args[0] >> 4) | (args[0] << 4)).contiguous(), *args[1:])
    err = (torch.ops.qfuse.fused_moe(x, logits, 2, True, *swapped).double() - ref).abs().max()
    assert err > 4 * torch.finfo(torch.bfloat16).eps * ref.abs().max()


def test_routing_matches_hugging_face_mixtral_router():
    logits = torch.randn(9, 8).to(torch.bfloat16)
    w, e = topk_routing(logits, 2, True)
    probs = torch.softmax(logits.float(), dim=-1)  # MixtralTopKRouter.forward
    top, idx = torch.topk(probs, 2, dim=-1)
    assert torch.equal(e, idx) and torch.equal(w, top / top.sum(dim=-1, keepdim=True))
    w_plain, _ = topk_routing(logits, 2, False)
    assert torch.equal(w_plain, top)


@pytest.mark.parametrize("fmt", ["bf16", "W4A16_ASYM_CH", "W4A8_G32"])
def test_edge_routing(fmt):
    """M = 1 (most experts get nothing), every token to one expert, top_k = 1 and top_k = E."""
    e, h, i = 4, 64, 32
    x, logits, args = make_moe(fmt, 1, h, i, e, torch.bfloat16)
    out = torch.ops.qfuse.fused_moe(x, logits, 1, False, *args)
    assert torch.allclose(out.double(), moe_float64(x, logits, 1, False, args), rtol=0.02, atol=0.02 * out.abs().max().item())
    x, logits, args = make_moe(fmt, 6, h, i, e, torch.bfloat16)
    logits[:, 2] = 30.0  # all tokens to expert 2 first
    for top_k in (1, 2, e):
        out = torch.ops.qfuse.fused_moe(x, logits, top_k, True, *args)
        ref = moe_float64(x, logits, top_k, True, args)
        assert (out.double() - ref).abs().max() <= 0.02 * ref.abs().max()


def test_empty_batch_and_zero_tokens():
    x, logits, args = make_moe("W8A8", 0, 64, 32, 4, torch.float16)
    assert torch.ops.qfuse.fused_moe(x, logits, 2, True, *args).shape == (0, 64)
    x, logits, args = make_moe("W4A8", 3, 64, 32, 4, torch.float16)
    x[1] = 0  # the per-token scale's floor keeps 0/0 out
    out = torch.ops.qfuse.fused_moe(x, logits, 2, True, *args)
    assert torch.isfinite(out).all() and not out[1].any()


@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck(fmt):
    x, logits, args = make_moe(fmt, 3, 64, 32, 4, torch.bfloat16)
    torch.library.opcheck(torch.ops.qfuse.fused_moe.default, (x, logits, 2, True, *args))


def test_compiles_with_the_format_as_symbolic_ints():
    """One compiled function called with two formats: Dynamo makes the changed int arguments
    symbolic, and the fake kernel must take them (SymInts do not hash)."""
    torch._dynamo.reset()
    call = torch.compile(lambda x, logits, *args: torch.ops.qfuse.fused_moe(x, logits, 2, True, *args), fullgraph=True, backend="aot_eager")
    for fmt in ("W4A16_G32", "W8A16_ASYM_G32", "W4A16_G32"):
        x, logits, args = make_moe(fmt, 3, 64, 32, 4, torch.bfloat16)
        assert torch.equal(call(x, logits, *args), torch.ops.qfuse.fused_moe(x, logits, 2, True, *args)), fmt


def _args(fmt="W4A16_G32", m=3, h=64, i=32, e=4, dtype=torch.float16):
    x, logits, args = make_moe(fmt, m, h, i, e, dtype)
    return [x, logits, 2, True, *args]


def _replace(args, index, value):
    args = list(args)
    args[index] = value
    return args


# argument positions: x 0, logits 1, top_k 2, renormalize 3, w13 4, w13_scale 5, w13_zeros 6, w13_group_scale 7,
# w2 8, w2_scale 9, w2_zeros 10, w2_group_scale 11, weight_bits 12, act_bits 13, group_size 14
BAD = [
    (lambda a: _replace(a, 0, a[0].float()), TypeError, "fused_moe: x must be float16 or bfloat16"),
    (lambda a: _replace(a, 0, a[0][None]), ValueError, "x must be 2-D"),
    (lambda a: _replace(a, 1, a[1][:2]), ValueError, r"router_logits must have shape \(3, 4\)"),
    (lambda a: _replace(a, 1, a[1].to(torch.int32)), TypeError, "router_logits must be float16 or bfloat16 or float32"),
    (lambda a: _replace(a, 2, 5), ValueError, r"top_k must be in \[1, E=4\], got 5"),
    (lambda a: _replace(a, 2, 0), ValueError, r"top_k must be in \[1, E=4\], got 0"),
    (lambda a: _replace(a, 13, 4), ValueError, r"\(weight_bits, act_bits\) must be one of"),
    (lambda a: _replace(a, 14, 128), ValueError, "group_size=128 must divide both H=64"),
    (lambda a: _replace(a, 14, 48), ValueError, r"group_size must be one of \[-1, 128, 64, 32\]"),
    (lambda a: _replace(a, 4, a[4][:3]), ValueError, "w13 holds 3 experts but router_logits has E=4"),
    (lambda a: _replace(a, 4, a[4].view(torch.int8)), TypeError, "w13 must be uint8"),
    (lambda a: _replace(a, 8, a[8][:, :, :8].contiguous()), ValueError, r"w2 must have shape \(4, 64, 16\)"),
    (lambda a: _replace(a, 8, a[8].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "w2 must be contiguous"),
    (lambda a: _replace(a, 5, None), ValueError, "w13_scale is required for W4A16"),
    (lambda a: _replace(a, 5, a[5].float()), TypeError, "w13_scale must be float16"),
    (lambda a: _replace(a, 9, a[9][:, :32].contiguous()), ValueError, r"w2_scale must have shape \(4, 64, 1\)"),
    (lambda a: _replace(a, 7, torch.ones(4, 64, 2, dtype=torch.int8)), ValueError, "w13_group_scale must be None for W4A16"),
    (lambda a: _replace(a, 10, torch.zeros(4, 32, 1, dtype=torch.uint8)), ValueError, r"w2_zeros must have shape \(4, 64, 1\)"),
    (lambda a: _replace(a, 6, torch.full((4, 64, 2), 16, dtype=torch.uint8)), ValueError, r"w13_zeros: 512 values outside \[0, 16\)"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_rejects_bad_input(case):
    make, err, match = BAD[case]
    with pytest.raises(err, match=match):
        torch.ops.qfuse.fused_moe(*make(_args()))


def test_rejects_bad_int8_formats():
    a = _args("W4A8_G32")
    with pytest.raises(ValueError, match="group_size=32 needs w13_group_scale"):
        torch.ops.qfuse.fused_moe(*_replace(a, 7, None))
    with pytest.raises(ValueError, match="w2_zeros must be None for W4A8"):
        torch.ops.qfuse.fused_moe(*_replace(a, 10, torch.zeros(4, 64, 1, dtype=torch.uint8)))
    with pytest.raises(ValueError, match=r"w2_group_scale: \d+ values outside \[1, 17\)"):
        torch.ops.qfuse.fused_moe(*_replace(a, 11, torch.zeros_like(a[11])))
    a = _args("W8A8")
    with pytest.raises(TypeError, match="w13 must be int8"):
        torch.ops.qfuse.fused_moe(*_replace(a, 4, a[4].view(torch.uint8)))
    with pytest.raises(ValueError, match=r"group_size must be one of \[-1\] for W8A8"):
        torch.ops.qfuse.fused_moe(*_replace(a, 14, 32))
    with pytest.raises(ValueError, match=r"w13_scale must have shape \(4, 64\)"):
        torch.ops.qfuse.fused_moe(*_replace(a, 5, a[5][:, :32].contiguous()))
    a = _args("bf16", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="w13_scale must be None for bf16/fp16"):
        torch.ops.qfuse.fused_moe(*_replace(a, 5, torch.ones(4, 64)))
    with pytest.raises(TypeError, match="w13 must be bfloat16"):
        torch.ops.qfuse.fused_moe(*_replace(a, 4, a[4].half()))


@pytest.mark.parametrize("fmt", ["W4A16_G32", "W8A16_ASYM_G32", "W4A16_ASYM_CH"])
def test_act_order_reference_matches_float64(fmt):
    e, h, i = 4, 64, 32
    for m in (1, 7, 16):
        x, logits, args = make_moe(fmt, m, h, i, e, torch.bfloat16)
        perm = random_act_perm(e, h, m)
        out = torch.ops.qfuse.fused_moe(x, logits, 2, True, *args, perm)
        ref = moe_float64(x, logits, 2, True, args, perm)
        err, scale = (out.double() - ref).abs().max().item(), ref.abs().max().item()
        assert err <= 4 * torch.finfo(torch.bfloat16).eps * scale, f"{fmt} M={m}: {err:.3g}"
        # the permutation matters: reading x in natural order is far off
        assert (torch.ops.qfuse.fused_moe(x, logits, 2, True, *args).double() - ref).abs().max() > 0.1 * scale


def test_act_order_opcheck():
    x, logits, args = make_moe("W4A16_G32", 3, 64, 32, 4, torch.bfloat16)
    torch.library.opcheck(torch.ops.qfuse.fused_moe.default, (x, logits, 2, True, *args, random_act_perm(4, 64)))


def test_act_order_rejects_bad_permutations():
    a = _args()
    perm = random_act_perm(4, 64)
    with pytest.raises(ValueError, match=r"w13_act_perm must have shape \(4, 64\)"):
        torch.ops.qfuse.fused_moe(*a, perm[:, :32].contiguous())
    with pytest.raises(TypeError, match="w13_act_perm must be int64"):
        torch.ops.qfuse.fused_moe(*a, perm.int())
    twice = perm.clone()
    twice[2, 0] = twice[2, 1]
    with pytest.raises(ValueError, match=r"w13_act_perm\[2\] is not a permutation of 0..63"):
        torch.ops.qfuse.fused_moe(*a, twice)
    for fmt in ("W8A8", "W4A8_G32", "bf16"):
        with pytest.raises(ValueError, match="w13_act_perm must be None for .*act-order applies to weight-only quantized experts"):
            torch.ops.qfuse.fused_moe(*_args(fmt, dtype=torch.bfloat16), perm)

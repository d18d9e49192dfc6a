"""The Triton kernels of ``qfuse::fused_moe`` against its reference kernel.

CPU (CI): the launchers run under the Triton interpreter on small shapes with small tiles.
GPU (``pytest -m gpu``): a grid of formats x M through the registered CUDA kernel, and
CUDA-graph capture.

Tolerance of float outputs: ``|out - ref| <= 4 * eps(dtype) * max|ref|``. The kernels differ
from the reference by float32 summation order in the 16-bit-activation GEMMs (and, through it,
h may round to the other neighbour), far below an output ulp at the output's largest
magnitude. int8 activations: the accumulators are exact, fc2 and the top-k sum given the same
h are compared bit for bit; end to end, h's rounding (exp in float32) may move a code of the
quantized h by one, so the same bound applies there plus 1 % of max|ref| for such a flip.
"""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.moe.align import align_block_size
from qfuse.ops.moe.dispatch import candidate_configs, fused_moe_triton, run_fused_moe
from qfuse.ops.moe.fused_moe import expert_matmul, fused_moe_ref, silu_and_mul, sum_topk
from qfuse.ops.moe.grouped_gemm import moe_gemm, moe_sum
from qfuse.ops.moe.routing import topk_routing
from qfuse.ops.quant_int8 import quant_per_token_int8_ref
from tests.ops.moe.test_fused_moe import FORMATS, make_moe

CFG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}


def assert_close_to_ref(out, ref, int8_act):
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.is_contiguous()
    assert ref.abs().max() > 0
    scale = ref.float().abs().max().item()
    tol = (4 * torch.finfo(ref.dtype).eps + (0.01 if int8_act else 0)) * scale
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= tol, f"max error {err:.3g} > tolerance {tol:.3g}"


def assert_replay_equals_eager(call):
    """``call()`` eagerly (compiles and picks outside the capture), then captured in a CUDA graph and
    replayed: the same bits."""
    eager = call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def run_kernel(x, logits, top_k, renormalize, args, cfg=CFG):
    weights, experts = topk_routing(logits, top_k, renormalize)
    return run_fused_moe(cfg, x, weights, experts, *args)


# ---------------------------------------------------------------- CPU: Triton interpreter

# (format, M, dtype, H, I, E, top_k): each format once, the decode Ms and odd shapes spread over them
CASES = [
    ("bf16", 7, torch.bfloat16, 80, 48, 4, 2),  # K tails (80, 48 are not multiples of 32) and a partial N tile
    ("W8A16", 1, torch.float16, 64, 32, 8, 2),  # M = 1: six of eight experts get nothing
    ("W8A16_ASYM_G32", 2, torch.bfloat16, 64, 32, 4, 1),  # top_k = 1
    ("W4A16_G32", 16, torch.float16, 96, 64, 4, 3),
    ("W4A16_ASYM_CH", 7, torch.bfloat16, 72, 40, 5, 2),  # per channel with K tails
    ("W8A8", 2, torch.float16, 80, 48, 4, 2),
    ("W4A8", 16, torch.bfloat16, 64, 32, 4, 2),
    ("W4A8_G32", 7, torch.float16, 96, 64, 3, 2),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_reference(case):
    fmt, m, dtype, h, i, e, top_k = case
    x, logits, args = make_moe(fmt, m, h, i, e, dtype)
    out = run_kernel(x, logits, top_k, m != 2, args)
    assert_close_to_ref(out, fused_moe_ref(x, logits, top_k, m != 2, *args), FORMATS[fmt][1] == 8)


@pytest.mark.parametrize("fmt", ["W4A16_G32", "W4A8"])
def test_all_tokens_to_one_expert(fmt):
    x, logits, args = make_moe(fmt, 16, 64, 32, 4, torch.bfloat16)
    logits[:, 1] = 30.0  # every token's first choice; 16 rows fill one block exactly
    for top_k in (1, 2):
        out = run_kernel(x, logits, top_k, True, args)
        assert_close_to_ref(out, fused_moe_ref(x, logits, top_k, True, *args), FORMATS[fmt][1] == 8)


def test_group_128():
    """The issue's group size (H = I = 128: BLOCK_K 64 inside one group)."""
    for fmt in ("W4A16_ASYM_CH", "W4A8"):
        bits, act_bits, _, _ = FORMATS[fmt]
        x, logits, args = make_moe(fmt, 2, 128, 128, 4, torch.bfloat16)
        if act_bits == 8:  # W4A8 group 128: regroup the per-channel weight
            args = (
                *args[:3],
                torch.randint(1, 17, (4, 256, 1), dtype=torch.int8),
                *args[4:7],
                torch.randint(1, 17, (4, 128, 1), dtype=torch.int8),
                bits,
                act_bits,
                128,
            )
        else:
            args = (args[0], args[1][:, :, :1].contiguous(), args[2][:, :, :1].contiguous(), None,
                    args[4], args[5][:, :, :1].contiguous(), args[6][:, :, :1].contiguous(), None, bits, act_bits, 128)  # fmt: skip
        out = run_kernel(x, logits, 2, True, args, {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64})
        assert_close_to_ref(out, fused_moe_ref(x, logits, 2, True, *args), act_bits == 8)


def _pair_hidden(x, experts, args):
    """h [pairs, I] in pair order, as the reference computes it per expert."""
    *t, bits, act_bits, group = args
    i = t[0].shape[1] // 2
    a1, s1 = quant_per_token_int8_ref(x) if act_bits == 8 else (x, None)
    h = torch.empty(experts.numel(), i, dtype=x.dtype)
    for p, e in enumerate(experts.reshape(-1).tolist()):
        rows = [p // experts.shape[1]]
        acc = expert_matmul(
            a1[rows], None if s1 is None else s1[rows], t[0][e], *(None if v is None else v[e] for v in t[1:4]), bits, act_bits, group
        )
        h[p] = silu_and_mul(acc[:, :i], acc[:, i:]).to(x.dtype)[0]
    return h


@pytest.mark.parametrize("fmt", ["W8A8", "W4A8_G32"])
def test_int8_fc2_and_topk_sum_bit_exact(fmt):
    """Given the same h, fc2's exact int32 accumulator, its float epilogue and the ordered top-k sum
    equal the reference bit for bit; fc1's h agrees to one rounding of exp."""
    x, logits, args = make_moe(fmt, 7, 64, 32, 4, torch.float16)
    *t, bits, act_bits, group = args
    weights, experts = topk_routing(logits, 3, True)
    route = align_block_size(experts, 4, 16)
    xq, xs = quant_per_token_int8_ref(x)
    h = moe_gemm(xq, xs, t[0], t[1], None, t[3], None, *route, 21, 3, True, bits, act_bits, group, CFG, x.dtype)
    h_ref = _pair_hidden(x, experts, args)
    torch.testing.assert_close(h, h_ref, rtol=2 * torch.finfo(x.dtype).eps, atol=0)
    hq, hs = quant_per_token_int8_ref(h_ref)
    y = moe_gemm(hq, hs, t[4], t[5], None, t[7], weights.contiguous(), *route, 21, 1, False, bits, act_bits, group, CFG, x.dtype)
    y_ref = torch.cat([expert_matmul(hq[p : p + 1], hs[p : p + 1], t[4][e], t[5][e], None, None if t[7] is None else t[7][e], bits, act_bits, group)
                       for p, e in enumerate(experts.reshape(-1).tolist())]) * weights.reshape(-1, 1)  # fmt: skip
    assert torch.equal(y, y_ref)
    assert torch.equal(moe_sum(y, 3, x.dtype), sum_topk(y_ref.reshape(7, 3, -1), x.dtype))


def test_entry_point_picks_a_config_and_runs():
    """fused_moe_triton: routing, pick_config (off CUDA: the heuristic's first), the launches."""
    x, logits, args = make_moe("W4A16_G32", 3, 64, 32, 4, torch.bfloat16)
    out = fused_moe_triton(x, logits, 2, True, *args)
    assert_close_to_ref(out, fused_moe_ref(x, logits, 2, True, *args), False)


def test_a_cached_pick_without_a_meta_parameter_is_chosen_again(tmp_path, monkeypatch, caplog):
    """A user-cache pick of the grouped kernel that lacks BLOCK_K (which the launch reads): a warning and
    the heuristic's config, not a KeyError at every call."""
    import json

    from qfuse.ops import _autotune
    from qfuse.ops.moe.dispatch import OP, config_key

    for name in ("_memory", "_checked", "_refused", "_untuned"):
        monkeypatch.setattr(_autotune, name, {})
    monkeypatch.setattr(_autotune, "_loaded_files", set())
    cache = tmp_path / "autotune.json"
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(cache))
    x, logits, args = make_moe("W4A16_G32", 3, 64, 32, 4, torch.bfloat16)
    stale = {"kernel": "grouped", "BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    key = _autotune._key_str(OP, ("cpu", *config_key(3, 4, 32, 64, 2, 4, 16, 32, torch.bfloat16)))
    cache.write_text(json.dumps({key: stale}))
    with pytest.raises(KeyError, match="BLOCK_K"):  # what the stale pick does when run
        run_fused_moe(stale, x, *topk_routing(logits, 2, True), *args)
    with caplog.at_level("WARNING", logger="qfuse.autotune"):
        out = fused_moe_triton(x, logits, 2, True, *args)
    assert "(it lacks BLOCK_K, which its kernel reads); choosing again" in caplog.text
    assert_close_to_ref(out, fused_moe_ref(x, logits, 2, True, *args), False)


@pytest.mark.parametrize("m", [1, 16, 64, 1024, 4096])
def test_configs_by_m_bucket(m):
    every = candidate_configs(m, 14336, 4096, 4, 128, torch.bfloat16)
    cands = [c for c in every if c["kernel"] == "grouped"]
    assert cands and {c["kernel"] for c in every} == (
        {"grouped", "gemv", "gemv_words", "grouped_words"} if m <= 16 else {"grouped", "grouped_words"} if m <= 64 else {"grouped"}
    )
    block_m = {c["BLOCK_M"] for c in cands}
    assert (block_m == {16}) == (m <= 32)
    assert max(block_m) >= (64 if m >= 1024 else 16)


# ---------------------------------------------------------------- GPU

GPU_FORMATS = ["bf16", "W8A16", "W4A16_ASYM_G128", "W4A16_G128", "W8A8", "W4A8", "W4A8_G128"]


def _gpu_moe(fmt, m, h, i, e, dtype, device="cuda"):
    base = fmt.replace("G128", "G32").replace("W4A16_ASYM_G32", "W4A16_ASYM_CH")
    x, logits, args = make_moe(base, m, h, i, e, dtype)
    bits, act_bits = FORMATS[base][:2]
    if fmt.endswith("G128"):  # rebuild the group tensors at group 128
        g = lambda n, k, hi: torch.randint(1 if hi == 17 else 0, hi, (e, n, k // 128), dtype=torch.int8 if hi == 17 else torch.uint8)  # noqa: E731
        if act_bits == 8:
            args = (*args[:3], g(2 * i, h, 17), *args[4:7], g(h, i, 17), bits, act_bits, 128)
        else:
            s13 = (torch.rand(e, 2 * i, h // 128) * 0.02 / h**0.5 + 0.005 / h**0.5).to(dtype)
            s2 = (torch.rand(e, h, i // 128) * 0.02 / i**0.5 + 0.005 / i**0.5).to(dtype)
            z = "ASYM" in fmt
            args = (args[0], s13, g(2 * i, h, 16) if z else None, None, args[4], s2, g(h, i, 16) if z else None, None, bits, act_bits, 128)
    return x.to(device), logits.to(device), tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", GPU_FORMATS)
@pytest.mark.parametrize("m", [1, 2, 7, 16, 64, 257])
@pytest.mark.parametrize("shape", [(1024, 512, 8, 2), (512, 256, 64, 8)], ids=["E8top2", "E64top8"])
def test_gpu_grid(fmt, m, shape):
    h, i, e, top_k = shape
    dtype = torch.bfloat16 if m % 2 else torch.float16
    x, logits, args = _gpu_moe(fmt, m, h, i, e, dtype)
    out = torch.ops.qfuse.fused_moe(x, logits, top_k, True, *args)
    ref = fused_moe_ref(x, logits, top_k, True, *args)
    assert_close_to_ref(out, ref, args[-2] == 8)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["W4A16_G128", "W4A8"])
def test_gpu_cuda_graph_capture(fmt):
    x, logits, args = _gpu_moe(fmt, 4, 1024, 512, 8, torch.bfloat16)
    assert_replay_equals_eager(lambda: torch.ops.qfuse.fused_moe(x, logits, 2, True, *args))

"""The tensor-core word family of ``qfuse::fused_moe`` (ops/moe/grouped_words.py) against the op's
reference, under the Triton interpreter (CPU, CI): group 128 symmetric and with zero points,
per channel with zero points, groups of 32 (``SCALE_W``), K splits, blocks of 16 and 32 rows,
decode M, idle experts, all tokens to one expert (several blocks of one expert), the opt-in forms
(``X_WORDS``: the activations in the MMA's k order, bit-equal to the plain form; ``FOLD_ZERO``: the
zero point taken off each tile's dot); on the GPU every config at decode M and a CUDA-graph capture. Tolerance as in test_grouped_gemm.py."""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.kernel_family import Problem
from qfuse.ops.moe.dispatch import REGISTRY, candidate_configs
from qfuse.ops.moe.fused_moe import fused_moe_ref
from qfuse.ops.moe.grouped_words import FAMILY, configs, run_moe_grouped_words
from qfuse.ops.moe.routing import topk_routing
from tests.ops.moe.test_grouped_gemm import _gpu_moe, assert_close_to_ref, assert_replay_equals_eager


def run_words(x, logits, top_k, renormalize, args, cfg):
    weights, experts = topk_routing(logits, top_k, renormalize)
    return run_moe_grouped_words({"kernel": "grouped_words", "num_warps": 4, **cfg}, x, weights, experts, *args)


# (format, M, dtype, H, I, E, top_k, config)
CASES = [
    ("W4A16_G128", 1, torch.bfloat16, 128, 128, 8, 2, {"BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 1}),  # six experts idle
    ("W4A16_G128", 7, torch.bfloat16, 128, 256, 4, 2, {"BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 2}),  # fc2's K split in two
    ("W4A16_ASYM_G128", 16, torch.float16, 128, 256, 4, 2, {"BLOCK_M": 32, "BLOCK_N": 64, "SPLIT_K": 1}),  # zero points per group
    ("W4A16_ASYM_CH", 2, torch.bfloat16, 128, 128, 4, 3, {"BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 1}),  # per channel, scale after the loop
    ("W4A16_G32", 7, torch.float16, 128, 128, 5, 2, {"BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 1, "SCALE_W": True}),  # groups of 32
    ("W4A16_G128", 4, torch.bfloat16, 256, 128, 4, 2, {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 1}),  # fc1's tile past its 128 rows
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-M{c[1]}" for c in CASES])
def test_kernel_matches_reference(case):
    fmt, m, dtype, h, i, e, top_k, cfg = case
    x, logits, args = _gpu_moe(fmt, m, h, i, e, dtype, device="cpu")
    out = run_words(x, logits, top_k, m != 2, args, cfg)
    assert_close_to_ref(out, fused_moe_ref(x, logits, top_k, m != 2, *args), False)


@pytest.mark.parametrize("case", CASES[1:4] + CASES[5:], ids=[f"{c[0]}-M{c[1]}" for c in CASES[1:4] + CASES[5:]])
def test_activations_in_word_order_change_nothing(case):
    """``X_WORDS``: x permuted once (``word_order``), h stored by fc1 in that order: the MMAs see the
    same operands, so the output is bit-equal to the plain form's (the interpreter's float32 dots)."""
    fmt, m, dtype, h, i, e, top_k, cfg = case
    x, logits, args = _gpu_moe(fmt, m, h, i, e, dtype, device="cpu")
    plain = run_words(x, logits, top_k, True, args, cfg)
    assert torch.equal(run_words(x, logits, top_k, True, args, {**cfg, "X_WORDS": True}), plain)


def test_fc1_stores_h_in_word_order():
    """fc1 with ``X_WORDS`` writes each 128-column tile of h in ``word_order``'s column order."""
    from qfuse.ops.moe.align import align_block_size, fc1_row_div
    from qfuse.ops.moe.grouped_words import moe_mma_words
    from qfuse.ops.wna16.tma import word_order

    x, logits, args = _gpu_moe("W4A16_G128", 3, 128, 256, 4, torch.bfloat16, device="cpu")
    weights, experts = topk_routing(logits, 2, True)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4}
    route = align_block_size(experts, 4, 16)
    h = [moe_mma_words(xx, *args[:3], None, 128, {**cfg, "X_WORDS": xw}, route, 6, fc1_row_div(x, experts), 1)
         for xw, xx in ((False, x), (True, word_order(x, 128)))]  # fmt: skip
    assert torch.equal(h[1], word_order(h[0], 128))


FOLD_CASES = [c for c in CASES if c[0] in ("W4A16_G128", "W4A16_ASYM_G128")]


@pytest.mark.parametrize("case", FOLD_CASES, ids=[f"{c[0]}-M{c[1]}" for c in FOLD_CASES])
def test_folded_zero_point_matches_reference(case):
    """``FOLD_ZERO`` (with and without ``X_WORDS``): codes as ``MAGIC + u``, ``(MAGIC + z) * sum x``
    off each tile's dot; symmetric and per-group zero points, bf16 and fp16."""
    fmt, m, dtype, h, i, e, top_k, cfg = case
    x, logits, args = _gpu_moe(fmt, m, h, i, e, dtype, device="cpu")
    ref = fused_moe_ref(x, logits, top_k, True, *args)
    for extra in ({"FOLD_ZERO": True}, {"FOLD_ZERO": True, "X_WORDS": True}):
        assert_close_to_ref(run_words(x, logits, top_k, True, args, {**cfg, **extra}), ref, False)


def test_folded_zero_point_refused_where_the_scale_is_not_per_tile():
    x, logits, args = _gpu_moe("W4A16_ASYM_CH", 2, 128, 128, 4, torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match="FOLD_ZERO needs groups of a multiple of 128"):
        run_words(x, logits, 2, True, args, {"BLOCK_M": 16, "BLOCK_N": 64, "FOLD_ZERO": True})
    p = Problem(16, 14336, 4096, 4, -1, torch.bfloat16, act_bits=16)
    assert not [c for c in configs(p, False) if "FOLD_ZERO" in c]


def test_slower_forms_are_opt_in(monkeypatch):
    """X_WORDS / FOLD_ZERO / MAXNREG are offered only with QFUSE_EXPERIMENTAL_KERNELS=1."""
    p = Problem(16, 14336, 4096, 4, 128, torch.bfloat16, act_bits=16)
    forms = ("X_WORDS", "FOLD_ZERO", "MAXNREG")
    monkeypatch.delenv("QFUSE_EXPERIMENTAL_KERNELS", raising=False)
    offered = [c for c in REGISTRY.offered(p) if c["kernel"] == "grouped_words"]
    assert offered and not [c for c in offered if any(f in c for f in forms)]
    monkeypatch.setenv("QFUSE_EXPERIMENTAL_KERNELS", "1")
    offered = [c for c in REGISTRY.offered(p) if c["kernel"] == "grouped_words"]
    assert {f for c in offered for f in forms if f in c} == set(forms)
    assert all("no faster than the plain form" in FAMILY.opt_in_reason(c) for c in offered if any(f in c for f in forms))


def test_opt_in_forms_never_write_registers_of_a_wgmma_in_flight():
    """sm_90 SASS (no GPU) of fc1's and fc2's loop for every opt-in config, g128 and per channel:
    no instruction writes a register operand of a wgmma still in flight (PTX leaves that
    undefined; ``X_WORDS`` per channel or with ``SCALE_W`` had 5-35 such writes, so it is not offered there)."""
    import json

    from tests.ops._sm90_scripts import run_sm90_script

    cases = {}
    for group in (128, -1):
        for cfg in configs(Problem(16, 14336, 4096, 4, group, torch.bfloat16, act_bits=16), False):
            if FAMILY.opt_in_reason(cfg):
                cfg = {k: v for k, v in cfg.items() if k != "SPLIT_K"}  # a launch argument, not compiled in
                cases[f"moesass,{group},{json.dumps(cfg, sort_keys=True)}"] = None
    lines = run_sm90_script("_compile_sm90.py", list(cases), processes=2).splitlines()  # CI's two cores
    assert len(lines) == 2 * len(cases) >= 16
    assert all(line.endswith(" hazards 0") for line in lines), [line for line in lines if not line.endswith(" hazards 0")]


def test_all_tokens_to_one_expert():
    """17 tokens top-1 on one expert: two blocks of 16 rows for it, the second with 15 padding rows."""
    x, logits, args = _gpu_moe("W4A16_G128", 17, 128, 128, 4, torch.bfloat16, device="cpu")
    logits[:, 3] = 30.0
    out = run_words(x, logits, 1, True, args, {"BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 1})
    assert_close_to_ref(out, fused_moe_ref(x, logits, 1, True, *args), False)


def test_offered_for_4bit_float_activations_up_to_m_64():
    for bits, act_bits, m, group, ok in [
        (4, 16, 1, 128, True),
        (4, 16, 64, -1, True),
        (4, 16, 65, 128, False),
        (8, 16, 1, 128, False),
        (4, 8, 1, 128, False),
    ]:
        supported, reason = FAMILY.supports(Problem(m, 14336, 4096, bits, group, torch.bfloat16, act_bits=act_bits))
        assert supported == ok and (ok or reason), (bits, act_bits, m, group)
    assert FAMILY.supports(Problem(1, 1408, 2048, 4, 64, torch.bfloat16, act_bits=16))[0]  # group 64: SCALE_W
    assert not FAMILY.supports(Problem(1, 1400, 2048, 4, -1, torch.bfloat16, act_bits=16))[0]  # I not a multiple of 128
    p = Problem(16, 14336, 4096, 4, 128, torch.bfloat16, act_bits=16)
    assert "grouped_words" in {c["kernel"] for c in REGISTRY.offered(p)}
    assert {c["BLOCK_M"] for c in configs(p, False)} == {16} and {c["BLOCK_M"] for c in configs(Problem(64, 14336, 4096, 4, 128), False)} == {16, 32}
    assert all(c["SCALE_W"] for c in configs(Problem(1, 1408, 2048, 4, 64, act_bits=16), False))
    assert {c["kernel"] for c in candidate_configs(4, 14336, 4096, 8, -1, torch.bfloat16)} == {"grouped", "gemv", "gemv_words"}


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["W4A16_G128", "W4A16_ASYM_G128", "W4A16_ASYM_CH"])
@pytest.mark.parametrize("m", [1, 2, 7, 16, 64])
def test_gpu_every_config(fmt, m):
    """Every config of the family (exhaustive list) at an E 8 top-2 shape (H 1024, I 512)."""
    h, i, e, top_k = 1024, 512, 8, 2
    dtype = torch.bfloat16 if m % 2 else torch.float16
    x, logits, args = _gpu_moe(fmt, m, h, i, e, dtype)
    ref = fused_moe_ref(x, logits, top_k, True, *args)
    for cfg in configs(Problem(m, i, h, 4, args[-1], dtype, act_bits=16), exhaustive=True):
        assert_close_to_ref(run_words(x, logits, top_k, True, args, cfg), ref, False)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    x, logits, args = _gpu_moe("W4A16_G128", 16, 1024, 512, 8, torch.bfloat16)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 4, "num_warps": 8, "num_stages": 4}
    assert_replay_equals_eager(lambda: run_words(x, logits, 2, True, args, cfg))

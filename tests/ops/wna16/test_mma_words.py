"""ops/wna16/mma_words.py against the reference kernel of ``qfuse::wna16_gemm``.

CPU (CI): the launcher under the Triton interpreter (the word pairs from integer and float32
ops: the interpreter cannot run inline PTX), and the kernel compiled for sm_90 with the PTX
(tests/ops/_compile_sm90.py, a subprocess). GPU (``pytest -m gpu``): the PTX pairs on real
shapes, both dtypes, every group size, zero points, extreme codes. Tolerance:
tests/ops/test_wna16_gemm_kernel.py's.
"""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.wna16.dispatch import usable_configs
from qfuse.ops.wna16.mma_words import mma_words_supported, w4a16_mma_words
from tests.ops._sm90_scripts import run_sm90_script
from tests.ops.test_wna16_gemm_kernel import assert_close_to_ref, make_problem
from tests.ops.wna16.test_tiled_planes import _codes_at_the_extremes

# (group, SCALE_W): the group scale on a 128-code tile's partial dot, or on each word's codes
FORMS = [(-1, False), (128, False), (256, False), (32, True), (64, True), (128, True)]


# ---------------------------------------------------------------- CPU: Triton interpreter


@pytest.mark.parametrize("form", range(len(FORMS)))
@pytest.mark.parametrize("m", [1, 7, 33])
@pytest.mark.parametrize("byte_pairs", [False, True])
def test_interpreter(form, m, byte_pairs):
    group_size, scale_w = FORMS[form]
    i = form + m + byte_pairs
    dtype = (torch.float16, torch.bfloat16)[i % 2]
    split_k = (1, 2, 3)[i % 3]
    x, qw, s, z, b = make_problem(m, 40, 768 if split_k == 3 else 512, 4, group_size, dtype, asym=i % 2 == 0 or form == 0, bias=i % 3 != 1)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "SPLIT_K": split_k, "SCALE_W": scale_w, "BYTE_PAIRS": byte_pairs, "GROUP_M": 2}
    assert_close_to_ref(w4a16_mma_words(x, qw, s, z, b, group_size, cfg), x, qw, s, z, b, 4, group_size)


def test_interpreter_extreme_codes():
    """|u - z| = 15 in every nibble slot, both scale placements, both pairings."""
    x, _, s, _, _ = make_problem(3, 16, 256, 4, 128, torch.bfloat16, asym=False, bias=False)
    qw, z = _codes_at_the_extremes(16, 256, 128)
    for scale_w in (False, True):
        for byte_pairs in (False, True):
            out = w4a16_mma_words(x, qw, s, z, None, 128, {"BLOCK_M": 16, "BLOCK_N": 16, "SCALE_W": scale_w, "BYTE_PAIRS": byte_pairs})
            assert_close_to_ref(out, x, qw, s, z, None, 4, 128)


@pytest.mark.parametrize("scale_w,byte_pairs", [(False, False), (True, False), (False, True)])
def test_tolerance_catches_an_unpermuted_activation(scale_w, byte_pairs):
    """The codes reach the MMA out of natural order: activations taken in natural order (the
    weights' words shuffled inside each 128-code tile the other way) must fail the check."""
    x, qw, s, z, b = make_problem(2, 32, 256, 4, 128, torch.bfloat16, asym=True, bias=False)
    words = qw.view(torch.int32).view(32, 2, 4, 4)  # [n, tile, c, q]
    shuffled = words.transpose(2, 3).contiguous().view(torch.uint8).view(qw.shape)
    with pytest.raises(AssertionError):
        assert_close_to_ref(
            w4a16_mma_words(x, shuffled, s, z, b, 128, {"BLOCK_M": 16, "BLOCK_N": 16, "SCALE_W": scale_w, "BYTE_PAIRS": byte_pairs}),
            x,
            qw,
            s,
            z,
            b,
            4,
            128,
        )


def test_unaligned_weight_storage():
    """A weight view starting at an odd byte (a slice of a larger buffer) still runs."""
    x, qw, s, z, b = make_problem(3, 16, 128, 4, -1, torch.bfloat16, asym=True, bias=False)
    buf = torch.empty(qw.numel() + 1, dtype=torch.uint8)
    shifted = buf[1:].view(qw.shape)
    shifted.copy_(qw)
    out = w4a16_mma_words(x, shifted, s, z, b, -1, {"BLOCK_M": 16, "BLOCK_N": 16})
    assert_close_to_ref(out, x, qw, s, z, b, 4, -1)


def test_supported_shapes():
    assert mma_words_supported(4096, 128, False) and mma_words_supported(4096, -1, False)
    assert mma_words_supported(4096, 32, True) and not mma_words_supported(4096, 32, False)
    assert not mma_words_supported(4096, -1, True)  # per-channel: the scale is applied once, after the loop
    assert not mma_words_supported(4160, -1, False)  # K not a whole number of 128-code tiles
    x, qw, s, z, b = make_problem(2, 16, 192, 4, 64, torch.bfloat16, asym=False, bias=False)
    with pytest.raises(ValueError, match="K % 128"):
        w4a16_mma_words(x, qw, s, z, b, 64, {"BLOCK_M": 16, "BLOCK_N": 16, "SCALE_W": True})


def test_register_capped_configs_are_opt_in(monkeypatch):
    """MAXNREG configs (never clearly faster on the H200) and BYTE_PAIRS (slower there) run only
    with QFUSE_EXPERIMENTAL_KERNELS=1."""
    monkeypatch.delenv("QFUSE_EXPERIMENTAL_KERNELS", raising=False)
    offered = [c for c in usable_configs(16, 4096, 4096, 4, 128) if c["kernel"] == "mma_words"]
    assert offered and not any("MAXNREG" in c or "BYTE_PAIRS" in c for c in offered)
    assert not any("BYTE_PAIRS" in c for c in usable_configs(16, 4096, 4096, 4, -1))
    monkeypatch.setenv("QFUSE_EXPERIMENTAL_KERNELS", "1")
    capped = [c for c in usable_configs(16, 4096, 4096, 4, 128) if c["kernel"] == "mma_words" and "MAXNREG" in c]
    assert {c["MAXNREG"] for c in capped} == {128, 80}
    x, qw, s, z, b = make_problem(3, 40, 256, 4, 128, torch.bfloat16, asym=True, bias=True)  # a ptxas option: no-op here
    assert_close_to_ref(w4a16_mma_words(x, qw, s, z, b, 128, {**capped[0], "BLOCK_N": 16}), x, qw, s, z, b, 4, 128)


def test_ptx_compiles_for_sm90():
    """The inline PTX assembles for Hopper with the installed Triton: dtype x SCALE_W x zero
    points x group form, in a covering set."""
    cases = [
        "mma,bf16,128,0,0",
        "mma,bf16,-1,1,0",
        "mma,fp16,128,1,0",
        "mma,fp16,-1,0,0",
        "mma,bf16,32,1,1",
        "mma,bf16,128,0,1",
        "mma,fp16,64,0,1",
        "mma,fp16,128,1,1",
        "mma,bf16,-1,1,0,1",
        "mma,fp16,128,0,0,1",
        "mma,bf16,64,1,1,1",
        "mma,fp16,128,1,1,1",
    ]  # BYTE_PAIRS
    assert run_sm90_script("_compile_sm90.py", cases).count("compiled") == len(cases)


# ---------------------------------------------------------------- GPU: the PTX pairs

GPU_CFGS = [
    {"BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 4, "num_warps": 8, "num_stages": 4},
    {"BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 32, "BLOCK_N": 128, "SPLIT_K": 2, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 256, "SPLIT_K": 3, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 2, "num_warps": 4, "num_stages": 4, "MAXNREG": 128},
    {"BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 4, "num_warps": 8, "num_stages": 4, "BYTE_PAIRS": True},
    {"BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3, "BYTE_PAIRS": True},
]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", range(len(GPU_CFGS)))
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("asym", [False, True])
def test_gpu_configs(cfg, group_size, dtype, asym):
    for scale_w in (False, True):
        if not mma_words_supported(4096, group_size, scale_w):
            continue
        for m, (n, k) in ((1, (4096, 4096)), (7, (4000, 4096)), (16, (1000, 2944)), (50, (6144, 14336))):
            x, qw, s, z, b = make_problem(m, n, k, 4, group_size, dtype, asym, bias=m % 2 == 1, device="cuda")
            out = w4a16_mma_words(x, qw, s, z, b, group_size, {**GPU_CFGS[cfg], "SCALE_W": scale_w})
            assert_close_to_ref(out, x, qw, s, z, b, 4, group_size)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale_w", [False, True])
def test_gpu_extreme_codes(dtype, scale_w):
    x, _, s, _, _ = make_problem(5, 256, 512, 4, 128, dtype, asym=False, bias=False, device="cuda")
    qw, z = _codes_at_the_extremes(256, 512, 128)
    out = w4a16_mma_words(x, qw.cuda(), s, z.cuda(), None, 128, {**GPU_CFGS[0], "SCALE_W": scale_w})
    assert_close_to_ref(out, x, qw.cuda(), s, z.cuda(), None, 4, 128)

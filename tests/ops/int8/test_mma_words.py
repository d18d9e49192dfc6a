"""ops/int8/mma_words.py against the reference kernel of ``qfuse::w4a8_gemm``, bit for bit.

CPU (CI): the launcher under the Triton interpreter (the nibble unpack in int8 ops: the
interpreter cannot run inline PTX), and the kernel compiled for sm_90 (a subprocess: the PTX
assembles and the MMA is the int8 wgmma). GPU (``pytest -m gpu``): every candidate config on
the five shapes and the odd ones, per-channel and group 128.
"""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.int4_packing import pack_int4
from qfuse.ops.int8.dispatch import candidate_configs, is_experimental
from qfuse.ops.int8.mma_words import mma_words_configs, mma_words_supported, run_w4a8_mma_words
from qfuse.ops.w4a8_gemm import w4a8_gemm_ref
from tests.ops._sm90_scripts import run_sm90_script
from tests.ops.test_w4a8_gemm_kernel import ODD_SHAPES, fake_quant_check, make_w4a8
from tests.ops.test_w8a8_gemm_kernel import SHAPES, assert_bitwise


def _cfg(bm=16, bn=32, split=1, **kw):
    return {"kernel": "mma_words", "BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": split, **kw}


# ---------------------------------------------------------------- CPU: Triton interpreter

# (group, GS_FOLD): per-channel; group 128 on the tile's partial; group 128 in the int8 operand
FORMS = [(-1, 0), (128, 0), (128, 1)]


@pytest.mark.parametrize("m", [1, 2, 7, 16, 33])
@pytest.mark.parametrize("form", range(len(FORMS)))
@pytest.mark.parametrize("split_k", [1, 3])
def test_interpreter_matches_reference(m, form, split_k):
    group_size, fold = FORMS[form]
    i = m + split_k + form
    out_dtype = (torch.bfloat16, torch.float16)[i % 2]
    args = make_w4a8(m, 40, 384, group_size, per_token=i % 3 != 0, bias=i % 2 == 0, out_dtype=out_dtype)
    out = run_w4a8_mma_words(*args, out_dtype, config=_cfg(bm=32 if m == 33 else 16, split=split_k, GS_FOLD=fold))
    assert_bitwise(out, w4a8_gemm_ref(*args, group_size, out_dtype))
    fake_quant_check(out, *args, group_size)


@pytest.mark.parametrize("case", range(5))
def test_interpreter_stream_k(case):
    """Stream-K: programs that share a tile (first, middle and last shares, tiles split 1-3 ways,
    programs spanning a tile boundary, more programs than units) add up to the reference bits."""
    m, n, k, group_size, per_sm, sms = [
        (1, 72, 384, -1, 1, 5),
        (3, 96, 512, 128, 2, 7),
        (17, 64, 256, 128, 1, 3),
        (2, 40, 1024, -1, 3, 11),
        (1, 32, 128, -1, 1, 9),
    ][case]
    args = make_w4a8(m, n, k, group_size, per_token=case != 1, bias=case % 2 == 0)
    ref = w4a8_gemm_ref(*args, group_size, torch.bfloat16)
    for fold in (0, 1) if group_size == 128 else (0,):
        cfg = {
            "kernel": "mma_words",
            "BLOCK_M": 32 if m > 16 else 16,
            "BLOCK_N": 16 if case == 3 else 32,
            "STREAM": per_sm,
            "SMS": sms,
            "GS_FOLD": fold,
        }
        assert_bitwise(run_w4a8_mma_words(*args, torch.bfloat16, config=cfg), ref)


def test_interpreter_accumulator_at_its_bound():
    """q = -8 (u = 0) times group scale 16 against xq = -128 in every slot: |acc| = K * 2**14,
    the op's bound, through the per-tile group-scale multiply."""
    k = 1024
    xq = torch.full((2, k), -128, dtype=torch.int8)
    codes = torch.zeros((32, k), dtype=torch.uint8)
    codes[1::2] = 15  # q = 7
    gs = torch.full((32, k // 128), 16, dtype=torch.int8)
    one = torch.ones(1)
    for fold in (0, 1):  # w_int = -128 (u = 0, gs = 16) is the int8 edge of the folded operand
        out = run_w4a8_mma_words(xq, one, pack_int4(codes), one, gs, None, torch.float32, config=_cfg(split=2, GS_FOLD=fold))
        assert torch.equal(out, w4a8_gemm_ref(xq, one, pack_int4(codes), one, gs, None, 128, torch.float32))
        assert out.abs().max() == k * 2**14


def test_supported_shapes_and_errors():
    assert mma_words_supported(4096) and mma_words_supported(14336, 7) and not mma_words_supported(14336, 9)  # 112 tiles
    assert not mma_words_supported(4104)
    args = make_w4a8(2, 16, 256 + 64, -1)
    with pytest.raises(ValueError, match="K % 128"):
        run_w4a8_mma_words(*args, torch.bfloat16, config=_cfg())


def test_candidates_for_decode_only():
    """Offered (W4A8 on a GPU) at M <= 64 with whole 128-code tiles per split, not beyond."""
    for m in (1, 16, 64):
        cfgs = [c for c in candidate_configs(m, 4096, 14336, 128, 132, w4=True, gpu=True) if c["kernel"] == "mma_words"]
        assert cfgs == [dict(c, kernel="mma_words") for c in mma_words_configs(m, 4096, 14336, 132, 128)] and cfgs
        assert sum(c.get("GS_FOLD", 0) for c in cfgs) * 2 == len(cfgs)  # each tile with and without the folded scale
        assert not any(c.get("GS_FOLD") for c in mma_words_configs(m, 4096, 14336, 132, -1))
        assert all(mma_words_supported(14336, c.get("SPLIT_K", 1)) and c["BLOCK_M"] == max(16, m) for c in cfgs)
        assert any(c.get("STREAM") for c in cfgs) == (m <= 16)
        assert all(is_experimental(c) == bool(c.get("STREAM")) for c in cfgs)  # stream-K: opt-in (slower on the H200)
    assert mma_words_configs(128, 4096, 4096, 132) == [] and mma_words_configs(16, 4096, 4104, 132) == []
    assert not any(c["kernel"] == "mma_words" for c in candidate_configs(16, 4096, 4096, 128, 132, w4=True, gpu=False))  # no PTX: the interpreter


def test_compiles_to_int8_wgmma_for_sm90():
    """The inline PTX assembles for Hopper with the installed Triton, and the MMA is the int8
    wgmma with the tokens as its N side (not a fallback to mma.sync)."""
    cases = [
        "w4a8mw,-1,0,16,128,4",
        "w4a8mw,128,1,16,128,8",
        "w4a8mw,128,0,32,64,4",
        "w4a8mw,-1,1,64,256,8",
        "w4a8mw,128,1,16,64,4,1",
        "w4a8mw,128,0,64,128,8,1",  # GS_FOLD
        "w4a8mw,-1,0,16,128,8,0,1",
        "w4a8mw,128,0,16,64,4,1,1",
    ]  # stream-K
    out = run_sm90_script("_compile_sm90.py", cases)
    for case, n in zip(cases, (16, 16, 32, 64, 16, 64, 16, 16)):
        assert f"compiled {case} mma m64n{n}k32.s32.s8.s8" in out


# ---------------------------------------------------------------- GPU: the PTX unpack


@pytest.mark.gpu
@pytest.mark.parametrize("group_size", [-1, 128])
@pytest.mark.parametrize("m", [1, 2, 7, 16, 33, 64])
@pytest.mark.parametrize("n,k", SHAPES + ODD_SHAPES)
def test_gpu_every_config(n, k, m, group_size):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out_dtype = (torch.bfloat16, torch.float16)[m % 2]
    args = make_w4a8(m, n, k, group_size, device="cuda", per_token=m != 7, bias=m % 2 == 1, out_dtype=out_dtype)
    ref = w4a8_gemm_ref(*args, group_size, out_dtype)
    cfgs = mma_words_configs(m, n, k, sms, group_size)
    assert cfgs
    for cfg in cfgs:
        assert_bitwise(run_w4a8_mma_words(*args, out_dtype, config=cfg), ref)

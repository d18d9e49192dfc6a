"""ops/wna16/tma.py against the reference kernel of ``qfuse::wna16_gemm``.

CPU (CI): the launcher under the Triton interpreter (TMA descriptors interpreted, nibble planes
from integer ops), and the kernel compiled for sm_90 with its PTX (tests/ops/_compile_sm90.py).
GPU (``pytest -m gpu``): the PTX planes through real TMA descriptors at the issue's shapes, every
dispatcher config of the family, extreme codes. Tolerance: tests/ops/test_wna16_gemm_kernel.py's.
"""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.wna16.dispatch import candidate_configs, is_experimental, usable_configs
from qfuse.ops.wna16.tma import tma_supported, wna16_tma, word_order, word_order_triton
from tests.ops._sm90_scripts import run_sm90_script
from tests.ops.test_wna16_gemm_kernel import assert_close_to_ref, make_problem
from tests.ops.wna16.test_tiled_planes import _codes_at_the_extremes

CFG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64}


# ---------------------------------------------------------------- CPU: Triton interpreter


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size,split_k", [(-1, 1), (32, 1), (64, 2), (-1, 3), (128, 2)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("asym", [False, True])
def test_interpreter(bits, group_size, split_k, dtype, asym):
    # M and N not multiples of the tile (M = 21, N = 40: 2 x 2 tiles, the last of each partial; TMA
    # zero-fills, the store masks); per-channel K = 160 ends in a partial BLOCK_K tile; split 3 of it
    # ends in a split with a tile wholly past K
    k = 160 if group_size == -1 else 256
    x, qw, s, z, b = make_problem(21, 40, k, bits, group_size, dtype, asym, bias=asym != (split_k == 2))
    out = wna16_tma(x, qw, s, z, b, bits, group_size, {**CFG, "SPLIT_K": split_k})
    assert_close_to_ref(out, x, qw, s, z, b, bits, group_size)


@pytest.mark.parametrize(
    "bits,group_size,asym,wave,tail_split",
    [(4, -1, True, 4, 2), (4, 64, False, 5, 3), (8, 32, True, 4, 2), (8, -1, False, 7, 2), (4, 128, True, 6, 2)],
)
def test_interpreter_tail_split(bits, group_size, asym, wave, tail_split):
    """TAIL_SPLIT: 6 tiles, waves of ``wave`` programs: the tiles past the last whole wave run as
    ``tail_split`` K slices (wave 7: no whole wave, every tile is split; wave 6: no tail, plain)."""
    k = 160 if group_size == -1 else 256
    x, qw, s, z, b = make_problem(37, 40, k, bits, group_size, torch.bfloat16, asym, bias=asym)
    cfg = {**CFG, "TAIL_SPLIT": tail_split, "WAVE_PROGRAMS": wave}
    for _ in range(2):  # the arrival counters are left zeroed for the next call
        assert_close_to_ref(wna16_tma(x, qw, s, z, b, bits, group_size, cfg), x, qw, s, z, b, bits, group_size)


def _codes8_at_the_extremes(n, k, group_size):
    """8-bit codes 0 or 255 and zero points at the other end: |u - z| = 255, the most bf16 holds exactly."""
    qw = torch.randint(0, 2, (n, k), dtype=torch.uint8) * 255
    return qw, (255 - qw[:, ::group_size]).contiguous()


@pytest.mark.parametrize("bits", [4, 8])
def test_interpreter_extreme_codes(bits):
    x, _, s, _, _ = make_problem(3, 16, 256, bits, 128, torch.bfloat16, asym=False, bias=False)
    qw, z = (_codes_at_the_extremes if bits == 4 else _codes8_at_the_extremes)(16, 256, 128)
    assert_close_to_ref(wna16_tma(x, qw, s, z, None, bits, 128, CFG), x, qw, s, z, None, bits, 128)


def test_tolerance_catches_swapped_nibbles():
    x, qw, s, z, b = make_problem(5, 32, 128, 4, 64, torch.bfloat16, asym=True, bias=False)
    swapped = ((qw >> 4) | (qw << 4)).contiguous()  # even and odd k exchanged
    with pytest.raises(AssertionError):
        assert_close_to_ref(wna16_tma(x, swapped, s, z, b, 4, 64, CFG), x, qw, s, z, b, 4, 64)


@pytest.mark.parametrize("group_size,split_k,block_k", [(-1, 1, 64), (32, 2, 32), (64, 1, 64), (128, 2, 128), (128, 3, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("asym", [False, True])
def test_interpreter_words(group_size, split_k, block_k, dtype, asym):
    """WORDS: int32 words in wgmma's lane order against activations permuted the same (4-bit; M and
    N past the tile: M = 21, N = 40, split 3 with a slice wholly past K)."""
    x, qw, s, z, b = make_problem(21, 40, 256, 4, group_size, dtype, asym, bias=asym)
    out = wna16_tma(x, qw, s, z, b, 4, group_size, {**CFG, "BLOCK_K": block_k, "SPLIT_K": split_k, "WORDS": True})
    assert_close_to_ref(out, x, qw, s, z, b, 4, group_size)


def test_word_order_is_mma_words_order():
    """word_order at BLOCK_K = 128 is ops/wna16/mma_words.py's in-kernel activation permutation
    (natural k = 32c + 8q + 4e + 2sl + h -> k' = 32q + 16sl + 8h + 2c + e); at 64, the same with two
    words per lane; a permutation of each tile's columns."""
    x = torch.arange(2 * 256, dtype=torch.float32).reshape(2, 256)
    mma_words = x.reshape(2, 2, 4, 4, 2, 2, 2).permute(0, 1, 3, 5, 6, 2, 4).reshape(2, 256)  # [m, tile, q, sl, h, c, e]
    assert torch.equal(word_order(x, 128), mma_words)
    kp = torch.arange(64)
    q, sl, h, c, e = kp // 32, (kp // 16) % 2, (kp // 8) % 2, (kp // 2) % 4, kp % 2
    assert torch.equal(word_order(x, 64)[0, :64], x[0, 8 * (2 * c + q) + 4 * e + 2 * sl + h])
    assert torch.equal(word_order(x, 64).sort(dim=1).values, x)


@pytest.mark.parametrize("block_k,k", [(32, 96), (64, 256), (64, 448), (128, 384), (256, 512)])
@pytest.mark.parametrize("m", [1, 7, 33])
def test_word_order_triton_is_word_order(block_k, k, m):
    """The Triton permutation equals the torch one bit for bit: rows past a whole 16-row block
    (7, 33), K of 1-8 tiles (blocks of 96 / 192 / 384 / 512 columns), a row-strided view (every
    other row of a wider tensor) and a column-strided one (copied first), fp16 / bf16."""
    for dtype in (torch.bfloat16, torch.float16):
        wide = torch.randn(2 * m, 3 * k, generator=torch.Generator().manual_seed(m + k)).to(dtype)
        for x in (wide[:m, :k].contiguous(), wide[::2, k : 2 * k], wide[:m, ::3]):
            assert torch.equal(word_order_triton(x, block_k), word_order(x, block_k))


def test_words_rejects_8bit_and_partial_tiles():
    x, qw, s, z, b = make_problem(2, 16, 160, 4, -1, torch.bfloat16, asym=False, bias=False)
    with pytest.raises(ValueError, match="WORDS needs"):
        wna16_tma(x, qw, s, z, b, 4, -1, {**CFG, "WORDS": True})  # K = 160 is not whole 64-code tiles
    x, qw, s, z, b = make_problem(2, 16, 128, 8, -1, torch.bfloat16, asym=False, bias=False)
    with pytest.raises(ValueError, match="WORDS needs"):
        wna16_tma(x, qw, s, z, b, 8, -1, {**CFG, "WORDS": True})


def test_unaligned_operands_are_copied():
    """A descriptor base must be 16-byte aligned: views that start mid-buffer still run."""
    x, qw, s, z, b = make_problem(3, 16, 128, 4, -1, torch.bfloat16, asym=True, bias=False)
    wbuf = torch.empty(qw.numel() + 1, dtype=torch.uint8)
    qw_off = wbuf[1:].view(qw.shape)
    qw_off.copy_(qw)
    xbuf = torch.empty(x.numel() + 1, dtype=x.dtype)
    x_off = xbuf[1:].view(x.shape)
    x_off.copy_(x)
    assert qw_off.data_ptr() % 16 and x_off.data_ptr() % 16
    assert_close_to_ref(wna16_tma(x_off, qw_off, s, z, b, 4, -1, CFG), x, qw, s, z, b, 4, -1)


def test_rejects_k_without_whole_tma_rows():
    assert tma_supported(4096) and not tma_supported(4080) and tma_supported(4080, 8) and not tma_supported(4088, 8)
    x, qw, s, z, b = make_problem(2, 16, 112, 4, -1, torch.bfloat16, asym=False, bias=False)
    with pytest.raises(ValueError, match="multiple of 32"):
        wna16_tma(x, qw, s, z, b, 4, -1, CFG)
    x, qw, s, z, b = make_problem(2, 16, 104, 8, -1, torch.bfloat16, asym=False, bias=False)
    with pytest.raises(ValueError, match="multiple of 16"):
        wna16_tma(x, qw, s, z, b, 8, -1, CFG)


def test_dispatcher_offers_it_only_where_it_applies(monkeypatch):
    def tma(m, k, bits=4, usable=False):
        cands = usable_configs(m, 4096, k, bits, 128) if usable else candidate_configs(m, 4096, k, bits, 128)
        return [c for c in cands if c["kernel"] == "tiled_tma"]

    assert tma(256, 4096) and tma(4096, 4096) and tma(64, 4096) and tma(256, 4096, bits=8)
    assert not tma(8, 4096) and not tma(256, 4080) and not tma(256, 4088, bits=8)
    # M buckets 16-32: tiles of the bucket's tokens, split up to 8
    assert all(c["BLOCK_M"] == m and c["SPLIT_K"] <= 8 for m in (16, 32) for c in tma(m, 4096) if c["BLOCK_M"] < 64) and tma(16, 4096, bits=8)
    assert all(c["BLOCK_M"] <= 2 * 128 and c["SPLIT_K"] in (1, 2, 4) for c in tma(128, 4096))
    # measured on the H200: from M bucket 64, 4- and 8-bit, 4 and 8 warps; TAIL_SPLIT
    # opt-in
    monkeypatch.delenv("QFUSE_EXPERIMENTAL_KERNELS", raising=False)
    assert tma(256, 4096, usable=True) and tma(64, 4096, usable=True) and tma(256, 4096, bits=8, usable=True)
    assert all(any(c["num_warps"] == 8 for c in tma(256, 4096, bits=bits)) for bits in (4, 8))
    assert any("TAIL_SPLIT" in c for c in tma(512, 4096, bits=8)) and not any("TAIL_SPLIT" in c for c in tma(512, 4096, bits=8, usable=True))
    assert candidate_configs(256, 4096, 4096, 4, 128)[0]["kernel"] == "tiled_tma"
    assert candidate_configs(64, 4096, 4096, 4, 128)[0]["kernel"] == "tiled_tma"
    assert candidate_configs(256, 4096, 4096, 8, 128)[0]["kernel"] == "tiled_tma"
    assert not any(is_experimental(c, bits) for bits in (4, 8) for c in tma(128, 4096, bits=bits) if "WORDS" not in c)
    # WORDS: 4-bit, the twin of a byte-path tile; offered only for the 64-token 128-deep tiles (M bucket 64)
    # and the 256-token 64-deep ones (M bucket >= 128), where the H200 measured it fastest; opt-in at every other tile
    for m in (16, 64, 256):
        words = [c for c in tma(m, 4096) if c.get("WORDS")]
        assert words and all({**c, "WORDS": False} in [{**d, "WORDS": False} for d in tma(m, 4096) if not d.get("WORDS")] for c in words)
        assert all(is_experimental(c, 4) == ((c["BLOCK_M"], c["BLOCK_K"]) not in ((64, 128), (256, 64))) for c in words)
    assert not any(c.get("WORDS") for c in tma(256, 4096, bits=8) + tma(64, 4096, bits=8) + tma(16, 4096, usable=True))
    offered = [c for c in tma(256, 4096, usable=True) if c.get("WORDS")]
    assert offered and all(c["BLOCK_M"] == 256 and c["BLOCK_K"] == 64 for c in offered)
    offered = [c for c in tma(64, 4096, usable=True) if c.get("WORDS")]
    assert {(c["BLOCK_N"], c["num_warps"]) for c in offered} == {(64, 4), (128, 4)}
    assert all(c["BLOCK_M"] == 64 and c["BLOCK_K"] == 128 for c in offered)
    assert not any(c.get("WORDS") for c in usable_configs(64, 4096, 4096, 4, 64) if c["kernel"] == "tiled_tma")  # g64: BLOCK_K 64
    tails = [c for c in tma(512, 4096) if "TAIL_SPLIT" in c]
    assert tails and all(is_experimental(c, 4) and c["SPLIT_K"] == 1 and c["BLOCK_M"] == 256 for c in tails)
    assert not any("TAIL_SPLIT" in c for c in tma(512, 4096, usable=True))
    assert not tma(8, 4096)
    monkeypatch.setenv("QFUSE_EXPERIMENTAL_KERNELS", "1")
    assert any("TAIL_SPLIT" in c for c in tma(512, 4096, usable=True))
    # before Hopper (no TMA): never offered, and the heuristic first candidate is another family
    pre = usable_configs(256, 4096, 4096, 4, 128, tma=False)
    assert pre and not any(c["kernel"] == "tiled_tma" for c in pre) and pre[0]["kernel"] == "tiled"


def test_ptx_compiles_for_sm90_with_an_asynchronous_wgmma():
    """The TMA kernel with the planes PTX compiles for Hopper with the installed Triton, and its
    loop's wgmma (and the tiled_planes JOIN form's, opt-in for what ptxas then does with it: see
    test_wna16_gemm_kernel's SASS test) stays asynchronous: the only ``wgmma.wait_group 0`` is the last wait (after the
    loop); inside it, every wait leaves MMAs in flight. A change that makes Triton wait for
    every slice (a use of the accumulator in the loop, a weight operand stored to shared memory
    in the loop) fails here, on the CPU."""
    cases = [
        "tma,bf16,128,0,1",
        "tma,fp16,-1,1,2",
        "tma,bf16,64,1,1",
        "tma,fp16,128,0,4",
        "tma,bf16,128,1,2,8",
        "tma,fp16,-1,0,1,8",
        "tma,bf16,128,0,1,4,2",
        "tma,fp16,-1,1,1,8,3",  # TAIL_SPLIT
        "bf16,2,1,0,1,1",
        "fp16,4,1,1,1,1",  # tiled_planes JOIN: the same loop, pointer-fed
        "bf16,2,1,0,1",
    ]  # control: tiled_planes without JOIN, whose loop is synchronous
    stdout = run_sm90_script("_compile_sm90.py", cases)
    assert stdout.count("compiled") == len(cases)

    def asynchronous(line: str) -> bool:
        # triton 3.6: 3,3,3,3,0 (a wait per K = 16 piece); 3.7.1: 1,1,0; a synchronous loop: 0 per slice
        waits = [int(w) for w in line.split(" waits ")[1].split(",") if w]
        return bool(waits[:-1]) and waits[-1] == 0 and 0 not in waits[:-1]

    lines = stdout.splitlines()
    assert all(asynchronous(line) for line in lines[:-1]), lines
    assert not asynchronous(lines[-1]), lines[-1]  # the check tells a synchronous loop apart


def test_sass_keeps_wgmmas_in_flight_and_their_registers_untouched():
    """sm_90 SASS of offered tiles (4- and 8-bit, both dtypes, all group forms, split-K): ptxas
    keeps wgmmas in flight (no ``WARPGROUP.DEPBAR`` 0 in the loop: the C7515 serialization that a
    constant-zero accumulator caused) and never writes a register of one in flight (the hazard
    behind the 8-bit 8-warp tiles' wrong results on the H200). ops/wna16/tma.py, module docstring.
    The WORDS tiles keep wgmmas in flight within a K tile and drain them before the next one's values."""
    cases = [
        "tmasass,8,bf16,128,0,256,128,64,8,3,2",  # the 8-bit tile that computed wrong results
        "tmasass,8,fp16,-1,1,256,64,64,4,3,1",
        "tmasass,8,bf16,128,1,128,128,128,8,3,1",
        "tmasass,8,fp16,32,0,64,128,64,4,4,4",
        "tmasass,4,bf16,128,0,256,128,64,8,4,1",
        "tmasass,4,fp16,-1,1,64,128,64,4,4,2",
        "tmasass,4,bf16,128,0,128,128,128,8,3,1",
        "tmasass,4,bf16,64,1,64,256,64,8,4,1",
        "tmasass,4,fp16,-1,1,16,128,128,4,4,2,1",  # WORDS (opt-in tile)
        # WORDS, offered: the 256-token tiles of M bucket >= 128 and the 64-token ones of bucket 64
        "tmasass,4,bf16,128,0,256,128,64,8,3,1,1",
        "tmasass,4,bf16,128,1,256,128,64,8,4,1,1",
        "tmasass,4,fp16,64,0,256,64,64,4,3,2,1",
        "tmasass,4,bf16,-1,1,256,64,64,4,4,1,1",
        "tmasass,4,bf16,128,0,64,128,128,4,3,1,1",
        "tmasass,4,fp16,128,1,64,64,128,4,4,4,1",
    ]
    lines = run_sm90_script("_compile_sm90.py", cases, processes=2).splitlines()  # CI's two cores
    assert len(lines) == len(cases)
    for line in lines:
        waits = [int(w) for w in line.split(" waits ")[1].split(" ")[0].split(",")]
        words = len(line.split(" waits ")[0].split(",")) == 12  # the optional WORDS field
        assert waits and (max(waits) > 0 if words else min(waits) > 0), line  # WORDS: drains (0) and in-flight waits
        assert " hazards 0" in line, line


# ---------------------------------------------------------------- GPU: real descriptors, PTX planes

# (group, dtype, zero points): a covering set, each value of each twice (every combination compiles
# its own ~15 configs x 2 shape specializations; all 16 took most of a 380 s GPU run)
GPU_QUANT = [(-1, torch.bfloat16, True), (32, torch.float16, False), (64, torch.bfloat16, False), (128, torch.float16, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size,dtype,asym", GPU_QUANT)
def test_gpu_every_config(bits, group_size, dtype, asym):
    """Every config the dispatcher offers for this family (opt-in ones too), at M = 16 to prefill
    and odd shapes (N % 16 != 0)."""
    for m, (n, k) in ((200, (4000, 4096)), (1024, (4096, 4096)), (300, (1000, 2944)), (50, (4096, 4096)), (12, (4000, 4096)), (30, (1000, 2944))):
        x, qw, s, z, b = make_problem(m, n, k, bits, group_size, dtype, asym, bias=m % 2 == 0, device="cuda")
        for cfg in candidate_configs(m, n, k, bits, group_size):
            if cfg["kernel"] == "tiled_tma":
                try:
                    assert_close_to_ref(wna16_tma(x, qw, s, z, b, bits, group_size, cfg), x, qw, s, z, b, bits, group_size)
                except AssertionError as e:  # the first wrong config, named (one that leaves its counters set fails the rest)
                    raise AssertionError(f"M={m} N={n} K={k} {cfg}: {e}") from None


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_extreme_codes(bits, dtype):
    x, _, s, _, _ = make_problem(300, 256, 512, bits, 128, dtype, asym=False, bias=False, device="cuda")
    qw, z = (_codes_at_the_extremes if bits == 4 else _codes8_at_the_extremes)(256, 512, 128)
    split = {"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 2, "num_warps": 8, "num_stages": 3}
    for cfg in ({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4}, split):
        assert_close_to_ref(wna16_tma(x, qw.cuda(), s, z.cuda(), None, bits, 128, cfg), x, qw.cuda(), s, z.cuda(), None, bits, 128)


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("tail_split", [2, 4])
def test_gpu_tail_split(bits, tail_split):
    """TAIL_SPLIT's two launches (whole waves, then the tail split along K) at the H200's own wave
    (one or two programs per SM) and at a short test wave, twice each (the tail's arrival counters
    are left zeroed), odd shapes included."""
    for m, (n, k), group_size, dtype in (
        (256, (28672, 4096), 128, torch.bfloat16),
        (300, (1000, 2944), 64, torch.float16),
        (512, (4096, 4096), -1, torch.bfloat16),
    ):
        x, qw, s, z, b = make_problem(m, n, k, bits, group_size, dtype, asym=m != 256, bias=m != 512, device="cuda")
        for tile in (
            {"BLOCK_M": 256, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4, "TAIL_WAVE": 1},
            {"BLOCK_M": 256, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "WAVE_PROGRAMS": 7},
        ):
            cfg = {**tile, "BLOCK_K": 64, "SPLIT_K": 1, "TAIL_SPLIT": tail_split}
            for _ in range(2):
                assert_close_to_ref(wna16_tma(x, qw, s, z, b, bits, group_size, cfg), x, qw, s, z, b, bits, group_size)


@pytest.mark.gpu
@pytest.mark.parametrize("block_k", [64, 128])
def test_gpu_word_order_at_prefill_shapes(block_k):
    """The compiled permutation at the Llama-3-8B prefill's activations (and an odd M), bit for bit."""
    for m, k in ((2048, 4096), (37, 14336)):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        assert torch.equal(word_order_triton(x, block_k), word_order(x, block_k))


@pytest.mark.gpu
def test_gpu_8bit_tiles_that_computed_wrong_results():
    """The 8-bit tiles that computed wrong results on the H200 with the former 8-bit path (ptxas
    wrote registers of wgmmas in flight; ops/wna16/tma.py): 8 warps with split-K
    (errors up to a third of the output's range), 8 warps at split 1 on an odd shape (NaN), and
    ``TAIL_SPLIT`` at 4 warps."""
    x, qw, s, z, b = make_problem(256, 512, 1024, 8, 128, torch.bfloat16, asym=False, bias=False, device="cuda")
    for cfg in (
        {"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 2, "num_warps": 8, "num_stages": 3},
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 2, "num_warps": 8, "num_stages": 3},
    ):
        assert_close_to_ref(wna16_tma(x, qw, s, z, b, 8, 128, cfg), x, qw, s, z, b, 8, 128)
    x, qw, s, z, b = make_problem(300, 1000, 2944, 8, 64, torch.float16, asym=True, bias=True, device="cuda")
    for cfg in (
        {"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 8, "num_stages": 3},
        {"BLOCK_M": 256, "BLOCK_N": 64, "BLOCK_K": 64, "TAIL_SPLIT": 2, "WAVE_PROGRAMS": 7, "num_warps": 4, "num_stages": 3},
    ):
        assert_close_to_ref(wna16_tma(x, qw, s, z, b, 8, 64, cfg), x, qw, s, z, b, 8, 64)

"""ops/_autotune.py: config lookup order, lazy candidate lists, M buckets (no GPU needed: on a
CPU device a cache miss returns the heuristic first candidate without measuring)."""

from __future__ import annotations

import json

import pytest
import torch

from qfuse.ops import _autotune


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(_autotune, "_memory", {})
    monkeypatch.setattr(_autotune, "_loaded_files", set())
    monkeypatch.setattr(_autotune, "_untuned", {})
    monkeypatch.setattr(_autotune, "_TUNED_DIR", tmp_path / "tuned")
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(tmp_path / "user.json"))
    return tmp_path


def _never_run(cfg):
    raise AssertionError("a CPU lookup must not launch anything")


def test_m_bucket():
    assert [_autotune.m_bucket(m) for m in (1, 2, 3, 7, 16, 33, 8192, 20000)] == [1, 2, 4, 8, 16, 64, 8192, 8192]


def test_shipped_config_skips_building_candidates(fresh_cache):
    (fresh_cache / "tuned").mkdir()
    (fresh_cache / "tuned" / "op.cpu.json").write_text(json.dumps({"op|cpu|1|64": {"BLOCK": 32}}))
    built = []

    def candidates():
        built.append(1)
        return [{"BLOCK": 16}, {"BLOCK": 32}]

    cpu = torch.device("cpu")
    assert _autotune.pick_config("op", (1, 64), candidates, _never_run, cpu) == {"BLOCK": 32}
    assert not built  # the list is only built on a cache miss
    assert _autotune.pick_config("op", (2, 64), candidates, _never_run, cpu) == {"BLOCK": 16}  # miss: heuristic first
    assert built == [1]


def test_user_cache_wins_over_shipped_defaults(fresh_cache):
    (fresh_cache / "tuned").mkdir()
    (fresh_cache / "tuned" / "op.cpu.json").write_text(json.dumps({"op|cpu|1|64": {"BLOCK": 32}}))
    (fresh_cache / "user.json").write_text(json.dumps({"op|cpu|1|64": {"BLOCK": 64}}))
    assert _autotune.pick_config("op", (1, 64), [{"BLOCK": 16}, {"BLOCK": 32}], _never_run, torch.device("cpu")) == {"BLOCK": 64}


def test_empty_candidate_list_is_an_error(fresh_cache):
    with pytest.raises(ValueError, match="no candidate configs"):
        _autotune.pick_config("op", (1,), lambda: [], _never_run, torch.device("cpu"))


def test_split_k_choices():
    from qfuse.ops._autotune import split_k_choices

    # K = 14336, 4-bit, 64-word tiles: 28 tiles per row, 128 GEMV programs on 132 SMs
    assert split_k_choices(28, 128, 132) == [14, 7, 4, 2, 1]
    # enough programs already (28672 rows / 32): 1, and 2 for the 16-per-SM target
    assert split_k_choices(32, 896, 132) == [2, 1]
    for tiles, programs in ((16, 64), (28, 64), (112, 32), (3, 8), (1, 4)):
        splits = split_k_choices(tiles, programs, 132)
        assert splits[-1] == 1 and splits == sorted(set(splits), reverse=True)
        assert all(tiles % s == 0 and (s == 1 or tiles // s >= 2) for s in splits)


def test_shipped_wna16_picks_are_not_opt_in():
    """The shipped file bypasses the opt-in gate (a hit is used as is), so it must hold no config
    that ``is_experimental`` keeps opt-in: a tune that timed them must not ship them by a merge."""
    from qfuse.ops.wna16.dispatch import is_experimental

    shipped = json.loads((_autotune._TUNED_DIR / "wna16_gemm.NVIDIA_H200.json").read_text())
    assert shipped
    opt_in = [key for key, cfg in shipped.items() if is_experimental(cfg, int(key.rsplit("|", 1)[1]))]
    assert not opt_in, opt_in


@pytest.mark.parametrize("name", ["w8a8_gemm", "w8a8_gemm_eager", "w4a8_gemm"])
def test_shipped_int8_picks_are_not_opt_in(name):
    """The same for the int8 GEMMs (ops/int8/dispatch.py's is_experimental: the W8A8 dp4a GEMV)."""
    from qfuse.ops.int8.dispatch import is_experimental

    shipped = json.loads((_autotune._TUNED_DIR / f"{name}.NVIDIA_H200.json").read_text())
    assert shipped
    opt_in = [key for key, cfg in shipped.items() if is_experimental(cfg)]
    assert not opt_in, opt_in


def test_nearest_stored_pick_keeps_its_program_count(fresh_cache):
    """A pick with BLOCK_N and SPLIT_K comes with the offered split that keeps its programs: 4096 rows
    in 32 tiles x 4 splits = 128 programs; 1024 rows (8 tiles) want 16 splits, 2048 rows 8."""
    _autotune._memory["op|G|16|4096|4096|128"] = {"BLOCK_N": 128, "SPLIT_K": 4, "w": 8}
    offered = [{"BLOCK_N": 128, "SPLIT_K": s, "w": w} for w in (4, 8) for s in (1, 2, 8, 16)]
    assert _autotune.nearest_stored("op", "G", (16, 1024, 4096, 128), offered) == {"BLOCK_N": 128, "SPLIT_K": 16, "w": 8}
    assert _autotune.nearest_stored("op", "G", (16, 2048, 4096, 128), offered) == {"BLOCK_N": 128, "SPLIT_K": 8, "w": 8}
    assert _autotune.nearest_stored("op", "G", (16, 16384, 4096, 128), offered) == {"BLOCK_N": 128, "SPLIT_K": 1, "w": 8}
    assert _autotune.nearest_stored("op", "G", (16, 1024, 4096, 128), [{"BLOCK_N": 64, "SPLIT_K": 4, "w": 8}]) is None
    # past M = 64 the M tiles fill the GPU: as stored
    _autotune._memory["op|G|2048|4096|4096|128"] = {"BLOCK_N": 128, "SPLIT_K": 1, "w": 8}
    big = [{"BLOCK_N": 128, "SPLIT_K": s, "w": 8} for s in (1, 2, 4)]
    assert _autotune.nearest_stored("op", "G", (2048, 1024, 4096, 128), big) == {"BLOCK_N": 128, "SPLIT_K": 1, "w": 8}
    # fused_moe's keys hold (E, I) where the GEMMs' hold (N, K): its picks come as stored
    _autotune._memory["fused_moe|G|16|64|1408|2048"] = {"BLOCK_N": 32, "SPLIT_K": 2}
    moe_offered = [{"BLOCK_N": 32, "SPLIT_K": s} for s in (1, 2, 4)]
    assert _autotune.nearest_stored("fused_moe", "G", (16, 8, 1408, 2048), moe_offered) == {"BLOCK_N": 32, "SPLIT_K": 2}


def test_nearest_stored_pick_of_the_same_m_bucket_and_kind(fresh_cache):
    _autotune._memory.update(
        {
            "op|G|1|4096|4096|128": {"B": 1},
            "op|G|1|28672|4096|128": {"B": 2},
            "op|G|1|4096|14336|128": {"B": 3},
            "op|G|16|1024|4096|128": {"B": 4},  # another M bucket
            "op|G|1|1024|4096|-1": {"B": 5},  # another group size
        }
    )
    offered = [{"B": b} for b in (0, 1, 2, 3, 4, 5)]
    assert _autotune.nearest_stored("op", "G", (1, 1024, 4096, 128), offered) == {"B": 1}
    assert _autotune.nearest_stored("op", "G", (1, 14336, 4096, 128), offered) == {"B": 2}  # log-nearer 28672 than 4096
    assert _autotune.nearest_stored("op", "G", (1, 4096, 12288, 128), offered) == {"B": 3}  # K weighs double
    assert _autotune.nearest_stored("op", "G", (1, 1024, 4096, 128), [{"B": 0}, {"B": 3}]) == {"B": 3}  # offered ones only
    assert _autotune.nearest_stored("op", "G", (2, 1024, 4096, 128), offered) is None
    assert _autotune.nearest_stored("op", "G", (1, 64), offered) is None  # keys without (N, K)

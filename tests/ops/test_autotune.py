"""ops/_autotune.py: config lookup order, lazy candidate lists, M buckets (no GPU needed: on a
CPU device a cache miss returns the heuristic first candidate without measuring)."""

from __future__ import annotations

import json

import pytest
import torch

from qfuse.ops import _autotune
from tests.helpers import OPT_IN_MMA_WORDS


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(_autotune, "_memory", {})
    monkeypatch.setattr(_autotune, "_loaded_files", set())
    monkeypatch.setattr(_autotune, "_untuned", {})
    monkeypatch.setattr(_autotune, "_checked", {})
    monkeypatch.setattr(_autotune, "_refused", {})
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
    for _ in range(3):
        assert _autotune.pick_config("op", (1, 64), candidates, _never_run, cpu) == {"BLOCK": 32}
    assert built == [1]  # built once per key and process, to check the stored pick against
    assert _autotune.pick_config("op", (2, 64), candidates, _never_run, cpu) == {"BLOCK": 16}  # miss: heuristic first
    assert built == [1, 1]


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


@pytest.mark.parametrize("experimental", [False, True])
def test_every_generated_config_carries_its_familys_meta_parameters(monkeypatch, experimental):
    """No config of this version (the tuners' exhaustive lists too) is refused by ``lacks_keys``
    unless it is opt-in, which ``usable`` refuses anyway: a user's tuned pick keeps running (the
    opt-in stream-K ``mma_words`` configs carry no SPLIT_K, which every offered one does)."""
    from qfuse.ops.int8 import dispatch as int8
    from qfuse.ops.moe import dispatch as moe
    from qfuse.ops.wna16 import dispatch as wna16

    monkeypatch.setenv("QFUSE_EXPERIMENTAL_KERNELS", "1" if experimental else "0")
    problems = []
    for m in (1, 8, 64, 1024):
        for n, k in ((4096, 4096), (28672, 4096), (4096, 14336), (576, 1536)):
            problems += [(wna16.REGISTRY, wna16.problem(m, n, k, b, g, 132, True, torch.bfloat16)) for b, g in ((4, 128), (4, -1), (8, -1))]
            problems += [(int8.REGISTRY, int8.problem(m, n, k, g, 132, w4=w4, gpu=True)) for w4, g in ((False, -1), (True, -1), (True, 128))]
        for i, h in ((14336, 4096), (1408, 2048)):
            formats = ((4, 16, 128), (8, 16, -1), (8, 8, -1), (4, 8, 128), (16, 16, -1))
            problems += [(moe.REGISTRY, moe.problem(m, i, h, wb, g, torch.bfloat16, ab)) for wb, ab, g in formats]
    refused = []
    for registry, p in problems:
        offered = registry.offered(p)
        refused += [c for c in registry.candidates(p, True) if _autotune.lacks_keys(c, offered) and not registry.is_opt_in(c)]
    assert not refused, refused[:3]


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


@pytest.mark.parametrize(
    "entry", [("op|G|16|4096", {"B": 1}), ("op|G|16|4096x|4096|128", {"B": 1}), ("op|G|16|4096|4096|128", {"BLOCK_N": 64, "SPLIT_K": 0})]
)
def test_a_stored_entry_that_cannot_be_read_is_ignored_by_the_nearest_search(fresh_cache, caplog, entry):
    """A hand-edited or foreign entry of the same M bucket (short key, N not an integer, SPLIT_K 0)
    is skipped with a warning; it crashed every untuned call (graph capture) of every shape without its own pick."""
    _autotune._memory.update([entry, ("op|G|16|2048|4096|128", {"BLOCK_N": 64, "SPLIT_K": 2})])
    offered = [{"BLOCK_N": 64, "SPLIT_K": s} for s in (1, 2, 4)]
    with caplog.at_level("WARNING", logger="qfuse.autotune"):
        assert _autotune.nearest_stored("op", "G", (16, 1024, 4096, 128), offered) == {"BLOCK_N": 64, "SPLIT_K": 4}
    assert "cannot be read" in caplog.text


def _write_keys(path: str, prefix: str, count: int) -> None:
    for i in range(count):
        _autotune.merge_into_json(_autotune.Path(path), f"{prefix}{i}", {"BLOCK": i})


def test_processes_writing_the_cache_at_once_keep_every_entry(tmp_path):
    """Writers take turns under a file lock, each through its own temporary file: two processes
    adding 60 keys each to a file of 20 (the benchmarks compile in parallel processes) leave all 140;
    without the lock the file ended as invalid JSON, which no later save repaired."""
    import multiprocessing

    path = tmp_path / "cache.json"
    path.write_text(json.dumps({f"old{i}": {"BLOCK": i} for i in range(20)}))
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_keys, args=(str(path), p, 60)) for p in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)
    data = json.loads(path.read_text())
    assert len(data) == 140 and data["a59"] == {"BLOCK": 59} and data["old0"] == {"BLOCK": 0}
    assert sorted(f.name for f in tmp_path.iterdir()) == ["cache.json", "cache.json.lock"]  # no temporary file left


@pytest.mark.parametrize("content", [b"[]", b"null", b"3", b"\xff\xfe{", b"", b'{"op|G|1|64": {"BLOCK'])
def test_a_cache_file_that_holds_no_object_is_ignored_then_replaced(fresh_cache, content, caplog):
    """A foreign, truncated or non-UTF-8 cache costs a re-measurement: lookups ignore it, and the
    next save writes a new file (with a warning) instead of failing silently in every process."""
    user = fresh_cache / "user.json"
    user.write_bytes(content)
    assert _autotune.pick_config("op", (1, 64), [{"BLOCK": 16}, {"BLOCK": 32}], _never_run, torch.device("cpu")) == {"BLOCK": 16}
    assert _autotune.lookup("op", (1, 64), "cpu") is None
    with caplog.at_level("WARNING", logger="qfuse.autotune"):
        _autotune.merge_into_json(user, "op|cpu|1|64", {"BLOCK": 32})
    assert json.loads(user.read_text()) == {"op|cpu|1|64": {"BLOCK": 32}} and "not a JSON object" in caplog.text


def test_a_symlinked_cache_is_written_through_the_link(tmp_path):
    shared = tmp_path / "team" / "autotune.json"
    shared.parent.mkdir()
    shared.write_text(json.dumps({"a": {"BLOCK": 1}}))
    link = tmp_path / "autotune.json"
    link.symlink_to(shared)
    _autotune.merge_into_json(link, "b", {"BLOCK": 2})
    assert link.is_symlink() and json.loads(shared.read_text()) == {"a": {"BLOCK": 1}, "b": {"BLOCK": 2}}


def test_a_stored_pick_that_cannot_run_here_is_chosen_again(fresh_cache, caplog):
    """A cached pick of a kernel family this version lacks, or an opt-in config cached while
    QFUSE_EXPERIMENTAL_KERNELS=1 was set: not run (it failed every call, or ran unverified)."""
    (fresh_cache / "user.json").write_text(json.dumps({"op|cpu|1|64": {"kernel": "gone", "BLOCK": 8}}))
    cands = [{"kernel": "k", "BLOCK": 16}, {"kernel": "k", "BLOCK": 32}]
    usable = lambda c: c.get("kernel") == "k"  # noqa: E731
    with caplog.at_level("WARNING", logger="qfuse.autotune"):
        assert _autotune.pick_config("op", (1, 64), cands, _never_run, torch.device("cpu"), usable) == cands[0]
    assert "cannot run here" in caplog.text


def test_a_refused_user_pick_falls_back_to_the_shipped_pick(fresh_cache, caplog):
    """An opt-in pick in the user cache (tuned with QFUSE_EXPERIMENTAL_KERNELS=1) does not hide the
    shipped table's pick for the same key: that runs, not the untuned first candidate."""
    (fresh_cache / "tuned").mkdir()
    (fresh_cache / "tuned" / "op.cpu.json").write_text(json.dumps({"op|cpu|1|64": {"kernel": "k", "B": 2}}))
    (fresh_cache / "user.json").write_text(json.dumps({"op|cpu|1|64": {"kernel": "k", "B": 3, "OPT_IN": True}}))
    cands = [{"kernel": "k", "B": 1}, {"kernel": "k", "B": 2}]
    usable = lambda c: "OPT_IN" not in c  # noqa: E731
    with caplog.at_level("WARNING", logger="qfuse.autotune"):
        for _ in range(2):
            assert _autotune.pick_config("op", (1, 64), cands, _never_run, torch.device("cpu"), usable) == {"kernel": "k", "B": 2}
    assert caplog.text.count("the shipped pick") == 1


def test_a_stored_pick_that_lacks_a_meta_parameter_gives_way_to_the_shipped_pick(fresh_cache, caplog):
    """A user-cache pick stored before its kernel read ``C`` (every offered config of its family has
    it) would fail with KeyError at launch: the shipped pick runs, and without one the choice is made again."""
    (fresh_cache / "tuned").mkdir()
    (fresh_cache / "tuned" / "op.cpu.json").write_text(json.dumps({"op|cpu|1|64": {"kernel": "k", "B": 2, "C": 1}}))
    (fresh_cache / "user.json").write_text(json.dumps({"op|cpu|1|64": {"kernel": "k", "B": 3}, "op|cpu|2|64": {"kernel": "k", "B": 3}}))
    cands = [{"kernel": "k", "B": 1, "C": 0}, {"kernel": "k", "B": 2, "C": 1}, {"kernel": "other", "D": 1}]
    cpu = torch.device("cpu")
    with caplog.at_level("WARNING", logger="qfuse.autotune"):
        assert _autotune.pick_config("op", (1, 64), cands, _never_run, cpu) == {"kernel": "k", "B": 2, "C": 1}
        assert _autotune.pick_config("op", (2, 64), cands, _never_run, cpu) == cands[0]
    assert caplog.text.count("it lacks C, which its kernel reads") == 2 and "the shipped pick" in caplog.text
    assert _autotune.lacks_keys({"kernel": "k", "B": 3, "C": 0, "E": 1}, cands) == []  # an extra key is no reason
    assert _autotune.lacks_keys({"kernel": "new", "B": 3}, cands) == []  # no config of its family offered to compare with


def test_a_refused_stored_pick_is_checked_and_warned_about_once(fresh_cache, caplog):
    """Where nothing is measured (QFUSE_AUTOTUNE=0, graph capture) the refused pick stays stored:
    one warning per key and process, not one per call of every layer."""
    (fresh_cache / "user.json").write_text(json.dumps({"op|cpu|1|64": {"kernel": "gone"}}))
    cands = [{"kernel": "k", "B": 1}, {"kernel": "k", "B": 2}]
    checks = []

    def usable(c):
        checks.append(c)
        return c.get("kernel") == "k"

    with caplog.at_level("WARNING", logger="qfuse.autotune"):
        for _ in range(3):
            assert _autotune.pick_config("op", (1, 64), cands, _never_run, torch.device("cpu"), usable) == cands[0]
    assert len(checks) == 1 and caplog.text.count("cannot run here") == 1


def test_threads_that_miss_one_key_measure_it_once(fresh_cache, monkeypatch):
    """Measurements take turns (a CUDA graph captured in one thread while another synchronizes or
    captures fails both); a thread that waited takes the pick the other one measured."""
    import threading
    import time

    monkeypatch.setattr(_autotune, "device_name", lambda device=None: "G")
    active, peak, timed = [0], [0], []

    def graph_time_ms(calls):
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        timed.append(1)
        time.sleep(0.02)
        active[0] -= 1
        return 1.0

    monkeypatch.setattr(_autotune, "graph_time_ms", graph_time_ms)
    cands = [{"B": 1}, {"B": 2}, {"B": 3}]
    picks = []
    threads = [
        threading.Thread(target=lambda: picks.append(_autotune.pick_config("op", (1, 64), cands, lambda c: None, torch.device("cuda"))))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert picks == [{"B": 1}] * 4 and peak[0] == 1 and len(timed) == len(cands)


def test_registry_usable_refuses_unknown_families_and_opt_in_configs(monkeypatch):
    from qfuse.ops.wna16.dispatch import REGISTRY

    assert REGISTRY.usable({"kernel": "gemv_words", "BLOCK_N": 16, "BLOCK_W": 64, "SPLIT_K": 1, "num_warps": 4})
    assert not REGISTRY.usable({"kernel": "gemv_words_v2"}) and not REGISTRY.usable({"BLOCK_N": 16}) and not REGISTRY.usable([1])
    opt_in = OPT_IN_MMA_WORDS
    monkeypatch.delenv("QFUSE_EXPERIMENTAL_KERNELS", raising=False)
    assert REGISTRY.is_opt_in(opt_in) and not REGISTRY.usable(opt_in)
    monkeypatch.setenv("QFUSE_EXPERIMENTAL_KERNELS", "1")
    assert REGISTRY.usable(opt_in)


@pytest.mark.parametrize(
    ("value", "expected"), [("0", False), ("false", False), (" Off ", False), ("no", False), ("1", True), ("TRUE", True), ("yes", True), ("", True)]
)
def test_env_flags_read_the_usual_spellings(monkeypatch, value, expected):
    monkeypatch.setenv("QFUSE_AUTOTUNE", value)
    assert _autotune.env_flag("QFUSE_AUTOTUNE", True) is expected


def test_an_env_flag_with_another_value_is_an_error(monkeypatch):
    monkeypatch.setenv("QFUSE_EXPERIMENTAL_KERNELS", "maybe")
    with pytest.raises(ValueError, match="QFUSE_EXPERIMENTAL_KERNELS='maybe': expected one of 1, true, yes, on or 0, false, no, off"):
        _autotune.experimental_kernels()


def test_cache_path_expands_the_home_directory(monkeypatch, tmp_path):
    """QFUSE_AUTOTUNE_CACHE="~/x.json" set without a shell (a launcher's env block) names the home file, not ./~."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", "~/picks.json")
    assert _autotune.cache_path() == tmp_path / "picks.json"

"""qfuse/bench/_wna16_tune.py: the parallel precompile survives a compiler abort."""

from __future__ import annotations

import os

from qfuse.bench._wna16_tune import precompile


def abort_on_first_bucket(args):
    """Stands in for a worker whose Triton compile hits an LLVM assertion (ends the process)."""
    jobs = args[0]
    if any(job[3] == 1 for job in jobs):  # the bucket holding an M = 1 job
        os.abort()
    return len(jobs)


def test_precompile_reports_a_dead_worker_instead_of_hanging():
    logged = []
    precompile([(64, 256)], [1, 16], [4], 128, "bfloat16", False, workers=2, log=logged.append, worker=abort_on_first_bucket)
    assert logged and "compile worker died" in logged[0]


def test_precompile_logs_nothing_when_workers_finish():
    logged = []
    precompile([(64, 256)], [16], [4], 128, "bfloat16", False, workers=2, log=logged.append, worker=len)
    assert logged == []


def test_tune_families_keeps_the_shipped_pick():
    """--tune-families times only those families, plus the config shipped for the key (so a
    partial re-tune cannot drop an old winner from another family)."""
    import torch

    from qfuse.bench._wna16_tune import shipped_config, tune_candidates
    from qfuse.ops._autotune import _key_str
    from qfuse.ops.wna16.dispatch import OP, candidate_configs, config_key

    m, n, k = 256, 4096, 4096
    old = shipped_config(_key_str(OP, ("NVIDIA_H200", *config_key(m, n, k, 4, 128, torch.bfloat16))))
    assert old is not None and old["kernel"] != "tiled_words"  # the H200 pick of this key is another family
    cands = tune_candidates(m, n, k, 4, 128, {"tiled_words"}, torch.bfloat16, "NVIDIA_H200")
    assert cands[-1] == old and all(c["kernel"] == "tiled_words" for c in cands[:-1])
    assert len(cands) - 1 == sum(c["kernel"] == "tiled_words" for c in candidate_configs(m, n, k, 4, 128, exhaustive=True))
    assert tune_candidates(m, n, k, 4, 128, None, torch.bfloat16, "cpu") == candidate_configs(m, n, k, 4, 128, exhaustive=True)


def test_tune_timings_csv_lists_every_candidate_in_rank_order(tmp_path):
    """Each tuned key appends all its timed candidates (fastest first) next to the JSON."""
    import csv
    import json

    from qfuse.bench._wna16_tune import _append_timings

    cache = tmp_path / "wna16_gemm.tuned.json"
    _append_timings(cache, "k1", [(5.0, {"kernel": "a", "X": 1}), (7.25, {"kernel": "b"})])
    _append_timings(cache, "k2", [(3.0, {"kernel": "c"})])
    rows = list(csv.DictReader((tmp_path / "wna16_gemm.tuned.timings.csv").open()))
    assert [(r["key"], r["rank"], r["us"]) for r in rows] == [("k1", "0", "5.00"), ("k1", "1", "7.25"), ("k2", "0", "3.00")]
    assert json.loads(rows[0]["config"]) == {"kernel": "a", "X": 1}


def test_tune_never_picks_an_opt_in_config():
    """Opt-in configs are timed but the pick (what the tuned JSON ships) is the fastest other one."""
    from qfuse.bench._wna16_tune import _shippable_pick

    capped = {"kernel": "mma_words", "BLOCK_M": 16, "BLOCK_N": 128, "MAXNREG": 128}
    plain = {"kernel": "mma_words", "BLOCK_M": 16, "BLOCK_N": 128}
    other = {"kernel": "tiled_planes", "BLOCK_M": 16}
    assert _shippable_pick([(9.0, capped), (9.5, plain), (10.0, other)], 4) == (9.5, plain, 10.0)
    us, cfg, rest = _shippable_pick([(9.0, plain), (9.2, capped)], 4)
    assert (us, cfg) == (9.0, plain) and rest != rest  # no shippable runner-up: NaN
    assert _shippable_pick([(9.0, capped)], 4) is None and _shippable_pick([], 4) is None

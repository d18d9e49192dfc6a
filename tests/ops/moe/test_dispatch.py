"""ops/moe/dispatch.py: the shipped H200 table of fused_moe picks."""

import json
from pathlib import Path

import torch

import qfuse.ops
from qfuse.ops.moe.dispatch import OP, REGISTRY, problem


def test_shipped_configs_are_offered_candidates():
    """Every shipped pick is a config its key's registry offers (no opt-in, no stale tile)."""
    table = json.loads((Path(qfuse.ops.__file__).with_name("tuned") / f"{OP}.NVIDIA_H200.json").read_text())
    assert len(table) >= 92
    kernels = set()
    for key, cfg in table.items():
        op, gpu, mb, e, i, h, top_k, wbits, abits, group, dtype = key.split("|")
        assert op == OP and gpu == "NVIDIA_H200" and int(top_k) <= int(e)
        p = problem(int(mb), int(i), int(h), int(wbits), int(group), getattr(torch, dtype), int(abits))
        assert cfg in REGISTRY.offered(p), key
        kernels.add(cfg["kernel"])
    assert kernels == {"grouped", "gemv", "gemv_words", "grouped_words"}

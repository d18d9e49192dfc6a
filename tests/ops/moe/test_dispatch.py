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


def test_picks_and_launches_on_the_activations_gpu(monkeypatch):
    """Triton launches on the current device, and the word GEMV family launches without a guard of
    its own: x on cuda:1 while cuda:0 is current must run, and measure its configs, on cuda:1."""
    from types import SimpleNamespace

    from qfuse.ops.moe import dispatch
    from tests.helpers import record_cuda_device

    entered = record_cuda_device(monkeypatch)
    monkeypatch.setattr(dispatch, "topk_routing_triton", lambda logits, top_k, renormalize: (None, None))
    seen = []
    monkeypatch.setattr(dispatch, "pick_config", lambda *a: seen.append(("pick", list(entered))) or {"kernel": "gemv_words"})
    monkeypatch.setattr(dispatch.REGISTRY, "run", lambda cfg, *a: seen.append(("run", list(entered))))
    gpu1 = torch.device("cuda", 1)
    x = SimpleNamespace(shape=(1, 256), device=gpu1, dtype=torch.bfloat16, is_cuda=True)
    w13 = SimpleNamespace(shape=(8, 512, 128))
    dispatch.fused_moe_triton(x, None, 2, True, w13, None, None, None, None, None, None, None, 4, 16, 128)
    assert seen == [("pick", [gpu1]), ("run", [gpu1])] and not entered

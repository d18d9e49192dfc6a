"""ops/moe/dispatch.py: the shipped H200 table of fused_moe picks."""

import json
from pathlib import Path

import torch

import qfuse.ops
from qfuse.ops.moe.dispatch import OP, REGISTRY, TILE_MAJOR, config_key, layout_key, problem


def test_shipped_configs_are_offered_candidates():
    """Every shipped pick is a config its key's registry offers (no opt-in, no stale tile; so it lacks no
    meta-parameter of its family, which pick_config would refuse it for)."""
    table = json.loads((Path(qfuse.ops.__file__).with_name("tuned") / f"{OP}.NVIDIA_H200.json").read_text())
    assert len(table) >= 92
    kernels = set()
    for key, cfg in table.items():
        op, gpu, mb, e, i, h, top_k, wbits, abits, group, dtype, *layout = key.split("|")
        assert op == OP and gpu == "NVIDIA_H200" and int(top_k) <= int(e) and layout in ([], [TILE_MAJOR])
        assert not layout or (int(abits) == 16 and int(wbits) < 16), key  # tile-major codes: weight-only experts
        p = problem(int(mb), int(i), int(h), int(wbits), int(group), getattr(torch, dtype), int(abits))
        assert cfg in REGISTRY.offered(p), key
        kernels.add(cfg["kernel"])
    assert kernels == {"grouped", "gemv", "gemv_words", "grouped_words"}


def test_tile_major_key_falls_back_to_the_natural_layouts_stored_pick(tmp_path, monkeypatch):
    """A tile-major call is keyed by its layout; where only the natural layout's pick of the shape is
    stored, that one runs; where neither is, the tile-major key is measured (and stored) as it is."""
    from qfuse.ops._autotune import _key_str
    from qfuse.ops.moe import dispatch

    cache = tmp_path / "autotune.json"
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(cache))
    natural = config_key(8, 8, 14336, 4096, 2, 4, 16, 128, torch.bfloat16)
    tiled = config_key(8, 8, 14336, 4096, 2, 4, 16, 128, torch.bfloat16, tile_major=True)
    assert tiled == (*natural, TILE_MAJOR)
    gpu = "GPU_under_test"  # no shipped table
    pick = {"kernel": "gemv_words", "BLOCK_N": 32}

    def layout(stored: dict) -> tuple:
        cache.write_text(json.dumps({_key_str(OP, (gpu, *k)): pick for k in stored}))
        monkeypatch.setattr(dispatch, "_layout_keys", {})
        return layout_key(tiled, gpu), layout_key(natural, gpu)

    assert layout([]) == (tiled, natural)
    assert layout([natural]) == (natural, natural)
    assert layout([natural, tiled]) == (tiled, natural)
    assert layout([tiled]) == (tiled, natural)


def test_nearest_stored_pick_of_a_tile_major_key(monkeypatch):
    """Without measuring (QFUSE_AUTOTUNE=0, CUDA-graph capture), a tile-major key of an unstored shape
    takes the nearest stored shape's pick, of its own layout where that is as near, else the natural one's."""
    from qfuse.ops import _autotune
    from qfuse.ops._autotune import _key_str, nearest_stored

    a, b, c = ({"kernel": "grouped", "BLOCK_M": bm} for bm in (16, 32, 64))
    gpu = "GPU_under_test"
    entry = lambda i, tiled: _key_str(OP, (gpu, *config_key(16, 8, i, 4096, 2, 4, 16, 128, torch.bfloat16, tiled)))  # noqa: E731
    query = config_key(16, 8, 4096, 4096, 2, 4, 16, 128, torch.bfloat16, tile_major=True)
    monkeypatch.setattr(_autotune, "_memory", {entry(14336, False): a})
    assert nearest_stored(OP, gpu, query, [a, b, c]) == a
    monkeypatch.setattr(_autotune, "_memory", {entry(14336, False): a, entry(14336, True): b})
    assert nearest_stored(OP, gpu, query, [a, b, c]) == b
    monkeypatch.setattr(_autotune, "_memory", {entry(4096 * 2, False): a, entry(14336, True): b})  # 1 vs 1.81 + 0.5 away
    assert nearest_stored(OP, gpu, query, [a, b, c]) == a
    assert nearest_stored(OP, gpu, query[:-1], [a, b, c]) == a  # a natural key never takes a tile-major pick
    monkeypatch.setattr(_autotune, "_memory", {entry(14336, True): b})
    assert nearest_stored(OP, gpu, query[:-1], [a, b, c]) is None


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

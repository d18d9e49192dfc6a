"""ops/int8/dispatch.py: the int8 GEMMs' entry point launches on the activations' GPU."""

from types import SimpleNamespace

import torch

from qfuse.ops.int8 import dispatch
from tests.helpers import record_cuda_device


def test_picks_and_launches_on_the_activations_gpu(monkeypatch):
    """Triton launches on the current device: xq on cuda:1 while cuda:0 is current must run, and
    measure its configs, on cuda:1."""
    entered = record_cuda_device(monkeypatch)
    seen = []
    monkeypatch.setattr(dispatch, "pick_config", lambda *a: seen.append(("pick", list(entered))) or {"kernel": "tile"})
    monkeypatch.setattr(dispatch.REGISTRY, "run", lambda cfg, *a: seen.append(("run", list(entered))))
    gpu1 = torch.device("cuda", 1)
    xq = SimpleNamespace(shape=(4, 256), device=gpu1, is_cuda=True)
    dispatch.int8_gemm("w8a8_gemm", xq, None, SimpleNamespace(shape=(64, 256)), None, None, None, torch.bfloat16, w4=False)
    assert seen == [("pick", [gpu1]), ("run", [gpu1])] and not entered

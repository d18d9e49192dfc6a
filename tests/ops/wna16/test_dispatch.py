"""ops/wna16/dispatch.py: the op's entry point launches on the activations' GPU."""

from types import SimpleNamespace

import torch

from qfuse.ops.wna16 import dispatch
from tests.helpers import record_cuda_device


def test_picks_and_launches_on_the_activations_gpu(monkeypatch):
    """Triton launches on the current device: x on cuda:1 while cuda:0 is current (a model spread
    over GPUs, called eagerly) must run, and measure its configs, on cuda:1."""
    entered = record_cuda_device(monkeypatch)
    seen = []
    monkeypatch.setattr(dispatch, "pick_config", lambda *a: seen.append(("pick", list(entered))) or {"kernel": "tiled"})
    monkeypatch.setattr(dispatch, "run_config", lambda cfg, *a: seen.append(("run", list(entered))))
    gpu1 = torch.device("cuda", 1)
    x = SimpleNamespace(shape=(4, 256), device=gpu1, dtype=torch.bfloat16, is_cuda=True)
    dispatch.wna16_gemm_triton(x, SimpleNamespace(shape=(64, 128)), None, None, None, 4, 128)
    assert seen == [("pick", [gpu1]), ("run", [gpu1])] and not entered

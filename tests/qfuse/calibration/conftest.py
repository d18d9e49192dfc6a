import pytest
import torch


@pytest.fixture
def one_thread():
    """Calibration runs long chains of small torch ops (GPTQ's column loop, AWQ's searches): on a
    2-core machine intra-op threads only add synchronisation, 10x and more when another process
    holds a core (GPTQ of a 48 x 256 weight: 0.02 s on one thread, 0.28 s on two under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

"""Test setup. On a machine without CUDA the Triton kernels run under the Triton
interpreter, which must be switched on before anything imports triton."""

import os
import sys
import zlib

if "triton" in sys.modules:  # pragma: no cover
    raise RuntimeError("triton was imported before tests/conftest.py could set TRITON_INTERPRET")

import torch  # noqa: E402  (torch does not import triton at import time)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import qfuse  # noqa: E402,F401


@pytest.fixture(autouse=True)
def fresh_seed(request):
    """A different seed per test (from its id, or $QFUSE_TEST_SEED mixed in), printed on failure."""
    base = int(os.environ.get("QFUSE_TEST_SEED", "0"))
    seed = (zlib.crc32(request.node.nodeid.encode()) + base) % 2**31
    torch.manual_seed(seed)
    yield seed


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

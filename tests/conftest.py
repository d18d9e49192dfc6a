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


def _interpreter_usable() -> None:
    """Stop with the fix, not 600 interpreter errors: triton < 3.7's interpreter turns a loop
    bound into a 1-element numpy array and calls int() on it, which numpy >= 2.4 refuses
    ("only 0-dimensional arrays can be converted to Python scalars", triton-lang/triton#9171).
    Every kernel with a runtime loop fails there (seen with triton 3.6.0, torch 2.11's pair)."""
    from importlib.metadata import version

    def release(name: str) -> tuple[int, ...]:
        return tuple(int(p) for p in version(name).split("+")[0].split(".")[:2] if p.isdigit())

    if os.environ.get("TRITON_INTERPRET") == "1" and release("triton") < (3, 7) and release("numpy") >= (2, 4):
        raise RuntimeError(
            f"triton {version('triton')}'s interpreter cannot run these tests with numpy {version('numpy')} "
            "(triton-lang/triton#9171): install numpy<2.4, or triton>=3.7 (the Makefile installs 3.7.1)"
        )


_interpreter_usable()

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

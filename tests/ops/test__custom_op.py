import pytest
import torch

import qfuse  # noqa: F401  (registers the ops)


def _norm(x):
    return torch.ops.qfuse.rms_norm(x, torch.ones(x.shape[-1], dtype=x.dtype), 1e-6)


def test_eager_call_refuses_an_input_that_requires_grad():
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(RuntimeError, match="qfuse::rms_norm has no backward"):
        _norm(x)
    with torch.no_grad():
        assert _norm(x).shape == (4, 64)


def test_compile_refuses_an_input_that_requires_grad():
    """The Autograd key falls through: without the fake kernel's check the compiled call returned
    an output with no grad_fn, and the gradient through the op was silently zero."""
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="qfuse::rms_norm has no backward"):
        torch.compile(lambda t: t + _norm(t), fullgraph=True)(x)


def test_compile_under_no_grad_matches_eager():
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.equal(torch.compile(_norm, fullgraph=True)(x), _norm(x))

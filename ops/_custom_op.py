"""``custom_op``: the registration of ``torch.library.custom_op`` at a fraction of its per-call cost.

``torch.library.custom_op`` runs every call through Python autograd and pytree handling.
Measured on the CPU (torch 2.13, one thread), a call of ``torch.ops.qfuse.wna16_gemm`` costs
57 us more than its implementation, and a 3-argument op 30 us more; an op whose schema is
defined with ``torch.library.Library`` and whose kernels are registered per dispatch key costs
7 us more. An eager decode step pays that for every qfuse op of every layer, so the ops are
registered here.

Same use as the decorator it replaces::

    @custom_op("qfuse::wna16_gemm")
    def wna16_gemm(x: Tensor, ...) -> Tensor: ...      # the schema comes from the annotations
    @wna16_gemm.register_kernel("cuda")
    def _cuda(x, ...): ...
    @wna16_gemm.register_fake
    def _fake(x, ...): ...
    wna16_gemm(x, ...)                                   # calls torch.ops.qfuse.wna16_gemm

The decorated function is the kernel of every device without its own
(``CompositeExplicitAutograd``, as with ``custom_op``). No op has an autograd formula (the ops
are inference kernels): as with ``custom_op``, a call in grad mode with an input that requires
grad raises. That check sits in the kernels (about 1 us) with the Autograd key a fallthrough,
because a Python Autograd kernel costs 11 us per call (measured as above).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_LIBRARIES: dict[str, torch.library.Library] = {}
OPS: list[CustomOp] = []  # every op defined here, in definition order (ops/_inductor.py)


def _library(namespace: str) -> torch.library.Library:
    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    return _LIBRARIES[namespace]


class CustomOp:
    """A registered operator: call it, or add kernels with ``register_kernel`` / ``register_fake``."""

    def __init__(self, qualname: str, fn: Callable):
        namespace, name = qualname.split("::")
        self.qualname = qualname
        self._name = name
        self._lib = _library(namespace)
        schema = torch.library.infer_schema(fn, mutates_args=())
        self._lib.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
        self._lib.impl(name, _refusing_grad(qualname, fn), "CompositeExplicitAutograd")
        self._lib.impl(name, torch.library.fallthrough_kernel, "Autograd")
        self.default = getattr(getattr(torch.ops, namespace), name).default
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        self.__wrapped__ = fn
        OPS.append(self)

    def register_kernel(self, device_type: str) -> Callable[[Callable], Callable]:
        """Decorator: ``fn`` runs the op for tensors on ``device_type`` (``"cuda"``, ``"cpu"``)."""
        key = {"cuda": "CUDA", "cpu": "CPU"}[device_type]

        def register(fn: Callable) -> Callable:
            self._lib.impl(self._name, _refusing_grad(self.qualname, fn), key)
            return fn

        return register

    def register_fake(self, fn: Callable) -> Callable:
        """Decorator: ``fn`` computes the outputs' metadata (FakeTensor / meta tensors, torch.compile)."""
        # The Autograd key falls through, so under torch.compile only the fake kernel sees a
        # tensor that requires grad: checking there refuses the compile, as the eager call refuses,
        # instead of returning an output with no grad_fn and gradients silently missing that path
        torch.library.register_fake(self.qualname, _refusing_grad(self.qualname, fn), lib=self._lib)
        return fn

    def __call__(self, *args, **kwargs):
        return self.default(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<qfuse op {self.qualname}>"


def _refusing_grad(qualname: str, fn: Callable) -> Callable:
    """``fn``, raising first if grad mode is on and a tensor argument requires grad."""

    def kernel(*args, **kwargs):
        if torch.is_grad_enabled():
            for a in (*args, *kwargs.values()):
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    raise RuntimeError(
                        f"{qualname} has no backward (qfuse's ops are inference kernels): call it under torch.no_grad() "
                        "or torch.inference_mode(), or pass tensors that do not require grad"
                    )
        return fn(*args, **kwargs)

    return kernel


def custom_op(qualname: str) -> Callable[[Callable], CustomOp]:
    """Decorator: define the op ``"namespace::name"`` from a typed function (see the module docstring)."""

    def define(fn: Callable) -> CustomOp:
        return CustomOp(qualname, fn)

    return define

"""``launch``: a Triton launch that skips ``JITFunction.run``'s per-call binding on repeat calls.

``kernel[grid](*args, **meta)`` binds and specializes every argument in Python before it
launches: on the H200 machine's host (torch 2.11, triton 3.6) an empty 14-argument kernel
costs 16.4 us per launch, and the W4A16 word GEMV's 30-argument launch about 28 us of the 76 us
of host time an eager ``QuantLinear`` call took. A model called eagerly (``model.generate``
without ``torch.compile``) waits on that host time at decode batch sizes.

``launch(kernel, grid, *args, **meta)`` is the same call. The first launch of a
specialization goes through Triton (which compiles or finds the kernel) and keeps the compiled
kernel under a key that is finer than Triton's own: the exact value of every non-tensor
argument and meta-parameter, and each tensor's dtype, device and 16-byte alignment (what Triton
specializes a pointer on). A later launch with the same key calls the compiled kernel directly
(``CompiledKernel[grid](*all_args)``), with the arguments Triton would have bound: positional
ones as given, then each remaining parameter from ``meta`` or its default.

Under the interpreter (``TRITON_INTERPRET=1``, the CPU tests) and for CPU tensors the call is
plain ``kernel[grid](...)``.
"""

from __future__ import annotations

import inspect

from torch import Tensor

from ._exact_triton import interpreting

# key -> (compiled kernel, the parameter values after the positional ones)
_compiled: dict[tuple, tuple[object, tuple]] = {}
_MAX_ENTRIES = 8192  # one per (kernel, shape, alignment, meta): a prefill of many lengths adds one per length
# Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when its module is imported
_INTERPRETED = interpreting()
_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_pdl", "debug"})


def _tail(kernel, n_positional: int, meta: dict) -> tuple:
    """The values of the parameters after the first ``n_positional``: from ``meta``, else the default."""
    params = list(inspect.signature(kernel.fn).parameters.values())[n_positional:]
    out = []
    for p in params:
        if p.name in meta:
            out.append(meta[p.name])
        elif p.default is not inspect.Parameter.empty:
            out.append(p.default)
        else:
            raise TypeError(f"{kernel.fn.__name__}: no value for parameter {p.name!r}")
    return tuple(out)


def _compiled_launch(t: Tensor | None) -> bool:
    """Whether a launch whose first tensor is ``t`` runs a compiled kernel (CUDA, no interpreter)."""
    return t is not None and t.is_cuda and not _INTERPRETED


def launch(kernel, grid: tuple, *args, **meta):
    """``kernel[grid](*args, **meta)``, with the binding done once per specialization (module docstring)."""
    first = next((a for a in args if isinstance(a, Tensor)), None)
    if not _compiled_launch(first):
        return kernel[grid](*args, **meta)
    # One device per launch (the ops check it); a list comprehension, not a function per argument:
    # the key is built on every call
    spec = [(a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, Tensor) else a for a in args]
    key = (id(kernel), first.get_device(), tuple(spec), tuple(meta.items()))
    try:
        hit = _compiled.get(key)
    except TypeError:  # an unhashable argument: no cache
        return kernel[grid](*args, **meta)
    if hit is not None:
        compiled, tail = hit
        return compiled[(*grid, 1, 1)[:3]](*args, *tail)  # CompiledKernel's launcher reads grid[0..2]
    compiled = kernel[grid](*args, **meta)
    if len(_compiled) >= _MAX_ENTRIES:
        _compiled.clear()
    _compiled[key] = (compiled, _tail(kernel, len(args), {k: v for k, v in meta.items() if k not in _OPTIONS}))
    return compiled

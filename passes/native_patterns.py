"""Patterns for the torch-native forms (second tier), traced once per process.

Rather than spelling out what Inductor decomposes ``silu`` or an RMSNorm into
(which moves between torch releases: e.g. torch 2.13 turns bf16 ``silu`` into
``convert -> neg -> exp -> add 1 -> div -> convert``), each form is traced with
``pattern_matcher.fwd_only`` (the same decomposition table Inductor uses) and
converted with ``fx_to_pattern``. dtype literals stay in the pattern, so there is
one pattern per activation dtype; ``eps`` is captured through
``scalar_workaround`` with a sentinel that float32 represents exactly (torch's
``rms_norm`` rounds eps to float32).

Each pattern's output node accepts any number of users: when the float result
is also read elsewhere, the rewrite leaves it in place for those readers.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch._inductor.pattern_matcher import MULTIPLE, PatternExpr, fwd_only, fx_to_pattern

EPS_SENTINEL = 2.0**-17  # exact in float32 and float64; no other literal in these graphs equals it
DTYPES = (torch.bfloat16, torch.float16)


def _hf_rms_norm(x, weight):
    """``LlamaRMSNorm.forward`` (also Qwen2 / Mistral): normalize in fp32, round, then weight * y."""
    xf = x.to(torch.float32)
    variance = xf.pow(2).mean(-1, keepdim=True)
    y = xf * torch.rsqrt(variance + EPS_SENTINEL)
    return weight * y.to(x.dtype)


def _torch_rms_norm(x, weight):
    """``F.rms_norm`` / ``nn.RMSNorm``: the weight multiply happens in fp32, one rounding at the end."""
    return F.rms_norm(x, (x.shape[-1],), weight, EPS_SENTINEL)


def _silu(gate):
    return F.silu(gate)


def _functional_inplace(graph) -> None:
    """make_fx does not functionalize: a composite that updates a temporary in place
    (``F.rms_norm``'s ``add_``) traces as ``aten.add_``, while the compiled graph holds
    ``aten.add``. Swap in the functional overload where the mutated input is a temporary
    nobody else reads (always so in these traces; anything else raises)."""
    for n in graph.nodes:
        t = n.target
        if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or not t._schema.is_mutable:
            continue
        base = getattr(torch.ops.aten, t.overloadpacket.__name__.rstrip("_"), None)
        mutated = n.args[0]
        if base is None or mutated.op == "placeholder" or len(mutated.users) != 1:
            raise RuntimeError(f"cannot make {n.format_node()} functional")
        n.target = getattr(base, t._overloadname)


def _trace(fn, args, argnames) -> PatternExpr:
    # Real tracing of tiny CPU tensors; keep any fake mode / tracing context of an
    # ongoing compile out of it.
    from torch._guards import tracing
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), tracing(None):
        gm = fwd_only(fn, args)
    _functional_inplace(gm.graph)
    pattern = fx_to_pattern(gm, argnames=argnames, scalar_workaround={"eps": EPS_SENTINEL})
    pattern.users = MULTIPLE
    return pattern


@functools.cache
def hf_rms_norm_patterns() -> tuple[tuple[torch.dtype, PatternExpr], ...]:
    out = []
    for dt in DTYPES:
        args = [torch.randn(4, 16).to(dt), torch.randn(16).to(dt)]
        out.append((dt, _trace(_hf_rms_norm, args, ("x", "weight"))))
    return tuple(out)


@functools.cache
def torch_rms_norm_patterns() -> tuple[tuple[torch.dtype, int, PatternExpr], ...]:
    # The decomposition names the reduced dim positively, so one pattern per rank.
    out = []
    for dt in DTYPES:
        for rank in (2, 3):
            args = [torch.randn(*(2,) * (rank - 1), 16).to(dt), torch.randn(16).to(dt)]
            out.append((dt, rank, _trace(_torch_rms_norm, args, ("x", "weight"))))
    return tuple(out)


@functools.cache
def silu_patterns() -> tuple[tuple[torch.dtype, PatternExpr], ...]:
    out = []
    for dt in DTYPES:
        out.append((dt, _trace(_silu, [torch.randn(4, 16).to(dt)], ("gate",))))
    return tuple(out)

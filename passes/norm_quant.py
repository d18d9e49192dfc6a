"""RMSNorm (optionally after a residual add) followed by per-token int8 quant.

Recognizers, each ``producer node -> Plan | None``; ``producer`` is what the quant
reads once row-preserving reshapes are peeled off:

    fused_add_rms_norm(x, r, w, eps)[0]            -> fused_add_rms_norm_quant(x, r, w, eps)
    rms_norm(x + r, w, eps)          (plain add)   -> fused_add_rms_norm_quant(x, r, w, eps)
    rms_norm(x, w, eps)                            -> rms_norm_quant(x, w, eps)
    HF LlamaRMSNorm decomposition  (+ plain add)   -> same two, second tier
    F.rms_norm decomposition       (+ plain add)   -> same two, opt-in (rounds differently)

Checks before any rewrite (else no fusion): activation fp16/bf16, weight of the
same dtype and shape [H], eps a positive Python float (a constant in the graph),
an add of two tensors of the norm input's exact shape and dtype (no broadcast, no
type promotion, no ``alpha``), and the fused op's own argument checks on metadata.
``x + r`` equals ``r + x`` bit for bit, so the operand order does not matter.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from . import graph_utils as gu
from .native_patterns import hf_rms_norm_patterns, torch_rms_norm_patterns
from .rewrite import Plan

qfuse = torch.ops.qfuse
aten = torch.ops.aten
ACT_DTYPES = (torch.float16, torch.bfloat16)


def _eps_ok(eps) -> bool:
    return isinstance(eps, (float, int)) and not isinstance(eps, bool) and eps > 0


def norm_args_ok(x, w, eps) -> bool:
    xv, wv = gu.val(x), gu.val(w)
    if xv is None or wv is None or not _eps_ok(eps):
        return False
    return xv.dtype in ACT_DTYPES and wv.dtype == xv.dtype and wv.dim() == 1 and gu.same_size(wv.shape[0], xv.shape[-1])


def foldable_add(x) -> tuple[Node, Node] | None:
    """``(a, b)`` when ``x = a + b`` can become the residual add of fused_add_rms_norm."""
    if not isinstance(x, Node) or x.op != "call_function" or x.target is not aten.add.Tensor:
        return None
    if len(x.args) != 2 or any(k != "alpha" or v != 1 for k, v in x.kwargs.items()):
        return None
    a, b = x.args
    xv, av, bv = gu.val(x), gu.val(a), gu.val(b)
    if xv is None or av is None or bv is None:
        return None
    if not (av.dtype == bv.dtype == xv.dtype) or not (gu.same_shape(av.shape, xv.shape) and gu.same_shape(bv.shape, xv.shape)):
        return None
    return a, b


def _plan(x, w, eps, producer: Node, dead: list[Node], with_add: bool) -> Plan | None:
    if not norm_args_ok(x, w, eps):
        return None
    if with_add:
        ab = foldable_add(x)
        if ab is None:
            return None
        plan = Plan(qfuse.fused_add_rms_norm_quant.default, (*ab, w, float(eps)), producer, residual=[x], dead=dead)
    else:
        plan = Plan(qfuse.rms_norm_quant.default, (x, w, float(eps)), producer, dead=dead)
    return plan if plan.validate() else None


def _qfuse_rms_norm(prod: Node):
    if prod.op != "call_function" or prod.target is not qfuse.rms_norm.default:
        return None
    return gu.op_arg(prod, 0, "x"), gu.op_arg(prod, 1, "weight"), gu.op_arg(prod, 2, "eps")


def fused_add_rms_norm(prod: Node) -> Plan | None:
    """``fused_add_rms_norm(...)[0]`` -> ``fused_add_rms_norm_quant``; its residual output moves over."""
    if prod.op != "call_function" or prod.target is not operator.getitem or prod.args[1] != 0:
        return None
    f = prod.args[0]
    if not isinstance(f, Node) or f.op != "call_function" or f.target is not qfuse.fused_add_rms_norm.default:
        return None
    x, r, w, eps = (gu.op_arg(f, i, n) for i, n in enumerate(("x", "residual", "weight", "eps")))
    if not norm_args_ok(x, w, eps):
        return None
    try:
        residual = gu.getitem_users(f).get(1, [])
    except ValueError:
        return None
    plan = Plan(qfuse.fused_add_rms_norm_quant.default, (x, r, w, float(eps)), prod, residual=residual, dead=[f])
    return plan if plan.validate() else None


def add_rms_norm(prod: Node) -> Plan | None:
    """``rms_norm(a + b)`` (HF decoders add the residual in plain torch) -> ``fused_add_rms_norm_quant``."""
    args = _qfuse_rms_norm(prod)
    return None if args is None else _plan(*args, prod, [], with_add=True)


def rms_norm(prod: Node) -> Plan | None:
    args = _qfuse_rms_norm(prod)
    return None if args is None else _plan(*args, prod, [], with_add=False)


def _native(prod: Node, patterns, with_add: bool) -> Plan | None:
    pv = gu.val(prod)
    if pv is None or prod.op != "call_function":
        return None
    for entry in patterns:
        dt, pattern = entry[0], entry[-1]
        if pv.dtype != dt or (len(entry) == 3 and pv.dim() != entry[1]):
            continue
        m = pattern.match(prod)
        if not m:
            continue
        x, w, eps = m.kwargs["x"], m.kwargs["weight"], m.kwargs["eps"]
        if gu.val(x) is None or gu.val(x).dtype != dt:
            return None
        return _plan(x, w, eps, prod, list(m.nodes), with_add)
    return None


def add_hf_rms_norm(prod: Node) -> Plan | None:
    return _native(prod, hf_rms_norm_patterns(), with_add=True)


def hf_rms_norm(prod: Node) -> Plan | None:
    return _native(prod, hf_rms_norm_patterns(), with_add=False)


def add_torch_rms_norm(prod: Node) -> Plan | None:
    return _native(prod, torch_rms_norm_patterns(), with_add=True)


def torch_rms_norm(prod: Node) -> Plan | None:
    return _native(prod, torch_rms_norm_patterns(), with_add=False)

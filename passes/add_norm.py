"""A residual add read by an RMSNorm, left without a quant after it: ``fused_add_rms_norm``.

    y = a + b;  out = rms_norm(y, w, eps);  ... y ...   ->   out, y' = fused_add_rms_norm(a, b, w, eps);  ... y' ...

Hugging Face decoders add the residual in plain torch and then call the norm module, whose
``qfuse::rms_norm`` Inductor cannot see into: the add stays a kernel of its own, two per
decoder layer. The weight-only schemes quantize no activation, so the quant fusions
(norm_quant.py) never take these adds; this pass runs after them on what is left. The fused op
computes ``y' = a + b`` in the activation dtype and normalizes it exactly as ``rms_norm``
(ops/rms_norm.py), so the rewrite changes no bit. Readers of ``y`` placed before the fused op
keep the add (then nothing is saved, and nothing is lost).
"""

from __future__ import annotations

import torch
from torch.fx import Graph

from . import graph_utils as gu
from .norm_quant import foldable_add, norm_args_ok

qfuse = torch.ops.qfuse


def fuse_add_rms_norm(graph: Graph) -> int:
    """Rewrite every ``rms_norm(a + b)`` the fused op accepts; returns how many."""
    fused = 0
    for norm in list(graph.find_nodes(op="call_function", target=qfuse.rms_norm.default)):
        x, w, eps = gu.op_arg(norm, 0, "x"), gu.op_arg(norm, 1, "weight"), gu.op_arg(norm, 2, "eps")
        ab = foldable_add(x) if norm_args_ok(x, w, eps) else None
        if ab is None:
            continue
        args = (*ab, w, float(eps))
        try:
            fake = tuple(gu.fake_call(qfuse.fused_add_rms_norm.default, args))
        except (TypeError, ValueError, RuntimeError):  # the op's own checks refuse it: no fusion
            continue
        with graph.inserting_before(gu.insertion_point(graph, args).next):
            node = gu.call(graph, qfuse.fused_add_rms_norm.default, args, fake=fake)
            out, residual = gu.getitem(graph, node, 0), gu.getitem(graph, node, 1)
        norm.replace_all_uses_with(out)
        graph.erase_node(norm)
        gu.replace_uses_after(x, residual, graph)
        gu.erase_dead(graph, [x])
        fused += 1
    return fused

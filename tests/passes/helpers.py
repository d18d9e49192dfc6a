"""Shared helpers for the pass tests: compile with/without the qfuse passes, record the
post-grad graph before and after them, print graphs in a version-stable form."""

from __future__ import annotations

import operator

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

import qfuse.passes as qp
from qfuse.compile import compile as qcompile

QUANT = torch.ops.qfuse.quant_per_token_int8.default
# emulate_precision_casts: Inductor rounds bf16/fp16 intermediates where eager does, so
# the unfused compile equals eager and the fused ops (defined as the eager composition)
# can be compared bit for bit. Without it Inductor keeps e.g. silu's result in fp32
# before the multiply (int8 codes then move by 1 in ~1% of elements).
EXACT = {"emulate_precision_casts": True}


class Recorder(CustomGraphPass):
    """A post-grad pass that only records the graph it sees (as a normalized string and op counts)."""

    def __init__(self):
        self.graphs: list[str] = []
        self.counts: list[dict[str, int]] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.graphs.append(normalize(graph))
        c: dict[str, int] = {}
        for n in graph.nodes:
            if n.op == "call_function":
                c[short(n.target)] = c.get(short(n.target), 0) + 1
        self.counts.append(c)

    def uuid(self):
        return None  # never cache: we want to see the graph every time


class Before(CustomGraphPass):
    """Record, run the qfuse pass, record again."""

    def __init__(self, config=None):
        self.before, self.after = Recorder(), Recorder()
        self.qfuse = qp.QfusePostGradPass(config)

    def __call__(self, graph):
        self.before(graph)
        self.qfuse(graph)
        self.after(graph)

    def uuid(self):
        return None


def short(target) -> str:
    if target is operator.getitem:
        return "getitem"
    if target in (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default):
        return "aten.reshape"
    name = str(target)
    return name[: -len(".default")] if name.endswith(".default") else name


def normalize(graph: torch.fx.Graph) -> str:
    """One line per call node, nodes renamed by position (names differ across torch versions)."""
    names: dict[torch.fx.Node, str] = {}
    lines = []
    n_in = n_v = 0

    def fmt(a):
        if isinstance(a, torch.fx.Node):
            return names[a]
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(fmt(x) for x in a) + "]"
        return repr(a)

    for n in graph.nodes:
        if n.op == "placeholder":
            names[n] = f"in{n_in}"
            n_in += 1
        elif n.op == "call_function":
            names[n] = f"v{n_v}"
            n_v += 1
            args = [fmt(a) for a in n.args] + [f"{k}={fmt(v)}" for k, v in n.kwargs.items()]
            lines.append(f"{names[n]} = {short(n.target)}({', '.join(args)})")
        elif n.op == "output":
            lines.append(f"return {fmt(n.args[0])}")
    return "\n".join(lines)


def run_compiled(fn, args, *, passes: bool, options=None, config=None, **kw):
    """Compile ``fn`` fresh (dynamo reset) with or without the passes and call it once."""
    torch._dynamo.reset()
    opts = dict(options or {})
    with torch.inference_mode():
        if passes:
            compiled = qcompile(fn, fullgraph=True, options=opts, pass_config=config, **kw)
        else:
            compiled = torch.compile(fn, fullgraph=True, options=opts, **kw)
        return compiled(*args)


def fused_vs_unfused(fn, args, config=None, options=None):
    """(unfused output, fused output, qfuse counters of the fused compile, Before recorder)."""
    options = {**EXACT, **(options or {})}
    unfused = run_compiled(fn, args, passes=False, options=options)
    rec = Before(config)
    qp.reset_counters()
    fused = run_compiled(fn, args, passes=False, options={**options, "post_grad_custom_post_pass": rec})
    return unfused, fused, dict(qp.counters), rec


def assert_same(a, b):
    """Exact equality of (nested tuples of) tensors."""
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b), f"max abs diff {(a.float() - b.float()).abs().max().item()}"


def count_standalone_quants(recorder: Recorder) -> int:
    return sum(c.get("qfuse.quant_per_token_int8", 0) for c in recorder.counts)

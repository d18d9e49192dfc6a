"""ops/_inductor.py: qfuse's ops get their Inductor fallbacks before a compile, so Inductor never
formats their arguments for its implicit-fallback log line (torch 2.11 formats it, logged or
not; the 32-layer W4A8 decode step stalled there)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch._inductor import exc, lowering

import qfuse
from qfuse.ops._custom_op import OPS
from qfuse.ops._inductor import register_inductor_fallbacks
from tests.hf_models import tiny_hf_model


@pytest.fixture
def without_qfuse_lowerings(monkeypatch):
    """Inductor's lowering table as before any qfuse op was compiled (restored afterwards)."""
    for op in OPS:
        if op.default in lowering.lowerings:
            monkeypatch.delitem(lowering.lowerings, op.default)


def test_every_op_gets_the_fallback_and_layout_constraint_of_the_implicit_one(without_qfuse_lowerings):
    qfuse_ops = {name for name in torch._C._dispatch_get_all_op_names() if name.startswith("qfuse::")}
    assert {op.qualname for op in OPS} == qfuse_ops and len(qfuse_ops) >= 12  # no op defined another way
    assert not any(op.default in lowering.lowerings for op in OPS)
    register_inductor_fallbacks()
    register_inductor_fallbacks()  # idempotent
    for op in OPS:
        assert op.default in lowering.lowerings and op.default in lowering.needs_realized_inputs, op.qualname
        tag = lowering.get_layout_constraint_tag(op.default, with_default=True)
        assert lowering.maybe_layout_constraints(op.default) is lowering.tag_to_layout_constraint(tag), op.qualname


class _Formatting(logging.Handler):
    """Formats every record, as a handler that writes them would."""

    def emit(self, record):
        record.getMessage()


def test_a_compile_with_the_passes_never_formats_a_qfuse_ops_arguments(without_qfuse_lowerings, monkeypatch):
    formatted = []

    def operator_str(target, args, kwargs):
        formatted.append(str(target))
        return str(target)

    monkeypatch.setattr(exc.OperatorIssue, "operator_str", staticmethod(operator_str))
    graph_log = logging.getLogger("torch._inductor.graph")  # torch 2.13 formats the line only when it is emitted
    handler, level = _Formatting(), graph_log.level
    graph_log.addHandler(handler)
    graph_log.setLevel(logging.INFO)
    model = qfuse.quantize_model(tiny_hf_model("llama", layers=2, hidden=128, intermediate=256, vocab=128), "W4A8", progress=False)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    try:
        torch._dynamo.reset()
        with torch._inductor.config.patch(force_disable_caches=True), torch.no_grad():
            compiled = qfuse.compile(copy.deepcopy(model), fullgraph=True)
            got = compiled(ids).logits
            want = model(ids).logits
    finally:
        graph_log.removeHandler(handler)
        graph_log.setLevel(level)
        torch._dynamo.reset()
    assert formatted == []
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)

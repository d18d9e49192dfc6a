"""Post-grad graphs before/after the passes (expecttest, normalized: node names by
position, view/reshape spelled alike), the FX graph cache, uuid, and qfuse.compile."""

import subprocess
import sys
from pathlib import Path

import expecttest
import torch
from torch._dynamo.utils import counters as torch_counters
from torch._inductor import custom_graph_pass
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.utils import fresh_cache

import qfuse.passes as qp
from qfuse.compile import _compile_kwargs, inductor_options
from qfuse.compile import compile as qcompile

from .helpers import Before, assert_same, fused_vs_unfused, run_compiled

q = torch.ops.qfuse
H = 32


def quant(t):
    return q.quant_per_token_int8(t.reshape(-1, t.shape[-1]))


def decoder_tail(x, r, w1, w2):
    """add + norm -> 3 quants (q/k/v), then a plain norm -> quant. qfuse ops only, so the
    graph is the same on every torch (silu's decomposition is not; it is tested by counts)."""
    h = x + r
    y = q.rms_norm(h, w1, 1e-6)
    a, b, c = quant(y), quant(y), quant(y)
    z = quant(q.rms_norm(x, w2, 1e-5))
    return a, b, c, z, h


def _args(t: int = 3):
    bf = torch.bfloat16
    return (torch.randn(2, t, H).to(bf), torch.randn(2, t, H).to(bf), torch.randn(H).to(bf), torch.randn(H).to(bf))


class TestGraphs(expecttest.TestCase):
    def test_post_grad_graph_before_and_after(self):
        unfused, fused, counts, rec = fused_vs_unfused(decoder_tail, _args())
        assert_same(unfused, fused)
        self.assertEqual({k: v for k, v in counts.items() if v}, {"dedup_quant": 2, "add_rms_norm_quant": 1, "rms_norm_quant": 1})
        self.assertExpectedInline(
            rec.before.graphs[0],
            """\
v0 = aten.add.Tensor(in0, in1)
v1 = qfuse.rms_norm(v0, in2, 1e-06)
v2 = aten.reshape(v1, [-1, 32])
v3 = qfuse.quant_per_token_int8(v2)
v4 = getitem(v3, 0)
v5 = getitem(v3, 1)
v6 = aten.reshape(v1, [-1, 32])
v7 = qfuse.quant_per_token_int8(v6)
v8 = getitem(v7, 0)
v9 = getitem(v7, 1)
v10 = aten.reshape(v1, [-1, 32])
v11 = qfuse.quant_per_token_int8(v10)
v12 = getitem(v11, 0)
v13 = getitem(v11, 1)
v14 = qfuse.rms_norm(in0, in3, 1e-05)
v15 = aten.reshape(v14, [-1, 32])
v16 = qfuse.quant_per_token_int8(v15)
v17 = getitem(v16, 0)
v18 = getitem(v16, 1)
return [v4, v5, v8, v9, v12, v13, v17, v18, v0]""",
        )
        self.assertExpectedInline(
            rec.after.graphs[0],
            """\
v0 = qfuse.fused_add_rms_norm_quant(in0, in1, in2, 1e-06)
v1 = getitem(v0, 0)
v2 = getitem(v0, 1)
v3 = getitem(v0, 2)
v4 = qfuse.rms_norm_quant(in0, in3, 1e-05)
v5 = getitem(v4, 0)
v6 = getitem(v4, 1)
v7 = aten.reshape(v1, [-1, 32])
v8 = aten.reshape(v2, [-1, 1])
v9 = aten.reshape(v5, [-1, 32])
v10 = aten.reshape(v6, [-1, 1])
return [v7, v8, v7, v8, v7, v8, v9, v10, v3]""",
        )


def _rms_quant(x, w):
    return quant(q.rms_norm(x, w, 1e-6))


def test_fx_graph_cache_hit_on_second_compile():
    args = (torch.randn(4, H).to(torch.bfloat16), torch.randn(H).to(torch.bfloat16))
    with fresh_cache(), torch._inductor.config.patch(fx_graph_cache=True):
        torch_counters.clear()
        qp.reset_counters()
        first = run_compiled(_rms_quant, args, passes=True)
        assert torch_counters["inductor"]["fxgraph_cache_miss"] == 1
        assert torch_counters["inductor"]["fxgraph_cache_bypass"] == 0
        assert qp.counters["rms_norm_quant"] == 1
        second = run_compiled(_rms_quant, args, passes=True)
        assert torch_counters["inductor"]["fxgraph_cache_hit"] == 1
        assert qp.counters["rms_norm_quant"] == 1  # served from the cache: the pass did not run again
        assert_same(first, second)
        # another config is another cache entry
        run_compiled(_rms_quant, args, passes=True, config=qp.PassConfig(torch_rms_norm=True))
        assert torch_counters["inductor"]["fxgraph_cache_miss"] == 2


def test_uuid_covers_config_and_chained_pass():
    a, b = qp.QfusePostGradPass(), qp.QfusePostGradPass(qp.PassConfig())
    assert a.uuid() == b.uuid() and isinstance(a.uuid(), str)
    assert qp.QfusePostGradPass(qp.PassConfig(torch_rms_norm=True)).uuid() != a.uuid()

    class WithUuid(CustomGraphPass):
        def __call__(self, graph):
            pass

        def uuid(self):
            return "user-pass-v1"

    assert qp.QfusePostGradPass(then=WithUuid()).uuid() not in (None, a.uuid())
    assert qp.QfusePostGradPass(then=lambda graph: None).uuid() is None  # Inductor must bypass the cache


def test_inductor_options_is_one_pass_object():
    opts = inductor_options()
    assert list(opts) == ["post_grad_custom_post_pass"]
    assert isinstance(opts["post_grad_custom_post_pass"], qp.QfusePostGradPass)  # not a list: torch 2.11 rejects lists
    assert inductor_options(fuse_act_quant=False)["post_grad_custom_post_pass"].config.fuse_act_quant is False


def test_importing_qfuse_changes_no_inductor_config():
    assert torch._inductor.config.post_grad_custom_post_pass is None
    assert torch._inductor.config.post_grad_custom_pre_pass is None


def test_qfuse_compile_merges_mode_options_and_chains_user_pass(monkeypatch):
    seen = {}

    def fake_compile(model, **kwargs):
        seen.update(kwargs)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    user = Before()
    qcompile(torch.nn.Identity(), mode="max-autotune-no-cudagraphs", fullgraph=True, options={"post_grad_custom_post_pass": user})
    assert "mode" not in seen and seen["fullgraph"] is True
    assert seen["options"]["max_autotune"] is True
    p = seen["options"]["post_grad_custom_post_pass"]
    assert isinstance(p, qp.QfusePostGradPass) and p.then is user
    seen.clear()
    qcompile(torch.nn.Identity(), passes=False, mode="default")
    assert seen == {"mode": "default"}
    try:
        qcompile(torch.nn.Identity(), backend="eager")
    except ValueError as e:
        assert "backend='inductor'" in str(e)
    else:
        raise AssertionError("backend='eager' must be refused")


def test_qfuse_compile_runs_the_passes():
    args = (torch.randn(4, H).to(torch.bfloat16), torch.randn(H).to(torch.bfloat16))
    qp.reset_counters()
    rec = Before()
    out = run_compiled(_rms_quant, args, passes=True, options={"post_grad_custom_post_pass": rec})
    assert qp.counters["rms_norm_quant"] == 1  # qfuse's pass ran (before the chained recorder)
    assert "qfuse.rms_norm_quant" in rec.before.graphs[0]  # the chained pass saw the fused graph
    assert_same(out, _rms_quant(*args))


def test_qfuse_compile_runs_a_globally_set_user_pass_after_its_own():
    """A pass set in torch._inductor.config (not options=) still runs, after qfuse's; a qfuse pass
    set there is not run twice."""
    import torch._inductor.config as inductor_config

    args = (torch.randn(4, H).to(torch.bfloat16), torch.randn(H).to(torch.bfloat16))
    rec = Before()
    with inductor_config.patch(post_grad_custom_post_pass=rec):
        out = run_compiled(_rms_quant, args, passes=True)
    assert "qfuse.rms_norm_quant" in rec.before.graphs[0]
    assert_same(out, _rms_quant(*args))
    rec2 = Before()
    with inductor_config.patch(post_grad_custom_post_pass=qp.QfusePostGradPass(then=rec2)):
        chained = _compile_kwargs(True, None, {})["options"]["post_grad_custom_post_pass"]
    assert chained.then is rec2


# torch 2.13 added CustomInferenceAwareGraphPass; torch 2.11 has none (a plain CustomGraphPass then)
_INFERENCE_AWARE = getattr(custom_graph_pass, "CustomInferenceAwareGraphPass", None)


class InferenceAware(_INFERENCE_AWARE or CustomGraphPass):
    def __init__(self):
        self.calls = []

    def __call__(self, graph, is_inference=None):
        self.calls.append(is_inference)

    def uuid(self):
        return None


def test_qfuse_compile_runs_a_list_of_user_passes_after_its_own():
    """torch >= 2.13 takes a list in post_grad_custom_post_pass: each pass runs, in order; an
    inference-aware pass gets is_inference, as Inductor calls it."""
    args = (torch.randn(4, H).to(torch.bfloat16), torch.randn(H).to(torch.bfloat16))
    first, aware, second = Before(), InferenceAware(), Before()
    out = run_compiled(_rms_quant, args, passes=True, options={"post_grad_custom_post_pass": [first, aware, second]})
    assert "qfuse.rms_norm_quant" in first.before.graphs[0] and "qfuse.rms_norm_quant" in second.before.graphs[0]
    assert aware.calls == [True if _INFERENCE_AWARE is not None else None]  # without the class it is called as a plain pass
    assert_same(out, _rms_quant(*args))

    class WithUuid(CustomGraphPass):
        def __init__(self, name):
            self.name = name

        def __call__(self, graph):
            pass

        def uuid(self):
            return self.name

    a, b = WithUuid("a"), WithUuid("b")
    assert qp.QfusePostGradPass(then=[a, b]).uuid() not in (None, qp.QfusePostGradPass(then=[b, a]).uuid(), qp.QfusePostGradPass(then=a).uuid())
    assert qp.QfusePostGradPass(then=(a, lambda graph: None)).uuid() is None  # one pass without a uuid: no cache


_WITHOUT_INFERENCE_AWARE = """
import torch._inductor.fx_passes.post_grad  # holds its own reference to the class
from torch._inductor import custom_graph_pass

del custom_graph_pass.CustomInferenceAwareGraphPass  # as on torch 2.11, before qfuse.passes is imported
import qfuse.passes.manager as manager
from tests.passes import test_graphs_and_cache as t

assert manager.QfusePostGradPass.__mro__[1] is custom_graph_pass.CustomGraphPass
t.test_qfuse_compile_runs_a_list_of_user_passes_after_its_own()
print("ok")
"""


def test_passes_and_this_module_on_a_torch_without_inference_aware_passes():
    """torch 2.11 has no CustomInferenceAwareGraphPass: this module imports, the qfuse pass is a
    plain CustomGraphPass that Inductor calls with the graph alone, and chained passes still run."""
    root = Path(__file__).resolve().parents[2]
    # the environment as conftest.py left it (TRITON_INTERPRET)
    r = subprocess.run([sys.executable, "-c", _WITHOUT_INFERENCE_AWARE], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_dynamic_shapes_one_compile_two_token_counts():
    """Symbolic token counts: the output reshapes reuse the graph's own (symbolic) sizes."""
    qp.reset_counters()
    torch._dynamo.reset()
    with fresh_cache(), torch.inference_mode():  # a cache hit would run no pass (and count nothing)
        fused = qcompile(decoder_tail, fullgraph=True, dynamic=True)
        for t in (3, 5):
            args = _args(t)
            assert_same(fused(*args), decoder_tail(*args))  # CPU: the fused ops are the eager composition
    assert qp.counters["add_rms_norm_quant"] == 1  # compiled once, for both token counts
    assert qp.counters["rms_norm_quant"] == 1

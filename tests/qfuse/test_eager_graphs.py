"""Eager CUDA-graph replays (qfuse/eager_graphs.py) on the CPU: when a call may replay, and the
bookkeeping of :class:`EagerGraphs` with the capture stood in by a recorder (the real captures
and their bits run on the GPU: tests/qfuse/test_eager_graphs_gpu.py)."""

import copy
import io
import types

import pytest
import torch

import qfuse
from qfuse import eager_graphs
from qfuse.eager_graphs import EagerGraphs, graphs_of, replayable
from tests.helpers import run_in_threads


def test_cpu_calls_never_replay():
    assert not replayable(torch.randn(1, 8))


def test_modules_keep_graphs_out_of_state_dict_copies_and_pickles():
    q = qfuse.QuantLinear.from_linear(torch.nn.Linear(256, 32, dtype=torch.bfloat16), "W4A16")
    keys = set(q.state_dict())
    graphs = graphs_of(q)
    assert graphs_of(q) is graphs and set(q.state_dict()) == keys
    assert graphs_of(copy.deepcopy(q)) is not graphs
    buf = io.BytesIO()
    torch.save(q, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert len(graphs_of(loaded)) == 0
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    assert torch.equal(loaded(x), q(x))


class _Recorder:
    """Stands in for the capture: a "graph" whose replay calls ``fn`` on the static inputs."""

    def __init__(self):
        self.captures = 0

    def capture(self, fn, inputs, stream):
        self.captures += 1
        static = tuple(t.clone() for t in inputs)
        graph = types.SimpleNamespace()
        entry = eager_graphs._Graph(graph, static, fn(*static))
        graph.replay = lambda: entry.output.copy_(fn(*static))  # into the output's memory, as a graph does
        return entry


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(EagerGraphs, "_capture", staticmethod(rec.capture))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)  # absent from CPU builds
    return rec


def test_plain_call_then_capture_then_replays(recorder):
    graphs, w = EagerGraphs(), torch.randn(4)
    calls = []

    def fn(x):
        calls.append(x)
        return x * w

    x1, x2 = torch.randn(2, 4), torch.randn(2, 4)
    assert torch.equal(graphs(fn, (w,), x1), x1 * w) and recorder.captures == 0 and len(graphs) == 0
    assert torch.equal(graphs(fn, (w,), x2), x2 * w) and recorder.captures == 1 and len(graphs) == 1
    a = graphs(fn, (w,), x1)
    b = graphs(fn, (w,), x2)
    assert recorder.captures == 1
    assert torch.equal(a, x1 * w) and torch.equal(b, x2 * w)  # each call's own output: not the graph's buffer
    w.mul_(2)  # an in-place update: the replay reads it
    assert torch.equal(graphs(fn, (w,), x1), x1 * w)
    assert graphs(fn, (w,), torch.randn(3, 4)).shape == (3, 4) and recorder.captures == 1  # a new shape: plain first


def test_new_weights_or_too_many_shapes_drop_the_graphs(recorder):
    graphs, fn = EagerGraphs(), lambda x: x + 1
    w = torch.zeros(1)
    for _ in range(2):
        graphs(fn, (w,), torch.randn(1, 4))
    assert len(graphs) == 1
    graphs(fn, (torch.zeros(1),), torch.randn(1, 4))  # another tensor (a moved or reloaded module)
    assert len(graphs) == 0
    for rows in range(1, eager_graphs.MAX_GRAPHS + 2):
        for _ in range(2):
            graphs(fn, (w,), torch.randn(rows, 4))
    assert 1 <= len(graphs) <= eager_graphs.MAX_GRAPHS


def test_a_capture_that_fails_warns_and_turns_the_replays_off(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)  # absent from CPU builds
    monkeypatch.setattr(eager_graphs, "_failed", False)

    def refuse(fn, inputs, stream):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(EagerGraphs, "_capture", staticmethod(refuse))
    graphs, x = EagerGraphs(), torch.randn(2, 4)
    graphs(lambda t: t * 2, (), x)
    with pytest.warns(UserWarning, match="could not be captured"):
        assert torch.equal(graphs(lambda t: t * 2, (), x), x * 2)
    assert torch.equal(graphs(lambda t: t * 2, (), x), x * 2)  # no second attempt, no second warning
    assert not eager_graphs.enabled()  # a failed capture may leave the allocator's capture state behind


def test_static_inputs_take_an_expanded_input():
    """A graph's input buffer has the input's strides unless its elements overlap (``expand``): the
    copy into it is then refused by torch, which made the capture fail and turned every graph off."""
    expanded = torch.randn(1, 8).expand(4, 8)
    buffer = eager_graphs.static_input(expanded)
    assert buffer.is_contiguous() and torch.equal(buffer.copy_(expanded), expanded)
    sliced = torch.randn(4, 16)[:, ::2]
    buffer = eager_graphs.static_input(sliced)
    assert buffer.stride() == sliced.stride() and torch.equal(buffer.copy_(sliced), sliced)


def test_mlp_blocks_get_a_graphed_forward_that_copies_and_pickles_with_them():
    from tests.hf_models import tiny_hf_model

    model = qfuse.quantize_model(tiny_hf_model("llama"), "W4A16", progress=False)
    mlp = model.model.layers[0].mlp
    assert type(mlp).__name__ == "LlamaMLP" and isinstance(mlp.__dict__["forward"], eager_graphs._GraphedForward)
    assert eager_graphs.graph_blocks(model) == 0  # already given
    ids = torch.randint(0, 256, (1, 5))
    with torch.inference_mode():
        ref = model(ids, use_cache=False).logits
        twin = copy.deepcopy(model)
        assert twin.model.layers[0].mlp.forward.module is twin.model.layers[0].mlp
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        assert loaded.model.layers[0].mlp.forward.module is loaded.model.layers[0].mlp
        twin.model.layers[0].mlp.down_proj.scales.mul_(2)  # the copy's own weights
        assert torch.equal(model(ids, use_cache=False).logits, ref) and torch.equal(loaded(ids, use_cache=False).logits, ref)
        assert not torch.equal(twin(ids, use_cache=False).logits, ref)


def test_threads_sharing_a_stream_get_their_own_results(recorder):
    """Two threads on one stream (a server's default stream) must not copy into the same graph's
    inputs between the other's copy and replay: the replay would compute the other's input."""
    import time

    graphs, w = EagerGraphs(), torch.randn(4)

    def slow_double(x):  # the graph's kernels: they read the static input some time after the copy
        time.sleep(0.002)
        return x * 2

    graphs(slow_double, (w,), torch.zeros(4))  # plain call
    graphs(slow_double, (w,), torch.zeros(4))  # capture
    wrong = []

    def worker(i):
        for j in range(20):
            x = torch.full((4,), float(100 * i + j))
            if not torch.equal(graphs(slow_double, (w,), x), x * 2):
                wrong.append((i, j))

    run_in_threads(worker, 4)
    assert not wrong, f"{len(wrong)} of 80 calls returned another thread's result"


def test_switches_read_on_off_spellings_and_refuse_other_values(monkeypatch):
    for value, on in (("false", False), ("off", False), ("0", False), ("yes", True), ("1", True), ("", True)):
        monkeypatch.setenv("QFUSE_EAGER_GRAPHS", value)
        assert eager_graphs.enabled() is on, value
    monkeypatch.setenv("QFUSE_EAGER_GRAPHS", "disabled")
    with pytest.raises(ValueError, match="QFUSE_EAGER_GRAPHS='disabled'"):
        eager_graphs.enabled()
    monkeypatch.setenv("QFUSE_EAGER_GRAPH_ROWS", "16")
    assert eager_graphs.max_rows() == 16
    monkeypatch.setenv("QFUSE_EAGER_GRAPH_ROWS", "sixteen")
    with pytest.raises(ValueError, match="QFUSE_EAGER_GRAPH_ROWS='sixteen'"):
        eager_graphs.max_rows()

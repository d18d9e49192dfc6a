"""Eager CUDA-graph replays on the GPU: every scheme's QuantLinear, RMSNorm, a MoE block and a
whole decoder give the bits of the plain calls, outputs are the caller's own, weights updated
in place are read, a moved module captures again, and a user's own capture records plain ops."""

import pytest
import torch

import qfuse
from qfuse.eager_graphs import graphs_of
from tests.helpers import run_in_threads
from tests.hf_models import tiny_hf_model

pytestmark = pytest.mark.gpu


def _linear(n, k, scheme):
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n, bias=True, device="cuda", dtype=torch.bfloat16)
    return qfuse.QuantLinear.from_linear(lin, scheme)


@pytest.mark.parametrize("scheme", list(qfuse.SCHEMES))
@pytest.mark.parametrize("m", [1, 2, 7, 16])
def test_replays_give_the_plain_calls_bits(scheme, m):
    q = _linear(1000, 4096, scheme)  # N = 1000: a partial last row tile
    xs = [torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    with torch.inference_mode():
        outs = [q(x) for x in xs]  # plain, capture, replay, replay
        assert len(graphs_of(q)) == 1
        for x, out in zip(xs, outs):
            assert torch.equal(out, q._forward(x))  # every output its own (not the graph's buffer)
        assert len({o.data_ptr() for o in outs}) == len(outs)


def test_in_place_weight_updates_are_read_and_a_moved_module_captures_again():
    q = _linear(512, 1024, "W4A16")
    x = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        q(x), q(x)
        q.scales.mul_(2)
        assert torch.equal(q(x), q._forward(x))
        q.to("cpu").to("cuda")  # new buffers
        out = q(x)  # the old graphs dropped: a plain call
        assert len(graphs_of(q)) == 0 and torch.equal(out, q._forward(x))
        q(x)
        assert len(graphs_of(q)) == 1 and torch.equal(q(x), q._forward(x))


def test_an_expanded_input_replays_and_keeps_the_graphs_on():
    """An ``expand``ed input (one row broadcast): its graph takes a contiguous copy; the capture
    failed before, turning every module's graphs off for the process."""
    from qfuse import eager_graphs

    q = _linear(256, 512, "W4A16")
    x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16).expand(4, 512)
    with torch.inference_mode():
        outs = [q(x) for _ in range(3)]
    assert eager_graphs.enabled() and len(graphs_of(q)) == 1
    assert all(torch.equal(o, q._forward(x.contiguous())) for o in outs)


def test_grad_mode_and_inference_mode_each_get_their_graph():
    q = _linear(256, 512, "W8A8")
    x = torch.randn(3, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        a = [q(x) for _ in range(3)]
    with torch.inference_mode():
        b = [q(x) for _ in range(3)]
    assert len(graphs_of(q)) == 2 and all(torch.equal(t, a[0]) for t in a + b)


def test_rows_past_the_limit_run_plain(monkeypatch):
    monkeypatch.setenv("QFUSE_EAGER_GRAPH_ROWS", "4")
    q = _linear(256, 512, "W4A16")
    with torch.inference_mode():
        for _ in range(3):
            q(torch.randn(5, 512, device="cuda", dtype=torch.bfloat16))
    assert len(graphs_of(q)) == 0


def test_a_users_capture_records_the_plain_ops():
    q = _linear(256, 512, "W4A8")
    x = torch.randn(2, 512, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        ref = q._forward(x)
        q(x)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            q(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = q(x)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, ref)


def test_rms_norm_and_moe_block_replay_their_plain_bits():
    from qfuse.moe import QuantMoE
    from tests.qfuse.test_moe import tiny_moe_model

    torch.manual_seed(0)
    norm = qfuse.RMSNorm(torch.randn(1024, device="cuda", dtype=torch.bfloat16), 1e-5)
    # Qwen2-MoE: a shared expert of QuantLinears, called (plainly) inside the block's capture
    model = qfuse.quantize_model(tiny_moe_model("qwen2_moe", hidden=512, intermediate=256).cuda(), "W4A16", progress=False)
    moe = model.model.layers[0].mlp
    assert isinstance(moe, QuantMoE)
    with torch.inference_mode():
        for module, width in ((norm, 1024), (moe, 512)):
            xs = [torch.randn(1, 3, width, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
            outs = [module(x) for x in xs]
            assert len(graphs_of(module)) == 1
            for x, out in zip(xs, outs):
                assert torch.equal(out, module._forward(x))


@pytest.mark.parametrize("scheme", ["W4A16", "W8A8"])
def test_decoder_logits_with_and_without_graphs(scheme, monkeypatch):
    model = tiny_hf_model("llama", layers=2, hidden=1024, intermediate=2816, vocab=512).cuda()
    qfuse.quantize_model(model, scheme, progress=False)
    ids = torch.randint(0, 512, (2, 1), device="cuda")
    with torch.inference_mode():
        monkeypatch.setenv("QFUSE_EAGER_GRAPHS", "0")
        ref = model(ids, use_cache=False).logits
        monkeypatch.setenv("QFUSE_EAGER_GRAPHS", "1")
        outs = [model(ids, use_cache=False).logits for _ in range(3)]
    layer = model.model.layers[0]
    # the MLP block is one graph (its QuantLinears run plainly inside its capture); q_proj and the norms their own
    assert (len(graphs_of(layer.mlp)), len(graphs_of(layer.mlp.down_proj)), len(graphs_of(layer.self_attn.q_proj))) == (1, 0, 1)
    assert len(graphs_of(layer.input_layernorm)) == 1
    assert all(torch.equal(o, ref) for o in outs)


def test_threads_on_one_stream_get_their_own_results():
    """Four threads calling one QuantLinear on the default stream: each output is its own input's."""

    q = _linear(4096, 4096, "W4A16")
    xs = [torch.randn(2, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    with torch.inference_mode():
        want = [q._forward(x) for x in xs]
        q(xs[0]), q(xs[0])  # plain, capture
    wrong = []

    def worker(i):
        with torch.inference_mode():
            for _ in range(50):
                if not torch.equal(q(xs[i]), want[i]):
                    wrong.append(i)

    run_in_threads(worker, 4)
    assert not wrong, f"{len(wrong)} of 200 calls returned another thread's result"

"""Eager calls of qfuse modules replayed as CUDA graphs.

A model called without ``torch.compile`` (``model.generate``, a notebook) waits on Python for
every op. At decode sizes the GPU finishes a qfuse GEMM in 4-25 us, while an eager
``QuantLinear`` call costs 100-380 us of host time on the H200 machine (the dispatcher, the
argument checks, the config lookup, Triton's launcher; int8 schemes two ops), against 22-30 us for
a bf16 ``nn.Linear`` (``qfuse bench eager``). So :class:`qfuse.QuantLinear`, :class:`qfuse.RMSNorm`
and ``qfuse.moe.QuantMoE``, called eagerly on CUDA, run their forward normally the first time an
input shape is seen and capture it into a CUDA graph the second time; from then on a call is one
copy of the input into the graph's, one replay and one copy of the graph's output (the caller
gets a tensor of its own): the same kernels with the same configs, so the same bits.

When (:func:`replayable`): a plain CUDA tensor input, not under ``torch.compile`` tracing, no
CUDA graph being captured on the current stream (a user's own capture records the ops as
they are), no input that requires grad in grad mode, no ``TorchDispatchMode`` active, and at
most ``QFUSE_EAGER_GRAPH_ROWS`` rows (default 64: decode batches; a prefill's many tokens are
GPU-bound anyway, and each new length would be a capture). ``QFUSE_EAGER_GRAPHS=0`` (or
``false`` / ``no`` / ``off``) turns it off.

A graph is kept per (input shapes, strides, dtypes, device, stream, inference mode, autocast) and per
the data pointers of the module's own tensors: a module moved or given new tensors captures
again (its old graphs are dropped); in-place updates of its tensors are read by the replay,
which reads the same memory. At most ``MAX_GRAPHS`` input shapes per module. Memory: a graph
holds its input and output copies and its workspace, in one pool per (device, stream) shared
by every module's graphs (replays on one stream are ordered): at 16 rows about 2.6 MB per
Llama-3-8B decoder layer. Deep copies and pickles of a module start with no graphs.
"""

from __future__ import annotations

import copy
import functools
import os
import threading
import warnings

import torch
from torch import Tensor

from .ops._autotune import env_flag

MAX_GRAPHS = 4  # input shapes per module; one more drops them all (a batch that keeps changing)
_pools: dict[tuple, object] = {}  # (device index, stream id) -> the graph memory pool
_side_streams: dict[int, torch.cuda.Stream] = {}  # device index -> the stream graphs are captured on
_lock = threading.Lock()
_failed = False  # a capture failed: the allocator's and the RNG's capture state are not to be trusted again


def enabled() -> bool:
    return not _failed and env_flag("QFUSE_EAGER_GRAPHS", True)


def max_rows() -> int:
    value = os.environ.get("QFUSE_EAGER_GRAPH_ROWS", "").strip() or "64"
    if not value.isdigit():
        raise ValueError(f"QFUSE_EAGER_GRAPH_ROWS={value!r}: expected a non-negative integer (rows of an input replayed as a CUDA graph)")
    return int(value)


def replayable(x: Tensor) -> bool:
    """Whether a call with input ``x`` (``[..., features]``) may go through a graph (module docstring)."""
    if torch.compiler.is_compiling():  # first: Dynamo folds it to True and traces nothing else here
        return False
    return (
        type(x) is Tensor
        and x.is_cuda
        and x.dim() >= 1
        and x.numel() // max(x.shape[-1], 1) <= max_rows()
        and not (x.requires_grad and torch.is_grad_enabled())
        and torch._C._len_torch_dispatch_stack() == 0
        and enabled()
        and not torch._C._cuda_isCurrentStreamCapturing()
    )


def own_tensors(module: torch.nn.Module) -> tuple:
    """Every parameter and buffer of ``module`` and its children: what a graph of its forward reads."""
    return (*module.parameters(), *module.buffers())


def graphs_of(module: torch.nn.Module) -> "EagerGraphs":
    """``module``'s :class:`EagerGraphs`, made on first use (a plain attribute: not in
    ``state_dict``; a module built without ``__init__``, e.g. by a loader, gets one too)."""
    graphs = module.__dict__.get("_eager_graphs")
    if graphs is None:
        graphs = module.__dict__["_eager_graphs"] = EagerGraphs()
    return graphs


# Hugging Face MLP blocks (down(act(gate(x)) * up(x)): a function of x and the block's own
# tensors) replayed as one graph once their Linears are QuantLinears: one replay instead of three
# QuantLinear replays and the activation's kernels
GRAPHED_BLOCKS = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")


class _GraphedForward:
    """The ``forward`` of a block graphed as a whole (an instance attribute, so the block keeps its
    class, its ``state_dict`` and its compiled form: under ``torch.compile`` it is the class's
    forward). Deep copies and pickles of the block get their own."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def __call__(self, x, *args, **kwargs):
        m = self.module
        plain = type(m).forward
        if args or kwargs or not replayable(x):
            return plain(m, x, *args, **kwargs)
        return graphs_of(m)(functools.partial(plain, m), own_tensors(m), x)

    def __deepcopy__(self, memo) -> "_GraphedForward":
        return _GraphedForward(copy.deepcopy(self.module, memo))  # the copy of the block (in memo)

    def __reduce__(self):
        return _GraphedForward, (self.module,)


def graph_blocks(model: torch.nn.Module) -> int:
    """Give every Hugging Face MLP block of ``model`` (:data:`GRAPHED_BLOCKS`) that holds a
    ``QuantLinear`` a forward replayed as one CUDA graph in eager calls; returns how many."""
    from .linear import QuantLinear

    count = 0
    for m in model.modules():
        if type(m).__name__ in GRAPHED_BLOCKS and "forward" not in m.__dict__ and any(isinstance(c, QuantLinear) for c in m.children()):
            m.forward = _GraphedForward(m)
            count += 1
    return count


def _fail() -> None:
    global _failed
    _failed = True


def _pool_with_keeper(device: torch.device, side: torch.cuda.Stream, stream: torch.cuda.Stream) -> tuple:
    """A graph memory pool and a one-kernel graph captured into it and kept for the process: a
    pool whose graphs are all freed (a model deleted, a module moved) may not take a capture
    again (torch's host allocator asserts), and the keeper holds it open."""
    pool = torch.cuda.graph_pool_handle()
    keeper = torch.cuda.CUDAGraph()
    scratch = torch.zeros(1, device=device)
    _capture_into(keeper, pool, side, stream, lambda: scratch.add_(1))
    return pool, keeper, scratch


def _capture_into(graph: torch.cuda.CUDAGraph, pool, side: torch.cuda.Stream, stream: torch.cuda.Stream, fn):
    """``fn()`` captured into ``graph`` (memory from ``pool``) on the ``side`` stream, ordered after
    and before ``stream``'s work; returns what ``fn`` returned (its tensors live in the pool)."""
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        # thread_local: another thread's CUDA calls during this capture do not invalidate it
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            out = fn()
        finally:
            graph.capture_end()
    stream.wait_stream(side)
    return out


def static_input(t: Tensor) -> Tensor:
    """A graph's own buffer for input ``t``: ``t``'s strides, or contiguous where elements of ``t``
    overlap (an ``expand``ed input: a copy into its strides would write one element several times,
    which torch refuses; the failed capture turned every eager graph off)."""
    if torch._debug_has_internal_overlap(t) == 1:  # MemOverlap::Yes, what copy_ refuses to write into
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


class _Graph:
    __slots__ = ("graph", "inputs", "output")

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: tuple[Tensor, ...], output: Tensor):
        self.graph, self.inputs, self.output = graph, inputs, output


class EagerGraphs:
    """A module's captured graphs: ``graphs(fn, weights, *inputs)`` returns ``fn(*inputs)``, from a
    replay where one is kept (``weights``: the module's own tensors, whose data pointers the graphs
    depend on). Call it only where :func:`replayable` holds for the first input."""

    def __init__(self):
        self._graphs: dict[tuple, _Graph] = {}
        self._seen: set[tuple] = set()
        self._weights: tuple = ()
        # Threads that share a stream (a server's default stream) would otherwise copy into one
        # graph's inputs between another thread's copy and replay, and the replay would compute the
        # other's input (tests/qfuse/test_eager_graphs.py). Held from the input copy to the output
        # clone being enqueued, and through a capture; not around a first plain call.
        self._mutex = threading.Lock()

    def __call__(self, fn, weights: tuple, *inputs: Tensor) -> Tensor:
        with self._mutex:
            out = self._replay_or_capture(fn, weights, inputs)
        return fn(*inputs) if out is None else out

    def _replay_or_capture(self, fn, weights: tuple, inputs: tuple[Tensor, ...]) -> Tensor | None:
        """The output from a replay (capturing first where the shape was seen before), or None
        where the call is to run plainly."""
        sig = tuple(0 if w is None else w.data_ptr() for w in weights)
        if sig != self._weights:  # moved, reloaded or replaced: the graphs point at the old memory
            self.clear()
            self._weights = sig
        device = inputs[0].device
        stream = torch._C._cuda_getCurrentRawStream(device.index)  # an int: cheaper than a Stream object
        key = (
            tuple((t.shape, t.stride(), t.dtype) for t in inputs),
            device.index,
            stream,
            torch.is_inference_mode_enabled(),
            torch.is_autocast_enabled("cuda"),  # a graph replays the kernels autocast chose at its capture
        )
        entry = self._graphs.get(key)
        if entry is not None:
            for dst, src in zip(entry.inputs, inputs):
                dst.copy_(src)
            entry.graph.replay()
            return entry.output.clone()
        if key not in self._seen:  # first sight of this shape: a plain call (it compiles and picks configs)
            self._seen.add(key)
            return None
        if len(self._graphs) >= MAX_GRAPHS:
            self.clear()
        if _failed:
            return None
        try:
            entry = self._capture(fn, inputs, stream)
        except Exception as e:  # an op that cannot be captured (a host sync): plain calls from now on
            _fail()
            warnings.warn(
                f"qfuse: an eager call could not be captured as a CUDA graph ({type(e).__name__}: {e}); "
                "eager calls run as plain op calls from now on",
                stacklevel=4,
            )
            return None
        self._graphs[key] = entry
        return entry.output.clone()

    @staticmethod
    def _capture(fn, inputs: tuple[Tensor, ...], stream_id: int) -> _Graph:
        device = inputs[0].device
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = torch.cuda.current_stream(device)
        with _lock:
            side = _side_streams.get(index)
            if side is None:
                side = _side_streams[index] = torch.cuda.Stream(device)
            pool = _pools.get((index, stream_id))
            if pool is None:
                pool = _pools[(index, stream_id)] = _pool_with_keeper(device, side, stream)
        static = tuple(static_input(t) for t in inputs)
        for dst, src in zip(static, inputs):
            dst.copy_(src)
        graph = torch.cuda.CUDAGraph()
        output = _capture_into(graph, pool[0], side, stream, lambda: fn(*static))
        graph.replay()  # the capture recorded the kernels without running them
        return _Graph(graph, static, output)

    def clear(self) -> None:
        """Drop every graph and every shape seen (the weights' signature stays what it is)."""
        self._graphs.clear()
        self._seen.clear()

    def __len__(self) -> int:
        return len(self._graphs)

    def __deepcopy__(self, memo) -> "EagerGraphs":
        return EagerGraphs()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

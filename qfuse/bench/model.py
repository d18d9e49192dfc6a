"""``qfuse bench model``: a whole Hugging Face decoder, quantized, eager and compiled, against bf16, torchao and gemlite.

Per case (bf16; a qfuse scheme, its int8-activation ones with the fusion passes on and off;
torchao int4 weight-only in the tinygemm layout and int8 dynamic when torchao imports;
gemlite 0.6's A16W4, group 128, of qfuse's own W4A16 codes, when gemlite imports) one
model with random bf16 weights is built on the GPU (lm_head stays bf16), quantized, and run:

* ``decode``: one new token per sequence at position ``--context`` of a ``StaticCache``
  (attention over the whole cached context), the logits included. ``eager``: the module
  called from Python, each step synchronized (what ``model.generate`` without compile pays).
  ``compiled``: ``qfuse.compile`` / ``torch.compile`` (``fullgraph=True, dynamic=False``) of
  the step, then one CUDA graph of it captured here and replayed (transformers' own
  ``mode="reduce-overhead"`` with ``StaticCache`` crashed on transformers 5.17).
* ``prefill``: one sequence of ``--prefill`` tokens, compiled, timed as a CUDA graph; the
  last token's logits only, as a server computes them, and no cache written (Inductor's CPU
  code for a ``StaticCache`` prefill failed a bounds check on torch 2.13).

``mixtral-8x7b``: a Hugging Face ``MixtralForCausalLM`` of Mixtral-8x7B's shape (hidden 4096,
8 experts of intermediate 14336, top-2, 32 / 8 heads, vocab 32000) with 4 decoder layers by
default (the published model has 32; ``--layers`` sets them): ``quantize_model`` converts each
sparse-MoE block to ``qfuse.moe.QuantMoE`` (experts through ``qfuse::fused_moe``, the router in
bf16). The torchao and gemlite cases are skipped there with the reason printed and a ``skipped``
row in the CSV: they convert ``nn.Linear`` layers, and the experts are 3-D parameters.

Columns: ``ms`` (median per step), ``tokens_per_s``, ``x_bf16`` (bf16's ms / this ms, same
mode and batch), ``weight_gb`` (parameters and buffers, the KV cache not included),
``peak_gb`` (``max_memory_allocated`` from the built model up to that row: weights, caches,
activations, compile-time buffers), ``build_peak_gb`` (the same while the model was built and
quantized: the bf16 model and the quantized layers replacing it are both alive then), ``compile_s`` (the first
compiled call of that mode and batch: Dynamo + Inductor + Triton, every qfuse kernel already
autotuned by the eager warm-up; its phases in ``compile_phases/``, with the FX calls Dynamo
captured and Inductor's IR nodes and generated kernels: none where its FX graph cache hit). Each row goes to the CSV as
it is measured, so a run stopped by a time limit keeps what it measured.

``--compile-first N`` compiles before it measures: every case's compiled rows run first in a
subprocess of their own, N at a time (``compile_first/<case>/``: log, CSV, compile phases), which
fills Inductor's and Triton's on-disk caches; ``compile_s`` is then that cold first call, and the
measuring process's own first call, warm, is ``warm_compile_s``. A case whose subprocess fails
(e.g. past ``--compile-timeout``; it stops at that row) keeps that failure as a row, and of its
compiled rows the measuring run compiles only those the subprocess finished; eager rows all. A
subprocess that ran out of GPU memory beside the others is no failure: the measuring run compiles
all that case's rows, those the subprocess did not finish with their own first call as ``compile_s``.

``--compile-timeout S`` stops a first compiled call after S seconds: every thread's Python stack
and the compile phases so far go to ``compile_phases/<case>_<row>.timeout.txt``, the case gets a
``failed`` row, and the next case runs. (A call stuck in C code, e.g. a CUDA synchronize, is
stopped when it next runs Python.) ``--inductor-config KEY=VALUE`` sets a
``torch._inductor.config`` field for the whole run, for A/B runs of Inductor's options; it is
recorded in an ``inductor_config`` column.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import faulthandler
import gc
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

from ._device import require_cuda
from .timing import write_csv

MODELS = {  # architecture, config fields (the published shapes; weights are random)
    "llama3-8b": (
        "llama",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            rope_theta=500000.0,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
        ),
    ),
    "qwen2-7b": (
        "qwen2",
        dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            vocab_size=152064,
            rope_theta=1000000.0,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
        ),
    ),
    "mixtral-8x7b": (
        "mixtral",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=4,  # of Mixtral-8x7B's 32 (--layers sets them): 4 layers of bf16 experts are 11 GB
            num_attention_heads=32,
            num_key_value_heads=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            vocab_size=32000,
            max_position_embeddings=32768,
            rms_norm_eps=1e-5,
            sliding_window=None,
        ),
    ),
    # CPU-sized, for the tests of this module
    "tiny": (
        "llama",
        dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            max_position_embeddings=4096,
        ),
    ),
    "tiny-mixtral": (
        "mixtral",
        dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            vocab_size=512,
            max_position_embeddings=4096,
        ),
    ),
}
QFUSE_CASES = ("W4A16", "W8A16", "W8A8", "W4A8", "W4A8_G128")
TORCHAO_CASES = ("torchao-int4", "torchao-int8dq")
GEMLITE_CASES = ("gemlite-w4",)  # gemlite 0.6 A16W4, group 128, qfuse's symmetric W4A16 codes (bench/_peers.py)
PEER_CASES = TORCHAO_CASES + GEMLITE_CASES
DEFAULT_CASES = ("bf16", "W4A16", "W4A8_G128", "W8A8", "W8A8:nopasses", "torchao-int4")
# case modifiers: ``attn`` (any case: attention through qfuse::decode_attention,
# ``qfuse.use_decode_attention``); ``fuse`` (bf16 and qfuse cases: q/k/v and gate/up stacked,
# ``qfuse.fuse_projections``); for qfuse schemes also ``nopasses`` (compiled without the fusion
# passes), ``lm_head=W8A16`` / ``lm_head=W4A16`` (the output head quantized too) and ``natural_codes``
# (MoE experts in the natural packing instead of tile-major: ``qfuse bench moe --natural-codes``' model row)
MODIFIERS = ("nopasses", "attn", "fuse", "lm_head=W8A16", "lm_head=W4A16", "natural_codes")


def parse_case(case: str) -> tuple[str, frozenset[str]]:
    """``"W8A8:nopasses:attn"`` -> ``("W8A8", {"nopasses", "attn"})``; unknown parts raise."""
    scheme, *mods = case.split(":")
    known = ("bf16", *QFUSE_CASES, *PEER_CASES)
    allowed = MODIFIERS if scheme in QFUSE_CASES else ("attn", "fuse") if scheme == "bf16" else ("attn",)
    if scheme not in known or any(m not in allowed for m in mods):
        raise ValueError(
            f"unknown case {case!r}; choose from {', '.join(known)}, followed by ':attn' (qfuse's decode attention), "
            "':fuse' (stacked projections; not torchao) and, for qfuse schemes, ':nopasses', ':lm_head=W8A16' / ':lm_head=W4A16' "
            "or ':natural_codes'"
        )
    return scheme, frozenset(mods)


def _lm_head_scheme(mods: frozenset[str]) -> str | None:
    heads = [m.split("=", 1)[1] for m in mods if m.startswith("lm_head=")]
    if len(heads) > 1:
        raise ValueError(f"one lm_head scheme per case, got {sorted(heads)}")
    return heads[0] if heads else None


def model_config(name: str, layers: int | None = None):
    from transformers import LlamaConfig, MixtralConfig, Qwen2Config

    arch, fields = MODELS[name]
    fields = dict(fields)
    if layers:
        fields["num_hidden_layers"] = layers
    config = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mixtral": MixtralConfig}[arch](**fields)
    config.use_cache = True
    return config


def skip_reason(config, case: str) -> str | None:
    """Why ``case`` is not run on the model of ``config`` (None: it is run)."""
    if case.split(":")[0] in PEER_CASES and getattr(config, "num_local_experts", 0):
        return (
            "the peers convert nn.Linear layers here (torchao's quantize_, gemlite's A16Wn), which leaves the sparse-MoE "
            "experts, 3-D parameters, in bf16: the case would not measure a quantized MoE model"
        )
    return None


def build_model(config, case: str, device: str):
    """The random-weight bf16 model of ``config`` with ``case``'s quantization applied."""
    from transformers import AutoModelForCausalLM

    import qfuse

    scheme, mods = parse_case(case)  # before the model: a bad case costs no build
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    if scheme in QFUSE_CASES:
        qfuse.quantize_model(model, scheme, progress=False, lm_head=_lm_head_scheme(mods))
    elif scheme == "torchao-int4":
        from torchao.quantization import Int4WeightOnlyConfig, quantize_

        quantize_(model, Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d"), filter_fn=_torchao_filter)
    elif scheme == "torchao-int8dq":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        quantize_(model, Int8DynamicActivationInt8WeightConfig(), filter_fn=_torchao_filter)
    elif scheme == "gemlite-w4":
        from ._peers import gemlite_linears, setup_gemlite

        errors = []
        if setup_gemlite(errors.append) is None:
            raise RuntimeError(errors[0])
        gemlite_linears(model, bits=4, group=128)
    if "natural_codes" in mods:
        natural_experts(model)
    if "fuse" in mods:
        qfuse.fuse_projections(model)
    if "attn" in mods:
        qfuse.use_decode_attention(model)
    return model


def natural_experts(model) -> int:
    """Rebuild ``model``'s tile-major MoE experts with their codes in the natural packing (a state_dict is
    natural either way); the number rebuilt."""
    from qfuse.moe import QuantExperts, QuantMoE

    blocks = [m for m in model.modules() if isinstance(m, QuantMoE) and m.experts.tile_major]
    for block in blocks:
        ex = block.experts
        block.experts = QuantExperts(
            ex.num_experts, ex.hidden_size, ex.intermediate_size, ex.top_k, ex.renormalize, ex.scheme, ex.state_dict(), tile_major=False
        )
    return len(blocks)


def _torchao_filter(module, name: str) -> bool:
    return isinstance(module, torch.nn.Linear) and not name.endswith("lm_head")


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes ``t`` holds: a wrapper tensor subclass (torchao's packed int4 / int8 weights) is the sum of
    its inner tensors (``__tensor_flatten__``), not its logical shape at its logical dtype."""
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def weight_bytes(model) -> int:
    return sum(tensor_bytes(t) for t in [*model.parameters(), *model.buffers()])


class DecodeStep:
    """``model``'s forward at a fixed position of a ``StaticCache`` of ``max_len`` slots for
    ``batch`` sequences: ``step(ids, pos) -> logits``, the new tokens written at ``pos``.

    transformers 5's static cache layers write at, and build the mask from, a counter of their own
    (``cumulative_length``, a device tensor every call advances), not ``cache_position``: a step
    called again at one position would attend to one more key each time, counted from however
    many calls came before (a CUDA graph of it from the empty cache: a few keys, not ``pos``).
    Each call first sets that counter to ``pos[0]`` (a copy inside the graph when compiled), so
    every call and replay writes at ``pos`` and attends to keys ``0 .. pos``. The layers are
    initialized here, outside any compiled call.
    """

    def __init__(self, model, max_len: int, batch: int):
        from transformers import StaticCache

        self.model = model
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        config, emb = model.config, model.get_input_embeddings().weight
        if hasattr(self.cache, "early_initialization"):
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            self.cache.early_initialization(batch, config.num_key_value_heads, head_dim, emb.dtype, emb.device)
        layers = getattr(self.cache, "layers", ())
        if any(hasattr(layer, "cumulative_length_int") for layer in layers):
            raise NotImplementedError("DecodeStep: sliding-window cache layers keep a host-side length that a replayed step cannot set")
        self._counters = [c for c in (getattr(layer, "cumulative_length", None) for layer in layers) if isinstance(c, torch.Tensor)]

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        for counter in self._counters:
            counter.copy_(pos[0])
        positions = pos.unsqueeze(0).expand(ids.shape[0], -1)
        out = self.model(input_ids=ids, past_key_values=self.cache, cache_position=pos, position_ids=positions, use_cache=True)
        return out.logits


class PrefillStep:
    """``model``'s forward over a whole prompt, the next token's logits only (as a server computes them)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits


def compile_step(step, case: str):
    import qfuse

    scheme, mods = parse_case(case)
    if scheme in QFUSE_CASES:
        return qfuse.compile(step, passes="nopasses" not in mods, fullgraph=True, dynamic=False)
    return torch.compile(step, fullgraph=True, dynamic=False)


class CompileTimeout(RuntimeError):
    """A first compiled call ran past ``--compile-timeout``."""


def _compile_phases() -> str:
    """Dynamo's per-phase seconds, then the sizes that drive them: FX calls Dynamo captured and
    graphs it made, Inductor's IR nodes before fusion, kernels it generated and padded strides."""
    try:
        import torch._inductor.metrics as inductor

        stats = torch._dynamo.utils.counters["stats"]
        sizes = (
            f"dynamo: {stats['calls_captured']} calls captured, {stats['unique_graphs']} graphs; inductor: "
            f"{inductor.ir_nodes_pre_fusion} IR nodes before fusion, {inductor.generated_kernel_count} kernels generated, "
            f"{inductor.num_comprehensive_padding} buffers padded"
        )
        return f"{torch._dynamo.utils.compile_times(repr='str', aggregate=True)}\n{sizes}"
    except Exception as e:  # private torch APIs: their absence must not cost the row
        return f"compile phases unavailable: {type(e).__name__}: {e}"


def _all_stacks() -> str:
    """Every thread's whole Python stack (faulthandler stops at 100 frames, and Dynamo's are deeper)."""
    main = threading.main_thread().ident
    return "\n".join(
        f"thread {ident}{' (main)' if ident == main else ''}, most recent call last:\n" + "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    )


@contextlib.contextmanager
def _deadline(seconds: float, report: Path):
    """Raise :class:`CompileTimeout` in the main thread once ``seconds`` pass (SIGALRM; nothing
    when ``seconds`` <= 0), after writing every thread's Python stack and the compile phases so
    far to ``report``: where a compile that does not finish spends its time."""
    if seconds <= 0:
        yield
        return

    # the folder and file only: the message lands in the CSV, which is committed (no machine paths)
    message = f"the first compiled call ran past {seconds:g} s; stacks in {report.parent.name}/{report.name}"
    expired = []

    def expire(signum, frame):
        expired.append(True)
        head = f"stopped after {seconds:g} s (--compile-timeout); every thread's whole Python stack:"
        report.write_text(f"{head}\n{_all_stacks()}\ncompile phases so far:\n{_compile_phases()}\n")
        raise CompileTimeout(message)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except Exception as e:
        if expired and not isinstance(e, CompileTimeout):  # Dynamo / Inductor wrap what is raised inside them
            raise CompileTimeout(message) from e
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if expired:  # raised where a broad ``except`` inside torch swallowed it, and the call went on
        raise CompileTimeout(message)


def first_call(compiled, inputs: tuple, phases: Path, timeout: float = 0) -> float:
    """Seconds of ``compiled``'s first call (Dynamo + Inductor + Triton); where that time went, by
    compile phase (``torch._dynamo.utils.compile_times``: tracing, each pass, codegen, Triton's
    compiles), is written to ``phases``. Past ``timeout`` seconds (> 0) it raises
    :class:`CompileTimeout`, the stacks written to ``phases`` with suffix ``.timeout.txt``."""
    import torch._dynamo.utils

    metrics = getattr(torch._dynamo.utils, "compilation_time_metrics", None)
    if metrics is not None:
        metrics.clear()  # the phases of this compile only
    import torch._inductor.metrics

    torch._inductor.metrics.reset()  # and its sizes
    torch._dynamo.utils.counters["stats"].clear()
    phases.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with _deadline(timeout, phases.with_suffix(".timeout.txt")):
        compiled(*inputs)
        _sync(inputs[0].device)
    seconds = time.perf_counter() - t0
    phases.write_text(f"first call {seconds:.1f} s\n{_compile_phases()}\n")
    return seconds


def _file_name(case: str) -> str:
    return case.replace(":", "_").replace("=", "-")


def time_eager(fn, args, steps: int) -> float:
    """Median ms of ``fn(*args)`` called from Python, synchronized after each call (after two
    calls: qfuse's modules capture their eager CUDA graphs in the second, qfuse/eager_graphs.py)."""
    fn(*args)
    fn(*args)
    _sync(args[0].device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn(*args)
        _sync(args[0].device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_captured(fn, args, replays: int, warmup: int = 1) -> float:
    """Median ms of one CUDA-graph replay of ``fn(*args)`` (the autotuner's graph timing)."""
    from qfuse.ops._autotune import graph_time_ms

    return graph_time_ms([lambda: fn(*args)], replays=replays, warmup=warmup)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_case(case: str, args, record, log=print) -> None:
    """Build ``case``'s model and measure its rows, each handed to ``record`` as it is measured."""
    device = args.device
    cuda = device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch._dynamo.reset()  # each case's compiles start from nothing (and stay under the recompile limit)
    config = model_config(args.model, args.layers)
    t0 = time.perf_counter()
    model = build_model(config, case, device)
    base = {"model": args.model, "layers": config.num_hidden_layers, "case": case, "weight_gb": round(weight_bytes(model) / 1e9, 6)}
    base["build_peak_gb"] = float("nan")
    if cuda:  # the rows' peak_gb counts from here: the float weights a quantizer replaced are gone
        base["build_peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 3)
        gc.collect()
        torch.cuda.reset_peak_memory_stats()
    log(f"[model] {case}: built and quantized in {time.perf_counter() - t0:.1f} s, {base['weight_gb']} GB of weights")
    if args.inductor_config:
        base["inductor_config"] = " ".join(args.inductor_config)

    def add(row: dict) -> None:
        row["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 3) if cuda else float("nan")
        record(row)

    vocab = config.vocab_size
    with torch.inference_mode():
        for batch in args.batches:
            step = DecodeStep(model, args.context + 8, batch)
            ids = torch.randint(0, vocab, (batch, 1), device=device)
            pos = torch.tensor([args.context], device=device)
            if batch in args.eager_batches:
                ms = time_eager(step, (ids, pos), args.steps)
                add({**base, "mode": "eager", "batch": batch, "tokens": 1, "ms": round(ms, 4), "tokens_per_s": round(batch / ms * 1e3, 1)})
                log(f"[model] {case} eager batch {batch}: {ms:.3f} ms")
            if not _compiles(args, "compiled", batch):
                continue
            compiled = compile_step(step, case)
            phases = args.out / "compile_phases" / f"{_file_name(case)}_decode_b{batch}.txt"
            compile_s = first_call(compiled, (ids, pos), phases, args.compile_timeout)
            ms = time_captured(compiled, (ids, pos), args.replays) if cuda else time_eager(compiled, (ids, pos), args.steps)
            add(
                {
                    **base,
                    "mode": "compiled",
                    "batch": batch,
                    "tokens": 1,
                    "ms": round(ms, 4),
                    "tokens_per_s": round(batch / ms * 1e3, 1),
                    "compile_s": round(compile_s, 1),
                }
            )
            log(f"[model] {case} compiled batch {batch}: {ms:.3f} ms (compile {compile_s:.0f} s)")
            del compiled, step
        if args.prefill and _compiles(args, "prefill", 1):
            ids = torch.randint(0, vocab, (1, args.prefill), device=device)
            compiled = compile_step(PrefillStep(model), case)
            phases = args.out / "compile_phases" / f"{_file_name(case)}_prefill_{args.prefill}.txt"
            compile_s = first_call(compiled, (ids,), phases, args.compile_timeout)
            # a 2048-token prefill is ~40-60 ms of sustained GEMMs on the H200: two tables' timings of one bf16
            # prefill at 3 replays differed by 1.8 %, so it gets the decode rows' replays and 3 warm-up replays
            ms = time_captured(compiled, (ids,), max(3, args.replays), warmup=3) if cuda else time_eager(compiled, (ids,), 2)
            add(
                {
                    **base,
                    "mode": "prefill",
                    "batch": 1,
                    "tokens": args.prefill,
                    "ms": round(ms, 4),
                    "tokens_per_s": round(args.prefill / ms * 1e3, 1),
                    "compile_s": round(compile_s, 1),
                }
            )
            log(f"[model] {case} prefill {args.prefill}: {ms:.3f} ms (compile {compile_s:.0f} s)")
            del compiled
    del model
    gc.collect()


def _compiles(args, mode: str, batch: int) -> bool:
    """Whether :func:`run_case` compiles this row: not with ``--no-compile``; after a
    ``--compile-first`` subprocess that failed, only the rows it finished (``args.compiled_rows``)."""
    rows = getattr(args, "compiled_rows", None)
    return not args.no_compile and (rows is None or (mode, str(batch)) in rows)


def run_eager_interleaved(cases: list[str], args, log=print) -> list[dict]:
    """Eager rows only, every case's model built first and their steps timed in turns: round r
    times ``--steps`` steps of each (case, batch), in an order rotated by r, and a row's ms is the median over all
    its rounds' steps. The H200 machine's host runs 20-50 % faster or slower from one minute to the
    next, which a case-after-case run reads as a difference between cases."""
    device = args.device
    config = model_config(args.model, args.layers)
    models = {case: build_model(config, case, device) for case in cases}
    vocab = config.vocab_size
    times: dict[tuple, list[float]] = {}
    with torch.inference_mode():
        steps = {}
        for case in cases:
            for batch in args.eager_batches:
                step = DecodeStep(models[case], args.context + 8, batch)
                ids = torch.randint(0, vocab, (batch, 1), device=device)
                pos = torch.tensor([args.context], device=device)
                for _ in range(2):  # the second call captures qfuse's eager graphs
                    step(ids, pos)
                steps[(case, batch)] = (step, ids, pos)
        order = list(steps)
        for r in range(args.rounds if order else 0):  # no case or no eager batch: no rows
            for key in order[r % len(order) :] + order[: r % len(order)]:  # each round starts one case later: no case is always last
                step, ids, pos = steps[key]
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    step(ids, pos)
                    _sync(ids.device)
                    times.setdefault(key, []).append((time.perf_counter() - t0) * 1e3)
            log(f"[model] eager round {r + 1} of {args.rounds} done")
    rows = []
    for (case, batch), ts in times.items():
        ms = statistics.median(ts)
        rows.append(
            {
                "model": args.model,
                "layers": config.num_hidden_layers,
                "case": case,
                "weight_gb": round(weight_bytes(models[case]) / 1e9, 6),
                "mode": "eager",
                "batch": batch,
                "tokens": 1,
                "ms": round(ms, 4),
                "tokens_per_s": round(batch / ms * 1e3, 1),
                "peak_gb": "",
            }
        )
        log(f"[model] {case} eager batch {batch}: {ms:.3f} ms (median of {len(ts)} steps in {args.rounds} rounds)")
    return rows


def add_ratios(rows: list[dict]) -> None:
    """``x_bf16``: bf16's ms over the row's ms, for the same mode, batch and tokens."""
    bf16 = {(r["mode"], r["batch"], r["tokens"]): r["ms"] for r in rows if r["case"] == "bf16"}
    for r in rows:
        ref = bf16.get((r["mode"], r["batch"], r["tokens"]))
        r["x_bf16"] = round(ref / r["ms"], 3) if ref else ""


def plot(rows: list[dict], path: Path) -> None:
    """One panel per (mode, batch): x bf16 per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["mode"], r["batch"]) for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.8), squeeze=False)
    for ax, (mode, batch) in zip(axes.flat, panels):
        sub = [r for r in rows if (r["mode"], r["batch"]) == (mode, batch) and r["x_bf16"] != ""]
        ax.bar([r["case"] for r in sub], [r["x_bf16"] for r in sub], color=["gray" if r["case"] == "bf16" else "C0" for r in sub])
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_title(f"{mode}, batch {batch}" if mode != "prefill" else f"prefill {sub[0]['tokens'] if sub else ''}")
        ax.set_ylabel("x bf16 (higher is faster)")
        ax.tick_params(axis="x", rotation=60, labelsize=7)
    fig.suptitle(f"qfuse bench model: {rows[0]['model']}, {rows[0]['layers']} layers")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="qfuse bench model", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="llama3-8b")
    ap.add_argument("--layers", type=int, help="decoder layers (default: the model's; mixtral-8x7b: 4 of its 32)")
    ap.add_argument(
        "--cases",
        nargs="+",
        default=list(DEFAULT_CASES),
        help="bf16, qfuse schemes, torchao-int4, torchao-int8dq, gemlite-w4; modifiers: CASE:attn (qfuse's decode attention), CASE:fuse "
        "(stacked projections; bf16 and qfuse), SCHEME:nopasses, SCHEME:lm_head=W8A16 / W4A16, SCHEME:natural_codes (MoE "
        "experts in the natural packing, not tile-major)",
    )
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument(
        "--eager-batches",
        type=int,
        nargs="*",
        help="batches of --batches also timed in eager mode (default: 1 and 16, those given; --interleave: any)",
    )
    ap.add_argument("--context", type=int, default=1024, help="cached tokens each decode step attends to")
    ap.add_argument("--prefill", type=int, default=2048, help="prompt length of the prefill row (0: none)")
    ap.add_argument("--steps", type=int, default=10, help="eager steps timed")
    ap.add_argument("--replays", type=int, default=20, help="CUDA-graph replays timed")
    ap.add_argument("--no-compile", action="store_true", help="eager rows only")
    ap.add_argument("--interleave", action="store_true", help="eager rows only, the cases' models all built first and timed in turns (--rounds)")
    ap.add_argument("--rounds", type=int, default=5, help="--interleave: rounds of --steps steps per case and batch")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the tests' tiny model
    ap.add_argument("--out", type=Path, default=Path("bench_model"))
    ap.add_argument(
        "--stacks-every",
        type=float,
        default=0,
        metavar="S",
        help="print every thread's Python stack to stderr every S seconds (where a long compile spends its time)",
    )
    ap.add_argument(
        "--compile-timeout",
        type=float,
        default=0,
        metavar="S",
        help="stop a first compiled call after S seconds, its stacks written to compile_phases/, and go on with the next case",
    )
    ap.add_argument(
        "--compile-first",
        type=int,
        default=0,
        metavar="N",
        help="first compile every case's compiled rows in subprocesses, N at a time (cold compile_s; the measured run's is warm_compile_s)",
    )
    ap.add_argument(
        "--inductor-config",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="torch._inductor.config fields for the whole run (VALUE a Python literal), e.g. graph_partition=False",
    )
    args = ap.parse_args(argv)
    if args.eager_batches is None:
        args.eager_batches = [b for b in (1, 16) if args.interleave or b in args.batches]
    elif not args.interleave and (missing := [b for b in args.eager_batches if b not in args.batches]):
        ap.error(f"--eager-batches {' '.join(map(str, missing))}: not in --batches (eager rows are timed for batches of --batches)")
    try:
        args.inductor_fields = inductor_fields(args.inductor_config)
    except ValueError as e:
        ap.error(str(e))
    if args.device == "cuda":
        require_cuda("model")
    if args.stacks_every <= 0:
        return run(args)
    faulthandler.dump_traceback_later(args.stacks_every, repeat=True)  # sampling without a profiler
    try:
        return run(args)
    finally:
        faulthandler.cancel_dump_traceback_later()


def inductor_fields(items: list[str]) -> dict:
    """``["KEY=VALUE", ...]`` -> ``{KEY: value}`` for ``torch._inductor.config.patch``; VALUE is a
    Python literal (``False``, ``64``, ``"x"``) or else taken as a string. A ValueError names a
    malformed item or a key ``torch._inductor.config`` does not have."""
    import torch._inductor.config as inductor_config

    fields = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--inductor-config {item!r}: expected KEY=VALUE")
        if not hasattr(inductor_config, key):
            raise ValueError(f"--inductor-config {item!r}: torch._inductor.config has no field {key!r}")
        try:
            fields[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            fields[key] = text
    return fields


def run(args) -> int:
    """The cases of ``args`` (``main``'s options): each row to ``model.csv`` as it is measured; 1 if a case failed."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(getattr(args, "inductor_fields", {})):
        return _run(args)


def _child_argv(args, case: str, out: Path) -> list[str]:
    """``qfuse bench model`` arguments of ``case``'s compile-first subprocess: its compiled rows, timed once."""
    argv = ["--model", args.model, "--cases", case, "--batches", *map(str, args.batches), "--eager-batches"]
    argv += ["--context", str(args.context), "--prefill", str(args.prefill), "--steps", "1", "--replays", "1"]
    argv += ["--device", args.device, "--out", str(out), "--compile-timeout", str(args.compile_timeout)]
    argv += ["--layers", str(args.layers)] if args.layers else []
    return argv + (["--inductor-config", *args.inductor_config] if args.inductor_config else [])


def _with_cold_compile(record, cold_rows: list[dict]):
    """``record`` for a case compiled first: a compiled row's own first call becomes ``warm_compile_s``
    and ``compile_s`` the cold one of the same mode and batch; a row the subprocess did not finish
    keeps its own first call as ``compile_s``."""
    cold = {(r.get("mode"), str(r.get("batch"))): r.get("compile_s") for r in cold_rows if r.get("compile_s")}

    def record_row(row: dict) -> None:
        key = (row.get("mode"), str(row.get("batch")))
        if "compile_s" in row and key in cold:
            row["warm_compile_s"] = row["compile_s"]
            row["compile_s"] = float(cold[key])
        record(row)

    return record_row


def compile_first(args, cases: list[str], log=print) -> dict[str, list[dict]]:
    """Run each case's compiled rows in a subprocess of its own, ``args.compile_first`` at a time; their
    CSV rows by case (``compile_first/<case>/model.csv``; a subprocess that wrote none gets a failed row)."""
    root = args.out / "compile_first"
    waiting, running, done = list(cases), {}, {}
    while waiting or running:
        while waiting and len(running) < args.compile_first:
            case = waiting.pop(0)
            out = root / _file_name(case)
            out.mkdir(parents=True, exist_ok=True)
            with (out / "log.txt").open("w") as f:
                cmd = [sys.executable, "-m", "qfuse.cli", "bench", "model", *_child_argv(args, case, out)]
                running[case] = (subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT), out, time.perf_counter())
            log(f"[model] {case}: compiling first ({out / 'log.txt'})")
        for case, (proc, out, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[case]
            csv_path = out / "model.csv"
            rows = list(csv.DictReader(csv_path.open())) if csv_path.is_file() else []
            if not rows:
                rows = [{"case": case, "mode": "failed", "error": f"compile-first subprocess exited {proc.returncode}; see {out / 'log.txt'}"}]
            done[case] = rows
            log(f"[model] {case}: compiled first in {time.perf_counter() - t0:.0f} s (exit {proc.returncode})")
        time.sleep(0.2)
    return done


def _out_of_memory(error: str) -> bool:
    """Whether a row's error is the GPU running out of memory (CUDA's allocator or cuBLAS's handle)."""
    return any(m in error for m in ("out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED"))


def _run(args) -> int:
    rows: list[dict] = []

    def record(row: dict) -> None:
        rows.append(row)
        add_ratios([r for r in rows if r.get("mode") not in ("failed", "skipped")])
        write_csv(rows, args.out / "model.csv")

    config = model_config(args.model, args.layers)
    if args.interleave:
        rows = run_eager_interleaved([c for c in args.cases if not skip_reason(config, c)], args)
        add_ratios(rows)
        if rows:
            plot(rows, args.out / "model.png")
        for case in args.cases:
            if reason := skip_reason(config, case):
                print(f"[model] {case}: skipped on {args.model}: {reason}", flush=True)
                rows.append({"model": args.model, "case": case, "mode": "skipped", "error": reason})
        write_csv(rows, args.out / "model.csv")
        return 0
    cases = [c for c in args.cases if not skip_reason(config, c)]
    cold = compile_first(args, cases) if getattr(args, "compile_first", 0) > 0 and not args.no_compile else {}
    for case in args.cases:
        if reason := skip_reason(config, case):
            print(f"[model] {case}: skipped on {args.model}: {reason}", flush=True)
            record({"model": args.model, "case": case, "mode": "skipped", "error": reason})
            continue
        case_args, case_record = args, record
        if case in cold:
            failed = [r for r in cold[case] if r.get("mode") == "failed"]
            if failed and all(_out_of_memory(r.get("error", "")) for r in failed):
                # the subprocesses share the GPU (four Llama-3-8B-shaped builds at once ran an 80 GB H100 out of
                # memory): this process compiles every row, those the subprocess did not finish with their own compile_s
                print(f"[model] {case}: compile-first ran out of GPU memory beside the others; compiling its rows here", flush=True)
                failed = []
            for r in failed:
                record({"model": args.model, "case": case, "mode": "failed", "error": f"compile-first: {r.get('error', '')}"[:300]})
            # the subprocess stopped at its first failure: measure only the compiled rows it finished
            done = {(r.get("mode"), str(r.get("batch"))) for r in cold[case] if r.get("mode") in ("compiled", "prefill")}
            case_args = argparse.Namespace(**{**vars(args), "compiled_rows": done if failed else None})
            case_record = _with_cold_compile(record, cold[case])
        try:
            run_case(case, case_args, case_record)
        except Exception as e:  # a peer that does not install, a case that fails or a compile past its time must not cost the others
            print(f"[model] {case}: FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            record({"model": args.model, "case": case, "mode": "failed", "error": f"{type(e).__name__}: {e}"[:300]})
    ok = [r for r in rows if r.get("mode") not in ("failed", "skipped")]
    if ok:
        plot(ok, args.out / "model.png")
        for r in ok:
            print(
                f"{r['case']:<16} {r['mode']:<9} batch {r['batch']:>3} {r['ms']:>9.3f} ms {r['tokens_per_s']:>10.1f} tok/s  x bf16 {r['x_bf16']!s:>6}"
                f"  weights {r['weight_gb']} GB  peak {r['peak_gb']} GB  compile {r.get('compile_s', '')}"
            )
    return 0 if all(r.get("mode") != "failed" for r in rows) else 1

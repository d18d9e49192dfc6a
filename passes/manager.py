"""The post-grad pass Inductor runs: one ``CustomGraphPass`` holding a ``PatternMatcherPass``.

Installed as Inductor's ``post_grad_custom_post_pass`` (one object: torch 2.11
rejects lists) through :func:`inductor_options` or ``qfuse.compile``; nothing
changes global Inductor config. Per graph it runs:

1. ``dedup_quant``: identical ``quant_per_token_int8`` calls on one tensor become one.
2. The fusions, larger first (a ``PatternMatcherPass`` anchored on every
   ``quant_per_token_int8`` node; the first recognizer that accepts the quant's
   producer rewrites it): fused_add_rms_norm, add + rms_norm, rms_norm,
   silu * mul, then the torch-native norm forms.
3. ``add_rms_norm``: a residual add read by a ``qfuse::rms_norm`` that no quant follows (the
   weight-only schemes, the final norm) becomes ``fused_add_rms_norm`` (add_norm.py).

``uuid()`` hashes the source of every module of this package and the config, so
the FX graph cache stays on and never serves a graph built by other passes.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
from pathlib import Path

import torch
from torch._inductor import custom_graph_pass
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.pattern_matcher import MULTIPLE, CallFunction, KeywordArg, Match, PatternMatcherPass, register_graph_pattern

from qfuse.ops._inductor import register_inductor_fallbacks

from . import norm_quant, silu_mul_quant
from .add_norm import fuse_add_rms_norm
from .counters import counters, log, record
from .dedup_quant import QUANT, dedup_quant
from .graph_utils import peel_row_reshapes
from .rewrite import apply_plan, quant_ok


@dataclasses.dataclass(frozen=True)
class PassConfig:
    """Which rewrites exist. Every field is part of the pass uuid (the FX cache key)."""

    dedup_quant: bool = True  # collapse identical quant calls (q/k/v, gate/up) first
    fuse_norm_quant: bool = True  # qfuse rms_norm / fused_add_rms_norm (+ plain residual add) -> quant
    fuse_act_quant: bool = True  # silu(gate) * up -> quant
    hf_rms_norm: bool = True  # second tier: the HF LlamaRMSNorm decomposition (exactly qfuse's math)
    # F.rms_norm / nn.RMSNorm multiply the weight in fp32 and round once; the fused op
    # rounds like HF (before the weight multiply): int8 codes may move by up to 2. Opt-in.
    torch_rms_norm: bool = False
    fuse_add_norm: bool = True  # residual add + qfuse rms_norm (no quant after) -> fused_add_rms_norm


# (counter name, recognizer, config fields that must all be on), larger patterns first.
FUSIONS = (
    ("fused_add_rms_norm_quant", norm_quant.fused_add_rms_norm, ("fuse_norm_quant",)),
    ("add_rms_norm_quant", norm_quant.add_rms_norm, ("fuse_norm_quant",)),
    ("rms_norm_quant", norm_quant.rms_norm, ("fuse_norm_quant",)),
    ("silu_and_mul_quant", silu_mul_quant.silu_mul, ("fuse_act_quant",)),
    ("add_hf_rms_norm_quant", norm_quant.add_hf_rms_norm, ("fuse_norm_quant", "hf_rms_norm")),
    ("hf_rms_norm_quant", norm_quant.hf_rms_norm, ("fuse_norm_quant", "hf_rms_norm")),
    ("add_torch_rms_norm_quant", norm_quant.add_torch_rms_norm, ("fuse_norm_quant", "torch_rms_norm")),
    ("torch_rms_norm_quant", norm_quant.torch_rms_norm, ("fuse_norm_quant", "torch_rms_norm")),
)


def _check(recognize, match: Match) -> bool:
    quant = match.output_node()
    if not quant_ok(quant):
        return False
    producer, chain = peel_row_reshapes(quant.args[0])
    plan = recognize(producer) if isinstance(producer, torch.fx.Node) else None
    if plan is None:
        return False
    match.qfuse_plan = (chain, plan)  # read by _rewrite
    return True


def _rewrite(name: str, match: Match, inp) -> None:
    chain, plan = match.qfuse_plan
    kept = apply_plan(match.graph, match.output_node(), chain, plan)
    record(name)
    if kept:
        record("kept_float_output")


@functools.cache
def pattern_pass(config: PassConfig) -> PatternMatcherPass:
    """The PatternMatcherPass for ``config`` (built once per process and config)."""
    pm = PatternMatcherPass(pass_name="qfuse_fusion")
    anchor = CallFunction(QUANT, KeywordArg("inp"), _users=MULTIPLE)
    for name, recognize, flags in FUSIONS:
        if all(getattr(config, f) for f in flags):
            register_graph_pattern(anchor, extra_check=functools.partial(_check, recognize), pass_dict=pm)(functools.partial(_rewrite, name))
    return pm


@functools.cache
def _source_hash() -> str:
    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


# Inductor calls a pass of this class with is_inference (torch releases without it call none with it)
_InferenceAware = getattr(custom_graph_pass, "CustomInferenceAwareGraphPass", None)


def _chained(then) -> tuple:
    """The passes ``then`` names: none, one, or those of a list / tuple."""
    if then is None:
        return ()
    return tuple(then) if isinstance(then, (list, tuple)) else (then,)


class QfusePostGradPass(_InferenceAware or CustomGraphPass):
    """qfuse's fusion passes as one Inductor post-grad custom pass.

    ``then``: another pass to run afterwards (e.g. one the user had installed in
    ``post_grad_custom_post_pass``), or a list / tuple of them, run in order (torch >= 2.13
    takes a list there); each must be a ``CustomGraphPass`` with a uuid for the FX graph
    cache to stay on, as Inductor itself requires. A ``CustomInferenceAwareGraphPass`` among
    them gets the ``is_inference`` Inductor gave this pass (True when called without it).
    """

    def __init__(self, config: PassConfig | None = None, then=None):
        self.config = config or PassConfig()
        self.then = then

    def __call__(self, graph: torch.fx.Graph, is_inference: bool = True) -> None:
        before = collections.Counter(counters)
        if self.config.dedup_quant:
            record("dedup_quant", dedup_quant(graph))
        if graph.find_nodes(op="call_function", target=QUANT):
            pattern_pass(self.config).apply(graph)
        if self.config.fuse_add_norm:
            record("add_rms_norm", fuse_add_rms_norm(graph))
        fired = counters - before
        if fired:
            graph.lint()
            log.info("qfuse.passes: %s", ", ".join(f"{k}={v}" for k, v in sorted(fired.items())))
        for then in _chained(self.then):
            if _InferenceAware is not None and isinstance(then, _InferenceAware):
                then(graph, is_inference)
            else:
                then(graph)

    def uuid(self):
        then = [p.uuid() if isinstance(p, CustomGraphPass) else None for p in _chained(self.then)]
        if None in then:
            return None  # a pass without a uuid: Inductor must bypass the cache
        return hashlib.sha256(f"{_source_hash()}|{self.config!r}|{then!r}".encode()).hexdigest()

    def __repr__(self) -> str:
        return f"QfusePostGradPass({self.config!r})"

    # equal passes for equal settings: transformers compiles generate's step again whenever the
    # call's CompileConfig differs from the last one, so qfuse.compile_config() made per call
    # recompiled every call (and failed at Dynamo's recompile limit)
    def __eq__(self, other) -> bool:
        return type(other) is type(self) and self.config == other.config and self.then == other.then

    def __hash__(self) -> int:
        return hash((type(self), repr(self.config)))


def inductor_options(config: PassConfig | None = None, *, then=None, **config_fields) -> dict:
    """Options for ``torch.compile(model, options=qfuse.passes.inductor_options())``.

    Keyword arguments set :class:`PassConfig` fields, e.g. ``inductor_options(torch_rms_norm=True)``.
    """
    if config is None:
        config = PassConfig(**config_fields)
    elif config_fields:
        config = dataclasses.replace(config, **config_fields)
    register_inductor_fallbacks()  # before the compile: torch 2.11's implicit fallback (ops/_inductor.py)
    return {"post_grad_custom_post_pass": QfusePostGradPass(config, then=then)}

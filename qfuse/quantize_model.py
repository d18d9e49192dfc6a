"""``quantize_model``: convert a model's ``nn.Linear`` and RMSNorm modules in place."""

from __future__ import annotations

import copy
import fnmatch
import math
import warnings
from collections import Counter
from collections.abc import Iterable

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .calibration.fake_quant import FakeQuantLinear, fake_quant_linear
from .calibration.grid import WeightGrid
from .calibration.pipeline import LayerCalibrator
from .calibration.recipe import check_recipe, parse_recipe
from .eager_graphs import graph_blocks
from .fused_projections import ProjectionSlice
from .linear import QuantLinear, check_quantizable
from .moe import QuantMoE, check_moe_quantizable, sparse_moe_blocks
from .norm import RMSNorm, check_convertible, is_convertible_rmsnorm
from .schemes import Scheme, get_scheme, make_scheme, op_group_sizes

# Kept in floating point besides the caller's ignore entries (the head unless lm_head= names a
# scheme). Unlike entries the caller passes, they do not warn when they match nothing: most models
# without an "lm_head" simply have no output head. Qwen2-MoE's
# shared_expert_gate ([1, H], a scalar gate per token) stays float as vLLM and llm-compressor
# keep it: quantizing it saves 2 * H bytes per layer and vLLM loads it as a float Linear.
DEFAULT_IGNORE = ("lm_head", "shared_expert_gate")


def _ignored(name: str, ignore: Iterable[str]) -> bool:
    """A module is skipped when an ``ignore`` entry equals its full name or its last
    component, or matches its full name as a glob (``"model.layers.0.*"``)."""
    last = name.rsplit(".", 1)[-1]
    return any(pat == name or pat == last or fnmatch.fnmatchcase(name, pat) for pat in ignore)


def _label(name: str) -> str:
    """The name used in messages; the model itself has the empty name."""
    return name or "model"


def _ignore_patterns(ignore: str | Iterable[str] | None) -> tuple[str, ...]:
    """``ignore`` as a tuple of patterns. A str is one pattern: iterating it would give
    its characters, and "lm_head" would then ignore nothing."""
    if ignore is None:
        return DEFAULT_IGNORE
    patterns = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    not_str = [p for p in patterns if not isinstance(p, str)]
    if not_str:
        raise TypeError(f"ignore entries must be str, got {not_str!r}")
    return patterns


def _refuse_quantized(model: nn.Module) -> None:
    """A model holding QuantLinears was quantized before. Quantizing the rest silently
    would leave the model with the old scheme; requantizing would quantize rounded
    weights a second time. Neither is what a second call means."""
    if any(isinstance(m, ProjectionSlice) for m in model.modules()):
        raise ValueError(
            "model has projections stacked by qfuse.fuse_projections; quantize the unfused model "
            "(qfuse.unfuse_projections(model) first) and fuse after quantize_model"
        )
    kinds = (QuantLinear, FakeQuantLinear, QuantMoE)  # fake_quant=True layers and MoE blocks were quantized too
    schemes = Counter(
        f"{(m.experts if isinstance(m, QuantMoE) else m).scheme.name} {next(k.__name__ for k in kinds if isinstance(m, k))}"
        for m in model.modules()
        if isinstance(m, kinds)
    )
    if schemes:
        found = ", ".join(f"{n} {s}" for s, n in sorted(schemes.items()))
        raise ValueError(
            f"model is already quantized ({found} layer(s)); quantize_model converts float nn.Linear "
            "layers and does not requantize: start again from the float model. To give some layers another scheme, "
            "keep them out of the first call with ignore=... and quantize those submodules in a second call"
        )


def _candidates(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every module quantize_model could replace: float ``nn.Linear`` and convertible RMSNorms."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) or is_convertible_rmsnorm(m)]


def _warn_unmatched(patterns: tuple[str, ...], names: list[str]) -> None:
    """An entry that matches no layer ignores nothing, which is a typo or a container
    name (``"mlp"``: entries match layers, not the modules holding them)."""
    for pat in patterns:
        if not any(_ignored(name, (pat,)) for name in names):
            warnings.warn(
                f"quantize_model: ignore entry {pat!r} matches no nn.Linear or RMSNorm layer, so it ignores nothing "
                "(an entry matches a layer's full name, its last name component, or its full name as a glob, "
                "e.g. 'model.layers.0.*')",
                UserWarning,
                stacklevel=4,
            )


def _refuse_nothing_to_quantize(model: nn.Module, linears: list, candidates: list, patterns: tuple[str, ...]) -> None:
    """Returning a model with no quantized layer would look like success (a model of
    transformers Conv1D layers, an ignore pattern matching everything, an fp32 model whose
    norms alone would be converted and then fail at every forward). Sparse-MoE experts that
    ``ignore`` leaves count as layers to quantize (experts only, attention kept float)."""
    if linears or _kept_moe_blocks(model, patterns):
        return
    n_linear = sum(isinstance(m, nn.Linear) for _, m in candidates)
    why = f"all {n_linear} nn.Linear layer(s) are matched by ignore={patterns!r}" if n_linear else f"{type(model).__name__} contains no nn.Linear"
    raise ValueError(f"nothing to quantize (model left unchanged): {why}")


def _check_finite(w: Tensor, name: str) -> None:
    """A meta tensor has no values to check."""
    if not w.is_meta and not torch.isfinite(w).all():
        bad = int((~torch.isfinite(w)).sum())
        raise ValueError(f"{name}: weight has {bad} NaN/inf value(s) of {w.numel()} (a broken checkpoint?)")


def _in_features(mod: nn.Linear) -> int | None:
    w = mod.weight
    return w.shape[1] if w.dim() == 2 else None


def _ragged(scheme: Scheme, k: int | None) -> bool:
    """Whether ``scheme``'s group does not divide ``k`` inputs."""
    return k is not None and scheme.group_size != -1 and k % scheme.group_size != 0


def _fallback_scheme(scheme: Scheme, k: int) -> Scheme | None:
    """The scheme of a layer of ``k`` inputs that ``scheme``'s group does not divide: the
    largest group the scheme's op runs that is <= its group and divides ``k`` (wna16_gemm and
    w4a8_gemm: 64, then 32, for a scheme of group 128); an int8-activation op without such a
    group runs the layer per channel. None when no group divides ``k``: the layer is refused,
    as without a fallback."""
    for g in op_group_sizes(scheme.weight_bits, scheme.act_bits):
        if g < scheme.group_size and k % g == 0:
            return make_scheme(scheme.weight_bits, scheme.act_bits, g, scheme.symmetric, scheme.static_act)
    if not scheme.weight_only:
        return make_scheme(scheme.weight_bits, scheme.act_bits, -1, scheme.symmetric, scheme.static_act)
    return None


def _layer_schemes(linears: list[tuple[str, nn.Module]], scheme: Scheme, group_fallback: bool) -> dict[str, Scheme]:
    """Each Linear's scheme: ``scheme``, or its fallback where its group does not divide in_features."""
    out = {}
    for name, mod in linears:
        k = _in_features(mod)
        fallback = _fallback_scheme(scheme, k) if group_fallback and _ragged(scheme, k) else None
        out[name] = fallback or scheme
    return out


def _warn_fallbacks(linears: list[tuple[str, nn.Module]], schemes: dict[str, Scheme], scheme: Scheme, stacklevel: int = 3) -> None:
    """One warning for every layer that runs a smaller group (or per channel) than ``scheme``."""
    moved = [(name, schemes[name]) for name, _ in linears if schemes[name] is not scheme]
    if not moved:
        return
    by_scheme: dict[Scheme, list[str]] = {}
    for name, s in moved:
        by_scheme.setdefault(s, []).append(name)
    parts = []
    for s, names in sorted(by_scheme.items(), key=lambda item: -item[0].group_size):
        group = "per channel" if s.group_size == -1 else f"with group {s.group_size}"
        parts.append(f"{len(names)} {group} ({s.name}, e.g. {_label(names[0])})")
    warnings.warn(
        f"quantize_model: {len(moved)} of {len(linears)} layer(s) have in_features not divisible by group_size={scheme.group_size} "
        f"of {scheme.name} and use the largest group its op runs that divides them instead: {', '.join(parts)}; "
        "pass group_fallback=False to refuse these layers",
        UserWarning,
        stacklevel=stacklevel,
    )


def _problem(name: str, mod: nn.Module, scheme: Scheme, fallback_failed: bool = False) -> Exception | None:
    """Why ``mod`` cannot be converted, or None. ``fallback_failed``: ``scheme``'s group does not
    divide the layer's in_features and no smaller group its op runs does."""
    try:
        if isinstance(mod, nn.Linear):
            check_quantizable(mod.weight, scheme, _label(name))
            _check_finite(mod.weight.detach(), _label(name))
        else:
            check_convertible(mod, _label(name))
    except TypeError as e:
        return e
    except ValueError as e:
        k = _in_features(mod) if isinstance(mod, nn.Linear) else None
        if fallback_failed and not (scheme.weight_bits == 4 and k % 2):  # the group check failed
            smaller = [str(g) for g in op_group_sizes(scheme.weight_bits, scheme.act_bits) if g < scheme.group_size]
            return ValueError(f"{e}, nor by a smaller group size {scheme.op} runs ({', '.join(smaller) or 'none'})")
        return e
    return None


def _check_all(layers: list[tuple[str, nn.Module]], scheme: Scheme, schemes: dict[str, Scheme] | None = None, group_fallback: bool = False) -> None:
    """One error naming every layer that cannot be converted, before anything changes.
    ``schemes``: a Linear's own scheme by name (default: ``scheme``)."""
    schemes = schemes or {}
    problems = []
    for name, mod in layers:
        s = schemes.get(name, scheme)
        failed = group_fallback and isinstance(mod, nn.Linear) and _ragged(s, _in_features(mod))
        if (e := _problem(name, mod, s, failed)) is not None:
            problems.append(e)
    if not problems:
        return
    kind = TypeError if all(isinstance(e, TypeError) for e in problems) else ValueError
    lines = "\n  ".join(str(e) for e in problems[:20])
    more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
    raise kind(
        f"cannot quantize {len(problems)} layer(s) with {scheme.name} (model left unchanged):\n  {lines}{more}\n"
        "pass their names in ignore=... to keep them in floating point"
    )


def _build_replacements(linears: list, norms: list, scheme: Scheme, schemes: dict[str, Scheme], progress: bool) -> list[tuple[str, nn.Module]]:
    """Every new module, built before any is swapped in: an error half-way (a quantizer,
    out of memory, Ctrl-C) then leaves the model exactly as it was. ``schemes``: each
    Linear's scheme by name."""
    with tqdm(linears, desc=f"qfuse {scheme.name}", unit="layer", disable=not progress) as bar:
        new: list[tuple[str, nn.Module]] = [(name, QuantLinear.from_linear(mod, schemes[name])) for name, mod in bar]
    new += [(name, RMSNorm.from_module(mod)) for name, mod in norms]
    return new


def head_untied(model: nn.Module) -> bool:
    """Whether a model whose config says ``tie_word_embeddings`` has an output head that does not
    share the input embedding's weight (a quantized head): transformers' ``tie_weights`` and
    checkpoint readers would tie them again, or skip the stored head."""
    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return False
    try:
        head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return False
    return head is not None and embedding is not None and getattr(head, "weight", None) is not getattr(embedding, "weight", None)


def _swap_in(model: nn.Module, replacements: list[tuple[str, nn.Module]], inference: bool = True) -> nn.Module:
    """The model with ``replacements`` swapped in. ``inference``: qfuse's ops have no backward, so
    the float parameters left (embeddings, a kept head, norms) stop requiring grad, as
    ``qfuse.from_pretrained``'s do: with them a plain ``model(ids)`` in grad mode reached the first
    qfuse op with a tensor that requires grad and raised."""
    for name, new in replacements:
        if not name:
            # The model is itself an nn.Linear (a leaf, so the only replacement): there is
            # no parent to swap it into, the new module is the result.
            return new.requires_grad_(False) if inference else new
        model.set_submodule(name, new)
    if head_untied(model):
        model.config.tie_word_embeddings = False
    graph_blocks(model)  # eager decode calls of each MLP block: one CUDA-graph replay (qfuse/eager_graphs.py)
    return model.requires_grad_(False) if inference else model


def _check_calibration(steps: list, scheme: Scheme, data, calibration) -> None:
    """Calibration steps need data; data needs a step (or a static scheme) to use it."""
    check_recipe(steps, scheme)
    if (steps or scheme.static_act) and data is None:
        need = f"calibration={calibration!r}" if steps else f"{scheme.name} (static activation scales)"
        raise ValueError(f"{need} needs calibration_data: token ids [B, T] or a list of them (e.g. qfuse.calibration.calibration_batches(tokenizer))")
    if data is not None and not steps and not scheme.static_act:
        raise ValueError(
            f"calibration_data was given but nothing uses it: {scheme.name} with calibration=None rounds to nearest "
            "(pass calibration='gptq', 'awq', 'sq', ... or drop calibration_data)"
        )


def _fake_quant_replacements(
    model: nn.Module, linears: list, schemes: dict[str, Scheme], steps: list, data, progress: bool
) -> list[tuple[str, nn.Module]]:
    """FakeQuantLinears: the calibration's own (the pipeline leaves them in the decoder layers),
    round to nearest for the rest."""
    if data is not None:
        LayerCalibrator(steps, schemes).run(model, data, progress)
    new = []
    for name, mod in linears:
        if isinstance(mod, nn.Linear) and not isinstance(model.get_submodule(name) if name else model, FakeQuantLinear):
            grid = WeightGrid(schemes[name], mod.in_features, mod.weight.dtype)
            new.append((name, fake_quant_linear(schemes[name], grid, grid.rtn(mod.weight.detach().float()), mod.bias, mod.weight.dtype)))
    return new


def _calibrated_replacements(
    model: nn.Module, linears: list, scheme: Scheme, schemes: dict[str, Scheme], steps: list, data, progress: bool, results: dict | None = None
) -> list[tuple[str, nn.Module]]:
    """QuantLinears from the layer-by-layer calibration (run here unless its ``results`` are
    given); Linears outside the decoder layers round to nearest."""
    if results is None:
        results = LayerCalibrator(steps, schemes).run(model, data, progress)
    new = []
    for name, mod in linears:
        r = results.get(name)
        if r is None:
            if schemes[name].static_act:
                raise ValueError(
                    f"{_label(name)}: {scheme.name} needs a calibrated activation scale, and calibration runs inside "
                    "the decoder layers only: pass this layer in ignore=..."
                )
            new.append((name, QuantLinear.from_linear(mod, schemes[name])))
        else:
            n, k = r.w_hat.shape
            new.append((name, QuantLinear(k, n, r.scheme, r.tensors, r.bias, r.act_perm)))
    return new


def _moe_scheme(scheme: Scheme, hidden: int, intermediate: int, group_fallback: bool) -> Scheme:
    """The experts' scheme: ``scheme``, or where its group does not divide both the hidden and the
    expert intermediate size, the fallback a Linear of ``gcd(hidden, intermediate)`` inputs gets."""
    k = math.gcd(hidden, intermediate)
    if group_fallback and _ragged(scheme, k):
        return _fallback_scheme(scheme, k) or scheme  # none: from_block refuses with the sizes
    return scheme


def _kept_moe_blocks(model: nn.Module, patterns: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    """The sparse-MoE blocks that ``ignore`` matches neither by the block's name nor by ``<block>.experts``."""
    return [(n, b) for n, b in sparse_moe_blocks(model) if not (_ignored(n, patterns) or _ignored(f"{n}.experts", patterns))]


def _moe_replacements(
    model: nn.Module, scheme: Scheme, patterns: tuple[str, ...], group_fallback: bool, simulated: bool
) -> list[tuple[str, nn.Module]]:
    """A :class:`qfuse.moe.QuantMoE` for every Hugging Face sparse-MoE block (Mixtral, Qwen2-MoE, Qwen3-MoE)
    that ``ignore`` does not match (by the block's name or ``<block>.experts``), built before anything is
    swapped in. Its experts take ``scheme`` by round to nearest; the shared expert's Linears stay the
    block's own modules and are converted as Linears. Calibration and the fake-quant simulation do not
    cover experts yet, so those refuse a model with such blocks."""
    blocks = _kept_moe_blocks(model, patterns)
    if not blocks:
        return []
    names = ", ".join(_label(n) for n, _ in blocks[:3]) + (", ..." if len(blocks) > 3 else "")
    if simulated:
        raise ValueError(
            f"calibration and fake_quant do not cover sparse-MoE experts yet ({len(blocks)} block(s): {names}); "
            "quantize without them, or keep the blocks in floating point with ignore=[<block name>, ...]"
        )
    if any(not n for n, _ in blocks):
        raise ValueError("quantize_model: the model is itself a sparse-MoE block; convert it with qfuse.moe.QuantMoE.from_block(block, scheme)")
    plan, refused = [], []
    for name, block in blocks:  # every block checked before any is quantized (minutes on a large model)
        gate_up = block.experts.gate_up_proj
        s = _moe_scheme(scheme, gate_up.shape[2], gate_up.shape[1] // 2, group_fallback)
        try:
            check_moe_quantizable(gate_up, block.experts.down_proj, s, f"{_label(name)}.experts")
        except (TypeError, ValueError) as e:
            refused.append((name, e))
        plan.append((name, block, s))
    if refused:
        names = ", ".join(_label(n) for n, _ in refused[:5]) + (f" and {len(refused) - 5} more" if len(refused) > 5 else "")
        error = type(refused[0][1])
        raise error(
            f"quantize_model: {len(refused)} sparse-MoE block(s) cannot take {scheme.name} ({names}): {refused[0][1]}; "
            "keep them in floating point with ignore=[<block name>, ...]"
        )
    new = []
    for name, block, s in plan:
        if s is not scheme:
            warnings.warn(
                f"quantize_model: {_label(name)}.experts run {s.name}: group_size={scheme.group_size} does not divide their sizes",
                UserWarning,
                stacklevel=3,
            )
        new.append((name, QuantMoE.from_block(block, s, name)))
    return new


def quantize_model(
    model: nn.Module,
    scheme: Scheme | str,
    *,
    ignore: str | Iterable[str] | None = None,
    lm_head: Scheme | str | None = None,
    progress: bool = True,
    group_fallback: bool = True,
    calibration=None,
    calibration_data=None,
    fake_quant: bool = False,
) -> nn.Module:
    """Quantize ``model`` in place with ``scheme`` and return it.

    Every ``nn.Linear`` becomes a :class:`qfuse.QuantLinear`; every RMSNorm of a Hugging
    Face Llama / Qwen2 / Mistral model (and ``torch.nn.RMSNorm``) becomes a
    :class:`qfuse.RMSNorm` calling ``qfuse::rms_norm``. Layers matched by ``ignore`` are
    kept as they are: an entry matches a layer's full name, its last name component, or
    its full name as a glob (``"model.layers.0.*"``); a str is one entry; an entry that matches
    no layer warns. ``lm_head`` and ``shared_expert_gate`` are kept in any case (the head is
    quantized by ``lm_head=`` only): ``ignore`` adds to them.

    ``lm_head``: quantize the output head (the ``nn.Linear`` named ``lm_head``) too, with this
    scheme, e.g. ``"W8A16"`` or ``"W4A16"`` (weight-only: the head's int8 activations would be
    one more quantization on the logits); None keeps it in floating point. Perplexity cost on
    SmolLM2-135M in README.md ("Quantizing lm_head"). A head tied to the input embedding is
    untied: the embedding keeps its float weight.

    ``group_fallback``: a Linear whose in_features the scheme's group size does not divide
    (SmolLM2's hidden size 576 = 4 * 128 + 64) takes the largest group the scheme's op runs
    that is smaller and divides it (64, then 32: ``W4A16_G64``, ``W4A16_G64_ASYM``, ``W4A8_G64``;
    a W4A8 layer no group divides runs per channel, ``W4A8``), and one ``UserWarning`` per call gives their count, groups and an example
    name. ``save_quantized`` records each layer's group. ``False`` refuses these layers.

    All layers are checked, and all new modules built, before any is swapped in: a layer
    that cannot be converted (fp32 weights, in_features divisible by no group size the
    op runs, NaN/inf weights, ...) raises a ``ValueError``/``TypeError`` naming every such
    layer, and any error leaves the model untouched. It also raises a ``ValueError``
    when no ``nn.Linear`` is left to quantize, and when the model already contains
    ``QuantLinear`` layers (no requantization: start from the float model).

    ``calibration``: a recipe of :class:`qfuse.calibration.SmoothQuant`, :class:`~qfuse.calibration.AWQ`
    and :class:`~qfuse.calibration.GPTQ` steps (one, a list, or their names joined by ``+``:
    ``"gptq"``, ``"sq+gptq"``, ``"awq+gptq"``), run decoder layer by decoder layer on
    ``calibration_data`` (token ids ``[B, T]`` or a list of such batches, e.g.
    :func:`qfuse.calibration.calibration_batches`, or a tokenizer's padded output, whose rows then
    run one by one without their padding) before the Linears are replaced. The static
    scheme ``W8A8_STATIC`` needs ``calibration_data`` too (its activation scales). Calibration
    changes the model as it goes (the smoothing and scaling are folded into the norms): an error
    part-way leaves it partly calibrated, so start again from the float model.

    ``fake_quant=True`` returns the quantization as the algorithm itself simulates it instead:
    each Linear becomes a :class:`qfuse.calibration.FakeQuantLinear` holding the algorithm's
    float32 weight ``(c - z) * s`` and quantizing activations with the ops' reference formula,
    in plain torch, and the norms stay as they are. Its outputs match the ``QuantLinear`` model
    of the same call (tests/qfuse/calibration): a check that packing and the ops compute what
    the algorithm optimized.

    A model on the meta device gives a skeleton with meta buffers of the real shapes
    and dtypes, to be filled by ``load_state_dict(state_dict, assign=True)``.

    A bare ``nn.Linear`` cannot be changed in place: the returned ``QuantLinear``
    replaces it, so use the return value.
    """
    ignore = None if ignore is None else _ignore_patterns(ignore)  # once: an iterator is read once
    linears, norms, schemes, steps = _plan(model, scheme, ignore, group_fallback, calibration, calibration_data, lm_head)
    scheme = get_scheme(scheme)
    # MoE blocks first: their shared-expert Linears are then swapped inside the new block
    moes = _moe_replacements(model, scheme, _ignore_patterns(ignore), group_fallback, fake_quant or calibration_data is not None)
    if fake_quant:
        return _swap_in(model, _fake_quant_replacements(model, linears, schemes, steps, calibration_data, progress), inference=False)
    if calibration_data is None:
        return _swap_in(model, moes + _build_replacements(linears, norms, scheme, schemes, progress))
    new = _calibrated_replacements(model, linears, scheme, schemes, steps, calibration_data, progress)
    return _swap_in(model, new + [(name, RMSNorm.from_module(mod)) for name, mod in norms])


def quantize_with_simulation(
    model: nn.Module,
    scheme: Scheme | str,
    *,
    ignore=None,
    lm_head: Scheme | str | None = None,
    progress: bool = True,
    group_fallback: bool = True,
    calibration=None,
    calibration_data=None,
) -> tuple[nn.Module, nn.Module]:
    """``(quantize_model(model, ...), quantize_model(copy, ..., fake_quant=True))`` from one
    calibration run: the kernels' model and the algorithm's simulation of exactly the same codes."""
    ignore = None if ignore is None else _ignore_patterns(ignore)  # once: an iterator is read once
    linears, norms, schemes, steps = _plan(model, scheme, ignore, group_fallback, calibration, calibration_data, lm_head)
    scheme = get_scheme(scheme)
    _moe_replacements(model, scheme, _ignore_patterns(ignore), group_fallback, simulated=True)  # refuses MoE blocks
    if calibration_data is None:
        simulation = copy.deepcopy(model)
        sim_linears = [(n, simulation.get_submodule(n) if n else simulation) for n, _ in linears]
        simulation = _swap_in(simulation, _fake_quant_replacements(simulation, sim_linears, schemes, steps, None, progress), inference=False)
        return _swap_in(model, _build_replacements(linears, norms, scheme, schemes, progress)), simulation
    results = LayerCalibrator(steps, schemes).run(model, calibration_data, progress)
    simulation = copy.deepcopy(model)  # the decoder layers hold the calibration's FakeQuantLinears now
    sim_linears = [(n, simulation.get_submodule(n)) for n, _ in linears]
    simulation = _swap_in(simulation, _fake_quant_replacements(simulation, sim_linears, schemes, steps, None, progress), inference=False)
    new = _calibrated_replacements(model, linears, scheme, schemes, steps, calibration_data, progress, results)
    return _swap_in(model, new + [(name, RMSNorm.from_module(mod)) for name, mod in norms]), simulation


def _plan(model, scheme, ignore, group_fallback, calibration, calibration_data, lm_head=None):
    """Every check of quantize_model, before anything changes: the Linears and norms to convert,
    each Linear's scheme, the calibration steps."""
    scheme = get_scheme(scheme)
    patterns = _ignore_patterns(ignore)
    _refuse_quantized(model)
    candidates = _candidates(model)
    if ignore is not None:
        _warn_unmatched(patterns, [n for n, _ in candidates] + [f"{n}{tail}" for n, _ in sparse_moe_blocks(model) for tail in ("", ".experts")])
    heads, head_scheme = _heads(candidates, lm_head, ignore, patterns)
    # the defaults hold whatever the caller ignores besides: the head is quantized by lm_head= only
    defaults = tuple(p for p in DEFAULT_IGNORE if not (heads and p == "lm_head"))
    patterns = defaults if ignore is None else tuple(dict.fromkeys(patterns + defaults))
    # a sparse-MoE block named in ignore is kept whole: Qwen2-MoE's shared expert inside it too
    whole = tuple(f"{n}." for n, _ in sparse_moe_blocks(model) if _ignored(n, patterns))
    kept = [(n, m) for n, m in candidates if not (_ignored(n, patterns) or n.startswith(whole))]
    linears = [(n, m) for n, m in kept if isinstance(m, nn.Linear)]
    norms = [(n, m) for n, m in kept if not isinstance(m, nn.Linear)]
    _refuse_nothing_to_quantize(model, linears, candidates, patterns)
    body = [(n, m) for n, m in linears if n not in heads]
    schemes = _layer_schemes(body, scheme, group_fallback)
    if heads:
        schemes.update(_layer_schemes([(n, m) for n, m in linears if n in heads], head_scheme, group_fallback))
    _check_all(linears + norms, scheme, schemes, group_fallback)
    steps = parse_recipe(calibration)
    _check_calibration(steps, scheme, calibration_data, calibration)
    _warn_fallbacks(body, schemes, scheme, stacklevel=4)
    if heads:
        _warn_fallbacks([(n, m) for n, m in linears if n in heads], schemes, head_scheme, stacklevel=4)
    return linears, norms, schemes, steps


def _heads(candidates: list, lm_head, ignore, patterns: tuple[str, ...]) -> tuple[set[str], Scheme | None]:
    """The output-head Linears ``lm_head=`` quantizes (named ``lm_head``) and their scheme."""
    if lm_head is None:
        return set(), None
    head_scheme = get_scheme(lm_head)
    if head_scheme.static_act:
        raise ValueError(f"lm_head={head_scheme.name!r}: a static activation scale needs calibration, which runs inside the decoder layers only")
    heads = {n for n, m in candidates if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] == "lm_head"}
    if not heads:
        raise ValueError(f"lm_head={head_scheme.name!r}: the model has no nn.Linear named lm_head")
    if ignore is not None and any(_ignored(n, patterns) for n in heads):
        raise ValueError(f"lm_head={head_scheme.name!r} quantizes the head, but ignore={patterns!r} keeps it in floating point: drop one of the two")
    return heads, head_scheme

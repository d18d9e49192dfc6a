"""``qfuse.compile``: ``torch.compile`` with qfuse's Inductor fusion passes switched on.

    model = qfuse.compile(model, fullgraph=True)                 # passes on
    model = torch.compile(model, options=qfuse.inductor_options())  # the same, by hand

Nothing here touches global Inductor config; the passes live in the options of
that one compile. ``torch.compile`` refuses ``mode=`` together with ``options=``,
so ``qfuse.compile`` turns a ``mode`` into its Inductor options
(``torch._inductor.list_mode_options``) and merges them.

Generation: ``model.generate`` of Hugging Face models calls the module's own forward, never
a ``torch.compile`` wrapper around it, so ``torch.compile(model).generate(...)`` runs eagerly.
transformers compiles the decode steps itself when the cache is static and a ``compile_config``
is given; :func:`compile_config` builds one with the qfuse passes, and ``qfuse.compile`` of a
model that has ``generate`` returns a module whose ``generate`` uses it (static cache, decode
steps compiled, the prompt's prefill eager, as transformers does).
"""

from __future__ import annotations

import functools
import inspect

import torch


def inductor_options(config=None, **config_fields) -> dict:
    """The ``options=`` dict for ``torch.compile`` that installs the qfuse fusion passes.

    Keyword arguments set fields of :class:`qfuse.passes.PassConfig`
    (``dedup_quant``, ``fuse_norm_quant``, ``fuse_act_quant``, ``hf_rms_norm``, ``torch_rms_norm``).
    """
    from qfuse.passes import inductor_options as _options  # imports torch._inductor lazily

    return _options(config, **config_fields)


def _compile_kwargs(passes: bool, pass_config, kwargs: dict) -> dict:
    """``torch.compile`` keyword arguments with the passes merged into ``options``."""
    kwargs = dict(kwargs)
    backend = kwargs.get("backend", "inductor")
    if backend != "inductor":
        if not passes:  # the A/B form of a torch.compile call with another backend: nothing of Inductor's to set
            return kwargs
        raise ValueError(f"qfuse.compile: the fusion passes need backend='inductor', got backend={backend!r}")
    from qfuse.ops._inductor import register_inductor_fallbacks

    register_inductor_fallbacks()  # torch 2.11's implicit fallbacks can stall a deep graph's compile (ops/_inductor.py)
    if not passes:
        return kwargs
    mode = kwargs.pop("mode", None)
    options = dict(kwargs.pop("options", None) or {})
    if mode not in (None, "default"):
        from torch._inductor import list_mode_options

        options = {**list_mode_options(mode, kwargs.get("dynamic")), **options}
    import torch._inductor.config as inductor_config

    from qfuse.passes import QfusePostGradPass
    from qfuse.passes import inductor_options as _options

    # options= replaces Inductor's config for this compile: a pass the caller set there, or else
    # globally in torch._inductor.config, runs after qfuse's instead of being dropped
    key = "post_grad_custom_post_pass"
    then = options[key] if key in options else inductor_config.post_grad_custom_post_pass
    if isinstance(then, QfusePostGradPass):  # qfuse's own pass set globally: its config is replaced, what it chained kept
        then = then.then
    options.update(_options(pass_config, then=then))
    return {**kwargs, "options": options}


def compile(model, *, passes: bool = True, pass_config=None, **torch_compile_kwargs):  # noqa: A001 - mirrors torch.compile
    """``torch.compile(model, **torch_compile_kwargs)`` with the qfuse passes installed.

    ``passes=False`` compiles without them (same call otherwise, for A/B runs).
    ``pass_config``: a :class:`qfuse.passes.PassConfig`. A pass the caller already put in
    ``options["post_grad_custom_post_pass"]`` (or each of a list there, in order), or else in
    ``torch._inductor.config.post_grad_custom_post_pass``, runs after qfuse's.
    A model with ``generate`` (Hugging Face) gets a ``generate`` that compiles the decode steps
    (see the module docstring and :func:`compile_config`).
    """
    compiled = torch.compile(model, **_compile_kwargs(passes, pass_config, torch_compile_kwargs))
    if isinstance(model, torch.nn.Module) and callable(getattr(model, "generate", None)) and not torch_compile_kwargs.get("disable"):
        steps = {k: v for k, v in torch_compile_kwargs.items() if k != "disable"}
        config = compile_config(passes=passes, pass_config=pass_config, **steps)
        # on the wrapper itself: OptimizedModule.__setattr__ would set it on the model passed in
        object.__setattr__(compiled, "generate", _generate_compiled(model.generate, config))
    return compiled


def compile_config(*, passes: bool = True, pass_config=None, fullgraph: bool = True, dynamic: bool | None = False, **torch_compile_kwargs):
    """A ``transformers.CompileConfig`` that compiles ``generate``'s decode steps with the qfuse passes.

        out = model.generate(ids, cache_implementation="static", compile_config=qfuse.compile_config())

    transformers compiles only with a static cache; it also does so on the CPU here (its
    default compiles on CUDA only). Arguments as :func:`compile`; ``mode`` (transformers'
    default: "reduce-overhead") is folded into the options, and none is set by default.
    """
    from transformers import CompileConfig

    kwargs = _compile_kwargs(passes, pass_config, {"fullgraph": fullgraph, "dynamic": dynamic, **torch_compile_kwargs})
    config = CompileConfig(
        fullgraph=kwargs.pop("fullgraph"),
        dynamic=kwargs.pop("dynamic"),
        backend=kwargs.pop("backend", "inductor"),
        mode=kwargs.pop("mode", None),
        options=kwargs.pop("options", None),
    )
    if kwargs:
        raise TypeError(f"qfuse.compile_config: transformers' CompileConfig takes no {', '.join(sorted(kwargs))}")
    config._compile_all_devices = True
    return config


def _generate_compiled(generate, config):
    """``generate`` with a static cache and ``config`` unless the call names its own (as an argument
    or in its ``generation_config``)."""

    signature = inspect.signature(generate)

    @functools.wraps(generate)
    def generate_with_compiled_steps(*args, **kwargs):
        try:  # generation_config may come positionally (generate(inputs, generation_config, ...))
            generation_config = signature.bind_partial(*args, **kwargs).arguments.get("generation_config")
        except TypeError:
            generation_config = kwargs.get("generation_config")
        if kwargs.get("cache_implementation") is None and getattr(generation_config, "cache_implementation", None) is None:
            if kwargs.get("past_key_values") is None and kwargs.get("cache") is None:  # transformers 5 names it cache
                kwargs["cache_implementation"] = "static"
        if getattr(generation_config, "compile_config", None) is None:
            kwargs.setdefault("compile_config", config)
        return generate(*args, **kwargs)

    return generate_with_compiled_steps

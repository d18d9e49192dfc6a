"""The kernel-family registries (ops/kernel_family.py): the walk, refusals with reasons, opt-in
gating, the one config spelling, and the structure rules (each family declared once, no private
name imported across ops modules)."""

import ast
from pathlib import Path

import pytest
import torch

from qfuse.ops.int8 import dispatch as int8_dispatch
from qfuse.ops.kernel_family import KernelFamily, Problem, Registry
from qfuse.ops.wna16 import dispatch as wna16_dispatch

OPS = Path(__file__).resolve().parents[2] / "ops"


def _family(name, ok=True, configs=({"A": 1},), default=True, opt_in=lambda c: ""):
    return KernelFamily(
        name,
        "test",
        lambda p: (ok, "" if ok else f"{name} cannot"),
        lambda p, ex: [dict(c) for c in configs],
        lambda cfg, *a: (name, cfg),
        default=default,
        why_opt_in="" if default else f"{name} is opt-in",
        opt_in=opt_in,
    )


def test_walk_order_refusals_and_heuristic():
    reg = Registry(
        "op",
        [_family("a", configs=({"A": 1}, {"A": 2})), _family("b", ok=False), _family("c", configs=({"C": 1},))],
        heuristic=lambda p, cands: sorted(cands, key=lambda c: c["kernel"] != "c"),
    )
    p = Problem(1, 8, 8)
    assert reg.candidates(p) == [{"kernel": "c", "C": 1}, {"kernel": "a", "A": 1}, {"kernel": "a", "A": 2}]
    verdicts = {v.family: v for v in reg.explain(p)}
    assert not verdicts["b"].supported and verdicts["b"].reason == "b cannot" and verdicts["b"].configs == 0
    assert verdicts["a"].supported and verdicts["a"].configs == verdicts["a"].offered == 2
    assert reg.run({"kernel": "a", "A": 2}) == ("a", {"kernel": "a", "A": 2})
    with pytest.raises(ValueError, match="unknown kernel family 'z'"):
        reg.run({"kernel": "z"})
    with pytest.raises(ValueError, match="duplicate"):
        Registry("op", [_family("a"), _family("a")])


def test_opt_in_families_and_configs_need_the_switch(monkeypatch):
    reg = Registry(
        "op", [_family("a", configs=({"A": 1}, {"A": 2}), opt_in=lambda c: "A=2 is slower" if c["A"] == 2 else ""), _family("x", default=False)]
    )
    p = Problem(1, 8, 8)
    monkeypatch.delenv("QFUSE_EXPERIMENTAL_KERNELS", raising=False)
    assert reg.offered(p) == [{"kernel": "a", "A": 1}]
    verdicts = {v.family: v for v in reg.explain(p)}
    assert (verdicts["a"].configs, verdicts["a"].offered, verdicts["a"].reason) == (2, 1, "A=2 is slower")
    assert (verdicts["x"].offered, verdicts["x"].reason) == (0, "x is opt-in")
    monkeypatch.setenv("QFUSE_EXPERIMENTAL_KERNELS", "1")
    assert len(reg.offered(p)) == 3


@pytest.mark.parametrize("registry", [wna16_dispatch.REGISTRY, int8_dispatch.REGISTRY])
def test_every_opt_in_family_says_why(registry):
    for fam in registry.families:
        assert fam.default or fam.why_opt_in, fam.name
        assert (OPS / f"{fam.module}.py").is_file(), fam.module


def test_every_candidate_names_its_family():
    for m in (1, 2, 16, 64, 256, 2048):
        for bits in (4, 8):
            for c in wna16_dispatch.candidate_configs(m, 4096, 4096, bits, 128, dtype=torch.bfloat16):
                assert c["kernel"] in {f.name for f in wna16_dispatch.FAMILIES}
        for w4, gs in ((True, 128), (True, -1), (True, 64), (False, -1)):
            for c in int8_dispatch.candidate_configs(m, 4096, 4096, gs, 132, w4=w4, gpu=True):
                assert c["kernel"] in {f.name for f in int8_dispatch.REGISTRY.families}
                assert "KERNEL" not in c


def test_int8_configs_of_the_spelling_before_kernel_still_run():
    assert int8_dispatch.normalize({"KERNEL": "gemv", "BLOCK_M": 1}) == {"kernel": "gemv", "BLOCK_M": 1}
    assert int8_dispatch.normalize({"TMA": 1, "BLOCK_M": 64}) == {"kernel": "tma", "BLOCK_M": 64}
    assert int8_dispatch.normalize({"BLOCK_M": 16}) == {"kernel": "tile", "BLOCK_M": 16}
    assert int8_dispatch.normalize({"KERNEL": "w8", "TMA": 1}) == {"kernel": "w8", "TMA": 1}


def test_int8_refusals_name_the_reason():
    p = int8_dispatch.problem(16, 1536, 576, 64, 132, w4=True, gpu=True)
    verdicts = {v.family: v for v in int8_dispatch.REGISTRY.explain(p)}
    assert verdicts["tile"].supported and verdicts["tile"].offered > 0
    assert "M > 8" in verdicts["gemv"].reason
    assert "group" in verdicts["mma_words"].reason and not verdicts["mma_words"].supported
    cpu = int8_dispatch.problem(16, 4096, 4096, 128, 132, w4=True, gpu=False)
    assert [v.family for v in int8_dispatch.REGISTRY.explain(cpu) if v.supported] == ["tile"]


def _imports(path: Path):
    """(module, names) of each relative import, the module as a path under ops/ ("int8/common", "_autotune")."""
    here = path.parent.relative_to(OPS).parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(here[: len(here) - (node.level - 1)]) if node.level > 1 else list(here)
            yield "/".join(base + (node.module or "").split(".")).strip("/"), [a.name for a in node.names]


def test_no_private_name_is_imported_across_ops_modules():
    bad = [
        (str(p.relative_to(OPS)), mod, name)
        for p in sorted(OPS.rglob("*.py"))
        for mod, names in _imports(p)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not bad, bad


def test_int8_kernel_modules_import_only_downward():
    """The int8 families: common helpers <- kernels <- dispatch, never back up (no import circle)."""
    rank = {
        "int8/common": 0,
        "jit_utils": 0,
        "kernel_family": 0,
        "int8/tile": 1,
        "int8/tma": 2,
        "int8/gemv": 1,
        "int8/mma_words": 1,
        "int8/gemv8": 1,
        "int8/int8_weight": 3,
        "int8/dispatch": 4,
    }
    for name, r in rank.items():
        for mod, _ in _imports(OPS / f"{name}.py"):
            if mod in rank:
                assert rank[mod] < r, (name, mod)


def test_ops_layout_one_subpackage_per_op_family():
    """ops/: the op modules and shared helpers at the top, each op family's kernels in its subpackage."""
    assert {p.name for p in OPS.iterdir() if p.is_dir() and (p / "__init__.py").is_file()} == {"wna16", "int8", "activation", "moe", "attention"}
    from qfuse.ops.moe import dispatch as moe_dispatch

    for registry, pkg in ((wna16_dispatch.REGISTRY, "wna16"), (int8_dispatch.REGISTRY, "int8"), (moe_dispatch.REGISTRY, "moe")):
        assert all(f.module.startswith(pkg + "/") for f in registry.families)

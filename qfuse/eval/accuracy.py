"""The accuracy table: perplexity of a model under every scheme and calibration recipe, each
through qfuse's ops (``QuantLinear``) and through the calibration's own fake-quant simulation
(``FakeQuantLinear``) from the same run, against the float model on the same windows.

``qfuse eval smollm2 --ppl --table --out DIR`` writes ``accuracy.csv``, ``accuracy.md`` and
(with matplotlib) ``accuracy.png``.
"""

from __future__ import annotations

import copy
import csv
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..calibration.recipe import check_recipe, parse_recipe, recipe_name
from ..quantize_model import quantize_with_simulation
from ..schemes import get_scheme
from .perplexity import perplexity

# The recipes of the table: SmoothQuant serves int8 activations only (weight-only schemes refuse it).
WEIGHT_ONLY_RECIPES = ("rtn", "gptq", "awq", "awq+gptq")
INT8_ACT_RECIPES = ("rtn", "sq", "gptq", "awq", "sq+gptq", "awq+gptq", "sq+awq+gptq")
TABLE_SCHEMES = ("W8A16", "W8A8", "W8A8_STATIC", "W4A16", "W4A16_ASYM", "W4A8", "W4A8_G128")


def table_cells(schemes=TABLE_SCHEMES, recipes=None) -> list[tuple[str, str]]:
    """(scheme, recipe) pairs: the table's recipes that apply to each scheme, or, with ``recipes``
    (any recipe names: ``"gptq-mse"``, ``"GPTQ+awq"`` read as ``"awq+gptq"``; a ValueError for an
    unknown step), those of them that apply to it (SmoothQuant: int8 activations only)."""
    wanted = None if recipes is None else list(dict.fromkeys(recipe_name(parse_recipe(r)) for r in recipes))
    cells = []
    for s in schemes:
        scheme = get_scheme(s)
        if wanted is None:
            names = WEIGHT_ONLY_RECIPES if scheme.weight_only else INT8_ACT_RECIPES
        else:
            names = [r for r in wanted if _applies(r, scheme)]
        cells += [(scheme.name, r) for r in names]
    return cells


def _applies(recipe: str, scheme) -> bool:
    try:
        check_recipe(parse_recipe(recipe), scheme)
    except ValueError:
        return False
    return True


@dataclass
class Row:
    scheme: str
    recipe: str
    ppl: float  # through qfuse's ops
    ppl_fake_quant: float  # through the calibration's own simulation
    delta_pct: float  # (ppl / float ppl - 1) * 100
    calibrate_s: float
    eval_s: float


def _seconds(fn):
    t0 = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def evaluate_cell(
    base: nn.Module, scheme: str, recipe: str, windows: Tensor, calibration_data, device, batch: int, progress: bool = False
) -> tuple[float, float, float, float]:
    """(ppl through the ops, ppl of the simulation, calibration seconds, evaluation seconds) of one cell."""
    model = copy.deepcopy(base).to(device)
    steps = parse_recipe(recipe)
    data = calibration_data if (steps or get_scheme(scheme).static_act) else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the group fallback warning, once per cell
        (quantized, simulation), calib_s = _seconds(
            lambda: quantize_with_simulation(model, scheme, calibration=steps, calibration_data=data, progress=progress)
        )
    ppl, eval_s = _seconds(lambda: perplexity(quantized, windows, batch, progress=progress).ppl)
    ppl_sim = perplexity(simulation, windows, batch, progress=progress).ppl
    return ppl, ppl_sim, calib_s, eval_s


def accuracy_table(
    base: nn.Module,
    cells: list[tuple[str, str]],
    windows: Tensor,
    calibration_data,
    device,
    batch: int = 1,
    progress: bool = True,
    on_row=None,
    base_ppl: float | None = None,
) -> tuple[float, list[Row]]:
    """The float model's perplexity (measured unless ``base_ppl`` is given) and one :class:`Row`
    per cell. ``base`` stays untouched. ``on_row(base_ppl, rows)`` runs after each cell (e.g. to
    write the table so far)."""
    if base_ppl is None:
        float_model = copy.deepcopy(base).to(device)
        base_ppl = perplexity(float_model, windows, batch, progress=False).ppl
        del float_model
    rows = []
    for i, (scheme, recipe) in enumerate(cells):
        ppl, sim, calib_s, eval_s = evaluate_cell(base, scheme, recipe, windows, calibration_data, device, batch)
        row = Row(scheme, recipe_name(parse_recipe(recipe)), ppl, sim, (ppl / base_ppl - 1) * 100, calib_s, eval_s)
        rows.append(row)
        if progress:
            print(
                f"[{i + 1}/{len(cells)}] {scheme:<11} {row.recipe:<9} ppl {ppl:.4f} (fake-quant {sim:.4f}) {row.delta_pct:+.2f} % "
                f"calibrate {calib_s:.1f} s",
                flush=True,
            )
        if on_row:
            on_row(base_ppl, rows)
    return base_ppl, rows


def read_rows(path: Path) -> tuple[float, list[Row]]:
    """The float perplexity and the rows of an ``accuracy.csv`` written by :func:`write_table`."""
    with open(path, newline="") as f:
        base_ppl = float(f.readline().removeprefix("# float ppl "))
        rows = [
            Row(r["scheme"], r["recipe"], *(float(r[k]) for k in ("ppl", "ppl_fake_quant", "delta_pct", "calibrate_s", "eval_s")))
            for r in csv.DictReader(f)
        ]
    return base_ppl, rows


def write_table(out: Path, base_ppl: float, rows: list[Row], header: str) -> list[Path]:
    """``accuracy.csv``, ``accuracy.md`` and, when matplotlib is installed, ``accuracy.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "accuracy.csv", out / "accuracy.md"]
    with open(written[0], "w", newline="") as f:
        f.write(f"# float ppl {base_ppl!r}\n")
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in asdict(r).items()})
    lines = [
        header,
        "",
        f"float model: ppl {base_ppl:.4f}",
        "",
        "| scheme | recipe | ppl (qfuse ops) | ppl (fake-quant) | Δ % vs float | calibrate s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.scheme} | {r.recipe} | {r.ppl:.4f} | {r.ppl_fake_quant:.4f} | {r.delta_pct:+.2f} | {r.calibrate_s:.1f} |")
    written[1].write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    schemes = list(dict.fromkeys(r.scheme for r in rows))
    recipes = list(dict.fromkeys(r.recipe for r in rows))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(recipes)
    for j, rec in enumerate(recipes):
        xs = [i + j * width for i, s in enumerate(schemes) for r in rows if r.scheme == s and r.recipe == rec]
        ys = [r.delta_pct for s in schemes for r in rows if r.scheme == s and r.recipe == rec]
        ax.bar(xs, ys, width, label=rec)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(schemes))], schemes)
    ax.set_ylabel("perplexity increase over float (%)")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_title(header.lstrip("# "), fontsize=9)
    ax.legend(ncol=len(recipes), fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=120)
    written.append(out / "accuracy.png")
    return written

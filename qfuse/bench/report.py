"""``qfuse bench report``: the markdown tables of BENCHMARKS.md, built from benchmark CSVs; no GPU needed.

    python -m qfuse.bench.report docs/bench/current       # one table per CSV there, to stdout
    python -m qfuse.bench.report --write BENCHMARKS.md    # refill every marked table from its CSV
    python -m qfuse.bench.report --check BENCHMARKS.md    # exit 1 if a marked table differs from its CSV

A table in a markdown file sits between two markers; the path is relative to the markdown file,
and optional row filters (``COL=v1,v2``, ``COL<=v``, ``COL>=v``; numeric) follow it::

    <!-- report docs/bench/current/w8a8.csv M<=256 -->
    | ... the table ... |
    <!-- report end -->

The option ``by_case`` (``qfuse bench moe`` CSVs) gives one row per (shape, M) instead of one per
case: the bf16 MoE's us, then ``x bf16 (% of floor)`` per other case in the CSV's order.

The kind of a CSV is told by its columns: those written by ``qfuse bench gemm`` (W4A16 / W8A16),
``int8_gemm`` (W8A8, W4A8), ``norm_quant``, ``decoder``, ``act_order``, ``model``, ``eager``, ``moe`` and ``word_order``. Every ratio reads
as the other time over the op's (``x bf16`` = bf16 us / op us: above 1 the op is faster); where the
CSV has that ratio as a column (the bench computed it from unrounded times) the column is used, else
it is computed from the CSV's times. ``% of floor`` = the floor's time (bytes / the run's measured
HBM bandwidth) over the op's.
"""

from __future__ import annotations

import argparse
import ast
import csv
import re
import sys
from pathlib import Path
from typing import Callable

from qfuse.bench._floors import int8_gemm_bytes

Row = dict[str, str]
Column = tuple[str, Callable[[Row], str]]

MARKER = re.compile(r"<!-- report (\S+)((?: (?!-->)[^ \n]+)*) -->\n.*?<!-- report end -->", re.S)


def _f(row: Row, col: str) -> float | None:
    v = row.get(col, "")
    return float(v) if v not in ("", None) else None


def _us(col: str) -> Callable[[Row], str]:
    def cell(row: Row) -> str:
        v = _f(row, col)
        return "" if v is None else f"{v:.2f}".rstrip("0").rstrip(".")

    return cell


def _computed(row: Row, num: str, den: str, stored: str | None) -> float | None:
    """``num / den`` of two time columns, or the CSV's own ``stored`` ratio where it has one."""
    if stored is not None and (v := _f(row, stored)) is not None:
        return v
    a, b = _f(row, num), _f(row, den)
    return None if a is None or b is None or b == 0 else a / b


def _ratio(num: str, den: str, stored: str | None = None, digits: int = 2) -> Callable[[Row], str]:
    """How many times faster the ``den`` op is than the ``num`` one."""

    def cell(row: Row) -> str:
        v = _computed(row, num, den, stored)
        return "" if v is None else f"{v:.{digits}f}"

    return cell


def _pct(part: str, whole: str, stored: str | None = None) -> Callable[[Row], str]:
    """``part / whole`` in percent (a floor's time over the op's)."""

    def cell(row: Row) -> str:
        if stored is not None and (v := _f(row, stored)) is not None:
            return f"{v:.0f} %"
        v = _computed(row, part, whole, None)
        return "" if v is None else f"{100 * v:.0f} %"

    return cell


def _overhead(col: str, base: str, stored: str | None = None) -> Callable[[Row], str]:
    """``col / base - 1`` in percent."""

    def cell(row: Row) -> str:
        if stored is not None and (v := _f(row, stored)) is not None:
            return f"{v:+.0f} %"
        v = _computed(row, col, base, None)
        return "" if v is None else f"{100 * (v - 1):+.0f} %"

    return cell


def _text(col: str) -> Callable[[Row], str]:
    return lambda row: row.get(col, "")


def kernel_label(config: str) -> str:
    """A ``qfuse bench gemm`` config dict as a short label: ``tiled_tma 64x128x128 SK1 4w WORDS``."""
    try:
        c = ast.literal_eval(config)
    except (ValueError, SyntaxError):
        return config
    if not isinstance(c, dict):
        return config
    parts = [str(c.get("kernel", "?"))]
    if "BLOCK_M" in c and "BLOCK_K" in c:
        parts.append(f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}")
    elif "BLOCK_M" in c:
        parts.append(f"{c['BLOCK_M']}x{c['BLOCK_N']}")
    elif "BLOCK_W" in c:
        parts.append(f"{c['BLOCK_N']}x{c['BLOCK_W']}w")
    if "SPLIT_K" in c:
        parts.append(f"SK{c['SPLIT_K']}")
    if "num_warps" in c:
        parts.append(f"{c['num_warps']}w")
    parts += [k for k in ("WORDS", "TAIL_SPLIT") if c.get(k)]
    return " ".join(parts)


def _wna16(rows: list[Row]) -> list[Column]:
    cols: list[Column] = [
        ("N x K", _text("shape")),
        ("M", _text("M")),
        ("us", _us("op_us")),
        ("bf16 us", _us("bf16_us")),
        ("x bf16", _ratio("bf16_us", "op_us", "speedup_vs_bf16")),
    ]
    for peer in ("tinygemm", "gemlite"):
        if any(r.get(f"{peer}_us") for r in rows):
            cols += [(f"{peer} us", _us(f"{peer}_us")), (f"x {peer}", _ratio(f"{peer}_us", "op_us"))]
    return cols + [("% of floor", _pct("floor_us", "op_us", "pct_of_floor")), ("kernel", lambda r: kernel_label(r.get("config", "")))]


def _w8a8(rows: list[Row]) -> list[Column]:
    return [
        ("N x K", _text("shape")),
        ("M", _text("M")),
        ("us", _us("w8a8_us")),
        ("bf16 us", _us("bf16_us")),
        ("x bf16", _ratio("bf16_us", "w8a8_us", "w8a8_x_bf16")),
        ("_int_mm+epi us", _us("int_mm_us")),
        ("x _int_mm+epi", _ratio("int_mm_us", "w8a8_us", "w8a8_x_int_mm")),
        ("% of floor", _pct("floor_w8a8_us", "w8a8_us")),
        ("config", _text("w8a8_cfg")),
    ]


def _w4a8_pc_floor(row: Row) -> Row:
    """``row`` with ``floor_w4a8_pc_us``, the per-channel op's floor. A CSV written before that column
    has only ``floor_w4a8_us``, whose bytes count group 128's int8 group scales too, which the
    per-channel op does not read: its floor is that one times the per-channel bytes over group 128's."""
    if _f(row, "floor_w4a8_pc_us") is not None or (g128 := _f(row, "floor_w4a8_us")) is None:
        return row
    n, k = (int(v) for v in row["shape"].lower().split("x"))
    m = int(row["M"])
    return {**row, "floor_w4a8_pc_us": str(g128 * int8_gemm_bytes(m, n, k, 4) / int8_gemm_bytes(m, n, k, 4, 128))}


def _w4a8(rows: list[Row]) -> list[Column]:
    pc_floor = _pct("floor_w4a8_pc_us", "w4a8_pc_us")
    return [
        ("N x K", _text("shape")),
        ("M", _text("M")),
        ("pc us", _us("w4a8_pc_us")),
        ("g128 us", _us("w4a8_g128_us")),
        ("bf16 us", _us("bf16_us")),
        ("pc x bf16", _ratio("bf16_us", "w4a8_pc_us", "w4a8_pc_x_bf16")),
        ("g128 x bf16", _ratio("bf16_us", "w4a8_g128_us", "w4a8_g128_x_bf16")),
        ("g128 / pc", _ratio("w4a8_pc_us", "w4a8_g128_us", "g128_over_pc")),
        ("pc x _int_mm+epi", _ratio("int_mm_us", "w4a8_pc_us")),
        ("pc % of floor", lambda r: pc_floor(_w4a8_pc_floor(r))),
        ("pc config", _text("w4a8_pc_cfg")),
        ("g128 config", _text("w4a8_g128_cfg")),
    ]


def _norm_quant(rows: list[Row]) -> list[Column]:
    return [
        ("op", _text("op")),
        ("H", _text("H")),
        ("M", _text("M")),
        ("fused us", _us("fused_us")),
        ("unfused us", _us("unfused_us")),
        ("Inductor us", _us("inductor_us")),
        ("x unfused", _ratio("unfused_us", "fused_us", "fused_vs_unfused")),
        ("x Inductor", _ratio("inductor_us", "fused_us", "fused_vs_inductor")),
        ("% of floor", _pct("floor_us", "fused_us")),
    ]


def _decoder(rows: list[Row]) -> list[Column]:
    return [
        ("scheme", _text("scheme")),
        ("shape", _text("shape")),
        ("M", _text("M")),
        ("passes on us", _us("passes_us")),
        ("passes off us", _us("no_passes_us")),
        ("x (passes)", _ratio("no_passes_us", "passes_us", "speedup", 3)),
        ("weight floor us", _us("floor_us")),
        ("% of floor", _pct("floor_us", "passes_us")),
        ("compile s on / off", lambda r: f"{_us('compile_s_passes')(r)} / {_us('compile_s_no_passes')(r)}"),
    ]


def _act_order(rows: list[Row]) -> list[Column]:
    return [
        ("N x K", _text("shape")),
        ("M", _text("M")),
        ("plain us", _us("plain_us")),
        ("act-order us", _us("act_order_us")),
        ("act-order compiled us", _us("compiled_act_order_us")),
        ("gather alone us", _us("gather_us")),
        (
            "overhead / compiled",
            lambda r: (
                f"{_overhead('act_order_us', 'plain_us', 'overhead_pct')(r)} / {_overhead('compiled_act_order_us', 'plain_us', 'compiled_overhead_pct')(r)}"
            ),
        ),
    ]


def _model(rows: list[Row]) -> list[Column]:
    return [
        ("case", _text("case")),
        ("mode", _text("mode")),
        ("batch", _text("batch")),
        ("tokens", _text("tokens")),
        ("ms", _us("ms")),
        ("tokens/s", _text("tokens_per_s")),
        ("x bf16", _text("x_bf16")),
        ("weights GB", _text("weight_gb")),
        ("peak GB", _text("peak_gb")),
        *([("build peak GB", _text("build_peak_gb"))] if any(r.get("build_peak_gb") for r in rows) else []),
        ("compile s", _text("compile_s")),
    ]


def _moe(rows: list[Row]) -> list[Column]:
    return [
        ("shape", _text("shape")),
        ("M", _text("M")),
        ("case", _text("case")),
        ("us", _us("us")),
        ("x bf16", _ratio("bf16_us", "us", "x_bf16")),
        ("x loop", _ratio("loop_us", "us", "x_loop")),
        ("% of floor", _pct("floor_us", "us", "pct_of_floor")),
        ("experts touched", _text("experts_touched")),
        ("kernel", lambda r: kernel_label(r.get("config", ""))),
    ]


def _eager(rows: list[Row]) -> list[Column]:
    return [
        ("call", _text("what")),
        ("M", _text("m")),
        ("N x K", lambda r: f"{r['n']} x {r['k']}" if r.get("k") not in (None, "", "0") else r["n"]),
        ("host us", _us("host_us")),
        ("wall us", _us("wall_us")),
        ("GPU us", _us("gpu_us")),
        ("tree", _text("tree")),
    ]


def _word_order(rows: list[Row]) -> list[Column]:
    return [
        ("what", _text("kind")),
        ("M", _text("M")),
        ("N x K", lambda r: f"{r['N']} x {r['K']}" if r.get("N") else f"K {r['K']}"),
        ("config", _text("config")),
        ("us", _us("us")),
        ("us, ATen's order", _us("us_aten")),
        ("x ATen's order", _ratio("us_aten", "us")),
    ]


# (columns that tell the kind, its table); the first match wins
KINDS: list[tuple[set[str], Callable[[list[Row]], list[Column]]]] = [
    ({"op_us", "bf16_us", "bits"}, _wna16),
    ({"w8a8_us", "int_mm_us"}, _w8a8),
    ({"w4a8_pc_us", "w4a8_g128_us"}, _w4a8),
    ({"fused_us", "unfused_us", "inductor_us"}, _norm_quant),
    ({"passes_us", "no_passes_us"}, _decoder),
    ({"plain_us", "compiled_act_order_us"}, _act_order),
    ({"tokens_per_s", "x_bf16", "mode"}, _model),
    ({"host_us", "wall_us", "gpu_us"}, _eager),
    ({"experts_touched", "loop_us", "floor_us"}, _moe),
    ({"us_aten", "config", "kind"}, _word_order),
]


def _keep(row: Row, filters: list[str]) -> bool:
    for f in filters:
        m = re.fullmatch(r"(\w+)(<=|>=|=)([\d.,]+)", f)
        if not m:
            raise SystemExit(f"qfuse bench report: bad row filter {f!r} (want COL=v1,v2, COL<=v or COL>=v)")
        col, op, val = m.groups()
        v = _f(row, col)
        if v is None:
            return False
        if op == "=" and v not in {float(x) for x in val.split(",")}:
            return False
        if (op == "<=" and v > float(val)) or (op == ">=" and v < float(val)):
            return False
    return True


def _moe_by_case(rows: list[Row]) -> list[str]:
    """One line per (shape, M): experts touched, the bf16 MoE's us, each other case's x bf16 (% of floor)."""
    cases = list(dict.fromkeys(r["case"] for r in rows if r["case"] != "bf16"))
    points = {}
    for r in rows:
        points.setdefault((r["shape"], r["M"]), {})[r["case"]] = r
    lines = ["| shape | M | experts touched | bf16 us | " + " | ".join(f"{c} x bf16 (% floor)" for c in cases) + " |"]
    lines.append("|" + "---|" * (4 + len(cases)))
    for (shape, m), by in points.items():
        any_row = next(iter(by.values()))
        cells = [shape, m, any_row.get("experts_touched", ""), _us("us")(by["bf16"]) if "bf16" in by else ""]
        for c in cases:
            r = by.get(c)
            x = _ratio("bf16_us", "us", "x_bf16")(r) if r else ""
            cells.append(f"{x} ({_pct('floor_us', 'us', 'pct_of_floor')(r)})" if r and x else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def table(path: Path, filters: list[str] | None = None) -> str:
    """The markdown table of one CSV (its rows in file order, filtered; ``by_case``: see the module)."""
    filters = list(filters or [])
    by_case = "by_case" in filters
    filters = [f for f in filters if f != "by_case"]
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields = set(reader.fieldnames or ())
        rows = [r for r in reader if _keep(r, filters)]
    if by_case:
        if not {"experts_touched", "loop_us", "floor_us", "case"} <= fields:
            raise SystemExit(f"qfuse bench report: {path}: by_case needs a qfuse bench moe CSV")
        return "\n".join(_moe_by_case(rows))
    for needed, columns in KINDS:
        if needed <= fields:
            cols = columns(rows)
            break
    else:
        raise SystemExit(f"qfuse bench report: {path}: not a CSV of a known benchmark (columns {sorted(fields)})")
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r) for _, cell in cols) + " |" for r in rows]
    return "\n".join(lines)


def fill(markdown: str, base: Path) -> str:
    """``markdown`` with every marked table rebuilt from its CSV (paths relative to ``base``). A line
    that starts a marker but is no start of a whole marked table (a malformed marker line, or no end
    marker before the next table's start) stops it: that table would be neither refilled nor checked."""
    whole = {m.start() for m in MARKER.finditer(markdown)}
    for s in re.finditer(r"^<!-- report (?!end -->)", markdown, re.M):
        if s.start() not in whole:
            line = markdown.count("\n", 0, s.start()) + 1
            text = markdown[s.start() :].split("\n", 1)[0]
            raise SystemExit(
                f"qfuse bench report: line {line}: {text!r} starts no marked table (want '<!-- report PATH [FILTER ...] -->', "
                "one space apart, and '<!-- report end -->' after the table)"
            )

    def repl(m: re.Match) -> str:
        path, filters = m.group(1), m.group(2).split()
        start = m.group(0).split("\n", 1)[0]
        return f"{start}\n{table(base / path, filters)}\n\n<!-- report end -->"

    return MARKER.sub(repl, markdown)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qfuse bench report", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", type=Path, help="CSV files or folders of them: print one table each")
    p.add_argument("--write", type=Path, metavar="MD", help="refill the marked tables of this markdown file")
    p.add_argument("--check", type=Path, metavar="MD", help="exit 1 if a marked table of this markdown file differs from its CSV")
    args = p.parse_args(argv)
    if not (args.paths or args.write or args.check):
        p.error("give CSV files or folders, --write MD or --check MD")
    missing = [str(path) for path in [*args.paths, args.write, args.check] if path is not None and not path.exists()]
    if missing:
        p.error(f"no such file or folder: {', '.join(missing)}")
    for csv_path in [q for path in args.paths for q in (sorted(path.glob("*.csv")) if path.is_dir() else [path])]:
        print(f"### {csv_path.name}\n\n{table(csv_path)}\n")
    for md, write in ((args.write, True), (args.check, False)):
        if md is None:
            continue
        old = md.read_text()
        new = fill(old, md.parent)
        if write:
            md.write_text(new)
            print(f"{md}: {len(MARKER.findall(new))} tables", file=sys.stderr)
        elif new != old:
            print(f"{md}: a marked table differs from its CSV; run qfuse bench report --write {md}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

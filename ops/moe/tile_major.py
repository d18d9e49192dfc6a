"""Tile-major expert codes: the packed codes of each weight matrix reordered so that a kernel's
step over 64 rows reads one contiguous 4 KB run.

The natural packing (ops/int4_packing.py) stores a matrix row by row: a kernel that walks K
in steps of 128 4-bit codes over a tile of rows reads 64 bytes of each row per step, rows
``K / 2`` bytes apart (Mixtral fc1: 2 KB), so every step touches as many DRAM pages as the
tile has rows. Tile-major stores the same bytes as tiles of 64 rows x 64 bytes (128 4-bit or
64 8-bit codes), the tiles of a 64-row band one after another along K::

    codes [R, B] (B bytes per row) -> view [R / 64, 64, B / 64, 64] -> transpose(1, 2)

so byte ``(r, b)`` sits at ``(r // 64) * 64 B + (b // 64) * 4096 + (r % 64) * 64 + b % 64``
(ops/wna16/common.py ``tile_major_rows`` / ``tile_major_cols`` in the kernels). The shape and
dtype stay those of the natural layout; only the order changes. Needs R % 64 == 0 and B % 64 == 0.

Measured on an H100 (torch 2.11, triton 3.6; Mixtral-8x7B W4A16 g128, bench moe's seed-0 routing,
CUDA-graph medians; docs/bench/current/h100/moe_tile_major.log): ``grouped_words`` 389.9 -> 304.9
us at M = 16 and 340.2 -> 280.2 us at M = 8 (its 128-row tile), while the word GEMV
(``gemv_words``), whose tiles read 512 contiguous bytes per row in the natural layout, went 73.4 ->
75.6 us at M = 1 and 334.3 -> 355.2 us at M = 8. A plain read of the bytes: 2.94 TB/s natural
(64 bytes of each of 128 rows per step), 3.05 TB/s tile-major. The whole op, each at its pick
(docs/bench/current/h100/moe_tile_major.csv against moe_natural_codes.csv): Mixtral 295.2 against
390.5 us at M = 16, 404.8 / 434.0 at M = 64, 189.8 / 180.6 at M = 4, within 1 % at M = 1, 256-4096;
the E64 top-8 shape 118.4 / 145.3 at M = 16, 71.2 / 68.6 at M = 4. ``QuantExperts`` stores W4A16
experts this way (qfuse/moe.py ``holds_tile_major``); W8A16 ones took 0-3 % longer tile-major and
stay natural unless asked.
"""

from __future__ import annotations

from torch import Tensor

ROWS = 64  # rows of a tile
BYTES = 64  # bytes of each row in a tile


def tile_major_supported(rows: int, row_bytes: int) -> bool:
    return rows % ROWS == 0 and row_bytes % BYTES == 0


def _check(codes: Tensor, fn: str) -> tuple[int, int, int]:
    *_, r, cols = codes.shape
    unit = BYTES // codes.element_size()
    if not tile_major_supported(r, cols * codes.element_size()):
        raise ValueError(f"{fn}: needs rows % {ROWS} == 0 and bytes per row % {BYTES} == 0; got {tuple(codes.shape)} {codes.dtype}")
    return r, cols, unit


def to_tile_major(codes: Tensor) -> Tensor:
    """Packed codes ``[..., R, B]`` (any integer dtype) in the natural layout -> tile-major, same shape."""
    r, cols, unit = _check(codes, "to_tile_major")
    lead = codes.shape[:-2]
    return codes.reshape(*lead, r // ROWS, ROWS, cols // unit, unit).transpose(-3, -2).contiguous().reshape(codes.shape)


def from_tile_major(codes: Tensor) -> Tensor:
    """The inverse of :func:`to_tile_major`."""
    r, cols, unit = _check(codes, "from_tile_major")
    lead = codes.shape[:-2]
    return codes.reshape(*lead, r // ROWS, cols // unit, ROWS, unit).transpose(-3, -2).contiguous().reshape(codes.shape)


def with_codes(weights: tuple, layout) -> tuple:
    """``fused_moe``'s eight expert weight arguments (``w13``, its scale, zeros and group scale, then
    ``w2``'s) with ``w13``'s and ``w2``'s codes passed through ``layout`` (:func:`to_tile_major` or
    :func:`from_tile_major`)."""
    return (layout(weights[0]), *weights[1:4], layout(weights[4]), *weights[5:])

"""The accuracy table's cells (qfuse/eval/accuracy.py)."""

import pytest

from qfuse.eval.accuracy import INT8_ACT_RECIPES, WEIGHT_ONLY_RECIPES, table_cells


def test_table_cells_default_to_the_table_recipes():
    assert table_cells(["W4A16", "W8A8"]) == [("W4A16", r) for r in WEIGHT_ONLY_RECIPES] + [("W8A8", r) for r in INT8_ACT_RECIPES]


def test_table_cells_take_any_recipe_name_that_applies():
    """Recipes as quantize --calibration reads them: any order and case, gptq-mse (not a table
    column); SmoothQuant only for int8 activations; duplicates once."""
    assert table_cells(["W8A16", "W8A8"], ["GPTQ+awq", "gptq-mse", "sq", "awq+gptq"]) == [
        ("W8A16", "awq+gptq"),
        ("W8A16", "gptq-mse"),
        ("W8A8", "awq+gptq"),
        ("W8A8", "gptq-mse"),
        ("W8A8", "sq"),
    ]
    assert table_cells(["W4A16"], ["sq"]) == []


def test_table_cells_refuse_an_unknown_step():
    with pytest.raises(ValueError, match="unknown calibration step 'bogus'"):
        table_cells(["W8A16"], ["gptq", "bogus"])

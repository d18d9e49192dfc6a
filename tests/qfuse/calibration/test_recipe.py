"""Calibration recipes: names and step objects in, steps in running order out."""

import pytest

from qfuse.calibration import GPTQ, SmoothQuant, parse_recipe, recipe_name
from qfuse.calibration.recipe import check_recipe
from qfuse.schemes import SCHEMES


@pytest.mark.parametrize(
    ("recipe", "name"),
    [
        (None, "rtn"),
        ("rtn", "rtn"),
        ("gptq", "gptq"),
        ("GPTQ + SQ", "sq+gptq"),
        ("gptq+awq", "awq+gptq"),
        ("smoothquant+gptq", "sq+gptq"),
        ("rtn+awq", "awq"),
    ],
)
def test_names_parse_into_steps_in_running_order(recipe, name):
    """Names are case- and space-insensitive, "rtn" adds nothing, and steps always run SmoothQuant, AWQ, GPTQ."""
    assert recipe_name(parse_recipe(recipe)) == name


def test_step_objects_keep_their_options():
    """A step object, alone or in a list, is used as given (its options kept), reordered like names."""
    gptq = GPTQ(act_order="group", damp=0.05)
    assert parse_recipe(gptq) == [gptq]
    steps = parse_recipe([gptq, "sq"])
    assert steps[0] == SmoothQuant() and steps[1] is gptq


@pytest.mark.parametrize(
    ("recipe", "error", "match"),
    [
        ("foo", ValueError, "unknown calibration step 'foo'"),
        ("gptq+GPTQ", ValueError, "each step may appear once"),
        (["sq", SmoothQuant(alpha=0.8)], ValueError, "each step may appear once"),
        ([3], TypeError, "calibration steps are"),
        (SmoothQuant, TypeError, r"got the class SmoothQuant; pass a step, SmoothQuant\(\)"),
        (["sq", GPTQ], TypeError, "got the class GPTQ"),
    ],
)
def test_bad_recipes(recipe, error, match):
    """Unknown names, repeated steps and objects that are no step are refused."""
    with pytest.raises(error, match=match):
        parse_recipe(recipe)


def test_smoothquant_only_for_int8_activations():
    """check_recipe refuses SmoothQuant for a weight-only scheme and lets AWQ / GPTQ through."""
    check_recipe(parse_recipe("sq+gptq"), SCHEMES["W8A8"])
    check_recipe(parse_recipe("awq+gptq"), SCHEMES["W4A16"])
    with pytest.raises(ValueError, match="SmoothQuant helps int8 activation"):
        check_recipe(parse_recipe("sq"), SCHEMES["W4A16"])


def test_gptq_mse_is_a_named_step():
    """'gptq-mse' is GPTQ(mse=True) and keeps its name through recipe_name."""
    steps = parse_recipe("sq+gptq-mse")
    assert steps[1] == GPTQ(mse=True)
    assert recipe_name(steps) == "sq+gptq-mse"

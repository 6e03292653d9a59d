"""The shared comma-separated integer option."""

from __future__ import annotations

import pytest
import typer

from headlab.cli.options import int_list


def test_parses_in_order():
    assert int_list("0, 3,5", option="--layers") == [0, 3, 5]
    assert int_list("1,16", option="--heads", minimum=1) == [1, 16]


@pytest.mark.parametrize(("text", "minimum", "fragment"), [
    ("a,b", 0, "'a' is not an int ≥ 0 (got --layers='a,b'"),
    ("-1", 0, "'-1' is not an int ≥ 0"),
    ("0", 1, "'0' is not a positive int"),
    ("2.5", 0, "'2.5' is not an int ≥ 0"),
    ("", 0, "'' is not an int ≥ 0"),
    ("3,3", 0, "3 is listed more than once"),
])
def test_bad_values_name_the_item_and_the_option(text, minimum, fragment):
    with pytest.raises(typer.BadParameter) as err:
        int_list(text, option="--layers", minimum=minimum)
    assert fragment in str(err.value)

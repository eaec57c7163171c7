"""The checks of a single value (core/checks.py), one wording for the settings, the declared options and the
delivery profiles."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ditto_fast.core.checks import check_choice, check_flag, check_number, check_path, check_text
from ditto_fast.core.errors import UsageError


@pytest.mark.parametrize("value, integer, said", [
    (True, True, "x must be an integer in 1..10 or auto, got True"),
    (False, False, "x must be a number in 1..10 or auto, got False"),
    (math.nan, False, "x must be a number in 1..10 or auto, got nan"),
    (math.inf, False, "x must be in 1..10 or auto, got inf"),
    (2.5, True, "x must be an integer in 1..10 or auto, got 2.5"),
    (10**400, True, "x must be in 1..10 or auto, got 1000"),
    ("5", True, "x must be an integer in 1..10 or auto, got '5'"),
    ("manual", True, "x must be an integer in 1..10 or auto, got 'manual'"),
])
def test_a_number_is_a_number_in_its_range(value, integer, said):
    with pytest.raises(UsageError) as e:
        check_number(value, 1, 10, "x", integer=integer, words=("auto",))
    assert str(e.value).startswith(said), e.value


def test_what_passes_comes_back_in_its_kind():
    assert check_number(2.0, 1, 10, "x", integer=True) == 2 and isinstance(check_number(2.0, 1, 10, "x",
                                                                                        integer=True), int)
    assert check_number(3, 1, 10, "x", integer=False) == 3.0 and check_number("auto", 1, 9, "", integer=True,
                                                                               words=("auto",)) == "auto"
    assert check_number(-23, -40, -5, "k", integer=False, unit="LUFS") == -23.0
    with pytest.raises(UsageError, match="^k must be in -40..-5 LUFS, got -3$"):
        check_number(-3, -40, -5, "k", integer=False, unit="LUFS")
    assert check_choice("b", ("a", "b"), "c") == "b" and check_flag(False, "f") is False
    assert check_text("", "t", empty=True) == "" and check_path("a", "p") == Path("a")


@pytest.mark.parametrize("check, value, said", [
    (lambda v: check_choice(v, (1, 2), "c"), True, "c must be one of 1, 2, got True"),      # True == 1 in Python
    (lambda v: check_flag(v, "f"), 1, "f must be true or false, got 1"),
    (lambda v: check_text(v, "t"), " ", "t must be a non-empty string, got ' '"),
    (lambda v: check_path(v, "p"), "", "p must be a file path, got ''"),
    (lambda v: check_choice(v, ("a",), ""), "b", "must be one of a, got 'b'"),               # click names it
])
def test_each_check_names_where_and_what_is_allowed(check, value, said):
    with pytest.raises(UsageError, match=f"^{said}$"):
        check(value)

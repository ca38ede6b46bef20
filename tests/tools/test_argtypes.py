"""argparse pieces of the command line and the examples (nkilib_msda/tools/argtypes.py)."""

from __future__ import annotations

import argparse
import math

import pytest

from nkilib_msda.tools.argtypes import OneLineErrorParser, int_at_least, positive_float


@pytest.mark.parametrize("minimum,text,want", [(0, "0", 0), (0, "17", 17), (1, "1", 1), (3, "3", 3)])
def test_int_at_least_accepts_integers_from_the_minimum(minimum, text, want):
    assert int_at_least(minimum)(text) == want


@pytest.mark.parametrize("minimum,text,message", [
    (0, "-1", "expected a non-negative integer, got -1"),
    (0, "x", "expected a non-negative integer, got 'x'"),
    (1, "0", "expected a positive integer, got 0"),
    (1, "2.5", "expected a positive integer, got '2.5'"),
    (3, "2", "expected an integer >= 3, got 2"),
])
def test_int_at_least_names_what_it_expected(minimum, text, message):
    with pytest.raises(argparse.ArgumentTypeError) as info:
        int_at_least(minimum)(text)
    assert str(info.value) == message


@pytest.mark.parametrize("text", ["0", "-1.5", "inf", "nan", "two"])
def test_positive_float_rejects_what_is_not_a_finite_positive_number(text):
    with pytest.raises(argparse.ArgumentTypeError, match="^expected a positive number, got "):
        positive_float(text)


def test_positive_float_accepts_a_positive_number():
    assert math.isclose(positive_float("0.25"), 0.25)


def test_parser_error_is_one_line_with_exit_code_2(capsys):
    parser = OneLineErrorParser(prog="tool")
    parser.add_argument("--steps", type=int_at_least(1))
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--steps", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == ("tool: error: argument --steps: expected a positive integer, got 0 "
                   "(see `tool --help`)\n")

"""argparse pieces shared by the ``nkilib-msda`` command line and the example scripts: a
parser whose errors are one line, and number types whose errors name what was expected.

A type's error becomes argparse's ``argument --NAME: expected ..., got ...``; with
:class:`OneLineErrorParser` that is the whole of stderr, exit code 2, no usage dump.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, NoReturn

__all__ = ["OneLineErrorParser", "int_at_least", "positive_float"]


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse with a one-line error (``prog: error: ... (see `prog --help`)``) and exit
    code 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``minimum`` ("a positive integer" for 1, "a non-negative
    integer" for 0, else "an integer >= minimum" in the error)."""
    expected = {0: "a non-negative integer", 1: "a positive integer"}.get(
        minimum, f"an integer >= {minimum}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value

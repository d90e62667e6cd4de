"""The benchmark scripts' flags, as hasfl-ray's own are: a bad value is one sentence on stderr naming the flag, the
value and what was expected, exit status 2, before anything runs, is measured or a scratch folder is made (before,
``soak.py --every 0`` ended in a ZeroDivisionError after its first round, ``--rounds 20`` in an IndexError after the
whole run, ``--local-steps 0`` was dropped silently; ``bench_short_rounds.py --settings x`` in a KeyError).

    parser = Parser(description=...)
    parser.add_argument("--rounds", type=integer(1), default=500)
    parser.add_argument("--sizes", type=integers(1), default="10000,100000")
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Callable, List, NoReturn, Sequence


def refuse(message: str) -> NoReturn:
    """``Error: MESSAGE`` on stderr and exit status 2."""
    print(f"Error: {message}", file=sys.stderr)
    raise SystemExit(2)


class Parser(argparse.ArgumentParser):
    """argparse with its errors (a value a ``type`` refuses, a bad choice, an unknown flag) as one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        message = re.sub(r"^argument ([^:]+?)(/[^:]+)?: (?=is )", r"\1 ", message)  # "--every is '0'; expected ..."
        refuse(f"{message} (see {self.prog} --help)")


def _number(text: str, kind: type, expected: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"is {text!r}; expected {expected}") from None
    return value


def integer(low: int) -> Callable[[str], int]:
    """A flag's type: an integer of at least ``low``."""
    expected = f"an integer of at least {low}"

    def parse(text: str) -> int:
        value = _number(text, int, expected)
        if value < low:
            raise argparse.ArgumentTypeError(f"is {text!r}; expected {expected}")
        return value

    parse.__name__ = expected
    return parse


def fraction(text: str) -> float:
    """A flag's type: a finite number >= 0."""
    value = _number(text, float, "a number >= 0")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"is {text!r}; expected a number >= 0")
    return value


def integers(low: int) -> Callable[[str], List[int]]:
    """A flag's type: a comma list of integers of at least ``low`` (``10000,100000``)."""
    expected = f"a comma list of integers of at least {low}, e.g. 100,1000"

    def parse(text: str) -> List[int]:
        try:
            values = [int(part) for part in text.split(",")]
        except ValueError:
            values = []
        if not values or any(value < low for value in values):
            raise argparse.ArgumentTypeError(f"is {text!r}; expected {expected}")
        return values

    return parse


def names(allowed: Sequence[str], empty: bool = False) -> Callable[[str], List[str]]:
    """A flag's type: a comma list of some of ``allowed`` (``empty``: the empty string, none, allowed too)."""
    expected = f"a comma list of {', '.join(allowed)}"

    def parse(text: str) -> List[str]:
        values = [part for part in text.split(",") if part or not empty]
        if (not values and not empty) or any(value not in allowed for value in values):
            raise argparse.ArgumentTypeError(f"is {text!r}; expected {expected}")
        return values

    return parse

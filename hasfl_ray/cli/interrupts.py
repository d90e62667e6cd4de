"""A Ctrl-C (or SIGTERM) outside a run's own handlers, in one line: while `hasfl-ray` starts
(:mod:`hasfl_ray.cli.entry`) or while a command loads what it runs (the click group, :mod:`hasfl_ray.cli.main`).
Standard library only: the entry point imports it before anything heavy."""

from __future__ import annotations

import signal
import sys
from typing import List, NoReturn

#: The signals received outside a run's own handlers (SIGTERM is turned into KeyboardInterrupt, as SIGINT is).
received: List[int] = []


def terminated(number: int, frame) -> None:
    """SIGTERM's handler while `hasfl-ray` starts: a KeyboardInterrupt, as SIGINT's, remembering which it was."""
    received.append(number)
    raise KeyboardInterrupt


def interrupted(where: str) -> NoReturn:
    """One line saying the command was interrupted ``where``, and exit with 128 + the signal's number."""
    number = received[-1] if received else signal.SIGINT
    sys.stderr.write(f"Interrupted by {signal.Signals(number).name} {where}.\n")
    sys.exit(128 + number)

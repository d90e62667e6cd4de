"""A Ctrl-C (or SIGTERM) outside a run's own handlers, in one line: while `hasfl-ray` starts
(:mod:`hasfl_ray.cli.entry`), while a command loads what it runs, or once a run stopped at once by a second signal.
Standard library only: the entry point imports it before anything heavy."""

from __future__ import annotations

import os
import signal
import sys

from hasfl_ray.interrupts import handle, signal_number

TYPE_CHECKING = False  # (typing itself not imported: this module is loaded before the console script's handlers)
if TYPE_CHECKING:
    from typing import NoReturn


def interrupted(where: str, error: BaseException | None = None) -> NoReturn:
    """One line saying the command was interrupted ``where`` by the signal behind ``error`` (a KeyboardInterrupt:
    :func:`hasfl_ray.interrupts.signal_number`), and exit with 128 + the signal's number. Under the console
    script's handlers (which it puts back as it returns), further signals are ignored from here on: the line is the
    last word."""
    number = signal_number(error)
    for other in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(other) is handle:
            signal.signal(other, signal.SIG_IGN)
    sys.stderr.write(f"Interrupted by {signal.Signals(number).name} {where}.\n")
    sys.exit(128 + number)


def ended_at_once(number: int) -> NoReturn:
    """A second signal while the first waits for an import to end (an import that does not end: a plug-in's?):
    the process ends now, in one line, with 128 + the signal's number, nothing unwound through the import (called
    in the signal handler: raw writes only; what the command printed is flushed where that can be done)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 (a write the signal interrupted: its lines are the cost)
            pass
    os.write(2, f"Interrupted by {signal.Signals(number).name} again while an import was still running; stopped at "
                "once.\n".encode())
    os._exit(128 + number)

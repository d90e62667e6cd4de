"""The `hasfl-ray` console script's entry point, light on purpose: before it imports anything heavy it hands SIGINT
and SIGTERM to :func:`hasfl_ray.interrupts.handle`, which never raises inside an import (a signal that lands in one
is raised when the import has ended), so an interrupt while the CLI, torch, the data or Ray are still loading ends
with one line and exit status 130 (143 for SIGTERM), never a traceback, a half-imported module or a signal
swallowed by native code (a second signal while the first waits for an import to end ends the process at once, in
one line: :func:`hasfl_ray.cli.interrupts.ended_at_once`). A run installs its own handlers once it starts (the
first signal checkpoints and stops it: hasfl_ray/engine/signals.py). The click group itself is
:data:`hasfl_ray.cli.main.main`."""

from __future__ import annotations

import signal

from hasfl_ray import allocator, interrupts, threads
from hasfl_ray.cli.interrupts import ended_at_once, interrupted

#: The signals the console script answers in one line.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def main(argv=None) -> None:
    """Run `hasfl-ray` (``argv``: the arguments, default sys.argv[1:])."""
    threads.passive_waits()  # before torch loads OpenMP: waiting threads sleep (hasfl_ray/threads.py)
    allocator.huge_pages()  # before torch's first allocation: large tensors in huge pages (hasfl_ray/allocator.py)
    interrupts.watch(statements=True)
    insisted = interrupts.when_insisted(ended_at_once)
    # (a signal the process was started with ignored stays ignored: a background job of a shell without job control)
    previous = {number: signal.signal(number, interrupts.handle) for number in SIGNALS
                if signal.getsignal(number) != signal.SIG_IGN}
    try:
        try:
            from hasfl_ray.cli.main import main as group

            interrupts.settle()  # a signal that landed in those imports: here, before any command runs
        except KeyboardInterrupt as error:
            interrupted("while hasfl-ray was starting; nothing was run", error)
        try:
            group.main(args=list(argv) if argv is not None else None, prog_name="hasfl-ray")
        finally:
            interrupts.settle()  # one that landed in an import as the command ended
    except KeyboardInterrupt as error:  # (click turns those inside a command into one line: cli/main.py)
        interrupted("before the command finished", error)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        interrupts.when_insisted(insisted)

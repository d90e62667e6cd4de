"""The `hasfl-ray` console script's entry point, light on purpose: it imports nothing heavy before it can answer a
Ctrl-C, so an interrupt while the CLI, torch or a command's subsystem are still loading ends with one line and exit
status 130 (143 for SIGTERM), never a traceback. A run installs its own handlers once it starts (the first signal
checkpoints and stops it: hasfl_ray/engine/signals.py). The click group itself is :data:`hasfl_ray.cli.main.main`."""

from __future__ import annotations

import signal
from typing import Optional, Sequence

from hasfl_ray.cli.interrupts import interrupted, terminated


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Run `hasfl-ray` (``argv``: the arguments, default sys.argv[1:])."""
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        try:
            from hasfl_ray.cli.main import main as group
        except KeyboardInterrupt:
            interrupted("while hasfl-ray was starting; nothing was run")
        group.main(args=list(argv) if argv is not None else None, prog_name="hasfl-ray")
    finally:
        signal.signal(signal.SIGTERM, previous)

"""`hasfl-ray` (the console script's own ``main``) with a stamp as each round ends, for timing rounds from outside.

``Engine.run_round`` is wrapped to note ``time.perf_counter()`` as it returns, on every backend the same point: the
round's update applied and the driver about to plan the next round (on the local backend after the round's
evaluation, on Ray before it: there it runs behind the next round's training). ``perf_counter`` is the system's
monotonic clock, so the stamps compare with the caller's. They are written as JSON (``[[round, seconds], ...]``) to
the file ``$HASFL_ROUND_STAMPS`` when the process exits. Nothing else changes: same arguments, same output.

    HASFL_ROUND_STAMPS=stamps.json python benchmarks/stamped_cli.py simulate --dataset digits --rounds 20
"""

from __future__ import annotations

import atexit
import json
import os
import time
from typing import List, Tuple

from hasfl_ray.cli.main import main
from hasfl_ray.engine.engine import Engine

STAMPS: List[Tuple[int, float]] = []
_run_round = Engine.run_round


def _stamped(self, t):
    line = _run_round(self, t)
    STAMPS.append((t, time.perf_counter()))
    return line


def _write() -> None:
    path = os.environ.get("HASFL_ROUND_STAMPS")
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(STAMPS, handle)


if __name__ == "__main__":
    Engine.run_round = _stamped
    atexit.register(_write)
    main()

"""Waiting for a Ray cluster to place a run's actors. A cluster joined by address whose CPUs (or GPUs) other jobs
hold places the actors only once those jobs end, which may be hours: the wait says so once, on the terminal and in
RUN/log.txt, and a stop (Ctrl-C, SIGTERM) ends it at once rather than when the cluster frees room (docs/ray.md)."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import ray

from hasfl_ray.errors import RoundInterrupted

logger = logging.getLogger(__name__)

#: Seconds of waiting for the actors' set-up before the run says what it waits for (a start on a busy 2-core machine,
#: every actor importing torch, takes up to ~15 s).
PLACEMENT_NOTICE_S = 30.0
#: How often the wait looks at the run's stop request (seconds).
POLL_S = 0.5


def wait_placed(refs: Sequence[Any], should_stop: Callable[[], bool], what: str) -> None:
    """Wait for the actors' set-up calls ``refs``; raise :class:`RoundInterrupted` when a stop is asked meanwhile
    (nothing of the run has started: the engine stops it as a stop before its first round), and warn once, after
    :data:`PLACEMENT_NOTICE_S`, naming ``what`` the run waits for and the cluster's free resources. An actor that
    failed raises as ``ray.get`` does."""
    pending, began, told = list(refs), time.monotonic(), False
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
        if not pending:
            break
        if should_stop():
            raise RoundInterrupted
        if not told and time.monotonic() - began >= PLACEMENT_NOTICE_S:
            told = True
            free, total = ray.available_resources(), ray.cluster_resources()
            gpus = f", {free.get('GPU', 0):g} of its {total.get('GPU', 0):g} GPUs" if total.get("GPU") else ""
            logger.warning("still waiting after %g s for the Ray cluster to start %s (%g of its %g CPUs free%s): "
                           "other jobs may hold them; the run starts once they are free, or Ctrl-C stops it",
                           PLACEMENT_NOTICE_S, what, free.get("CPU", 0), total.get("CPU", 0), gpus)
    ray.get(list(refs))  # an actor that failed to start raises here

"""Graceful stops: the first SIGINT or SIGTERM asks the run to stop at the end of the current client; a second one
stops it at once."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Optional

from hasfl_ray.interrupts import interrupt, noted, watch

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While active (a ``with`` block in the main thread), SIGINT and SIGTERM set :meth:`requested` instead of
    killing the process; the second signal raises KeyboardInterrupt at once, an :class:`hasfl_ray.interrupts.Interrupt`
    naming the signal (inside an import, as soon as the import has ended; ``finally`` blocks still run, so the
    Ray processes of the run are shut down). Outside the main thread it does nothing (signals go to the main
    thread only), and the previous handlers come back on exit.

    Nested inside another (a sweep's around its cells' runs), a stop asked of one is a stop of both: the inner one
    starts stopped when the outer was asked first (a signal between a sweep's cells, or while a cell loads its
    data), and hands its signal to the outer one on exit."""

    def __init__(self) -> None:
        self.signal_number: Optional[int] = None
        self._previous = {}

    def requested(self) -> bool:
        return self.signal_number is not None

    def _handle(self, number: int, frame) -> None:
        insisted = noted(number)  # (Ray's 3-second abort alarm on SIGTERM cancelled: the run needs longer to stop)
        if self.signal_number is not None:
            interrupt(number, frame, insisted)  # the second signal: stop now (inside an import: as it ends)
            return
        self.signal_number = number
        logger.warning("%s received: stopping after the current client and writing a checkpoint (send it again to "
                       "stop at once)", signal.Signals(number).name)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            watch()
            for number in STOP_SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        outer = self._outer()
        if outer is not None and outer.requested() and not self.requested():
            self.signal_number = outer.signal_number
        return self

    def __exit__(self, *exc) -> None:
        outer = self._outer()
        if outer is not None and self.requested() and not outer.requested():
            outer.signal_number = self.signal_number
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def _outer(self) -> Optional["StopSignals"]:
        """The StopSignals this one is nested in (whose handler it replaced), if any."""
        owner = getattr(self._previous.get(signal.SIGINT), "__self__", None)
        return owner if isinstance(owner, StopSignals) else None

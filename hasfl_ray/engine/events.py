"""TensorBoard event files in RUN/events/: a run you can watch (``tensorboard --logdir runs/``).

Written only when the optional ``tensorboard`` package imports (``pip install "hasfl-ray[tensorboard]"``);
otherwise nothing is written and nothing is said. The writer only reads what the round produced (its metrics line,
the algorithm's ``p_current`` and ``h_tilde()``), so results are the same with or without it. Per round:

- scalars, tagged with their metrics.jsonl key: ``test_accuracy``, ``test_loss``, ``avg_p``, ``coverage``,
  ``frozen_fraction`` and ``mean_h`` (when the algorithm has H̃), at step = the round;
- histograms over clients: ``p`` (the current allocation, ``p_current``) and ``h_tilde`` (when the algorithm
  has H̃; non-finite values are left out).

A resumed run opens a new event file whose first event purges the steps from its first round on (SummaryWriter's
``purge_step``): the rounds the interrupted run wrote after its checkpoint are hidden, and TensorBoard shows the
resumed run's values. A failure to write events (a full disk, say) logs one warning and stops the events; the run
goes on.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional

import numpy as np

from hasfl_ray.callbacks import Callback

logger = logging.getLogger(__name__)

#: The run directory's folder for event files (one of rundir.RUN_FOLDERS).
EVENTS_FOLDER = "events"
#: The metrics.jsonl keys written as scalars each round (a None value, mean_h without H̃, is skipped).
SCALAR_KEYS = ("test_accuracy", "test_loss", "train_loss", "avg_p", "coverage", "frozen_fraction", "mean_h")
#: Seconds between flushes of the event file to disk (a live view lags by at most this much).
FLUSH_SECS = 5


def tensorboard_available() -> bool:
    """Whether the optional ``tensorboard`` package imports here."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class RunEvents(Callback):
    """The event writer of one run (or one resumed part of it), a built-in callback (:mod:`hasfl_ray.callbacks`):
    use :meth:`open`; the engine calls ``on_round_end`` / ``on_update`` (``write``) once per round after its metrics
    line is appended; ``close`` when the run ends, however it ends."""

    def on_round_end(self, line: Dict[str, Any], run: Any) -> None:
        self.write(line, run.algorithm)  # reads only: TensorBoard's view of the round

    on_update = on_round_end

    def __init__(self, writer: Any, path: str):
        self._writer = writer
        self.path = path

    @classmethod
    def open(cls, run_path: str, first_round: int) -> Optional["RunEvents"]:
        """A writer on ``run_path``/events whose steps start at ``first_round`` (0, or the round a resume starts
        at), or None when tensorboard does not import or the folder cannot be written (one warning)."""
        if not tensorboard_available():
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard too old or broken for torch: the same as absent
            return None
        path = os.path.join(run_path, EVENTS_FOLDER)
        try:
            if os.path.islink(path):
                raise OSError(f"{EVENTS_FOLDER} is a link to {os.readlink(path)!r}, never followed")
            writer = SummaryWriter(log_dir=path, purge_step=first_round, flush_secs=FLUSH_SECS)
        except Exception as error:  # noqa: BLE001 - watching a run must never stop it
            logger.warning("TensorBoard events are not written to %s (%s); the run goes on", path, error)
            return None
        return cls(writer, path)

    def write(self, line: Dict[str, Any], algorithm: Any) -> None:
        """Record round ``line["round"]``: its scalars and the histograms of p and H̃ over clients."""
        if self._writer is None:
            return
        step = int(line["round"])
        try:
            for key in SCALAR_KEYS:
                value = line.get(key)
                if value is not None:
                    self._writer.add_scalar(key, float(value), step)
            self._histogram("p", getattr(algorithm, "p_current", None), step)
            self._histogram("h_tilde", algorithm.h_tilde(), step)
        except Exception as error:  # noqa: BLE001 - a full disk or a plug-in's odd p_current: stop the events only
            logger.warning("TensorBoard events stop after round %d (%s); the run goes on", step, error)
            self.close()

    def _histogram(self, tag: str, values: Any, step: int) -> None:
        if values is None:
            return
        values = np.asarray(values, dtype=np.float64).ravel()
        values = values[np.isfinite(values)]
        if values.size:
            self._writer.add_histogram(tag, values, step)

    def close(self) -> None:
        """Flush and close the event file (again: nothing)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception as error:  # noqa: BLE001
                logger.warning("TensorBoard events in %s could not be closed (%s)", self.path, error)

"""``--resume`` of a run whose checkpoint holds every round: nothing is left to train, so a Ray run (``backend:
ray``) is finished in this process, as the local backend finishes it (its summary written again from the
checkpoint, the same params_sha256), without starting Ray and its actors for nothing (seconds, and a cluster's
room). Results never depend on the backend, and config.yaml keeps the execution the run recorded."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict

import yaml

from hasfl_ray.engine.backend import LocalBackend
from hasfl_ray.engine.handoff import HandoffBackend

logger = logging.getLogger(__name__)

#: The comment line of config.yaml after which the execution is recorded (``RunDirectory.create``).
EXECUTION = "# execution (does not change results)"


def finish_here(engine: Any) -> None:
    """Where ``engine`` resumes a checkpoint with no round left (a synchronous run: an asynchronous one's
    clients in flight live on its backend) on a backend that would start Ray, swap in a backend that never starts
    it (:class:`HandoffBackend` starts Ray only after a round ran here) and say so, once."""
    c = engine.config
    if not (engine.rundir and holds_every_round(engine)) or isinstance(engine.backend, (LocalBackend, HandoffBackend)):
        return
    engine.backend = HandoffBackend(_no_ray, stored_execution(engine.rundir.path))
    logger.warning("run directory %r holds a finished run (%d of %d rounds); its summary is written again here, "
                   "without starting Ray", engine.rundir.path, engine.checkpoint.round, c.rounds)


def holds_every_round(engine: Any) -> bool:
    """Whether ``engine`` resumes a synchronous run whose checkpoint holds every round (nothing is left to train)."""
    c, checkpoint = engine.config, engine.checkpoint
    return bool(engine.resume) and checkpoint is not None and c.mode != "async" and checkpoint.round >= c.rounds


def record_config(engine: Any) -> None:
    """Write config.yaml with the execution of this process, except where a resume finds every round of a
    synchronous run already trained: nothing runs here, so the config.yaml the run wrote as it ran stays as it is
    (a local run resumed with ``--backend ray --actors 2`` had come to record ``backend: ray`` and ``actors: 2``)."""
    if holds_every_round(engine) and os.path.isfile(os.path.join(engine.rundir.path, "config.yaml")):
        return
    engine.rundir.create(engine.config.to_dict(), engine.backend.describe())


def _no_ray():  # never called: no round is left to hand over at
    raise AssertionError("a finished run never starts Ray")


def stored_execution(path: str) -> Dict[str, Any]:
    """The execution the run's config.yaml records (its ``# key: value`` lines after :data:`EXECUTION`);
    ``{"backend": "ray"}`` where it records none that can be read."""
    found: Dict[str, Any] = {}
    try:
        with open(os.path.join(path, "config.yaml"), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    if EXECUTION in lines:
        for line in lines[lines.index(EXECUTION) + 1:]:
            key, colon, value = line[1:].strip().partition(":")
            if line.startswith("#") and colon and key:
                try:
                    found[key] = yaml.safe_load(value)
                except yaml.YAMLError:
                    found[key] = value.strip()
    return found if found.get("backend") == "ray" else {"backend": "ray"}

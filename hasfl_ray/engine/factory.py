"""The backend factory, above both backends: the in-process one (:mod:`hasfl_ray.engine.backend`) and Ray's
(:mod:`hasfl_ray.simulation.backend`, imported, with Ray, only for ``backend: ray``)."""

from __future__ import annotations

import os
from typing import Optional

from hasfl_ray.engine.backend import Backend, LocalBackend
from hasfl_ray.config import RunConfig
from hasfl_ray.engine.handoff import HandoffBackend
from hasfl_ray.simulation import require_ray

#: A hook for tests: the round at which a run handed over to Ray (:class:`HandoffBackend`) switches, waiting for Ray
#: there (0: Ray from the first round; more than the rounds: every round in this process).
TAKEOVER_ROUND_ENV = "HASFL_HANDOFF_ROUND"


def make_backend(config: RunConfig) -> Backend:
    """The backend ``config.backend`` names; Ray is imported only for ``ray`` (one sentence when it is missing).
    A Ray run chosen by the default backend (``handoff``, set by :meth:`RunConfig.resolved` for ``backend: auto``)
    that starts Ray on this machine trains here while Ray starts, in the background, and hands over to it
    (docs/ray.md, 'Start-up'; :func:`hasfl_ray.simulation.placement.handoff_execution` says when): Ray is imported
    there too. ``backend: ray`` given by name trains on Ray from its first round."""
    if config.backend == "ray" and config.handoff:
        from hasfl_ray.simulation.placement import handoff_execution

        # an asynchronous run has no round boundary to hand over at (its clients in flight live on one backend)
        execution = handoff_execution(config) if config.mode != "async" else None
        if execution is not None:
            return HandoffBackend(lambda: _ray_backend(warn_at_warm_up=True), execution, _takeover_round())
    if config.backend == "ray":
        return _ray_backend()
    return LocalBackend()


def _ray_backend(warn_at_warm_up: bool = False) -> Backend:
    require_ray()
    from hasfl_ray.simulation.backend import RayBackend

    return RayBackend(warn_at_warm_up)


def _takeover_round() -> Optional[int]:
    value = os.environ.get(TAKEOVER_ROUND_ENV, "").strip()
    return int(value) if value.isdigit() else None

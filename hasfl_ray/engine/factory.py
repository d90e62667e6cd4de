"""The backend factory, above both backends: the in-process one (:mod:`hasfl_ray.engine.backend`) and Ray's
(:mod:`hasfl_ray.simulation.backend`, imported, with Ray, only for ``backend: ray``)."""

from __future__ import annotations

from hasfl_ray.engine.backend import Backend, LocalBackend
from hasfl_ray.engine.config import RunConfig
from hasfl_ray.simulation import require_ray


def make_backend(config: RunConfig) -> Backend:
    """The backend ``config.backend`` names; Ray is imported only for ``ray`` (one sentence when it is missing)."""
    if config.backend == "ray":
        require_ray()
        from hasfl_ray.simulation.backend import RayBackend

        return RayBackend()
    return LocalBackend()

"""The Ray backend: trainer actors pinned to GPUs (or CPU cores) and a server actor; the only package importing Ray.

Importing this package does not import Ray: :func:`ray_backend` does, and says how to install Ray when it
is missing, so the local backend keeps working without it.
"""

from __future__ import annotations

import importlib.util

from hasfl_ray.errors import ConfigError

RAY_INSTALL = 'pip install "ray>=2.9"'


def ray_available() -> bool:
    """Whether Ray can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def require_ray() -> None:
    """Raise a one-sentence :class:`ConfigError` with the install command when Ray cannot be imported."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(f"backend 'ray' needs Ray, which is not installed; install it with `{RAY_INSTALL}`, "
                          "or run with --backend local") from None


def ray_backend():
    """A new :class:`hasfl_ray.simulation.backend.RayBackend` (imports Ray)."""
    require_ray()
    from hasfl_ray.simulation.backend import RayBackend
    return RayBackend()


__all__ = ["RAY_INSTALL", "ray_available", "ray_backend", "require_ray"]

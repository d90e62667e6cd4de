"""The Ray backend: trainer actors pinned to GPUs (or CPU cores) and a server actor; the only package importing Ray.

Importing this package does not import Ray: :func:`hasfl_ray.engine.factory.make_backend` imports it for
``backend: ray`` (after :func:`require_ray`, which says how to install Ray when it is missing), so the local backend
keeps working without it.
"""

from __future__ import annotations

import logging
import os

from hasfl_ray.errors import RAY_INSTALL, ConfigError


#: Ray's notice that token authentication is on (it stays on; the user has nothing to act on). The notice that it
#: is off, and every other warning, still shows.
_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"


class _DropTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_TOKEN_NOTICE)


#: What a Ray instance started here exposes when token authentication is off.
AUTH_OFF_WARNING = ("RAY_AUTH_MODE=disabled: this Ray instance answers unauthenticated requests (cluster, node and "
                    "job information, and job submission) on every port it opens, on every interface (the GCS, 6379 "
                    "for `ray start --head`, the object manager, node manager and worker ports); unset "
                    "RAY_AUTH_MODE, or keep those ports behind a firewall that admits only this machine "
                    "(loopback) or the cluster's nodes (docs/ray.md, 'Security')")


def quiet_token_notice() -> None:
    """Before ``ray.init``: silence Ray's 'token authentication is enabled' notice (never the check itself), and
    warn, once per call, when the environment turned token authentication off (:data:`AUTH_OFF_WARNING`): the run
    goes on (the user asked for it), but never silently."""
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _DropTokenNotice) for f in logger.filters):
        logger.addFilter(_DropTokenNotice())
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        logging.getLogger(__name__).warning(AUTH_OFF_WARNING)


def ray_available() -> bool:
    """Whether Ray can be imported (checked without importing it): the check the default backend rule makes."""
    from hasfl_ray.engine.config import ray_installed

    return ray_installed()


def require_ray() -> None:
    """Raise a one-sentence :class:`ConfigError` with the install command when Ray cannot be imported."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(f"backend 'ray' needs Ray, which is not installed; install it with `{RAY_INSTALL}`, "
                          "or run with --backend local") from None


__all__ = ["RAY_INSTALL", "ray_available", "require_ray"]

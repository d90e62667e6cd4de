"""The Ray backend: trainer actors pinned to GPUs (or CPU cores) and a server actor; the only package importing Ray.

Importing this package does not import Ray: :func:`hasfl_ray.engine.factory.make_backend` imports it for
``backend: ray`` (after :func:`require_ray`, which says how to install Ray when it is missing), so the local backend
keeps working without it.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, Dict, Optional, Tuple

from hasfl_ray.errors import RAY_INSTALL, ConfigError


#: Ray's notice that token authentication is on (it stays on; the user has nothing to act on). The notice that it
#: is off, and every other warning, still shows.
_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
#: Ray's notice that ``ray.init`` outside the main thread leaves SIGTERM alone (the run's own handler takes it).
_THREAD_NOTICE = "SIGTERM handler is not set because current thread is not the main thread"
#: Seconds a Ray address has to accept a connection and answer as a gRPC server before it counts as unreachable
#: (Ray's own connect retries and warns for minutes).
PROBE_SECONDS = 5.0


class _DropTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith((_TOKEN_NOTICE, _THREAD_NOTICE))


#: What a Ray instance started here exposes when token authentication is off.
AUTH_OFF_WARNING = ("RAY_AUTH_MODE=disabled: this Ray instance answers unauthenticated requests (cluster, node and "
                    "job information, and job submission) on every port it opens, on every interface (the GCS, 6379 "
                    "for `ray start --head`, the object manager, node manager and worker ports); unset "
                    "RAY_AUTH_MODE, or keep those ports behind a firewall that admits only this machine "
                    "(loopback) or the cluster's nodes (docs/ray.md, 'Security')")


def quiet_token_notice(warn: bool = True) -> None:
    """Before ``ray.init``: silence Ray's 'token authentication is enabled' notice (never the check itself), and
    (``warn``) :func:`warn_auth_off`."""
    for name in ("ray._private.authentication.authentication_token_setup", "ray._private.worker"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTokenNotice) for f in logger.filters):
            logger.addFilter(_DropTokenNotice())
    if warn:
        warn_auth_off()


def warn_auth_off() -> None:
    """Warn, once per call, when the environment turned token authentication off (:data:`AUTH_OFF_WARNING`): the
    run goes on (the user asked for it), but never silently."""
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        logging.getLogger(__name__).warning(AUTH_OFF_WARNING)


def ray_address(address: Optional[str]) -> Tuple[Optional[str], str]:
    """The Ray address a run joins and where it came from, for sentences: ``address`` (the --address flag or the
    config's ``address``), else RAY_ADDRESS when set (Ray itself would read it), else ``(None, "")``: start Ray
    here."""
    if address:
        return address, "address"
    env = os.environ.get("RAY_ADDRESS", "").strip()
    return (env, "RAY_ADDRESS in the environment") if env else (None, "")


def connect_ray(address: Optional[str], local: Dict[str, Any], warn: bool = True) -> bool:
    """The one guarded start of Ray (simulate's backend and the sweep's executor): join the cluster at ``address``
    or RAY_ADDRESS (probed first, :func:`probe_address`), else start a private Ray on this machine (never joining a
    cluster already running there, whose installed code would run our cells) with ``local``'s options
    (``ray.init`` keywords). Returns True when this call initialised Ray (the caller shuts it down), False when it
    was already initialised. Every failure is one :class:`ConfigError` sentence, naming where an address came from.
    ``warn``: :func:`warn_auth_off` now (False: the caller does, where the run's log sees it)."""
    import ray

    if ray.is_initialized():
        return False
    quiet_token_notice(warn)
    address, source = ray_address(address)
    if address:
        target = probe_address(address, source)
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except Exception as error:  # ConnectionError, a version mismatch, a refused job
            raise _unreachable(source, address, target, error) from None
        return True
    try:  # address "local": a private instance, never the cluster a `ray start` left on this machine (issue 37)
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, **local)
    except Exception as error:  # Ray's own start-up failures (ports, /dev/shm, permissions, a read-only HOME)
        raise ConfigError(f"Ray could not start on this machine ({_first_line(error)}); expected a machine where "
                          "`ray start --head` works, or --backend local") from None
    return True


#: A gRPC (HTTP/2) client's opening: the connection preface and an empty SETTINGS frame. A GCS or Ray client
#: server answers it with its own SETTINGS frame (frame type 4) at once.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def probe_address(address: str, source: str, seconds: Optional[float] = None) -> str:
    """Check, within ``seconds`` (default :data:`PROBE_SECONDS`), that ``address`` (HOST:PORT, ``ray://HOST:PORT``
    or ``auto``) is a listening gRPC server, as a Ray GCS or Ray client server is, before ``ray.init`` retries it
    for minutes; one ConfigError sentence naming ``source`` otherwise. Returns the HOST:PORT probed ('' when the address is no HOST:PORT: Ray
    reads it). A TLS cluster (RAY_USE_TLS) is only checked to accept a connection."""
    import ray

    target = address.split("://", 1)[1] if "://" in address else address
    if target == "auto":
        try:  # the cluster `ray start` recorded on this machine
            target = ray._private.services.canonicalize_bootstrap_address(target) or ""
        except Exception as error:
            raise _unreachable(source, address, "", error) from None
    host, _, port = target.rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        return ""
    if not 1 <= int(port) <= 65535:  # the kernel folds 99999 into another port: "Connection refused" misled
        unset = "no --address" if source == "address" else "RAY_ADDRESS unset"
        raise ConfigError(f"{source} is {address!r} but its port {port} is out of range; expected a port from 1 to "
                          f"65535 (the address `ray start --head` prints), or {unset} to start Ray on this machine")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=seconds or PROBE_SECONDS) as conn:
            if os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):
                conn.sendall(_HTTP2_PREFACE)
                answer = conn.recv(9)
                if len(answer) < 4 or answer[3] != 4:
                    raise ConnectionError("it does not answer as a Ray cluster does (gRPC)")
    except OSError as error:
        raise _unreachable(source, address, target, "timed out" if isinstance(error, socket.timeout) else
                           error.strerror or str(error)) from None
    if "://" not in address and os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):
        check_admitted(target, address, source, seconds or PROBE_SECONDS)
    return target


#: gRPC status names of a cluster that answered but will not let this process in (its token, its permissions).
_REFUSALS = ("UNAUTHENTICATED", "PERMISSION_DENIED")


def check_admitted(target: str, address: str, source: str, seconds: float) -> None:
    """Ask the GCS at ``target`` (HOST:PORT) for its cluster id, with the authentication ``ray.init`` would send
    (Ray's own channel: a token only when RAY_AUTH_MODE=token, or for ``auto`` when a token is on this machine):
    one ConfigError sentence when it refuses us. Ray's own connect retried a refused token for ~20 s, printing a
    raw C++ log line a second, then blamed the address ("no Ray cluster answered"). Any other answer (or a Ray
    without these helpers) is left to ``ray.init``."""
    try:
        import grpc
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available)
        from ray._private.grpc_utils import init_grpc_channel
    except ImportError:
        return
    if address == "auto":  # what ray.init does next for "auto" (an explicit address never turns tokens on)
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    channel = init_grpc_channel(target)
    try:
        channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")(b"", timeout=seconds)
    except grpc.RpcError as error:
        code = getattr(error.code(), "name", "") if callable(getattr(error, "code", None)) else ""
        if code in _REFUSALS:
            detail = (error.details() or code).split(":")[0].strip()[:60]
            unset = "no --address" if source == "address" else "RAY_ADDRESS unset"
            raise ConfigError(f"{source} is {address!r}: a Ray cluster answered but refused the connection ({detail}); "
                              f"expected RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN), or {unset}") from None
    finally:
        channel.close()


#: Where a resumed run's address comes from when no flag gives one: the cluster it joined, kept in its config.yaml.
STORED_ADDRESS = "the resumed run's address (its config.yaml)"


def _unreachable(source: str, address: str, target: str, detail: object) -> ConfigError:
    reason = _first_line(detail) if isinstance(detail, BaseException) else str(detail)
    unset = "no --address" if source == "address" else "RAY_ADDRESS unset"
    expected = ("--address of a running cluster (`ray start --head` prints it), or --backend local to finish the run "
                "on this machine" if source == STORED_ADDRESS else
                f"the address of a running cluster (`ray start --head` prints it), or {unset} to start Ray on this "
                "machine")
    return ConfigError(f"{source} is {address!r} but no Ray cluster answered there ({target + ': ' if target else ''}"
                       f"{reason}); expected {expected}")


def _first_line(error: BaseException) -> str:
    return str(error).split("\n")[0].strip().rstrip(".")[:160] or type(error).__name__


def ray_available() -> bool:
    """Whether Ray can be imported (checked without importing it): the check the default backend rule makes."""
    from hasfl_ray.config import ray_installed

    return ray_installed()


def require_ray() -> None:
    """Raise a one-sentence :class:`ConfigError` with the install command when Ray cannot be imported."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(f"backend 'ray' needs Ray, which is not installed; install it with `{RAY_INSTALL}`, "
                          "or run with --backend local") from None


__all__ = ["RAY_INSTALL", "connect_ray", "ray_address", "ray_available", "require_ray"]

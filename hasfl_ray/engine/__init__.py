"""The engine: config, round loop, server, backends and the run directory."""

from hasfl_ray.engine.backend import Backend, LocalBackend
from hasfl_ray.config import RunConfig
from hasfl_ray.engine.engine import Engine
from hasfl_ray.engine.server import Server

__all__ = ["Backend", "Engine", "LocalBackend", "RunConfig", "Server"]

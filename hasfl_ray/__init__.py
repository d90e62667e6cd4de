"""hasfl-ray: HAS-FL and its baselines, simulated on Ray actors with a fused aggregation kernel.

The plug-in API (docs/plugins.md): subclass :class:`Algorithm` (or :class:`Dataset`), register it
with :func:`register_algorithm` (:func:`register_dataset`) or name it as ``FILE.py:Class`` / ``MODULE:Class``, and run
it with ``hasfl-ray simulate --algorithm ...`` or :func:`simulate`.
"""

__version__ = "0.1.0"

from hasfl_ray import allocator as _allocator  # noqa: E402 (ctypes and os only)

_allocator.bound_primitive_cache()  # before any convolution runs: oneDNN's compiled-primitive cache bounded

#: Public names loaded on first use, so that importing hasfl_ray stays light and layered (no torch: the console
#: script's entry, hasfl_ray.cli.entry, is reached before anything heavy is imported, so a Ctrl-C while the rest
#: loads is one line, never a traceback).
_LAZY = {
    "AggregateResult": "hasfl_ray.aggregation",
    "aggregate_updates": "hasfl_ray.aggregation",
    "Algorithm": "hasfl_ray.algorithms.base",
    "Arrival": "hasfl_ray.algorithms.base",
    "ClientResult": "hasfl_ray.training.local",
    "LocalObjective": "hasfl_ray.training.local",
    "Dataset": "hasfl_ray.data.base",
    "FederatedDataset": "hasfl_ray.data.base",
    "TensorFederatedDataset": "hasfl_ray.data.base",
    "RunConfig": "hasfl_ray.config",
    "register_algorithm": "hasfl_ray.registry",
    "register_dataset": "hasfl_ray.registry",
    "simulate": "hasfl_ray.api",
    "load_run": "hasfl_ray.results",
    "RunResult": "hasfl_ray.results",
    "Callback": "hasfl_ray.callbacks",
    "EarlyStopping": "hasfl_ray.callbacks",
    "Stop": "hasfl_ray.callbacks",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hasfl_ray' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]

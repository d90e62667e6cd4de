"""The Python entry point: run one experiment with a built-in or a plug-in algorithm and dataset."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional, Sequence, Union

from hasfl_ray.callbacks import check_callbacks

from hasfl_ray.config import (RunConfig, check_inert_keys, given_keys, load_yaml_config, merge_layers,
                              migrate_config)
from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import spec_of
from hasfl_ray.results import RunResult


def _name(kind: str, value: Any) -> str:
    """A registered name or spec as is; a plug-in class as the name its runs record."""
    if isinstance(value, str):
        return value
    if isinstance(value, type):
        return spec_of(kind, value)
    raise ConfigError(f"{kind} is a {type(value).__name__} object; expected a name, FILE.py:Class / MODULE:Class, "
                      f"or the plug-in class itself")


def simulate(config: Union[RunConfig, Mapping[str, Any], str, None] = None, *, algorithm: Any = None,
             dataset: Any = None, algorithm_options: Optional[Mapping[str, Any]] = None,
             out_dir: Optional[str] = None, progress: Optional[bool] = None, resume: bool = False,
             force: bool = False, callbacks: Optional[Sequence[Any]] = None, track: Sequence[str] = (),
             **fields: Any) -> RunResult:
    """Run one experiment and return its result: the summary as a dict (best_accuracy, final_accuracy, avg_p,
    avg_p_post_warmup, rounds, params_sha256, wall_s, ...) with ``.history`` (every metrics line), ``.out_dir``
    and ``.frame()`` (:class:`~hasfl_ray.results.RunResult`), writing the run directory ``out_dir`` when given.

    Args:
        config: a RunConfig, a mapping of config keys, or the path of a YAML config (default: all defaults).
        algorithm: a registered name, ``FILE.py:Class`` / ``MODULE:Class``, or an Algorithm subclass.
        dataset: a registered name, ``FILE.py:Class`` / ``MODULE:Class``, or a Dataset subclass.
        algorithm_options: the algorithm's options (its ``options_class`` fields), or an instance of that class.
        fields: further config keys (``rounds=5``, ``clients=10``, ``mu=0.5`` for fedprox), over ``config``'s.
        progress: a progress bar (tqdm's notebook widget in Jupyter); default: on in a notebook, off elsewhere.
        callbacks: objects with ``on_round_end`` / ``on_update`` / ``on_run_start`` / ``on_run_end``
            (:mod:`hasfl_ray.callbacks`); ``on_round_end`` may return ``Stop`` to end the run early.
        track: experiment trackers to log to, ``"mlflow"`` and/or ``"wandb"`` (:mod:`hasfl_ray.trackers`).

    ``backend`` defaults to ``auto``, the command line's rule: Ray where it is installed, else local
    (:func:`hasfl_ray.config.default_backend`); results do not depend on it.
    """
    from hasfl_ray.engine import Engine

    run_config = make_config(config, algorithm=algorithm, dataset=dataset, algorithm_options=algorithm_options,
                             **fields)
    from hasfl_ray.trackers import make_trackers

    if progress is None:
        progress = in_notebook()
    hooks = check_callbacks(callbacks) + make_trackers(track)
    engine = Engine(run_config, out_dir=out_dir, progress=progress, resume=resume, force=force, callbacks=hooks)
    summary = engine.run()
    return RunResult(summary, engine.history, out_dir)


def make_config(config: Union[RunConfig, Mapping[str, Any], str, None] = None, *, algorithm: Any = None,
                dataset: Any = None, algorithm_options: Optional[Mapping[str, Any]] = None, **fields: Any) -> RunConfig:
    """The RunConfig :func:`simulate` runs for the same arguments (a RunConfig, a mapping or a YAML path, the
    algorithm and dataset by name, spec or class, their options and further keys), checked as it checks them;
    :func:`hasfl_ray.flower.Strategy` builds its run from it too."""
    if isinstance(config, os.PathLike):  # a pathlib.Path to a config file, as its string
        config = os.fspath(config)
    if isinstance(config, str):  # a config file: options for other algorithms (a sweep's shared keys) are dropped
        layers = [(load_yaml_config(config), "drop")]
    elif isinstance(config, RunConfig):
        layers = [(migrate_config(config.to_dict()), "refuse")]
    elif config is None or isinstance(config, Mapping):
        layers = [(dict(config or {}), "refuse")]
    else:
        raise ConfigError(f"config is {_shown(config)}; expected a RunConfig, a mapping of config keys or a YAML path")
    given = dict(fields)
    if algorithm is not None:
        given["algorithm"] = _name("algorithm", algorithm)
    if dataset is not None:
        given["dataset"] = _name("dataset", dataset)
    layers.append((given, "refuse"))
    if algorithm_options is not None:
        instance = dataclasses.is_dataclass(algorithm_options) and not isinstance(algorithm_options, type)
        if not instance and not isinstance(algorithm_options, Mapping):
            what = f"the class {algorithm_options!r}" if isinstance(algorithm_options, type) else \
                _shown(algorithm_options)
            raise ConfigError(f"algorithm_options is {what}; expected a mapping of option names to values (or an "
                              "instance of the options dataclass)")
        layers.append(({"algorithm_options": dataclasses.asdict(algorithm_options)
                        if instance else dict(algorithm_options)}, "refuse"))
    source = "config" if not isinstance(config, str) else f"config file {config!r}"
    values = merge_layers(layers, source)
    given_layers = [layer for layer, _ in layers[isinstance(config, RunConfig):]]  # a RunConfig holds every key
    if dataclasses.is_dataclass(algorithm_options):  # an options instance holds every field: the user's, those changed
        given_layers[-1] = {"algorithm_options": {f.name: getattr(algorithm_options, f.name)
                                                  for f in dataclasses.fields(algorithm_options)
                                                  if getattr(algorithm_options, f.name) != f.default}}
    run_config = RunConfig.from_dict(values)
    check_inert_keys(given_keys(given_layers), values, source)
    return run_config


def _shown(value: Any) -> str:
    """``value``'s repr, cut to 60 characters (a sentence names it, never pages of it)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where a progress bar is shown by default)."""
    import sys

    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"

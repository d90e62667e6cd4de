"""A run's results in Python (docs/notebook.md): what :func:`hasfl_ray.simulate` returns (:class:`RunResult`) and
what :func:`load_run` reads back from a run folder (:class:`Run`).

Both give the summary, the per-round history as records (a list of dicts, one per metrics.jsonl line) and, where
pandas is installed, as a DataFrame (:meth:`frame`). A run folder also gives the clients' records (clients.csv) and
the global model at any width from its checkpoint (:meth:`Run.model`).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from hasfl_ray.errors import ConfigError
from hasfl_ray.front_end import option


def _frame(records: List[Dict[str, Any]]):
    try:
        import pandas
    except ImportError:
        raise ImportError("frame() needs pandas (pip install pandas); the records are in .history") from None
    return pandas.DataFrame.from_records(records)


class RunResult(dict):
    """The summary of a run (this dict: best_accuracy, final_accuracy, params_sha256, ... as summary.json), with
    ``history`` (every metrics line, in order), ``out_dir`` (the run folder, None without one) and :meth:`frame`."""

    def __init__(self, summary: Dict[str, Any], history: List[Dict[str, Any]], out_dir: Optional[str]):
        super().__init__(summary)
        self.history = [dict(line) for line in history]
        self.out_dir = out_dir

    @property
    def summary(self) -> Dict[str, Any]:
        return dict(self)

    def frame(self):
        """The history as a pandas DataFrame, one row per round (server update in async mode)."""
        return _frame(self.history)

    def load(self) -> "Run":
        """The run folder read back (:func:`load_run`); one sentence when the run had none."""
        if self.out_dir is None:
            raise ConfigError("this run has no folder (out_dir None); expected simulate(..., out_dir=PATH) to read "
                              "its clients and model back")
        return load_run(self.out_dir)


class Run:
    """A finished (or stopped) run read from its folder: ``config`` (config.yaml as a dict), ``summary``
    (summary.json; None for a run that has not finished), ``history`` (metrics.jsonl's lines), ``clients``
    (clients.csv's rows as dicts, numbers as numbers), :meth:`frame`, :meth:`clients_frame`, :meth:`params` and
    :meth:`model`."""

    def __init__(self, path: str):
        from hasfl_ray.analysis.runfiles import read_metrics
        from hasfl_ray.analysis.runs import _read_config, read_clients
        from hasfl_ray.files import read_json

        self.path = path
        config_path = os.path.join(path, "config.yaml")
        if not os.path.isfile(config_path):
            raise ConfigError(f"run folder {path!r} has no config.yaml; expected a folder a hasfl-ray run wrote "
                              f"(its {option('out')})")
        # the report's readers: links refused, the YAML strict and migrated from earlier versions, numbers checked
        self.config: Dict[str, Any] = _read_config(config_path)
        summary_path = os.path.join(path, "summary.json")
        self.summary: Optional[Dict[str, Any]] = read_json(summary_path, "run file", "the summary of a finished "
                                                           "hasfl-ray run") if os.path.isfile(summary_path) else None
        has = lambda name: os.path.isfile(os.path.join(path, name))  # noqa: E731
        self.history: List[Dict[str, Any]] = read_metrics(path) if has("metrics.jsonl") else []
        self.clients: List[Dict[str, Any]] = [{key: _number(value) for key, value in row.items()} for row in
                                              read_clients(os.path.join(path, "clients.csv"))] \
            if has("clients.csv") else []

    def frame(self):
        """metrics.jsonl as a pandas DataFrame."""
        return _frame(self.history)

    def clients_frame(self):
        """clients.csv as a pandas DataFrame."""
        return _frame(self.clients)

    def params(self) -> Dict[str, Any]:
        """The global parameters of the run's checkpoint (name -> full-width float32 tensor): after the last round
        of a finished run, or the last checkpoint of a stopped one. One sentence when the run kept none
        (``checkpoint_every 0``)."""
        from hasfl_ray.engine.checkpoint import load_checkpoint

        checkpoint = load_checkpoint(self.path)
        if checkpoint is None:
            raise ConfigError(f"run folder {self.path!r} has no checkpoint (checkpoints/latest.pt); expected a run "
                              "with checkpoint_every > 0, which keeps the model after its last round")
        return checkpoint.params

    def model(self, width: float = 1.0):
        """The global model as the run evaluated it at ``width`` (the network behind ``accuracy_at_width``; width 1:
        ``test_accuracy``): the nested prefix for most built-ins, FIARSE's and FedGMR's masked model, a depth
        sub-model's exits (DepthFL's ensemble at width 1), a plug-in's ``submodel_for_eval``; in eval mode, on the
        CPU. Building it loads the run's dataset (the model of a ``--model`` run is registered by it), so the run's
        ``data_dir`` must still hold the data. Norm statistics: sBN networks normalise with each batch's statistics
        here (the server's static statistics pass over the clients' data is not redone)."""
        import numpy as np

        from hasfl_ray.config import RunConfig
        from hasfl_ray.data import load_plugin_dataset
        from hasfl_ray.engine.depth_eval import evaluated_network
        from hasfl_ray.engine.participants import capacity_tiers
        from hasfl_ray.engine.preparing import build_algorithm
        from hasfl_ray.federation import ladder_of
        from hasfl_ray.models.choice import model_dataset
        from hasfl_ray.registry import lookup, spec_label

        if not isinstance(width, (int, float)) or isinstance(width, bool) or not 0 < width <= 1:
            raise ConfigError(f"width is {width!r}; expected a number in (0, 1]")
        config = RunConfig.from_dict(self.config).resolved()
        dataset = model_dataset(load_plugin_dataset(lookup("dataset", config.dataset), config), config,
                                spec_label(config.dataset))
        params = self.params()
        p_max = capacity_tiers(config.effective_data_seed, config.clients, config.tier_counts, ladder_of(config))
        algorithm = build_algorithm(config, dataset.model, p_max, np.asarray(dataset.client_sizes(), dtype=np.int64))
        algorithm.algorithm.global_params = lambda: params  # FIARSE's thresholds read it
        return evaluated_network(algorithm, dataset.model, params, float(width)).eval()


def load_run(path: str) -> Run:
    """Read the run folder ``path`` (hasfl-ray simulate's --out): its config, summary, history, clients and model."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        raise ConfigError(f"run folder {path!r} is not a folder; expected the {option('out')} of a hasfl-ray run")
    return Run(os.fspath(path))


def _number(value: str) -> Any:
    if value == "":
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value

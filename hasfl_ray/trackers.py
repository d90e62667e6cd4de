"""Experiment trackers as callbacks (docs/notebook.md#trackers): ``--track mlflow`` and ``--track wandb``.

Each logs the run's resolved config as parameters, every numeric scalar of each metrics line at step = the round
(server version in async mode), and the summary's numbers at the end, with the run folder's name as the tracker's
run name. Where the tracker's server is set is the tracker's own business: MLflow reads ``MLFLOW_TRACKING_URI``
(default: ./mlruns), W&B reads ``WANDB_MODE`` (``offline`` writes ./wandb without an account) and ``WANDB_PROJECT``.

A tracker only reads, so a run's results do not depend on it; a tracker that fails after the start (a server
gone, a full disk) logs one warning and stops logging, and the run goes on. One that cannot start (the package
is not installed) is refused before the run starts, in one sentence.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Dict, List, Optional, Sequence

from hasfl_ray.callbacks import Callback, RunInfo
from hasfl_ray.errors import ConfigError

logger = logging.getLogger(__name__)

TRACKERS = ("mlflow", "wandb")


def scalars(line: Dict[str, Any]) -> Dict[str, float]:
    """The finite numbers of a metrics line or summary (nested dicts flattened as ``key/sub``), ``round`` left out."""
    out: Dict[str, float] = {}
    for key, value in line.items():
        if key == "round":
            continue
        if isinstance(value, dict):
            for sub, number in scalars(value).items():
                out[f"{key}/{sub}"] = number
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)
    return out


def _params(config: Any) -> Dict[str, str]:
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return {key: str(value)[:250] for key, value in values.items() if value is not None}


def _name(run: RunInfo) -> Optional[str]:
    return os.path.basename(os.path.normpath(run.out_dir)) if run.out_dir else None


class _Tracker(Callback):
    """A tracker's shared handling: a failure after the start stops the logging with one warning."""

    kind = ""

    def __init__(self):
        self.active = False

    def _guard(self, action, *args) -> None:
        if not self.active:
            return
        try:
            action(*args)
        except Exception as error:  # noqa: BLE001 - a tracker never costs a run
            logger.warning("%s logging stops (%s); the run goes on", self.kind, error)
            self.active = False

    def on_round_end(self, line: Dict[str, Any], run: RunInfo) -> None:
        self._guard(self._log, scalars(line), int(line["round"]))

    on_update = on_round_end

    def on_run_end(self, summary: Dict[str, Any], run: RunInfo) -> None:
        self._guard(self._finish, scalars(summary))


class MLflowTracker(_Tracker):
    """Logs to MLflow (``MLFLOW_TRACKING_URI``; experiment ``hasfl-ray`` unless ``MLFLOW_EXPERIMENT_NAME``)."""

    kind = "mlflow"

    def __init__(self, experiment: Optional[str] = None):
        super().__init__()
        import mlflow

        self.mlflow = mlflow
        self.experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME", "hasfl-ray")
        self.run_id: Optional[str] = None

    def on_run_start(self, run: RunInfo) -> None:
        self.active = True

        def start():
            self.mlflow.set_experiment(self.experiment)
            active = self.mlflow.start_run(run_name=_name(run))
            self.run_id = active.info.run_id
            self.mlflow.log_params(_params(run.config))
        self._guard(start)

    def _log(self, values: Dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(values, step=step)

    def _finish(self, values: Dict[str, float]) -> None:
        self.mlflow.log_metrics({f"summary/{k}": v for k, v in values.items()})
        self.mlflow.end_run()
        self.active = False


class WandbTracker(_Tracker):
    """Logs to Weights & Biases (``WANDB_MODE=offline`` needs no account; project ``hasfl-ray`` unless
    ``WANDB_PROJECT``)."""

    kind = "wandb"

    def __init__(self, project: Optional[str] = None):
        super().__init__()
        import wandb

        self.wandb = wandb
        self.project = project or os.environ.get("WANDB_PROJECT", "hasfl-ray")
        self.run: Any = None

    def on_run_start(self, run: RunInfo) -> None:
        self.active = True

        def start():
            self.run = self.wandb.init(project=self.project, name=_name(run), config=_params(run.config),
                                       reinit="finish_previous")
        self._guard(start)

    def _log(self, values: Dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def _finish(self, values: Dict[str, float]) -> None:
        for key, value in values.items():
            self.run.summary[key] = value
        self.run.finish()
        self.active = False


def make_trackers(names: Sequence[str]) -> List[Callback]:
    """The trackers named (``mlflow``, ``wandb``); one sentence for an unknown name or a package not installed."""
    if isinstance(names, str):
        names = [names]
    out: List[Callback] = []
    seen = set()
    for name in names or ():
        if name not in TRACKERS:
            raise ConfigError(f"track is {name!r}; expected one of {', '.join(TRACKERS)}")
        if name in seen:  # two trackers of one kind would log the run twice (two MLflow runs)
            raise ConfigError(f"track names {name!r} twice; expected each tracker once ({', '.join(TRACKERS)})")
        seen.add(name)
        try:
            out.append(MLflowTracker() if name == "mlflow" else WandbTracker())
        except ImportError:
            raise ConfigError(f"track is {name!r} but the {name} package is not installed; expected "
                              f"pip install {name} (or hasfl-ray[{name}])") from None
    return out

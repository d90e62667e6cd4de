"""Where the training API used to live, kept importable: :class:`ClientTask`, :class:`LocalObjective`,
:class:`OptimizerSettings` and friends are in :mod:`hasfl_ray.training.task`, :class:`ClientResult` in
:mod:`hasfl_ray.training.result`, :class:`Trainer` in :mod:`hasfl_ray.training.trainer`."""

from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.task import ClientTask, LocalObjective, OptimizerSettings, graphable, inject_fault
from hasfl_ray.training.trainer import Trainer

__all__ = ["ClientResult", "ClientTask", "LocalObjective", "OptimizerSettings", "Trainer", "graphable",
           "inject_fault"]

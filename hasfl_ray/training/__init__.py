"""Local training and evaluation: plain PyTorch, used in-process and inside Ray actors alike."""

from hasfl_ray.training.evaluate import evaluate
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.task import ClientTask, LocalObjective, OptimizerSettings
from hasfl_ray.training.trainer import Trainer

__all__ = ["ClientResult", "ClientTask", "LocalObjective", "OptimizerSettings", "Trainer", "evaluate"]

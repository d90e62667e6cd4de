"""Local training and evaluation: plain PyTorch, used in-process and inside Ray actors alike."""

from hasfl_ray.training.evaluate import evaluate
from hasfl_ray.training.local import ClientResult, ClientTask, LocalObjective, OptimizerSettings, Trainer

__all__ = ["ClientResult", "ClientTask", "LocalObjective", "OptimizerSettings", "Trainer", "evaluate"]

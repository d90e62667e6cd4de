"""Accuracy at each depth of a run with depth sub-models (docs/models.md#depth-sub-models): the global model's
depth-d sub-model at full width (its first d stages and exit d's logits), evaluated on the server's test samples in
its batches, as the accuracy at each width is (``accuracy_at_depth`` of metrics.jsonl, DepthFL's per-classifier
accuracy)."""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

import torch

from hasfl_ray.models import build_model
from hasfl_ray.models.resnet import sbn_statistics
from hasfl_ray.engine.statistics import pass_batches
from hasfl_ray.training.evaluate import evaluate


@torch.no_grad()
def evaluate_depths(server, depths: Sequence[int]) -> Dict[int, Tuple[float, float]]:
    """(accuracy, loss) of ``server``'s global model cut to each depth of ``depths`` (a :class:`Server`), its sBN
    statistics from the server's pass where it has static BatchNorm."""
    out = {}
    for depth in depths:
        model = build_model(server.model_name, 1.0, int(depth)).to(server.device)
        for name, param in model.named_parameters():
            param.copy_(server.params[name])
        if server.statistics.mode != "test_batch":
            sbn_statistics(model, pass_batches(server.dataset, server.statistics))
        out[int(depth)] = evaluate(model, server.dataset, server.eval_batch_size, server.eval_indices)
    return out


__all__ = ["evaluate_depths"]

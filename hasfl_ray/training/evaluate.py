"""Evaluation of the full-width global model on the global test set."""

from __future__ import annotations

from typing import Tuple

import torch
from torch import nn
from torch.nn import functional as F

from hasfl_ray.data.base import FederatedDataset


@torch.no_grad()
def evaluate(model: nn.Module, dataset: FederatedDataset, batch_size: int = 500) -> Tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``model`` on the test set, in fixed batches of ``batch_size``.

    BatchNorm normalises with each evaluation batch's statistics (the project's BN policy, see
    :class:`hasfl_ray.models.ImageCNN`), so the batch size is part of the protocol and recorded.
    """
    model.eval()
    device = next(model.parameters()).device
    correct, loss_sum, total = 0, 0.0, 0
    for x, y in dataset.test_batches(batch_size):
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        total += int(y.numel())
    return correct / max(total, 1), loss_sum / max(total, 1)

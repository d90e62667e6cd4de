"""Evaluation of the full-width global model on the global test set, or on a seeded subset of it."""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hasfl_ray.data.base import FederatedDataset
from hasfl_ray.evaluation import beats, right
from hasfl_ray.training.seeding import STREAM_EVAL, numpy_rng


def evaluation_subset(seed: int, test_size: int, samples: Optional[int]) -> Optional[torch.Tensor]:
    """The sorted int64 test indices that ``eval_samples`` = ``samples`` evaluates, or None for the whole test set.

    Drawn once, uniformly without replacement, from rng(seed, STREAM_EVAL): the same subset every round, on every
    backend and for every actor count. ``samples`` None, or at least ``test_size``, means the whole test set
    (evaluated exactly as without the option)."""
    if samples is None or samples >= test_size:
        return None
    chosen = numpy_rng(seed, STREAM_EVAL).choice(test_size, size=samples, replace=False)
    return torch.from_numpy(np.sort(chosen).astype(np.int64))


@torch.no_grad()
def evaluate(model: nn.Module, dataset: FederatedDataset, batch_size: int = 500,
             indices: Optional[torch.Tensor] = None,
             beaten: Optional[List[Tuple[torch.Tensor, torch.Tensor]]] = None) -> Tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``model`` on the test set, in fixed batches of ``batch_size``.

    With ``indices`` (sorted int64 positions in the test set, :func:`evaluation_subset`), on those test samples
    only, in that order, ``batch_size`` at a time.

    BatchNorm normalises with each evaluation batch's statistics (the project's BN policy, see
    :class:`hasfl_ray.models.ImageCNN`), so the batch size is part of the protocol and recorded.

    ``beaten``: a list that gets each batch's labels and :func:`~hasfl_ray.evaluation.beats` (on the CPU), from the
    same forward pass, for the local-accuracy pass to reuse (the right answers are counted from them: the same rule).
    """
    model.eval()
    device = next(model.parameters()).device
    correct, loss_sum, total = 0, 0.0, 0
    batches = dataset.test_batches(batch_size) if indices is None else \
        dataset.test_subset_batches(indices, batch_size)
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        if beaten is None:
            correct += int(right(logits, y).sum())
        else:
            bits = beats(logits, y)
            correct += int((~bits.any(dim=1)).sum())
            beaten.append((y.cpu(), bits.cpu()))
        total += int(y.numel())
    return correct / max(total, 1), loss_sum / max(total, 1)

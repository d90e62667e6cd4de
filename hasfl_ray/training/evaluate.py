"""Evaluation of the full-width global model on the global test set, or on a seeded subset of it."""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hasfl_ray.data.base import FederatedDataset
from hasfl_ray.evaluation import beats, right
from hasfl_ray.models.unfilled import unfilled_memory
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


#: Samples a forward of a CPU evaluation whose outputs are per sample (static BatchNorm with its running statistics:
#: :func:`per_sample`) splits each evaluation batch into: on this 2-core CPU the convolutions are faster per sample
#: at smaller batches (the HeteroFL pack's PreResNet (1,1,1,2) over 200 test images: 0.737 s in one forward, 0.650 s
#: in forwards of 50; with the convolutions' weights reordered once (hasfl_ray/models/packed_conv.py), forwards of 25
#: 0.572 s against 0.612-0.617 s at 50, medians of 8 and 10 interleaved repeats; the logits and loss bit-identical
#: at 10, 25, 40, 50 and 200). The loss and counts are still taken per evaluation batch.
PER_SAMPLE_FORWARD = 25


def per_sample(model: nn.Module) -> bool:
    """Whether ``model``'s outputs in evaluation mode are per sample, so how a batch is cut into forwards changes
    nothing but float rounding: it has static BatchNorm (hasfl_ray's ResNets with ``norm: sbn``) and every
    BatchNorm of it normalises with running statistics (after the sBN pass; ``test_batch`` mode has none)."""
    from hasfl_ray.models.resnet import StaticBatchNorm2d

    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return any(isinstance(m, StaticBatchNorm2d) for m in norms) and all(
        m.track_running_stats and m.running_mean is not None for m in norms)


def _forward(model: nn.Module, x: torch.Tensor, split: int) -> torch.Tensor:
    if split <= 0 or x.shape[0] <= split:
        return model(x)
    return torch.cat([model(x[start:start + split]) for start in range(0, x.shape[0], split)])


@torch.no_grad()
@unfilled_memory()
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
    split = PER_SAMPLE_FORWARD if device.type == "cpu" and per_sample(model) else 0
    correct, loss_sum, total = 0, 0.0, 0
    batches = dataset.test_batches(batch_size) if indices is None else \
        dataset.test_subset_batches(indices, batch_size)
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits = _forward(model, x, split)
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        if beaten is None:
            correct += int(right(logits, y).sum())
        else:
            bits = beats(logits, y)
            correct += int((~bits.any(dim=1)).sum())
            beaten.append((y.cpu(), bits.cpu()))
        total += int(y.numel())
    return correct / max(total, 1), loss_sum / max(total, 1)

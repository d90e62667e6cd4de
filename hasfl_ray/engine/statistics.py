"""The static-BatchNorm statistics pass of a run (docs/models.md): the plan its config gives (:class:`StatisticsPlan`:
``sbn_statistics``, ``sbn_batch_size``, ``sbn_statistics_data``, the run's augmentation) and the batches each plan
reads, HeteroFL's whole, augmented training set included."""

from __future__ import annotations

from typing import Iterator, NamedTuple, Tuple

import numpy as np
import torch

from hasfl_ray.models.sbn_pass import SBN_STREAM, training_batches
from hasfl_ray.training.augment import black_pixel, crop_flip
from hasfl_ray.training.seeding import torch_generator

#: The stream of the crop-flip draws of a pass over the augmented training set (``sbn_statistics_data:
#: training_set`` with ``augmentation: crop_flip``), keyed by the pass's batch number.
SBN_AUGMENT_STREAM = 0x5B4F


class StatisticsPlan(NamedTuple):
    """What a :class:`~hasfl_ray.engine.server.Server` (and every evaluator) needs of a run's config for sBN's
    evaluation statistics (:func:`statistics_plan`); a plain 3-tuple (mode, batch size, seed) reads as the clients'
    data without augmentation."""

    mode: str  # shuffled | in_order | test_batch
    batch_size: int  # samples per batch of the pass
    seed: int  # the run seed: orders the shuffled pass and draws its crops
    data: str = "clients"  # clients | training_set
    augmentation: str = "none"  # the run's training augmentation (read by a training_set pass)


def statistics_plan(config) -> StatisticsPlan:
    """A run's :class:`StatisticsPlan`: ``sbn_statistics``; the batch, ``sbn_batch_size`` for the shuffled pass and
    ``eval_batch_size`` for ``in_order`` (the earlier pass ran in the evaluation's batches, 500, and a version-2
    run migrated to it is evaluated as it ran); ``sbn_statistics_data`` and the run's ``augmentation``."""
    mode = config.sbn_statistics
    return StatisticsPlan(mode, config.eval_batch_size if mode == "in_order" else config.sbn_batch_size,
                          config.seed, getattr(config, "sbn_statistics_data", "clients"),
                          getattr(config, "augmentation", "none"))


def pass_batches(dataset, plan: StatisticsPlan) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """The batches the pass of ``plan`` reads (not for ``test_batch``, which has no pass)."""
    if plan.data == "training_set":
        return training_set_batches(dataset, plan.batch_size, plan.seed, plan.augmentation)
    return training_batches(dataset, plan.batch_size, plan.seed if plan.mode == "shuffled" else None)


def training_set_batches(dataset, batch_size: int, seed: int,
                         augmentation: str = "none") -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """HeteroFL's ``stats(dataset['train'], ..)`` (src/train_classifier_fed.py): the *whole* training set, samples no
    client holds included, in a seeded permutation of its indices (``default_rng([seed, SBN_STREAM])``), cut into
    batches of ``batch_size`` (a last batch of one sample left out), each read as training reads it: with
    ``augmentation`` crop_flip, cropped and flipped (RandomCrop(padding 4), RandomHorizontalFlip: HeteroFL's training
    transform, src/data.py::fetch_dataset) from the draws of ``(seed, SBN_AUGMENT_STREAM, batch number)``, the padding
    a black pixel of the standardised images. The dataset holds its training set as tensors
    (:class:`~hasfl_ray.data.base.TensorFederatedDataset`: ``train_x``, ``train_y``)."""
    size = int(dataset.train_y.shape[0])
    order = torch.as_tensor(np.random.default_rng([seed, SBN_STREAM]).permutation(size), dtype=torch.int64)
    fill = None
    for number, start in enumerate(range(0, size - 1, batch_size)):
        chunk = order[start:start + batch_size]
        if chunk.numel() < 2:
            break
        chunk = chunk.to(dataset.train_y.device)
        x, y = dataset.training_set_batch(chunk)
        if augmentation == "crop_flip":
            fill = black_pixel(dataset, x.shape[1], x.device) if fill is None else fill
            x = crop_flip(x, torch_generator(seed, SBN_AUGMENT_STREAM, number), fill)
        yield x, y


__all__ = ["SBN_AUGMENT_STREAM", "StatisticsPlan", "pass_batches", "statistics_plan", "training_set_batches"]

"""The clients' training data as the static-BatchNorm statistics pass reads it (docs/models.md): shuffled or in client
order. The plan a run's config gives and the pass over the whole training set are
:mod:`hasfl_ray.engine.statistics`; the pass itself, one forward pass with momentum None, is
:func:`hasfl_ray.models.resnet.sbn_statistics`."""

from __future__ import annotations

from typing import Iterator, List, Tuple

import numpy as np
import torch

#: The stream of the sBN statistics pass's permutation (beside the run seed), apart from every other draw.
SBN_STREAM = 0x5B4E


def training_batches(dataset, batch_size: int, seed=None) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """Every client's training samples (the union of the clients' data, the training set the federation holds),
    ``batch_size`` at a time; a last batch of fewer than 2 samples is left out (it gives BatchNorm no batch
    statistics). With ``seed`` (HeteroFL's ``stats``: a shuffled loader over the training set, its batch size 10), in
    a seeded permutation of all of them, each batch's samples gathered client by client; without, client after
    client, each client's in its sample order, across client boundaries."""
    if seed is not None:
        yield from _shuffled_batches(dataset, batch_size, seed)
        return
    parts: List[Tuple[torch.Tensor, torch.Tensor]] = []
    held = 0
    for client in range(dataset.num_clients):
        size, start = dataset.client_size(client), 0
        while start < size:
            take = min(batch_size - held, size - start)
            parts.append(dataset.client_batch(client, torch.arange(start, start + take)))
            start, held = start + take, held + take
            if held == batch_size:
                yield torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])
                parts, held = [], 0
    if held >= 2:
        yield torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def _shuffled_batches(dataset, batch_size: int, seed: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    sizes = [dataset.client_size(client) for client in range(dataset.num_clients)]
    owner = np.repeat(np.arange(len(sizes)), sizes)
    position = np.concatenate([np.arange(size) for size in sizes]) if sizes else np.zeros(0, dtype=np.int64)
    order = np.random.default_rng([seed, SBN_STREAM]).permutation(len(owner))
    for start in range(0, len(order) - 1, batch_size):
        chunk = order[start:start + batch_size]
        if len(chunk) < 2:
            break
        pieces = [dataset.client_batch(int(client), torch.as_tensor(position[chunk[owner[chunk] == client]]))
                  for client in np.unique(owner[chunk])]
        yield torch.cat([x for x, _ in pieces]), torch.cat([y for _, y in pieces])


__all__ = ["SBN_STREAM", "training_batches"]

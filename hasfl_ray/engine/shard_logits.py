"""The clients' test shards scored as the sources score them (local accuracy, ``--local-eval-rule source``): the
width-``width`` global model's logits of chosen test samples, each client's shard in its own batches. Out of
:class:`~hasfl_ray.engine.server.Server` to keep that file within its size; :meth:`Server.test_logits` calls it."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch


@torch.no_grad()
def test_logits(server, indices: np.ndarray, width: float = 1.0,
                groups: Optional[Sequence[int]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The labels, int64 (S,), and the width-``width`` global model's logits, float32 (S, C), of the test
    samples ``indices`` (positions in the full test set), in batches of ``eval_batch_size``: the clients' own test
    shards, for local accuracy as the sources score it (:func:`hasfl_ray.evaluation.shard_local_accuracies`).
    ``groups``: the sizes of consecutive runs of ``indices`` (each sorted: one client's shard) evaluated apart, as
    the sources' per-client test loaders do (HeteroFL ``train_classifier_fed.py::test``, FedRolex
    ``resnet_client.py::test_model_for_user``), each run in their order (by label, then by position: a client's
    shards one label after another, ``non_iid``) so that a batch normalised with its own statistics (``test_batch``,
    batch-statistics norms) holds what theirs holds (a last batch of one sample, which has no batch statistics,
    joins the batch before it); the rows returned follow ``indices``."""
    model = server.width_model(width, None, cache=width in server._width_models)
    model.eval()
    indices = np.asarray(indices, dtype=np.int64)
    ys, outs, start = [], [], 0
    for size in ([len(indices)] if groups is None else [int(g) for g in groups]):
        part, start = torch.as_tensor(indices[start:start + size]), start + size
        if groups is None:
            for x, y in server.dataset.test_subset_batches(part, server.eval_batch_size):
                outs.append(model(x.to(server.device)).float().cpu())
                ys.append(y.cpu())
        elif size:
            x, y = next(iter(server.dataset.test_subset_batches(part, size)))
            order = torch.argsort(y.cpu(), stable=True)
            logits = [None] * size
            cuts = list(range(0, size, server.eval_batch_size)) + [size]
            if len(cuts) > 2 and cuts[-1] - cuts[-2] == 1:  # one sample has no batch statistics: with the one before
                del cuts[-2]
            for first, end in zip(cuts, cuts[1:]):
                chosen = order[first:end]
                out = model(x[chosen.to(x.device)].to(server.device)).float().cpu()
                for row, position in zip(out, chosen.tolist()):
                    logits[position] = row
            outs.append(torch.stack(logits))
            ys.append(y.cpu())
    if not outs:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
    return torch.cat(ys).numpy().astype(np.int64), torch.cat(outs).numpy()

"""The server's differentially private mean (docs/privacy.md): each accepted update clipped over the coordinates its
client holds, the count-weighted sum noised and divided by each coordinate's holders
(:func:`hasfl_ray.aggregation.privacy.privatize`), with the coverage of the aggregation path the round's updates take
without privacy (:meth:`hasfl_ray.engine.server.Server._aggregate`: slices, windows, label split, index sets, masks).

Every layout goes through the fused kernel's one pass (:func:`fused_form`): slices and windows through
``aggregate_private_into``; index sets, masks and the label split (:func:`label_split_form`) through
``aggregate_private_sparse_into``; on the CPU, and on a CUDA server whose build has their CUDA kernel (compiled for
sm_90, not yet run on a card). The torch path of :func:`~hasfl_ray.aggregation.privacy.privatize` remains where
``--aggregation reference`` selects it, on another device or a build without the kernel, and where the op cannot
express the round (windows split in blocks past dim 0; index sets beside a label split or windows, which the round's
own path refuses in a sentence): the same draws (csrc/private_normal.h), so the paths agree to rounding."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np


def private_mean(server: Any, updates: List[Dict], offsets: List[int], holds: Optional[np.ndarray],
                 clients: Sequence[int]) -> Any:
    """The round's noised mean (an AggregateResult); ``server.privacy_keys`` set to the round's privacy keys."""
    from hasfl_ray.aggregation.privacy import privatize

    def mean_of(ups, extra):  # extra: one more client holding every coordinate (privacy.holder_counts)
        if not ups:  # Poisson participation without a participant: nothing but the noise
            return nothing(server)
        rows = holds if holds is None or not extra else np.vstack([holds, np.ones_like(holds[:1])])
        offs = offsets + [offsets[0]] if extra else offsets
        return server._aggregate(ups, offs, [1.0] * len(ups), rows)

    aggregate, server.privacy_keys = privatize(mean_of, server.shapes, updates, list(clients), server.privacy,
                                               fused_form(server, updates, offsets, holds))
    return aggregate


def fused_form(server: Any, updates: List[Dict], offsets: List[int], holds: Optional[np.ndarray]):
    """The fused kernel's one-pass form of the DP mean (clip, mean, counts, noise) where the round's layout has it,
    on a CPU server with the kernel built, or a CUDA server whose build has the private ops' CUDA kernel
    (:func:`hasfl_ray.ops.aggregate_private.cuda_available`; not yet run on a card), unless refused
    (``--aggregation reference``: the torch path): leading slices and rolling windows (their channel offsets as the
    layout's element starts, :func:`hasfl_ray.aggregation.windows.element_starts`) through
    ``aggregate_private_into``, index sets and masks (beside slices) and the label split (:func:`label_split_form`)
    through ``aggregate_private_sparse_into``. None elsewhere (another device, a build without the kernel, a layout
    the op cannot express: the torch path, the same draws)."""
    from hasfl_ray.ops import aggregate_private
    from hasfl_ray.ops.sparse import has_sparse

    if server.aggregation_backend == "reference" or server.device.type not in ("cpu", "cuda") or \
            (server.device.type == "cuda" and not aggregate_private.cuda_available()):
        return None
    if holds is not None:
        return label_split_form(server, updates, offsets, holds)
    if has_sparse(updates):
        if any(offsets) or getattr(server, "estimator", None) == "common-core" \
                or not aggregate_private.sparse_available():
            return None  # beside windows or common-core: the round's own path refuses them in a sentence

        def fused_sparse(ups, bounds, std, key, offset, expected):
            return aggregate_private.aggregate_private_sparse(server.shapes, ups, [1.0] * len(ups), bounds, std, key,
                                                              offset, expected, server.gate_blocks)

        return fused_sparse
    if not aggregate_private.available():
        return None
    expressible, starts = window_starts(server, updates, offsets)
    if not expressible:
        return None

    def fused(ups, bounds, std, key, offset, expected):
        return aggregate_private.aggregate_private(server.shapes, ups, [1.0] * len(ups), bounds, std, key, offset,
                                                   expected, server.gate_blocks, starts)

    return fused


def window_starts(server: Any, updates: List[Dict], offsets: List[int]):
    """(True, None) for leading slices, (True, the op's element starts) for rolling windows
    (:func:`hasfl_ray.aggregation.windows.element_starts`), (False, None) where the windows cannot be expressed."""
    if not any(offsets):
        return True, None
    from hasfl_ray.aggregation.windows import element_starts

    starts = element_starts(server.specs, updates, offsets)
    return starts is not None, starts


def label_split_form(server: Any, updates: List[Dict], offsets: List[int], holds: np.ndarray):
    """The label split's one pass (HeteroFL's and FedRolex's ``classifier_aggregation: label_split``): the output
    layer's coordinates a client is averaged over (its slice or window, rows of the labels it holds) as a mask, the
    rows of labels it does not hold as its ``uncounted`` entries (in its norm and divergence, in no mean or k_j:
    :func:`hasfl_ray.aggregation.label_split.split_by_label`), the other parameters slices or windows beside them;
    ``covered_by_layer`` of the output layer as :func:`~hasfl_ray.aggregation.label_split.aggregate_label_split`
    gives it. None where the round's own path refuses the round (index sets or masks beside a label split) or the
    windows cannot be expressed (:func:`hasfl_ray.aggregation.windows.element_starts`)."""
    from hasfl_ray.aggregation.label_split import split_by_label
    from hasfl_ray.ops import aggregate_private
    from hasfl_ray.ops.sparse import has_sparse

    if has_sparse(updates) or not aggregate_private.sparse_available():
        return None
    expressible, starts = window_starts(server, updates, offsets)
    if not expressible:
        return None

    def fused_label_split(ups, bounds, std, key, offset, expected):
        split, aside = split_by_label(server.specs, ups, offsets, holds, server.output_layer)
        got = aggregate_private.aggregate_private_sparse(server.shapes, split, [1.0] * len(ups), bounds, std, key,
                                                         offset, expected, server.gate_blocks, starts, aside)
        for name in server.output_layer:
            counts = got.counts[name]
            got.result.covered_by_layer[name] = int((counts > 0).sum()) / counts.numel()
        return got

    return fused_label_split


def nothing(server: Any) -> Any:
    """The aggregate of no update: zeros of every parameter's shape on the server's device, nothing covered."""
    import torch

    from hasfl_ray.aggregation import AggregateResult

    empty = torch.zeros(0, dtype=torch.float64)
    delta = {name: torch.zeros(tuple(shape), dtype=server.params[name].dtype, device=server.params[name].device)
             for name, shape in server.shapes.items()}
    return AggregateResult(delta, empty, empty, 0.0, dict.fromkeys(server.specs, 0.0))


def covered_everywhere(server: Any):
    """Under Poisson participation the noised mean moves every coordinate (whoever came): the adaptive server
    optimisers' mask of covered coordinates is all of them, not the participants' (which would tell who came)."""
    import torch

    return lambda: {name: torch.ones(tuple(shape), dtype=torch.bool, device=server.params[name].device)
                    for name, shape in server.shapes.items()}


__all__ = ["covered_everywhere", "fused_form", "label_split_form", "nothing", "private_mean"]

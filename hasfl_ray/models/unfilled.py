"""Evaluation passes without deterministic mode's NaN fill of new tensors (issue 46 item 1).

Deterministic mode (:func:`hasfl_ray.training.determinism.apply_determinism`) also makes torch fill every new tensor
with NaN (``torch.utils.deterministic.fill_uninitialized_memory``, on by default with it), so that a kernel reading
memory it did not write would show. In an evaluation pass every output is written by its kernel before anything
reads it, so the fill is only work; :func:`unfilled_memory` turns it off around the sBN statistics pass
(:func:`hasfl_ray.models.resnet.sbn_statistics`) and the test pass (:func:`hasfl_ray.training.evaluate.evaluate`).
Training keeps it."""

from __future__ import annotations

import contextlib
from typing import Iterator

#: Whether :func:`unfilled_memory` turns the fill off (benchmarks/bench_eval.py sets it False to time the path before
#: it beside the current one in one process).
EVALUATION_UNFILLED = True


@contextlib.contextmanager
def unfilled_memory() -> Iterator[None]:
    """Inside: new tensors are not filled with NaN. Deterministic mode does that to every new tensor by default
    (``torch.utils.deterministic.fill_uninitialized_memory``), so that a kernel reading memory it did not write
    would show; in an evaluation pass (the sBN statistics pass, the test pass) every output is written by its kernel
    before anything reads it (convolution, BatchNorm, ReLU, pooling, linear), so the fill is only work: about 5 % of
    the HeteroFL pack's sBN pass on a CPU (issue 46 item 1). The values computed are the same bits. The switch is
    the process's; the previous setting is restored on the way out (nested uses included)."""
    try:
        import torch.utils.deterministic as settings
    except ImportError:  # a torch without the switch
        settings = None
    if not EVALUATION_UNFILLED or not hasattr(settings, "fill_uninitialized_memory"):
        yield
        return
    previous = settings.fill_uninitialized_memory
    settings.fill_uninitialized_memory = False
    try:
        yield
    finally:
        settings.fill_uninitialized_memory = previous


__all__ = ["EVALUATION_UNFILLED", "unfilled_memory"]

"""The memory layout the server evaluates in: channels-last where the network convolves, at every width."""

from __future__ import annotations

import torch
from torch import nn

from hasfl_ray.models.packed_conv import pack_convolutions

#: The layout of the full-width evaluation model (``test_accuracy``, its sBN statistics, local accuracy at width 1):
#: ``channels_last`` (the default since issue 46: EMNIST's full-width test pass 1.4-1.6x faster on a CPU, the CIFAR-10
#: PreResNet's 1.3x, the accuracy the same, the loss within float rounding) or ``default``, the layout it had before,
#: which benchmarks/bench_eval.py sets to measure the earlier path beside the current one in one process. Read when
#: a :class:`~hasfl_ray.engine.server.Server` is built. Sub-models below width 1 are channels-last either way.
FULL_WIDTH_LAYOUT = "channels_last"


def _to_channels_last(module: nn.Module, args):
    """Forward pre-hook: a 4-D input in channels-last memory order (its values unchanged)."""
    x = args[0]
    return (x.contiguous(memory_format=torch.channels_last),) + tuple(args[1:]) if x.dim() == 4 else None


def _evaluation_layout(model: nn.Module) -> nn.Module:
    """A model built for evaluation, in channels-last memory order when it convolves: on a CPU its convolutions and
    max-pooling run 1.3-2.5x faster so (the digits CNN at widths 0.25-0.75: 15.6 ms -> 7.1 ms a pass over the test
    set; EMNIST's CNN at width 1 over its 3,420-image sample: 9.8 s -> 6.2 s of CPU). Its logits may differ from the
    default layout's in the last bits (another convolution kernel), the same on every backend, since the server's
    code alone evaluates (on Ray a trainer runs the same :class:`~hasfl_ray.engine.server.Server`). Its convolutions
    keep their weights reordered for oneDNN between forwards (:mod:`hasfl_ray.models.packed_conv`: the same bits,
    without a reorder of every weight on every forward)."""
    if any(isinstance(m, nn.Conv2d) for m in model.modules()):
        model = pack_convolutions(model.to(memory_format=torch.channels_last))
        model.register_forward_pre_hook(_to_channels_last)
    return model


def full_width_layout(model: nn.Module) -> nn.Module:
    """The full-width evaluation model in :data:`FULL_WIDTH_LAYOUT`."""
    if FULL_WIDTH_LAYOUT not in ("channels_last", "default"):
        raise ValueError(f"FULL_WIDTH_LAYOUT is {FULL_WIDTH_LAYOUT!r}; expected channels_last or default")
    return _evaluation_layout(model) if FULL_WIDTH_LAYOUT == "channels_last" else model

"""The sBN statistics pass in stacked forwards (issue 46 item 1): the source's batches (HeteroFL's ``stats``: batches
of 10) run several at a time through one forward of their concatenation, and each static BatchNorm runs every batch
through its own BatchNorm forward, a *ghost batch*: its own batch statistics normalise it and count once in the
running statistics, in order, exactly as the unstacked pass counts them. Convolutions, the Scaler in evaluation,
ReLU and pooling are per sample, so each batch's activations are those of the batch run alone up to the float
rounding of a convolution at another batch size (none on this CPU's oneDNN kernels: the statistics came out
bit-identical in float32 and float64, tests/models/test_ghost_norm.py). The groups are the batches exactly as the
pass's loader cut them, a short last batch its own group. Only the statistics pass uses this
(:func:`hasfl_ray.models.resnet.sbn_statistics`); training never does."""

from __future__ import annotations

from typing import Iterable, Iterator, List, Sequence, Tuple

import torch

#: Samples a stacked forward of the statistics pass gathers (whole batches, at least one; 1: one forward a batch, the
#: pass as the source runs it). On this 2-core CPU (one intra-op thread) the convolutions are nearly as fast per
#: sample at batch 10 as at any larger batch, so stacking saves only the per-forward overhead: the width-1 PreResNet
#: (1,1,1,2) pass over 500 CIFAR-10 images 1.88 s at 1 sample, 1.69-1.74 s at 20-30, 2.0 s at 50 and more
#: (benchmarks/bench_eval.py); a GPU, idle at batch 10, gains far more (not measured here).
STACK_SAMPLES = 30
#: Whether a CPU pass without autograd writes each batch's output into its rows (:func:`_ghost_into`) rather than
#: concatenating them (benchmarks/bench_eval.py sets it False to measure the path before it).
WRITE_INTO = True


def stacked_batches(batches: Iterable[Tuple[torch.Tensor, torch.Tensor]], samples: int = STACK_SAMPLES
                    ) -> Iterator[Tuple[torch.Tensor, List[int]]]:
    """Consecutive ``batches`` concatenated into stacks of at least ``samples`` samples (the last stack what is left),
    each with the sizes of the batches in it, in order; a batch never splits."""
    held: List[torch.Tensor] = []
    sizes: List[int] = []
    for x, _ in batches:
        held.append(x)
        sizes.append(int(x.shape[0]))
        if sum(sizes) >= samples:
            yield (held[0] if len(held) == 1 else torch.cat(held)), sizes
            held, sizes = [], []
    if held:
        yield (held[0] if len(held) == 1 else torch.cat(held)), sizes


def ghost_forward(layer: torch.nn.BatchNorm2d, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """``layer`` in training mode over ``x``, the concatenation of batches of ``sizes``: each batch through the
    layer's own BatchNorm forward, one after another (its batch statistics normalise it; with momentum None the
    running statistics become the cumulative average of the batches' means and unbiased variances, updated batch
    by batch as the unstacked pass updates them), the outputs concatenated in ``x``'s memory format. On a CPU
    without autograd each batch's output is written straight into its rows of the result (:func:`_ghost_into`: the
    same kernel, no concatenation afterwards)."""
    if WRITE_INTO and x.device.type == "cpu" and not torch.is_grad_enabled() and _plain_update(layer) and \
            min(sizes) >= 2 and (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)):
        return _ghost_into(layer, x, sizes)
    outputs, start = [], 0
    for size in sizes:
        outputs.append(torch.nn.BatchNorm2d.forward(layer, x[start:start + size]))
        start += size
    return torch.cat(outputs).contiguous(memory_format=_format(x))


def _plain_update(layer: torch.nn.BatchNorm2d) -> bool:
    """Whether ``layer`` is a BatchNorm in training mode that counts batches into running statistics (what
    :func:`_ghost_into` writes out of ``nn.BatchNorm2d.forward``)."""
    return layer.training and layer.track_running_stats and layer.running_mean is not None and \
        layer.running_var is not None and layer.num_batches_tracked is not None


def _ghost_into(layer: torch.nn.BatchNorm2d, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """:func:`ghost_forward` on a CPU: ``nn.BatchNorm2d.forward``'s steps for each batch (count the batch; the update
    factor, 1 / batches counted with momentum None; torch's ``native_batch_norm`` in training mode) with the
    kernel's out= form writing the batch's rows of one output with ``x``'s strides (those the concatenation had, also
    where a shape is both contiguous and channels-last, as at 1x1, where a later kernel chooses its path by them):
    the same values, strides and running statistics bit for bit (tests/models/test_ghost_norm.py), without the
    concatenation's copy (~4 % of the pack's sBN pass). ``x`` is dense (contiguous or channels-last)."""
    out = torch.empty_like(x)  # x's own strides
    spare = (x.new_empty(0), x.new_empty(0))  # the kernel's saved mean and inverse deviation (unused here)
    start = 0
    for size in sizes:
        layer.num_batches_tracked.add_(1)
        factor = 1.0 / float(layer.num_batches_tracked) if layer.momentum is None else layer.momentum
        torch.ops.aten.native_batch_norm.out(x[start:start + size], layer.weight, layer.bias, layer.running_mean,
                                             layer.running_var, True, factor, layer.eps,
                                             out=out[start:start + size], save_mean=spare[0], save_invstd=spare[1])
        start += size
    return out


def _format(x: torch.Tensor) -> torch.memory_format:
    """``x``'s memory format: channels-last where it is laid out so (and not also contiguous), else contiguous."""
    return torch.channels_last if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) \
        and not x.is_contiguous() else torch.contiguous_format


__all__ = ["STACK_SAMPLES", "ghost_forward", "stacked_batches"]

"""Convolutions of an evaluation model with their weights reordered once, not on every forward (issue 46 item 1).

On a CPU, torch's convolution hands oneDNN the weight in torch's layout, and oneDNN reorders it into the blocked
layout its kernel reads (``Acdb32a``, ``Acdb64a``) on *every* forward: for the HeteroFL pack's PreResNet (1,1,1,2)
at width 1, about 6 ms of reorders against ~90 ms of convolution a forward of 30 samples, mostly the 512x512
stage's (9.4 MB a weight). An evaluation runs the same weights through many forwards (the sBN statistics pass: 17
forwards over 500 CIFAR-10 images; the test pass: one per 50 images), so :class:`PackedConv2d` reorders the weight
once (``torch.ops.mkldnn._reorder_convolution_weight``, ~2.7 ms a weight of that network with its primitive
query) and calls oneDNN's convolution with it (``torch.ops.mkldnn._convolution_pointwise``, the op torch's own CPU
inference compiler uses for prepacked weights). The kernel is the one torch's path runs (the same primitive, only
without the reorder), so the outputs are the same bits (tests/models/test_packed_conv.py: every shape of the
built-in networks, bias or not, strided, 1x1, grouped, other batch sizes than the one it was reordered at).

Only where it cannot change a value: without autograd, on a CPU, float32, input and weight channels-last (the
evaluation layout, :mod:`hasfl_ray.engine.eval_layout`), the zeros padding, and where torch itself would run the
convolution in oneDNN (``torch._C._select_conv_backend``, once per input shape: a batch of one with a 1x1 kernel,
say, goes to another kernel, and there the module runs torch's path). Anything else, training included, is the
plain ``nn.Conv2d`` forward. The reordered weight is redone when the weight changes (its version counter: every
in-place copy of a new global model bumps it); the layout oneDNN picks for a convolution does not depend on the
batch size (and should another shape want another, oneDNN reorders by itself, as torch's path does). One reordered
copy per convolution is held (the model's convolution weights once more in memory), outside the module's state
(not in ``state_dict``, not pickled or deep-copied: :data:`_PACKED` holds it by a weak reference to the module)."""

from __future__ import annotations

import weakref
from typing import Dict, Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F

#: Whether :func:`pack_convolutions` swaps the convolutions in (benchmarks/bench_eval.py sets it False to measure
#: the path before it beside the current one in one process); read when an evaluation model is built.
ENABLED = True

#: conv module -> its :class:`_Held` reordered weight.
_PACKED: "weakref.WeakKeyDictionary[nn.Conv2d, _Held]" = weakref.WeakKeyDictionary()


def available() -> bool:
    """Whether this torch has oneDNN's prepacked convolution ops (a CPU build with oneDNN)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise") and \
        hasattr(torch.ops.mkldnn, "_reorder_convolution_weight") and hasattr(torch._C, "_select_conv_backend")


class PackedConv2d(nn.Conv2d):
    """``nn.Conv2d`` whose forward without autograd on a CPU reuses a reordered weight (module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self._packed(x)
        if weight is None:
            return super().forward(x)
        return torch.ops.mkldnn._convolution_pointwise(x, weight, self.bias, list(self.padding), list(self.stride),
                                                       list(self.dilation), self.groups, "none", [], "")

    def _packed(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """The reordered weight, or None where this forward takes torch's own path."""
        w = self.weight
        if torch.is_grad_enabled() or x.device.type != "cpu" or w.device.type != "cpu" or x.dim() != 4 or \
                x.dtype != torch.float32 or w.dtype != torch.float32 or self.padding_mode != "zeros" or \
                isinstance(self.padding, str) or (self.bias is not None and self.bias.dtype != torch.float32) or \
                not x.is_contiguous(memory_format=torch.channels_last) or \
                not w.is_contiguous(memory_format=torch.channels_last):
            return None
        key = (w.data_ptr(), w._version, tuple(w.shape), w.stride())
        held = _PACKED.get(self)
        if held is None or held.key != key:
            held = _PACKED[self] = _Held(key, w.detach())
        shape = tuple(x.shape)
        if shape not in held.onednn:  # torch's own choice of kernel for this input (a batch of one may differ)
            held.onednn[shape] = torch._C._select_conv_backend(
                x, w, self.bias, list(self.stride), list(self.padding), list(self.dilation), False, [0, 0],
                self.groups, None) == torch._C._ConvBackend.Mkldnn
        if not held.onednn[shape]:
            return None
        if held.packed is None:  # oneDNN's blocked layout is the same at every batch size of a convolution
            held.packed = torch.ops.mkldnn._reorder_convolution_weight(w.detach(), list(self.padding),
                                                                       list(self.stride), list(self.dilation),
                                                                       self.groups, list(shape))
        return held.packed


class _Held:
    """A convolution's reordered weight (made at the first input shape oneDNN runs; oneDNN reorders it again by
    itself should another shape want another layout, so a value never depends on it), the weight it was made from
    (held so that its memory, and so its data pointer in ``key``, is not reused meanwhile), and torch's choice of
    kernel per input shape."""

    __slots__ = ("key", "weight", "packed", "onednn")

    def __init__(self, key: tuple, weight: torch.Tensor):
        self.key, self.weight, self.packed = key, weight, None
        self.onednn: Dict[Tuple[int, ...], bool] = {}


def pack_convolutions(model: nn.Module) -> nn.Module:
    """``model`` with every plain ``nn.Conv2d`` a :class:`PackedConv2d` (the same module, its class swapped: its
    parameters, hooks and state unchanged), where :data:`ENABLED` and :func:`available`; returns ``model``."""
    if ENABLED and available():
        for module in model.modules():
            if type(module) is nn.Conv2d:
                module.__class__ = PackedConv2d
    return model


def conv_reference(module: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """torch's own convolution of ``module`` over ``x`` (what :class:`PackedConv2d` must equal bit for bit)."""
    return F.conv2d(x, module.weight, module.bias, module.stride, module.padding, module.dilation, module.groups)


__all__ = ["ENABLED", "PackedConv2d", "available", "conv_reference", "pack_convolutions"]

"""Width slicing: one description per parameter drives extraction, insertion, masks and the cost model."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch


def width_channels(p: float, channels: int) -> int:
    """Number of retained channels ceil(p * channels) of a layer at width ``p`` (Algorithm 2).

    The product is rounded to 9 decimals first so that exact tiers such as 0.75 * 64 never
    land one channel high through floating-point noise.
    """
    if isinstance(p, bool) or not isinstance(p, numbers.Real):  # Python, numpy floats; a string is never read
        raise TypeError(f"width p is {p!r}; expected a number in (0, 1]")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"width p must lie in (0, 1], got {p!r}")
    return max(1, math.ceil(round(p * channels, 9)))


@dataclass(frozen=True)
class DimSlice:
    """How one dimension of a parameter shrinks with width.

    Attributes:
        size: full size of the dimension.
        scaled: whether the dimension shrinks with width at all.
        unit: trailing multiplier that is never sliced (e.g. the 4x4 spatial positions a channel
            occupies after flattening); the retained size is ``ceil(p * size / (unit * blocks)) * unit``
            per block.
        blocks: number of equal blocks sliced separately (the 4 gates of an LSTM weight).
        group: the channel group this dim's channels belong to, for channel index sets
            (:func:`hasfl_ray.models.index_slicing.channel_groups`): dims naming one group hold one index set (a
            residual network's stream); None: read off a sequential chain's order. Not part of equality.
    """

    size: int
    scaled: bool = True
    unit: int = 1
    blocks: int = 1
    group: Optional[str] = field(default=None, compare=False)

    @property
    def channels(self) -> int:
        return self.size // (self.unit * self.blocks)

    def sliced(self, p: float) -> int:
        if not self.scaled:
            return self.size
        return self.blocks * width_channels(p, self.channels) * self.unit


@dataclass(frozen=True)
class ParamSpec:
    """Slice description of one parameter: a :class:`DimSlice` per dimension."""

    name: str
    dims: Tuple[DimSlice, ...]

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    @property
    def gate_blocks(self) -> int:
        return self.dims[0].blocks if self.dims else 1

    def sliced_shape(self, p: float) -> Tuple[int, ...]:
        return tuple(d.sliced(p) for d in self.dims)

    def numel(self, p: float = 1.0) -> int:
        return math.prod(self.sliced_shape(p))


def region(full: torch.Tensor, packed_shape: Sequence[int], blocks: int = 1) -> torch.Tensor:
    """View of the coordinates of ``full`` that a packed tensor of ``packed_shape`` occupies.

    The region is the leading slice of every dimension; with ``blocks`` > 1, dimension 0 is
    ``blocks`` equal blocks and the leading slice is taken inside each block. For blocks > 1
    the view has shape ``(blocks, packed_shape[0] // blocks, *packed_shape[1:])``.
    """
    if blocks == 1:
        return full[tuple(slice(0, s) for s in packed_shape)]
    rows = full.shape[0] // blocks
    blocked = full.view(blocks, rows, *full.shape[1:])
    index = (slice(None), slice(0, packed_shape[0] // blocks)) + tuple(slice(0, s) for s in packed_shape[1:])
    return blocked[index]


def extract(full: torch.Tensor, spec: ParamSpec, p: float) -> torch.Tensor:
    """Packed (contiguous, physically smaller) copy of the width-``p`` slice of ``full``."""
    shape = spec.sliced_shape(p)
    return region(full, shape, spec.gate_blocks).reshape(shape).clone()


def insert_(full: torch.Tensor, packed: torch.Tensor, spec: ParamSpec) -> torch.Tensor:
    """Write ``packed`` into its region of ``full`` in place and return ``full``."""
    view = region(full, packed.shape, spec.gate_blocks)
    view.copy_(packed.reshape(view.shape))
    return full


def mask(spec: ParamSpec, p: float, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """Full-shape 0/1 mask m of the width-``p`` slice of one parameter."""
    m = torch.zeros(spec.shape, dtype=dtype)
    region(m, spec.sliced_shape(p), spec.gate_blocks).fill_(1)
    return m


def gate_blocks_of(specs: Mapping[str, ParamSpec]) -> Dict[str, int]:
    """The ``gate_blocks`` argument of :func:`hasfl_ray.aggregate_updates` for these specs."""
    return {name: spec.gate_blocks for name, spec in specs.items() if spec.gate_blocks > 1}


# Rolling windows (FedRolex): the kept channels of a scaled dim are ``offset, offset + 1, …`` modulo the
# channel count instead of the leading ones. Offset 0 is exactly the leading slice above. Dims that share a
# channel space (a layer's outputs and the next layer's inputs) have the same channel count, so one integer
# offset per client gives a consistent sub-network. Every dim reads the offset modulo its own channel count, so
# offsets that differ by a multiple of :func:`window_period` give the same windows everywhere.


def window_period(specs: Mapping[str, ParamSpec]) -> int:
    """The least common multiple of the channel counts of every scaled dim of ``specs`` (1 where none is scaled):
    offsets o and o + k · period give the same window in every parameter, and (−s) mod period is the offset whose
    window starts at channel −s mod C in every dim of C channels (FedRolex's own direction)."""
    return math.lcm(1, *(dim.channels for spec in specs.values() for dim in spec.dims if dim.scaled))


def window_index(dim: DimSlice, kept: int, offset: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Indices into a full dimension of the window of ``kept`` channels starting at channel ``offset``.

    Channel c (of ``dim.channels``) occupies ``dim.unit`` consecutive positions, repeated in each of
    ``dim.blocks`` blocks; the window wraps around the channel count. An unscaled dim keeps everything.

    Returns:
        int64 tensor (blocks * kept * unit,), in packed order: packed position k holds full position index[k].
    """
    if not dim.scaled:
        return torch.arange(dim.size, device=device)
    channels = (offset % dim.channels + torch.arange(kept, device=device)) % dim.channels
    within = (channels[:, None] * dim.unit + torch.arange(dim.unit, device=device)[None, :]).flatten()
    starts = torch.arange(dim.blocks, device=device) * (dim.channels * dim.unit)
    return (starts[:, None] + within[None, :]).flatten()


def window_indices(spec: ParamSpec, packed_shape: Sequence[int], offset: int,
                   device: torch.device | str | None = None) -> Tuple[torch.Tensor, ...]:
    """:func:`window_index` of every dim for a packed tensor of ``packed_shape`` (kept channels read off it)."""
    return tuple(window_index(d, s // (d.blocks * d.unit) if d.scaled else s, offset, device)
                 for d, s in zip(spec.dims, packed_shape))


def window_linear_index(spec: ParamSpec, packed_shape: Sequence[int], offset: int,
                        device: torch.device | str | None = None) -> torch.Tensor:
    """Flat (row-major) positions in the full tensor of every packed element, int64 of ``packed_shape``."""
    linear = torch.zeros((), dtype=torch.int64, device=device)
    stride = 1
    indices = window_indices(spec, packed_shape, offset, device)
    for d in reversed(range(len(spec.dims))):
        view = [1] * len(spec.dims)
        view[d] = -1
        linear = linear + indices[d].view(view) * stride
        stride *= spec.dims[d].size
    return linear.expand(tuple(packed_shape)) if linear.dim() else linear


def extract_window(full: torch.Tensor, spec: ParamSpec, p: float, offset: int) -> torch.Tensor:
    """Packed copy of the width-``p`` rolling window starting at channel ``offset`` (offset 0: :func:`extract`)."""
    out = full
    for d, (dim, size) in enumerate(zip(spec.dims, spec.sliced_shape(p))):
        if dim.scaled:
            out = out.index_select(d, window_index(dim, size // (dim.blocks * dim.unit), offset, full.device))
    return out.contiguous() if out is not full else full.clone()


def roll_channels(full: torch.Tensor, spec: ParamSpec, shift: int) -> torch.Tensor:
    """Copy of ``full`` with every scaled dim's channels rolled by ``shift``: out[c] = full[(c − shift) mod C].

    With ``shift = −offset`` the window at ``offset`` becomes the leading slice, so windows that share one
    offset can be aggregated by the leading-slice kernel and rolled back with ``shift = +offset``.
    """
    out = full
    for d, dim in enumerate(spec.dims):
        if not dim.scaled or shift % dim.channels == 0:
            continue
        shape = out.shape
        split = shape[:d] + (dim.blocks, dim.channels * dim.unit) + shape[d + 1:]
        out = out.reshape(split).roll((shift % dim.channels) * dim.unit, dims=d + 1).reshape(shape)
    return out if out is not full else full.clone()

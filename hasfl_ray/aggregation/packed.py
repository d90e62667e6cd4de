"""Packed updates beyond slices and windows: per-dim channel index sets and unstructured masks.

A client's update of one parameter is one of:

* a ``torch.Tensor``: the leading slice of every dim (inside each gate block), as before;
* :class:`IndexedUpdate`: ``values`` over the product of per-dim index sets. ``index[d]`` is a strictly
  increasing int64 tensor of indices of dim ``d`` of the full shape, or None for every index of that dim;
  ``values.shape[d]`` is its length. Gate blocks play no part: dim 0's indices are indices of the full dim;
* :class:`MaskedUpdate`: an arbitrary subset of the coordinates. ``bits`` is the bitmask of the flattened
  full shape, little bit order (bit ``k % 8`` of byte ``k // 8`` is flat coordinate ``k``, the layout of
  ``numpy.packbits(..., bitorder="little")``), ``ceil(numel / 8)`` bytes with the padding bits clear;
  ``values`` is 1-D, the held coordinates in row-major order.

Both travel as they are (only what the client holds plus its index lists or bitmask, never the dense
tensor) and are aggregated by the fused kernel (``hasfl_ray::aggregate_sparse_into``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch


class _Values:
    """What an update's dtype and device are: its packed ``values``."""

    values: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device


@dataclass(frozen=True)
class IndexedUpdate(_Values):
    """``values`` over per-dim index sets ``index`` (None: the whole dim). See the module docstring."""

    values: torch.Tensor
    index: Tuple[Optional[torch.Tensor], ...]

    def nbytes(self) -> int:
        """Bytes this update occupies on the wire: its values and its index lists."""
        return self.values.numel() * self.values.element_size() + sum(
            8 * index.numel() for index in self.index if index is not None)

    @staticmethod
    def gather(full: torch.Tensor, index: Sequence[Optional[torch.Tensor]]) -> "IndexedUpdate":
        """The coordinates of ``full`` in the product of ``index`` (a copy), as an update; index lists that do not
        fit ``full``'s shape (a list per dim, each a strictly increasing int64 tensor inside its dim, or None) are
        one sentence, as :func:`check_packed` says them."""
        if not isinstance(index, (tuple, list)) or len(index) != full.dim():
            raise ValueError(f"index has {len(index) if isinstance(index, (tuple, list)) else index!r} entries; "
                             f"expected one per dim of the shape {tuple(full.shape)}")
        for dim, (chosen, size) in enumerate(zip(index, full.shape)):
            check_index(f"index[{dim}]", dim, chosen, size, tuple(full.shape))
        values = full
        for dim, chosen in enumerate(index):
            if chosen is not None:
                values = values.index_select(dim, chosen.to(full.device))
        return IndexedUpdate(values.contiguous(), tuple(index))


@dataclass(frozen=True)
class MaskedUpdate(_Values):
    """``values`` at the set bits of ``bits`` (flat bitmask of the full shape). See the module docstring."""

    values: torch.Tensor
    bits: torch.Tensor

    def nbytes(self) -> int:
        """Bytes this update occupies on the wire: its values and its bitmask."""
        return self.values.numel() * self.values.element_size() + self.bits.numel()

    @staticmethod
    def gather(full: torch.Tensor, mask: torch.Tensor) -> "MaskedUpdate":
        """The coordinates of ``full`` where the bool ``mask`` (``full``'s shape) is set, as an update."""
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != tuple(full.shape):
            got = (f"a {type(mask).__name__}" if not isinstance(mask, torch.Tensor)
                   else f"shape {tuple(mask.shape)} and dtype {mask.dtype}")
            raise ValueError(f"mask has {got}; expected a torch.bool tensor of the parameter's shape "
                             f"{tuple(full.shape)}")
        problem = mask_storage_problem(mask)
        if problem:
            raise ValueError(f"mask {problem} of the parameter's shape {tuple(full.shape)}")
        return MaskedUpdate(full[mask.to(full.device)].contiguous(), pack_bits(mask))


Packed = Union[torch.Tensor, IndexedUpdate, MaskedUpdate]
SPARSE_TYPES = (IndexedUpdate, MaskedUpdate)


def mask_storage_problem(mask: torch.Tensor) -> Optional[str]:
    """What keeps a bool tensor of the right shape from being read as a mask, as the start of a sentence ("is a
    torch.sparse_coo tensor; expected a dense (strided, ...) torch.bool tensor"), or None: a sparse layout (nothing
    reshapes or packs it) or the meta device (no values)."""
    if mask.layout != torch.strided:
        return f"is a {mask.layout} tensor; expected a dense (strided, mask.to_dense()) torch.bool tensor"
    if mask.device.type == "meta":
        return "is on meta, a tensor without values; expected a torch.bool tensor with values"
    return None


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """A bool tensor's flat bitmask: uint8, ceil(numel / 8) bytes, little bit order."""
    flat = mask.detach().reshape(-1).cpu().numpy().astype(bool)
    return torch.from_numpy(np.packbits(flat, bitorder="little"))


def unpack_bits(bits: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The bool mask of ``shape`` that :func:`pack_bits` packed into ``bits``."""
    numel = math.prod(shape)
    flat = np.unpackbits(bits.detach().cpu().numpy(), count=numel, bitorder="little").astype(bool)
    return torch.from_numpy(flat).reshape(tuple(shape))


def count_bits(array: np.ndarray) -> int:
    """How many bits a 1-D uint8 array sets: 8 bytes a step (a tenth of the time byte by byte: 50 EMNIST clients'
    masks are 20 MB a round)."""
    whole = array.size // 8 * 8
    return (int(np.bitwise_count(array[:whole].view(np.uint64)).sum(dtype=np.int64)) +
            int(np.bitwise_count(array[whole:]).sum(dtype=np.int64)))


def is_sparse(update: object) -> bool:
    return isinstance(update, SPARSE_TYPES)


def index_structure(where: str, chosen: object) -> Optional[int]:
    """How many indices ``chosen`` (one dim's index list, named ``where``) holds, with the checks that read no index:
    None (the whole dim: returns None) or a 1-D int64 strided tensor with values. Raises one sentence otherwise."""
    if chosen is None:
        return None
    if not isinstance(chosen, torch.Tensor) or chosen.dtype != torch.int64 or chosen.dim() != 1 or \
            chosen.layout != torch.strided:
        got = (f"a {type(chosen).__name__}" if not isinstance(chosen, torch.Tensor)
               else f"a {chosen.layout} tensor" if chosen.layout != torch.strided
               else f"dtype {chosen.dtype} and {chosen.dim()} dims")
        raise TypeError(f"{where} is {got}; expected a 1-D torch.int64 tensor or None")
    if chosen.is_meta:
        raise ValueError(f"{where} is on meta, a tensor without values; expected a 1-D torch.int64 tensor with "
                         "values or None")
    return chosen.numel()


def _host_array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.numpy() if tensor.device.type == "cpu" else tensor.cpu().numpy()


def check_index(where: str, dim: int, chosen: Optional[torch.Tensor], size: int, full: Tuple[int, ...]) -> int:
    """Check one dim's index list ``chosen`` (named ``where``) of a shape ``full`` whose dim ``dim`` has ``size``
    indices: None (the whole dim) or a strictly increasing 1-D int64 tensor inside it; return how many it holds.
    Raises ValueError/TypeError with one sentence naming ``where``, the value and what was expected."""
    length = index_structure(where, chosen)
    if length is None:
        return size
    array = _host_array(chosen)
    # Strictly increasing (the usual case), its ends are its extremes: one pass over it, not three.
    increasing = length <= 1 or bool((array[1:] > array[:-1]).all())
    if length:
        low, high = (array[0], array[-1]) if increasing else (array.min(), array.max())
        if low < 0 or high >= size:
            bad = int(low) if low < 0 else int(high)
            raise ValueError(f"{where} holds index {bad}, outside dim {dim} of size {size} of the global shape "
                             f"{full}; expected indices in [0, {size})")
    if not increasing:
        raise ValueError(f"{where} is {chosen.tolist()[:8]}{'...' if length > 8 else ''}, which is not strictly "
                         "increasing; expected sorted indices without duplicates")
    return length


def check_structure(where: str, full: Tuple[int, ...], packed: Union[IndexedUpdate, MaskedUpdate]) -> torch.Tensor:
    """:func:`check_packed`'s checks that read no index and no bitmask byte (types, dtypes, shapes, lengths); return
    the values tensor. :func:`contents_hold` checks the rest for many holders at once."""
    values = packed.values
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{where}.values is a {type(values).__name__}; expected a torch.Tensor")
    if values.layout != torch.strided:
        raise ValueError(f"{where}.values is a {values.layout} tensor; expected a dense (strided, values.to_dense()) "
                         "contiguous packed tensor")
    if not values.is_contiguous():
        raise ValueError(f"{where}.values is not contiguous; expected a contiguous packed tensor")
    if isinstance(packed, IndexedUpdate):
        index = packed.index
        if not isinstance(index, (tuple, list)) or len(index) != len(full):
            raise ValueError(f"{where}.index has {len(index) if isinstance(index, (tuple, list)) else index!r} "
                             f"entries; expected one per dim of the global shape {full}")
        if values.dim() != len(full):
            raise ValueError(f"{where}.values has {values.dim()} dims but the global shape {full} has {len(full)}")
        shape = values.shape
        for dim, chosen in enumerate(index):
            if chosen is None:
                length = full[dim]
            elif type(chosen) is torch.Tensor and chosen.dtype is torch.int64 and chosen.dim() == 1 and \
                    chosen.layout is torch.strided and not chosen.is_meta:  # the usual case, its sentence unbuilt
                length = chosen.numel()
            else:
                length = index_structure(f"{where}.index[{dim}]", chosen)
            if shape[dim] != length:
                raise ValueError(f"{where}.values has {shape[dim]} entries in dim {dim} but its index set "
                                 f"there holds {length}")
        return values
    bits = packed.bits
    numel = math.prod(full)
    expected = (numel + 7) // 8
    if not isinstance(bits, torch.Tensor) or bits.dtype != torch.uint8 or bits.dim() != 1 or bits.numel() != expected:
        got = (f"a {type(bits).__name__}" if not isinstance(bits, torch.Tensor)
               else f"shape {tuple(bits.shape)} and dtype {bits.dtype}")
        raise ValueError(f"{where}.bits has {got}; expected a 1-D torch.uint8 bitmask of {expected} bytes "
                         f"(ceil({numel} / 8)) for the global shape {full}")
    if not bits.is_cpu:
        raise ValueError(f"{where}.bits is on {bits.device}; expected a CPU tensor")
    if not bits.is_contiguous():
        raise ValueError(f"{where}.bits is not contiguous (strides {bits.stride()}); expected a contiguous bitmask")
    return values


def check_packed(where: str, full: Tuple[int, ...], packed: Union[IndexedUpdate, MaskedUpdate]) -> torch.Tensor:
    """Check an index-set or mask update of a parameter of shape ``full``; return its values tensor.

    Raises ValueError/TypeError with one sentence naming ``where``, the value and what was expected.
    """
    values = check_structure(where, full, packed)
    if isinstance(packed, IndexedUpdate):
        for dim, (chosen, size) in enumerate(zip(packed.index, full)):
            check_index(f"{where}.index[{dim}]", dim, chosen, size, full)
        return values
    numel = math.prod(full)
    array = packed.bits.numpy()
    spare = (numel + 7) // 8 * 8 - numel
    if spare and int(array[-1]) >> (8 - spare):
        raise ValueError(f"{where}.bits sets padding bits past coordinate {numel}; expected them clear")
    held = count_bits(array)
    if values.dim() != 1 or values.numel() != held:
        raise ValueError(f"{where}.values has shape {tuple(values.shape)} but its mask holds {held} coordinates; "
                         f"expected a 1-D tensor of {held} values")
    return values


#: Bitmasks of at least this many bytes are counted one at a time (:func:`count_bits`); smaller ones together.
_COUNT_APART = 4096


def joined_indices(lists: Sequence[torch.Tensor]) -> np.ndarray:
    """The index lists one after another, as one host array (lists on several devices: each brought over first)."""
    try:
        joined = torch.cat(list(lists))
    except RuntimeError:
        joined = torch.cat([chosen.cpu() for chosen in lists])
    return _host_array(joined)


def _sorted_inside(lists: Sequence[torch.Tensor], size: int) -> bool:
    """Whether each index list is strictly increasing with every index in [0, size): one pass over them all (one
    concatenation: a tensor's .numpy() alone costs more than a microsecond)."""
    joined = joined_indices(lists)
    if joined.size == 0:
        return True
    increasing = joined[1:] > joined[:-1]
    starts = np.cumsum([chosen.numel() for chosen in lists])[:-1]
    starts = starts[(starts > 0) & (starts < joined.size)]
    increasing[starts - 1] = True  # a new array's first index may be anything
    return bool(increasing.all()) and int(joined.min()) >= 0 and int(joined.max()) < size


def contents_hold(full: Tuple[int, ...], packs: Sequence[Union[IndexedUpdate, MaskedUpdate]]) -> bool:
    """Whether every one of ``packs`` (updates of one parameter of shape ``full``, :func:`check_structure` passed)
    passes :func:`check_packed`'s other checks (indices strictly increasing inside their dims, a bitmask's padding
    clear and its count of set bits the values' length): one numpy pass per dim over every holder's index lists, and
    one over all holders' bitmasks where they are small, where a holder at a time cost about 10 us each (50 EMNIST
    clients: 1,400 updates a round). False: :func:`check_packed` on each, in order, says the first problem."""
    indexed = [p for p in packs if isinstance(p, IndexedUpdate)]
    for dim, size in enumerate(full):
        lists = [p.index[dim] for p in indexed if p.index[dim] is not None]
        if lists and not _sorted_inside(lists, size):
            return False
    masked = [p for p in packs if isinstance(p, MaskedUpdate)]
    if not masked:
        return True
    if any(p.values.dim() != 1 for p in masked):
        return False
    numel = math.prod(full)
    size, spare = (numel + 7) // 8, (numel + 7) // 8 * 8 - numel
    held = np.array([p.values.numel() for p in masked], np.int64)
    if size == 0:
        return bool((held == 0).all())
    if size < _COUNT_APART:  # one copy of them all, [holders, size], where .numpy() a holder cost more
        stacked = torch.stack([p.bits for p in masked]).numpy()
        counts = np.bitwise_count(stacked).sum(axis=1, dtype=np.int64)
        last = stacked[:, -1]
    else:
        arrays = [p.bits.numpy() for p in masked]
        counts = np.array([count_bits(array) for array in arrays], np.int64)
        last = np.array([array[-1] for array in arrays], np.uint8)
    if spare and (last >> (8 - spare)).any():
        return False
    return bool((counts == held).all())


def dense_of(packed: Union[IndexedUpdate, MaskedUpdate], full: Tuple[int, ...]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(values scattered into a float64 tensor of ``full`` (0 elsewhere), bool mask of the held coordinates)."""
    device = packed.values.device
    dense = torch.zeros(full, dtype=torch.float64, device=device)
    if isinstance(packed, MaskedUpdate):
        mask = unpack_bits(packed.bits, full).to(device)
        dense[mask] = packed.values.to(torch.float64)
        return dense, mask
    grids = [torch.arange(size, device=device) if chosen is None else chosen.to(device)
             for chosen, size in zip(packed.index, full)]
    mask = torch.zeros(full, dtype=torch.bool, device=device)
    if full:
        where = torch.meshgrid(*grids, indexing="ij")
        dense[where] = packed.values.to(torch.float64)
        mask[where] = True
    else:
        dense.fill_(float(packed.values))
        mask.fill_(True)
    return dense, mask


def to_plain(packed: Packed):
    """``packed`` as plain values a checkpoint holds (``torch.load(weights_only=True)`` reads them back). An index set's
    or mask's tensors are copies: an update that came through the Ray wire holds views of one buffer in several dtypes
    (float32 values, int64 indices, uint8 bits), which ``torch.save`` refuses to write."""
    if isinstance(packed, IndexedUpdate):
        return {"packed_kind": "index", "values": packed.values.clone(),
                "index": [None if index is None else index.clone() for index in packed.index]}
    if isinstance(packed, MaskedUpdate):
        return {"packed_kind": "mask", "values": packed.values.clone(), "bits": packed.bits.clone()}
    return packed


def from_plain(value) -> Packed:
    """The inverse of :func:`to_plain`."""
    if isinstance(value, dict) and value.get("packed_kind") == "index":
        return IndexedUpdate(value["values"], tuple(value["index"]))
    if isinstance(value, dict) and value.get("packed_kind") == "mask":
        return MaskedUpdate(value["values"], value["bits"])
    return value


def to_device(packed: Packed, device) -> Packed:
    """``packed`` with its values on ``device`` (index lists and bitmasks stay where they are: the CPU)."""
    if isinstance(packed, IndexedUpdate):
        return IndexedUpdate(packed.values.to(device), packed.index)
    if isinstance(packed, MaskedUpdate):
        return MaskedUpdate(packed.values.to(device), packed.bits)
    return packed.to(device)


def gather_like(packed: Union[IndexedUpdate, MaskedUpdate], full: torch.Tensor) -> torch.Tensor:
    """The coordinates of ``full`` that ``packed`` holds, in its values' order and shape."""
    if isinstance(packed, MaskedUpdate):
        return full[unpack_bits(packed.bits, full.shape).to(full.device)]
    return IndexedUpdate.gather(full, packed.index).values


def with_values(packed: Union[IndexedUpdate, MaskedUpdate], values: torch.Tensor) -> Union[IndexedUpdate, MaskedUpdate]:
    """``packed`` holding ``values`` instead (same coordinates)."""
    if isinstance(packed, MaskedUpdate):
        return MaskedUpdate(values, packed.bits)
    return IndexedUpdate(values, packed.index)

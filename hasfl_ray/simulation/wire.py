"""What travels between the actors through Ray's object store: a structure's tensors as ONE byte buffer.

Pickling a torch tensor costs ~0.1 ms however small it is (its storage goes through pickle's reduce protocol), so a
trainer call's results (a dozen tensors per client) or the global parameters cost milliseconds to store and as many
to read. :func:`pack` replaces every tensor of a structure (dicts, lists, tuples and dataclasses, such as
:class:`~hasfl_ray.training.result.ClientResult`) by a slot and lays their bytes end to end in one numpy array,
which Ray stores out of band with no pickling (and reads back from shared memory without a copy); :func:`unpack`
copies that array once and gives back tensors that are views of it, with the same dtype, shape and bytes: results
are bit-identical to sending the tensors themselves (tests/simulation/test_wire.py).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

#: Every tensor starts at a multiple of this many bytes, so that a view of the buffer as any dtype is aligned.
ALIGN = 16


@dataclass(frozen=True)
class _Slot:
    """Where a tensor was: its place in the buffer, dtype and shape (it comes back on the CPU; the receiver moves it
    to its device, as it did with the tensors themselves)."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class Packed:
    """A structure whose tensors are :class:`_Slot` s, and the buffer holding their bytes."""

    skeleton: Any
    buffer: np.ndarray


#: Types :func:`_replace` returns as they are without looking further.
_ATOMS = (int, float, str, bool, bytes, type(None))
#: Per dataclass type, the names of its ``init`` fields (what ``dataclasses.replace`` takes).
_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _replace(obj: Any, leaf: type, fn: Callable[[Any], Any]) -> Any:
    """``obj`` with every ``leaf`` inside it (in dicts, lists, tuples and dataclass fields) replaced by ``fn(leaf)``,
    in order."""
    kind = type(obj)
    if kind in _ATOMS:
        return obj
    if kind is dict:
        return {key: _replace(item, leaf, fn) for key, item in obj.items()}
    if isinstance(obj, leaf):
        return fn(obj)
    if isinstance(obj, dict):
        return kind((key, _replace(item, leaf, fn)) for key, item in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return kind(_replace(item, leaf, fn) for item in obj)
    names = _FIELDS.get(kind)
    if names is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(obj) if f.init)
    if names is not None:
        return dataclasses.replace(obj, **{name: _replace(getattr(obj, name), leaf, fn) for name in names})
    return obj


def pack(value: Any) -> Packed:
    """``value`` with its tensors' bytes copied into one uint8 buffer (a GPU tensor's are copied to the CPU there)."""
    tensors: List[Tuple[torch.Tensor, _Slot]] = []
    end = 0

    def slot(tensor: torch.Tensor) -> _Slot:
        nonlocal end
        nbytes = tensor.numel() * tensor.element_size()
        tensors.append((tensor, _Slot(end, nbytes, tensor.dtype, tuple(tensor.shape))))
        end += -(-nbytes // ALIGN) * ALIGN
        return tensors[-1][1]

    skeleton = _replace(value, torch.Tensor, slot)
    buffer = np.zeros(end, dtype=np.uint8)  # the alignment padding too: a packed object's bytes are its tensors' alone
    flat = torch.from_numpy(buffer)
    with torch.no_grad():  # (a tensor that requires grad is copied as its data)
        for tensor, where in tensors:
            if where.nbytes:  # its place in the buffer, as unpack will view it, takes a copy of it: one copy_ call
                # (a non-contiguous or GPU tensor included), where a byte view of a contiguous copy cost 4 calls more
                _typed_view(flat, where).copy_(tensor)
    return Packed(skeleton, buffer)


def unpack(packed: Packed) -> Any:
    """The structure :func:`pack` was given, its tensors CPU views of one private copy of the buffer (the object
    store's memory is read-only and shared)."""
    flat = torch.from_numpy(np.array(packed.buffer, copy=True))

    def view(where: _Slot) -> torch.Tensor:
        if not where.nbytes:  # an empty tensor (a buffer of no bytes cannot be viewed as a wider dtype)
            return torch.empty(where.shape, dtype=where.dtype)
        return _typed_view(flat, where)

    return _replace(packed.skeleton, _Slot, view)


@dataclass(frozen=True)
class PackedTasks:
    """A trainer call's units (``(tasks, batched)`` each, :meth:`~hasfl_ray.simulation.actors.TrainerActor.run`)
    whose tasks' tensors travel in one packed buffer: ``units`` with every task's masks None and its objective's
    attributes (:func:`_plain_state`) taken out, ``state`` per unit, per task, ``(masks, objective attributes)``.

    Pickled one by one, a FIARSE client's dozen bitmasks cost the driver ~0.9 ms and 38 % more bytes, and a
    SCAFFOLD client's correction (``c - c_i``, one view of its flat vector per parameter) 2.5 MB where it holds
    213 KB: torch pickles a view with its whole storage, once per view."""

    units: Any
    state: Packed


def _plain_state(objective: Any) -> bool:
    """Whether ``objective`` pickles as its ``__dict__`` (no ``__getstate__``, ``__reduce__`` or ``__slots__`` of
    its own): then its attributes can travel packed and be set back as pickle would set them."""
    kind = type(objective)
    return (hasattr(objective, "__dict__") and not hasattr(kind, "__slots__")
            and getattr(kind, "__getstate__", object.__getstate__) is object.__getstate__
            and kind.__reduce_ex__ is object.__reduce_ex__ and kind.__reduce__ is object.__reduce__)


def _tensor_state(objective: Any) -> Optional[Dict[str, Any]]:
    """``objective``'s attributes where they can travel packed and hold a tensor (or a dict of them), else None."""
    if not _plain_state(objective):
        return None
    attributes = vars(objective)
    return dict(attributes) if any(isinstance(v, (torch.Tensor, dict)) for v in attributes.values()) else None


def pack_units(units: Any) -> Any:
    """``units`` as a trainer call carries them: a :class:`PackedTasks` where a task holds masks or its objective
    tensors, else as given (nothing copied: most calls carry neither)."""
    states = [[(task.masks, _tensor_state(task.objective)) for task in tasks] for tasks, _ in units]
    if all(masks is None and attributes is None for group in states for masks, attributes in group):
        return units
    stripped = []
    for (tasks, batched), group in zip(units, states):
        light = []
        for task, (_, attributes) in zip(tasks, group):
            shell = task.objective
            if attributes is not None:
                shell = copy.copy(shell)
                shell.__dict__.clear()
            light.append(dataclasses.replace(task, masks=None, objective=shell))
        stripped.append((light, batched))
    return PackedTasks(stripped, pack(states))


def unpack_units(units: Any) -> Any:
    """The units :func:`pack_units` was given (the tasks' tensors CPU views of one private copy of the buffer)."""
    if not isinstance(units, PackedTasks):
        return units
    out = []
    for (tasks, batched), group in zip(units.units, unpack(units.state)):
        for task, (masks, attributes) in zip(tasks, group):
            task.masks = masks
            if attributes is not None:
                task.objective.__dict__.update(attributes)
        out.append((tasks, batched))
    return out


def _typed_view(flat: torch.Tensor, where: _Slot) -> torch.Tensor:
    """The bytes ``where`` names in ``flat`` (a uint8 buffer of a multiple of ALIGN bytes) as a contiguous tensor of
    its dtype and shape: one ``as_strided`` call (a slice, then a view, cost twice as much: ~2.3 us a tensor, ~60
    tensors a digits call)."""
    whole = flat.view(where.dtype)
    return whole.as_strided(where.shape, _strides(where.shape), where.offset // whole.element_size())


@functools.lru_cache(maxsize=1024)
def _strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """The strides, in elements, of a contiguous tensor of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))

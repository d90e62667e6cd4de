"""What one client's round moves and computes at a width — bytes down, bytes up, training MACs of each local step —
from the model's cost table (``hasfl-ray cost``), and the seconds a device takes for it.

A client of width p downloads its width-p sub-model and uploads its update of the same shape, 4 bytes a parameter
(float32), and trains K local epochs of its samples in batches; each sample of a step costs
:data:`TRAIN_FACTOR` x the width-p network's forward MACs (forward, then a backward of twice the forward's MACs).
An algorithm adds what it moves or computes beyond that (``Algorithm.client_cost``: SCAFFOLD's control variates,
FedProx's proximal term, FjORD's distillation passes). docs/clock.md is the model of time in full."""

from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple, Union

import numpy as np

from hasfl_ray.models import build_model
from hasfl_ray.models.depth import depth_names

#: Bytes a parameter moves in each direction (float32).
BYTES_PER_PARAM = 4
#: A training step's MACs per sample in forward MACs: the forward pass (1) and the backward pass (2: the gradients
#: of the activations and of the weights, each about one forward's MACs).
TRAIN_FACTOR = 3
#: Widths whose costs :class:`WidthCosts` keeps (least recently used out): continuous widths are a new width per
#: client, and a long clocked run must not keep one entry for each (issue 46 item 4).
WIDTH_COSTS_KEPT = 1024


class WidthCosts:
    """The cost table of one model at any width: parameters and forward MACs per sample (cached per width)."""

    def __init__(self, model_name: str):
        model = build_model(model_name)
        self.model_name = model_name
        self._model, self._specs = model, model.param_specs()
        self._cache: "OrderedDict[object, Tuple[int, int]]" = OrderedDict()  # width, or (width, depth): an LRU

    def _entry(self, width: float, depth: Optional[int] = None) -> Tuple[int, int]:
        key = float(width) if depth is None else (float(width), int(depth))
        if key in self._cache:
            self._cache.move_to_end(key)
        else:
            while len(self._cache) >= WIDTH_COSTS_KEPT:
                self._cache.popitem(last=False)
            if depth is None:
                self._cache[key] = (sum(spec.numel(width) for spec in self._specs.values()),
                                    int(self._model.macs(width)))
            else:  # a depth sub-model: the parameters it holds, the forward of its stages and exits
                held = depth_names(self._model, depth, self._specs)
                self._cache[key] = (sum(self._specs[name].numel(width) for name in held),
                                    int(build_model(self.model_name, 1.0, depth).macs(width)))
        return self._cache[key]

    def params(self, width: float, depth: Optional[int] = None) -> int:
        """Parameters of the width-``width`` sub-model (``depth``: of its depth sub-model)."""
        return self._entry(width, depth)[0]

    def macs(self, width: float, depth: Optional[int] = None) -> int:
        """Forward multiply-accumulates per sample of the width-``width`` sub-model (``depth``: of its depth
        sub-model, every exit up to it)."""
        return self._entry(width, depth)[1]

    def model_bytes(self, width: float, depth: Optional[int] = None) -> int:
        """Bytes of the width-``width`` sub-model (or of an update of its shape): 4 a parameter."""
        return BYTES_PER_PARAM * self.params(width, depth)

    def masked_bytes(self, held: Mapping[str, int]) -> int:
        """Bytes of a masked sub-model (``Algorithm.parameter_masks``) or of its update: 4 a held value and
        ceil(numel / 8) of bitmask per masked parameter (``held``: name -> coordinates held), 4 a parameter of the
        others, which travel whole."""
        total = 0
        for name, spec in self._specs.items():
            numel = spec.numel(1.0)
            total += BYTES_PER_PARAM * held[name] + -(-numel // 8) if name in held else BYTES_PER_PARAM * numel
        return total


#: Bytes of one entry of an index list as an index-set sub-model carries it (int64, as
#: :class:`~hasfl_ray.aggregation.packed.IndexedUpdate` holds and the wire sends it).
INDEX_BYTES = 8


@functools.lru_cache(maxsize=64)
def index_list_bytes(model_name: str, width: float) -> int:
    """The index lists of a width-``width`` channel-index-set sub-model of ``model_name`` (issue 44 item 1a): per
    parameter, one int64 entry per kept position of every scaled dim (a flattened dim's channel: its ``unit``
    positions), what :meth:`IndexedUpdate.nbytes` counts beyond the held values (4 bytes each, already in
    :meth:`WidthCosts.model_bytes`). Sent down with the sub-model and up with the update."""
    return index_bytes_of(build_model(model_name).param_specs(), width)


def index_bytes_of(specs, width: float) -> int:
    """:func:`index_list_bytes` of the parameters ``specs`` (name -> ParamSpec)."""
    return INDEX_BYTES * sum(dim.sliced(width) for spec in specs.values() for dim in spec.dims if dim.scaled)


def local_batches(samples: int, batch_size: int, epochs: int, steps: Optional[int] = None) -> np.ndarray:
    """The samples of each local step of a client with ``samples`` samples, in order (what local training does:
    each epoch cut into batches of ``batch_size``, a last batch of one sample skipped unless it is the very first
    step, :func:`hasfl_ray.training.workspace.client_batches`); with ``steps`` (``local_steps``) the first ``steps``
    of as many epochs as it takes."""
    if samples <= 0:
        return np.zeros(0, dtype=np.int64)
    if samples == 1:
        return np.ones(1, dtype=np.int64)
    full, rest = divmod(samples, batch_size)
    epoch = [batch_size] * full + ([rest] if rest >= 2 else [])
    if steps is not None:
        return np.array((epoch * -(-steps // len(epoch)))[:steps], dtype=np.int64)
    return np.array(epoch * epochs, dtype=np.int64)


@dataclass(frozen=True)
class ClientCost:
    """One client's round at one width, before its device turns it into seconds.

    Attributes:
        width: the width it trains.
        bytes_down: bytes it downloads (its sub-model, and whatever its algorithm sends along).
        bytes_up: bytes it uploads (its update, and whatever its algorithm sends back).
        batches: samples in each local step, int64 (steps,).
        step_macs: training MACs of each local step, int64 (steps,).
    """

    width: float
    bytes_down: int
    bytes_up: int
    batches: np.ndarray
    step_macs: np.ndarray

    @property
    def steps(self) -> int:
        return len(self.step_macs)

    def plus(self, bytes_down: int = 0, bytes_up: int = 0,
             step_macs: Union[int, np.ndarray] = 0) -> "ClientCost":
        """This cost with more bytes each way and more MACs per step (a number for every step, or one per step)."""
        return dataclasses.replace(self, bytes_down=self.bytes_down + int(bytes_down),
                                   bytes_up=self.bytes_up + int(bytes_up),
                                   step_macs=self.step_macs + np.asarray(step_macs, dtype=np.int64))


def base_cost(costs: WidthCosts, width: float, samples: int, batch_size: int, epochs: int,
              steps: Optional[int] = None, depth: Optional[int] = None,
              held: Optional[Mapping[str, int]] = None) -> ClientCost:
    """The cost of a plain client of width ``width`` (no algorithm extras; ``steps``: ``local_steps``; ``depth``: a
    depth sub-model's, what it holds and trains; ``held``: a masked client's held coordinates per masked parameter:
    its bytes each way are :meth:`WidthCosts.masked_bytes`, its MACs the full network's, masked dense layers)."""
    batches = local_batches(samples, batch_size, epochs, steps)
    if held is not None:
        size = costs.masked_bytes(held)
        return ClientCost(float(width), size, size, batches, TRAIN_FACTOR * costs.macs(1.0) * batches)
    size = costs.model_bytes(width, depth)
    return ClientCost(float(width), size, size, batches, TRAIN_FACTOR * costs.macs(width, depth) * batches)


def seconds(cost: ClientCost, speed: float, down: float, up: float, latency: float,
            steps: Optional[int] = None) -> float:
    """A device's seconds for ``cost`` (its first ``steps`` local steps; None: all of them), in this order:
    bytes_down / down + MACs / speed + bytes_up / up + latency."""
    macs = int(cost.step_macs[:steps].sum())
    return cost.bytes_down / down + macs / speed + cost.bytes_up / up + latency


def steps_within(cost: ClientCost, speed: float, down: float, up: float, latency: float, budget: float) -> int:
    """How many of ``cost``'s local steps fit in ``budget`` seconds with the transfers and the latency (0: not even
    the first step); each count k is timed as :func:`seconds` with steps=k times it."""
    cumulative = np.cumsum(cost.step_macs)
    times = cost.bytes_down / down + cumulative / speed + cost.bytes_up / up + latency
    return int(np.searchsorted(times, budget, side="right"))

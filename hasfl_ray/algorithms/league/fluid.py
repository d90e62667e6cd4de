"""FLuID (Wang et al., MLSys 2023): invariant dropout, as iwang05/FLuID's CIFAR-10 strategy computes it.

Source: github.com/iwang05/FLuID, commit 206246d03f2b3880fc76354fa120ab7c16598952,
``CIFAR10/fedDropCIFAR_android.py::FedDropCIFARAndroid`` (``configure_fit``, ``aggregate_fit``, ``find_min``,
``find_stable``, ``drop_dynamic``, ``aggregate_drop``). Rounds ``rnd`` are Flower's, 1-based: hasfl-ray's round t
is rnd = t + 1.

The rule, read from that code (the source's tensors are Keras-layout: a kernel's output is its last axis and its
input the one before; the functions here take PyTorch's layout, output on dim 0 and input on dim 1):

- **A neuron** of a layer is an output channel c: its weights W[c], its bias b[c] and the next layer's inputs from
  it, W'[:, c] (for the last conv before the classifier, W'[:, c·s:(c+1)·s], s = the flattened spatial size: the
  source maps channel c to the classifier rows 16c .. 16c+15).
- **Change** of a weight (``find_min``): r = max over the non-straggler clients of |w_i − w| / |w| (w the round's
  global weight); of a neuron, the max of r over its weights, bias and next-layer inputs. At rnd 2 a layer's
  threshold becomes the smallest neuron change; at rnd 3, the mean of that and the new smallest. The initial
  threshold is 1.5 per layer.
- **Schedule**: after rnd 10 a counter counts rounds; when it reaches 2, every layer not yet stopped gets +0.2 and
  the counter restarts (so +0.2 every second round from rnd 12 while any layer can still move).
- **Invariant neurons** (``find_stable``): a weight is invariant for client i when |w_i − w| <= |θ · w| (θ the
  layer's threshold before the round's calibration: ``aggregate_fit`` calls ``find_stable`` before ``find_min``);
  invariant when it is so for at least 0.75 · (number of clients reporting − number of known stragglers)
  non-straggler clients; a neuron is invariant when all its weights, its bias and all its next-layer
  inputs are. The neurons dropped last round that are still invariant are the *certain* drops.
- **Which neurons a straggler drops** (``drop_dynamic``, every round from rnd 3, for each straggler): D = C −
  int(p · C) of each layer's C neurons (it keeps int(p · C), floor). If at least D certain drops: D of them at random
  (the first layer then stops its threshold's growth). Else if at least D invariant neurons: the certain ones plus
  the rest drawn from the other invariant ones (the layer stops growing). Else: every invariant neuron plus the rest
  drawn from the non-invariant ones. The last conv before the classifier skips the certain-drop step.
- **Stragglers and p**: at rnd 2 the slowest client of the round becomes the straggler, p from the ratio of the
  next-slowest's duration to its: >= 0.9 -> 0.95, >= 0.8 -> 0.85, >= 0.7 -> 0.75, >= 0.6 -> 0.65, else 0.5. Later,
  when the slowest client is not the straggler, the straggler's full-model time is estimated as duration / p · 1.15;
  a slowest client slower than that replaces it (p from the same table), and the next round skips this check.
- **Aggregation** (``aggregate_drop``): the sub-models are zero-filled to the global shapes and averaged with weights
  n_i, each coordinate divided by the examples of the clients that hold it (a coordinate dropped by row or by column
  loses that client's n_i once): the coordinate-wise n_i-weighted mean over the holders.

Departures the source has that hasfl-ray should not copy (kept out of these functions' defaults, documented here):
the last conv's invariance is judged with the threshold of the last fully-connected layer in ``idxList`` (the loop
variable leaks), and its own threshold is never calibrated; the classifier rows of channel c are 16c .. 16c+15,
channel-first, while a Keras Flatten of an NHWC tensor puts channel c at rows c, c + C, ... (in PyTorch's NCHW
the channel-first rows are right).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from hasfl_ray.algorithms.league.common import masked_mean
from hasfl_ray.algorithms.options import FLOAT32_MAX, check_count, check_range
from hasfl_ray.errors import ConfigError
from hasfl_ray.training.seeding import STREAM_ALGORITHM, stream_seed

#: (lower bound of next-slowest / slowest, p): the straggler's sub-model size (``aggregate_fit``).
P_TABLE = ((0.90, 0.95), (0.80, 0.85), (0.70, 0.75), (0.60, 0.65))


@dataclass
class FLuIDOptions:
    fluid_initial_threshold: float = 1.5  # every layer's threshold before calibration (relative change)
    fluid_increment: float = 0.2  # added to each growing layer's threshold
    fluid_increment_after: int = 10  # the counter runs from rnd > this
    fluid_increment_every: int = 2  # rounds between increments
    fluid_quorum: float = 0.75  # fraction of the non-straggler clients a weight must be invariant for
    fluid_time_margin: float = 1.15  # the straggler's full-model time = duration / p * this

    def __post_init__(self) -> None:
        check_range("fluid_initial_threshold", self.fluid_initial_threshold, 0, FLOAT32_MAX, "a number >= 0")
        check_range("fluid_increment", self.fluid_increment, 0, FLOAT32_MAX, "a number >= 0")
        check_count("fluid_increment_after", self.fluid_increment_after, 0, "a round number >= 0")
        check_count("fluid_increment_every", self.fluid_increment_every, 1, "a whole number of rounds >= 1")
        check_range("fluid_quorum", self.fluid_quorum, 0, 1, "a fraction in (0, 1]", low_open=True)
        check_range("fluid_time_margin", self.fluid_time_margin, 0, FLOAT32_MAX, "a number > 0", low_open=True)

    def inert(self, config):
        """Without a device clock no client is timed, so no straggler is replaced by the margin's rule."""
        if config.get("devices"):
            return {}
        return {"fluid_time_margin": ("devices is unset (no clock times the stragglers)", "--devices")}


def relative_change(global_weight: torch.Tensor, client_weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """r = max_i |w_i − w| / |w| per weight (``find_min``'s ``difference``; x/0 is inf and 0/0 NaN, as numpy's)."""
    out = torch.zeros(global_weight.shape, dtype=torch.float64)
    base = global_weight.to(torch.float64)
    for weight in client_weights:
        out = torch.maximum(out, (weight.to(torch.float64) - base).abs() / base.abs())
    return out


def _next_rows(next_tensor: torch.Tensor, neurons: int, spatial: int) -> torch.Tensor:
    """The next layer's per-input-neuron view: (neurons, …) with neuron c's inputs c·s .. (c+1)·s − 1 gathered."""
    if next_tensor.shape[1] != neurons * spatial:
        raise ConfigError(f"the next layer has {next_tensor.shape[1]} inputs; expected {neurons} neurons x {spatial} "
                          "spatial positions")
    moved = next_tensor.transpose(0, 1)  # (inputs, outputs, ...)
    return moved.reshape(neurons, -1)


def neuron_change(weight: torch.Tensor, bias: torch.Tensor, next_weight: torch.Tensor,
                  spatial: int = 1) -> torch.Tensor:
    """Per neuron: the max of a per-weight quantity over its weights, its bias and its next-layer inputs."""
    neurons = weight.shape[0]
    own = weight.reshape(neurons, -1).amax(dim=1)
    follow = _next_rows(next_weight, neurons, spatial).amax(dim=1)
    return torch.maximum(torch.maximum(own, bias), follow)


def smallest_change(changes: torch.Tensor) -> float:
    """``sum[np.argsort(sum)[0]]``: the smallest neuron change, NaN sorted last (NaN only if all are)."""
    finite = changes[~torch.isnan(changes)]
    return float(finite.min()) if finite.numel() else math.nan


def calibrate(rnd: int, current: float, smallest: float) -> float:
    """A layer's threshold after ``find_min`` of round ``rnd``: the smallest change at rnd 2, the mean of the
    threshold and the smallest change at rnd 3, unchanged otherwise."""
    if rnd == 2:
        return smallest
    if rnd == 3:
        return (current + smallest) / 2
    return current


def advance(rnd: int, thresholds: List[float], stopped: List[bool], counter: int,
            options: Optional[FLuIDOptions] = None) -> Tuple[List[float], int]:
    """The start of ``aggregate_fit``: (thresholds, counter) after round ``rnd``'s step of the schedule."""
    options = options or FLuIDOptions()
    thresholds = list(thresholds)
    if rnd > options.fluid_increment_after:
        counter += 1
        if counter >= options.fluid_increment_every:
            for layer, stop in enumerate(stopped):
                if not stop:
                    thresholds[layer] += options.fluid_increment
                    counter = 0
    return thresholds, counter


def invariant_votes(global_weight: torch.Tensor, client_weights: Sequence[torch.Tensor],
                    threshold: float) -> torch.Tensor:
    """Per weight, how many clients left it within |θ · w| of the global weight (``find_stable``'s count)."""
    base = global_weight.to(torch.float64)
    votes = torch.zeros(base.shape, dtype=torch.int64)
    for weight in client_weights:
        votes += ((weight.to(torch.float64) - base).abs() <= (threshold * base).abs()).to(torch.int64)
    return votes


def invariant_neurons(votes_weight: torch.Tensor, votes_bias: torch.Tensor, votes_next: torch.Tensor, voters: float,
                      quorum: float = 0.75, spatial: int = 1) -> List[int]:
    """The neurons whose every weight, bias and next-layer input has at least ``quorum · voters`` votes, ascending.

    ``voters`` is the source's ``len(results) - len(self.straggler)``: the clients reporting less every known
    straggler."""
    need = quorum * voters
    neurons = votes_weight.shape[0]
    own = (votes_weight >= need).reshape(neurons, -1).all(dim=1)
    follow = _next_rows(votes_next >= need, neurons, spatial).all(dim=1)
    return [int(c) for c in torch.nonzero(own & (votes_bias >= need) & follow).reshape(-1)]


def certain_drops(previous: Sequence[int], invariant: Sequence[int]) -> List[int]:
    """``defDropWeights``: last round's dropped neurons that are still invariant, in last round's order."""
    stable = set(invariant)
    return [c for c in previous if c in stable]


def dropped_count(neurons: int, p: float) -> int:
    """D = C − int(p · C): the straggler keeps int(p · C) neurons (floor)."""
    return neurons - int(p * neurons)


def choose_dropped(neurons: int, p: float, invariant: Sequence[int], certain: Sequence[int], rng: random.Random,
                   first_layer: bool = False, last_conv: bool = False,
                   count: Optional[int] = None) -> Tuple[List[int], bool]:
    """``drop_dynamic`` for one layer: (the sorted neurons the straggler drops, whether the layer's threshold stops).

    ``rng`` is a ``random.Random`` (the source draws with the ``random`` module's ``sample``); the same state gives
    the source's draws. ``count``: how many to drop (default :func:`dropped_count`, the source's C − int(p · C))."""
    count = dropped_count(neurons, p) if count is None else int(count)
    if not last_conv and len(certain) >= count:
        return sorted(rng.sample(list(certain), count)), first_layer
    if not last_conv and len(invariant) >= count:
        pool = list(invariant)
        for c in certain:
            pool.remove(c)
        chosen = rng.sample(pool, count - len(certain)) + list(certain)
        return sorted(chosen), True
    if last_conv and len(invariant) >= count:
        return sorted(rng.sample(list(invariant), count)), False
    pool = list(range(neurons))
    for c in invariant:
        pool.remove(c)
    chosen = rng.sample(pool, count - len(invariant)) + list(invariant)
    return sorted(chosen), False


def straggler_fraction(next_slowest: float, slowest: float) -> float:
    """p from next-slowest / slowest duration (the table of ``aggregate_fit``)."""
    ratio = next_slowest / slowest
    for bound, p in P_TABLE:
        if ratio >= bound:
            return p
    return 0.5


def full_time_estimate(duration: float, p: float, margin: float = 1.15) -> float:
    """The straggler's estimated time without dropout: duration / p · margin."""
    return duration / p * margin


@dataclass
class Stragglers:
    """``aggregate_fit``'s straggler bookkeeping: the stragglers in insertion order with their (estimated full-model)
    times, the sub-model size p, and whether the last round replaced a straggler (the next round skips the check)."""

    times: Dict[str, float] = field(default_factory=dict)
    p: float = 0.95
    just_updated: bool = False


def track_stragglers(rnd: int, durations: Sequence[Tuple[str, float]], state: Stragglers,
                     margin: float = 1.15) -> Tuple[Stragglers, List[str]]:
    """The end of ``aggregate_fit`` in round ``rnd``: (the new state, the stragglers dropped from it).

    ``durations`` are the round's (client, seconds) in result order (the sort is stable, as ``list.sort``)."""
    times, p, just_updated, removed = dict(state.times), state.p, state.just_updated, []
    ranked = sorted(durations, key=lambda item: item[1])
    if not times and rnd > 1:
        slowest = ranked[-1]
        times[slowest[0]] = slowest[1]
        p = straggler_fraction(ranked[-2][1], slowest[1])
    elif times and rnd > 1 and not just_updated:
        slowest = ranked[-1]
        if slowest[0] not in times:
            for client, seconds in ranked:
                if client in times:
                    times[client] = full_time_estimate(seconds, p, margin)
            first, first_time = next(iter(times.items()))
            if slowest[1] > first_time:
                times[slowest[0]] = slowest[1]
                p = straggler_fraction(first_time, slowest[1])
                just_updated = True
                del times[first]
                removed.append(first)
    else:
        just_updated = False
    return Stragglers(times, p, just_updated), removed


def held_mask(shape: Sequence[int], dropped_out: Sequence[int] = (), dropped_in: Sequence[int] = (),
              spatial_in: int = 1) -> torch.Tensor:
    """A straggler's held coordinates of a PyTorch-layout tensor (outputs on dim 0, inputs on dim 1): everything but
    the dropped output rows and (2-D and up) the dropped inputs' columns (input c spans c·s .. (c+1)·s − 1)."""
    mask = torch.ones(tuple(shape), dtype=torch.bool)
    if len(dropped_out):
        mask[list(dropped_out)] = False
    if len(dropped_in) and len(shape) > 1:
        columns = [c * spatial_in + k for c in dropped_in for k in range(spatial_in)]
        mask[:, columns] = False
    return mask


def aggregate(global_tensor: torch.Tensor, client_tensors: Sequence[torch.Tensor], held: Sequence[torch.Tensor],
              num_examples: Sequence[int], name: str = "the parameter") -> torch.Tensor:
    """``aggregate_drop`` for one tensor: the n_i-weighted mean over the clients holding each coordinate."""
    return masked_mean(global_tensor, client_tensors, held, [float(n) for n in num_examples], name)


def draws(seed: int, rnd: int, client: int) -> random.Random:
    """The ``random.Random`` of one straggler's draws in round ``rnd``: the algorithm stream keyed by (seed, rnd,
    client), so the draws do not depend on the backend or the order clients are handled in."""
    return random.Random(stream_seed(int(seed), STREAM_ALGORITHM, int(rnd), int(client)))


__all__ = ["FLuIDOptions", "P_TABLE", "Stragglers", "advance", "aggregate", "calibrate", "certain_drops", "choose_dropped",
           "draws", "dropped_count", "full_time_estimate", "held_mask", "invariant_neurons", "invariant_votes",
           "neuron_change", "relative_change", "smallest_change", "straggler_fraction", "track_stragglers"]

"""FLuID (Wang et al., MLSys 2023) as a run's algorithm (``--algorithm fluid``): invariant dropout, the rules of
:mod:`hasfl_ray.algorithms.league.fluid` (transcribed from iwang05/FLuID at a named commit and tested there) wired onto
the channel index sets (:mod:`hasfl_ray.models.index_slicing`).

A round t here is the source's rnd = t + 1. Every round:

1. ``allocate``: a non-straggler trains the full model (width 1); a straggler, from rnd 3 on, trains width p on the
   channels it keeps: per channel group (a neuron is a group's channel: a conv's output channel with its bias, its
   norm's weight and bias and the next layer's inputs from it; on a ResNet a stage's residual stream or a block's
   inner activation), ``choose_dropped`` drops C − ceil(p · C) channels (hasfl-ray's width rule; the source keeps
   int(p · C)): its last drops still invariant first (a straggler that replaced another inherits that one's: the
   source keeps one list, ``prevDropWeights``), then other invariant channels, then any, drawn from the
   algorithm stream keyed by (seed, rnd, client). The kept channels go out through ``channel_sets``.
2. ``inspect_updates`` (before ``observe``, with w^t and the accepted updates): the threshold schedule (``advance``),
   the invariant channels (every weight of the channel within |θ · w| for at least ``fluid_quorum`` of the
   non-straggler clients reporting, θ the group's threshold as it stands: the source's ``find_stable`` runs before
   ``find_min``), then each group's channel change max_i |w_i − w| / |w| over the non-stragglers' trained weights
   (calibration at rnd 2 and 3: the smallest change), and the stragglers: with a device population the round's
   clients timed by the device clock at the width they trained (``track_stragglers``: the slowest at rnd 2, p from
   the next-slowest's ratio, re-chosen as the source re-chooses); without one, every client of the lowest p^max (if
   below 1) is a straggler with p = that p^max, from the start (a departure: the source times real runs).
3. Aggregation: the coordinate-wise n_i-weighted mean over the clients holding each coordinate (the default weights,
   the index layout through the fused kernel), the source's ``aggregate_drop``.

State (thresholds, stopped flags, counter, stragglers with their times and p, invariant channels, each straggler's
last drops) is in ``state_dict``: a resumed run continues bit for bit. Runs in rounds only.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.config.sparse_mix import check_sparse_config
from hasfl_ray.algorithms.league import fluid as rules
from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import register_algorithm

#: The source's initial p (``self.p``) before a straggler is chosen.
INITIAL_P = 0.95


def _per_channel(tensor: torch.Tensor, dim: int, channels: int) -> torch.Tensor:
    """``tensor`` viewed as (channels, everything else) along ``dim`` (a flattened dim's channel c covers its
    consecutive positions)."""
    return tensor.movedim(dim, 0).reshape(channels, -1)


class ChannelLayout:
    """The model's channel groups as FLuID reads them: per group its channel count and the (parameter, dim) slices
    whose channels are its neurons; the first group and the group feeding the classifier (the source's last conv)."""

    def __init__(self, model_name: str):
        from hasfl_ray.models import build_model
        from hasfl_ray.models.index_slicing import channel_groups

        specs = build_model(model_name).param_specs()
        try:
            groups, self.sizes = channel_groups(specs)
        except ValueError as error:
            reason = str(error).split(";")[0]  # its first clause: the sentence stays one short line
            raise ConfigError(f"algorithm fluid needs a model of channel groups (a CNN, MLP or ResNet); "
                              f"model {model_name!r} is not one: {reason}") from None
        self.slices: List[List[Tuple[str, int]]] = [[] for _ in self.sizes]
        for (name, dim), group in groups.items():
            self.slices[group].append((name, dim))
        flattened = [group for (name, dim), group in groups.items() if dim == 1 and specs[name].dims[1].unit > 1]
        inputs = [group for (name, dim), group in groups.items() if dim == 1 and (name, 0) not in groups]
        self.last_conv = flattened[-1] if flattened else (inputs[-1] if inputs else len(self.sizes) - 1)


@register_algorithm("fluid")
class FLuID(Algorithm):
    """Invariant dropout (module docstring); options: :class:`~hasfl_ray.algorithms.league.fluid.FLuIDOptions`."""

    options_class = rules.FLuIDOptions

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        if getattr(config, "mode", "sync") == "async":
            raise ConfigError(f"algorithm fluid runs in rounds and mode is {config.mode!r}; expected mode sync "
                              "(its stragglers, thresholds and drops are the source's per-round bookkeeping)")
        check_sparse_config(config, "fluid", "channel index sets")  # before anything runs
        self.thresholds: Optional[List[float]] = None
        self.stopped: Optional[List[bool]] = None
        self.counter = 0
        self.stragglers = rules.Stragglers(p=INITIAL_P)
        self.invariant: Optional[List[List[int]]] = None
        self.previous: Dict[int, List[List[int]]] = {}
        self._layout: Optional[ChannelLayout] = None
        self._sets: Dict[int, List[List[int]]] = {}
        self.p_current = self.capacity_allocation(self.p_max)

    def capacity_allocation(self, p_max: np.ndarray) -> np.ndarray:
        """A client's width before its first round: the full model, what a non-straggler trains (clients.csv's
        ``p_final`` for a client that never took part; :meth:`observe` keeps each participant's own)."""
        return np.ones_like(np.asarray(p_max, dtype=np.float64))

    def check_model(self, widths) -> None:
        """Refuse a model without channel groups (an LSTM, a model with exits) before anything is written."""
        ChannelLayout(self.model_name)

    # -- who is a straggler ----------------------------------------------------------------------------------------

    def layout(self) -> ChannelLayout:
        if self._layout is None:
            self._layout = ChannelLayout(self.model_name)
            if self.thresholds is None:
                self.thresholds = [float(self.options.fluid_initial_threshold)] * len(self._layout.sizes)
                self.stopped = [False] * len(self._layout.sizes)
        return self._layout

    def straggler_widths(self) -> Dict[int, float]:
        """Client -> p of every known straggler: the device clock's (``track_stragglers``), or without a device
        population every client of the lowest p^max when that is below 1."""
        if self.clock is not None:
            return {int(client): float(self.stragglers.p) for client in self.stragglers.times}
        lowest = float(self.p_max.min()) if len(self.p_max) else 1.0
        if lowest >= 1.0:
            return {}
        return {int(i): lowest for i in np.flatnonzero(self.p_max == lowest)}

    # -- a round ---------------------------------------------------------------------------------------------------

    def allocate(self, round: int, participants: Sequence[int]) -> Dict[int, float]:
        layout, rnd = self.layout(), round + 1
        stragglers = self.straggler_widths() if rnd >= 3 else {}
        self._sets = {}
        widths = {}
        for client in participants:
            p = stragglers.get(int(client))
            if p is None:
                widths[client] = 1.0
                continue
            widths[client] = p
            self._sets[int(client)] = self._drop(layout, rnd, int(client), p)
        return widths

    def _drop(self, layout: ChannelLayout, rnd: int, client: int, p: float) -> List[List[int]]:
        """``drop_dynamic`` for straggler ``client`` of width ``p`` in ``rnd``: its kept channels per group (and its
        drops remembered, the stopped flags set)."""
        from hasfl_ray.models.slicing import width_channels

        rng = rules.draws(self.config.seed, rnd, client)
        previous = self.previous.get(client)
        kept, dropped_all = [], []
        for group, size in enumerate(layout.sizes):
            invariant = self.invariant[group] if self.invariant is not None else []
            certain = rules.certain_drops(previous[group], invariant) if previous is not None else []
            dropped, stop = rules.choose_dropped(size, p, invariant, certain, rng, first_layer=group == 0,
                                                 last_conv=group == layout.last_conv,
                                                 count=size - width_channels(p, size))
            if stop:
                self.stopped[group] = True
            dropped_all.append(dropped)
            gone = set(dropped)
            kept.append([c for c in range(size) if c not in gone])
        self.previous[client] = dropped_all
        return kept

    def channel_sets(self, round: int, client: int, width: float) -> Optional[List[List[int]]]:
        return self._sets.get(int(client))

    def inspect_updates(self, round: int, global_params: Dict[str, torch.Tensor], results: Sequence[Any]) -> None:
        layout, rnd, options = self.layout(), round + 1, self.options
        self.thresholds, self.counter = rules.advance(rnd, self.thresholds, self.stopped, self.counter, options)
        known = set(self.straggler_widths())
        voters = [r for r in results if r.client not in known and r.client not in self._sets]
        if voters:
            trained = [{name: global_params[name] + update for name, update in r.update.items()} for r in voters]
            changes: Dict[str, torch.Tensor] = {}
            invariant = []
            for group, size in enumerate(layout.sizes):
                change = None
                for name, dim in layout.slices[group]:
                    if name not in changes:
                        changes[name] = rules.relative_change(global_params[name], [w[name] for w in trained])
                    per = _per_channel(changes[name], dim, size).amax(dim=1)
                    change = per if change is None else torch.maximum(change, per)
                need = options.fluid_quorum * len(voters)
                held = torch.ones(size, dtype=torch.bool)
                for name, dim in layout.slices[group]:  # find_stable, with the threshold before this round's find_min
                    votes = rules.invariant_votes(global_params[name], [w[name] for w in trained],
                                                  self.thresholds[group])
                    held &= _per_channel(votes >= need, dim, size).all(dim=1)
                invariant.append([int(c) for c in torch.nonzero(held).reshape(-1)])
                self.thresholds[group] = rules.calibrate(rnd, self.thresholds[group], rules.smallest_change(change))
            self.invariant = invariant
        if self.clock is not None:
            durations = [(int(r.client), float(self.round_seconds(round, r.client, r.width))) for r in results]
            if len(durations) >= 2:  # the source ranks a round's slowest against the next-slowest
                before = set(self.stragglers.times)
                self.stragglers, removed = rules.track_stragglers(rnd, durations, self.stragglers,
                                                                  options.fluid_time_margin)
                added = [int(c) for c in self.stragglers.times if c not in before]
                for client in removed:  # the source's last drops are one list per layer (prevDropWeights), which a
                    drops = self.previous.pop(int(client), None)  # replacement leaves: the new straggler inherits
                    for new in added if drops is not None else ():
                        self.previous[new] = drops

    def set_capacities(self, round: int, p_max: np.ndarray) -> None:
        """Dynamic width assignment: the new capacities (a straggler without a clock is of the lowest), each client's
        ``p_current`` kept: the width of its last participation, which FLuID chose, not a capacity."""
        self.p_max = np.asarray(p_max, dtype=np.float64).copy()

    def observe(self, round: int, results: Sequence[Any], aggregate: Any) -> None:
        """Each accepted participant's width this round (1, or its p as a straggler) becomes its ``p_current``: its
        p at its last participation, clients.csv's ``p_final`` and the width its local accuracy is scored at
        (docs/metrics.md), not its p^max, which FLuID does not train at."""
        for result in results:
            self.p_current[int(result.client)] = float(result.width)

    # -- state -----------------------------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "fluid": {
            "thresholds": None if self.thresholds is None else [float(x) for x in self.thresholds],
            "stopped": None if self.stopped is None else [bool(x) for x in self.stopped],
            "counter": int(self.counter),
            "times": {str(c): float(s) for c, s in self.stragglers.times.items()},
            "p": float(self.stragglers.p), "just_updated": bool(self.stragglers.just_updated),
            "invariant": None if self.invariant is None else [list(map(int, g)) for g in self.invariant],
            "previous": {str(c): [list(map(int, g)) for g in drops] for c, drops in self.previous.items()}}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        mine = state["fluid"]
        self.thresholds = None if mine["thresholds"] is None else [float(x) for x in mine["thresholds"]]
        self.stopped = None if mine["stopped"] is None else [bool(x) for x in mine["stopped"]]
        self.counter = int(mine["counter"])
        self.stragglers = rules.Stragglers({int(c): float(s) for c, s in mine["times"].items()}, float(mine["p"]),
                                           bool(mine["just_updated"]))
        self.invariant = None if mine["invariant"] is None else [list(map(int, g)) for g in mine["invariant"]]
        self.previous = {int(c): [list(map(int, g)) for g in drops] for c, drops in mine["previous"].items()}

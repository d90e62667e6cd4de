"""When each client is available: always, per a trace's intervals, or a seeded two-state Markov model.

Every model answers per client and lazily — :meth:`Availability.window` says whether a client is available at a
simulated time and until when — so sampling K available clients of a million checks O(K) clients, never all of
them. Every answer is a pure function of (seed, client, time): nothing needs checkpointing, and the order in which
clients are asked changes nothing (the Markov model's per-client cache only saves recomputing)."""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np

from hasfl_ray.training.seeding import STREAM_AVAILABILITY, numpy_rng

INF = math.inf


class Availability:
    """Always available (the default without availability intervals or a Markov model)."""

    always = True

    def window(self, client: int, time: float) -> Tuple[bool, float]:
        """(whether ``client`` is available at ``time``, the time its availability ends: infinity when it never
        does; meaningless when it is not available)."""
        return True, INF

    def next_on(self, client: int, time: float) -> float:
        """The earliest time >= ``time`` at which ``client`` is available."""
        return time


class TraceAvailability(Availability):
    """A trace's on-intervals per client (CSR: ``offsets``, ``starts``, ``ends``), repeating every ``period``
    seconds; a client without intervals is always available. An interval is half-open, [start, end)."""

    always = False

    def __init__(self, offsets: np.ndarray, starts: np.ndarray, ends: np.ndarray, period: float):
        self.offsets, self.starts, self.ends, self.period = offsets, starts, ends, float(period)

    def _spans(self, client: int) -> Tuple[np.ndarray, np.ndarray]:
        low, high = self.offsets[client], self.offsets[client + 1]
        return self.starts[low:high], self.ends[low:high]

    def window(self, client: int, time: float) -> Tuple[bool, float]:
        starts, ends = self._spans(client)
        if not len(starts):
            return True, INF
        cycle = math.floor(time / self.period)
        within = time - cycle * self.period
        k = int(np.searchsorted(ends, within, side="right"))  # the first interval ending after `within`
        if k == len(starts) or starts[k] > within:
            return False, time
        until = cycle * self.period + float(ends[k])
        if ends[k] == self.period and starts[0] == 0.0:  # on across the wrap: into the next cycle's first interval
            until += float(ends[0]) if len(starts) > 1 or ends[0] < self.period else INF
        return True, until

    def next_on(self, client: int, time: float) -> float:
        available, _ = self.window(client, time)
        if available:
            return time
        starts, ends = self._spans(client)
        cycle = math.floor(time / self.period)
        within = time - cycle * self.period
        k = int(np.searchsorted(starts, within, side="right"))
        return cycle * self.period + float(starts[k]) if k < len(starts) else (cycle + 1) * self.period + float(starts[0])


class MarkovAvailability(Availability):
    """A two-state (on/off) continuous-time Markov chain per client: exponential on and off periods of means
    ``mean_on`` and ``mean_off`` seconds, started in its stationary state (on with probability
    mean_on / (mean_on + mean_off)) at time 0. Client i's chain is drawn from its own stream
    ``rng(seed, STREAM_AVAILABILITY, i)``: a uniform for the first state, then standard exponentials in blocks of
    :attr:`BLOCK`, as far as the times asked need (so the chain never depends on what else was asked)."""

    always = False
    BLOCK = 64

    def __init__(self, mean_on: float, mean_off: float, seed: int):
        self.mean_on, self.mean_off, self.seed = float(mean_on), float(mean_off), int(seed)
        # client -> (its generator, whether its first period is on, the times its state changes, ascending)
        self._chains: Dict[int, Tuple[np.random.Generator, bool, np.ndarray]] = {}

    def _changes(self, client: int, time: float) -> Tuple[bool, np.ndarray]:
        """(whether client's first period is on, its change times, drawn at least past ``time``)."""
        chain = self._chains.get(client)
        if chain is None:
            rng = numpy_rng(self.seed, STREAM_AVAILABILITY, client)
            chain = (rng, bool(rng.random() < self.mean_on / (self.mean_on + self.mean_off)), np.empty(0))
        rng, first_on, changes = chain
        while not len(changes) or changes[-1] <= time:
            done = len(changes)
            on = (np.arange(done, done + self.BLOCK) % 2 == 0) == first_on  # period j's state
            lengths = rng.standard_exponential(self.BLOCK) * np.where(on, self.mean_on, self.mean_off)
            changes = np.concatenate([changes, (changes[-1] if done else 0.0) + np.cumsum(lengths)])
        self._chains[client] = (rng, first_on, changes)
        return first_on, changes

    def window(self, client: int, time: float) -> Tuple[bool, float]:
        first_on, changes = self._changes(client, time)
        k = int(np.searchsorted(changes, time, side="right"))  # changes at or before `time`
        on = first_on == (k % 2 == 0)
        return (True, float(changes[k])) if on else (False, time)

    def next_on(self, client: int, time: float) -> float:
        first_on, changes = self._changes(client, time)
        k = int(np.searchsorted(changes, time, side="right"))
        return time if first_on == (k % 2 == 0) else float(changes[k])


def make_availability(name: Optional[str], intervals, seed: int) -> Availability:
    """The availability model of config ``availability`` (normalised) for profiles whose trace gave ``intervals``
    (or None): None means the trace's intervals when it gives them, else always available."""
    from hasfl_ray.clock.spec import parse_markov

    if name is not None and name.startswith("markov"):
        on, off = parse_markov(name)
        return MarkovAvailability(on, off, seed)
    if name in (None, "trace") and intervals is not None:
        return TraceAvailability(*intervals)
    return Availability()

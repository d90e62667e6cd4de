"""When each client is available: always, per a trace's intervals, or a seeded two-state Markov model.

Every model answers per client and lazily — :meth:`Availability.window` says whether a client is available at a
simulated time and until when — so sampling K available clients of a million checks O(K) clients, never all of
them. Every answer is a pure function of (seed, client, time): nothing needs checkpointing, and the order in which
clients are asked changes nothing (the Markov model's per-client cache only saves recomputing)."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, List, Optional, Tuple

import numpy as np

from hasfl_ray.errors import RoundInterrupted
from hasfl_ray.training.seeding import STREAM_AVAILABILITY, numpy_rng

INF = math.inf

#: A long loop of the clock (a Markov chain drawn far ahead, a scan of every client) asks whether a stop was
#: requested once per this many iterations.
STOP_CHECK_EVERY = 1024


def never() -> bool:
    """The stop check of a clock no run watches (a benchmark's, a test's): never."""
    return False


def wait_until(now: float, time: float) -> float:
    """The wait from ``now`` to ``time`` as the clock adds it (``now + wait``): ``time - now``, one ulp longer where
    that sum would round to just before ``time`` (a client that ``next_on`` says is on at ``time`` is on then)."""
    wait = time - now
    for _ in range(4):  # a rounded difference is off by at most an ulp or two
        if now + wait >= time:
            break
        wait = math.nextafter(wait, INF)
    return wait


class Availability:
    """Always available (the default without availability intervals or a Markov model)."""

    always = True
    #: Asked in long loops; the engine sets it to its stop signals' ``requested`` (:meth:`Clock.stop_when`).
    should_stop = staticmethod(never)

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

    def _cycle(self, time: float) -> Tuple[int, float]:
        """(the cycle ``time`` falls in, the time that cycle begins): the one place the phase is computed. An
        interval's bounds are the times ``begin + start`` and ``begin + end``, and both :meth:`window` and
        :meth:`next_on` compare ``time`` with those sums, never ``time - begin`` with the bounds: the two differ in
        the last bit for fractional bounds (1.9 - 1.0 is 0.8999999999999999), and then the time ``next_on`` gives
        would not be on by ``window``'s reckoning, nor a window's end after the time it is asked at (the clock
        waited for ever)."""
        cycle = math.floor(time / self.period)
        if time < cycle * self.period:  # the quotient rounded up to the next cycle
            cycle -= 1
        elif time >= (cycle + 1) * self.period:  # or down to the one before
            cycle += 1
        return cycle, cycle * self.period

    def window(self, client: int, time: float) -> Tuple[bool, float]:
        starts, ends = self._spans(client)
        if not len(starts):
            return True, INF
        _, begin = self._cycle(time)
        k = int(np.searchsorted(begin + ends, time, side="right"))  # the first interval ending after `time`
        if k == len(starts) or begin + float(starts[k]) > time:
            return False, time
        until = begin + float(ends[k])  # > time: on is never "until now"
        if ends[k] == self.period and starts[0] == 0.0:  # on across the wrap: into the next cycle's first interval
            until += float(ends[0]) if len(starts) > 1 or ends[0] < self.period else INF
        return True, until

    def next_on(self, client: int, time: float) -> float:
        """The first start after ``time`` where ``client`` is off then: always later than ``time``, so a wait for it
        moves on."""
        available, _ = self.window(client, time)
        if available:
            return time
        starts, _ = self._spans(client)
        cycle, begin = self._cycle(time)
        k = int(np.searchsorted(begin + starts, time, side="right"))
        return begin + float(starts[k]) if k < len(starts) else (cycle + 1) * self.period + float(starts[0])


    def longest_on(self) -> np.ndarray:
        """Per client, its longest stretch on in seconds (an interval ending at the period joined with one starting
        at 0; infinity for a client always on)."""
        counts = np.diff(self.offsets)
        longest = np.full(len(counts), INF)
        has = counts > 0
        if not has.any():
            return longest
        lengths = self.ends - self.starts
        firsts, lasts = self.offsets[:-1][has], self.offsets[1:][has] - 1
        best = np.maximum.reduceat(lengths, firsts)  # each client's intervals are one run of the arrays
        wrap = (self.ends[lasts] == self.period) & (self.starts[firsts] == 0.0)
        best = np.where(wrap, np.maximum(best, lengths[lasts] + lengths[firsts]), best)
        best[wrap & (counts[has] == 1)] = INF  # on from 0 to the period: always
        longest[has] = best
        return longest


class MarkovAvailability(Availability):
    """A two-state (on/off) continuous-time Markov chain per client: exponential on and off periods of means
    ``mean_on`` and ``mean_off`` seconds, started in its stationary state (on with probability
    mean_on / (mean_on + mean_off)) at time 0. Client i's chain is drawn from its own stream
    ``rng(seed, STREAM_AVAILABILITY, i)``: a uniform for the first state, then standard exponentials in blocks of
    :attr:`BLOCK`, as far as the times asked need (so the chain never depends on what else was asked).

    Memory stays bounded however long the run and however many clients are asked: a chain keeps its change times
    from just before the last time asked (the clock only moves forward; a time before them draws the chain again
    from its stream, the same values), and at most :attr:`MAX_CHAINS` chains are kept, the least recently asked
    dropped first (drawn again from their streams if asked again)."""

    always = False
    BLOCK = 64
    MAX_CHAINS = 100_000

    def __init__(self, mean_on: float, mean_off: float, seed: int):
        self.mean_on, self.mean_off, self.seed = float(mean_on), float(mean_off), int(seed)
        # client -> [its generator, whether its first period is on, how many change times were dropped, the change
        # times kept after them (ascending, absolute seconds)]
        self._chains: "OrderedDict[int, List[Any]]" = OrderedDict()

    def _fresh(self, client: int) -> List[Any]:
        rng = numpy_rng(self.seed, STREAM_AVAILABILITY, client)
        return [rng, bool(rng.random() < self.mean_on / (self.mean_on + self.mean_off)), 0, np.empty(0)]

    def _state(self, client: int, time: float) -> Tuple[bool, float]:
        """(whether ``client`` is on at ``time``, the time of its next change after ``time``)."""
        chain = self._chains.pop(client, None)
        if chain is None or (chain[2] and time < chain[3][0]):  # new, dropped, or asked before what it kept
            chain = self._fresh(client)
        rng, first_on, dropped, changes = chain
        blocks = 0
        while not len(changes) or changes[-1] <= time:
            if len(changes) > self.BLOCK:  # all at or before `time`: the last one is all a later answer needs
                dropped, changes = dropped + len(changes) - 1, changes[-1:]  # (linear, never quadratic, in far)
            done = dropped + len(changes)
            on = (np.arange(done, done + self.BLOCK) % 2 == 0) == first_on  # period j's state
            lengths = rng.standard_exponential(self.BLOCK) * np.where(on, self.mean_on, self.mean_off)
            changes = np.concatenate([changes, (changes[-1] if done else 0.0) + np.cumsum(lengths)])
            blocks += 1
            if blocks % STOP_CHECK_EVERY == 0 and self.should_stop():  # a chain drawn far ahead: minutes
                raise RoundInterrupted(f"stopped while client {client}'s availability was drawn")
        k = int(np.searchsorted(changes, time, side="right"))  # changes at or before `time`
        on, following = first_on == ((dropped + k) % 2 == 0), float(changes[k])
        if k > self.BLOCK:  # keep the change just before `time` and those after it
            dropped, changes = dropped + k - 1, changes[k - 1:]
        chain[2:] = [dropped, changes]
        self._chains[client] = chain
        while len(self._chains) > self.MAX_CHAINS:
            self._chains.popitem(last=False)
        return on, following

    def window(self, client: int, time: float) -> Tuple[bool, float]:
        on, following = self._state(client, time)
        return (True, following) if on else (False, time)

    def next_on(self, client: int, time: float) -> float:
        on, following = self._state(client, time)
        return time if on else following


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

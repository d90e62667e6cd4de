"""The simulated clock of a run with a device population: who is invited, when each update would arrive, what the
deadline keeps, how long the round takes, and what moved.

The engine asks it, in the driver, every round (so every backend and actor count gets the same clock by
construction): :meth:`Clock.invite` (the round's invitations among the available clients), then
:meth:`Clock.settle` with each invited client's width and :class:`~hasfl_ray.clock.cost.ClientCost` (which clients
the round keeps, how many local steps a partial client does, the round's time and bytes), then
:meth:`Clock.advance`. Its random draws (invitations, dropouts) come from its own streams keyed by round, so they
never shift a training stream. docs/clock.md is the model in words."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from hasfl_ray.clock.availability import STOP_CHECK_EVERY, Availability, never, wait_until
from hasfl_ray.clock.cost import ClientCost, WidthCosts, base_cost, seconds, steps_within
from hasfl_ray.clock.profiles import DeviceProfiles
from hasfl_ray.errors import RoundInterrupted
from hasfl_ray.training.seeding import STREAM_CLOCK, numpy_rng

INF = math.inf

#: The sub-streams of ``rng(seed, STREAM_CLOCK, round, kind)``.
INVITATIONS, DROPOUTS = 0, 1

#: Invitations give up drawing at random after this many distinct candidates per client wanted (plus
#: :data:`DRAW_SLACK`) and scan every client instead (docs/clock.md: when fewer than K are available).
DRAWS_PER_CLIENT, DRAW_SLACK = 100, 1000


@dataclass
class Invitation:
    """A round's invited clients (sorted), how many candidates were found unavailable, and the seconds the server
    waited before anyone was available."""

    clients: List[int]
    unavailable: int = 0
    idle_s: float = 0.0


@dataclass
class RoundOutcome:
    """What the clock decided for one round.

    Attributes:
        kept: the clients whose updates are aggregated (sorted).
        steps: the local steps of each kept client cut short by the deadline (``partial``), client -> steps.
        round_time: seconds from the round's start to its end (the last kept update, or the deadline).
        bytes_down: bytes every invited client downloaded.
        bytes_up: bytes the kept clients uploaded.
        late: clients whose update came too late (after the deadline; under ``overselect`` also after the first K).
        dropped: clients that dropped out mid-round (``dropout``, or their availability ended).
        arrivals: seconds after the round's start at which each update that was sent arrives (kept and late
            clients; a partial client's after its last step): what an asynchronous server would schedule by.
        stops: seconds after the round's start at which each invited client stops: its arrival, or the moment it
            dropped out.
    """

    kept: List[int]
    steps: Dict[int, int]
    round_time: float
    bytes_down: int
    bytes_up: int
    late: List[int] = field(default_factory=list)
    dropped: List[int] = field(default_factory=list)
    arrivals: Dict[int, float] = field(default_factory=dict)
    stops: Dict[int, float] = field(default_factory=dict)


class Clock:
    """A run's simulated clock (see the module docstring).

    Args:
        profiles: every client's device.
        availability: when each client is available.
        costs: the model's cost table.
        num_samples: n_i per client.
        batch_size, local_epochs: the local protocol.
        seed: the run's seed (the clock's streams derive from it).
        deadline: seconds (None: none).
        policy: ``drop``, ``partial`` or ``overselect``.
        overselect: the fraction F of ``overselect`` (None otherwise).
        dropout: the probability an invited client drops out mid-round.
    """

    def __init__(self, profiles: DeviceProfiles, availability: Availability, costs: WidthCosts,
                 num_samples: np.ndarray, batch_size: int, local_epochs: int, seed: int,
                 deadline: Optional[float] = None, policy: str = "drop", overselect: Optional[float] = None,
                 dropout: float = 0.0, local_steps: Optional[int] = None):
        self.profiles, self.availability, self.costs = profiles, availability, costs
        self.local_steps = local_steps  # a fixed number of local iterations in place of local_epochs
        self.num_samples = num_samples
        self.batch_size, self.local_epochs, self.seed = batch_size, local_epochs, seed
        self.deadline, self.policy, self.overselect, self.dropout = deadline, policy, overselect, dropout
        n = len(profiles)
        self.now = 0.0
        self.busy = np.zeros(n, dtype=np.float64)  # seconds each client worked in the rounds it took part in
        self.waiting = np.zeros(n, dtype=np.float64)  # seconds each client waited for its rounds to end
        self.invited = np.zeros(n, dtype=bool)  # whether each client was ever invited
        self.should_stop = never  # asked in the long loops: a scan of every client, a Markov chain drawn far

    def stop_when(self, requested) -> None:
        """Ask ``requested()`` (the run's stop signals) in the clock's long loops: a scan of every client for an
        available one, a Markov chain drawn far ahead. When it answers True they raise
        :class:`~hasfl_ray.errors.RoundInterrupted`; nothing of the clock's state has changed by then."""
        self.should_stop = self.availability.should_stop = requested

    @property
    def num_clients(self) -> int:
        return len(self.profiles)

    # -- what an algorithm may ask (Algorithm.clock) -------------------------------------------------------------

    def profile(self, client: int) -> Dict[str, float]:
        """Client ``client``'s device: speed_macs_per_s, down_bytes_per_s, up_bytes_per_s, latency_s."""
        return self.profiles.row(client)

    def base_cost(self, client: int, width: float, depth: Optional[int] = None,
                  held: Optional[Mapping[str, int]] = None) -> ClientCost:
        """Client ``client``'s round at ``width`` without algorithm extras (``Algorithm.client_cost`` adds them);
        ``depth``: its depth sub-model's (:mod:`hasfl_ray.models.depth`); ``held``: a masked client's held
        coordinates per masked parameter (:func:`~hasfl_ray.clock.cost.base_cost`)."""
        return base_cost(self.costs, width, int(self.num_samples[client]), self.batch_size, self.local_epochs,
                         self.local_steps, depth, held)

    def seconds(self, client: int, cost: ClientCost, steps: Optional[int] = None) -> float:
        """Client ``client``'s seconds for ``cost`` (its first ``steps`` local steps; None: all)."""
        p = self.profiles
        return seconds(cost, p.speed[client], p.down[client], p.up[client], p.latency[client], steps)

    # -- the round ------------------------------------------------------------------------------------------------

    def invitations(self, per_round: int) -> int:
        """How many clients a round invites: K, or ceil((1 + F) K) under ``overselect`` (at most every client)."""
        if self.policy == "overselect":
            return min(self.num_clients, math.ceil((1 + self.overselect) * per_round - 1e-9))
        return per_round

    def invite(self, round: int, per_round: int) -> Optional[Invitation]:
        """Round ``round``'s invitations at the current simulated time, or None when the run's usual draw applies
        (every client always available and K invited: the participants are those of a run without a clock).

        Otherwise candidates are drawn uniformly with ``rng(seed, STREAM_CLOCK, round, 0)`` and each is asked
        whether it is available now, until :meth:`invitations` distinct available clients are found: O(clients
        per round / share available), never a pass over every client. Only when that many draws find too few
        (after :data:`DRAWS_PER_CLIENT` per client wanted) does it scan every client: then every available client
        is invited, fewer than asked when fewer are available, and when none is, the server waits until the first
        becomes available (the invitation's ``idle_s``)."""
        wanted = self.invitations(per_round)
        if self.availability.always and wanted == per_round:
            return None
        rng = numpy_rng(self.seed, STREAM_CLOCK, round, INVITATIONS)
        n = self.num_clients
        if self.availability.always:
            return Invitation(sorted(int(i) for i in rng.choice(n, size=wanted, replace=False)))
        chosen: List[int] = []
        seen = set()
        unavailable = 0
        cap = DRAWS_PER_CLIENT * wanted + DRAW_SLACK
        while len(chosen) < wanted and len(seen) < min(n, cap):
            for candidate in rng.integers(0, n, size=2 * (wanted - len(chosen)) + 8).tolist():
                if candidate in seen:
                    continue
                seen.add(candidate)
                if self.availability.window(candidate, self.now)[0]:
                    chosen.append(candidate)
                    if len(chosen) == wanted:
                        break
                else:
                    unavailable += 1
                if len(seen) >= min(n, cap):
                    break
        if len(chosen) == wanted:
            return Invitation(sorted(chosen), unavailable)
        return self._scan(wanted)

    def _scan(self, wanted: int) -> Invitation:
        """Every client asked (the rare path of :meth:`invite`): the first ``wanted`` available by id, after waiting
        for the first to become available when none is."""
        idle = 0.0
        while True:
            available = [c for c in self._every_client() if self.availability.window(c, self.now + idle)[0]]
            if available:
                return Invitation(available[:wanted], self.num_clients - len(available), idle)
            wake = min(self.availability.next_on(c, self.now + idle) for c in self._every_client())
            idle = wait_until(self.now, wake)

    def _every_client(self):
        """0, 1, ..., N - 1, asking :attr:`should_stop` every :data:`STOP_CHECK_EVERY` clients (a scan of ten
        million clients takes minutes): :class:`~hasfl_ray.errors.RoundInterrupted` when it says so."""
        for start in range(0, self.num_clients, STOP_CHECK_EVERY):
            if self.should_stop():
                raise RoundInterrupted("stopped while the clock scanned for an available client")
            yield from range(start, min(start + STOP_CHECK_EVERY, self.num_clients))

    def settle(self, round: int, invited: Sequence[int], costs: Mapping[int, ClientCost], per_round: int,
               start: Optional[float] = None) -> RoundOutcome:
        """The round's outcome for the ``invited`` clients (sorted) and their costs, starting at ``start`` seconds
        (default: now).

        Each invited client draws, in client order, a uniform u (drops out when u < dropout) and a uniform v (it
        drops after v x its round's time) from ``rng(seed, STREAM_CLOCK, round, 1)``; a client whose availability
        ends before its update would arrive drops out then too. The others' updates arrive after their
        :meth:`seconds`; the deadline policy decides which are kept (docs/clock.md, "Deadlines")."""
        start = self.now if start is None else start
        deadline = INF if self.deadline is None else self.deadline
        draws = numpy_rng(self.seed, STREAM_CLOCK, round, DROPOUTS).random((len(invited), 2))
        ends: Dict[int, float] = {}  # when each client stops: its arrival, or the moment it drops out
        arrivals: Dict[int, float] = {}
        dropped: List[int] = []
        for k, client in enumerate(invited):
            full = self.seconds(client, costs[client])
            until = self.availability.window(client, start)[1] - start
            if draws[k, 0] < self.dropout:
                dropped.append(client)
                ends[client] = draws[k, 1] * full
            elif full > until:
                dropped.append(client)
                ends[client] = until
            else:
                arrivals[client] = ends[client] = full
        steps: Dict[int, int] = {}
        late: List[int] = []
        if self.policy == "overselect":
            order = sorted(arrivals, key=lambda c: (arrivals[c], c))
            kept = [c for c in order if arrivals[c] <= deadline][:per_round]
            chosen = set(kept)
            late = [c for c in order if c not in chosen]
            round_time = arrivals[kept[-1]] if len(kept) == per_round else min(deadline, max(ends.values(), default=0.0))
        else:
            kept = []
            for client in sorted(arrivals):
                if arrivals[client] <= deadline:
                    kept.append(client)
                    continue
                fit = 0
                if self.policy == "partial":
                    p = self.profiles
                    fit = steps_within(costs[client], p.speed[client], p.down[client], p.up[client],
                                       p.latency[client], deadline)
                if fit > 0:
                    kept.append(client)
                    steps[client] = fit
                    arrivals[client] = ends[client] = self.seconds(client, costs[client], fit)
                else:
                    late.append(client)
            round_time = min(deadline, max(ends.values(), default=0.0))
        kept.sort()
        return RoundOutcome(kept=kept, steps=steps, round_time=float(round_time),
                            bytes_down=sum(int(costs[c].bytes_down) for c in invited),
                            bytes_up=sum(int(costs[c].bytes_up) for c in kept), late=sorted(late),
                            dropped=dropped, arrivals=arrivals, stops=ends)

    def advance(self, invitation: Invitation, outcome: RoundOutcome, invited: Sequence[int]) -> None:
        """Move the clock past the round (the idle wait, then the round) and count each invited client's busy and
        waiting seconds: a kept client works until its update arrives, then waits for the round's end; a late one
        works the whole round; one that dropped out works until it drops."""
        kept = set(outcome.kept)
        self.invited[list(invited)] = True
        for client in invited:
            if client in kept:
                arrival = outcome.arrivals[client]
                self.busy[client] += arrival
                self.waiting[client] += outcome.round_time - arrival
            else:  # late: the whole round; dropped out: until then
                self.busy[client] += min(outcome.stops[client], outcome.round_time)
        self.now += invitation.idle_s + outcome.round_time

    def wait_shares(self) -> np.ndarray:
        """Each client's share of its round time spent waiting for others (NaN: it never took part)."""
        total = self.busy + self.waiting
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(total > 0, self.waiting / np.where(total > 0, total, 1.0), np.nan)

    def state_dict(self) -> Dict[str, Any]:
        return {"now": self.now, "busy": self.busy.copy(), "waiting": self.waiting.copy(),
                "invited": self.invited.copy()}

    def state_problem(self, state: Any) -> Optional[str]:
        """What is wrong with a checkpoint's clock state for this clock, as a phrase ("its now is -3.0"), or None: a
        mapping holding now (a finite number >= 0) and busy, waiting (finite, >= 0) and invited, one per client."""
        if not isinstance(state, Mapping):
            return f"its clock state is a {type(state).__name__}"
        missing = [key for key in ("now", "busy", "waiting", "invited") if key not in state]
        if missing:
            return f"its clock state lacks {', '.join(missing)}"
        now = state["now"]
        if isinstance(now, bool) or not isinstance(now, (int, float, np.floating, np.integer)) or \
                not math.isfinite(float(now)) or float(now) < 0:
            return f"its clock's simulated time is {now!r}"
        for key in ("busy", "waiting", "invited"):
            try:
                values = np.asarray(state[key], dtype=bool if key == "invited" else np.float64)
            except (TypeError, ValueError):
                return f"its clock's {key} is not an array of numbers"
            if values.shape != (self.num_clients,):
                return f"its clock's {key} has shape {values.shape} for {self.num_clients} clients"
            if key != "invited" and (not np.isfinite(values).all() or (values < 0).any()):
                return f"its clock's {key} holds a negative or non-finite time"
        return None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.now = float(state["now"])
        self.busy = np.asarray(state["busy"], dtype=np.float64).copy()
        self.waiting = np.asarray(state["waiting"], dtype=np.float64).copy()
        self.invited = np.asarray(state["invited"], dtype=bool).copy()

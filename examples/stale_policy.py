"""A plug-in allocation policy for the asynchronous mode that trades width for staleness (docs/async.md, "Choosing
widths by staleness"): a narrow sub-model trains and uploads faster, so its update arrives less stale.

    hasfl-ray simulate --mode async --devices lognormal --concurrency 8 \\
        --algorithm examples/stale_policy.py:StalePolicy --algo-opt max_staleness=2

It reads what the Algorithm API gives an asynchronous run: ``arrived(version, arrivals)`` (each applied update's
staleness and its dispatch and arrival times) and ``self.now`` (the simulated time of the dispatch being
allocated), and the clock's ``round_seconds``.
"""

from dataclasses import dataclass

import numpy as np

from hasfl_ray import Algorithm
from hasfl_ray.errors import ConfigError
from hasfl_ray.federation import ladder_of


@dataclass
class StalePolicyOptions:
    max_staleness: float = 2.0  # the staleness (server updates) a client's update should stay within
    beta: float = 0.8  # EMA factor of the seconds between server updates and of each client's staleness

    def __post_init__(self):
        if not isinstance(self.max_staleness, (int, float)) or not self.max_staleness >= 0:
            raise ConfigError(f"max_staleness is {self.max_staleness!r}; expected a number of server updates >= 0")
        if not 0 <= self.beta < 1:
            raise ConfigError(f"beta is {self.beta!r}; expected a number in [0, 1)")


class StalePolicy(Algorithm):
    """p_i = the widest width of the run's ladder, at most p_i^max, whose predicted staleness fits max_staleness:
    its round time at that width on client i's device (``round_seconds``) divided by the seconds between server
    updates (an EMA over the arrivals seen so far), plus how much staler than predicted client i's updates have
    arrived (an EMA of observed minus predicted staleness). Before the first server update, and in rounds: p^max."""

    options_class = StalePolicyOptions

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        self.ladder = sorted(ladder_of(config).widths)
        self.gap = None  # EMA of simulated seconds between server updates
        self.last_update = None  # simulated seconds of the last server update
        self.excess = np.zeros(self.num_clients)  # EMA of observed minus predicted staleness, per client
        self.predicted = {}  # client -> staleness predicted at its dispatch

    def arrived(self, version, arrivals):
        beta = self.options.beta
        now = max(a.arrival_s for a in arrivals)
        if self.last_update is not None and now > self.last_update:
            gap = now - self.last_update
            self.gap = gap if self.gap is None else beta * self.gap + (1 - beta) * gap
        self.last_update = now
        for a in arrivals:
            miss = a.staleness - self.predicted.pop(a.client, a.staleness)
            self.excess[a.client] = beta * self.excess[a.client] + (1 - beta) * miss

    def allocate(self, round, participants):
        if self.now is None or self.gap is None or self.clock is None:
            return super().allocate(round, participants)
        widths = {}
        for client in participants:
            allowed = [w for w in self.ladder if w <= self.p_max[client] + 1e-12] or [self.ladder[0]]
            predicted = {w: self.round_seconds(round, client, w) / self.gap + self.excess[client] for w in allowed}
            fitting = [w for w in allowed if predicted[w] <= self.options.max_staleness]
            widths[client] = max(fitting) if fitting else allowed[0]
            self.predicted[client] = predicted[widths[client]] - self.excess[client]
        return widths

    def state_dict(self):
        return {**super().state_dict(), "gap": -1.0 if self.gap is None else self.gap,
                "last_update": -1.0 if self.last_update is None else self.last_update,
                "excess": self.excess.copy(), "predicted": {int(k): float(v) for k, v in self.predicted.items()}}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.gap = None if state["gap"] < 0 else float(state["gap"])
        self.last_update = None if state["last_update"] < 0 else float(state["last_update"])
        self.excess = np.asarray(state["excess"], dtype=np.float64).copy()
        self.predicted = {int(k): float(v) for k, v in state["predicted"].items()}

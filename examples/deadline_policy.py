"""A plug-in allocation policy that reads the device clock: each participant trains the widest sub-model its device
finishes before the deadline (docs/clock.md, "Choosing widths by the clock").

    hasfl-ray simulate --algorithm examples/deadline_policy.py:DeadlinePolicy \\
        --devices configs/devices/sample-trace.csv --deadline 2
"""

from dataclasses import dataclass

from hasfl_ray import Algorithm
from hasfl_ray.errors import ConfigError
from hasfl_ray.federation import ladder_of


@dataclass
class DeadlinePolicyOptions:
    margin: float = 1.0  # aim at margin x the deadline (below 1 leaves slack)

    def __post_init__(self):
        if not 0 < self.margin <= 1:
            raise ConfigError(f"margin is {self.margin!r}; expected a fraction in (0, 1]")


class DeadlinePolicy(Algorithm):
    """p_i = the widest width of the run's ladder, at most p_i^max, whose predicted round time on client i's device
    (``round_seconds``: download, local steps, upload, latency) fits margin x the deadline; the narrowest such width
    when none fits. Without a device population or a deadline: p_i^max, as the default allocation."""

    options_class = DeadlinePolicyOptions

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        self.ladder = sorted(ladder_of(config).widths)

    def allocate(self, round, participants):
        deadline = self.config.deadline
        if self.clock is None or deadline is None:
            return super().allocate(round, participants)
        budget = self.options.margin * deadline
        widths = {}
        for client in participants:
            allowed = [w for w in self.ladder if w <= self.p_max[client] + 1e-12] or [self.ladder[0]]
            fitting = [w for w in allowed if self.round_seconds(round, client, w) <= budget]
            widths[client] = max(fitting) if fitting else allowed[0]
        return widths

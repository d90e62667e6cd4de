"""A plug-in allocation policy: each client's width grows with its last local training loss.

    hasfl-ray simulate --algorithm examples/loss_policy.py:LossPolicy --algo-opt gain=0.5
"""

from dataclasses import dataclass

import numpy as np

from hasfl_ray import Algorithm
from hasfl_ray.errors import ConfigError


@dataclass
class LossPolicyOptions:
    min_width: float = 0.3  # width of a client whose loss is 0
    gain: float = 0.4  # extra width at the federation's mean loss
    warmup: int = 2  # rounds trained at p_max before the first re-allocation

    def __post_init__(self):
        if not 0 < self.min_width <= 1:
            raise ConfigError(f"min_width is {self.min_width!r}; expected a width in (0, 1]")
        if self.gain < 0 or self.warmup < 0:
            raise ConfigError(f"gain is {self.gain!r} and warmup {self.warmup!r}; expected numbers >= 0")


class LossPolicy(Algorithm):
    """p_i = min(p_i^max, min_width + gain * loss_i / mean loss), from each client's last reported loss."""

    options_class = LossPolicyOptions

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        self.last_loss = np.full(self.num_clients, np.nan)

    def observe(self, round, results, aggregate):
        for result in results:  # ClientResult: client, width, loss, num_samples, ...
            self.last_loss[result.client] = result.loss
        if round + 1 >= self.options.warmup and not np.isnan(self.last_loss).all():
            loss = np.where(np.isnan(self.last_loss), np.nanmean(self.last_loss), self.last_loss)
            wanted = self.options.min_width + self.options.gain * loss / (loss.mean() + 1e-12)
            self.p_current = np.minimum(self.p_max, wanted)

    def state_dict(self):  # everything --resume needs, so a resumed run is bit-identical
        return {**super().state_dict(), "last_loss": self.last_loss.copy()}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.last_loss = np.asarray(state["last_loss"], dtype=np.float64).copy()

"""What a round's training units cost on a trainer, for the Ray backend's plan of a round's calls
(:func:`~hasfl_ray.simulation.backend.calls`: longest-processing-time-first over the trainers).

A client's local training costs a fixed price per step (the framework's dispatch, the optimiser's step, the batch's
gather: the same at every width) plus a price that grows with the width's square (the convolutions' and linear
layers' arithmetic). On the digits CNN on a CPU the two are about equal at width 1, so the width-squared term alone
(``size x width^2``, this plan's model before) put a median 54 % error on a client's seconds and the two trainers of
a 0.1 s HAS-FL round finished a quarter of the round apart; ``steps x (a + b x width^2)`` fitted to the same clients
has an 11 % median error (benchmarks/RESULTS.md, "Short rounds on Ray").

:class:`CostModel` learns a and b from the trainers' own reports (each call's training seconds against the sums of
its clients' two terms; least squares over every call so far), so that it fits the model, device and batch size of
the run; until a few calls have reported it assumes a = b. Only where clients train depends on it: every client
trains from its own RNG streams, so results never do.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

from hasfl_ray.training.task import ClientTask
from hasfl_ray.training.workspace import local_plan

#: The price of a step relative to the width-squared term at width 1 until the fit has data (measured on the digits
#: CNN on a CPU: 1.16 against 1.24 ms per step).
PRIOR_RATIO = 1.0
#: Calls reported before the fitted ratio replaces the prior.
MIN_CALLS = 4
#: The fitted ratio is kept within [0, MAX_RATIO] (a noisy fit must not make width irrelevant).
MAX_RATIO = 100.0

Features = Tuple[float, float]  # (steps, steps x width^2) of a unit or a call


class CostModel:
    """A unit's cost as ``ratio x steps + steps x width^2``, ``ratio`` fitted from reported call seconds.

    Args:
        size_of: a client's number of training samples.
        batch_size, local_epochs, local_steps: the run's (:class:`~hasfl_ray.training.task.OptimizerSettings`).
    """

    def __init__(self, size_of: Callable[[int], int], batch_size: int, local_epochs: int,
                 local_steps: Optional[int]) -> None:
        self.size_of = size_of
        self.batch_size = max(1, int(batch_size))
        self.local_epochs = local_epochs
        self.local_steps = local_steps
        self.sums = [0.0] * 5  # the normal equations' sums: f1 f1, f1 f2, f2 f2, f1 t, f2 t
        self.calls = 0

    def steps(self, task: ClientTask) -> int:
        """The local steps the client takes (its epochs' batches, or --local-steps; at most its ``max_steps``)."""
        epochs, most = local_plan(self.local_epochs, self.local_steps, task.max_steps)
        if self.local_steps is not None:
            return most if most is not None else epochs
        steps = math.ceil(self.size_of(task.client) / self.batch_size) * epochs
        return steps if most is None else min(steps, most)

    def features(self, tasks: Sequence[ClientTask], unit: Sequence[int], batching: str) -> Features:
        """A unit's two terms: one client alone; a batched group (``batching`` on or mixed, several clients) takes
        its steps together, so their fixed price once, and with clients of several widths (mixed) trains every one
        at the widest."""
        steps = [self.steps(tasks[k]) for k in unit]
        widths = [float(tasks[k].width) for k in unit]
        if len(unit) > 1 and batching == "mixed" and len(set(widths)) > 1:
            widths = [max(widths)] * len(unit)
        if len(unit) > 1 and batching in ("on", "mixed"):
            return float(max(steps)), float(sum(s * w * w for s, w in zip(steps, widths)))
        return float(sum(steps)), float(sum(s * w * w for s, w in zip(steps, widths)))

    @property
    def ratio(self) -> float:
        """The price of a step over the width-squared term's at width 1: fitted once MIN_CALLS calls reported."""
        if self.calls < MIN_CALLS:
            return PRIOR_RATIO
        s11, s12, s22, y1, y2 = self.sums
        det = s11 * s22 - s12 * s12
        if det <= 1e-12 * max(1.0, s11 * s22):  # every call alike: the terms cannot be told apart
            return PRIOR_RATIO
        a, b = (y1 * s22 - y2 * s12) / det, (y2 * s11 - y1 * s12) / det
        if b <= 0:
            return MAX_RATIO
        return min(MAX_RATIO, max(0.0, a / b))

    def costs(self, features: Sequence[Features]) -> List[float]:
        ratio = self.ratio
        return [ratio * f1 + f2 for f1, f2 in features]

    def observe(self, features: Features, seconds: float) -> None:
        """A call trained units whose terms sum to ``features`` in ``seconds``."""
        f1, f2 = features
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        for i, value in enumerate((f1 * f1, f1 * f2, f2 * f2, f1 * seconds, f2 * seconds)):
            self.sums[i] += value
        self.calls += 1


__all__ = ["CostModel", "MAX_RATIO", "MIN_CALLS", "PRIOR_RATIO"]

"""What a round's training units cost on a trainer, for the Ray backend's plan of a round's calls
(:func:`~hasfl_ray.simulation.backend.calls`: longest-processing-time-first over the trainers).

A client's local training costs a fixed price per step (the framework's dispatch, the optimiser's step, the batch's
gather: the same at every width) plus a price that grows with the width's square (the convolutions' and linear
layers' arithmetic). On the digits CNN on a CPU the two are about equal at width 1, so the width-squared term alone
(``size x width^2``, this plan's model before) put a median 54 % error on a client's seconds and the two trainers of
a 0.1 s HAS-FL round finished a quarter of the round apart; ``steps x (a + b x width^2)`` fitted to the same clients
has an 11 % median error (benchmarks/RESULTS.md, "Short rounds on Ray").

:class:`CostModel` learns a and b from the trainers' own reports: each unit's seconds against its two terms, least
squares over every unit so far, each unit timed in CPU seconds by its trainer so that a busy machine's preemptions do
not count; it thereby fits the model, device and batch size of the run. Until a few units have reported it assumes
a = b. An evaluation's seconds are measured per method the same way. Only where clients train depends on it: every
client trains from its own RNG streams, so results never do.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from hasfl_ray.training.task import ClientTask
from hasfl_ray.training.workspace import local_plan

#: A round's units go to the trainers in calls (:func:`calls`): one call per trainer while a round has at most
#: UNITS_PER_CALL units per trainer, else up to CALLS_PER_TRAINER calls each, so that the driver can even out the
#: loads. Each call costs a submit, a result object and a round trip (~2-4 ms of CPU among the driver, the trainer
#: and Ray), which on a 2-core machine at 0.1 s rounds was a third of the round at one call per client. Every
#: client is still trained from its own RNG streams, so results do not depend on how clients are grouped.
UNITS_PER_CALL = 8
CALLS_PER_TRAINER = 8

#: The price of a step relative to the width-squared term at width 1 until the fit has data (measured on the digits
#: CNN on a CPU: 1.16 against 1.24 ms per step).
PRIOR_RATIO = 1.0
#: Units reported before the fitted ratio replaces the prior.
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
        self.evaluation: Dict[str, List[float]] = {}  # per method, evaluation cost units measured and their seconds

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

    def prices(self) -> Optional[Tuple[float, float]]:
        """(a, b): seconds per step and per step at width 1 of the width-squared term, fitted once MIN_CALLS calls
        reported, kept within a/b in [0, MAX_RATIO]; None before, or when the calls cannot tell the terms apart."""
        if self.calls < MIN_CALLS:
            return None
        s11, s12, s22, y1, y2 = self.sums
        det = s11 * s22 - s12 * s12
        if det <= 1e-12 * max(1.0, s11 * s22):  # every call alike: the terms cannot be told apart
            return None
        a, b = (y1 * s22 - y2 * s12) / det, (y2 * s11 - y1 * s12) / det
        if a <= 0:  # the steps' price alone is noise: the width-squared term's fit alone
            return (0.0, y2 / s22) if y2 > 0 else None
        if b <= 0 or a > MAX_RATIO * b:
            return (y1 / s11, y1 / s11 / MAX_RATIO) if y1 > 0 else None
        return a, b

    @property
    def ratio(self) -> float:
        """The price of a step over the width-squared term's at width 1 (PRIOR_RATIO until :meth:`prices`)."""
        prices = self.prices()
        return PRIOR_RATIO if prices is None else prices[0] / prices[1]

    def seconds(self, features: Sequence[Features]) -> Optional[List[float]]:
        """The units' predicted training seconds (None until :meth:`prices`)."""
        prices = self.prices()
        return None if prices is None else [prices[0] * f1 + prices[1] * f2 for f1, f2 in features]

    def costs(self, features: Sequence[Features]) -> List[float]:
        ratio = self.ratio
        return [ratio * f1 + f2 for f1, f2 in features]

    def observe_evaluation(self, method: str, cost: float, seconds: float) -> None:
        """Evaluations by ``method`` of ``cost`` (:func:`evaluation_cost` units) took ``seconds``."""
        if cost > 0 and seconds > 0 and math.isfinite(seconds):
            measured = self.evaluation.setdefault(method, [0.0, 0.0])
            measured[0] += cost
            measured[1] += seconds

    def evaluation_seconds(self, method: str, cost: float) -> Optional[float]:
        """An evaluation's predicted seconds, from its method's measured ones (None before one was measured)."""
        measured = self.evaluation.get(method)
        return cost * measured[1] / measured[0] if measured else None

    def observe(self, features: Features, seconds: float) -> None:
        """A unit (or a call of units whose terms sum to ``features``) trained in ``seconds``."""
        f1, f2 = features
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        for i, value in enumerate((f1 * f1, f1 * f2, f2 * f2, f1 * seconds, f2 * seconds)):
            self.sums[i] += value
        self.calls += 1


def evaluation_cost(method: str, args: Sequence[Any]) -> float:
    """A request's evaluation work in passes of the full-width model over the test samples, to spread a round's
    requests evenly over the trainers: ``evaluate`` is 1, ``evaluate_widths`` and ``test_beats`` 1 for width 1 and
    0.3 for each width below it (smaller, and evaluated channels-last: the digits CNN's passes at 0.25-0.75 take
    0.15-0.3 of the full width's); ``test_logits`` (the clients' test shards, at most the test set) 1. Only where
    evaluations run depends on it, never what they give."""
    if method in ("test_logits", "evaluate_depths"):
        return 1.0
    widths = list(args[0]) if method != "evaluate" and args and args[0] is not None else [1.0]
    return sum(1.0 if not isinstance(width, (int, float)) or float(width) >= 1.0 else 0.3 for width in widths)


def calls(units: Sequence[List[int]], costs: Sequence[float], trainers: int,
          preload: Optional[Sequence[float]] = None) -> List[List[Tuple[List[int], bool]]]:
    """The trainer calls of a round, heaviest first: each a list of units ``(positions, batched)`` (a batched
    group of several clients is ``batched``; a single client is trained alone). The units are spread over
    ``trainers`` x m calls by longest-processing-time-first (each unit, heaviest first by ``costs``, to the call
    with the least work so far): m = 1 while a round has at most UNITS_PER_CALL units per trainer (one call, one
    returned object per trainer per round), else enough calls, at most CALLS_PER_TRAINER per trainer, for the
    driver to even out the trainers' loads as they finish. ``preload`` (with m = 1): the work each trainer has
    besides (its evaluations), its call's starting load; the calls are then in trainer order, call i for trainer i,
    an empty one where a trainer gets no unit. The plan depends only on the units and their costs, and every client
    is trained from its own RNG streams, so results never depend on it."""
    per_trainer = len(units) / max(1, trainers)
    m = 1 if per_trainer <= UNITS_PER_CALL else min(CALLS_PER_TRAINER, int(per_trainer // UNITS_PER_CALL))
    if preload is not None and m == 1 and len(preload) == trainers:
        bins: List[Tuple[float, int, List[int]]] = [(float(load), b, []) for b, load in enumerate(preload)]
    else:
        preload = None
        bins = [(0.0, b, []) for b in range(min(len(units), max(1, trainers) * m))]
    heapq.heapify(bins)
    for u in sorted(range(len(units)), key=lambda u: (-costs[u], units[u][0])):
        load, b, members = heapq.heappop(bins)
        members.append(u)
        heapq.heappush(bins, (load + costs[u], b, members))
    if preload is not None:
        return [[(list(units[u]), len(units[u]) > 1) for u in sorted(members)] for _, _, members in sorted(
            bins, key=lambda bin: bin[1])]
    planned = sorted(bins, key=lambda bin: (-bin[0], bin[1]))
    return [[(list(units[u]), len(units[u]) > 1) for u in sorted(members)] for _, _, members in planned if members]


__all__ = ["CostModel", "MAX_RATIO", "MIN_CALLS", "PRIOR_RATIO", "calls", "evaluation_cost"]

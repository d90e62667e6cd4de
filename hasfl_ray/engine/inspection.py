"""A round's training with the clients' updates shown to the algorithm before they are emptied
(:meth:`hasfl_ray.algorithms.Algorithm.inspect_updates`, FLuID's invariant dropout reads them).

Only an algorithm that overrides ``inspect_updates`` pays for it: the engine then reads the global parameters
before the round (w^t, a copy on the driver) and asks the backend to keep the accepted results' updates (on Ray they
come back with the round's summary); every other algorithm's round is the backend's ``run_round`` as before.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Sequence, Tuple


def inspects_updates(algorithm: Any) -> bool:
    """Whether ``algorithm`` (or the algorithm a guard wraps) overrides ``Algorithm.inspect_updates`` (the base's
    carries ``inspects_nothing``; the engine imports no algorithm module to compare with it)."""
    inner = getattr(algorithm, "algorithm", algorithm)  # GuardedAlgorithm keeps the instance as .algorithm
    method = getattr(type(inner), "inspect_updates", None)
    return method is not None and not getattr(method, "inspects_nothing", False)


def train_round(engine: Any, round: int, tasks: Sequence[Any], weights: Sequence[float],
                call: Tuple[Any, ...] = ()) -> Tuple[List[Any], Any]:
    """``engine.backend.run_round`` of round ``round`` (``call``: its arguments after the weights, the server step
    and optimiser, :func:`~hasfl_ray.aggregation.server_optim.server_call`; default the algorithm's ``server_lr``),
    with ``inspect_updates(round, w^t, accepted results)`` in between for an algorithm that overrides it; the
    results returned have their updates emptied either way."""
    algorithm, backend = engine.algorithm, engine.backend
    call = tuple(call) or (algorithm.server_lr,)
    if not inspects_updates(algorithm):
        return backend.run_round(tasks, weights, *call)
    before = backend.get_params()
    results, aggregate = backend.run_round(tasks, weights, *call, keep_updates=True)
    algorithm.inspect_updates(round, before, results)
    return [dataclasses.replace(result, update={}) for result in results], aggregate


__all__ = ["inspects_updates", "train_round"]

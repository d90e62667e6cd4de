"""A synchronous round's aggregation with the algorithm's server correction (``Algorithm.post_aggregate``, DepthFL's
FedDyn step): the backend trains and aggregates as always; where the algorithm overrides the hook, the global
parameters before the round and after the aggregate are handed to it and what it returns becomes the global model.
An algorithm without the hook costs nothing here (no parameters are read), so every other run is unchanged."""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.engine.inspection import train_round
from hasfl_ray.errors import PluginError
from hasfl_ray.registry import call_plugin, spec_label


def corrects(algorithm: Any) -> bool:
    """Whether ``algorithm`` (or the algorithm a :class:`~hasfl_ray.engine.guard.GuardedAlgorithm` wraps) overrides
    :meth:`Algorithm.post_aggregate` and has not set ``post_aggregate_active`` false."""
    inner = getattr(algorithm, "algorithm", algorithm)
    method = getattr(type(inner), "post_aggregate", None)  # an instance may switch its hook off (DepthFL without FedDyn)
    return method is not None and not getattr(method, "base_default", False) and \
        bool(getattr(inner, "post_aggregate_active", True))


def aggregate_round(engine: Any, round: int, tasks: Sequence[Any], weights: Sequence[float],
                    call: Tuple[Any, ...] = ()) -> Tuple[List[Any], AggregateResult]:
    """The round's training and aggregation (:func:`~hasfl_ray.engine.inspection.train_round`: the backend's
    ``run_round``, ``inspect_updates`` where overridden), then the algorithm's correction where it has one
    and some update was accepted (a round whose every update was rejected leaves the model as it was)."""
    algorithm, backend = engine.algorithm, engine.backend
    if not corrects(algorithm):
        return train_round(engine, round, tasks, weights, call)
    before = backend.get_params()
    results, aggregate = train_round(engine, round, tasks, weights, call)
    if not results:
        return results, aggregate
    after = backend.get_params()
    label = f"algorithm {spec_label(engine.config.algorithm)!r}"
    new = call_plugin(label, "post_aggregate", lambda *a: algorithm.post_aggregate(*a), round, before, after,
                      results)
    if new is not None:
        if not isinstance(new, dict) or set(new) != set(after) or any(
                tuple(getattr(new[name], "shape", ())) != tuple(after[name].shape) for name in after):
            raise PluginError(f"{label} returned a {type(new).__name__} from post_aggregate(); expected None or a "
                              "mapping of every parameter name to a tensor of its full shape")
        backend.set_params(new)
    return results, aggregate


__all__ = ["aggregate_round", "corrects"]

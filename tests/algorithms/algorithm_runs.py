"""Helpers of the algorithm tests: short engine runs on the embedded digits, cached so each config trains once."""

from __future__ import annotations

import functools
from typing import Dict, List, Tuple

import numpy as np

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.models import build_model


class Recorded:
    """An engine run with the widths each round's participants were allocated."""

    def __init__(self, engine: Engine, widths: List[Dict[int, float]]):
        self.engine, self.widths = engine, widths

    @property
    def history(self):
        return self.engine.history


@functools.lru_cache(maxsize=None)
def _recorded_run(items: Tuple[Tuple[str, object], ...]) -> Recorded:
    engine = Engine(RunConfig.from_dict({"backend": "local", **dict(items)}))
    engine.prepare()
    widths: List[Dict[int, float]] = []
    allocate = engine.algorithm.allocate

    def recording(round, participants):
        out = allocate(round, participants)
        widths.append(dict(out))
        return out

    engine.algorithm.allocate = recording
    engine.run()
    return Recorded(engine, widths)


def recorded_run(**config) -> Recorded:
    """Run (once per distinct config) and return the engine with per-round allocated widths."""
    return _recorded_run(tuple(sorted(config.items())))


#: The short run every algorithm's learning test shares (adaptation from round 1 so it happens at all).
LEARNING_RUN = dict(rounds=5, seed=42, warmup=1, t_adapt=1)


def mask_fraction(p: float, model: str = "digits") -> float:
    """Fraction of the model's coordinates inside the width-p mask."""
    specs = build_model(model).param_specs().values()
    return sum(s.numel(p) for s in specs) / sum(s.numel(1.0) for s in specs)


def small_config(**overrides) -> RunConfig:
    """A resolved config for algorithm unit tests on hand-made federations of 4 clients."""
    return RunConfig.from_dict({"backend": "local", "clients": 4, "clients_per_round": 2, "rounds": 20, **overrides}).resolved()


P_MAX_4 = np.array([0.25, 0.5, 0.75, 1.0])
SAMPLES_4 = np.array([10, 20, 30, 40])

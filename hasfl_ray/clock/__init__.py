"""A width-aware simulated clock (docs/clock.md): device profiles, each round's time and bytes from the cost of
each client's width, deadlines, availability and dropout. Off unless a run configures a device population
(``devices``); the engine runs it in the driver, so it knows nothing of Ray."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from hasfl_ray.clock.availability import Availability, MarkovAvailability, TraceAvailability, make_availability
from hasfl_ray.clock.clock import Clock, Invitation, RoundOutcome
from hasfl_ray.clock.cost import (BYTES_PER_PARAM, TRAIN_FACTOR, ClientCost, WidthCosts, base_cost, local_batches,
                                  seconds, steps_within)
from hasfl_ray.clock.profiles import DeviceProfiles, draw_profiles, read_trace, tier_profiles
from hasfl_ray.errors import ConfigError


def make_clock(config: Any, model_name: str, num_samples: np.ndarray, p_max: np.ndarray,
               client_names: Optional[Sequence[str]] = None) -> Optional[Clock]:
    """The clock of a resolved run config (None without a device population): its profiles (the trace read, the
    tiers' devices dealt by p^max, or the seeded draw), its availability model and its deadline policy."""
    spec = config.devices
    if spec is None:
        return None
    n = config.clients
    if "trace" in spec:
        profiles = read_trace(spec["trace"], n, client_names)
    elif "fedscale" in spec:  # FedScale's capacity pickle: ms a sample -> MACs/s of this model (clock/fedscale.py)
        from hasfl_ray.clock.fedscale import read_capacity

        profiles = read_capacity(spec["fedscale"], n, WidthCosts(model_name).macs(1.0))
    elif "tiers" in spec:
        profiles = tier_profiles(spec["tiers"], np.asarray(p_max, dtype=np.float64))
    else:
        profiles = draw_profiles(spec, config.effective_data_seed, n)  # the population: --data-seed
    if config.availability == "trace" and profiles.intervals is None:
        raise ConfigError(f"availability is 'trace' but device trace {spec['trace']!r} has no availability column "
                          "with intervals; expected one, or availability always or markov:ON,OFF")
    if isinstance(config.availability, str) and config.availability.startswith("fedscale:"):
        from hasfl_ray.clock.fedscale import read_behave

        availability = read_behave(config.availability[len("fedscale:"):], n)
    else:
        availability = make_availability(config.availability, profiles.intervals, config.effective_data_seed)
    return Clock(profiles, availability, WidthCosts(model_name), np.asarray(num_samples, dtype=np.int64),
                 config.batch_size, config.local_epochs, config.seed, config.deadline, config.deadline_policy,
                 config.overselect, config.dropout, config.local_steps)


__all__ = ["Availability", "BYTES_PER_PARAM", "ClientCost", "Clock", "DeviceProfiles", "Invitation",
           "MarkovAvailability", "RoundOutcome", "TRAIN_FACTOR", "TraceAvailability", "WidthCosts", "base_cost",
           "draw_profiles", "local_batches", "make_availability", "make_clock", "read_trace", "seconds",
           "steps_within", "tier_profiles"]
